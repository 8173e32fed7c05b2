//! The BLIS adapter is the producer: the same arrivals and completions, fed to the adapter as
//! BLIS's policy sends them (JSON lines) and to the producer's core as its proxy would (a body,
//! the stages in order, the route's handle held until the answer ends, the answer's length told
//! to it), give the same placements.

use std::collections::HashMap;

use burst_prefix_api::{PlannerConfig, ProducerConfig};
use burst_prefix_blis_bench::placer::{serve, Placer};
use burst_prefix_blis_bench::protocol::{Answer, Ask, Event, EventKind};
use burst_prefix_core::{Handle, KeepBody, Limits, Producer};

const INSTANCES: usize = 8;

/// A burst of 6 prompts x 8 samples at 0 ms, answers ending over the next seconds, then the same
/// prompts again (a second epoch) and some lone requests: (ms, request, prompt tokens, answer).
fn arrivals() -> Vec<(u64, String, Vec<u32>, u32)> {
    let prompt = |p: u32, len: u32| (0..len).map(|t| p * 100_000 + t).collect::<Vec<u32>>();
    let mut out = Vec::new();
    for epoch in 0..2u64 {
        for p in 0..6u32 {
            for s in 0..8u32 {
                let answer = if p % 2 == 0 { 1_500 + 10 * s } else { 40 + s };
                out.push((
                    epoch * 60_000 + u64::from(s),
                    format!("e{epoch}p{p}s{s}"),
                    prompt(p, 1_000 + 300 * p),
                    answer,
                ));
            }
        }
        for lone in 0..4u32 {
            out.push((
                epoch * 60_000 + 500 + u64::from(lone),
                format!("e{epoch}l{lone}"),
                prompt(50 + lone, 700),
                100,
            ));
        }
    }
    out.sort_by_key(|a| a.0);
    out
}

/// When each request's answer ends (ms), a decode of 10 ms a token after 50 ms.
fn ends(arrivals: &[(u64, String, Vec<u32>, u32)]) -> HashMap<String, (u64, u32)> {
    arrivals
        .iter()
        .map(|(at, id, _, answer)| (id.clone(), (at + 50 + 10 * u64::from(*answer), *answer)))
        .collect()
}

fn instances() -> Vec<String> {
    (0..INSTANCES).map(|i| format!("instance_{i}")).collect()
}

/// Through the adapter, as BLIS's policy sends them: each ask carries the answers that ended
/// since the last one.
fn through_the_adapter(planner: &PlannerConfig) -> Vec<String> {
    let arrivals = arrivals();
    let ends = ends(&arrivals);
    let mut reported: Vec<String> = Vec::new();
    let mut lines = String::new();
    for (n, (at, id, tokens, _)) in arrivals.iter().enumerate() {
        let events: Vec<Event> = arrivals[..n]
            .iter()
            .filter(|(_, earlier, _, _)| !reported.contains(earlier))
            .filter(|(_, earlier, _, _)| ends[earlier].0 <= *at)
            .map(|(_, earlier, _, _)| Event {
                id: earlier.clone(),
                at: ends[earlier].0 * 1_000,
                kind: EventKind::Done,
                tokens: ends[earlier].1,
            })
            .collect();
        reported.extend(events.iter().map(|e| e.id.clone()));
        let ask = Ask {
            clock: at * 1_000,
            instances: (n == 0).then(instances),
            events,
            load: Vec::new(),
            id: id.clone(),
            tokens: tokens.clone(),
        };
        lines.push_str(&serde_json::to_string(&ask).unwrap());
        lines.push('\n');
    }
    let mut placer = Placer::new(planner.clone(), 4_096);
    let mut out = Vec::new();
    serve(&mut placer, lines.as_bytes(), &mut out, None).unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .skip(1)
        .map(|line| {
            let answer: Answer = serde_json::from_str(line).unwrap();
            answer
                .instance
                .unwrap_or_else(|| panic!("{:?}", answer.error))
        })
        .collect()
}

/// Through the core, as the proxy drives it: the body a client sends, the stages, the handle
/// held until the answer ends and told its length.
fn through_the_core(planner: &PlannerConfig) -> Vec<String> {
    let arrivals = arrivals();
    let ends = ends(&arrivals);
    let config = ProducerConfig {
        planner: planner.clone(),
        endpoints: instances()
            .into_iter()
            .enumerate()
            .map(|(i, id)| burst_prefix_api::Endpoint {
                id,
                address: format!("10.0.0.{}:8000", i + 1),
                running_requests: None,
            })
            .collect(),
    };
    let (producer, hand) =
        Producer::driven(&serde_yaml::to_string(&config).unwrap(), Limits::default()).unwrap();
    let mut held: Vec<(u64, u32, Handle)> = Vec::new();
    let mut out = Vec::new();
    for (at, id, tokens, _) in &arrivals {
        held.sort_by_key(|h| h.0);
        while held.first().is_some_and(|h| h.0 <= *at) {
            let (end, answer, mut handle) = held.remove(0);
            hand.set_ms(end);
            handle.answered(answer);
        }
        hand.set_ms(*at);
        let body = serde_json::json!({"model": "blis", "prompt": tokens, "max_tokens": 4_096});
        let mut admission = producer.admit(|_| None).unwrap();
        admission.take(body.to_string().as_bytes()).unwrap();
        let placed = futures::executor::block_on(admission.place(None, KeepBody::Drop)).unwrap();
        let routed = placed.route(0).unwrap();
        out.push(routed.handle.route().first().id.clone());
        let (end, answer) = ends[id];
        held.push((end, answer, routed.handle));
    }
    out
}

#[test]
fn the_adapter_places_as_the_producer_does_with_the_defaults_and_with_a_variant() {
    let defaults = PlannerConfig::default();
    let adapter = through_the_adapter(&defaults);
    let core = through_the_core(&defaults);
    assert_eq!(adapter, core);
    // The second epoch priced its answers by what the first's took: the prompts that answered
    // long spread their samples over more instances, those that answered short did not.
    let ids: Vec<String> = arrivals().into_iter().map(|a| a.1).collect();
    let spread = |epoch: u32, prompt: u32| {
        let mut on: Vec<&String> = ids
            .iter()
            .zip(&adapter)
            .filter(|(id, _)| id.starts_with(&format!("e{epoch}p{prompt}s")))
            .map(|(_, instance)| instance)
            .collect();
        on.sort();
        on.dedup();
        on.len()
    };
    let long = |epoch| (0..6).step_by(2).map(|p| spread(epoch, p)).sum::<usize>();
    let short = |epoch| (1..6).step_by(2).map(|p| spread(epoch, p)).sum::<usize>();
    eprintln!(
        "long prompts' spread {} -> {}, short {} -> {}",
        long(0),
        long(1),
        short(0),
        short(1)
    );
    assert!(long(1) > long(0), "{adapter:?}");
    assert!(short(1) < long(1), "{adapter:?}");
    let variant: PlannerConfig =
        serde_yaml::from_str("{maxPerReplica: 4, time: {prefillNanosPerToken: 2500}}").unwrap();
    assert_eq!(through_the_adapter(&variant), through_the_core(&variant));
}
