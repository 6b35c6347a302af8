//! An output file that appears whole or not at all. It is written to a hidden temporary next to
//! the destination, synced, and renamed into place once complete; an error drops the temporary,
//! and so does a SIGINT (Ctrl-C), SIGTERM or SIGHUP, which then prints a one-line message and
//! ends the process by that signal (so a shell script running the command stops too). A SIGKILL
//! may leave the hidden temporary, never a truncated output. A destination that exists and is
//! not a regular file (`/dev/null`, a FIFO, `/dev/stdout`) is written directly, as a plain
//! create would: a rename would replace the device or pipe with a file.

use anyhow::Context;
use indicatif::ProgressBar;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub struct OutFile {
    /// What the command writes: the temporary, or the destination itself when it is not a
    /// regular file.
    path: PathBuf,
    /// The signal guard and the destination the temporary is renamed onto; None when written
    /// directly.
    atomic: Option<(Arc<Guard>, PathBuf)>,
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

/// The regular file `dest` names, following symlinks (a dangling one to the file it would
/// create, so the link stays); None when `dest` exists and is something else.
fn regular_target(dest: &Path) -> Option<PathBuf> {
    let mut path = dest.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&path) {
            Err(_) => return Some(path),
            Ok(m) if m.file_type().is_symlink() => {
                let link = std::fs::read_link(&path).ok()?;
                path = match path.parent() {
                    Some(dir) => dir.join(link),
                    None => link,
                };
            }
            Ok(m) if m.file_type().is_file() => {
                return Some(std::fs::canonicalize(&path).unwrap_or(path));
            }
            Ok(_) => return None,
        }
    }
    None
}

impl OutFile {
    /// The file to write for `dest`. For a new or regular file, the temporary next to it (next
    /// to the file a symlink `dest` names, so the link stays), with the signal handler installed
    /// before anything is written; signals the process inherited as ignored (a `nohup` SIGHUP,
    /// a background job's SIGINT) stay ignored. For anything else, `dest` itself.
    pub fn new(dest: &Path, bar: Option<&ProgressBar>) -> anyhow::Result<OutFile> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let Some(dest) = regular_target(dest) else {
            return Ok(OutFile {
                path: dest.to_path_buf(),
                atomic: None,
            });
        };
        let name = dest
            .file_name()
            .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
        let tmp = dest.with_file_name(format!(".{name}.muser-tmp-{}", std::process::id()));
        let guard = Arc::new(Guard {
            tmp: tmp.clone(),
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
        // The temporary is created under the lock, so a signal either finds it or comes after
        // this has settled what there is to clean. A directory this process may not write in
        // (a writable model in a read-only folder) falls back to writing the file directly.
        let mut done = guard.committed.lock().unwrap_or_else(|e| e.into_inner());
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp);
        if let Err(e) = created {
            // Nothing of ours to clean from here on: a signal does its default.
            *done = true;
            let no_dir = matches!(
                e.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
            );
            if no_dir && dest.exists() {
                return Ok(OutFile {
                    path: dest,
                    atomic: None,
                });
            }
            let dir = tmp.parent().unwrap_or(Path::new("."));
            return Err(anyhow::Error::new(e).context(format!(
                "cannot create a file in {} to write {}",
                dir.display(),
                dest.display()
            )));
        }
        drop(done);
        Ok(OutFile {
            path: tmp,
            atomic: Some((guard, dest)),
        })
    }

    /// The file to write.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Syncs the finished temporary and renames it onto the destination, with the replaced
    /// file's permissions when there was one (nothing to do for a destination written directly).
    pub fn commit(self) -> anyhow::Result<()> {
        let Some((guard, dest)) = &self.atomic else {
            return Ok(());
        };
        let mut committed = guard.committed.lock().unwrap_or_else(|e| e.into_inner());
        let tmp = &guard.tmp;
        std::fs::File::open(tmp)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", tmp.display()))?;
        if let Ok(old) = std::fs::metadata(dest) {
            std::fs::set_permissions(tmp, old.permissions())
                .with_context(|| format!("setting the permissions of {}", tmp.display()))?;
        }
        std::fs::rename(tmp, dest)
            .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
        *committed = true;
        Ok(())
    }
}

impl Drop for OutFile {
    fn drop(&mut self) {
        if let Some((guard, _)) = &self.atomic {
            let committed = guard.committed.lock().unwrap_or_else(|e| e.into_inner());
            if !*committed {
                let _ = std::fs::remove_file(&guard.tmp);
            }
        }
    }
}

impl Guard {
    /// Ends the process for signal `sig`: removes the temporary (unless the output is already in
    /// place), says so, and lets the signal do what it would without the handler (status 128 +
    /// `sig` only if that fails). Threads still writing write into the removed file, harmlessly.
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
        let _ = signal_hook::low_level::emulate_default_handler(sig);
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
