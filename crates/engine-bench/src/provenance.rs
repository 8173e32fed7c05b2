//! What every result file says about where it came from: when, from which commit, on how many
//! cores, under what load.

use serde::Serialize;

/// When and where a bench ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Provenance {
    /// UTC, `YYYY-MM-DD HH:MM UTC`.
    pub date: String,
    /// `git rev-parse --short=12 HEAD`, and whether tracked files had uncommitted changes.
    pub commit: String,
    /// The cores this process may run on.
    pub cores: usize,
    /// `/proc/loadavg`'s 1, 5 and 15-minute averages when the bench started.
    pub load_average: String,
}

/// The first line `program args` prints (empty when it fails).
fn first_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// The 1, 5 and 15-minute load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

impl Provenance {
    /// Now, in the current directory's git checkout.
    pub fn now() -> Provenance {
        let head = first_line("git", &["rev-parse", "--short=12", "HEAD"]);
        let changed =
            !first_line("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty();
        Provenance {
            date: first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            commit: if changed {
                format!("{head} (with uncommitted changes)")
            } else {
                head
            },
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_average: load_average(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_when_and_on_how_many_cores() {
        let now = Provenance::now();
        assert!(now.cores >= 1);
        assert!(now.date.ends_with(" UTC"), "{}", now.date);
        assert_eq!(now.load_average.split(' ').count(), 3);
    }
}
