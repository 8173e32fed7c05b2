//! What the producer learns from the engines cannot be poisoned (docs/behaviour.md §7, "What the
//! engines say"): four replicas of one speed, one of whose `/metrics` lies for a while and then
//! tells the truth again, and one really slower that recovers. A simulated fleet on the
//! producer's driven clock: requests every 10 ms, each answered in the time its replica's real
//! speed and load take; every 100 ms each replica's counters (what it really did, or the lie) are
//! scraped into the producer, which places with what it learned.

use std::collections::VecDeque;

use burst_prefix_core::{ClockHand, Handle, KeepBody, Limits, Producer};
use burst_prefix_engine_state::speed::Counters;
use burst_prefix_planner::Speed;

const REPLICAS: usize = 4;
const PROMPT_TOKENS: f64 = 1_000.0;
const ANSWER_TOKENS: f64 = 100.0;

/// One simulated engine: what it has done, and what is in flight on it.
#[derive(Default)]
struct Engine {
    /// Seconds its work takes, times the prior's (1: as fast as the config says).
    slowness: f64,
    done: Counters,
    /// (ends at ms, prefill seconds, decode seconds, the handle).
    running: Vec<(u64, f64, f64, Handle)>,
}

struct Fleet {
    producer: Producer,
    hand: ClockHand,
    engines: Vec<Engine>,
    now_ms: u64,
    next_prompt: u64,
    /// Requests placed on each replica, in order (the last ones tell its recent share).
    placed: VecDeque<usize>,
}

fn add(field: &mut Option<f64>, value: f64) {
    *field = Some(field.unwrap_or(0.0) + value);
}

impl Fleet {
    fn new() -> Self {
        let mut yaml = String::from("engines: {loadIntervalMs: 100}\nendpoints:\n");
        for i in 0..REPLICAS {
            yaml.push_str(&format!(
                "  - {{id: r{i}, address: '10.0.0.{}:8000'}}\n",
                i + 1
            ));
        }
        let (producer, hand) = Producer::driven(&yaml, Limits::default()).unwrap();
        Fleet {
            producer,
            hand,
            engines: (0..REPLICAS)
                .map(|_| Engine {
                    slowness: 1.0,
                    ..Engine::default()
                })
                .collect(),
            now_ms: 0,
            next_prompt: 0,
            placed: VecDeque::new(),
        }
    }

    /// Runs `ms` of the fleet: a request every 10 ms, a scrape every 100 ms, `lie` applied to
    /// replica 3's scrapes.
    fn run(&mut self, ms: u64, lie: &dyn Fn(&mut Counters)) {
        let end = self.now_ms + ms;
        while self.now_ms < end {
            self.now_ms += 10;
            self.hand.set_ms(self.now_ms);
            self.finish_due();
            if self.now_ms.is_multiple_of(100) {
                self.scrape(lie);
            }
            self.place();
        }
    }

    fn finish_due(&mut self) {
        let now = self.now_ms;
        for engine in &mut self.engines {
            let (due, left): (Vec<_>, Vec<_>) = engine.running.drain(..).partition(|r| r.0 <= now);
            engine.running = left;
            for (_, prefill, decode, mut handle) in due {
                add(&mut engine.done.prefill_seconds, prefill);
                add(&mut engine.done.prefill_requests, 1.0);
                add(&mut engine.done.prompt_tokens, PROMPT_TOKENS);
                add(&mut engine.done.cached_prompt_tokens, 0.0);
                add(&mut engine.done.decode_seconds, decode);
                add(&mut engine.done.decode_requests, 1.0);
                add(&mut engine.done.generation_tokens, ANSWER_TOKENS);
                handle.answered(ANSWER_TOKENS as u32);
            }
        }
    }

    fn scrape(&mut self, lie: &dyn Fn(&mut Counters)) {
        let at = self.now_ms as f64 / 1e3;
        for (i, engine) in self.engines.iter().enumerate() {
            let mut counters = engine.done;
            counters.running = Some(engine.running.len() as f64);
            if i == 3 {
                lie(&mut counters);
            }
            let engines = self.producer.engines();
            engines.observe_speed(&format!("r{i}"), counters, at);
            engines.set_load(&format!("r{i}"), Some(engine.running.len() as u64));
        }
    }

    fn place(&mut self) {
        self.next_prompt += 1;
        let body = serde_json::json!({
            "model": "m",
            "prompt": format!("request {} {}", self.next_prompt, "x ".repeat(2_000)),
            "max_tokens": ANSWER_TOKENS,
        });
        let mut admission = self.producer.admit(|_| None).unwrap();
        admission.take(body.to_string().as_bytes()).unwrap();
        let placed = futures::executor::block_on(admission.place(None, KeepBody::Drop))
            .expect("no request fails");
        let routed = placed.route(0).expect("no request fails");
        let replica: usize = routed.handle.route().first().id[1..].parse().unwrap();
        let engine = &mut self.engines[replica];
        let speed = Speed::default();
        let running = engine.running.len() as f64 + 1.0;
        let prefill = engine.slowness
            * (speed.prefill_overhead_seconds + PROMPT_TOKENS * speed.prefill_seconds_per_token);
        let step = engine.slowness
            * (speed.decode_seconds_per_step
                + running * speed.decode_seconds_per_step_per_sequence);
        let decode = (ANSWER_TOKENS - 1.0) * step;
        let ends = self.now_ms + ((prefill + decode) * 1e3).ceil() as u64;
        engine.running.push((ends, prefill, decode, routed.handle));
        self.placed.push_back(replica);
    }

    /// Replica `replica`'s share of the last `n` placements.
    fn share(&self, replica: usize, n: usize) -> f64 {
        let last = self.placed.iter().rev().take(n);
        last.filter(|&&r| r == replica).count() as f64 / n as f64
    }
}

fn honest(_: &mut Counters) {}

/// A way a scrape lies.
type Lie = Box<dyn Fn(&mut Counters)>;

#[test]
fn a_replica_whose_metrics_lie_keeps_a_share_of_the_traffic_and_gets_its_share_back() {
    let lies: Vec<(&str, Lie)> = vec![
        (
            "two 1e308 samples of a prefill sum",
            Box::new(|c: &mut Counters| c.prefill_seconds = Some(f64::MAX * 2.0)),
        ),
        (
            "1e308 in a decode sum",
            Box::new(|c: &mut Counters| c.decode_seconds = Some(1e308)),
        ),
        (
            "1e308 requests running",
            Box::new(|c: &mut Counters| c.running = Some(1e308)),
        ),
        (
            "a prefill sum missing",
            Box::new(|c: &mut Counters| c.prefill_seconds = None),
        ),
        (
            "a count of 0 beside its sum",
            Box::new(|c: &mut Counters| c.prefill_requests = Some(0.0)),
        ),
        (
            "a lifetime of decode time at once",
            Box::new(|c: &mut Counters| c.decode_seconds = c.decode_seconds.map(|s| s * 1e4)),
        ),
    ];
    for (what, lie) in lies {
        let mut fleet = Fleet::new();
        fleet.run(3_000, &honest);
        // 200 requests while it lies.
        fleet.run(2_000, lie.as_ref());
        let lying = fleet.share(3, 200);
        // Then honest again: within 5 s it has its share back.
        fleet.run(3_000, &honest);
        let after = fleet.share(3, 200);
        eprintln!("{what}: {lying:.2} of the requests while it lies, {after:.2} after");
        assert!(
            (0.05..=0.50).contains(&lying),
            "{what}: {lying} while lying"
        );
        assert!((0.12..=0.40).contains(&after), "{what}: {after} after");
    }
}

#[test]
fn a_replica_learned_slow_is_tried_again_and_seen_to_recover() {
    let mut fleet = Fleet::new();
    fleet.engines[3].slowness = 10.0;
    fleet.run(4_000, &honest);
    let slow = fleet.share(3, 100);
    // It recovers (the requests it runs finish at the old speed): within 10 s it gets its
    // share of the traffic again.
    fleet.engines[3].slowness = 1.0;
    let mut regained = None;
    for second in 1..=10 {
        fleet.run(1_000, &honest);
        if fleet.share(3, 100) >= 0.12 {
            regained = Some(second);
            break;
        }
    }
    eprintln!("10x slower: {slow:.2} of the requests; its share back after {regained:?} s");
    assert!(slow < 0.15, "{slow}");
    assert!(regained.is_some(), "never regained its share");
}
