//! A child process in a process group of its own (vLLM's server forks its engine core; the peer
//! routers start a Rust server from Python), stopped by its id: SIGTERM to the group, SIGKILL
//! after a grace period, and SIGKILL when dropped, so that a bench or test that fails half-way
//! leaves nothing behind.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

pub struct Process {
    child: Child,
    /// Its process group (the child's pid: it leads a group of its own).
    group: Option<u32>,
    log: PathBuf,
}

/// Sends `signal` to the process group `group` (ours: the child leads it).
fn signal_group(group: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([signal, "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status();
}

impl Process {
    /// Starts `command` with its output in `log`.
    pub fn start(mut command: Command, log: &Path) -> anyhow::Result<Process> {
        let file = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {:?}", command.as_std().get_program()))?;
        Ok(Process {
            group: child.id(),
            child,
            log: log.to_path_buf(),
        })
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.try_wait()
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Its process group (its own pid), while it has not been stopped: what the fleet bench
    /// reads the CPU time of the process and its children by.
    pub fn group(&self) -> Option<u32> {
        self.group
    }

    /// SIGTERM to its group (so that logs are flushed and children are stopped by their
    /// parent), then SIGKILL to the group if it has not exited within `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(group) = self.group {
            signal_group(group, "-TERM");
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        // Whatever of its group outlived it.
        if let Some(group) = self.group.take() {
            signal_group(group, "-KILL");
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(group) = self.group.take() {
            signal_group(group, "-KILL");
        }
    }
}
