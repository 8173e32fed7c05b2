//! Replay after a gap, from the engine's replay socket (vLLM's ROUTER on `replay_endpoint`: a
//! DEALER sends `["", start seq (8 bytes big-endian)]`, and receives `["", topic, seq, payload]`
//! for each buffered batch from `start` on, then `["", "", -1, ""]`; vLLM before 0.32 left the
//! topic out), and the addresses of an engine's data-parallel ranks.

use std::ops::Range;

use bytes::Bytes;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::config::SubscriberConfig;
use super::metrics::KvEventsMetrics;
use crate::decode::decode_seq;
use crate::sequence::{judge_replay, ReplayOutcome};

/// Asks the replay socket at `address` (of `replica`'s engine) for `range`; the batches in it
/// that came back, in order, or `None` when there is no complete answer within the timeout.
pub(super) async fn replay(
    config: &SubscriberConfig,
    metrics: &KvEventsMetrics,
    replica: &str,
    address: &str,
    range: &Range<u64>,
) -> Option<Vec<(u64, Bytes)>> {
    let result = tokio::time::timeout(
        config.replay_timeout,
        request_replay(address, range, config.max_replay_batches),
    )
    .await;
    let outcome = match result {
        Ok(Ok(batches)) => {
            let seqs: Vec<u64> = batches.iter().map(|(s, _)| *s).collect();
            match judge_replay(range, &seqs) {
                ReplayOutcome::Complete => ("complete", Some(batches)),
                ReplayOutcome::Lost { .. } => ("lost", Some(batches)),
            }
        }
        Ok(Err(e)) => {
            tracing::warn!(%replica, %address, error = %e, "kv events: replay failed");
            ("failed", None)
        }
        Err(_) => {
            tracing::warn!(%replica, %address, "kv events: replay timed out");
            ("failed", None)
        }
    };
    metrics.replay(outcome.0);
    outcome.1
}

/// vLLM's replay exchange on a fresh DEALER socket; keeps the batches inside `range`.
async fn request_replay(
    address: &str,
    range: &Range<u64>,
    max_batches: usize,
) -> Result<Vec<(u64, Bytes)>, zeromq::ZmqError> {
    let mut socket = zeromq::DealerSocket::new();
    socket.connect(address).await?;
    let mut request = ZmqMessage::from(Bytes::new());
    request.push_back(Bytes::copy_from_slice(&range.start.to_be_bytes()));
    socket.send(request).await?;
    let mut out = Vec::new();
    // vLLM answers every buffered batch from `start` on, then the end marker.
    for _ in 0..=max_batches {
        let reply = socket.recv().await?.into_vec();
        // After the empty delimiter: [topic, seq, payload] (vLLM 0.32) or [seq, payload]
        // (earlier versions).
        let (seq, payload) = match reply.as_slice() {
            [_, _, seq, payload] | [_, seq, payload] => (seq, payload),
            _ => continue,
        };
        if seq.as_ref() == [0xff; 8] {
            break;
        }
        let Ok(seq) = decode_seq(seq) else {
            continue;
        };
        if range.contains(&seq) {
            out.push((seq, payload.clone()));
        }
        if seq + 1 >= range.end {
            break;
        }
    }
    Ok(out)
}

/// vLLM's address for data-parallel rank `rank` of a publisher or replay socket configured at
/// `address`: the TCP port plus the rank, or `_dp{rank}` after an `inproc` name (vLLM refuses
/// `ipc` with more than one rank).
pub fn rank_address(address: &str, rank: i64) -> String {
    if rank <= 0 {
        return address.to_owned();
    }
    if address.contains("inproc") {
        return format!("{address}_dp{rank}");
    }
    if address.starts_with("tcp://") {
        if let Some((base, port)) = address.rsplit_once(':') {
            if let Ok(port) = port.parse::<i64>() {
                return format!("{base}:{}", port + rank);
            }
        }
    }
    address.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_addresses_follow_vllms_offsets() {
        assert_eq!(rank_address("tcp://*:5557", 0), "tcp://*:5557");
        assert_eq!(
            rank_address("tcp://10.0.0.1:5557", 2),
            "tcp://10.0.0.1:5559"
        );
        assert_eq!(
            rank_address("tcp://[fd00::1]:5557", 1),
            "tcp://[fd00::1]:5558"
        );
        assert_eq!(rank_address("inproc://kv", 1), "inproc://kv_dp1");
        assert_eq!(rank_address("ipc:///run/kv.sock", 1), "ipc:///run/kv.sock");
    }
}
