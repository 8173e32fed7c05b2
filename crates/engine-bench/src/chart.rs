//! The SVG chart: per workload, a bar per route for computed prompt tokens over the lower bound
//! and for the busiest replica's sum over its bound (the mean over the seeds), each with a line
//! at 1.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{Report, RouteFigures, WorkloadReport};

const WIDTH: u32 = 1400;
const HEIGHT: u32 = 560;

/// Direct routes grey-blue, ours (`proxy...`, `ours...`) orange-brown, peers green and purple.
pub fn colour(route: &str, index: usize) -> RGBColor {
    let shade = |base: (u8, u8, u8), i: usize| {
        let k = (i % 4) as u8 * 28;
        RGBColor(
            base.0.saturating_add(k),
            base.1.saturating_add(k),
            base.2.saturating_add(k),
        )
    };
    if route.starts_with("proxy") || route.starts_with("ours") {
        shade((150, 50, 20), index)
    } else if route.starts_with("sglang") {
        shade((30, 110, 60), index)
    } else if route.starts_with("vllm-router") {
        shade((90, 60, 140), index)
    } else {
        shade((96, 115, 140), index)
    }
}

/// The chart as an SVG document.
pub fn svg(report: &Report) -> Result<String, String> {
    let mut out = String::new();
    draw(report, &mut out).map_err(|e| format!("cannot draw the chart: {e}"))?;
    Ok(out)
}

type Figure = fn(&WorkloadReport, &RouteFigures) -> f64;

fn draw(report: &Report, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "{}: {} replicas, tiny model, seeds {:?} (mean); proxy = burst-prefix (ours)",
        report.setup.engine, report.setup.replicas, report.setup.seeds
    );
    let root = root.titled(&title, ("sans-serif", 20))?;
    let panels = root.split_evenly((1, 2));
    let series: [(&str, Figure); 2] = [
        (
            "computed prompt tokens / lower bound (lower is better)",
            |w, r| w.by_bound(r),
        ),
        (
            "busiest replica's tokens, summed over steps / bound (lower is better)",
            |w, r| w.busiest_by_bound(r),
        ),
    ];
    for (panel, (caption, figure)) in panels.iter().zip(series) {
        bars(panel, caption, report, figure)?;
    }
    root.present()?;
    Ok(())
}

fn bars(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    report: &Report,
    figure: Figure,
) -> Result<(), Box<dyn std::error::Error>> {
    let workloads = report.workload_names();
    let routes = report.route_names();
    // values[workload][route]: the mean over the seeds that ran it.
    let values: Vec<Vec<Option<f64>>> = workloads
        .iter()
        .map(|&name| {
            routes
                .iter()
                .map(|&route| {
                    let seen: Vec<f64> = report
                        .workloads
                        .iter()
                        .filter(|w| w.workload == name)
                        .filter_map(|w| {
                            Some(figure(w, w.routes.iter().find(|r| r.route == route)?))
                        })
                        .filter(|v| v.is_finite())
                        .collect();
                    (!seen.is_empty()).then(|| seen.iter().sum::<f64>() / seen.len() as f64)
                })
                .collect()
        })
        .collect();
    let labels: Vec<String> = workloads.iter().map(|w| w.to_string()).collect();
    grouped_bars(area, caption, &labels, &routes, &values, true)
}

/// Bars in groups: one group per label, one bar per route (`values[group][route]`, `None`: no
/// bar), each route in its colour, a line at 1, a legend; with `value_labels`, each bar's value
/// above it. The engine bench's and the fleet bench's charts both draw these.
pub fn grouped_bars(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    labels: &[String],
    routes: &[&str],
    values: &[Vec<Option<f64>>],
    value_labels: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let top = values
        .iter()
        .flatten()
        .flatten()
        .fold(1.0, |a: f64, &b| a.max(b))
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(16)
        .x_label_area_size(30)
        .y_label_area_size(44)
        .build_cartesian_2d(0.0..labels.len() as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_max_light_lines(1)
        .y_label_style(("sans-serif", 13))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()?;
    let width = 0.8 / routes.len().max(1) as f64;
    for (i, per_route) in values.iter().enumerate() {
        for (j, value) in per_route.iter().enumerate() {
            let Some(value) = *value else { continue };
            let x0 = i as f64 + 0.1 + j as f64 * width;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0 + 0.005, 0.0), (x0 + width - 0.005, value)],
                colour(routes[j], j).filled(),
            )))?;
            if value_labels {
                chart.draw_series(std::iter::once(Text::new(
                    format!("{value:.2}"),
                    (x0 + width / 2.0, value + top * 0.01),
                    ("sans-serif", 9)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Center, VPos::Bottom)),
                )))?;
            }
        }
        chart.draw_series(std::iter::once(Text::new(
            labels[i].clone(),
            (i as f64 + 0.5, -top * 0.02),
            ("sans-serif", 14)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Top)),
        )))?;
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, 1.0), (labels.len() as f64, 1.0)],
        BLACK.stroke_width(1),
    )))?;
    for (j, route) in routes.iter().enumerate() {
        let colour = colour(route, j);
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(route.to_string())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 11))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Setup, ROUND_ROBIN};

    #[test]
    fn draws_a_bar_per_route_and_workload() {
        let figures = |route: &str, computed: u64, busiest: u64| RouteFigures {
            route: route.into(),
            ours: route.starts_with("proxy"),
            computed_tokens: computed,
            busiest_sum: busiest,
            answers_computed_tokens: computed,
            answers_without_usage: 0,
            ttft_p50_ms: 1.0,
            ttft_p99_ms: 1.0,
            wall_ms: 1.0,
            placements: Vec::new(),
            memory_in_use: None,
            baseline_of: None,
        };
        let report = Report {
            setup: Setup {
                provenance: Default::default(),
                routes: Vec::new(),
                engine: "vllm".into(),
                replicas: 4,
                engine_settings: String::new(),
                max_tokens: 1,
                seeds: vec![1],
                model: "tiny".into(),
                prompts: "text".into(),
                direct_fraction: 0.0,
                upstream: String::new(),
                answers: String::new(),
            },
            workloads: vec![WorkloadReport {
                workload: "grpo".into(),
                seed: 1,
                steps: 1,
                requests: 2,
                prompt_tokens: 10,
                lower_bound_tokens: 100,
                lower_bound_busiest: 50,
                routes: vec![
                    figures(ROUND_ROBIN, 300, 200),
                    figures("proxy, memory off", 175, 60),
                ],
                skipped: Vec::new(),
                simulator: Vec::new(),
            }],
        };
        let svg = svg(&report).unwrap();
        assert!(svg.starts_with("<svg"));
        for text in ["grpo", "3.00", "1.75", "4.00", "1.20", "proxy, memory off"] {
            assert!(svg.contains(text), "missing {text}");
        }
    }
}
