//! Stage 1 of the path, **admit** (docs/architecture.md): whether this producer takes a request
//! at all, and its body read under the limits, the same for every front-end.
//!
//! - A follower refuses (`not_leader`), so does a producer that is shutting down
//!   (`shutting_down`), before any of the body is read.
//! - The headers' hints are read here (a bad one is refused before the body); the body's own
//!   hints are the read stage's.
//! - The body is taken a chunk at a time by one [`BodyReader`], which every front-end feeds: the
//!   HTTP ones frame by frame ([`BodyReader::read_http`]), the endpoint picker message by message
//!   ([`BodyReader::take`]). At most `--max-body-bytes` (a declared length beyond is refused
//!   before reading), whole within `--body-timeout-ms` of the headers ([`BodyReader::deadline`]),
//!   each chunk's bytes taken from the byte budget (`--max-window-bytes`) before the next is read.

use std::num::NonZeroU32;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::budget::Reserved;
use crate::error::{PlaceError, RequestError};

/// Default limit of a request body: 8 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Default budget of the bytes the open window holds: 256 MiB.
pub const DEFAULT_MAX_WINDOW_BYTES: usize = 256 * 1024 * 1024;
/// Default of `--max-plan-replicas`.
pub const DEFAULT_MAX_PLAN_REPLICAS: usize = 10_000;
/// Default of `--body-timeout-ms`: the longest a request's body may take to arrive.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// When to retry a body the budget refused: the budget frees as windows are answered, within
/// a window's length (1 s is the least `Retry-After` says).
pub const BUDGET_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The limits every front-end applies, with their defaults (docs/behaviour.md §11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Most bytes the open window holds: its requests' hashes, and the bodies front-ends keep
    /// while their requests wait; beyond, `window_full`.
    pub max_window_bytes: usize,
    /// Most replicas a `POST /v1/plan` batch may name.
    pub max_plan_replicas: usize,
    /// A request's body (and, at the endpoint picker, its headers and body) must arrive within
    /// this long.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_window_bytes: DEFAULT_MAX_WINDOW_BYTES,
            max_plan_replicas: DEFAULT_MAX_PLAN_REPLICAS,
            body_timeout: DEFAULT_BODY_TIMEOUT,
        }
    }
}

impl Limits {
    /// Refuses a body of `bytes` (read so far, or declared) beyond `max_body_bytes`.
    fn check_body(&self, bytes: usize) -> Result<(), PlaceError> {
        if bytes > self.max_body_bytes {
            Err(PlaceError::BodyTooLarge {
                limit: self.max_body_bytes,
            })
        } else {
            Ok(())
        }
    }
}

/// The header that carries the group-size hint.
pub const GROUP_SIZE_HEADER: &str = "x-burst-prefix-group-size";
/// The header that names the model weights a request was made for (RL rollouts): a new version
/// makes the producer forget what the replicas cached under the older one.
pub const WEIGHT_VERSION_HEADER: &str = "x-burst-prefix-weight-version";

/// The longest weight version accepted.
pub const MAX_WEIGHT_VERSION: usize = 256;

/// What a client may tell the producer about its request, in `x-burst-prefix-*` headers or in
/// the body under `"burst_prefix"` (a name no inference server reads); the headers win.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    /// How many requests (this one included) share this exact prompt; a window whose hinted
    /// groups are all complete is sealed at once.
    pub group_size: Option<NonZeroU32>,
    /// The model weights the request was made for (any text, e.g. a training step).
    pub weight_version: Option<String>,
}

impl Hints {
    /// The hints of headers read by `value(name)` (lowercase names); a bad value is an error
    /// naming the header.
    pub fn from_headers<'a>(
        value: impl Fn(&str) -> Option<&'a [u8]>,
    ) -> Result<Hints, RequestError> {
        let group_size = value(GROUP_SIZE_HEADER)
            .map(|raw| {
                std::str::from_utf8(raw)
                    .ok()
                    .and_then(|text| text.trim().parse().ok())
                    .ok_or_else(|| RequestError::Field {
                        field: format!("header {GROUP_SIZE_HEADER}"),
                        problem: format!(
                            "expected an integer >= 1, got {:?}",
                            String::from_utf8_lossy(raw)
                        ),
                    })
            })
            .transpose()?;
        let weight_version = value(WEIGHT_VERSION_HEADER)
            .map(|raw| {
                std::str::from_utf8(raw)
                    .ok()
                    .map(str::trim)
                    .filter(|text| !text.is_empty() && text.len() <= MAX_WEIGHT_VERSION)
                    .map(str::to_string)
                    .ok_or_else(|| RequestError::Field {
                        field: format!("header {WEIGHT_VERSION_HEADER}"),
                        problem: format!(
                            "expected text of 1 to {MAX_WEIGHT_VERSION} bytes, got {:?}",
                            String::from_utf8_lossy(raw)
                        ),
                    })
            })
            .transpose()?;
        Ok(Hints {
            group_size,
            weight_version,
        })
    }
}

/// What admission checks of the producer (docs/behaviour.md §10, §11).
pub(crate) struct Door {
    pub leading: bool,
    pub closed: bool,
}

/// Admits a request: refused at once by a follower or a producer shutting down, or for a bad
/// hint header; else its headers' hints and the reader its body is fed to (under `limits`, its
/// bytes taken into `reserved`).
pub(crate) fn admit<'a>(
    door: Door,
    headers: impl Fn(&str) -> Option<&'a [u8]>,
    limits: Limits,
    reserved: Reserved,
) -> Result<(Hints, BodyReader), PlaceError> {
    if !door.leading {
        // Windows are the leader's: a follower that planned too would split bursts.
        return Err(PlaceError::NotLeader);
    }
    if door.closed {
        return Err(PlaceError::ShuttingDown);
    }
    let hints = Hints::from_headers(headers)?;
    Ok((hints, BodyReader::new(limits, reserved)))
}

/// A request's body, read a chunk at a time under the limits (docs/behaviour.md §11).
#[derive(Debug)]
pub struct BodyReader {
    limits: Limits,
    bytes: BytesMut,
    reserved: Reserved,
    deadline: Instant,
    /// What a body not whole by the deadline is refused with.
    late: PlaceError,
}

/// A whole body, its bytes still taken from the byte budget.
#[derive(Debug)]
pub struct WholeBody {
    pub bytes: Bytes,
    pub reserved: Reserved,
}

impl BodyReader {
    /// A reader whose body must be whole within `limits.body_timeout` from now, its bytes taken
    /// into `reserved`.
    pub fn new(limits: Limits, reserved: Reserved) -> Self {
        BodyReader {
            deadline: Instant::now() + limits.body_timeout,
            late: PlaceError::BodyTimeout {
                seconds: limits.body_timeout.as_secs_f64(),
            },
            limits,
            bytes: BytesMut::new(),
            reserved,
        }
    }

    /// When the body must be whole.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The body must be whole by `deadline` too, else it is refused with `late` (a bound on the
    /// whole request; on a tie, the bound's refusal).
    pub fn bound(&mut self, deadline: Instant, late: PlaceError) {
        if deadline <= self.deadline {
            self.deadline = deadline;
            self.late = late;
        }
    }

    /// Refused when the body will be `bytes` long, beyond the limit (before any is read).
    pub fn declared(&self, bytes: usize) -> Result<(), PlaceError> {
        self.limits.check_body(bytes)
    }

    /// Takes the next chunk: refused when the body grows past the limit or its bytes past the
    /// budget (`window_full`).
    pub fn take(&mut self, chunk: &[u8]) -> Result<(), PlaceError> {
        self.limits.check_body(self.bytes.len() + chunk.len())?;
        if !self.reserved.grow(chunk.len()) {
            return Err(PlaceError::WindowFull {
                limit: self.reserved.limit(),
                retry_after: BUDGET_RETRY_AFTER,
            });
        }
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// Takes an HTTP body frame by frame until it ends: refused at once when it declares more
    /// than the limit, when it is not whole by the deadline, or when the connection fails.
    pub async fn read_http<B>(&mut self, body: B) -> Result<(), PlaceError>
    where
        B: Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        self.declared(usize::try_from(body.size_hint().lower()).unwrap_or(usize::MAX))?;
        let late = self.late.clone();
        let deadline = self.deadline;
        let read = async {
            let mut body = std::pin::pin!(body);
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| PlaceError::BodyUnreadable(e.to_string()))?;
                if let Ok(data) = frame.into_data() {
                    self.take(&data)?;
                }
            }
            Ok(())
        };
        tokio::time::timeout_at(deadline, read)
            .await
            .unwrap_or(Err(late))
    }

    /// The body read so far, whole.
    pub fn finish(self) -> WholeBody {
        WholeBody {
            bytes: self.bytes.freeze(),
            reserved: self.reserved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::ByteBudget;
    use http_body_util::{Full, StreamBody};

    fn limits(max_body_bytes: usize) -> Limits {
        Limits {
            max_body_bytes,
            ..Limits::default()
        }
    }

    async fn read<B>(body: B, limits: Limits, reserved: Reserved) -> Result<Bytes, PlaceError>
    where
        B: Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        let mut reader = BodyReader::new(limits, reserved);
        reader.read_http(body).await?;
        Ok(reader.finish().bytes)
    }

    fn unbounded() -> Reserved {
        ByteBudget::new(usize::MAX).empty()
    }

    fn chunks(
        parts: Vec<Result<&'static str, &'static str>>,
    ) -> StreamBody<impl futures::Stream<Item = Result<http_body::Frame<Bytes>, String>>> {
        StreamBody::new(futures::stream::iter(parts.into_iter().map(|part| {
            part.map(|text| http_body::Frame::data(Bytes::from_static(text.as_bytes())))
                .map_err(str::to_string)
        })))
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_read_whole_and_a_larger_one_refused() {
        let body = read(chunks(vec![Ok("ab"), Ok("cd")]), limits(4), unbounded()).await;
        assert_eq!(body.unwrap(), Bytes::from_static(b"abcd"));
        assert_eq!(
            read(chunks(vec![Ok("ab"), Ok("cde")]), limits(4), unbounded()).await,
            Err(PlaceError::BodyTooLarge { limit: 4 })
        );
        assert_eq!(
            read(chunks(vec![Ok("a"), Err("reset")]), limits(4), unbounded()).await,
            Err(PlaceError::BodyUnreadable("reset".into()))
        );
    }

    #[tokio::test]
    async fn a_declared_length_past_the_limit_is_refused_before_reading() {
        let declared = Full::new(Bytes::from_static(b"12345"));
        assert_eq!(
            read(declared, limits(4), unbounded()).await,
            Err(PlaceError::BodyTooLarge { limit: 4 })
        );
    }

    #[tokio::test]
    async fn a_body_over_the_budget_or_too_slow_is_refused_before_more_is_read() {
        let budget = ByteBudget::new(3);
        let _held = {
            let mut held = budget.empty();
            assert!(held.grow(2));
            held
        };
        let refused = read(
            chunks(vec![Ok("ab"), Ok("cd")]),
            limits(100),
            budget.empty(),
        )
        .await;
        assert!(
            matches!(refused, Err(PlaceError::WindowFull { limit: 3, .. })),
            "{refused:?}"
        );
        let slow = Limits {
            body_timeout: Duration::from_millis(20),
            ..Limits::default()
        };
        let never = StreamBody::new(futures::stream::pending::<
            Result<http_body::Frame<Bytes>, String>,
        >());
        let timed_out = read(never, slow, ByteBudget::new(10).empty()).await;
        assert!(
            matches!(timed_out, Err(PlaceError::BodyTimeout { .. })),
            "{timed_out:?}"
        );
    }

    #[test]
    fn chunks_fed_one_by_one_meet_the_same_limits() {
        let budget = ByteBudget::new(usize::MAX);
        let mut reader = BodyReader::new(limits(4), budget.empty());
        reader.take(b"ab").unwrap();
        reader.take(b"cd").unwrap();
        assert_eq!(
            reader.take(b"e"),
            Err(PlaceError::BodyTooLarge { limit: 4 })
        );
        assert_eq!(reader.finish().bytes, Bytes::from_static(b"abcd"));
        assert_eq!(budget.used(), 0, "the bytes come back with the body");
    }

    fn from(value: Option<&'static str>) -> Result<Hints, RequestError> {
        Hints::from_headers(|name| {
            value
                .filter(|_| name == GROUP_SIZE_HEADER)
                .map(str::as_bytes)
        })
    }

    #[test]
    fn a_group_size_header_is_a_positive_integer_or_an_error_naming_it() {
        assert_eq!(from(None).unwrap(), Hints::default());
        assert_eq!(from(Some(" 8 ")).unwrap().group_size, NonZeroU32::new(8));
        for bad in ["0", "-1", "x", ""] {
            let error = from(Some(bad)).unwrap_err();
            assert_eq!(error.field(), "header x-burst-prefix-group-size", "{bad}");
            assert!(error.to_string().contains(&format!("{bad:?}")), "{error}");
        }
    }

    #[test]
    fn a_weight_version_header_is_short_text() {
        let read = |value: &'static [u8]| {
            Hints::from_headers(|name| (name == WEIGHT_VERSION_HEADER).then_some(value))
        };
        assert_eq!(read(b" 7 ").unwrap().weight_version.as_deref(), Some("7"));
        let error = read(b"").unwrap_err();
        assert_eq!(error.field(), "header x-burst-prefix-weight-version");
        assert!(read(&[b'x'; 300]).is_err());
    }

    #[test]
    fn a_follower_or_a_closing_producer_admits_nothing() {
        let none = |_: &str| None;
        let admitted = |leading, closed| {
            let reserved = ByteBudget::new(usize::MAX).empty();
            admit(Door { leading, closed }, none, Limits::default(), reserved).map(|(h, _)| h)
        };
        assert_eq!(admitted(false, false), Err(PlaceError::NotLeader));
        assert_eq!(admitted(true, true), Err(PlaceError::ShuttingDown));
        assert_eq!(admitted(true, false), Ok(Hints::default()));
    }
}
