//! Reading a request body under the body limit, the same for every HTTP front-end (the endpoint
//! picker gets its chunks in messages and checks the same [`Limits::check_body`]).

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;

use super::error::PlaceError;
use super::limits::Limits;

/// The whole body. Refused at once when it declares more than `limits.max_body_bytes`, or once
/// it grows past them (the rest is not read), or when the connection fails while it is read.
pub async fn read_body<B>(body: B, limits: &Limits) -> Result<Bytes, PlaceError>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let declared = usize::try_from(body.size_hint().lower()).unwrap_or(usize::MAX);
    limits.check_body(declared)?;
    let mut body = std::pin::pin!(body);
    let mut bytes = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| PlaceError::BodyUnreadable(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            limits.check_body(bytes.len() + data.len())?;
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};

    fn limits(max_body_bytes: usize) -> Limits {
        Limits {
            max_body_bytes,
            ..Limits::default()
        }
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
        let body = read_body(chunks(vec![Ok("ab"), Ok("cd")]), &limits(4)).await;
        assert_eq!(body.unwrap(), Bytes::from_static(b"abcd"));
        assert_eq!(
            read_body(chunks(vec![Ok("ab"), Ok("cde")]), &limits(4)).await,
            Err(PlaceError::BodyTooLarge { limit: 4 })
        );
        assert_eq!(
            read_body(chunks(vec![Ok("a"), Err("reset")]), &limits(4)).await,
            Err(PlaceError::BodyUnreadable("reset".into()))
        );
    }

    #[tokio::test]
    async fn a_declared_length_past_the_limit_is_refused_before_reading() {
        let declared = Full::new(Bytes::from_static(b"12345"));
        assert_eq!(
            read_body(declared, &limits(4)).await,
            Err(PlaceError::BodyTooLarge { limit: 4 })
        );
    }
}
