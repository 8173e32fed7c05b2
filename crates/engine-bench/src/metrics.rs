//! Reading an engine's Prometheus text exposition (`GET /metrics`): the sum of one metric's
//! samples whose labels match, one label of an info metric, and a histogram's cumulative
//! buckets. Enough for vLLM's (and llm-d-inference-sim's) metrics; not a general parser (no
//! escapes inside label values are needed for them).

/// One sample: its metric name, its labels and its value.
#[derive(Debug, PartialEq)]
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(&'a str, &'a str)>,
    value: f64,
}

fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(parse_line)
}

fn parse_line(line: &str) -> Option<Sample<'_>> {
    let (series, rest) = match line.find('{') {
        Some(open) => {
            let close = open + line[open..].find('}')?;
            (&line[..close + 1], &line[close + 1..])
        }
        None => line.split_at(line.find(char::is_whitespace)?),
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, labels)) => (name, labels.trim_end_matches('}')),
        None => (series, ""),
    };
    let labels = labels
        .split(',')
        .filter(|pair| !pair.trim().is_empty())
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key.trim(), value.trim().trim_matches('"')))
        })
        .collect();
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// The sum of `name`'s samples that carry every label of `matching`; `None` when it has none.
pub fn sum(text: &str, name: &str, matching: &[(&str, &str)]) -> Option<f64> {
    samples(text)
        .filter(|s| s.name == name)
        .filter(|s| matching.iter().all(|m| s.labels.contains(m)))
        .map(|s| s.value)
        .reduce(|a, b| a + b)
}

/// The value of label `label` on the first sample of `name` (an info metric's field).
pub fn label(text: &str, name: &str, label: &str) -> Option<String> {
    samples(text)
        .find(|s| s.name == name)?
        .labels
        .into_iter()
        .find(|(key, _)| *key == label)
        .map(|(_, value)| value.to_string())
}

/// The cumulative buckets of histogram `name` (its `name_bucket` samples), summed over every
/// other label: `(upper bound, count)`, in increasing bound, `+Inf` last.
pub fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let series = format!("{name}_bucket");
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for sample in samples(text).filter(|s| s.name == series) {
        let Some(bound) = sample.labels.iter().find(|(key, _)| *key == "le").and_then(
            |(_, value)| match *value {
                "+Inf" => Some(f64::INFINITY),
                other => other.parse().ok(),
            },
        ) else {
            continue;
        };
        match buckets.iter_mut().find(|(b, _)| *b == bound) {
            Some((_, count)) => *count += sample.value,
            None => buckets.push((bound, sample.value)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_compute"} 1728.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_cache_hit"} 6272.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 7.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 1.0
vllm:cache_config_info{block_size="128",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
process_open_fds 12
vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.01"} 3
vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.1"} 5
vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} 6
vllm:time_to_first_token_seconds_bucket{model_name="n",le="0.1"} 1
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.75
"#;

    #[test]
    fn sums_the_samples_whose_labels_match() {
        let computed = sum(
            TEXT,
            "vllm:prompt_tokens_by_source_total",
            &[("source", "local_compute")],
        );
        assert_eq!(computed, Some(1728.0));
        assert_eq!(sum(TEXT, "vllm:request_success_total", &[]), Some(8.0));
        assert_eq!(sum(TEXT, "process_open_fds", &[]), Some(12.0));
        assert_eq!(sum(TEXT, "vllm:missing", &[]), None);
    }

    #[test]
    fn sums_a_histograms_buckets_over_labels() {
        assert_eq!(
            buckets(TEXT, "vllm:time_to_first_token_seconds"),
            vec![(0.01, 3.0), (0.1, 6.0), (f64::INFINITY, 6.0)]
        );
        assert_eq!(
            sum(TEXT, "vllm:time_to_first_token_seconds_sum", &[]),
            Some(0.75)
        );
        assert!(buckets(TEXT, "vllm:missing").is_empty());
    }

    #[test]
    fn reads_an_info_metrics_label() {
        assert_eq!(
            label(TEXT, "vllm:cache_config_info", "num_gpu_blocks").as_deref(),
            Some("2048")
        );
        assert_eq!(label(TEXT, "vllm:cache_config_info", "nope"), None);
    }
}
