//! The bind topology: engines connect to the producer's one SUB endpoint and name themselves by
//! the topic they publish with: their endpoint id, or llm-d's `kv@<pod-ip>:<port>@<model>`
//! (docs/behaviour.md §7), which names the endpoint at that address.

use std::time::Duration;

use burst_prefix_engine_state::{
    EngineEndpoint, EngineUpdate, KvEventsMetrics, KvEventsSubscriber, SubscriberConfig, Topology,
};
use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use zeromq::{Socket, SocketSend, ZmqMessage};

/// One recorded vLLM 0.32.0 batch (see `tests/fixtures/vllm-0.32.0/README.md`).
fn recorded_batch() -> Bytes {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vllm-0.32.0/int-0.msgpack"
    );
    Bytes::from(std::fs::read(path).unwrap())
}

fn endpoint(id: &str, host: &str) -> EngineEndpoint {
    EngineEndpoint {
        id: id.into(),
        host: host.into(),
        http_port: 8000,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_publishing_with_llm_ds_topic_is_heard_as_the_endpoint_at_that_address() {
    let (_endpoints_tx, endpoints) = watch::channel(vec![
        endpoint("ns/vllm-a-rank-0", "10.244.0.7"),
        endpoint("ns/vllm-b-rank-0", "10.244.0.8"),
    ]);
    let (tx, mut rx) = mpsc::channel(1024);
    let registry = prometheus::Registry::new();
    let metrics = KvEventsMetrics::register(&registry).unwrap();
    let mut config = SubscriberConfig::new(Topology::Bind {
        endpoint: "tcp://127.0.0.1:0".into(),
    });
    config.replay_on_join = false;
    let subscriber = KvEventsSubscriber::spawn(config, endpoints, tx, metrics)
        .await
        .unwrap();
    let bound = subscriber.bound_endpoint().unwrap().to_string();
    let mut publisher = zeromq::PubSocket::new();
    publisher.connect(&bound).await.unwrap();
    let payload = recorded_batch();
    // The llm-d topics of b, then a (with another model name), then the endpoint id of a, and
    // a topic that names no endpoint. A PUB socket drops what it sends before the subscription
    // reached it, so each is sent again every 50 ms until heard (at most 10 s).
    let topics = [
        "kv@10.244.0.8:8000@Qwen/Qwen3-0.6B",
        "kv@10.244.0.7:8000@other-model",
        "ns/vllm-a-rank-0",
    ];
    let mut heard = Vec::new();
    // One sequence across the topics: the second and third are one endpoint's publisher.
    let mut seq = 0u64;
    for topic in topics {
        let first = seq;
        let replica = loop {
            assert!(seq - first < 200, "{topic} was never heard");
            for topic in ["kv@10.244.0.9:8000@m", topic] {
                let mut msg = ZmqMessage::from(Bytes::from(topic.to_string()));
                msg.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
                msg.push_back(payload.clone());
                publisher.send(msg).await.unwrap();
            }
            seq += 1;
            match tokio::time::timeout(Duration::from_millis(50), rx.recv()).await {
                Ok(Some(EngineUpdate::Batch { replica, .. })) => break replica,
                Ok(Some(EngineUpdate::Clear { .. })) => continue,
                Ok(None) => panic!("the subscriber stopped"),
                Err(_) => continue,
            }
        };
        heard.push(replica);
        // What is still queued for this topic belongs to it.
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {}
    }
    assert_eq!(
        heard,
        ["ns/vllm-b-rank-0", "ns/vllm-a-rank-0", "ns/vllm-a-rank-0"]
    );
    let text = {
        let mut buffer = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut buffer,
        )
        .unwrap();
        String::from_utf8(buffer).unwrap()
    };
    let unknown = text
        .lines()
        .find_map(|line| line.strip_prefix("burst_prefix_kv_event_unknown_topics_total "))
        .unwrap();
    assert!(unknown.parse::<u64>().unwrap() >= 1, "{text}");
}
