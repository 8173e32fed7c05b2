//! Where the control-plane binaries are: the directory `tests/control-plane/build.sh` builds into.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// Set by `make test` to the directory `tests/control-plane/build.sh --print-bin-dir` names.
pub const BIN_DIR_ENV: &str = "BURST_PREFIX_CONTROL_PLANE_BIN";

/// The binaries the control plane itself cannot start without.
const REQUIRED: [&str; 2] = ["etcd", "kube-apiserver"];

/// The control-plane binaries: etcd and kube-apiserver, and the clients helm and kubectl.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// Finds the bin directory: `$BURST_PREFIX_CONTROL_PLANE_BIN` when set, otherwise the one
    /// `tests/control-plane/build.sh --print-bin-dir` prints (so a plain `cargo test` finds what
    /// `make control-plane` built). Fails, never skips, when etcd or kube-apiserver is missing.
    pub fn locate() -> Result<Self, Error> {
        let dir = match std::env::var_os(BIN_DIR_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => default_bin_dir()?,
        };
        let missing: Vec<&str> = REQUIRED
            .into_iter()
            .filter(|name| !is_executable(&dir.join(name)))
            .collect();
        if missing.is_empty() {
            Ok(Self { dir })
        } else {
            Err(Error::BinariesMissing {
                dir,
                missing: missing.join(", "),
            })
        }
    }

    /// The bin directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of one binary, checked to exist: `etcd`, `kube-apiserver`, `helm` or `kubectl`.
    pub fn get(&self, name: &str) -> Result<PathBuf, Error> {
        let path = self.dir.join(name);
        if is_executable(&path) {
            Ok(path)
        } else {
            Err(Error::BinariesMissing {
                dir: self.dir.clone(),
                missing: name.to_owned(),
            })
        }
    }
}

fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/control-plane/build.sh")
}

fn default_bin_dir() -> Result<PathBuf, Error> {
    let script = build_script();
    let output = Command::new("bash")
        .arg(&script)
        .arg("--print-bin-dir")
        .output()
        .map_err(|source| Error::Io {
            what: format!("running {} --print-bin-dir", script.display()),
            source,
        })?;
    let dir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || dir.is_empty() {
        return Err(Error::Io {
            what: format!(
                "running {} --print-bin-dir: {}",
                script.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            source: std::io::Error::other(output.status.to_string()),
        });
    }
    Ok(PathBuf::from(dir))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    // `metadata` follows symlinks: a dangling kubectl link counts as missing.
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
