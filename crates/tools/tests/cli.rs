//! The tools binary, run as users run it.

use std::process::{Command, Stdio};

fn run(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_burst-prefix-tools"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn the tools binary");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn demo_reports_where_the_burst_landed_and_exits_0() {
    let (code, stdout, stderr) = run(&["demo"]);
    assert_eq!(code, 0, "{stderr}");
    for needle in [
        "6 prompts x 8 samples",
        "demo/vllm-0-rank-0",
        "demo/vllm-3-rank-0",
        "no affinity",
        "round-robin",
        "less prefill",
    ] {
        assert!(stdout.contains(needle), "{needle} missing in\n{stdout}");
    }
    // Placed on arrival (the default), in the mode's own words; the time cost left no replica
    // idle (52 requests on 4: an idle one would make the others decode longer).
    assert!(
        stdout.contains("placement on arrival") && stdout.contains("placed as they arrived"),
        "{stdout}"
    );
    for r in 0..4 {
        let line = stdout
            .lines()
            .find(|l| {
                l.trim_start()
                    .starts_with(&format!("demo/vllm-{r}-rank-0 "))
            })
            .unwrap_or_else(|| panic!("no line for replica {r} in\n{stdout}"));
        let requests: usize = line
            .split_whitespace()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no request count in {line:?}"));
        assert!(requests >= 1, "replica {r} idle:\n{stdout}");
    }
}

#[test]
fn simulate_prints_a_table_and_bad_options_exit_2() {
    let (code, stdout, stderr) = run(&["simulate", "--workload", "grpo"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("burst"), "{stdout}");
    let (code, _, stderr) = run(&["simulate", "--workload", "nonsense"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("nonsense"), "{stderr}");
}
