//! The placers' time: milliseconds on the wall clock since the producer started, or, where a
//! simulator drives the producer (the BLIS bench, docs/load-benches.md), the simulated time it
//! sets. Everything the placers decide by time (the memory's ages, when a prefill is predicted
//! done, how often the memory is settled) reads this one clock, so the same placements follow
//! from the same arrivals whoever keeps the time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The placers' clock.
#[derive(Clone, Debug)]
pub struct Clock(Keeper);

#[derive(Clone, Debug)]
enum Keeper {
    Wall(Instant),
    Driven(Arc<AtomicU64>),
}

/// Sets a driven [`Clock`]'s time.
#[derive(Clone, Debug)]
pub struct ClockHand(Arc<AtomicU64>);

impl Clock {
    /// The wall clock, from now.
    pub fn wall() -> Self {
        Clock(Keeper::Wall(Instant::now()))
    }

    /// A clock at 0 that only its hand moves.
    pub fn driven() -> (Self, ClockHand) {
        let ms = Arc::new(AtomicU64::new(0));
        (Clock(Keeper::Driven(ms.clone())), ClockHand(ms))
    }

    /// Milliseconds since it started.
    pub fn now_ms(&self) -> u64 {
        match &self.0 {
            Keeper::Wall(started) => started.elapsed().as_millis() as u64,
            Keeper::Driven(ms) => ms.load(Ordering::Relaxed),
        }
    }
}

impl ClockHand {
    /// Moves the clock to `ms`; never back (a placer's time is monotonic).
    pub fn set_ms(&self, ms: u64) {
        self.0.fetch_max(ms, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driven_clock_moves_only_forward_and_only_by_its_hand() {
        let (clock, hand) = Clock::driven();
        assert_eq!(clock.now_ms(), 0);
        hand.set_ms(1_500);
        assert_eq!(clock.now_ms(), 1_500);
        hand.set_ms(1_000);
        assert_eq!(clock.now_ms(), 1_500, "never back");
        let copy = clock.clone();
        hand.set_ms(2_000);
        assert_eq!(copy.now_ms(), 2_000, "its copies read the same time");
    }
}
