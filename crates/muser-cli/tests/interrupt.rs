//! `muser quantize` and `muser synth` run as a user runs them: a SIGINT (Ctrl-C) or SIGTERM while
//! they write stops them with a clear message, by that signal, and leaves neither a new output
//! nor its hidden temporary behind (a file the output would have replaced is untouched); a
//! destination that is a pipe stays a pipe and gets the bytes, and a symlink stays a link.

use muser_gguf::{GgmlType, GgufWriter, MetaValue, TensorSpec};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The input's matrices: `N_TENSORS` F16 matrices of `ROWS` rows of `COLS`, 96M weights (192 MB),
/// some seconds of Q4_K quantization on two cores, so the signal always comes mid-way.
const N_TENSORS: usize = 24;
const ROWS: u64 = 1024;
const COLS: u64 = 4096;

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes an F16 GGUF of pseudo-random weights (a xorshift, so quantizing each block takes the
/// reference quantizer's full search).
fn write_f16_gguf(path: &Path) {
    let metadata = vec![(
        "general.architecture".to_string(),
        MetaValue::String("llama".into()),
    )];
    let specs: Vec<TensorSpec> = (0..N_TENSORS)
        .map(|i| {
            TensorSpec::new(
                format!("blk.{i}.ffn_up.weight"),
                &[COLS, ROWS],
                GgmlType::F16,
            )
        })
        .collect();
    let mut w = GgufWriter::create(path, &metadata, &specs).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut data = vec![0u8; (ROWS * COLS * 2) as usize];
    for _ in &specs {
        for v in data.chunks_exact_mut(2) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let f = (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            v.copy_from_slice(&half::f16::from_f32(f).to_le_bytes());
        }
        w.write_tensor(&data).unwrap();
    }
    w.finish().unwrap();
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Starts `muser ARGS` (which writes `out.gguf`) in `dir`, sends `sig` once its temporary
/// exists, and checks that it stops cleanly with status 128 + `sig`, leaving the files `left`.
fn interrupt(dir: &Path, args: &[&str], sig: libc::c_int, sig_name: &str, left: &[&str]) {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_muser"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let tmp = dir.join(format!(".out.gguf.muser-tmp-{}", child.id()));
    // Wait for the temporary; a command that ends first makes the test meaningless.
    loop {
        if tmp.exists() {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "{args:?} ended ({status}) before its temporary {} was seen: the input is too \
                 small to interrupt",
                tmp.display()
            );
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{args:?}: the temporary {} never appeared", tmp.display());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let signalled = Instant::now();
    // SAFETY: kill(2) with the pid of our own child, which has not been waited for.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if signalled.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("{args:?} did not stop within 20 s of {sig_name}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(
        !status.success() && !stderr.contains("wrote out.gguf"),
        "{args:?} finished before {sig_name} reached it (the input is too small to interrupt): \
         {status}, stderr {stderr:?}"
    );
    // It dies by the signal, as a shell expects of a command the user stopped (a status of
    // 128 + sig would let a script's loop go on).
    assert_eq!(status.signal(), Some(sig), "{sig_name}: stderr {stderr:?}");
    // The last line says so and names the temporary (relative, or absolute when the output
    // existed before).
    let last = stderr.lines().last().unwrap_or_default();
    let name = tmp.file_name().unwrap().to_string_lossy();
    assert!(
        last.starts_with(&format!(
            "interrupted by {sig_name}: removed the partial output "
        )) && last.ends_with(&*name),
        "stderr {stderr:?}, expected a last line naming {name}"
    );
    assert!(!stderr.contains("panicked"), "stderr {stderr:?}");
    // Neither the temporary nor a new output is left.
    assert_eq!(names(dir), left, "{sig_name}");
    eprintln!(
        "{sig_name}: temporary after {:.2} s, stopped {:.3} s after the signal",
        (signalled - start).as_secs_f64(),
        signalled.elapsed().as_secs_f64()
    );
}

#[test]
fn a_signal_stops_quantize_and_removes_its_temporary() {
    let dir = scratch("quantize-interrupt");
    let t = Instant::now();
    write_f16_gguf(&dir.join("in.gguf"));
    eprintln!("wrote the input in {:.2} s", t.elapsed().as_secs_f64());
    let args = ["quantize", "in.gguf", "out.gguf", "Q4_K"];
    interrupt(&dir, &args, libc::SIGINT, "SIGINT", &["in.gguf"]);
    interrupt(&dir, &args, libc::SIGTERM, "SIGTERM", &["in.gguf"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_signal_stops_synth_and_keeps_the_file_it_would_replace() {
    let dir = scratch("synth-interrupt");
    let old = b"the file synth would replace";
    std::fs::write(dir.join("out.gguf"), old).unwrap();
    // llama-1b: ~600 MB of weights, a few seconds of generation.
    let args = ["synth", "llama-1b", "out.gguf"];
    interrupt(&dir, &args, libc::SIGINT, "SIGINT", &["out.gguf"]);
    interrupt(&dir, &args, libc::SIGTERM, "SIGTERM", &["out.gguf"]);
    assert_eq!(std::fs::read(dir.join("out.gguf")).unwrap(), old);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_pipe_gets_the_model_and_a_symlink_stays_a_link() {
    let dir = scratch("synth-targets");
    let synth = |out: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_muser"))
            .args(["synth", "muse-tiny", out])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    synth("plain.gguf");
    let plain = std::fs::read(dir.join("plain.gguf")).unwrap();
    // A FIFO: written through (a rename would replace it with a file and hang its reader).
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::read(fifo).unwrap()
    });
    synth("fifo");
    let got = reader.join().unwrap();
    assert!(
        got == plain,
        "the pipe got {} bytes, not the model's {}",
        got.len(),
        plain.len()
    );
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    // A dangling symlink: the model is written where it points, and the link stays.
    std::fs::create_dir(dir.join("models")).unwrap();
    std::os::unix::fs::symlink("models/m.gguf", dir.join("link.gguf")).unwrap();
    synth("link.gguf");
    assert!(std::fs::symlink_metadata(dir.join("link.gguf"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(dir.join("models/m.gguf")).unwrap(), plain);
    // A symlink to an existing model: replaced through the link, the link stays.
    synth("link.gguf");
    assert!(std::fs::symlink_metadata(dir.join("link.gguf"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(names(&dir.join("models")), ["m.gguf"]);
    std::fs::remove_dir_all(&dir).unwrap();
}
