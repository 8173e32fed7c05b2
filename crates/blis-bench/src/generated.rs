//! Tables in the docs that are made from result files, never typed (docs/load-benches.md): a
//! region of a markdown file between
//!
//! ```text
//! <!-- generated: blis summary bench/blis/results/F.json -->
//! ...
//! <!-- end generated -->
//! ```
//!
//! holds what `burst-prefix-blis-bench results` writes there from F.json (its summary table,
//! [`crate::tables::summary`]); `make check` fails when it differs.

use std::path::Path;

use anyhow::{bail, Context};

use crate::bench::Stored;

const START: &str = "<!-- generated: blis summary ";
const END: &str = "<!-- end generated -->";

/// `text` with every generated region rewritten from its result file (paths relative to
/// `root`).
pub fn regenerate(text: &str, root: &Path) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(START) {
        let (before, region) = rest.split_at(at);
        out.push_str(before);
        let line_end = region
            .find('\n')
            .context("a generated region's first line")?;
        let marker = &region[..line_end];
        let file = marker
            .strip_prefix(START)
            .and_then(|m| m.strip_suffix(" -->"))
            .with_context(|| format!("not a region marker: {marker}"))?
            .trim();
        let Some(end) = region.find(END) else {
            bail!("the region of {file} has no `{END}`");
        };
        let json =
            std::fs::read_to_string(root.join(file)).with_context(|| format!("reading {file}"))?;
        let stored: Stored =
            serde_json::from_str(&json).with_context(|| format!("{file}: not a result file"))?;
        out.push_str(marker);
        out.push_str("\n\n");
        out.push_str(&crate::tables::summary(&stored));
        out.push('\n');
        out.push_str(END);
        rest = &region[end + END.len()..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The markdown files whose regions are generated.
pub const FILES: [&str; 2] = ["BENCHMARKS.md", "README.md"];
