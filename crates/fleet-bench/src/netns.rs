//! The bench runs in a network namespace of its own (`unshare --net`, loopback up): the
//! simulators listen on every interface and have no flag to bind one address, and nothing the
//! bench starts (simulators, producer, peer routers, inference-perf) can reach beyond it.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};

use anyhow::{bail, Context};

/// Set in the re-run process: it is inside the namespace.
const INSIDE: &str = "BURST_PREFIX_FLEET_NETNS";

/// Outside: runs this program again with its arguments in a new network namespace, in this
/// process (it returns only on an error). Inside: brings loopback up, checks that it is the
/// only interface, and returns (go on).
pub fn enter() -> anyhow::Result<()> {
    if std::env::var_os(INSIDE).is_some() {
        let status = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .context("cannot run `ip link set lo up`")?;
        if !status.success() {
            bail!("`ip link set lo up` failed ({status})");
        }
        // /proc/self/net is this namespace's (/sys/class/net is the mount's, the host's).
        let interfaces = interfaces(&std::fs::read_to_string("/proc/self/net/dev")?);
        if interfaces != ["lo"] {
            bail!("the namespace has interfaces other than loopback: {interfaces:?}");
        }
        return Ok(());
    }
    let program = std::env::current_exe()?;
    // exec, not a child: unshare execs the program in turn, so the bench keeps this process's
    // PID, and a SIGTERM sent to it reaches the bench, which stops what it started.
    let error = Command::new("unshare")
        .args(["--net", "--"])
        .arg(&program)
        .args(std::env::args_os().skip(1))
        .env(INSIDE, "1")
        .exec();
    Err(error).context("cannot run `unshare --net` (it needs root or user namespaces)")
}

/// The next port for a server of the bench to listen on: counted up from 10,000, below the
/// ephemeral ports outgoing connections take (32,768 and up), and checked free. The namespace is
/// the bench's alone, so a port handed out is never taken by anything else; a free port the
/// kernel picks (port 0) could be, by a client's connection, before the server binds it (64
/// simulators started at once hit that).
pub fn next_port() -> std::io::Result<u16> {
    const FIRST: u16 = 10_000;
    const COUNT: u16 = 22_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    // Round and round: the servers of earlier runs have stopped.
    for _ in 0..COUNT {
        let port = FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % COUNT;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::other(
        "no free port between 10000 and 32000",
    ))
}

/// The interface names of a /proc/net/dev table (two header lines, then `name: counters`).
fn interfaces(table: &str) -> Vec<String> {
    table
        .lines()
        .skip(2)
        .filter_map(|line| Some(line.split_once(':')?.0.trim().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_interfaces_of_proc_net_dev() {
        let table = "Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n    lo:  0 0 0\n  eth0: 5 1 2\n";
        assert_eq!(interfaces(table), ["lo", "eth0"]);
    }

    #[test]
    fn ports_are_handed_out_once() {
        let (a, b) = (next_port().unwrap(), next_port().unwrap());
        assert!(a >= 10_000 && b != a && b < 32_000);
    }
}
