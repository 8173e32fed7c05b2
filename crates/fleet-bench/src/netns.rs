//! The bench runs in a network namespace of its own (`unshare --net`, loopback up): the
//! simulators listen on every interface and have no flag to bind one address, and nothing the
//! bench starts (simulators, producer, peer routers, inference-perf) can reach beyond it.

use std::process::{Command, ExitCode};

use anyhow::{bail, Context};

/// Set in the re-run process: it is inside the namespace.
const INSIDE: &str = "BURST_PREFIX_FLEET_NETNS";

/// Outside: re-runs this program with its arguments in a new network namespace and returns its
/// exit code. Inside: brings loopback up, checks that it is the only interface, and returns
/// `None` (go on).
pub fn enter() -> anyhow::Result<Option<ExitCode>> {
    if std::env::var_os(INSIDE).is_some() {
        let status = Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .context("cannot run `ip link set lo up`")?;
        if !status.success() {
            bail!("`ip link set lo up` failed ({status})");
        }
        let interfaces: Vec<String> = std::fs::read_dir("/sys/class/net")?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        if interfaces != ["lo"] {
            bail!("the namespace has interfaces other than loopback: {interfaces:?}");
        }
        return Ok(None);
    }
    let program = std::env::current_exe()?;
    let status = Command::new("unshare")
        .args(["--net", "--"])
        .arg(&program)
        .args(std::env::args_os().skip(1))
        .env(INSIDE, "1")
        .status()
        .context("cannot run `unshare --net` (it needs root or user namespaces)")?;
    Ok(Some(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8,
    )))
}
