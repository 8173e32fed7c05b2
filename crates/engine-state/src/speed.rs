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
//! recent intervals and forgetting older ones ([`FORGET`] per interval that saw some work; an
//! idle interval forgets nothing). The counters move at different moments (a prompt's tokens
//! count when it arrives, its prefill time when its first token is out), so one interval's
//! ratios are noise while sums over many are not.

use burst_prefix_planner::Speed;

use crate::exposition::parse_sample;

/// What one scrape's counters say, summed over the replica's models and engines.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counters {
    /// `vllm:request_prefill_time_seconds_sum`.
    pub prefill_seconds: f64,
    /// `vllm:request_prefill_time_seconds_count`.
    pub prefill_requests: f64,
    /// `vllm:prompt_tokens_total`.
    pub prompt_tokens: f64,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub cached_prompt_tokens: f64,
    /// `vllm:request_decode_time_seconds_sum`.
    pub decode_seconds: f64,
    /// `vllm:request_decode_time_seconds_count`.
    pub decode_requests: f64,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens: f64,
    /// `vllm:num_requests_running` (a gauge).
    pub running: f64,
}

/// The counters of a `/metrics` text (0 where a metric is absent).
pub fn parse_counters(text: &str) -> Counters {
    let mut counters = Counters::default();
    for (name, _, value) in text.lines().filter_map(parse_sample) {
        if !value.is_finite() {
            continue;
        }
        let field = match name {
            "vllm:request_prefill_time_seconds_sum" => &mut counters.prefill_seconds,
            "vllm:request_prefill_time_seconds_count" => &mut counters.prefill_requests,
            "vllm:prompt_tokens_total" => &mut counters.prompt_tokens,
            "vllm:prefix_cache_hits_total" => &mut counters.cached_prompt_tokens,
            "vllm:request_decode_time_seconds_sum" => &mut counters.decode_seconds,
            "vllm:request_decode_time_seconds_count" => &mut counters.decode_requests,
            "vllm:generation_tokens_total" => &mut counters.generation_tokens,
            "vllm:num_requests_running" => &mut counters.running,
            _ => continue,
        };
        *field += value;
    }
    counters
}

/// How much an interval's evidence counts once the next interval with evidence came.
pub const FORGET: f64 = 0.9;

/// Requests a fit needs to have seen (after forgetting) before it replaces the prior.
const ENOUGH_REQUESTS: f64 = 8.0;

/// One replica's learned speed.
#[derive(Clone, Debug, Default)]
pub struct SpeedLearner {
    last: Option<Counters>,
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
            prefill: Line::default(),
            decode: Line::default(),
            answers: (0.0, 0.0),
        }
    }

    /// One scrape's counters. A counter that went back (the engine restarted) starts afresh
    /// from it.
    pub fn observe(&mut self, now: Counters) {
        let Some(last) = self.last.replace(now) else {
            return;
        };
        let d = |f: fn(&Counters) -> f64| f(&now) - f(&last);
        let deltas = [
            d(|c| c.prefill_seconds),
            d(|c| c.prefill_requests),
            d(|c| c.prompt_tokens),
            d(|c| c.cached_prompt_tokens),
            d(|c| c.decode_seconds),
            d(|c| c.decode_requests),
            d(|c| c.generation_tokens),
        ];
        if deltas.iter().any(|&delta| delta < 0.0) {
            return;
        }
        let [prefill_seconds, prefills, prompt, cached, decode_seconds, decodes, generated] =
            deltas;
        // Older evidence is forgotten only as new evidence comes: an idle replica keeps what it
        // showed, however many scrapes pass. A prompt's tokens and its prefill time, an
        // answer's tokens and its decode time, are counted at different moments: each is added
        // in the interval it moved in, and only the sums are compared.
        let computed = (prompt - cached).max(0.0);
        if prefills > 0.0 || computed > 0.0 {
            self.prefill.forget();
            self.prefill
                .add(prefills, prefills, computed, prefill_seconds);
        }
        if decodes > 0.0 || generated > 0.0 {
            let steps = generated - decodes;
            let running = ((last.running + now.running) / 2.0).max(1.0);
            self.decode.forget();
            self.decode
                .add(decodes, steps, steps * running, decode_seconds);
            self.answers.0 = self.answers.0 * FORGET + decodes;
            self.answers.1 = self.answers.1 * FORGET + generated;
        }
    }

    /// The speed as learned so far, `prior`'s where too little was seen.
    pub fn speed(&self, prior: Speed) -> Speed {
        let mut speed = prior;
        if let Some((overhead, per_token)) = self.prefill.fit(
            prior.prefill_overhead_seconds,
            prior.prefill_seconds_per_token,
        ) {
            speed.prefill_overhead_seconds = overhead;
            speed.prefill_seconds_per_token = per_token;
        }
        if let Some((step, per_sequence)) = self.decode.fit(
            prior.decode_seconds_per_step,
            prior.decode_seconds_per_step_per_sequence,
        ) {
            speed.decode_seconds_per_step = step;
            speed.decode_seconds_per_step_per_sequence = per_sequence;
        }
        speed
    }

    /// The mean answer length, in tokens, once enough answers were seen.
    pub fn output_tokens(&self) -> Option<f64> {
        let (requests, tokens) = self.answers;
        (requests >= ENOUGH_REQUESTS).then(|| tokens / requests)
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
        for sum in [&mut self.weight, &mut self.u, &mut self.v, &mut self.y] {
            *sum *= FORGET;
        }
    }

    fn add(&mut self, weight: f64, u: f64, v: f64, y: f64) {
        self.weight += weight;
        self.u += u;
        self.v += v;
        self.y += y;
    }

    /// `(a, b)` with the prior's `b / a`, once enough was seen.
    fn fit(&self, prior_a: f64, prior_b: f64) -> Option<(f64, f64)> {
        if self.weight < ENOUGH_REQUESTS {
            return None;
        }
        let ratio = if prior_a > 0.0 {
            prior_b / prior_a
        } else {
            0.0
        };
        let basis = self.u + ratio * self.v;
        if basis <= 0.0 {
            return None;
        }
        let a = self.y / basis;
        Some((a, a * ratio))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_planner::testing::a100;

    /// Counters of a replica whose prefill takes `overhead + p x tokens` and decode step
    /// `d + g x running`, after `intervals` intervals of varied load.
    fn run(learner: &mut SpeedLearner, truth: Speed, intervals: usize, vary: bool) {
        let mut c = Counters {
            running: if vary { 4.0 } else { 8.0 },
            ..Counters::default()
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
        let mut learner = SpeedLearner::new();
        run(&mut learner, a100(), 12, true);
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
        let mut learner = SpeedLearner::new();
        run(&mut learner, a100(), 12, false);
        let speed = learner.speed(Speed::default());
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
        let mut learner = SpeedLearner::new();
        let mut c = Counters::default();
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
        let speed = learner.speed(Speed::default());
        let prefill =
            |s: &Speed| s.prefill_overhead_seconds + 1_000.0 * s.prefill_seconds_per_token;
        let step =
            |s: &Speed| s.decode_seconds_per_step + 10.0 * s.decode_seconds_per_step_per_sequence;
        // Within a tenth: what moved an interval earlier is forgotten once more (FORGET).
        assert!(close(prefill(&speed), prefill(&truth), 0.1), "{speed:?}");
        assert!(close(step(&speed), step(&truth), 0.1), "{speed:?}");
    }

    #[test]
    fn idle_scrapes_forget_nothing() {
        // An RL driver's replicas sit idle between steps, scraped every 250 ms: what the last
        // step showed must still stand when the next one is placed.
        let mut learner = SpeedLearner::new();
        run(&mut learner, a100(), 12, true);
        let learned = learner.speed(Speed::default());
        let last = learner.last.unwrap();
        for _ in 0..1_000 {
            learner.observe(last);
        }
        assert_eq!(learner.speed(Speed::default()), learned);
        assert!(learner.output_tokens().is_some());
    }

    #[test]
    fn a_restarted_engine_is_not_read_as_negative_work() {
        let mut learner = SpeedLearner::new();
        run(&mut learner, a100(), 12, true);
        let learned = learner.speed(Speed::default());
        learner.observe(Counters::default());
        assert_eq!(learner.speed(Speed::default()), learned);
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
                prefill_seconds: 2.0,
                prefill_requests: 4.0,
                prompt_tokens: 4000.0,
                cached_prompt_tokens: 1000.0,
                decode_seconds: 2.0,
                decode_requests: 4.0,
                generation_tokens: 404.0,
                running: 3.0,
            }
        );
    }
}
