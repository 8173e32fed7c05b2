//! Isolation: the test process in network and mount namespaces of its own, with nothing but
//! `lo` and the node's bridge, and the mounts the node leaves behind undone.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

use super::host::run;
use crate::Error;

/// Moves this process into new network and mount namespaces (see the module documentation).
/// Call it first in the test's `main` (`harness = false`), while the process has one thread:
/// a multi-threaded process cannot change its mount namespace, and threads made before would
/// stay behind in the machine's network.
pub fn enter_namespaces() -> Result<(), Error> {
    let threads = fs::read_to_string("/proc/self/status")
        .map_err(|e| Error::io("reading /proc/self/status", e))?
        .lines()
        .find_map(|line| line.strip_prefix("Threads:").map(|n| n.trim().to_owned()));
    if threads.as_deref() != Some("1") {
        return Err(Error::Node {
            reason: format!(
                "enter_namespaces needs a single-threaded process (threads: {threads:?}): \
                 call it first in main, in a test target with harness = false"
            ),
            logs: String::new(),
        });
    }
    // The process has one thread (checked above), so all of it moves.
    unshare(CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWNS).map_err(|errno| {
        Error::io(
            "unshare(CLONE_NEWNET | CLONE_NEWNS) (the node needs root)",
            errno.into(),
        )
    })?;
    // Mounts made from now on stay in this namespace, in both directions.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|errno| Error::io("making / a private mount", errno.into()))?;
    // Paths that containerd and the kubelet write whatever their configuration says: the shims'
    // sockets (/run/containerd/s) and the kubelet's log links (/var/log/containers).
    for dir in ["/run/containerd", "/var/log/containers"] {
        fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating {dir}"), e))?;
        run(Command::new("mount").args(["-t", "tmpfs", "tmpfs", dir]))?;
    }
    IN_OWN_NAMESPACES.store(true, Ordering::SeqCst);
    run(Command::new("ip").args(["link", "set", "lo", "up"]))
}

/// Set by [`enter_namespaces`]: this process has network and mount namespaces of its own.
static IN_OWN_NAMESPACES: AtomicBool = AtomicBool::new(false);

/// Refuses to touch the network unless this process has a network namespace of its own.
pub(super) fn ensure_own_network_namespace() -> Result<(), Error> {
    if IN_OWN_NAMESPACES.load(Ordering::SeqCst) {
        Ok(())
    } else {
        Err(Error::Node {
            reason: "the node needs network and mount namespaces of its own: call \
                     node::enter_namespaces() first in main"
                .into(),
            logs: String::new(),
        })
    }
}

/// Detaches every mount under `dir`, deepest first (volumes, root filesystems, pod network
/// namespaces), so that the directory can be removed.
pub(super) fn unmount_under(dir: &Path) {
    let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(point.replace("\\040", " ")))
        .filter(|point| point.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let _ = umount2(&point, MntFlags::MNT_DETACH);
    }
}
