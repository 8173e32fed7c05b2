//! A failover starts warm, on real vLLM and the real API server (docs/behaviour.md §7 and §10):
//! two producer processes share a Lease on the control plane's kube-apiserver and follow two
//! real vLLM replicas' KV events in the connect topology (`engines.kvEvents.connectPort`: each
//! engine binds its own publisher, every producer connects to each, leader or not).
//!
//! A burst of two prompts x 4 samples goes through the leader, which puts each prompt's samples
//! on one replica. Then the same prompts' next 4 samples go through a producer again, once
//! without a failover (the reference) and once right after the leader is SIGKILLed (the
//! successor answers them). They must compute no more tokens than the reference: the successor
//! heard the engines all along. To show the test can tell, a producer that did not hear them (the
//! same config without `engines`) is asked where it would send those samples: to the other
//! replica, which would compute the whole prompt again.
//!
//! Each replica listens on a loopback address of its own (127.0.0.2 and 127.0.0.3), as pods have
//! addresses of their own, so that both publish on the one `connectPort`. vLLM binds its
//! publisher only for an endpoint with `*` or `::` (any other it connects to), so it is given
//! `tcp://[::ffff:127.0.0.N]:PORT`, which libzmq binds as `127.0.0.N:PORT`.

mod common;
#[path = "engine/vllm_server.rs"]
mod vllm;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use burst_prefix_engine_bench::prompts::words;
use burst_prefix_test_support::ControlPlane;
use common::{binary, http_get, metric, runtime, Process};
use serde_json::{json, Value};
use vllm::{engine_test, free_port, model_dir, Vllm, VllmOptions};

/// The engine's KV block size on vLLM's CPU build, in tokens.
const ENGINE_BLOCK: u64 = 128;

/// Every request and wait of the test is bounded by this.
const PATIENCE: Duration = Duration::from_secs(60);

/// Samples per prompt in a burst.
const SAMPLES: usize = 4;

/// The proxy's answer header naming the endpoint that served a request.
const ENDPOINT_HEADER: &str = "x-burst-prefix-endpoint";

/// Engine blocks the producer's index has stored from the KV events, as its metrics say.
async fn stored_blocks(producer: &Producer) -> f64 {
    let (_, text) = http_get(&format!("{}/metrics", producer.admin))
        .await
        .unwrap_or((0, String::new()));
    metric(
        &text,
        "burst_prefix_engine_index_blocks_total{outcome=\"stored\"}",
    )
}

/// The producer's KV-event and engine-index metrics, for a failure's message.
async fn event_metrics(producer: &Producer) -> String {
    let (_, text) = http_get(&format!("{}/metrics", producer.admin))
        .await
        .unwrap_or((0, String::new()));
    text.lines()
        .filter(|l| l.starts_with("burst_prefix_kv_event") || l.starts_with("burst_prefix_engine"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Polls `check` every 100 ms until it holds or `limit` passes; false on time-out.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check().await
}

/// A producer process: its API and admin URLs.
struct Producer {
    process: Process,
    api: String,
    admin: String,
}

impl Producer {
    /// `serve --config config` on loopback ports of its own, with `extra` flags, its Lease (if
    /// any) on the control plane.
    fn start(name: &str, config: &Path, extra: &[String], control_plane: &ControlPlane) -> Self {
        let (api, admin) = (free_port(), free_port());
        let mut command = Command::new(binary("burst-prefix-producer"));
        command
            .env("KUBECONFIG", control_plane.kubeconfig())
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{api}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args(["--epp-listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info");
        Producer {
            process: Process::spawn(name, &mut command, control_plane.dir()),
            api: format!("http://127.0.0.1:{api}"),
            admin: format!("http://127.0.0.1:{admin}"),
        }
    }

    async fn ready(&self) -> bool {
        matches!(
            http_get(&format!("{}/readyz", self.admin)).await,
            Some((200, _))
        )
    }
}

/// What one answer said: the endpoint that served it and the prompt tokens it computed.
struct Served {
    endpoint: String,
    computed: u64,
}

/// `samples` copies of `prompt` at once to `url`'s `/v1/completions`.
async fn burst(client: &reqwest::Client, url: &str, prompt: &str, samples: usize) -> Vec<Served> {
    let sends: Vec<_> = (0..samples)
        .map(|_| {
            let client = client.clone();
            let url = format!("{url}/v1/completions");
            let body =
                json!({"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0.0});
            tokio::spawn(async move {
                let response = client
                    .post(&url)
                    .json(&body)
                    .timeout(PATIENCE)
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("POST {url}: {e}"));
                let status = response.status();
                let endpoint = response
                    .headers()
                    .get(ENDPOINT_HEADER)
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                let answer: Value = response.json().await.unwrap();
                assert!(status.is_success(), "POST {url}: {status}: {answer}");
                let usage = &answer["usage"];
                let prompt_tokens = usage["prompt_tokens"].as_u64().expect("usage");
                let cached = usage["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0);
                Served {
                    endpoint,
                    computed: prompt_tokens - cached,
                }
            })
        })
        .collect();
    let mut served = Vec::new();
    for send in sends {
        served.push(send.await.unwrap());
    }
    served
}

/// The endpoints of a burst's answers, with how many each served.
fn spread(served: &[Served]) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for s in served {
        *by.entry(s.endpoint.clone()).or_insert(0) += 1;
    }
    by
}

/// The one endpoint all of a burst went to (the test's premise: the leader co-locates a prompt's
/// samples).
fn only_endpoint(served: &[Served], what: &str) -> String {
    let by = spread(served);
    assert_eq!(by.len(), 1, "{what}: the samples were split: {by:?}");
    by.into_keys().next().unwrap()
}

/// The prompt's token count as the engine tokenizes it.
async fn token_count(client: &reqwest::Client, replica: &Vllm, prompt: &str) -> u64 {
    let answer: Value = client
        .post(replica.url("/tokenize"))
        .json(&json!({"model": "tiny", "prompt": prompt}))
        .timeout(PATIENCE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["count"].as_u64().expect("a token count")
}

/// Sends a short new prompt straight to `replica` (never through a producer) until every
/// producer's index has stored its blocks: each producer is connected to that replica's
/// publisher and subscribed (a PUB socket drops what it publishes before that).
async fn heard_by_all(
    client: &reqwest::Client,
    replica: &Vllm,
    producers: &[&Producer],
    seed: u32,
) {
    for attempt in 0..20u32 {
        let before: Vec<f64> = stored_by_each(producers).await;
        let prompt = words(seed + attempt, 300);
        let served = burst(client, &replica.url(""), &prompt, 1).await;
        assert!(
            served[0].computed >= 2 * ENGINE_BLOCK,
            "a probe of {} tokens",
            served[0].computed
        );
        let heard = eventually(Duration::from_secs(3), || async {
            let now = stored_by_each(producers).await;
            now.iter().zip(&before).all(|(n, b)| n > b)
        })
        .await;
        if heard {
            return;
        }
    }
    panic!(
        "the producers never heard the replica at {} (20 probes)",
        replica.url("")
    );
}

/// Where a producer that never heard the engines (`config`: the same without `engines`, fresh,
/// nothing in its memory) would send [`SAMPLES`] samples of `prompt`: asked through the scoring
/// API (`/v1/produce`), which sends nothing to the engines.
async fn cold_pick(
    client: &reqwest::Client,
    config: &Path,
    control_plane: &ControlPlane,
    prompt: &str,
) -> String {
    let cold = Producer::start("cold", config, &[], control_plane);
    assert!(
        eventually(PATIENCE, || cold.ready()).await,
        "the cold producer is not ready\n{}",
        cold.process.log_text()
    );
    let sends = (0..SAMPLES).map(|_| async {
        let answer: Value = client
            .post(format!("{}/v1/produce", cold.api))
            .json(&json!({"model": "tiny", "prompt": prompt}))
            .timeout(PATIENCE)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        answer["assignedEndpoint"]
            .as_str()
            .unwrap_or_else(|| panic!("the cold producer answered {answer}"))
            .to_string()
    });
    let picks: std::collections::BTreeSet<String> =
        futures::future::join_all(sends).await.into_iter().collect();
    assert_eq!(
        picks.len(),
        1,
        "the cold producer split the samples: {picks:?}"
    );
    picks.into_iter().next().unwrap()
}

/// Burst 1: `pair`'s prompts x [`SAMPLES`] at once through `leader`. The prompt it put on a
/// replica a cold producer would not pick for it, that replica, and the cold producer's pick.
async fn first_burst(
    client: &reqwest::Client,
    leader: &Producer,
    pair: [&String; 2],
    without_events: &Path,
    control_plane: &ControlPlane,
) -> (String, String, String) {
    let sends = pair.iter().map(|p| burst(client, &leader.api, p, SAMPLES));
    let answers = futures::future::join_all(sends).await;
    let mut picks = Vec::new();
    for (prompt, served) in pair.iter().zip(&answers) {
        let on = only_endpoint(served, "burst 1");
        let cold = cold_pick(client, without_events, control_plane, prompt).await;
        if on != cold {
            return (prompt.to_string(), on, cold);
        }
        picks.push(on);
    }
    panic!(
        "burst 1 put the prompts on {picks:?}, where a cold producer sends them too: the test \
         cannot tell warm from cold"
    )
}

async fn stored_by_each(producers: &[&Producer]) -> Vec<f64> {
    let mut stored = Vec::new();
    for p in producers {
        stored.push(stored_blocks(p).await);
    }
    stored
}

#[test]
fn the_first_burst_after_a_failover_computes_no_more_than_without_one() {
    let Some(_engine) = engine_test(
        "vllm_failover::the_first_burst_after_a_failover_computes_no_more_than_without_one",
    ) else {
        return;
    };
    let started = Instant::now();
    let (events_port, replay_port, http_port) = (free_port(), free_port(), free_port());
    let hosts = ["127.0.0.2", "127.0.0.3"];
    let replicas: Vec<Vllm> = std::thread::scope(|scope| {
        let starting: Vec<_> = hosts
            .iter()
            .map(|host| {
                scope.spawn(move || {
                    Vllm::start(VllmOptions {
                        host: Some(host.to_string()),
                        port: http_port,
                        kv_events: Some(json!({
                            "enable_kv_cache_events": true,
                            "publisher": "zmq",
                            "endpoint": format!("tcp://[::ffff:{host}]:{events_port}"),
                            "replay_endpoint": format!("tcp://{host}:{replay_port}"),
                            "topic": "kv",
                        })),
                        args: vec!["--enable-prompt-tokens-details".into()],
                        ..VllmOptions::default()
                    })
                })
            })
            .collect();
        starting.into_iter().map(|s| s.join().unwrap()).collect()
    });
    eprintln!("2 vLLM replicas ready in {:?}", started.elapsed());

    let control_plane = ControlPlane::shared();
    let dir = tempfile::tempdir().unwrap();
    let endpoints = format!(
        "endpoints:\n  - {{id: r0, address: '{}:{http_port}'}}\n  - {{id: r1, address: '{}:{http_port}'}}\n",
        hosts[0], hosts[1]
    );
    let planner = "windowDurationMs: 100\nmemory: {enabled: true}\n";
    let with_events = dir.path().join("with-events.yaml");
    std::fs::write(
        &with_events,
        format!(
            "{planner}engines:\n  kvEvents: {{connectPort: {events_port}, replayPort: {replay_port}}}\n  tokenizer: {{path: '{}'}}\n{endpoints}",
            model_dir().display()
        ),
    )
    .unwrap();
    let without_events = dir.path().join("without-events.yaml");
    std::fs::write(&without_events, format!("{planner}{endpoints}")).unwrap();

    runtime().block_on(async {
        let namespace = control_plane.namespace("failover").await.unwrap();
        let elect = |identity: &str| -> Vec<String> {
            [
                "--leader-elect",
                "--lease-name",
                "producers",
                "--lease-namespace",
                &namespace,
                "--lease-duration-seconds",
                "4",
                "--identity",
                identity,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        let mut producers: Vec<Producer> = ["p0", "p1"]
            .iter()
            .map(|id| Producer::start(id, &with_events, &elect(id), control_plane))
            .collect();
        let client = reqwest::Client::new();

        let leader = {
            let mut found = None;
            let deadline = Instant::now() + PATIENCE;
            while found.is_none() && Instant::now() < deadline {
                let mut ready = Vec::new();
                for (i, p) in producers.iter().enumerate() {
                    if p.ready().await {
                        ready.push(i);
                    }
                }
                if ready.len() == 1 {
                    found = Some(ready[0]);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            found.unwrap_or_else(|| {
                panic!(
                    "no single leader within {PATIENCE:?}\n{}\n{}",
                    producers[0].process.log_text(),
                    producers[1].process.log_text()
                )
            })
        };
        let follower = 1 - leader;
        {
            let all: Vec<&Producer> = producers.iter().collect();
            for (i, replica) in replicas.iter().enumerate() {
                heard_by_all(&client, replica, &all, 9_000 + 100 * i as u32).await;
            }
        }

        // Four prompts of one length (so that every burst's cost compares), sharing no block.
        let mut by_length: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for seed in 0..60u32 {
            let prompt = words(1_000 + 37 * seed, 600);
            let count = token_count(&client, &replicas[0], &prompt).await;
            by_length.entry(count).or_default().push(prompt);
        }
        let (length, prompts) = by_length
            .into_iter()
            .max_by_key(|(_, prompts)| prompts.len())
            .unwrap();
        assert!(prompts.len() >= 4, "no 4 prompts of one length: {length}");
        let full_blocks = (length - 1) / ENGINE_BLOCK;
        // Each sample of a prompt whose blocks a replica holds computes only its last block.
        let warm_cost = SAMPLES as u64 * (length - full_blocks * ENGINE_BLOCK);

        // The reference: no failover.
        let (prompt, holder, _) = first_burst(
            &client,
            &producers[leader],
            [&prompts[0], &prompts[1]],
            &without_events,
            control_plane,
        )
        .await;
        let reference = burst(&client, &producers[leader].api, &prompt, SAMPLES).await;
        let reference_cost: u64 = reference.iter().map(|s| s.computed).sum();
        assert_eq!(only_endpoint(&reference, "the reference"), holder);

        // The failover: burst 1 through the leader; the follower hears the engines store it.
        let before = stored_blocks(&producers[follower]).await;
        let (prompt, holder, cold_pick) = first_burst(
            &client,
            &producers[leader],
            [&prompts[2], &prompts[3]],
            &without_events,
            control_plane,
        )
        .await;
        let stored = (2 * full_blocks) as f64;
        assert!(
            eventually(PATIENCE, || async {
                stored_blocks(&producers[follower]).await >= before + stored
            })
            .await,
            "the follower's index never stored burst 1's {stored} engine blocks (from {before})\n\
             follower: {}\nleader: {}\n{}",
            event_metrics(&producers[follower]).await,
            event_metrics(&producers[leader]).await,
            producers[follower].process.log_text()
        );
        let killed = Instant::now();
        producers[leader]
            .process
            .signal(nix::sys::signal::Signal::SIGKILL);
        assert!(
            eventually(PATIENCE, || producers[follower].ready()).await,
            "the follower did not take over\n{}",
            producers[follower].process.log_text()
        );
        let failover = killed.elapsed();
        let after = burst(&client, &producers[follower].api, &prompt, SAMPLES).await;
        let after_cost: u64 = after.iter().map(|s| s.computed).sum();
        eprintln!(
            "failover in {:.2} s; the next {SAMPLES} samples of a {length}-token prompt computed \
             {after_cost} tokens after it, {reference_cost} without one (all on the holder: \
             {warm_cost}); a producer that did not hear the engines would send them to \
             {cold_pick}, not {holder}",
            failover.as_secs_f64()
        );
        assert_eq!(
            spread(&after),
            BTreeMap::from([(holder.clone(), SAMPLES)]),
            "after the failover the samples left the replica that holds their prompt"
        );
        assert!(
            after_cost <= reference_cost,
            "after the failover the burst computed {after_cost} tokens, {reference_cost} without one"
        );
        assert_eq!(reference_cost, warm_cost, "the reference computed more than its last blocks");
        producers.clear();
    });
}
