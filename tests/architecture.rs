//! docs/architecture.md stays true of the code, and the code keeps the shape it describes:
//! every workspace crate and every stage of the request's path is named there, the stages in
//! the order `crates/core/src/path.rs` gives them, and no crate has an import cycle between its
//! files. Needs only cargo (`make check` runs it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The workspace's members, from the root Cargo.toml.
fn members() -> Vec<String> {
    let manifest = read(&repo().join("Cargo.toml"));
    let list = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .expect("Cargo.toml lists its members")
        .0;
    list.split(',')
        .map(|member| member.trim().trim_matches('"').to_string())
        .filter(|member| !member.is_empty())
        .collect()
}

/// The stages of the request's path, in the order `crates/core/src/path.rs` writes them
/// (`1. **admit**`, ...).
fn stages() -> Vec<String> {
    let path = read(&repo().join("crates/core/src/path.rs"));
    let doc: String = path
        .lines()
        .take_while(|line| line.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut stages = Vec::new();
    for part in doc.split("**").skip(1).step_by(2) {
        if part.chars().all(|c| c.is_ascii_lowercase()) && !stages.contains(&part.to_string()) {
            stages.push(part.to_string());
        }
    }
    stages
}

#[test]
fn every_workspace_crate_is_in_the_architecture() {
    let doc = read(&repo().join("docs/architecture.md"));
    let members = members();
    assert!(members.len() >= 10, "{members:?}");
    let missing: Vec<&String> = members
        .iter()
        .filter(|member| !doc.contains(&format!("`{member}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names no {missing:?} (as `crates/...`): add a row to its crate table"
    );
}

#[test]
fn every_stage_of_the_path_is_in_the_architecture_in_order() {
    let stages = stages();
    assert!(stages.len() >= 4, "path.rs names its stages: {stages:?}");
    let doc = read(&repo().join("docs/architecture.md"));
    let mut last = 0;
    for stage in &stages {
        let file = ["", "/mod"]
            .iter()
            .map(|suffix| repo().join(format!("crates/core/src/{stage}{suffix}.rs")))
            .find(|file| file.is_file());
        assert!(
            file.is_some(),
            "stage {stage} has no module in crates/core/src"
        );
        let named = format!("**{stage}**");
        let at = doc[last..].find(&named).unwrap_or_else(|| {
            panic!("docs/architecture.md does not name {named} after the stages before it")
        });
        last += at + named.len();
    }
}

#[test]
fn no_crate_has_an_import_cycle_between_its_files() {
    let mut cycles = Vec::new();
    for entry in std::fs::read_dir(repo().join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            cycles.extend(
                import_cycles(&src)
                    .into_iter()
                    .map(|cycle| format!("{}: {cycle}", src.display())),
            );
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_check_finds_a_cycle_and_ignores_re_exports() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "lib.rs",
        "pub mod a;\npub mod b;\npub mod c;\npub use a::A;\n",
    );
    write("a.rs", "use crate::b::B;\npub struct A;\n");
    write("b.rs", "use super::c::{C, D};\npub struct B;\n");
    write("c/mod.rs", "mod d;\npub use d::D;\npub struct C;\n");
    write(
        "c/d.rs",
        "use crate::A;\npub struct D;\n// use crate::b::B;\n",
    );
    assert_eq!(import_cycles(dir.path()), ["a -> b -> c/d -> a"]);
    // Through a re-export only: c's parent re-exports d, which uses nothing of c.
    write("c/d.rs", "pub struct D;\n");
    assert!(import_cycles(dir.path()).is_empty());
}

/// A crate's files as modules: `a/b` for `a/b.rs` or `a/b/mod.rs`, `` for the crate root.
fn modules(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, src, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = relative
                    .iter()
                    .map(|p| p.to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    parts.pop();
                }
                out.insert(parts.join("/"), read(&path));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// The text of a file without its tests and comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    text.lines()
        .map(|line| line.split_once("//").map_or(line, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The items a file defines (`struct X`, `fn x`, ...).
fn items(code: &str) -> BTreeSet<String> {
    let mut items = BTreeSet::new();
    for keyword in [
        "struct ", "enum ", "fn ", "trait ", "type ", "const ", "static ", "mod ",
    ] {
        for (at, _) in code.match_indices(keyword) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = code[at + keyword.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                items.insert(name);
            }
        }
    }
    items
}

/// A file's `use` declarations (each starts a line), braces expanded: (re-exported, path).
fn uses(code: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let mut lines = code.lines();
    while let Some(line) = lines.next() {
        let line = line.trim_start();
        let (public, rest) = match line.strip_prefix("pub") {
            Some(rest) => {
                let rest = match rest.strip_prefix('(') {
                    Some(scoped) => scoped.split_once(')').map_or("", |(_, rest)| rest),
                    None => rest,
                };
                (true, rest.trim_start())
            }
            None => (false, line),
        };
        let Some(body) = rest.strip_prefix("use ") else {
            continue;
        };
        let mut declaration = body.to_string();
        while !declaration.contains(';') {
            match lines.next() {
                Some(next) => {
                    declaration.push(' ');
                    declaration.push_str(next.trim());
                }
                None => break,
            }
        }
        let declaration = declaration.split(';').next().unwrap_or_default();
        let compact: String = declaration.split_whitespace().collect::<Vec<_>>().join(" ");
        let compact = compact.replace(" ::", "::").replace(":: ", "::");
        for path in expand(&compact) {
            out.push((public, path));
        }
    }
    out
}

/// `a::{b, c::{d, e as f}}` as `a::b`, `a::c::d`, `a::c::e` (`self` as the prefix itself).
fn expand(path: &str) -> Vec<String> {
    let path = path.trim();
    let Some(open) = path.find('{') else {
        let path = path.split(" as ").next().unwrap_or_default();
        return vec![path.trim().to_string()];
    };
    let base = path[..open].trim().trim_end_matches("::");
    let inner = &path[open + 1..path.rfind('}').unwrap_or(path.len())];
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .flat_map(expand)
        .map(|part| match part.as_str() {
            "self" => base.to_string(),
            _ => format!("{base}::{part}"),
        })
        .collect()
}

/// The import cycles between a crate's files: `a -> b -> a`. An import goes to the file that
/// defines the item (followed through re-exports); a re-export (`pub use`) is not itself an
/// import.
fn import_cycles(src: &Path) -> Vec<String> {
    let modules = modules(src);
    let code: BTreeMap<&str, String> = modules.iter().map(|(m, t)| (m.as_str(), code(t))).collect();
    let items: BTreeMap<&str, BTreeSet<String>> =
        code.iter().map(|(m, c)| (*m, self::items(c))).collect();
    let uses: BTreeMap<&str, Vec<(bool, String)>> =
        code.iter().map(|(m, c)| (*m, self::uses(c))).collect();
    let join = |parts: &[&str]| parts.join("/");
    // A `use` path as segments from the crate root, or `None` for another crate's.
    let absolute = |module: &str, path: &str| -> Option<Vec<String>> {
        let segments: Vec<&str> = path.split("::").collect();
        let mut current: Vec<&str> = module.split('/').filter(|s| !s.is_empty()).collect();
        let rest = match segments[0] {
            "crate" => {
                current.clear();
                &segments[1..]
            }
            "super" | "self" => {
                let mut i = 0;
                while i < segments.len() && matches!(segments[i], "super" | "self") {
                    if segments[i] == "super" {
                        current.pop();
                    }
                    i += 1;
                }
                &segments[i..]
            }
            first => {
                let mut child = current.clone();
                child.push(first);
                if !modules.contains_key(&join(&child)) {
                    return None;
                }
                &segments[..]
            }
        };
        current.extend(rest);
        Some(current.into_iter().map(str::to_string).collect())
    };
    // The file that defines `path` (segments from the root), through re-exports.
    fn defining(
        path: &[String],
        depth: usize,
        modules: &BTreeMap<String, String>,
        items: &BTreeMap<&str, BTreeSet<String>>,
        uses: &BTreeMap<&str, Vec<(bool, String)>>,
        absolute: &dyn Fn(&str, &str) -> Option<Vec<String>>,
    ) -> Option<String> {
        let whole = path.join("/");
        if modules.contains_key(&whole) || depth > 8 {
            return modules.contains_key(&whole).then_some(whole);
        }
        let mut k = path.len();
        while k > 0 && !modules.contains_key(&path[..k].join("/")) {
            k -= 1;
        }
        let module = path[..k].join("/");
        let Some(name) = path.get(k) else {
            return Some(module);
        };
        if items[module.as_str()].contains(name) {
            return Some(module);
        }
        for (_, used) in &uses[module.as_str()] {
            let last = used.rsplit("::").next().unwrap_or_default();
            if last == name || last == "*" {
                if let Some(mut target) = absolute(&module, used) {
                    if last == "*" {
                        target.pop();
                        target.push(name.clone());
                    }
                    if let Some(found) =
                        defining(&target, depth + 1, modules, items, uses, absolute)
                    {
                        return Some(found);
                    }
                }
            }
        }
        Some(module)
    }
    let mut edges: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (module, used) in &uses {
        for (public, path) in used {
            let Some(mut target) = (!public).then(|| absolute(module, path)).flatten() else {
                continue;
            };
            if target.last().is_some_and(|s| s == "*") {
                target.pop();
            }
            if let Some(file) = defining(&target, 0, &modules, &items, &uses, &absolute) {
                if file != *module {
                    edges.entry(module).or_default().insert(file);
                }
            }
        }
    }
    // Depth-first search; each cycle reported once, from its first module in order.
    let mut cycles = BTreeSet::new();
    fn visit<'a>(
        module: &'a str,
        edges: &'a BTreeMap<&str, BTreeSet<String>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        cycles: &mut BTreeSet<String>,
    ) {
        if let Some(at) = stack.iter().position(|m| *m == module) {
            let mut cycle: Vec<&str> = stack[at..].to_vec();
            let first = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap();
            cycle.rotate_left(first);
            cycle.push(cycle[0]);
            let names: Vec<&str> = cycle
                .iter()
                .map(|m| if m.is_empty() { "lib" } else { m })
                .collect();
            cycles.insert(names.join(" -> "));
            return;
        }
        if !done.insert(module) {
            return;
        }
        stack.push(module);
        for next in edges.get(module).into_iter().flatten() {
            visit(next, edges, stack, done, cycles);
        }
        stack.pop();
    }
    let mut done = BTreeSet::new();
    for module in modules.keys() {
        let mut stack = Vec::new();
        visit(module, &edges, &mut stack, &mut done, &mut cycles);
    }
    cycles.into_iter().collect()
}
