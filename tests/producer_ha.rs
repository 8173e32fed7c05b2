//! Producer high availability (docs/behaviour.md §10) on the real API server: three producer
//! processes run with the command line the operator renders for `producer.replicas: 3` and the
//! operator-made ServiceAccount's own token; they elect a leader with the operator-made Lease; only
//! the leader is ready and plans. SIGKILL the leader: another takes over within the Lease duration,
//! and a burst sent right after failover is still co-located. With `ha: activeActive` every
//! replica is ready and serves, and a SIGKILL leaves the others serving without a gap.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use burst_prefix_test_support::ControlPlane;
use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::{json, Value};

/// The operator's default Lease duration for producers (the runtime crate's flag default).
const LEASE_DURATION: Duration = Duration::from_secs(15);

struct Replica {
    process: Process,
    api: String,
    admin: String,
}

/// The container args of the producer Deployment, with its listeners moved to loopback ports
/// of ours and the identity given (the pod name, from the downward API, in a real pod).
fn replica(
    control_plane: &ControlPlane,
    args: &[String],
    kubeconfig: &std::path::Path,
    identity: &str,
) -> Replica {
    let (api, admin, epp) = (free_port(), free_port(), free_port());
    let mut rendered: Vec<String> = args.to_vec();
    for (flag, port) in [
        ("--listen", api),
        ("--admin-listen", admin),
        ("--epp-listen", epp),
    ] {
        let at = rendered
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("{flag} in {args:?}"));
        rendered[at + 1] = format!("127.0.0.1:{port}");
    }
    let mut command = Command::new(binary("burst-prefix-producer"));
    command
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAME", identity)
        .args(&rendered);
    Replica {
        process: Process::spawn(identity, &mut command, control_plane.dir()),
        api: format!("http://127.0.0.1:{api}"),
        admin: format!("http://127.0.0.1:{admin}"),
    }
}

/// Four Ready pods of the policy's selector (`vllm-0..3` at 10.1.0.1-4), once they are the
/// four endpoints of its ConfigMap.
async fn four_ready_engine_pods(client: &kube::Client, ns: &str) {
    for i in 0..4 {
        create_pod(client, ns, &format!("vllm-{i}"), "vllm").await;
        set_pod_status(
            client,
            ns,
            &format!("vllm-{i}"),
            &format!("10.1.0.{}", i + 1),
            true,
        )
        .await;
    }
    eventually("four endpoints", TIMEOUT, || async {
        endpoint_ids(client, ns).await.filter(|ids| ids.len() == 4)
    })
    .await;
}

async fn ready(replica: &Replica) -> bool {
    matches!(
        http_get(&format!("{}/readyz", replica.admin)).await,
        Some((200, _))
    )
}

/// A burst of `prompts` x `samples` to `url`: the endpoints each prompt's samples got.
async fn burst(
    url: &str,
    prompts: usize,
    samples: usize,
    tag: &str,
) -> Vec<(u16, BTreeSet<String>)> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut sends = Vec::new();
    for p in 0..prompts {
        for _ in 0..samples {
            let client = client.clone();
            let url = format!("{url}/v1/produce");
            let body =
                json!({"model": "m", "prompt": format!("{tag} prompt {p} {}", "x".repeat(200))});
            sends.push(tokio::spawn(async move {
                let response = client.post(url).json(&body).send().await.unwrap();
                let status = response.status().as_u16();
                let answer: Value = response.json().await.unwrap();
                (
                    p,
                    status,
                    answer["assignedEndpoint"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                )
            }));
        }
    }
    let mut by_prompt = vec![(200u16, BTreeSet::new()); prompts];
    for send in sends {
        let (p, status, endpoint) = send.await.unwrap();
        if status != 200 {
            by_prompt[p].0 = status;
        }
        by_prompt[p].1.insert(endpoint);
    }
    by_prompt
}

#[tokio::test(flavor = "multi_thread")]
async fn one_leader_serves_and_a_follower_takes_over_after_sigkill() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("ha").await;
    let _operator = start_operator(control_plane, &ns, &[]);
    create_policy(
        &client,
        &ns,
        "rl",
        // Balanced by requests: the bursts check co-location across a failover, a rule of that
        // mode (the time cost may split a short prompt's samples).
        vllm_policy(json!({
            "windowDurationMs": 300,
            "balanceBy": "requests",
            "producer": {"replicas": 3},
        })),
    )
    .await;
    four_ready_engine_pods(&client, &ns).await;
    eventually("the producers' Lease", TIMEOUT, || async {
        Api::<Lease>::namespaced(client.clone(), &ns)
            .get_opt("rl-producer")
            .await
            .ok()
            .flatten()
    })
    .await;
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get("rl-producer")
        .await
        .unwrap();
    let pod = deployment.spec.template.spec.expect("a pod template");
    let container = &pod.containers[0];
    let args = container.args.clone().unwrap();
    assert!(args.contains(&"--leader-elect".to_string()), "{args:?}");

    let token = control_plane
        .service_account_token(&ns, "rl-producer")
        .await
        .unwrap();
    let kubeconfig = control_plane
        .kubeconfig_for("rl-producer-ha", &token)
        .unwrap();
    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| {
            replica(
                control_plane,
                &args,
                &kubeconfig,
                &format!("rl-producer-{i}"),
            )
        })
        .collect();

    let leader = eventually("exactly one ready replica", TIMEOUT, || async {
        let mut ready_ones = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            if ready(r).await {
                ready_ones.push(i);
            }
        }
        (ready_ones.len() == 1).then(|| ready_ones[0])
    })
    .await;
    // The others stay followers: not ready, saying why, and refusing requests.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (i, r) in replicas.iter().enumerate().filter(|(i, _)| *i != leader) {
        let (status, reason) = http_get(&format!("{}/readyz", r.admin)).await.unwrap();
        assert_eq!(status, 503, "replica {i}");
        assert!(reason.contains("follower"), "{reason}");
        let refused = burst(&r.api, 1, 1, "follower").await;
        assert_eq!(refused[0].0, 503, "a follower must not plan");
    }
    for (status, endpoints) in burst(&replicas[leader].api, 3, 8, "before").await {
        assert_eq!(status, 200);
        assert_eq!(endpoints.len(), 1, "split: {endpoints:?}");
    }

    // SIGKILL: the Lease is not released; a follower takes it when it lapses.
    let killed_at = Instant::now();
    replicas[leader]
        .process
        .signal(nix::sys::signal::Signal::SIGKILL);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let successor = eventually("a new leader ready and answering", TIMEOUT, || async {
        for &i in &others {
            if ready(&replicas[i]).await {
                let answered = burst(&replicas[i].api, 1, 1, "probe").await;
                if answered[0].0 == 200 {
                    return Some(i);
                }
            }
        }
        None
    })
    .await;
    let failover = killed_at.elapsed();
    println!(
        "failover: {:.2} s from SIGKILL of replica {leader} to replica {successor} ready and answering (Lease duration {} s)",
        failover.as_secs_f64(),
        LEASE_DURATION.as_secs()
    );
    assert!(failover < TIMEOUT);
    for (status, endpoints) in burst(&replicas[successor].api, 3, 8, "after").await {
        assert_eq!(status, 200);
        assert_eq!(endpoints.len(), 1, "split after failover: {endpoints:?}");
    }
    let remaining: Vec<usize> = others.into_iter().filter(|&i| i != successor).collect();
    assert!(!ready(&replicas[remaining[0]]).await, "two leaders");
    replicas.clear();
}

/// `ha: activeActive`: the operator renders no Lease and no `--leader-elect`, and the three
/// producers run with that command line are all ready and all place. SIGKILL one during a
/// steady load sent to the others: every request succeeds, and at every sample at least one
/// producer is ready (the survivors never stop being ready: there is no failover).
#[tokio::test(flavor = "multi_thread")]
async fn active_active_producers_all_serve_and_a_sigkill_leaves_no_gap() {
    let Scene {
        control_plane,
        client,
        ns,
    } = Scene::new("ha-active").await;
    let _operator = start_operator(control_plane, &ns, &[]);
    create_policy(
        &client,
        &ns,
        "rl",
        vllm_policy(json!({
            "windowDurationMs": 0,
            "producer": {"replicas": 3, "ha": "activeActive"},
        })),
    )
    .await;
    four_ready_engine_pods(&client, &ns).await;
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get("rl-producer")
        .await
        .unwrap();
    let strategy = deployment.spec.strategy.clone().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let args = deployment.spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert!(!args.contains(&"--leader-elect".to_string()), "{args:?}");
    assert!(Api::<Lease>::namespaced(client.clone(), &ns)
        .get_opt("rl-producer")
        .await
        .unwrap()
        .is_none());

    let token = control_plane
        .service_account_token(&ns, "rl-producer")
        .await
        .unwrap();
    let kubeconfig = control_plane
        .kubeconfig_for("rl-producer-active", &token)
        .unwrap();
    let mut replicas: Vec<Replica> = (0..3)
        .map(|i| {
            replica(
                control_plane,
                &args,
                &kubeconfig,
                &format!("rl-producer-{i}"),
            )
        })
        .collect();
    eventually("every replica ready", TIMEOUT, || async {
        for r in &replicas {
            if !ready(r).await {
                return None;
            }
        }
        Some(())
    })
    .await;
    for r in &replicas {
        let answered = burst(&r.api, 2, 4, "each").await;
        assert!(
            answered.iter().all(|(status, _)| *status == 200),
            "{answered:?}"
        );
    }

    // A steady load to the two that stay (what a Service sends once the killed pod's endpoint
    // is gone): 1 request every 50 ms, 60 in all; replica 0 is killed after the 10th.
    let mut failed = Vec::new();
    let mut samples_without_a_ready_one = 0;
    for n in 0..60 {
        if n == 10 {
            replicas[0]
                .process
                .signal(nix::sys::signal::Signal::SIGKILL);
        }
        let target = &replicas[1 + n % 2];
        let answered = burst(&target.api, 1, 1, &format!("steady {n}")).await;
        if answered[0].0 != 200 {
            failed.push((n, answered[0].0));
        }
        let mut any_ready = false;
        for r in &replicas[1..] {
            any_ready |= ready(r).await;
        }
        if !any_ready {
            samples_without_a_ready_one += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    assert_eq!(samples_without_a_ready_one, 0);
    assert!(ready(&replicas[1]).await && ready(&replicas[2]).await);
    assert!(
        !ready(&replicas[0]).await,
        "the killed replica still answers"
    );
    replicas.clear();
}
