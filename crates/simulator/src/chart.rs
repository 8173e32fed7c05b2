//! The `--svg` chart: per policy, bars of prefill over the lower bound and of imbalance, each
//! with a line at the ideal 1.

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::report::Report;

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 520;
/// Ours stands out; the baselines share one colour.
const OURS: RGBColor = RGBColor(214, 96, 39);
const BASELINE: RGBColor = RGBColor(96, 125, 160);
const IDEAL: RGBColor = RGBColor(40, 40, 40);

/// The chart as an SVG document.
pub fn svg(report: &Report) -> Result<String, String> {
    let mut out = String::new();
    draw(report, &mut out).map_err(|e| format!("cannot draw the chart: {e}"))?;
    Ok(out)
}

fn draw(report: &Report, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "{} workload: {} requests in {} steps on {} replicas; lower bound {} prefill tokens; \
         burst = ours",
        report.workload,
        report.requests,
        report.steps,
        report.replicas,
        crate::report::thousands(report.lower_bound_tokens)
    );
    let root = root.titled(&title, ("sans-serif", 20))?;
    let names: Vec<&str> = report.policies.iter().map(|p| p.name.as_str()).collect();
    let panels = root.split_evenly((1, 2));
    let series = [
        (
            "prefill tokens / lower bound (lower is better)",
            report
                .policies
                .iter()
                .map(|p| p.ratio_to_lower_bound)
                .collect::<Vec<_>>(),
        ),
        (
            "imbalance: busiest replica / mean (lower is better)",
            report.policies.iter().map(|p| p.imbalance).collect(),
        ),
    ];
    for (panel, (caption, values)) in panels.iter().zip(&series) {
        bars(panel, caption, &names, values)?;
    }
    root.present()?;
    Ok(())
}

fn bars(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    names: &[&str],
    values: &[f64],
) -> Result<(), Box<dyn std::error::Error>> {
    let top = values.iter().copied().fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(48)
        // A segmented 0..last has last + 1 segments: one per policy.
        .build_cartesian_2d(
            (0..names.len().saturating_sub(1)).into_segmented(),
            0.0..top,
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_max_light_lines(1)
        .x_labels(names.len())
        .x_label_formatter(&|value| match value {
            SegmentValue::CenterOf(i) => names.get(*i).copied().unwrap_or("").to_string(),
            _ => String::new(),
        })
        .x_label_style(("sans-serif", 13))
        .y_label_style(("sans-serif", 13))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()?;
    chart.draw_series(values.iter().enumerate().map(|(i, &value)| {
        let colour = if names[i] == "burst" { OURS } else { BASELINE };
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), value),
            ],
            colour.filled(),
        );
        bar.set_margin(0, 0, 10, 10);
        bar
    }))?;
    let label = ("sans-serif", 14)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    chart.draw_series(values.iter().enumerate().map(|(i, &value)| {
        Text::new(
            format!("{value:.2}"),
            (SegmentValue::CenterOf(i), value + top * 0.01),
            label.clone(),
        )
    }))?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(SegmentValue::Exact(0), 1.0), (SegmentValue::Last, 1.0)],
        IDEAL.stroke_width(1),
    )))?;
    chart.draw_series(std::iter::once(Text::new(
        "ideal",
        (SegmentValue::Last, 1.0),
        ("sans-serif", 12)
            .into_font()
            .color(&IDEAL)
            .pos(Pos::new(HPos::Right, VPos::Bottom)),
    )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::PolicyReport;

    #[test]
    fn draws_a_bar_and_a_label_per_policy() {
        let policy = |name: &str, ratio: f64| PolicyReport {
            name: name.into(),
            prefill_tokens: 1,
            ratio_to_lower_bound: ratio,
            imbalance: 1.1,
            colocation_rate: Some(1.0),
            step_time_tokens: 1,
        };
        let report = Report {
            workload: "grpo".into(),
            seed: 1,
            replicas: 2,
            cache_blocks: 10,
            block_size_tokens: 4,
            steps: 1,
            requests: 4,
            lower_bound_tokens: 12,
            policies: vec![policy("round-robin", 5.25), policy("burst", 1.0)],
        };
        let svg = svg(&report).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        for text in ["round-robin", "burst", "5.25", "1.00", "1.10"] {
            assert!(svg.contains(text), "missing {text}");
        }
    }
}
