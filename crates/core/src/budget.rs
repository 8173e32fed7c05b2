//! The bytes requests hold before they are placed, under one limit (`--max-window-bytes`):
//! bodies while they are read, the bodies a proxy keeps while its requests wait, and the hashes
//! in the open window. A request whose bytes do not fit is refused (`window_full`, 429) before
//! more of it is read, so slow or abandoned bodies cannot grow the producer's memory past it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct ByteBudget {
    limit: usize,
    used: AtomicUsize,
}

/// Bytes taken from a [`ByteBudget`], given back when dropped.
#[derive(Debug)]
pub struct Reserved {
    budget: Arc<ByteBudget>,
    bytes: usize,
}

impl ByteBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(ByteBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes taken now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation, to [`Reserved::grow`].
    pub fn empty(self: &Arc<Self>) -> Reserved {
        Reserved {
            budget: self.clone(),
            bytes: 0,
        }
    }

    /// Takes `bytes` more for a reservation that holds `own` if they fit, or if nothing but that
    /// reservation is taken (one request always fits: its body is bounded by its own limit).
    fn take(&self, bytes: usize, own: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let fits = used == own || used.saturating_add(bytes) <= self.limit;
                fits.then(|| used.saturating_add(bytes))
            })
            .is_ok()
    }
}

impl Reserved {
    /// Takes `more` bytes into this reservation; false (and nothing taken) when they do not fit.
    pub fn grow(&mut self, more: usize) -> bool {
        if more == 0 || self.budget.take(more, self.bytes) {
            self.bytes += more;
            true
        } else {
            false
        }
    }

    /// Gives back every byte taken; the reservation stays, empty, to grow again.
    pub fn release(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        self.bytes = 0;
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The limit of the budget it is taken from.
    pub fn limit(&self) -> usize {
        self.budget.limit
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_refused_beyond_the_limit_but_one_request_always_fits_and_drops_give_back() {
        let budget = ByteBudget::new(100);
        let mut big = budget.empty();
        assert!(big.grow(500), "alone: fits whatever its size");
        assert!(big.grow(500), "and grows while alone");
        let mut small = budget.empty();
        assert!(!small.grow(1), "anything more does not");
        drop(big);
        assert_eq!(budget.used(), 0);
        assert!(small.grow(60));
        let mut other = budget.empty();
        assert!(other.grow(40));
        assert!(!other.grow(1));
        assert_eq!((small.bytes(), other.bytes(), budget.used()), (60, 40, 100));
        drop((small, other));
        assert_eq!(budget.used(), 0);
    }
}
