//! The chart of a result file: per fleet size, ours and BLIS's routers against round-robin, in
//! makespan and in mean time to first token, per workload.

use burst_prefix_engine_bench::chart::grouped_bars;
use plotters::prelude::*;

use crate::bench::Stored;
use crate::report::{RouteFigures, RunReport, BASELINE};

/// The chart as an SVG document.
pub fn svg(json: &serde_json::Value) -> Result<String, String> {
    let stored: Stored = serde_json::from_value(json.clone()).map_err(|e| e.to_string())?;
    let mut sizes: Vec<usize> = stored.runs.iter().map(|r| r.instances).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = String::new();
    {
        let height = 380 * sizes.len().max(1) as u32 + 40;
        let root = SVGBackend::with_string(&mut out, (1500, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(
                &format!(
                    "BLIS {} ({}): ours and BLIS's routers over round-robin (lower is better)",
                    stored.setup.blis_commit,
                    crate::tables::setting_text(&stored.setup.setting)
                ),
                ("sans-serif", 18),
            )
            .map_err(|e| e.to_string())?;
        let rows = root.split_evenly((sizes.len().max(1), 2));
        let routes: Vec<&str> = stored
            .setup
            .routes
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        type Figure = fn(&RunReport, &RouteFigures) -> f64;
        let figures: [(&str, Figure); 2] = [
            ("makespan (RL steps: theirs)", |run, f| {
                run.judged_makespan_s(f)
            }),
            ("TTFT mean", |_, f| f.ttft_mean_ms),
        ];
        for (row, &size) in sizes.iter().enumerate() {
            let runs: Vec<_> = stored.runs.iter().filter(|r| r.instances == size).collect();
            let labels: Vec<String> = runs.iter().map(|r| r.workload.clone()).collect();
            for (column, (caption, figure)) in figures.iter().enumerate() {
                let values: Vec<Vec<Option<f64>>> = runs
                    .iter()
                    .map(|run| {
                        let base = run.routes.get(BASELINE).map(|f| figure(run, f));
                        routes
                            .iter()
                            .map(|route| {
                                let value = figure(run, run.routes.get(*route)?);
                                base.filter(|b| *b > 0.0).map(|b| value / b)
                            })
                            .collect()
                    })
                    .collect();
                grouped_bars(
                    &rows[row * 2 + column],
                    &format!("{size} instances: {caption} / round-robin's"),
                    &labels,
                    &routes,
                    &values,
                    false,
                )
                .map_err(|e| e.to_string())?;
            }
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}
