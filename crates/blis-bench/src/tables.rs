//! The markdown of a result file, made from its JSON alone (so that it can be made again from a
//! committed file: `burst-prefix-blis-bench tables F.json`).

use std::fmt::Write as _;

use anyhow::Context;

use crate::bench::Stored;
use crate::report::{RouteFigures, RunReport, BASELINE, OURS};

/// The tables of the result file `json` (named `file`).
pub fn markdown(json: &serde_json::Value, file: &str) -> anyhow::Result<String> {
    let stored: Stored =
        serde_json::from_value(json.clone()).context("not a BLIS bench result file")?;
    let setup = &stored.setup;
    let mut md = String::new();
    let _ = writeln!(md, "# BLIS bench: {file}\n");
    let _ = writeln!(
        md,
        "Generated from `{file}` by `burst-prefix-blis-bench tables`. Made {} from {} on {} \
         cores; BLIS {} ({}); seed {}; every request of ours asked `max_tokens: {}`. Command: \
         `{}`.\n",
        setup.provenance.date,
        setup.provenance.commit,
        setup.provenance.cores,
        setup.blis_commit,
        crate::tables::setting_text(&setup.setting),
        setup.seed,
        setup.max_tokens,
        setup.command,
    );
    if let Some(check) = &setup.plain_round_robin {
        let _ = writeln!(
            md,
            "The bench's BLIS (with our policy added) against BLIS without it, round-robin on {} \
             x{}: makespan {:.3} s and {:.3} s, TTFT mean {:.1} ms and {:.1} ms: every cluster \
             figure {}.\n",
            check.trace,
            check.instances,
            check.bench_makespan_s,
            check.plain_makespan_s,
            check.bench_ttft_mean_ms,
            check.plain_ttft_mean_ms,
            if check.equal { "equal" } else { "NOT equal" }
        );
    }
    let _ = writeln!(md, "Routes:\n");
    for route in &setup.routes {
        match route.planner_yaml() {
            Some(planner) => {
                let _ = writeln!(
                    md,
                    "- `{}`: ours, BLIS's `burst-prefix` policy asking the producer's placer with planner config `{}`",
                    route.name,
                    planner.trim().replace('\n', "; ")
                );
            }
            None => {
                let _ = writeln!(md, "- `{}`: `{}`", route.name, route.blis.join(" "));
            }
        }
    }
    let order: Vec<String> = setup.routes.iter().map(|r| r.name.clone()).collect();
    let _ = writeln!(
        md,
        "\n## Ours against round-robin and the best other route\n"
    );
    md.push_str(&summary(&stored));
    for run in &stored.runs {
        let _ = writeln!(
            md,
            "\n## {}, {} instances ({} requests{})\n",
            run.workload,
            run.instances,
            run.requests,
            run.objective
                .map_or(String::new(), |o| format!("; judged by {o:?}")
                    .to_lowercase())
        );
        md.push_str(&run.table(&order));
        let classes: Vec<String> = order
            .iter()
            .filter_map(|name| {
                let figures = run.routes.get(name)?;
                (figures.ttft_mean_ms_by_class.len() > 1).then(|| {
                    let by: Vec<String> = figures
                        .ttft_mean_ms_by_class
                        .iter()
                        .map(|(class, ms)| format!("{class} {ms:.0}"))
                        .collect();
                    format!("{name}: {}", by.join(", "))
                })
            })
            .collect();
        if !classes.is_empty() {
            let _ = writeln!(md, "\nTTFT mean ms by client: {}.", classes.join("; "));
        }
        let placer: Vec<String> = run
            .routes
            .iter()
            .filter_map(|(name, f)| {
                let p = f.placer.as_ref()?;
                Some(format!(
                    "{name}: {:.1} µs mean, {:.1} µs p99 per placement (the core's admit to route, body parsing and hashing included; {:.1} µs of it the place stage)",
                    p.mean_us, p.p99_us, p.place_mean_us
                ))
            })
            .collect();
        if !placer.is_empty() {
            let _ = writeln!(md, "\nOur placer: {}.", placer.join("; "));
        }
    }
    Ok(md)
}

/// The summary of a result file: ours against round-robin and the best other route, per run,
/// with the targets of the BLIS bench (bench/blis/README.md) checked.
pub fn summary(stored: &Stored) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Makespan is, for synchronous RL steps (grpo, grpo-saturated, epochs, chat-and-rl's \
         step), each step's from its arrival to its last answer, summed (`stepsS`); else \
         BLIS's `makespanS`. Best = the lowest of the routes that are not ours. Targets: \
         makespan at most 1.04x the best; TTFT mean at most round-robin's, and where prompts \
         repeat or the traffic is a stream (epochs, agents, chat-and-rl) at most 0.5x \
         round-robin's and 1.3x the best; e2e p99 at most 1.05x round-robin's; at 1,024 \
         instances or more, our place stage at most 20 µs a placement. *Placing* is our \
         place stage's mean per placement (and the core's whole path, admit to route, body \
         parsing and hashing included), wall time on the bench's machine; *replay wall* is the \
         whole replay's (BLIS's simulation with its routing, and for ours our placer) against \
         round-robin's.\n"
    );
    let _ = writeln!(
        md,
        "| workload | instances | route | makespan / best | makespan / round-robin | TTFT mean / round-robin | TTFT mean / best | e2e p99 / round-robin | placing µs (whole path) | replay wall / round-robin's | targets |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
    for run in &stored.runs {
        for (name, ours) in run.routes.iter().filter(|(n, _)| n.starts_with(OURS)) {
            let _ = writeln!(md, "{}", summary_row(run, name, ours));
        }
    }
    md
}

/// The targets `ours` misses on `run`, said briefly (empty: met); `None` without round-robin.
/// Three decimals: a miss by a hair (1.042x against 1.04x) must not read as a tie.
fn missed(run: &RunReport, ours: &RouteFigures) -> Option<Vec<String>> {
    let rr = run.routes.get(BASELINE)?;
    let mut missed = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            missed.push(what);
        }
    };
    if let Some((_, best)) = run.best_peer(|f| run.judged_makespan_s(f)) {
        let ratio = run.judged_makespan_s(ours) / best;
        check(ratio <= 1.04, format!("makespan {ratio:.3}x the best"));
    }
    let ttft = ours.ttft_mean_ms / rr.ttft_mean_ms;
    check(ttft <= 1.0, format!("TTFT {ttft:.3}x round-robin's"));
    if run.repeats_or_streams {
        check(ttft <= 0.5, format!("TTFT {ttft:.3}x round-robin's"));
        if let Some((_, best)) = run.best_peer(|f| f.ttft_mean_ms) {
            let ratio = ours.ttft_mean_ms / best;
            check(ratio <= 1.3, format!("TTFT {ratio:.3}x the best"));
        }
    }
    let e2e = ours.e2e_p99_ms / rr.e2e_p99_ms;
    check(e2e <= 1.05, format!("e2e p99 {e2e:.3}x round-robin's"));
    if let Some(placer) = ours.placer.as_ref().filter(|_| run.instances >= 1_024) {
        let us = placer.place_mean_us;
        check(us <= 20.0, format!("placing {us:.1} µs"));
    }
    missed.dedup();
    Some(missed)
}

fn summary_row(run: &RunReport, name: &str, ours: &RouteFigures) -> String {
    let ratio = |a: f64, b: Option<f64>| {
        b.filter(|b| *b > 0.0)
            .map_or("-".to_string(), |b| format!("{:.2}", a / b))
    };
    let rr = run.routes.get(BASELINE);
    let best_makespan = run.best_peer(|f| run.judged_makespan_s(f));
    let best_ttft = run.best_peer(|f| f.ttft_mean_ms);
    let targets = match missed(run, ours) {
        None => "-".to_string(),
        Some(missed) if missed.is_empty() => "met".to_string(),
        Some(missed) => format!("missed: {}", missed.join(", ")),
    };
    let placing = ours.placer.as_ref().map_or("-".to_string(), |p| {
        format!("{:.1} ({:.0})", p.place_mean_us, p.mean_us)
    });
    format!(
        "| {} | {} | {name} | {} ({}) | {} | {} | {} ({}) | {} | {placing} | {} | {targets} |",
        run.workload,
        run.instances,
        ratio(run.judged_makespan_s(ours), best_makespan.map(|b| b.1)),
        best_makespan.map_or("-", |b| b.0),
        ratio(
            run.judged_makespan_s(ours),
            rr.map(|r| run.judged_makespan_s(r))
        ),
        ratio(ours.ttft_mean_ms, rr.map(|r| r.ttft_mean_ms)),
        ratio(ours.ttft_mean_ms, best_ttft.map(|b| b.1)),
        best_ttft.map_or("-", |b| b.0),
        ratio(ours.e2e_p99_ms, rr.map(|r| r.e2e_p99_ms)),
        ratio(ours.wall_s, rr.map(|r| r.wall_s)),
    )
}

/// "model on hardware, TP n" of a result file's `setting`.
pub fn setting_text(setting: &serde_json::Value) -> String {
    format!(
        "{} on {}, TP {}",
        setting["model"].as_str().unwrap_or("?"),
        setting["hardware"].as_str().unwrap_or("?"),
        setting["tp"]
    )
}
