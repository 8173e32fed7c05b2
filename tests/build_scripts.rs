//! The repository's shell scripts under `set -o pipefail`: no pipe into a reader that stops
//! early (`head`, `grep -q`, `grep -m`), whose writer then dies of SIGPIPE and fails the
//! pipeline (exit 141) at random; and the control plane's version check, which once did that
//! (`"$tmp" --version 2>&1 | head -n 3` failed a cold `make control-plane` on
//! containerd-shim-runc-v2, whose four version lines are four writes), reads the whole output.
//! Needs nothing but bash.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A scratch directory of this test process, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("bp-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A fake binary that prints its version line first, then `lines` more lines, each its own
/// write (as Go's fmt.Println does on an unbuffered stdout), and exits 0.
fn fake_binary(dir: &Path, version: &str, lines: usize) -> PathBuf {
    let path = dir.join("fake-binary");
    fs::write(
        &path,
        format!(
            "#!/usr/bin/env bash\necho 'fake-binary:'\necho '  Version: {version}'\n\
             for ((i = 0; i < {lines}; i++)); do echo \"  padding line $i of the version output\"; done\n"
        ),
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `tests/control-plane/build.sh --check-version <binary> <expected> -v`: (success, stderr).
fn check_version(binary: &Path, expected: &str) -> (bool, String) {
    let output = Command::new("bash")
        .arg(repo().join("tests/control-plane/build.sh"))
        .arg("--check-version")
        .arg(binary)
        .arg(expected)
        .arg("-v")
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_version_check_reads_all_of_a_long_version_output() {
    let scratch = Scratch::new("version-check");
    // 20,000 lines after the version: far more than a pipe holds, so a reader that stopped
    // after three lines would leave the binary writing into a closed pipe (SIGPIPE, exit 141).
    let binary = fake_binary(&scratch.0, "v2.4.2", 20_000);
    for attempt in 0..3 {
        let (ok, stderr) = check_version(&binary, "v2.4.2");
        assert!(ok, "attempt {attempt}: {stderr}");
        assert_eq!(stderr, "");
    }
    let (ok, stderr) = check_version(&binary, "v9.9.9");
    assert!(!ok);
    assert!(
        stderr.contains("reports 'fake-binary:   Version: v2.4.2   padding line 0")
            && stderr.contains("expected v9.9.9"),
        "{stderr}"
    );
    // A binary that fails is named, with what it said.
    let failing = scratch.0.join("failing-binary");
    fs::write(
        &failing,
        "#!/usr/bin/env bash\necho 'no such flag' >&2\nexit 3\n",
    )
    .unwrap();
    fs::set_permissions(&failing, fs::Permissions::from_mode(0o755)).unwrap();
    let (ok, stderr) = check_version(&failing, "v1");
    assert!(!ok);
    assert!(stderr.contains("-v' failed: no such flag"), "{stderr}");
}

/// Every shell script in the repository (tracked or not, outside target/ and .git/).
fn shell_scripts(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | "node_modules") {
                shell_scripts(&path, found);
            }
        } else if name.ends_with(".sh") {
            found.push(path);
        }
    }
}

/// Whether a command (the part of a line after a `|`) reads only part of its input.
fn stops_early(command: &str) -> bool {
    let words: Vec<&str> = command.split_whitespace().collect();
    match words.first() {
        Some(&"head") => true,
        Some(&"grep") => words[1..]
            .iter()
            .take_while(|w| w.starts_with('-'))
            .any(|flag| {
                *flag == "--quiet"
                    || *flag == "--silent"
                    || flag.starts_with("--max-count")
                    || (!flag.starts_with("--") && (flag.contains('q') || flag.contains('m')))
            }),
        _ => false,
    }
}

/// The pipes in `line` into a reader that stops early (`||` is not a pipe; comments are skipped).
fn early_readers(line: &str) -> Vec<String> {
    let code = line.trim_start();
    if code.starts_with('#') {
        return Vec::new();
    }
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    for (i, c) in chars.iter().enumerate() {
        let lone_pipe =
            *c == '|' && chars.get(i + 1) != Some(&'|') && (i == 0 || chars[i - 1] != '|');
        if lone_pipe {
            let rest: String = chars[i + 1..].iter().collect();
            if stops_early(&rest) {
                found.push(rest.trim().to_string());
            }
        }
    }
    found
}

#[test]
fn the_pipe_check_finds_early_readers_and_only_those() {
    for line in [
        r#"got="$("$tmp" --version 2>&1 | head -n 3)""#,
        "readelf -l \"$1\" | grep -q 'program interpreter'",
        "curl -sf \"$url\" | grep -q x",
        "\"$bin\" --version 2>&1 | grep -m1 -i version",
        "x | grep -c . | grep --quiet 1",
    ] {
        assert!(!early_readers(line).is_empty(), "{line}");
    }
    for line in [
        "# a comment: x | head -n 3",
        "a || head -n 3",
        "grep -q foo <<<\"$text\"",
        "k get pods | grep -c .",
        "jq -r .id | sort -u",
        "x | grep -v bar | sed 's/a/b/'",
    ] {
        assert_eq!(early_readers(line), Vec::<String>::new(), "{line}");
    }
}

#[test]
fn no_script_under_pipefail_pipes_into_a_reader_that_stops_early() {
    let mut scripts = Vec::new();
    shell_scripts(&repo(), &mut scripts);
    scripts.sort();
    assert!(
        scripts
            .iter()
            .any(|s| s.ends_with("tests/control-plane/build.sh")),
        "{scripts:?}"
    );
    let mut offenders = Vec::new();
    for script in &scripts {
        let text = fs::read_to_string(script).unwrap();
        if !text.contains("pipefail") {
            continue;
        }
        for (number, line) in text.lines().enumerate() {
            for reader in early_readers(line) {
                offenders.push(format!(
                    "{}:{}: | {reader}",
                    script.strip_prefix(repo()).unwrap_or(script).display(),
                    number + 1
                ));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "read the whole output into a variable, then match it (`[[ $x == *...* ]]`, \
         `grep -q ... <<<\"$x\"`):\n{}",
        offenders.join("\n")
    );
}

/// An AVX2 CPU's flags without AVX-512 (an AMD EPYC of the Zen 2/3 generations), as
/// /proc/cpuinfo lists them.
const AVX2_FLAGS: &str = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat \
    pse36 clflush mmx fxsr sse sse2 ht syscall nx mmxext lm pni pclmulqdq ssse3 fma cx16 sse4_1 \
    sse4_2 movbe popcnt aes xsave avx f16c rdrand bmi1 avx2 smep bmi2 sha_ni";

/// `tests/vllm/setup.sh ARGS` as if on a CPU of `arch` with `flags` (in /proc/cpuinfo's form,
/// under `field`), its cache in `cache`: (exit code, stdout).
fn vllm_setup(
    scratch: &Scratch,
    arch: &str,
    field: &str,
    flags: &str,
    args: &[&str],
) -> (i32, String) {
    let cpuinfo = scratch.0.join("cpuinfo");
    fs::write(
        &cpuinfo,
        format!(
            "processor\t: 0\nvendor_id\t: AuthenticAMD\n{field}\t\t: {flags}\n\nprocessor\t: 1\n"
        ),
    )
    .unwrap();
    let output = Command::new("bash")
        .arg(repo().join("tests/vllm/setup.sh"))
        .args(args)
        .env("BURST_PREFIX_CPUINFO", &cpuinfo)
        .env("BURST_PREFIX_ARCH", arch)
        .env("BURST_PREFIX_CACHE", scratch.0.join("cache"))
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).trim().to_string(),
    )
}

#[test]
fn the_cpu_check_runs_vllm_on_avx2_without_avx512_and_names_the_flags_a_cpu_lacks() {
    let scratch = Scratch::new("vllm-cpu");
    let check = |arch: &str, field: &str, flags: &str| {
        vllm_setup(&scratch, arch, field, flags, &["--check-cpu"])
    };
    // The machine of issue 37: AVX2, no AVX-512. vLLM runs its AVX2 kernels there.
    assert_eq!(
        check("x86_64", "flags", AVX2_FLAGS),
        (0, "this CPU runs vLLM's AVX2 kernels".to_string())
    );
    let avx512 = format!("{AVX2_FLAGS} avx512f avx512dq avx512bw avx512vl");
    assert_eq!(
        check("x86_64", "flags", &avx512),
        (0, "this CPU runs vLLM's AVX-512 kernels".to_string())
    );
    // No AVX2: named, with the file it read.
    let (code, said) = check("x86_64", "flags", &AVX2_FLAGS.replace(" avx2", ""));
    assert_eq!(code, 3, "{said}");
    assert!(
        said.starts_with("this x86_64 CPU lacks avx2, which vLLM's CPU kernels need"),
        "{said}"
    );
    let (code, said) = check("x86_64", "flags", "fpu sse sse2");
    assert_eq!(code, 3);
    assert!(said.contains("lacks avx2 fma f16c"), "{said}");
    // aarch64 reads its Features line.
    assert_eq!(check("aarch64", "Features", "fp asimd evtstrm aes").0, 0);
    let (code, said) = check("aarch64", "Features", "fp evtstrm");
    assert_eq!(code, 3);
    assert!(said.contains("lacks asimd"), "{said}");
    let (code, said) = check("riscv64", "isa", "rv64imafdc");
    assert_eq!(code, 3);
    assert!(
        said.contains("built for x86_64 and aarch64, not riscv64"),
        "{said}"
    );
}

#[test]
fn setup_installs_nothing_on_a_cpu_vllm_cannot_run_on() {
    let scratch = Scratch::new("vllm-setup");
    let (code, said) = vllm_setup(
        &scratch,
        "x86_64",
        "flags",
        &AVX2_FLAGS.replace(" avx2", ""),
        &[],
    );
    assert_eq!(code, 0, "{said}");
    assert!(
        said.starts_with("vllm: not installed: this x86_64 CPU lacks avx2")
            && said.ends_with("the tests on real vLLM will say so and not run"),
        "{said}"
    );
    assert!(!scratch.0.join("cache").exists(), "the cache was touched");
}

#[test]
fn the_summary_names_the_tests_that_did_not_run_and_why() {
    let scratch = Scratch::new("engine-summary");
    let summary = |lines: &str| {
        let log = scratch.0.join("log");
        fs::write(&log, lines).unwrap();
        let output = Command::new("bash")
            .arg(repo().join("tests/vllm/summary.sh"))
            .arg(&log)
            .output()
            .unwrap();
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    assert_eq!(
        summary("ran\ta::one\tthis CPU runs vLLM's AVX2 kernels\nran\tb::two\tthis CPU runs vLLM's AVX2 kernels\n"),
        "real-engine tests: 2 ran (this CPU runs vLLM's AVX2 kernels), none skipped"
    );
    assert_eq!(
        summary("not run\ta::one\tthis x86_64 CPU lacks avx2\nnot run\tb::two\tthis x86_64 CPU lacks avx2\n"),
        "real-engine tests: 0 ran, 2 did not run (this x86_64 CPU lacks avx2): a::one, b::two"
    );
}
