//! The CPU check that decides whether the tests on real vLLM run (`tests/vllm/setup.sh
//! --check-cpu`, read from /proc/cpuinfo) agrees with vLLM itself on this machine: where it says
//! vLLM runs, vLLM's own kernel loader loads its kernels, for the ISA the check named (torch
//! reads the CPU by cpuid, not from /proc/cpuinfo). So a machine that can run vLLM never skips
//! those tests. The check's answers on other CPUs are tested in build_scripts.rs.

#[path = "engine/vllm_server.rs"]
mod vllm;

use std::process::Command;

use burst_prefix_test_support::real_engine::vllm_cpu_support;

#[test]
fn the_cpu_check_agrees_with_vllms_own_kernel_loader_on_this_machine() {
    let Some(_engine) = vllm::engine_test(
        "vllm_cpu::the_cpu_check_agrees_with_vllms_own_kernel_loader_on_this_machine",
    ) else {
        return;
    };
    let said = vllm_cpu_support().expect("engine_test ran it: this CPU runs vLLM");
    let output = Command::new(vllm::vllm_python())
        .env("VLLM_TARGET_DEVICE", "cpu")
        .args([
            "-c",
            "import torch, vllm\n\
             from vllm.platforms import current_platform\n\
             current_platform.import_kernels()\n\
             print(current_platform.device_type, torch.cpu._is_avx512_supported(), \
             hasattr(torch.ops._C, 'rms_norm'))",
        ])
        .output()
        .expect("run vLLM's python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "vLLM's kernels did not load although the check says this CPU runs them ({said}): {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let avx512 = std::env::consts::ARCH == "x86_64" && said.contains("AVX-512");
    assert_eq!(
        stdout.split_whitespace().collect::<Vec<_>>(),
        ["cpu", if avx512 { "True" } else { "False" }, "True"],
        "the check said: {said}"
    );
}
