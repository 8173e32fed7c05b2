//! CPU time from /proc: of a process group (a peer router's Python launcher and the Rust
//! server it runs, inference-perf's workers, a simulator), and of this process (the bench's own
//! client). Sampled before and after a run, so that a figure can be shown not to be the
//! machine's limit.

use std::collections::BTreeMap;

/// Clock ticks per second of /proc's times (`sysconf(_SC_CLK_TCK)`: 100 on Linux everywhere
/// the bench runs; `getconf CLK_TCK` says so).
const TICKS_PER_SECOND: f64 = 100.0;

/// The fields of a /proc/PID/stat line after the command (field 2, which may hold spaces and
/// parentheses: they start after its last `)`), numbered from field 3.
fn fields_after_command(stat: &str) -> Option<Vec<&str>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().collect())
}

/// `utime + stime` of a /proc/PID/stat line, and its process group, in ticks.
fn parse_stat(stat: &str) -> Option<(u32, u64)> {
    let fields = fields_after_command(stat)?;
    // state(3) ppid(4) pgrp(5) ... utime(14) stime(15).
    let group = fields.get(2)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((group, utime + stime))
}

/// `cutime + cstime` of a /proc/PID/stat line (fields 16 and 17): the CPU of its children that
/// have exited and been waited for, theirs included, in ticks.
fn parse_children(stat: &str) -> Option<u64> {
    let fields = fields_after_command(stat)?;
    let cutime: u64 = fields.get(13)?.parse().ok()?;
    let cstime: u64 = fields.get(14)?.parse().ok()?;
    Some(cutime + cstime)
}

/// CPU seconds used so far by the live processes of every process group, by group id.
pub fn by_group() -> BTreeMap<u32, f64> {
    let mut groups = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return groups;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process may exit between the listing and the read: skipped.
        if let Some((group, ticks)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
        {
            *groups.entry(group).or_insert(0.0) += ticks as f64 / TICKS_PER_SECOND;
        }
    }
    groups
}

/// CPU seconds this process has used (all its threads).
pub fn own() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .as_deref()
        .and_then(parse_stat)
        .map_or(f64::NAN, |(_, ticks)| ticks as f64 / TICKS_PER_SECOND)
}

/// CPU seconds used by this process's children that have exited and been waited for (and by
/// their own children): how the CPU of a client that has exited (inference-perf and its
/// workers) is read, as the difference around its run.
pub fn exited_children() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .as_deref()
        .and_then(parse_children)
        .map_or(f64::NAN, |ticks| ticks as f64 / TICKS_PER_SECOND)
}

/// Seconds during which some runnable task waited for a CPU, machine-wide, since boot (PSI:
/// /proc/pressure/cpu's `some total`, in microseconds); NaN without PSI. Over a step, its growth
/// over the step's wall time is the share of the time the machine's cores were contended (by
/// anything: this bench, or other work on the machine).
pub fn pressure() -> f64 {
    std::fs::read_to_string("/proc/pressure/cpu")
        .ok()
        .and_then(|text| parse_pressure(&text))
        .map_or(f64::NAN, |us| us as f64 / 1e6)
}

fn parse_pressure(text: &str) -> Option<u64> {
    text.lines()
        .find(|line| line.starts_with("some "))?
        .split_whitespace()
        .find_map(|field| field.strip_prefix("total="))?
        .parse()
        .ok()
}

/// Waits until the process groups `groups` together use at most `per_group` of a core each (a
/// quarter second at a time), at most `timeout`; returns how long it waited. Simulators spend
/// ~0.15 s of CPU each starting up, which would otherwise land in the first step's figures.
pub async fn settle(
    groups: &[u32],
    per_group: f64,
    timeout: std::time::Duration,
) -> std::time::Duration {
    let started = std::time::Instant::now();
    let interval = std::time::Duration::from_millis(250);
    let used = |readings: &BTreeMap<u32, f64>| -> f64 {
        groups.iter().filter_map(|g| readings.get(g)).sum()
    };
    let mut before = used(&by_group());
    while started.elapsed() < timeout {
        tokio::time::sleep(interval).await;
        let now = used(&by_group());
        if now - before <= per_group * groups.len() as f64 * interval.as_secs_f64() {
            break;
        }
        before = now;
    }
    started.elapsed()
}

/// The CPU seconds of named processes between two readings.
#[derive(Clone, Debug, Default)]
pub struct Meter {
    /// (name, process group)
    watched: Vec<(String, u32)>,
    start: BTreeMap<u32, f64>,
    own_start: f64,
}

impl Meter {
    /// Starts measuring the groups `watched` (name, group) and this process.
    pub fn start(watched: Vec<(String, u32)>) -> Meter {
        Meter {
            watched,
            start: by_group(),
            own_start: own(),
        }
    }

    /// CPU seconds since [`Meter::start`]: this process as `own_name`, then each watched group.
    /// A group's processes that exited in between are not counted (none of them should).
    pub fn read(&self, own_name: &str) -> Vec<(String, f64)> {
        let now = by_group();
        let mut used = vec![(own_name.to_string(), own() - self.own_start)];
        for (name, group) in &self.watched {
            let before = self.start.get(group).copied().unwrap_or(0.0);
            let after = now.get(group).copied().unwrap_or(before);
            used.push((name.clone(), after - before));
        }
        used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_group_and_times_after_the_command() {
        let stat = "4242 (python3 -m (x)) S 1 4240 4240 0 -1 4194560 100 0 0 0 250 70 0 0 20 0 3";
        assert_eq!(parse_stat(stat), Some((4240, 320)));
        assert_eq!(parse_children(stat), Some(0));
        let with_children = "1 (a) S 1 1 1 0 -1 0 0 0 0 0 250 70 12 30 20 0 3";
        assert_eq!(parse_children(with_children), Some(42));
        let psi = "some avg10=97.98 avg60=98.04 avg300=97.58 total=3938043809\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_pressure(psi), Some(3_938_043_809));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_uses_cpu() {
        let start = own();
        let mut x = 0u64;
        let until = std::time::Instant::now() + std::time::Duration::from_millis(50);
        while std::time::Instant::now() < until {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(own() >= start);
        assert!(!by_group().is_empty());
    }
}
