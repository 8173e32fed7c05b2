//! Child processes that cannot outlive the test binary, and a temp directory that is removed
//! however the test binary ends.
//!
//! A control plane shared by the tests of one binary lives in a `static`, and statics are never
//! dropped, so nothing can rely on `Drop` to stop etcd and kube-apiserver. Instead:
//!
//! - etcd and kube-apiserver are started with `prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel kills
//!   them when their parent goes away, whether the test binary returned, panicked, aborted or was
//!   killed. The parent in that sense is the *thread* that forked them, and libtest runs each test
//!   on a thread of its own that ends with the test, so every child is forked by one supervisor
//!   thread that lives as long as the process.
//! - The temp directory is removed by a watchdog `sh` that waits for end-of-file on its stdin, a
//!   pipe whose only writer is this process (std opens pipes close-on-exec, so no other child holds
//!   it). The kernel closes the pipe when this process ends, however it ends.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::prctl;
use nix::sys::signal::{kill, Signal};
use nix::unistd::{getppid, Pid};

type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on the supervisor thread and waits for its result.
fn on_supervisor<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> T {
    static SUPERVISOR: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let sender = SUPERVISOR.get_or_init(|| {
        let (sender, jobs) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("control-plane-supervisor".into())
            .spawn(move || {
                for job in jobs {
                    job();
                }
            })
            .expect("spawning the control-plane supervisor thread");
        Mutex::new(sender)
    });
    let (reply, result) = mpsc::channel();
    sender
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send(Box::new(move || {
            let _ = reply.send(job());
        }))
        .expect("the control-plane supervisor thread never exits");
    result
        .recv()
        .expect("the control-plane supervisor thread never exits")
}

/// Starts `command` with its stdout and stderr appended to `log`; the child is killed when this
/// process ends (see the module documentation).
pub(crate) fn spawn_supervised(mut command: Command, log: &Path) -> io::Result<Child> {
    let out = File::options().create(true).append(true).open(log)?;
    command
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    kill_with_parent(&mut command);
    on_supervisor(move || command.spawn())
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // pre_exec is unsafe by signature; the only unsafe code of the workspace.
fn kill_with_parent(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only the async-signal-safe
    // functions prctl and getppid.
    unsafe {
        command.pre_exec(move || {
            prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The parent may have died between fork and prctl: then nobody will send the signal.
            if getppid().as_raw() as u32 != parent {
                return Err(io::Error::other(
                    "the test process exited while starting a child",
                ));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn kill_with_parent(_command: &mut Command) {
    compile_error!("burst-prefix-test-support relies on Linux's PR_SET_PDEATHSIG");
}

/// Asks a child to stop (SIGTERM), waits up to `grace`, then kills it.
pub(crate) fn stop(child: &mut Child, grace: Duration) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        // Our own child, not reaped yet (try_wait said so): the pid is still its.
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A temp directory removed when this value is dropped or, failing that, when the process ends.
#[derive(Debug)]
pub(crate) struct ScratchDir {
    path: PathBuf,
    watchdog: Option<(Child, ChildStdin)>,
}

impl ScratchDir {
    pub(crate) fn create(prefix: &str) -> io::Result<Self> {
        let path = tempfile::Builder::new().prefix(prefix).tempdir()?.keep();
        let mut command = Command::new("sh");
        command
            // Wait for end-of-file, give the killed children a moment to go, then remove.
            .args([
                "-c",
                r#"while read -r _; do :; done; sleep 1; rm -rf -- "$0""#,
            ])
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Out of the test's process group: a signal to the group (timeout(1), Ctrl-C) must
            // not take the watchdog with it.
            .process_group(0);
        let mut child = on_supervisor(move || command.spawn())?;
        let stdin = child.stdin.take().expect("stdin is piped");
        Ok(Self {
            path,
            watchdog: Some((child, stdin)),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.watchdog.take() {
            let _ = std::fs::remove_dir_all(&self.path);
            // Its work is done: no need to wait out its grace period.
            drop(stdin);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The last `lines` lines of a log file, for error messages.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    const MAX_BYTES: u64 = 64 * 1024;
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            format!(
                "--- last {} lines of {} ---\n{}",
                tail.len(),
                path.display(),
                tail.join("\n")
            )
        }
        Err(err) => format!("--- {}: {err} ---", path.display()),
    }
}
