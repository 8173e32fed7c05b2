//! The `hash` and `plan` subcommands, run as the real binary.

use std::io::Write;
use std::process::{Command, Stdio};

fn run(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_burst-prefix-producer"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the producer binary");
    // The binary may refuse its options before reading stdin: a broken pipe is fine here.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let output = child.wait_with_output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[test]
fn hash_prints_the_spec_vector() {
    let (code, stdout, stderr) = run(
        &["hash", "--block-size-tokens", "4"],
        r#"{"model": "m", "prompt": [1,2,3,4,5,6,7,8,9,10]}"#,
    );
    assert_eq!(code, 0, "{stderr}");
    let output: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        output,
        serde_json::json!({
            "blockSizeTokens": 4,
            "prompts": [["ff375b446cd15b25", "d0e13dbe79e3cd40", "6c0f38e4493e1b53"]]
        })
    );
}

#[test]
fn hash_defaults_to_64_token_blocks() {
    let (code, stdout, _) = run(
        &["hash"],
        r#"{"model": "llama", "messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello!"}]}"#,
    );
    assert_eq!(code, 0);
    assert_eq!(
        stdout.trim(),
        r#"{"blockSizeTokens":64,"prompts":[["0fafa73bef220adc"]]}"#
    );
}

#[test]
fn plan_prints_assignments_in_request_order() {
    let input = r#"{
        "config": {"maxPerReplica": -1},
        "replicas": [{"id": "ns/p1-rank-0"}, {"id": "ns/p2-rank-0", "runningRequests": 0}],
        "requests": [
            {"id": "a", "body": {"model": "m", "prompt": "shared"}},
            {"id": "b", "body": {"model": "m", "prompt": "alone"}},
            {"id": "c", "body": {"model": "m", "prompt": "shared"}}
        ]
    }"#;
    let (code, stdout, stderr) = run(&["plan"], input);
    assert_eq!(code, 0, "{stderr}");
    let output: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        output,
        serde_json::json!({"assignments": [
            {"id": "a", "endpoint": "ns/p1-rank-0", "totalBlocks": 1},
            {"id": "b", "endpoint": null, "totalBlocks": 1},
            {"id": "c", "endpoint": "ns/p1-rank-0", "totalBlocks": 1}
        ]})
    );
}

#[test]
fn invalid_input_exits_2_with_one_line() {
    let cases: &[(&[&str], &str, &str)] = &[
        (&["hash"], "{not json", "malformed JSON"),
        (&["hash"], r#"{"prompt": "x"}"#, "body: `model` is missing"),
        (
            &["hash", "--block-size-tokens", "0"],
            r#"{"model": "m", "prompt": "x"}"#,
            "--block-size-tokens is 0",
        ),
        (&["plan"], r#"{"replicas": []}"#, "missing field `requests`"),
        (
            &["plan"],
            r#"{"replicas": [], "requests": [{"id": "x", "body": {"model": "m", "prompt": 5}}]}"#,
            "requests[0].body.prompt: expected",
        ),
        (
            &["plan"],
            r#"{"config": {"balanceBy": "bytes"}, "replicas": [], "requests": []}"#,
            "unknown variant `bytes`",
        ),
    ];
    for (args, stdin, needle) in cases {
        let (code, stdout, stderr) = run(args, stdin);
        assert_eq!(code, 2, "{args:?} {stdin}: {stderr}");
        assert!(stdout.is_empty());
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(needle), "{stderr} lacks {needle}");
    }
}

#[test]
fn serve_help_documents_every_flag_and_its_default() {
    let (code, stdout, _) = run(&["serve", "--help"], "");
    assert_eq!(code, 0);
    for needle in [
        "--listen",
        "[default: 0.0.0.0:8080]",
        "--admin-listen",
        "[default: 0.0.0.0:9090]",
        "--config <FILE>",
        "--configmap <NAMESPACE/NAME>",
        "--config-poll-ms",
        "--max-body-bytes",
        "[default: 8388608]",
        "--log-format",
        "--log-level",
        "BURST_PREFIX_LISTEN",
    ] {
        assert!(stdout.contains(needle), "{needle} missing in\n{stdout}");
    }
}
