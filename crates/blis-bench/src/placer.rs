//! The producer as a BLIS routing policy: a front-end of the core (like the proxy or the endpoint
//! picker) whose requests come from BLIS over two pipes ([`crate::protocol`]) and whose clock is
//! BLIS's simulated time. Each request goes through the core's stages as a client's would: its
//! body (the prompt's token ids and one `max_tokens` cap for every request, never its real
//! answer length) admitted, read, placed and routed; the route's handle is held until BLIS says
//! the answer ended, as the proxy holds it until the stream ends.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Instant;

use burst_prefix_api::{Endpoint, PlannerConfig, ProducerConfig};
use burst_prefix_core::{ClockHand, Handle, KeepBody, Limits, Producer};
use serde::Serialize;

use crate::protocol::{Answer, Ask, EventKind, Hello};

/// The model name in every body (one model per BLIS run).
const MODEL: &str = "blis";

/// A completion request as a client sends it: the prompt as token ids, one cap for all.
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    prompt: &'a [u32],
    max_tokens: u32,
}

/// The placer of one BLIS run.
pub struct Placer {
    planner: PlannerConfig,
    max_tokens: u32,
    /// Built at the first ask, which names the instances.
    producer: Option<(Producer, ClockHand)>,
    /// Routed requests whose answers have not ended, by BLIS's id.
    routed: HashMap<String, Handle>,
    /// Nanoseconds each placement took (admit to route).
    took_ns: Vec<u64>,
}

/// What the placer measured of itself, written when BLIS closes the pipe.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacerStats {
    pub placements: usize,
    pub instances: usize,
    /// Per placement, the core's stages from admitting the body to the route.
    pub mean_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Of it, the place stage alone (`burst_prefix_request_wait_seconds`).
    pub place_mean_us: f64,
}

impl Placer {
    /// A placer with the route's planner config, sending `max_tokens` as every request's cap.
    pub fn new(planner: PlannerConfig, max_tokens: u32) -> Self {
        Placer {
            planner,
            max_tokens,
            producer: None,
            routed: HashMap::new(),
            took_ns: Vec::new(),
        }
    }

    pub fn hello(&self) -> Hello {
        Hello {
            load_interval_us: self.planner.engines.load_interval_ms.max(0) as u64 * 1_000,
        }
    }

    /// The instance for `ask`'s request, after what it says happened since the last one.
    pub fn answer(&mut self, ask: Ask) -> Result<String, String> {
        if let Some(instances) = &ask.instances {
            self.producer = Some(self.start(instances)?);
        }
        let (producer, hand) = self
            .producer
            .as_ref()
            .ok_or("the first ask must name the instances")?;
        let mut events = ask.events;
        events.sort_by_key(|event| event.at);
        for event in events {
            hand.set_ms(event.at / 1_000);
            match event.kind {
                EventKind::First => {}
                // The answer ended: the handle finishes the request, as the proxy's does, with
                // the answer's length the stream showed.
                EventKind::Done => {
                    if let Some(mut handle) = self.routed.remove(&event.id) {
                        handle.answered(event.tokens);
                    }
                }
            }
        }
        for load in &ask.load {
            producer.engines().set_load(&load.id, Some(load.requests));
        }
        hand.set_ms(ask.clock / 1_000);
        // The client's body: writing it is the client's work, not the producer's.
        let body = serde_json::to_vec(&Body {
            model: MODEL,
            prompt: &ask.tokens,
            max_tokens: self.max_tokens,
        })
        .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let mut admission = producer.admit(|_| None).map_err(|r| r.to_string())?;
        admission.take(&body).map_err(|r| r.to_string())?;
        let placed = futures::executor::block_on(admission.place(None, KeepBody::Drop))
            .map_err(|r| r.to_string())?;
        let routed = placed.route(0).map_err(|r| r.to_string())?;
        let instance = routed.handle.route().first().id.clone();
        self.took_ns.push(started.elapsed().as_nanos() as u64);
        self.routed.insert(ask.id, routed.handle);
        Ok(instance)
    }

    /// A producer placing on `instances`, its clock at 0.
    fn start(&self, instances: &[String]) -> Result<(Producer, ClockHand), String> {
        let config = ProducerConfig {
            planner: self.planner.clone(),
            endpoints: instances
                .iter()
                .enumerate()
                .map(|(i, id)| Endpoint {
                    id: id.clone(),
                    // Never reached: BLIS serves the requests.
                    address: format!("10.{}.{}.{}:8000", i >> 16, (i >> 8) & 255, i & 255),
                    running_requests: None,
                })
                .collect(),
        };
        let yaml = serde_yaml::to_string(&config).map_err(|e| e.to_string())?;
        Producer::driven(&yaml, Limits::default())
    }

    pub fn stats(&self) -> PlacerStats {
        let mut took = self.took_ns.clone();
        took.sort_unstable();
        let us = |ns: u64| ns as f64 / 1e3;
        let n = took.len();
        PlacerStats {
            placements: n,
            instances: self
                .producer
                .as_ref()
                .and_then(|(p, _)| p.config())
                .map_or(0, |s| s.config.endpoints.len()),
            mean_us: if n == 0 {
                0.0
            } else {
                us(took.iter().sum::<u64>()) / n as f64
            },
            p99_us: took
                .get((n * 99).div_ceil(100).saturating_sub(1))
                .map_or(0.0, |&ns| us(ns)),
            max_us: took.last().map_or(0.0, |&ns| us(ns)),
            place_mean_us: self.producer.as_ref().map_or(0.0, |(producer, _)| {
                let waited = &producer.metrics().request_wait_seconds;
                waited.get_sample_sum() * 1e6 / waited.get_sample_count().max(1) as f64
            }),
        }
    }
}

/// Serves BLIS: the hello, then one answer per ask until BLIS closes its end; with `decisions`,
/// one line per placement there (`clock_us request instance`).
pub fn serve(
    placer: &mut Placer,
    asks: impl BufRead,
    mut answers: impl Write,
    mut decisions: Option<&mut dyn Write>,
) -> std::io::Result<()> {
    writeln!(answers, "{}", serde_json::to_string(&placer.hello())?)?;
    answers.flush()?;
    for line in asks.lines() {
        let line = line?;
        let answer = match serde_json::from_str::<Ask>(&line) {
            Ok(ask) => match (ask.clock, ask.id.clone(), placer.answer(ask)) {
                (clock, id, Ok(instance)) => {
                    if let Some(out) = decisions.as_deref_mut() {
                        writeln!(out, "{clock} {id} {instance}")?;
                    }
                    Answer {
                        instance: Some(instance),
                        error: None,
                    }
                }
                (_, _, Err(error)) => Answer {
                    instance: None,
                    error: Some(error),
                },
            },
            Err(error) => Answer {
                instance: None,
                error: Some(format!("unreadable ask: {error}")),
            },
        };
        writeln!(answers, "{}", serde_json::to_string(&answer)?)?;
        answers.flush()?;
    }
    Ok(())
}
