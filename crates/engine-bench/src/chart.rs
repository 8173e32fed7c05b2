//! The SVG chart: per workload, a bar per route for computed prompt tokens over the lower bound
//! and for TTFT p50 over round-robin's, each with a line at 1.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::{Report, RouteFigures, WorkloadReport};
use crate::run::Route;

const WIDTH: u32 = 1200;
const HEIGHT: u32 = 520;

fn colour(route: Route) -> RGBColor {
    match route {
        Route::RoundRobin => RGBColor(150, 160, 175),
        Route::LeastLoaded => RGBColor(96, 125, 160),
        Route::ProxyMemoryOff => RGBColor(214, 96, 39),
        Route::ProxyMemoryOn => RGBColor(150, 50, 20),
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
        "llama-server: {} replicas x {} slots, tiny model; proxy = burst-prefix (ours)",
        report.setup.replicas, report.setup.slots
    );
    let root = root.titled(&title, ("sans-serif", 20))?;
    let panels = root.split_evenly((1, 2));
    let by_bound: Figure = |w, r| r.computed_tokens as f64 / w.lower_bound_tokens.max(1) as f64;
    let by_rr_ttft: Figure = |w, r| {
        w.round_robin()
            .map_or(f64::NAN, |rr| r.ttft_p50_ms / rr.ttft_p50_ms)
    };
    let series = [
        (
            "computed prompt tokens / lower bound (lower is better)",
            by_bound,
        ),
        ("TTFT p50 / round-robin's (lower is better)", by_rr_ttft),
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
    let workloads = &report.workloads;
    let values: Vec<Vec<(Route, f64)>> = workloads
        .iter()
        .map(|w| w.routes.iter().map(|r| (r.route, figure(w, r))).collect())
        .collect();
    let top = values
        .iter()
        .flatten()
        .map(|(_, v)| *v)
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(16)
        .x_label_area_size(30)
        .y_label_area_size(44)
        .build_cartesian_2d(0.0..workloads.len() as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_max_light_lines(1)
        .y_label_style(("sans-serif", 13))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()?;
    let slots = Route::ALL.len() as f64;
    let width = 0.8 / slots;
    for (i, routes) in values.iter().enumerate() {
        for (route, value) in routes.iter().filter(|(_, v)| v.is_finite()) {
            let j = Route::ALL.iter().position(|r| r == route).unwrap_or(0) as f64;
            let x0 = i as f64 + 0.1 + j * width;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0 + 0.01, 0.0), (x0 + width - 0.01, *value)],
                colour(*route).filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                format!("{value:.2}"),
                (x0 + width / 2.0, value + top * 0.01),
                ("sans-serif", 11)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )))?;
        }
        chart.draw_series(std::iter::once(Text::new(
            workloads[i].workload.clone(),
            (i as f64 + 0.5, -top * 0.02),
            ("sans-serif", 14)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Top)),
        )))?;
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, 1.0), (workloads.len() as f64, 1.0)],
        BLACK.stroke_width(1),
    )))?;
    for route in Route::ALL {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(route.name())
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour(route).filled())
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Setup;

    #[test]
    fn draws_a_bar_per_route_and_workload() {
        let figures = |route: Route, computed: u64, ttft: f64| RouteFigures {
            route,
            name: route.name(),
            computed_tokens: computed,
            ttft_p50_ms: ttft,
            ttft_p99_ms: ttft,
            wall_ms: 1.0,
            imbalance: 1.0,
        };
        let report = Report {
            setup: Setup {
                replicas: 4,
                slots: 2,
                threads: 1,
                cache_ram_mib: 1,
                max_tokens: 1,
                seed: 1,
                model: "tiny".into(),
                engine: "b1".into(),
                planner: String::new(),
            },
            workloads: vec![WorkloadReport {
                workload: "grpo".into(),
                steps: 1,
                requests: 2,
                prompt_tokens: 10,
                lower_bound_tokens: 100,
                routes: vec![
                    figures(Route::RoundRobin, 300, 200.0),
                    figures(Route::ProxyMemoryOff, 175, 100.0),
                ],
                simulator: Vec::new(),
            }],
        };
        let svg = svg(&report).unwrap();
        assert!(svg.starts_with("<svg"));
        for text in ["grpo", "3.00", "1.75", "0.50", "proxy, memory off"] {
            assert!(svg.contains(text), "missing {text}");
        }
        let markdown = report.to_markdown();
        assert!(
            markdown.contains("| proxy, memory off | 175 | 1.750 | 0.583 | 100 (0.50) |"),
            "{markdown}"
        );
    }
}
