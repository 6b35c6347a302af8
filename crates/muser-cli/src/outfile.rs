//! An output file that appears whole or not at all. It is written to a hidden temporary next to
//! the destination and renamed into place once complete; an error drops the temporary, and so
//! does a SIGINT (Ctrl-C), SIGTERM or SIGHUP, which then ends the process with a one-line
//! message and status 128 + the signal's number (130 for Ctrl-C). A SIGKILL may leave the hidden
//! temporary, never a truncated output.

use anyhow::Context;
use indicatif::ProgressBar;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub struct OutFile {
    guard: Arc<Guard>,
    dest: PathBuf,
}

/// What the signal thread and the writer share.
struct Guard {
    tmp: PathBuf,
    /// True once the output is in place. Whoever ends the process, or renames the output, holds
    /// it: an exit never races the rename, and two exits never race each other.
    committed: Mutex<bool>,
    /// A progress bar to clear before the message.
    bar: Option<ProgressBar>,
}

impl OutFile {
    /// The temporary for `dest` (for the file a symlink `dest` names, so the link stays), with
    /// the signal handler installed before anything is written. Signals the process inherited as
    /// ignored (a `nohup` SIGHUP, a background job's SIGINT) stay ignored.
    pub fn new(dest: &Path, bar: Option<&ProgressBar>) -> anyhow::Result<OutFile> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let dest = std::fs::canonicalize(dest).unwrap_or_else(|_| dest.to_path_buf());
        let name = dest
            .file_name()
            .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
        let tmp = dest.with_file_name(format!(".{name}.muser-tmp-{}", std::process::id()));
        let guard = Arc::new(Guard {
            tmp,
            committed: Mutex::new(false),
            bar: bar.cloned(),
        });
        let wanted: Vec<i32> = [SIGINT, SIGTERM, SIGHUP]
            .into_iter()
            .filter(|&sig| !ignored(sig))
            .collect();
        let mut signals = signal_hook::iterator::Signals::new(&wanted)
            .context("installing the SIGINT/SIGTERM handler")?;
        // The handler stays for the rest of the process: removing signal-hook's handler would
        // leave the signal ignored, not restore its default. After the rename it does the default.
        let g = Arc::clone(&guard);
        std::thread::Builder::new()
            .name("output-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    g.exit(sig)
                }
            })
            .context("starting the signal handler thread")?;
        Ok(OutFile { guard, dest })
    }

    /// The temporary to write.
    pub fn path(&self) -> &Path {
        &self.guard.tmp
    }

    /// Renames the finished temporary onto the destination, with the replaced file's
    /// permissions when there was one.
    pub fn commit(self) -> anyhow::Result<()> {
        let mut committed = self
            .guard
            .committed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let tmp = &self.guard.tmp;
        if let Ok(old) = std::fs::metadata(&self.dest) {
            std::fs::set_permissions(tmp, old.permissions())
                .with_context(|| format!("setting the permissions of {}", tmp.display()))?;
        }
        std::fs::rename(tmp, &self.dest)
            .with_context(|| format!("renaming {} to {}", tmp.display(), self.dest.display()))?;
        *committed = true;
        Ok(())
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        let committed = self
            .guard
            .committed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !*committed {
            let _ = std::fs::remove_file(&self.guard.tmp);
        }
    }
}

impl Guard {
    /// Ends the process for signal `sig`: removes the temporary (unless the output is already in
    /// place, when the signal does what it would without the handler), says so and exits with
    /// status 128 + `sig`. Threads still writing write into the removed file, harmlessly.
    fn exit(&self, sig: i32) -> ! {
        let committed = self.committed.lock().unwrap_or_else(|e| e.into_inner());
        if *committed {
            let _ = signal_hook::low_level::emulate_default_handler(sig);
            std::process::exit(128 + sig);
        }
        let removed = match std::fs::remove_file(&self.tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        let name = signal_hook::low_level::signal_name(sig).unwrap_or("a signal");
        let tmp = self.tmp.display();
        // On a terminal the message starts on a line of its own (a progress bar may be drawn).
        let nl = if std::io::stderr().is_terminal() {
            "\n"
        } else {
            ""
        };
        // Not eprintln: a SIGHUP may have closed the terminal, and a failed write must not panic.
        let _ = match removed {
            Ok(()) => writeln!(
                std::io::stderr(),
                "{nl}interrupted by {name}: removed the partial output {tmp}"
            ),
            Err(e) => writeln!(
                std::io::stderr(),
                "{nl}interrupted by {name}: could not remove the partial output {tmp}: {e}"
            ),
        };
        std::process::exit(128 + sig);
    }
}

/// Whether signal `sig` is ignored (SIG_IGN), as `nohup` leaves SIGHUP and a non-interactive
/// shell leaves SIGINT for a background job.
fn ignored(sig: i32) -> bool {
    // SAFETY: with a null new action, sigaction only writes the current action into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}
