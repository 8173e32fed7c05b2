//! Every metric the chart's alerts (PrometheusRule) and Grafana dashboard query exists: the real
//! producer and the real operator run, serve some traffic and reconcile (one policy succeeds, one
//! fails), and their /metrics must hold a series for each metric name and exact label value the
//! rendered queries name.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use burst_prefix_test_support::ControlPlane;
use common::{
    binary, create_policy, eventually, free_port, http_get, install_crd, repo, start_operator_as,
    vllm_policy, Process, TIMEOUT,
};
use serde::Deserialize;
use serde_json::json;

/// A metric a query names, with the exact label values it requires.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Selector {
    name: String,
    labels: BTreeMap<String, String>,
}

/// The `burst_prefix_*` selectors of a PromQL expression (`name` or `name{a="b", c=~"..."}`;
/// only `=` matchers are kept: a regex matcher over a dashboard variable matches anything).
fn selectors(expr: &str) -> Vec<Selector> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("burst_prefix_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_string();
        let mut labels = BTreeMap::new();
        let after = &tail[end..];
        if let Some(inner) = after.strip_prefix('{') {
            let close = inner.find('}').expect("a closed label matcher");
            for matcher in inner[..close].split(',') {
                let matcher = matcher.trim();
                if matcher.contains("=~") || matcher.contains("!=") || matcher.is_empty() {
                    continue;
                }
                let (label, value) = matcher.split_once('=').expect("label=value");
                labels.insert(
                    label.trim().to_string(),
                    value.trim().trim_matches('"').to_string(),
                );
            }
        }
        found.push(Selector { name, labels });
        rest = &tail[end..];
    }
    found
}

/// The series of a Prometheus text exposition: name and labels.
fn series(exposition: &str) -> Vec<Selector> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let metric = line.rsplit_once(' ').map(|(m, _)| m).unwrap_or(line);
            let (name, labels) = match metric.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (metric, ""),
            };
            let labels = labels
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect();
            Selector {
                name: name.to_string(),
                labels,
            }
        })
        .collect()
}

/// The expressions of the chart's PrometheusRule and Grafana dashboard, as rendered.
fn chart_queries(control_plane: &ControlPlane) -> Vec<String> {
    let output = control_plane
        .helm()
        .args(["template", "bp"])
        .arg(repo().join("charts/burst-prefix"))
        .args([
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "grafanaDashboard.enabled=true",
            "--api-versions",
            "monitoring.coreos.com/v1/PrometheusRule",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let manifest = String::from_utf8(output.stdout).unwrap();
    let mut queries = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&manifest) {
        let object = serde_yaml::Value::deserialize(document)
            .ok()
            .and_then(|value| serde_json::to_value(value).ok())
            .unwrap_or(serde_json::Value::Null);
        match object["kind"].as_str() {
            Some("PrometheusRule") => {
                for group in object["spec"]["groups"].as_array().unwrap() {
                    for rule in group["rules"].as_array().unwrap() {
                        queries.push(rule["expr"].as_str().unwrap().to_string());
                    }
                }
            }
            Some("ConfigMap") if object["metadata"]["name"] == "bp-burst-prefix-dashboard" => {
                let dashboard: serde_json::Value =
                    serde_json::from_str(object["data"]["burst-prefix.json"].as_str().unwrap())
                        .unwrap();
                for panel in dashboard["panels"].as_array().unwrap() {
                    for target in panel["targets"].as_array().unwrap() {
                        queries.push(target["expr"].as_str().unwrap().to_string());
                    }
                }
                let variables = dashboard["templating"]["list"].as_array().unwrap();
                for variable in variables {
                    if let Some(query) = variable["definition"].as_str() {
                        queries.push(query.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    queries
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_the_alerts_and_dashboard_query_is_exported() {
    let control_plane = ControlPlane::shared();
    install_crd(control_plane);
    let queries = chart_queries(control_plane);
    assert!(queries.len() >= 10, "{queries:?}");
    let wanted: BTreeSet<Selector> = queries.iter().flat_map(|q| selectors(q)).collect();
    assert!(wanted
        .iter()
        .any(|s| s.name.starts_with("burst_prefix_operator_")));

    // The producer, on a config file with two endpoints, sent a burst.
    let config = control_plane.dir().join("observability-producer.yaml");
    std::fs::write(
        &config,
        "windowDurationMs: 50\nendpoints:\n  - {id: ns/a-rank-0, address: '127.0.0.1:9'}\n  - {id: ns/b-rank-0, address: '127.0.0.1:10'}\n",
    )
    .unwrap();
    let (api, admin, epp) = (free_port(), free_port(), free_port());
    let mut command = Command::new(binary("burst-prefix-producer"));
    command
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--listen", &format!("127.0.0.1:{api}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .args(["--epp-listen", &format!("127.0.0.1:{epp}")]);
    let producer = Process::spawn("producer", &mut command, control_plane.dir());
    let http = reqwest::Client::new();
    eventually("the producer to be ready", TIMEOUT, || async {
        http_get(&format!("http://127.0.0.1:{admin}/readyz"))
            .await
            .filter(|(code, _)| *code == 200)
    })
    .await;
    let burst = (0..4).map(|_| {
        http.post(format!("http://127.0.0.1:{api}/v1/produce"))
            .json(&json!({"model": "m", "prompt": "the same prompt, long enough ".repeat(20)}))
            .send()
    });
    for answer in futures::future::join_all(burst).await {
        assert!(answer.unwrap().status().is_success());
    }

    // The operator, reconciling one policy that works and one the API server refuses.
    let ns = control_plane.namespace("observability").await.unwrap();
    let operator = start_operator_as(control_plane, control_plane.kubeconfig(), &ns, &[]);
    let client = control_plane.client();
    let spec = vllm_policy(json!({}));
    create_policy(&client, &ns, "works", spec.clone()).await;
    let mut broken = spec;
    broken["producer"] = json!({"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}});
    create_policy(&client, &ns, "refused", broken).await;
    let metrics_url = format!("{}/metrics", operator.admin);
    eventually(
        "a reconcile error in the operator's metrics",
        TIMEOUT,
        || async {
            http_get(&metrics_url)
                .await
                .filter(|(_, text)| text.contains("burst_prefix_operator_reconcile_errors_total{"))
        },
    )
    .await;

    let mut exported = series(&http_get(&metrics_url).await.unwrap().1);
    exported.extend(series(
        &http_get(&format!("http://127.0.0.1:{admin}/metrics"))
            .await
            .unwrap()
            .1,
    ));
    let missing: Vec<&Selector> = wanted
        .iter()
        .filter(|want| {
            !exported.iter().any(|have| {
                have.name == want.name
                    && want
                        .labels
                        .iter()
                        .all(|(k, v)| have.labels.get(k) == Some(v))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "queried by the chart but not exported: {missing:#?}\nproducer log:\n{}",
        producer.log_text()
    );
    println!(
        "{} queries, {} distinct selectors, all exported",
        queries.len(),
        wanted.len()
    );
}

#[test]
fn selectors_are_read_from_promql() {
    let found = selectors(
        r#"sum by (ns) (rate(burst_prefix_requests_total{outcome="rejected", namespace=~"$ns"}[5m])) / burst_prefix_endpoints"#,
    );
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].name, "burst_prefix_requests_total");
    assert_eq!(found[0].labels["outcome"], "rejected");
    assert_eq!(found[0].labels.len(), 1);
    assert_eq!(found[1].name, "burst_prefix_endpoints");
}
