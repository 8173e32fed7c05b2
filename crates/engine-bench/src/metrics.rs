//! Reading an engine's Prometheus text exposition (`GET /metrics`): the sum of one metric's
//! samples whose labels match, and one label of an info metric. Enough for vLLM's counters; not
//! a general parser (no escapes inside label values are needed for them).

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
    fn reads_an_info_metrics_label() {
        assert_eq!(
            label(TEXT, "vllm:cache_config_info", "num_gpu_blocks").as_deref(),
            Some("2048")
        );
        assert_eq!(label(TEXT, "vllm:cache_config_info", "nope"), None);
    }
}
