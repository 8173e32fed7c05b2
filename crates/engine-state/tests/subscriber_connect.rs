//! The connect topology against an engine whose publisher comes up late (an engine loading its
//! model for minutes): the subscriber keeps trying for as long as the endpoint is listed.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_publisher_comes_up_after_the_zeromq_connect_timeout_is_still_heard() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (_endpoints_tx, endpoints) = watch::channel(vec![EngineEndpoint {
        id: "late".into(),
        host: "127.0.0.1".into(),
        http_port: 1,
    }]);
    let (tx, mut rx) = mpsc::channel(1024);
    let metrics = KvEventsMetrics::register(&prometheus::Registry::new()).unwrap();
    let mut config = SubscriberConfig::new(Topology::Connect {
        address: format!("tcp://{{host}}:{port}"),
    });
    config.replay_on_join = false;
    let _subscriber = KvEventsSubscriber::spawn(config, endpoints, tx, metrics)
        .await
        .unwrap();

    // Past the point where one zeromq connect gives up for good (its default connect timeout).
    tokio::time::sleep(zeromq::DEFAULT_CONNECT_TIMEOUT + Duration::from_secs(2)).await;
    let mut publisher = zeromq::PubSocket::new();
    publisher
        .bind(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap();
    let payload = recorded_batch();
    let mut heard = false;
    // A PUB socket drops what it sends before the subscriber is connected and subscribed, so
    // the batch is sent again every 50 ms, for at most 15 s.
    for seq in 0u64..300 {
        let mut msg = ZmqMessage::from(Bytes::from_static(b"late"));
        msg.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
        msg.push_back(payload.clone());
        publisher.send(msg).await.unwrap();
        if let Ok(Some(update)) = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await {
            assert!(
                matches!(update, EngineUpdate::Batch { ref replica, .. } if replica == "late"),
                "{update:?}"
            );
            heard = true;
            break;
        }
    }
    assert!(
        heard,
        "the subscriber stopped trying to reach an engine whose publisher came up {}s late",
        (zeromq::DEFAULT_CONNECT_TIMEOUT + Duration::from_secs(2)).as_secs()
    );
}
