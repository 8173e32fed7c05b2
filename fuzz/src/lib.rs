//! What each fuzz target checks, as plain functions of the fuzzer's bytes (the targets in
//! `fuzz_targets/` only hand them over). Every check panics on a broken property, which
//! libFuzzer reports as a crash with the input that broke it.

pub mod engine_metrics;
pub mod ext_proc;
pub mod producer_config;
pub mod proxy;
pub mod request_body;

/// With `BURST_PREFIX_FUZZ_WRITE_SEEDS=DIR` in the environment, writes a target's seeds (inputs
/// built from typed values, e.g. protobuf messages) into DIR and exits.
pub fn write_seeds_if_asked(seeds: fn() -> Vec<(&'static str, Vec<u8>)>) {
    let Some(dir) = std::env::var_os("BURST_PREFIX_FUZZ_WRITE_SEEDS") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("the seed directory");
    for (name, bytes) in seeds() {
        std::fs::write(dir.join(name), bytes).expect("a seed file");
    }
    eprintln!("seeds written to {}", dir.display());
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    /// The committed seeds of the targets that build theirs from typed values are what those
    /// values encode to: a change to the message builders cannot silently change the corpus.
    #[test]
    fn committed_seeds_are_what_the_builders_write() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/ext_proc");
        for (name, bytes) in crate::ext_proc::seeds() {
            let committed = std::fs::read(dir.join(name)).expect("a committed seed");
            assert_eq!(committed, bytes, "seeds/ext_proc/{name}");
        }
    }

    /// Every committed seed (those that once broke a target among them) passes its target's
    /// checks, so `make check` finds a regression without running the fuzzer.
    #[test]
    fn committed_seeds_pass_their_checks() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
        let targets: [(&str, fn(&[u8])); 5] = [
            ("engine_metrics", crate::engine_metrics::check),
            ("ext_proc", crate::ext_proc::check),
            ("proxy", crate::proxy::check),
            ("producer_config", crate::producer_config::check),
            ("request_body", |data| {
                let _ = crate::request_body::check(data);
            }),
        ];
        for (target, check) in targets {
            let mut checked = 0;
            for entry in std::fs::read_dir(seeds.join(target)).expect("a seed directory") {
                let path = entry.expect("a seed").path();
                eprintln!("checking {}", path.display());
                check(&std::fs::read(&path).expect("a seed file"));
                checked += 1;
            }
            assert!(checked > 0, "seeds/{target} holds seeds");
        }
    }
}
