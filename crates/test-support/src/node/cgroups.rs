//! The node's cgroups: every pod, containerd and its shims run in cgroups of the node's own
//! (cgroupfs driver, `cgroupRoot`), killed as a whole when the node stops, or by a watchdog
//! when the test process dies without stopping it.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::host::write;
use crate::Error;

/// The node's cgroups: one directory of the same name in every cgroup v1 hierarchy, which the
/// kubelet gets as its `cgroupRoot`; containerd runs in `<name>/containerd` of the pids one.
#[derive(Debug)]
pub(super) struct Cgroups {
    name: String,
    pids: PathBuf,
    watchdog: Option<(Child, std::process::ChildStdin)>,
}

impl Cgroups {
    /// Its name below each hierarchy's root (the kubelet's `cgroupRoot`).
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn create(name: &str) -> Result<Self, Error> {
        let hierarchies = cgroup_hierarchies()?;
        let pids = hierarchies
            .iter()
            .find(|h| h.ends_with("pids"))
            .ok_or_else(|| Error::Node {
                reason: "no cgroup v1 pids hierarchy in /sys/fs/cgroup".into(),
                logs: String::new(),
            })?
            .join(name);
        for hierarchy in &hierarchies {
            let dir = hierarchy.join(name);
            fs::create_dir_all(&dir)
                .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
            // A new cpuset has no CPUs and no memory nodes: give it the parent's.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = fs::read_to_string(hierarchy.join(file)) {
                    write(&dir.join(file), value.trim())?;
                }
            }
        }
        // Kills whatever is left when this process ends without dropping the node.
        let mut command = Command::new("sh");
        command
            .args(["-c", WATCHDOG])
            .arg(&pids)
            .arg(name)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Out of the test's process group: a signal to the group (timeout(1), Ctrl-C) must
            // not take the watchdog with it.
            .process_group(0);
        let mut child = command
            .spawn()
            .map_err(|e| Error::io("starting the cgroup watchdog", e))?;
        let stdin = child.stdin.take().expect("stdin is piped");
        Ok(Self {
            name: name.to_owned(),
            pids,
            watchdog: Some((child, stdin)),
        })
    }

    /// `cgroup.procs` of `<name>/<sub>` in the pids hierarchy, created.
    pub(super) fn procs_file(&self, sub: &str) -> Result<PathBuf, Error> {
        let dir = self.pids.join(sub);
        fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        Ok(dir.join("cgroup.procs"))
    }

    /// SIGKILL to every process in the node's cgroups until none is left (bounded).
    pub(super) fn kill_all(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = pids_under(&self.pids);
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids {
                // A pid read from the node's own cgroup.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(super) fn remove(&mut self) {
        if let Ok(hierarchies) = cgroup_hierarchies() {
            for hierarchy in hierarchies {
                remove_dirs_bottom_up(&hierarchy.join(&self.name));
            }
        }
        if let Some((mut child, stdin)) = self.watchdog.take() {
            drop(stdin);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits for end-of-file on stdin, then kills every process under $0 (the node's pids cgroup)
/// and removes the node's cgroup directories ($1) from every hierarchy.
const WATCHDOG: &str = r#"while read -r _; do :; done
for _ in 1 2 3 4 5 6 7 8 9 10; do
    pids="$(find "$0" -name cgroup.procs -exec cat {} + 2>/dev/null)"
    [ -n "$pids" ] || break
    kill -9 $pids 2>/dev/null
    sleep 0.2
done
for dir in /sys/fs/cgroup/*/"$1"; do
    [ -d "$dir" ] && find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null
done"#;

fn cgroup_hierarchies() -> Result<Vec<PathBuf>, Error> {
    let entries =
        fs::read_dir("/sys/fs/cgroup").map_err(|e| Error::io("listing /sys/fs/cgroup", e))?;
    let mut hierarchies: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.join("cgroup.procs").exists())
        .collect();
    hierarchies.sort();
    if hierarchies.is_empty() {
        return Err(Error::Node {
            reason: "no cgroup v1 hierarchies in /sys/fs/cgroup (the node expects cgroup v1)"
                .into(),
            logs: String::new(),
        });
    }
    Ok(hierarchies)
}

fn pids_under(dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(entries) = fs::read_dir(&dir) {
            stack.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    pids
}

fn remove_dirs_bottom_up(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.filter_map(Result::ok) {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_dirs_bottom_up(&entry.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}
