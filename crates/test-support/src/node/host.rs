//! What the node runs on the host: commands, their search path, and files it writes.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

pub(super) fn run(command: &mut Command) -> Result<(), Error> {
    let what = format!("{command:?}");
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("running {what}"), e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Node {
            reason: format!(
                "{what} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
            logs: String::new(),
        })
    }
}

pub(super) fn which(name: &str) -> Result<PathBuf, Error> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| Error::Node {
            reason: format!("{name} is not installed: run `make node-deps`"),
            logs: String::new(),
        })
}

/// PATH with `dir` first (containerd finds its shim there, the kubelet nothing else).
pub(super) fn path_with(dir: &Path) -> OsString {
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths),
    );
    std::env::join_paths(paths).expect("PATH entries have no ':'")
}

pub(super) fn toml_string(value: &str) -> String {
    // A TOML basic string has JSON's escapes.
    serde_json::to_string(value).expect("a string serializes")
}

pub(super) fn write(path: &Path, contents: &str) -> Result<(), Error> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    }
    fs::write(path, contents).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_are_quoted_and_escaped() {
        assert_eq!(toml_string(r#"/tmp/a "b"\c"#), r#""/tmp/a \"b\"\\c""#);
    }

    #[test]
    fn path_with_puts_the_directory_first() {
        let path = path_with(Path::new("/opt/bin"));
        assert!(path.to_string_lossy().starts_with("/opt/bin"));
    }
}
