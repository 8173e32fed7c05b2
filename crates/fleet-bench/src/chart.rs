//! The SVG chart: per fleet size with an inference-perf sweep, TTFT p50 and output tokens per
//! second against the offered rate (one line per route, the mean over seeds); then the driver's
//! workloads' makespan and TTFT p50 over round-robin's (a bar per route, the mean over seeds and
//! steps).

use plotters::coord::Shift;
use plotters::prelude::*;

use burst_prefix_engine_bench::chart::{colour, grouped_bars};

use crate::report::{Pick, Report, StepFigures, RATIOS};

const WIDTH: u32 = 1400;
const ROW: u32 = 460;

/// The chart as an SVG document.
pub fn svg(report: &Report) -> Result<String, String> {
    let mut out = String::new();
    draw(report, &mut out).map_err(|e| format!("cannot draw the chart: {e}"))?;
    Ok(out)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn mean(values: &[f64]) -> Option<f64> {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    (!finite.is_empty()).then(|| finite.iter().sum::<f64>() / finite.len() as f64)
}

fn sweep_sizes(report: &Report) -> Vec<usize> {
    let mut sizes: Vec<usize> = Vec::new();
    for run in &report.runs {
        if run.steps.iter().any(|s| s.offered_rate.is_some()) && !sizes.contains(&run.replicas) {
            sizes.push(run.replicas);
        }
    }
    sizes
}

fn driver_cells(report: &Report) -> Vec<(usize, String)> {
    report
        .cells()
        .into_iter()
        .filter(|&(replicas, workload)| {
            report.runs.iter().any(|r| {
                r.replicas == replicas
                    && r.workload == workload
                    && r.steps.iter().any(|s| s.makespan_ms.is_some())
            })
        })
        .map(|(r, w)| (r, w.to_string()))
        .collect()
}

fn draw(report: &Report, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let sizes = sweep_sizes(report);
    let cells = driver_cells(report);
    let rows = sizes.len() + usize::from(!cells.is_empty());
    let root =
        SVGBackend::with_string(out, (WIDTH, ROW * rows.max(1) as u32 + 40)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "llm-d-inference-sim fleet ({}, commit {}), seeds {:?} (mean); ours = burst-prefix",
        report.setup.provenance.date, report.setup.provenance.commit, report.setup.seeds
    );
    let root = root.titled(&title, ("sans-serif", 20))?;
    let areas = root.split_evenly((rows.max(1), 1));
    for (row, &replicas) in sizes.iter().enumerate() {
        let panels = areas[row].split_evenly((1, 2));
        let figures: [(&str, Pick); 2] = [
            ("TTFT p50 (ms, client)", |s| s.client.ttft_p50_ms),
            ("output tokens/s", |s| s.output_tokens_per_s),
        ];
        for (panel, (caption, pick)) in panels.iter().zip(figures) {
            let caption = format!("{caption} against offered rate (req/s), {replicas} replicas");
            lines(panel, &caption, report, replicas, pick)?;
        }
    }
    if !cells.is_empty() {
        let panels = areas[sizes.len()].split_evenly((1, 2));
        for (panel, (name, pick)) in panels.iter().zip([RATIOS[0], RATIOS[1]]) {
            let caption = format!("{name} / round-robin's (lower is better)");
            bars(panel, &caption, report, &cells, pick)?;
        }
    }
    root.present()?;
    Ok(())
}

/// (rate, mean over seeds of `pick`) of a route's sweep stages on `replicas` replicas.
fn sweep_points(report: &Report, replicas: usize, route: &str, pick: Pick) -> Vec<(f64, f64)> {
    let steps: Vec<&StepFigures> = report
        .runs
        .iter()
        .filter(|r| r.replicas == replicas && r.route == route)
        .flat_map(|r| &r.steps)
        .filter(|s| s.offered_rate.is_some())
        .collect();
    let mut rates: Vec<f64> = steps.iter().filter_map(|s| s.offered_rate).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    rates
        .into_iter()
        .filter_map(|rate| {
            let values: Vec<f64> = steps
                .iter()
                .filter(|s| s.offered_rate == Some(rate))
                .map(|s| pick(s))
                .collect();
            Some((rate, mean(&values)?))
        })
        .collect()
}

fn lines(
    area: &Area<'_>,
    caption: &str,
    report: &Report,
    replicas: usize,
    pick: Pick,
) -> Result<(), Box<dyn std::error::Error>> {
    let routes = report.route_names();
    let series: Vec<(&str, Vec<(f64, f64)>)> = routes
        .iter()
        .map(|&route| (route, sweep_points(report, replicas, route, pick)))
        .filter(|(_, points)| !points.is_empty())
        .collect();
    let points = series.iter().flat_map(|(_, p)| p);
    let x_max = points.clone().map(|p| p.0).fold(1.0, f64::max) * 1.05;
    let y_max = points.map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(16)
        .x_label_area_size(30)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .y_max_light_lines(1)
        .x_max_light_lines(1)
        .label_style(("sans-serif", 12))
        .draw()?;
    for (index, (route, points)) in series.iter().enumerate() {
        let colour = colour(route, index);
        chart
            .draw_series(std::iter::once(PathElement::new(
                points.clone(),
                colour.stroke_width(2),
            )))?
            .label(route.to_string())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 14, y)], colour.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 11))
        .draw()?;
    Ok(())
}

fn bars(
    area: &Area<'_>,
    caption: &str,
    report: &Report,
    cells: &[(usize, String)],
    pick: Pick,
) -> Result<(), Box<dyn std::error::Error>> {
    let routes = report.route_names();
    let values: Vec<Vec<Option<f64>>> = cells
        .iter()
        .map(|(replicas, workload)| {
            routes
                .iter()
                .map(|route| mean(&report.ratios(*replicas, workload, route, pick)))
                .collect()
        })
        .collect();
    let labels: Vec<String> = cells
        .iter()
        .map(|(replicas, workload)| format!("{workload}, {replicas}"))
        .collect();
    grouped_bars(area, caption, &labels, &routes, &values, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{report, step};
    use crate::report::{RunFigures, ROUND_ROBIN};

    #[test]
    fn draws_the_sweep_lines_and_the_makespan_bars() {
        let sweep = |route: &str, ttft: f64| RunFigures {
            replicas: 16,
            workload: "shared-prefix".into(),
            seed: 1,
            route: route.into(),
            steps: vec![
                StepFigures {
                    makespan_ms: None,
                    ..step(0.0, ttft, Some(4.0))
                },
                StepFigures {
                    makespan_ms: None,
                    ..step(0.0, ttft * 3.0, Some(8.0))
                },
            ],
        };
        let rl = |route: &str, makespan: f64| RunFigures {
            replicas: 16,
            workload: "rl-64x8".into(),
            seed: 1,
            route: route.into(),
            steps: vec![step(makespan, 10.0, None)],
        };
        let report = report(vec![
            sweep(ROUND_ROBIN, 20.0),
            sweep("ours", 10.0),
            rl(ROUND_ROBIN, 1000.0),
            rl("ours", 800.0),
        ]);
        assert_eq!(
            sweep_points(&report, 16, "ours", |s| s.client.ttft_p50_ms),
            vec![(4.0, 10.0), (8.0, 30.0)]
        );
        let svg = svg(&report).unwrap();
        assert!(svg.starts_with("<svg"));
        for text in ["ours", "round-robin", "rl-64x8, 16", "against offered rate"] {
            assert!(svg.contains(text), "missing {text}");
        }
    }
}
