//! The bytes of gRPC messages the endpoint picker has not received whole, in the byte budget
//! (`--max-window-bytes`, docs/behaviour.md §11). tonic buffers a message until its last byte
//! arrives (up to the decoding limit, the body limit plus room), before the picker sees any of
//! it: without this, streams that each send most of a large message and stop held that memory
//! outside the budget until the body timeout. Each stream's inbound body is read through
//! [`TransitBody`], which follows the gRPC framing (a flag byte, a 4-byte big-endian length, the
//! message) and keeps the bytes of the message in transit reserved; a frame whose bytes do not
//! fit ends the stream with [`refused`], which the picker answers `429 window_full`.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tonic::{Code, Status};

use burst_prefix_core::admit::BUDGET_RETRY_AFTER;
use burst_prefix_core::budget::Reserved;
use burst_prefix_core::PlaceError;

/// The gRPC message prefix: the compressed flag and the length.
const PREFIX: usize = 5;

/// The message of the status that ends a stream whose message in transit did not fit.
const REFUSED: &str =
    "window_full: the bytes of a message in transit do not fit --max-window-bytes";

/// A stream's inbound body, its message in transit counted in the budget.
pub struct TransitBody {
    inner: Body,
    reserved: Reserved,
    prefix: [u8; PREFIX],
    /// Prefix bytes seen of the message in transit (0: between messages).
    prefix_seen: usize,
    /// The message's declared length, and how much of it is still to come.
    declared: usize,
    remaining: usize,
    refused: bool,
}

impl TransitBody {
    pub fn new(inner: Body, reserved: Reserved) -> Self {
        TransitBody {
            inner,
            reserved,
            prefix: [0; PREFIX],
            prefix_seen: 0,
            declared: 0,
            remaining: 0,
            refused: false,
        }
    }

    /// Follows the framing through `data`; the bytes of the message now in transit.
    fn track(&mut self, mut data: &[u8]) -> usize {
        while !data.is_empty() {
            if self.prefix_seen < PREFIX {
                let n = (PREFIX - self.prefix_seen).min(data.len());
                self.prefix[self.prefix_seen..self.prefix_seen + n].copy_from_slice(&data[..n]);
                self.prefix_seen += n;
                data = &data[n..];
                if self.prefix_seen == PREFIX {
                    let length = [
                        self.prefix[1],
                        self.prefix[2],
                        self.prefix[3],
                        self.prefix[4],
                    ];
                    self.declared = u32::from_be_bytes(length) as usize;
                    self.remaining = self.declared;
                }
            } else {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
            }
            if self.prefix_seen == PREFIX && self.remaining == 0 {
                // Whole: tonic decodes it now, and the picker counts what it keeps.
                self.prefix_seen = 0;
            }
        }
        match self.prefix_seen {
            PREFIX => PREFIX + self.declared - self.remaining,
            seen => seen,
        }
    }

    /// Keeps `in_transit` bytes reserved; false when they do not fit.
    fn reserve(&mut self, in_transit: usize) -> bool {
        if in_transit < self.reserved.bytes() {
            self.reserved.release();
        }
        let more = in_transit - self.reserved.bytes();
        self.reserved.grow(more)
    }
}

impl http_body::Body for TransitBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.refused {
            return Poll::Ready(None);
        }
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            let in_transit = this.track(data);
            if !this.reserve(in_transit) {
                this.refused = true;
                this.reserved.release();
                let refused = Status::resource_exhausted(REFUSED);
                return Poll::Ready(Some(Err(axum::Error::new(refused))));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.refused || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The refusal of a stream that [`TransitBody`] ended, if `status` is its.
pub fn refused(status: &Status, limit: usize) -> Option<PlaceError> {
    (status.code() == Code::ResourceExhausted && status.message() == REFUSED).then_some(
        PlaceError::WindowFull {
            limit,
            retry_after: BUDGET_RETRY_AFTER,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_core::budget::ByteBudget;

    fn framed(length: u32, sent: usize) -> Vec<u8> {
        let mut frame = vec![0u8];
        frame.extend_from_slice(&length.to_be_bytes());
        frame.resize(PREFIX + sent, b' ');
        frame
    }

    #[test]
    fn only_the_message_in_transit_is_counted() {
        let budget = ByteBudget::new(1_000);
        let mut body = TransitBody::new(Body::empty(), budget.empty());
        // A whole message, then 40 bytes of a second one declaring 100.
        let mut data = framed(10, 10);
        data.extend(framed(100, 40));
        assert_eq!(body.track(&data), PREFIX + 40);
        // Its rest and 3 bytes of the next prefix.
        assert_eq!(body.track(&[b' '; 60]), 0);
        assert_eq!(body.track(&[0, 0, 0]), 3);
        assert_eq!(body.track(&[0, 7, b'x']), PREFIX + 1);
    }

    #[test]
    fn a_message_that_does_not_fit_is_refused_and_a_finished_one_gives_its_bytes_back() {
        let budget = ByteBudget::new(100);
        let mut other = budget.empty();
        assert!(other.grow(50));
        let mut body = TransitBody::new(Body::empty(), budget.empty());
        let in_transit = body.track(&framed(80, 40));
        assert!(body.reserve(in_transit));
        assert_eq!(budget.used(), 50 + 45);
        let in_transit = body.track(&[b' '; 40]);
        assert!(body.reserve(in_transit));
        assert_eq!(budget.used(), 50, "a whole message holds nothing here");
        let in_transit = body.track(&framed(80, 60));
        assert!(!body.reserve(in_transit), "50 + 65 > 100");
        assert_eq!(budget.used(), 50, "nothing taken by a refusal");
    }
}
