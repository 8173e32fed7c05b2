//! Which tests on a real engine run on this machine, and the record `make test` sums up.
//!
//! vLLM's CPU kernels run on an x86-64 CPU with AVX2 or an aarch64 CPU with NEON; the rule is
//! `tests/vllm/setup.sh --check-cpu`, which installs nothing where it fails. A test on real vLLM
//! starts with [`runs_on_vllm`]: where the CPU cannot run vLLM it says so in one line, naming
//! the flags the CPU lacks, and returns without testing anything; everywhere else it runs (a
//! missing install is then a failure, never a skip). Each call appends a line to the file named
//! by [`LOG_ENV`] when set (the Makefile sets it), which `tests/vllm/summary.sh` sums up at the
//! end of `make test`.

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The file each test on a real engine appends its line to: `ran`, or `not run` and why.
pub const LOG_ENV: &str = "BURST_PREFIX_REAL_ENGINE_TESTS_LOG";

/// What `tests/vllm/setup.sh --check-cpu` says of this CPU: `Ok` with the kernels vLLM runs
/// here, or `Err` with why it cannot run.
pub fn vllm_cpu_support() -> Result<String, String> {
    let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vllm/setup.sh");
    let output = Command::new("bash")
        .arg(&setup)
        .arg("--check-cpu")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} --check-cpu: {e}", setup.display()));
    let said = String::from_utf8_lossy(&output.stdout).trim().to_string();
    match output.status.code() {
        Some(0) => Ok(said),
        Some(3) => Err(said),
        _ => panic!(
            "{} --check-cpu failed ({}): {}{}",
            setup.display(),
            output.status,
            said,
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

/// Whether test `test` runs on real vLLM here; records the answer (see the module's doc).
pub fn runs_on_vllm(test: &str) -> bool {
    match vllm_cpu_support() {
        Ok(kernels) => {
            record(&format!("ran\t{test}\t{kernels}"));
            true
        }
        Err(reason) => {
            eprintln!("NOT RUN {test}: vLLM cannot run on this CPU: {reason}");
            record(&format!("not run\t{test}\t{reason}"));
            false
        }
    }
}

/// Appends `line` to the log, when there is one: one write, so that the lines of tests running
/// at once do not interleave.
fn record(line: &str) {
    let Some(path) = std::env::var_os(LOG_ENV) else {
        return;
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", Path::new(&path).display()));
    file.write_all(format!("{line}\n").as_bytes())
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", Path::new(&path).display()));
}
