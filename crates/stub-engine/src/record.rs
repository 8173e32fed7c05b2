//! What reached the stub: one [`RecordedRequest`] per inference request, kept in order of
//! arrival, served by `GET /stub/requests`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One request as the stub saw it and answered it. Times are microseconds since the Unix epoch
/// (the same clock for every process on one machine).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedRequest {
    /// 1, 2, ... in order of arrival at this stub.
    pub seq: u64,
    pub method: String,
    pub path: String,
    /// Every request header, names lowercase; repeated headers joined with ", ".
    pub headers: BTreeMap<String, String>,
    /// The body as JSON, or as a string when it is not JSON.
    pub body: Value,
    pub received_unix_micros: u64,
    /// The status answered (0 until the answer's head is written).
    pub status: u16,
    pub stream: bool,
    /// SSE chunks handed to the connection (the `[DONE]` line not counted).
    pub chunks_sent: u32,
    pub first_chunk_unix_micros: Option<u64>,
    pub last_chunk_unix_micros: Option<u64>,
    /// The whole answer was handed to the connection.
    pub completed: bool,
    /// The client went away (the connection closed) before the answer was complete.
    pub client_disconnected: bool,
    /// The stub cut the stream on purpose (`stub.abortAfterChunks`).
    pub aborted: bool,
}

/// The shared record, bounded to the last `capacity` requests.
#[derive(Debug, Clone)]
pub struct Recorder {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    capacity: usize,
    next_seq: u64,
    requests: VecDeque<RecordedRequest>,
}

impl Recorder {
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                capacity: capacity.max(1),
                next_seq: 1,
                requests: VecDeque::new(),
            })),
        }
    }

    /// Every request recorded so far (at most the capacity, the newest), in order of arrival.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.iter().cloned().collect()
    }

    /// Forgets every recorded request (sequence numbers keep counting).
    pub fn clear(&self) {
        self.lock().requests.clear();
    }

    /// Records the arrival of a request; the returned guard records how it is answered, and a
    /// client that went away when it is dropped before [`InFlight::complete`].
    pub(crate) fn begin(
        &self,
        method: &str,
        path: &str,
        headers: &HeaderMap,
        body: Value,
        stream: bool,
    ) -> InFlight {
        let mut inner = self.lock();
        let seq = inner.next_seq;
        inner.next_seq += 1;
        if inner.requests.len() == inner.capacity {
            inner.requests.pop_front();
        }
        inner.requests.push_back(RecordedRequest {
            seq,
            method: method.to_owned(),
            path: path.to_owned(),
            headers: header_map(headers),
            body,
            received_unix_micros: now_unix_micros(),
            status: 0,
            stream,
            chunks_sent: 0,
            first_chunk_unix_micros: None,
            last_chunk_unix_micros: None,
            completed: false,
            client_disconnected: false,
            aborted: false,
        });
        InFlight {
            recorder: self.clone(),
            seq,
            done: false,
        }
    }

    fn update(&self, seq: u64, change: impl FnOnce(&mut RecordedRequest)) {
        let mut inner = self.lock();
        // Sequence numbers are consecutive in the deque; an evicted request is not updated.
        if let Some(first) = inner.requests.front().map(|r| r.seq) {
            if let Some(request) = seq
                .checked_sub(first)
                .and_then(|i| usize::try_from(i).ok())
                .and_then(|i| inner.requests.get_mut(i))
            {
                change(request);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The record of one request being answered.
#[derive(Debug)]
pub(crate) struct InFlight {
    recorder: Recorder,
    seq: u64,
    done: bool,
}

impl InFlight {
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    pub(crate) fn status(&self, status: u16) {
        self.recorder.update(self.seq, |r| r.status = status);
    }

    pub(crate) fn chunk_sent(&self) {
        let now = now_unix_micros();
        self.recorder.update(self.seq, |r| {
            r.chunks_sent += 1;
            r.first_chunk_unix_micros.get_or_insert(now);
            r.last_chunk_unix_micros = Some(now);
        });
    }

    pub(crate) fn complete(mut self) {
        self.done = true;
        self.recorder.update(self.seq, |r| r.completed = true);
    }

    pub(crate) fn abort(mut self) {
        self.done = true;
        self.recorder.update(self.seq, |r| r.aborted = true);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Dropped unfinished: the server dropped the handler or the response body, which it does
        // when the connection closed under it.
        if !self.done {
            self.recorder
                .update(self.seq, |r| r.client_disconnected = true);
        }
    }
}

fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        map.entry(name.as_str().to_owned())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert(value);
    }
    map
}

pub(crate) fn now_unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn begin(recorder: &Recorder) -> InFlight {
        let mut headers = HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        recorder.begin("POST", "/v1/completions", &headers, Value::Null, true)
    }

    #[test]
    fn records_the_life_of_a_request() {
        let recorder = Recorder::new(10);
        let in_flight = begin(&recorder);
        in_flight.status(200);
        in_flight.chunk_sent();
        in_flight.chunk_sent();
        in_flight.complete();
        let [request] = recorder.requests().try_into().unwrap();
        assert_eq!(request.seq, 1);
        assert_eq!(request.headers["x-a"], "1, 2");
        assert_eq!(request.status, 200);
        assert_eq!(request.chunks_sent, 2);
        assert!(request.first_chunk_unix_micros <= request.last_chunk_unix_micros);
        assert!(request.completed && !request.client_disconnected && !request.aborted);
    }

    #[test]
    fn dropped_unfinished_means_the_client_went_away() {
        let recorder = Recorder::new(10);
        drop(begin(&recorder));
        begin(&recorder).abort();
        let requests = recorder.requests();
        assert!(requests[0].client_disconnected && !requests[0].completed);
        assert!(requests[1].aborted && !requests[1].client_disconnected);
    }

    #[test]
    fn keeps_only_the_newest() {
        let recorder = Recorder::new(2);
        let first = begin(&recorder);
        for _ in 0..2 {
            begin(&recorder).complete();
        }
        first.complete(); // evicted: nothing to update, no panic
        let seqs: Vec<u64> = recorder.requests().iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [2, 3]);
        recorder.clear();
        assert!(recorder.requests().is_empty());
        begin(&recorder).complete();
        assert_eq!(recorder.requests()[0].seq, 4);
    }
}
