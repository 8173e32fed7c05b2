//! Reading a request body under the limits, the same for every HTTP front-end (the endpoint
//! picker gets its chunks in messages and applies the same [`Limits::check_body`] and budget):
//! at most `--max-body-bytes`, within `--body-timeout-ms`, each chunk's bytes taken from the
//! window's budget before the next is read.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;

use super::budget::Reserved;
use super::error::PlaceError;
use super::limits::Limits;

/// When to retry a body the budget refused: the budget frees as windows are answered, within
/// a window's length (1 s is the least `Retry-After` says).
pub const BUDGET_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The whole body, its bytes taken into `reserved`. Refused at once when it declares more than
/// `limits.max_body_bytes`, or once it grows past them or past the budget (the rest is not
/// read), when it is not complete within `limits.body_timeout`, or when the connection fails
/// while it is read.
pub async fn read_body<B>(
    body: B,
    limits: &Limits,
    reserved: &mut Reserved,
) -> Result<Bytes, PlaceError>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let declared = usize::try_from(body.size_hint().lower()).unwrap_or(usize::MAX);
    limits.check_body(declared)?;
    let read = async {
        let mut body = std::pin::pin!(body);
        let mut bytes = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| PlaceError::BodyUnreadable(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                limits.check_body(bytes.len() + data.len())?;
                take(reserved, data.len())?;
                bytes.extend_from_slice(&data);
            }
        }
        Ok(bytes.freeze())
    };
    tokio::time::timeout(limits.body_timeout, read)
        .await
        .unwrap_or(Err(PlaceError::BodyTimeout {
            seconds: limits.body_timeout.as_secs_f64(),
        }))
}

/// Takes `bytes` more of a body into `reserved`, or refuses the body (`window_full`).
pub fn take(reserved: &mut Reserved, bytes: usize) -> Result<(), PlaceError> {
    if reserved.grow(bytes) {
        Ok(())
    } else {
        Err(PlaceError::WindowFull {
            limit: reserved.limit(),
            retry_after: BUDGET_RETRY_AFTER,
        })
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

    async fn read<B>(body: B, limits: &Limits) -> Result<Bytes, PlaceError>
    where
        B: Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        read_body(body, limits, &mut ByteBudget::new(usize::MAX).empty()).await
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
        let body = read(chunks(vec![Ok("ab"), Ok("cd")]), &limits(4)).await;
        assert_eq!(body.unwrap(), Bytes::from_static(b"abcd"));
        assert_eq!(
            read(chunks(vec![Ok("ab"), Ok("cde")]), &limits(4)).await,
            Err(PlaceError::BodyTooLarge { limit: 4 })
        );
        assert_eq!(
            read(chunks(vec![Ok("a"), Err("reset")]), &limits(4)).await,
            Err(PlaceError::BodyUnreadable("reset".into()))
        );
    }

    #[tokio::test]
    async fn a_declared_length_past_the_limit_is_refused_before_reading() {
        let declared = Full::new(Bytes::from_static(b"12345"));
        assert_eq!(
            read(declared, &limits(4)).await,
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
        let mut reserved = budget.empty();
        let refused = read_body(
            chunks(vec![Ok("ab"), Ok("cd")]),
            &limits(100),
            &mut reserved,
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
        let timed_out = read_body(never, &slow, &mut ByteBudget::new(10).empty()).await;
        assert!(
            matches!(timed_out, Err(PlaceError::BodyTimeout { .. })),
            "{timed_out:?}"
        );
    }
}
