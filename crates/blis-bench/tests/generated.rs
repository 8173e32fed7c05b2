//! The tables made from result files are what the generator makes from them: a table edited by
//! hand, or a result file changed without making its tables again, fails here (`make check`).

use std::path::Path;

use burst_prefix_blis_bench::generated::{regenerate, FILES};

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

#[test]
fn the_generated_regions_of_the_docs_are_what_their_result_files_make() {
    for file in FILES {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let made = regenerate(&text, root()).unwrap();
        assert!(
            made == text,
            "{file}: a generated table differs from its result file; run `make results`"
        );
    }
}

#[test]
fn every_committed_blis_result_has_the_tables_its_json_makes() {
    let results = root().join("bench/blis/results");
    let Ok(entries) = std::fs::read_dir(&results) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let made = burst_prefix_blis_bench::tables::markdown(&json, &file).unwrap();
        let committed = std::fs::read_to_string(path.with_extension("md")).unwrap();
        assert!(
            made == committed,
            "{}: its .md differs from what its JSON makes; run `burst-prefix-blis-bench tables {}`",
            path.display(),
            path.display()
        );
    }
}

#[test]
fn a_table_edited_by_hand_is_found() {
    let json = root().join("bench/blis/results");
    let Some(result) = std::fs::read_dir(&json).ok().and_then(|mut d| {
        d.find_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "json").then_some(p)
        })
    }) else {
        return;
    };
    let relative = result.strip_prefix(root()).unwrap().display().to_string();
    let region = format!("<!-- generated: blis summary {relative} -->\n\n| typed | by hand |\n<!-- end generated -->\n");
    let made = regenerate(&region, root()).unwrap();
    assert_ne!(made, region, "a typed table is replaced");
    assert_eq!(
        regenerate(&made, root()).unwrap(),
        made,
        "a generated one stays"
    );
}
