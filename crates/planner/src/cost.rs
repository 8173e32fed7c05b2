//! One cost, in seconds (docs/behaviour.md §4, "Time"): a request goes where it is predicted to
//! be answered first, counting the time it takes from the requests already there.
//!
//! A replica prefills the prompt tokens it does not cache at its prefill rate, after the
//! prefill already queued there; then it decodes the answer one token per step, and a step takes
//! longer with every sequence decoding beside it (BLIS's step model: a fixed part plus a part per
//! sequence). So a request placed on replica r, with `u` of its prompt tokens uncached there and
//! an answer of `L` tokens, costs
//!
//! ```text
//!   queued prefill x p + overhead + u x p          until its first token (less the queued
//!                                                   prefill of the prefix it shares there)
//! + L x (d + g x (running + 1))                    its decode, beside the running sequences
//! + running x L x g                                 what it slows the running ones by
//! + a wait for a slot when r runs its maximum
//! ```
//!
//! with `p` the replica's seconds per prefill token, `d` its seconds per decode step alone and
//! `g` what each further sequence adds to a step. Requests that share a prefix on one replica
//! share its prefill (vLLM registers a block when it is allocated, so copies scheduled together
//! compute it once): the queued prefill of a prefix it holds there is not waited for again. The k-split, how many replicas a fan-out's
//! prefix is computed on and a conversation's stickiness all follow from this one cost: a
//! request follows a prefix to the replica holding it while the prefill it saves there is worth
//! more than the decoding it slows.

/// How fast a replica works: learned from its engine's own metrics when the producer reads
/// them, else the config's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speed {
    /// Seconds to prefill one prompt token it does not cache.
    pub prefill_seconds_per_token: f64,
    /// Seconds every prefill takes besides its tokens.
    pub prefill_overhead_seconds: f64,
    /// Seconds per decode step with one sequence running (its inter-token latency alone).
    pub decode_seconds_per_step: f64,
    /// Seconds each further running sequence adds to a decode step.
    pub decode_seconds_per_step_per_sequence: f64,
    /// Requests it runs at once (vLLM's `max_num_seqs`); the next ones wait for a slot.
    pub max_running: f64,
}

impl Default for Speed {
    /// Llama-3.1-8B on one H100 (BLIS's calibrated step model, `defaults.yaml` at 1a6eb35:
    /// beta = 5752.7 + 17.251 x prefill tokens + 5.9991 x decode tokens us per step, alpha0 =
    /// 232.46 us), vLLM's default of 256 sequences.
    fn default() -> Self {
        Speed {
            prefill_seconds_per_token: 19.0e-6,
            prefill_overhead_seconds: 5.985e-3,
            decode_seconds_per_step: 5.759e-3,
            decode_seconds_per_step_per_sequence: 6.0e-6,
            max_running: 256.0,
        }
    }
}

/// What a replica is busy with when a request is placed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Busy {
    /// Requests placed on it and not answered (running or waiting).
    pub requests: f64,
    /// Prompt tokens placed on it that it does not cache and has not prefilled yet.
    pub prefill_tokens: f64,
}

/// A replica as the time cost sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pace {
    pub speed: Speed,
    pub busy: Busy,
}

impl Pace {
    /// The seconds a request costs here (the module's formula): `uncached` of its prompt
    /// tokens not held here, `held` held (their queued prefill it shares), an answer of
    /// `output` tokens.
    pub fn seconds(&self, uncached: f64, held: f64, output: f64) -> f64 {
        let Speed {
            decode_seconds_per_step: d,
            decode_seconds_per_step_per_sequence: g,
            max_running,
            ..
        } = self.speed;
        let running = self.busy.requests.min(max_running - 1.0).max(0.0);
        let first_token = self.first_token_seconds(uncached, held);
        let decode = output * (d + g * (running + 1.0));
        let slows = running * output * g;
        // Past its maximum a request waits for a slot: one frees every answer's decode over
        // the slots, on average.
        let queued = (self.busy.requests + 1.0 - max_running).max(0.0);
        let wait = queued * output * (d + g * max_running) / max_running;
        first_token + decode + slows + wait
    }

    /// The seconds until the first token of a request placed here with `uncached` prompt
    /// tokens not held here and `held` held: the prefill queued before it (but what it
    /// shares), then its own.
    pub fn first_token_seconds(&self, uncached: f64, held: f64) -> f64 {
        let queued = self.busy.prefill_tokens - held.min(self.busy.prefill_tokens);
        (queued + uncached) * self.speed.prefill_seconds_per_token
            + self.speed.prefill_overhead_seconds
    }

    /// The replica after one more request with `uncached` prompt tokens.
    pub fn add(&mut self, uncached: f64) {
        self.busy.requests += 1.0;
        self.busy.prefill_tokens += uncached;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_replica_costs_the_requests_own_prefill_and_decode() {
        let pace = Pace::default();
        let s = pace.speed;
        let alone = pace.seconds(2000.0, 0.0, 100.0);
        let expected = 2000.0 * s.prefill_seconds_per_token
            + s.prefill_overhead_seconds
            + 100.0 * (s.decode_seconds_per_step + s.decode_seconds_per_step_per_sequence);
        assert!((alone - expected).abs() < 1e-12, "{alone} vs {expected}");
    }

    #[test]
    fn a_cached_prompt_saves_its_prefill_and_each_running_sequence_costs_twice() {
        let mut pace = Pace::default();
        let s = pace.speed;
        let cold = pace.seconds(2000.0, 0.0, 100.0);
        let warm = pace.seconds(0.0, 0.0, 100.0);
        assert!((cold - warm - 2000.0 * s.prefill_seconds_per_token).abs() < 1e-12);
        pace.add(0.0);
        // Once beside it (its own decode slower), once for the one it slows.
        let step = 2.0 * 100.0 * s.decode_seconds_per_step_per_sequence;
        assert!((pace.seconds(0.0, 0.0, 100.0) - warm - step).abs() < 1e-12);
        // Prefill queued before it is waited for, but not that of a prefix it shares there.
        pace.add(500.0);
        let queued = 500.0 * s.prefill_seconds_per_token;
        assert!((pace.seconds(0.0, 0.0, 100.0) - warm - 2.0 * step - queued).abs() < 1e-12);
        let sharing = pace.seconds(0.0, 300.0, 100.0);
        let left = 200.0 * s.prefill_seconds_per_token;
        assert!((sharing - warm - 2.0 * step - left).abs() < 1e-12);
    }

    #[test]
    fn a_full_replica_adds_a_wait_for_a_slot() {
        let speed = Speed {
            max_running: 2.0,
            ..Speed::default()
        };
        let at = |requests: f64| {
            Pace {
                speed,
                busy: Busy {
                    requests,
                    prefill_tokens: 0.0,
                },
            }
            .seconds(0.0, 0.0, 100.0)
        };
        // Two running: the third waits about half an answer's decode.
        let waited = at(2.0) - at(1.0);
        let decode = 100.0
            * (speed.decode_seconds_per_step + 2.0 * speed.decode_seconds_per_step_per_sequence);
        assert!((waited - decode / 2.0).abs() < 1e-9, "{waited}");
        assert!(at(3.0) - at(2.0) > waited * 0.99);
    }

    #[test]
    fn a_slower_replica_costs_more_for_the_same_request() {
        let fast = Pace::default();
        let slow = Pace {
            speed: Speed {
                prefill_seconds_per_token: 50.15e-6,
                prefill_overhead_seconds: 24.18e-3,
                decode_seconds_per_step: 16.46e-3,
                decode_seconds_per_step_per_sequence: 18.2e-6,
                max_running: 256.0,
            },
            busy: Busy::default(),
        };
        assert!(slow.seconds(1000.0, 0.0, 200.0) > 2.5 * fast.seconds(1000.0, 0.0, 200.0));
    }
}
