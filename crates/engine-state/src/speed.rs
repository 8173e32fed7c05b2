//! Each replica's speed, learned from its own `/metrics` (docs/behaviour.md §7, "What the
//! engines say"): how long its prefills take per uncached prompt token, how long a decode step
//! takes with more or fewer sequences running, and how long its answers are. The time cost
//! (`burst_prefix_planner::cost`) prices a replica with it, so replicas of different speed are
//! priced right; until a replica has shown enough, the config's figures stand.
//!
//! From vLLM's counters (llm-d-inference-sim exports the same), between two scrapes:
//! - prefill: `vllm:request_prefill_time_seconds` (sum and count) against the prompt tokens it
//!   computed (`vllm:prompt_tokens_total` less `vllm:prefix_cache_hits_total`): a prefill takes
//!   `overhead + p x computed tokens`;
//! - decode: `vllm:request_decode_time_seconds` (sum, count) over the tokens decoded after each
//!   first one (`vllm:generation_tokens_total` less the requests), at the mean of
//!   `vllm:num_requests_running` at both scrapes: a step takes `d + g x running`;
//! - answers: the tokens generated per finished request.
//!
//! Each line keeps the config's split between its fixed and its per-token (per-sequence) part
//! and learns its level: the seconds observed over the work the line predicts, summed over the
//! recent intervals and forgetting older ones ([`FORGET`] per interval that saw some work). The
//! counters move at different moments (a prompt's tokens count when it arrives, its prefill time
//! when its first token is out), so one interval's ratios are noise while sums over many are not.
//!
//! The engine is another system, so what it says is checked before it is believed:
//! - a counter absent, not a number, or summing past what a float holds is unknown for that
//!   scrape; when it is back, it starts a new baseline (its lifetime total never lands in one
//!   interval); one that went back (a restart) starts a new baseline too;
//! - an interval whose counters moved more than an engine can in its time (more requests,
//!   tokens or busy seconds than [`MAX_REQUESTS_PER_SECOND`], [`MAX_TOKENS_PER_SECOND`],
//!   [`MAX_BUSY_SECONDS_PER_SECOND`] allow), or whose running gauge is past [`MAX_RUNNING`], is
//!   rejected, never folded in ([`Verdict::Rejected`]);
//! - every learned figure stays within [`BOUND`] times the prior either way, and is finite;
//! - while a replica shows no work, what it taught relaxes toward the prior (halving its weight
//!   every [`RELAX_HALF_LIFE_SECONDS`]): a replica learned slow, and so given nothing, is tried
//!   again and seen to recover.

use burst_prefix_planner::Speed;

use crate::exposition::parse_sample;

/// A learned figure is at most this many times the prior's, and at least its this-many-th.
pub const BOUND: f64 = 20.0;
/// More requests than this per second per replica are not an engine's (prefills, answers).
pub const MAX_REQUESTS_PER_SECOND: f64 = 100_000.0;
/// More tokens than this per second per replica are not an engine's (prompt, cached, generated).
pub const MAX_TOKENS_PER_SECOND: f64 = 10_000_000.0;
/// More request-seconds of prefill or decode per second than this are not an engine's (requests
/// run side by side, but not this many).
pub const MAX_BUSY_SECONDS_PER_SECOND: f64 = 16_384.0;
/// A running gauge past this is not an engine's.
pub const MAX_RUNNING: f64 = 100_000.0;
/// One request's prefill or decode taking longer than this is not an engine's.
pub const MAX_SECONDS_PER_REQUEST: f64 = 3_600.0;
/// While a replica shows no work, what it taught weighs half as much every this many seconds.
pub const RELAX_HALF_LIFE_SECONDS: f64 = 0.5;

/// What one scrape's counters say, summed over the replica's models and engines; `None` where
/// a counter is absent, not a number, or sums past what a float holds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counters {
    /// `vllm:request_prefill_time_seconds_sum`.
    pub prefill_seconds: Option<f64>,
    /// `vllm:request_prefill_time_seconds_count`.
    pub prefill_requests: Option<f64>,
    /// `vllm:prompt_tokens_total`.
    pub prompt_tokens: Option<f64>,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub cached_prompt_tokens: Option<f64>,
    /// `vllm:request_decode_time_seconds_sum`.
    pub decode_seconds: Option<f64>,
    /// `vllm:request_decode_time_seconds_count`.
    pub decode_requests: Option<f64>,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens: Option<f64>,
    /// `vllm:num_requests_running` (a gauge).
    pub running: Option<f64>,
}

/// The counters of a `/metrics` text.
pub fn parse_counters(text: &str) -> Counters {
    // Per field: its sum so far, and whether a sample of it was not a number.
    let mut sums: [(Option<f64>, bool); 8] = [(None, false); 8];
    for (name, _, value) in text.lines().filter_map(parse_sample) {
        let field = match name {
            "vllm:request_prefill_time_seconds_sum" => 0,
            "vllm:request_prefill_time_seconds_count" => 1,
            "vllm:prompt_tokens_total" => 2,
            "vllm:prefix_cache_hits_total" => 3,
            "vllm:request_decode_time_seconds_sum" => 4,
            "vllm:request_decode_time_seconds_count" => 5,
            "vllm:generation_tokens_total" => 6,
            "vllm:num_requests_running" => 7,
            _ => continue,
        };
        let (sum, poisoned) = &mut sums[field];
        *poisoned |= !value.is_finite();
        *sum = Some(sum.unwrap_or(0.0) + value);
    }
    let [a, b, c, d, e, f, g, h] =
        sums.map(|(sum, poisoned)| sum.filter(|s| s.is_finite() && !poisoned));
    Counters {
        prefill_seconds: a,
        prefill_requests: b,
        prompt_tokens: c,
        cached_prompt_tokens: d,
        decode_seconds: e,
        decode_requests: f,
        generation_tokens: g,
        running: h,
    }
}

/// What one scrape did to a replica's learned speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Its first scrape, or an interval that saw no work: nothing learned.
    Baseline,
    /// Folded in.
    Learned,
    /// Not folded in: the counters moved more than an engine can (`.0` says which).
    Rejected(&'static str),
    /// A counter went back (a restart) or came back: a new baseline from it.
    Reset,
}

/// How much an interval's evidence counts once the next interval with evidence came.
pub const FORGET: f64 = 0.9;

/// Requests a fit needs to have seen (after forgetting) before it replaces the prior.
const ENOUGH_REQUESTS: f64 = 8.0;

/// One replica's learned speed.
#[derive(Clone, Debug, Default)]
pub struct SpeedLearner {
    /// The last scrape and when (seconds on the caller's monotonic clock).
    last: Option<(Counters, f64)>,
    /// When an interval last showed work (for the relaxation toward the prior), and the last
    /// scrape's time.
    worked_at: f64,
    seen_at: f64,
    /// Prefill seconds per request against computed tokens per request, weighted by requests.
    prefill: Line,
    /// Seconds per decode step against sequences running, weighted by requests.
    decode: Line,
    /// Tokens per answer: (requests, tokens), forgetting alike.
    answers: (f64, f64),
}

impl SpeedLearner {
    /// A replica not heard yet.
    pub fn new() -> Self {
        SpeedLearner {
            last: None,
            worked_at: 0.0,
            seen_at: 0.0,
            prefill: Line::default(),
            decode: Line::default(),
            answers: (0.0, 0.0),
        }
    }

    /// One scrape's counters, read at `at` seconds (any monotonic clock, the same for every
    /// call). What it says is checked first (the module's rules); the verdict says what it did.
    pub fn observe(&mut self, now: Counters, at: f64) -> Verdict {
        self.seen_at = at;
        let Some((last, last_at)) = self.last.replace((now, at)) else {
            self.worked_at = at;
            return Verdict::Baseline;
        };
        let elapsed = (at - last_at).max(1e-3);
        // A counter known at both scrapes moved by its delta; one that went back, or was
        // unknown at either, is a new baseline.
        let mut reset = false;
        let mut d = |f: fn(&Counters) -> Option<f64>| match (f(&last), f(&now)) {
            (Some(before), Some(after)) if after >= before => Some(after - before),
            (Some(_), Some(_)) | (None, Some(_)) => {
                reset = true;
                None
            }
            _ => None,
        };
        let prefill_seconds = d(|c| c.prefill_seconds);
        let prefills = d(|c| c.prefill_requests);
        let prompt = d(|c| c.prompt_tokens);
        let cached = d(|c| c.cached_prompt_tokens);
        let decode_seconds = d(|c| c.decode_seconds);
        let decodes = d(|c| c.decode_requests);
        let generated = d(|c| c.generation_tokens);
        let plausible = |delta: Option<f64>, per_second: f64| {
            delta.is_none_or(|delta| delta <= per_second * elapsed + per_second.min(1e4))
        };
        let checks = [
            (
                plausible(prefills, MAX_REQUESTS_PER_SECOND),
                "prefill requests",
            ),
            (
                plausible(decodes, MAX_REQUESTS_PER_SECOND),
                "decode requests",
            ),
            (plausible(prompt, MAX_TOKENS_PER_SECOND), "prompt tokens"),
            (plausible(cached, MAX_TOKENS_PER_SECOND), "cached tokens"),
            (
                plausible(generated, MAX_TOKENS_PER_SECOND),
                "generated tokens",
            ),
            (
                plausible(prefill_seconds, MAX_BUSY_SECONDS_PER_SECOND),
                "prefill seconds",
            ),
            (
                plausible(decode_seconds, MAX_BUSY_SECONDS_PER_SECOND),
                "decode seconds",
            ),
            (
                [last.running, now.running]
                    .iter()
                    .all(|r| r.is_none_or(|r| (0.0..=MAX_RUNNING).contains(&r))),
                "running",
            ),
        ];
        if let Some((_, what)) = checks.iter().find(|(ok, _)| !ok) {
            return Verdict::Rejected(what);
        }
        // A histogram's sum and count move together (each observation adds to both), each
        // observation a positive time under an hour: a sum frozen while its count moves, or the
        // other way round, is a lie.
        for (sum, count, what) in [
            (prefill_seconds, prefills, "the prefill time histogram"),
            (decode_seconds, decodes, "the decode time histogram"),
        ] {
            if let (Some(sum), Some(count)) = (sum, count) {
                let consistent = if count > 0.0 {
                    sum > 0.0 && sum <= count * MAX_SECONDS_PER_REQUEST
                } else {
                    sum == 0.0
                };
                if !consistent {
                    return Verdict::Rejected(what);
                }
            }
        }
        // Older evidence is forgotten only as new evidence comes. A prompt's tokens and its
        // prefill time, an answer's tokens and its decode time, are counted at different
        // moments: each is added in the interval it moved in, and only the sums are compared.
        let mut learned = false;
        if let (Some(prefill_seconds), Some(prefills), Some(prompt), Some(cached)) =
            (prefill_seconds, prefills, prompt, cached)
        {
            let computed = (prompt - cached).max(0.0);
            if prefills > 0.0 || computed > 0.0 {
                self.prefill.forget();
                self.prefill
                    .add(prefills, prefills, computed, prefill_seconds);
                learned = true;
            }
        }
        if let (Some(decode_seconds), Some(decodes), Some(generated)) =
            (decode_seconds, decodes, generated)
        {
            if decodes > 0.0 || generated > 0.0 {
                let steps = (generated - decodes).max(0.0);
                let running = [last.running, now.running]
                    .iter()
                    .map(|r| r.unwrap_or(1.0))
                    .sum::<f64>()
                    / 2.0;
                self.decode.forget();
                self.decode
                    .add(decodes, steps, steps * running.max(1.0), decode_seconds);
                self.answers.0 = self.answers.0 * FORGET + decodes;
                self.answers.1 = self.answers.1 * FORGET + generated;
                learned = true;
            }
        }
        if learned {
            self.worked_at = at;
            Verdict::Learned
        } else {
            // No work: the evidence itself fades at the relaxation's pace, so that work resumed
            // after a long pause is learned afresh rather than mixed with what the replica was.
            let idle = 0.5f64.powf(elapsed.min(at - self.worked_at) / RELAX_HALF_LIFE_SECONDS);
            self.prefill.scale_by(idle);
            self.decode.scale_by(idle);
            if reset {
                Verdict::Reset
            } else {
                Verdict::Baseline
            }
        }
    }

    /// How much of what it taught still counts: 1 while it shows work, halving every
    /// [`RELAX_HALF_LIFE_SECONDS`] of showing none.
    fn trust(&self) -> f64 {
        0.5f64.powf((self.seen_at - self.worked_at).max(0.0) / RELAX_HALF_LIFE_SECONDS)
    }

    /// Whether what it taught has relaxed to (nearly) nothing: the prior stands again.
    pub fn relaxed(&self) -> bool {
        self.trust() < 0.01
    }

    /// The speed as learned so far, `prior`'s where too little was seen; every figure finite
    /// and within [`BOUND`] times the prior's, relaxed toward it while the replica shows no
    /// work.
    pub fn speed(&self, prior: Speed) -> Speed {
        let mut speed = prior;
        let trust = self.trust();
        if let Some(scale) = self.prefill.scale(
            prior.prefill_overhead_seconds,
            prior.prefill_seconds_per_token,
            trust,
        ) {
            speed.prefill_overhead_seconds *= scale;
            speed.prefill_seconds_per_token *= scale;
        }
        if let Some(scale) = self.decode.scale(
            prior.decode_seconds_per_step,
            prior.decode_seconds_per_step_per_sequence,
            trust,
        ) {
            speed.decode_seconds_per_step *= scale;
            speed.decode_seconds_per_step_per_sequence *= scale;
        }
        speed
    }

    /// The mean answer length, in tokens, once enough answers were seen.
    pub fn output_tokens(&self) -> Option<f64> {
        let (requests, tokens) = self.answers;
        (requests >= ENOUGH_REQUESTS)
            .then(|| tokens / requests)
            .filter(|tokens| tokens.is_finite())
            .map(|tokens| tokens.clamp(1.0, f64::from(1u32 << 20)))
    }
}

/// Observed seconds `y` against a model `y = a x u + b x v` whose split `b / a` is the prior's:
/// forgotten sums of both terms and of the seconds, weighted by the requests they saw. Counters
/// move at different moments (a prompt's tokens count when it arrives, its prefill time when its
/// first token is out), so an interval's own ratios are noise; sums over many intervals are not,
/// and a split between the fixed and the per-token part would need the intervals to differ more
/// than they do under steady load. So the level is learned and the shape kept.
#[derive(Clone, Copy, Debug, Default)]
struct Line {
    weight: f64,
    u: f64,
    v: f64,
    y: f64,
}

impl Line {
    fn forget(&mut self) {
        self.scale_by(FORGET);
    }

    fn scale_by(&mut self, factor: f64) {
        for sum in [&mut self.weight, &mut self.u, &mut self.v, &mut self.y] {
            *sum *= factor;
        }
    }

    fn add(&mut self, weight: f64, u: f64, v: f64, y: f64) {
        self.weight += weight;
        self.u += u;
        self.v += v;
        self.y += y;
    }

    /// What the prior `(a, b)` is scaled by (the prior's `b / a` kept), once enough was seen:
    /// within [1 / BOUND, BOUND], and only `trust` of the way there from 1 (geometrically).
    fn scale(&self, prior_a: f64, prior_b: f64, trust: f64) -> Option<f64> {
        if self.weight < ENOUGH_REQUESTS || prior_a <= 0.0 || !prior_a.is_finite() {
            return None;
        }
        let ratio = prior_b / prior_a;
        let basis = self.u + ratio * self.v;
        let a = self.y / basis;
        if !(basis > 0.0 && a.is_finite() && ratio.is_finite()) {
            return None;
        }
        let scale = (a / prior_a).clamp(1.0 / BOUND, BOUND);
        Some(scale.powf(trust))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_planner::testing::a100;

    /// A scrape's counters, every one present.
    #[derive(Clone, Copy, Debug, Default)]
    struct Raw {
        prefill_seconds: f64,
        prefill_requests: f64,
        prompt_tokens: f64,
        cached_prompt_tokens: f64,
        decode_seconds: f64,
        decode_requests: f64,
        generation_tokens: f64,
        running: f64,
    }

    impl Raw {
        fn counters(&self) -> Counters {
            Counters {
                prefill_seconds: Some(self.prefill_seconds),
                prefill_requests: Some(self.prefill_requests),
                prompt_tokens: Some(self.prompt_tokens),
                cached_prompt_tokens: Some(self.cached_prompt_tokens),
                decode_seconds: Some(self.decode_seconds),
                decode_requests: Some(self.decode_requests),
                generation_tokens: Some(self.generation_tokens),
                running: Some(self.running),
            }
        }
    }

    /// A learner fed scrapes a second apart.
    struct Scrapes {
        learner: SpeedLearner,
        at: f64,
    }

    impl Scrapes {
        fn new() -> Self {
            Scrapes {
                learner: SpeedLearner::new(),
                at: 0.0,
            }
        }

        fn observe(&mut self, raw: Raw) -> Verdict {
            self.at += 1.0;
            self.learner.observe(raw.counters(), self.at)
        }
    }

    /// Counters of a replica whose prefill takes `overhead + p x tokens` and decode step
    /// `d + g x running`, after `intervals` intervals of varied load.
    fn run(learner: &mut Scrapes, truth: Speed, intervals: usize, vary: bool) -> Raw {
        let mut c = Raw {
            running: if vary { 4.0 } else { 8.0 },
            ..Raw::default()
        };
        learner.observe(c);
        for i in 0..intervals {
            let requests = 10.0;
            let computed = if vary {
                200.0 + 300.0 * (i % 4) as f64
            } else {
                1_000.0
            };
            let running = if vary {
                4.0 + 10.0 * (i % 3) as f64
            } else {
                8.0
            };
            let answer = 100.0;
            c.prefill_requests += requests;
            c.prefill_seconds += requests
                * (truth.prefill_overhead_seconds + truth.prefill_seconds_per_token * computed);
            c.prompt_tokens += requests * (computed + 50.0);
            c.cached_prompt_tokens += requests * 50.0;
            c.decode_requests += requests;
            c.generation_tokens += requests * answer;
            c.decode_seconds += requests
                * (answer - 1.0)
                * (truth.decode_seconds_per_step
                    + truth.decode_seconds_per_step_per_sequence * running);
            c.running = running;
            learner.observe(c);
        }
        c
    }

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance * b.abs()
    }

    #[test]
    fn the_prior_stands_until_enough_is_seen() {
        let learner = SpeedLearner::new();
        assert_eq!(learner.speed(Speed::default()), Speed::default());
        assert_eq!(learner.output_tokens(), None);
    }

    #[test]
    fn a_slower_replica_is_learned_from_its_counters() {
        // An A100 replica priced with the H100 prior: after a few intervals of varied load its
        // learned speed predicts what it really takes, at the loads it saw, within 15%, and a
        // request there is priced as the 2.6x slower replica it is.
        let mut scrapes = Scrapes::new();
        run(&mut scrapes, a100(), 12, true);
        let learner = &scrapes.learner;
        let speed = learner.speed(Speed::default());
        let truth = a100();
        let prefill = |s: &Speed, tokens: f64| {
            s.prefill_overhead_seconds + tokens * s.prefill_seconds_per_token
        };
        let step = |s: &Speed, running: f64| {
            s.decode_seconds_per_step + running * s.decode_seconds_per_step_per_sequence
        };
        for tokens in [500.0, 650.0, 800.0] {
            assert!(
                close(prefill(&speed, tokens), prefill(&truth, tokens), 0.15),
                "{speed:?}"
            );
        }
        for running in [4.0, 14.0] {
            assert!(
                close(step(&speed, running), step(&truth, running), 0.15),
                "{speed:?}"
            );
        }
        let request = |s: &Speed| prefill(s, 1_000.0) + 200.0 * step(s, 8.0);
        assert!(
            request(&speed) > 2.5 * request(&Speed::default()),
            "{speed:?}"
        );
        assert_eq!(speed.max_running, Speed::default().max_running);
        assert!(close(learner.output_tokens().unwrap(), 100.0, 1e-9));
    }

    #[test]
    fn steady_load_keeps_the_priors_ratios_and_scales_to_what_it_saw() {
        let mut scrapes = Scrapes::new();
        run(&mut scrapes, a100(), 12, false);
        let speed = scrapes.learner.speed(Speed::default());
        let truth = a100();
        // The means are right: a prefill of 1,000 tokens, a step beside 8 sequences.
        let prefill =
            |s: &Speed| s.prefill_overhead_seconds + 1_000.0 * s.prefill_seconds_per_token;
        let step =
            |s: &Speed| s.decode_seconds_per_step + 8.0 * s.decode_seconds_per_step_per_sequence;
        assert!(close(prefill(&speed), prefill(&truth), 1e-6), "{speed:?}");
        assert!(close(step(&speed), step(&truth), 1e-6), "{speed:?}");
    }

    #[test]
    fn counters_that_move_at_different_moments_still_price_right() {
        // llm-d-inference-sim counts a prompt's tokens in one scrape and its prefill time in a
        // later one; an answer's tokens as they come and its decode time at its end.
        let truth = a100();
        let mut learner = Scrapes::new();
        let mut c = Raw::default();
        learner.observe(c);
        for _ in 0..10 {
            c.prompt_tokens += 10.0 * 1_000.0;
            c.generation_tokens += 10.0 * 50.0;
            c.running = 10.0;
            learner.observe(c);
            c.prefill_requests += 10.0;
            c.prefill_seconds +=
                10.0 * (truth.prefill_overhead_seconds + 1_000.0 * truth.prefill_seconds_per_token);
            c.generation_tokens += 10.0 * 50.0;
            c.decode_requests += 10.0;
            c.decode_seconds += 10.0
                * 99.0
                * (truth.decode_seconds_per_step
                    + 10.0 * truth.decode_seconds_per_step_per_sequence);
            learner.observe(c);
        }
        let speed = learner.learner.speed(Speed::default());
        let prefill =
            |s: &Speed| s.prefill_overhead_seconds + 1_000.0 * s.prefill_seconds_per_token;
        let step =
            |s: &Speed| s.decode_seconds_per_step + 10.0 * s.decode_seconds_per_step_per_sequence;
        // Within a tenth: what moved an interval earlier is forgotten once more (FORGET).
        assert!(close(prefill(&speed), prefill(&truth), 0.1), "{speed:?}");
        assert!(close(step(&speed), step(&truth), 0.1), "{speed:?}");
    }

    #[test]
    fn idle_scrapes_relax_what_was_learned_toward_the_prior() {
        // An RL driver's replicas sit idle between steps, scraped every second: a short pause
        // keeps most of what the last step showed; a replica given nothing for long (learned
        // slow, so starved) is priced at the prior again and tried.
        let mut scrapes = Scrapes::new();
        let last = run(&mut scrapes, a100(), 12, true);
        let learned = scrapes.learner.speed(Speed::default());
        let step = |s: &Speed| s.decode_seconds_per_step;
        scrapes.observe(last);
        let paused = scrapes.learner.speed(Speed::default());
        let prior = Speed::default();
        // One idle second: a quarter of the way (in log) still learned.
        assert!(step(&paused) > 0.9 * step(&learned).powf(0.25) * step(&prior).powf(0.75));
        for _ in 0..30 {
            scrapes.observe(last);
        }
        assert!(scrapes.learner.relaxed());
        let relaxed = scrapes.learner.speed(Speed::default());
        assert!(
            (step(&relaxed) / step(&prior) - 1.0).abs() < 0.01,
            "{relaxed:?}"
        );
        assert!(scrapes.learner.output_tokens().is_some());
    }

    #[test]
    fn a_restarted_engine_is_not_read_as_negative_work() {
        let mut scrapes = Scrapes::new();
        run(&mut scrapes, a100(), 12, true);
        let learned = scrapes.learner.speed(Speed::default());
        assert_eq!(scrapes.observe(Raw::default()), Verdict::Reset);
        // Nothing negative folded in: only a second's relaxation toward the prior.
        let step = |s: &Speed| s.decode_seconds_per_step;
        let relaxed = step(&learned).powf(0.25) * step(&Speed::default()).powf(0.75);
        let now = step(&scrapes.learner.speed(Speed::default()));
        assert!((now / relaxed - 1.0).abs() < 1e-6, "{now} vs {relaxed}");
    }

    /// A replica serving as the A100 does, honest for 12 scrapes, then `lie` makes the next
    /// scrape say something else, then it is honest again for `after` scrapes.
    fn lying(lie: impl Fn(&mut Counters), after: usize) -> (Vec<Verdict>, Speed) {
        let mut scrapes = Scrapes::new();
        let mut honest = run(&mut scrapes, a100(), 12, false);
        let mut verdicts = Vec::new();
        let mut lied = honest.counters();
        lie(&mut lied);
        scrapes.at += 1.0;
        verdicts.push(scrapes.learner.observe(lied, scrapes.at));
        for _ in 0..after {
            honest.prefill_requests += 10.0;
            honest.prefill_seconds += 10.0
                * (a100().prefill_overhead_seconds + 1_000.0 * a100().prefill_seconds_per_token);
            honest.prompt_tokens += 10.0 * 1_050.0;
            honest.cached_prompt_tokens += 10.0 * 50.0;
            honest.decode_requests += 10.0;
            honest.generation_tokens += 1_000.0;
            honest.decode_seconds += 10.0
                * 99.0
                * (a100().decode_seconds_per_step
                    + 8.0 * a100().decode_seconds_per_step_per_sequence);
            verdicts.push(scrapes.observe(honest));
        }
        (verdicts, scrapes.learner.speed(Speed::default()))
    }

    fn within_bounds(speed: &Speed) -> bool {
        let prior = Speed::default();
        let pairs = [
            (
                speed.prefill_seconds_per_token,
                prior.prefill_seconds_per_token,
            ),
            (
                speed.prefill_overhead_seconds,
                prior.prefill_overhead_seconds,
            ),
            (speed.decode_seconds_per_step, prior.decode_seconds_per_step),
            (
                speed.decode_seconds_per_step_per_sequence,
                prior.decode_seconds_per_step_per_sequence,
            ),
        ];
        pairs
            .iter()
            .all(|&(v, p)| v.is_finite() && v >= p / BOUND * 0.999 && v <= p * BOUND * 1.001)
    }

    #[test]
    fn a_lying_scrape_is_rejected_or_starts_a_baseline_and_never_makes_a_figure_wild() {
        let truth = {
            let mut scrapes = Scrapes::new();
            run(&mut scrapes, a100(), 12, false);
            scrapes.learner.speed(Speed::default())
        };
        let huge = |field: fn(&mut Counters) -> &mut Option<f64>| {
            move |c: &mut Counters| *field(c) = Some(1e308)
        };
        type Lie = Box<dyn Fn(&mut Counters)>;
        let cases: Vec<(&str, Lie)> = vec![
            (
                "a 1e308 prefill sum",
                Box::new(huge(|c| &mut c.prefill_seconds)),
            ),
            (
                "a 1e308 decode sum",
                Box::new(huge(|c| &mut c.decode_seconds)),
            ),
            ("a 1e308 running gauge", Box::new(huge(|c| &mut c.running))),
            (
                "a lifetime count at once",
                Box::new(|c: &mut Counters| c.decode_requests = c.decode_requests.map(|n| n + 1e9)),
            ),
            (
                "a sum gone missing",
                Box::new(|c: &mut Counters| c.prefill_seconds = None),
            ),
            (
                "a count of 0",
                Box::new(|c: &mut Counters| c.prefill_requests = Some(0.0)),
            ),
        ];
        for (what, lie) in cases {
            let (verdicts, speed) = lying(lie, 6);
            assert_ne!(verdicts[0], Verdict::Learned, "{what}: {verdicts:?}");
            assert!(within_bounds(&speed), "{what}: {speed:?}");
            // Honest again, it is priced as it is within a fifth.
            let step = |s: &Speed| {
                s.decode_seconds_per_step + 8.0 * s.decode_seconds_per_step_per_sequence
            };
            assert!(
                (step(&speed) / step(&truth) - 1.0).abs() < 0.2,
                "{what}: {speed:?} vs {truth:?}"
            );
        }
    }

    #[test]
    fn parsing_leaves_a_counter_unknown_when_it_is_absent_or_not_a_number() {
        let text = "vllm:request_prefill_time_seconds_sum 1e308\n\
                    vllm:request_prefill_time_seconds_sum{engine=\"1\"} 1e308\n\
                    vllm:prompt_tokens_total NaN\n\
                    vllm:generation_tokens_total 7\n";
        let c = parse_counters(text);
        assert_eq!(c.prefill_seconds, None, "overflowed to infinity");
        assert_eq!(c.prompt_tokens, None, "not a number");
        assert_eq!(c.decode_seconds, None, "absent");
        assert_eq!(c.generation_tokens, Some(7.0));
    }

    #[test]
    fn counters_are_summed_over_models_and_engines() {
        let text = "vllm:request_prefill_time_seconds_sum{engine=\"0\",model_name=\"m\"} 1.5\n\
                    vllm:request_prefill_time_seconds_sum{engine=\"1\",model_name=\"m\"} 0.5\n\
                    vllm:request_prefill_time_seconds_count{model_name=\"m\"} 4\n\
                    vllm:prompt_tokens_total{model_name=\"m\"} 4000\n\
                    vllm:prefix_cache_hits_total{model_name=\"m\"} 1000\n\
                    vllm:request_decode_time_seconds_sum{model_name=\"m\"} 2\n\
                    vllm:request_decode_time_seconds_count{model_name=\"m\"} 4\n\
                    vllm:generation_tokens_total{model_name=\"m\"} 404\n\
                    vllm:num_requests_running{model_name=\"m\"} 3\n\
                    vllm:request_prefill_time_seconds_bucket{le=\"0.1\",model_name=\"m\"} 2\n";
        assert_eq!(
            parse_counters(text),
            Counters {
                prefill_seconds: Some(2.0),
                prefill_requests: Some(4.0),
                prompt_tokens: Some(4000.0),
                cached_prompt_tokens: Some(1000.0),
                decode_seconds: Some(2.0),
                decode_requests: Some(4.0),
                generation_tokens: Some(404.0),
                running: Some(3.0),
            }
        );
    }
}
