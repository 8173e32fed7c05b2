//! The routes a workload is sent through, as data (bench/engine/routes.yaml): a list of named
//! routes, each straight to the replicas, through burst-prefix's proxy with a planner config,
//! placed by the producer's `/v1/produce` and sent straight (a proxy route's baseline), or
//! through a peer router with its arguments. A new proxy setting is one entry.

use anyhow::{anyhow, bail, Context};
use burst_prefix_api::{PlannerConfig, ProducerConfig};
use serde::{Deserialize, Serialize};

use crate::peers::Peer;

/// Straight to the replicas, chosen by the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direct {
    /// Cycling through them (carried on across steps).
    RoundRobin,
    /// The fewest prompt tokens in flight (ties to fewer requests, then the lower index), as a
    /// KV-utilization scorer sees it; verl's rollout balancer is least-in-flight, the same when a
    /// step's requests are sent at once.
    LeastLoaded,
}

/// How a route reaches the replicas.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RouteKind {
    Direct(Direct),
    /// burst-prefix's proxy with this planner config (docs/behaviour.md §2; the bench adds the
    /// endpoints).
    Proxy {
        planner_yaml: String,
    },
    /// Placed by the producer with the planner config of the proxy route `of` (each request asks
    /// `POST /v1/produce`), then sent by the bench straight to its replica: the proxy's
    /// placements without the proxy in the path, the baseline of that route's wall time.
    ProduceThenDirect {
        of: String,
        planner_yaml: String,
    },
    /// A peer router with these arguments (the bench adds host, ports and workers).
    Peer {
        peer: Peer,
        args: Vec<String>,
    },
}

/// One named route.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    pub name: String,
    pub kind: RouteKind,
    /// Sent with a conversation's turns, its id as the value; such a route runs only on
    /// workloads with conversations.
    pub session_header: Option<String>,
    /// Listed but not run yet, and why (the report says so).
    pub pending: Option<String>,
    /// Producers side by side (a proxy route; the fleet bench only): each request goes to the
    /// next one in turn through a round-robin front, and each knows only its own placements
    /// and what the engines report (active-active, docs/behaviour.md §10). 1 for every other
    /// route.
    pub producers: usize,
}

/// An entry of routes.yaml: a name and exactly one of the ways.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    name: String,
    direct: Option<Direct>,
    proxy: Option<String>,
    produce_then_direct: Option<String>,
    sglang_router: Option<Vec<String>>,
    vllm_router: Option<Vec<String>>,
    session_header: Option<String>,
    pending: Option<String>,
    producers: Option<usize>,
}

/// Placeholders of a proxy's planner YAML, filled in by the bench from the engine.
pub struct Placeholders {
    /// `${cacheTokensPerReplica}`: the prompt tokens one replica's cache holds.
    pub cache_tokens_per_replica: u64,
    /// `${kvEventsBind}`: the ZMQ endpoint the proxy binds for the engines' KV events
    /// (`engines.kvEvents.bind`), which every replica connects its publisher to.
    pub kv_events_bind: String,
    /// `${tokenizerPath}`: the engine's model directory (`engines.tokenizer.path`).
    pub tokenizer_path: String,
}

impl Placeholders {
    /// `yaml` with every placeholder filled in; an unknown one is an error.
    fn fill(&self, yaml: &str) -> anyhow::Result<String> {
        let filled = yaml
            .replace(
                "${cacheTokensPerReplica}",
                &self.cache_tokens_per_replica.to_string(),
            )
            .replace("${kvEventsBind}", &self.kv_events_bind)
            .replace("${tokenizerPath}", &self.tokenizer_path);
        if let Some(at) = filled.find("${") {
            let rest = &filled[at..];
            let name = &rest[..rest.find('}').map_or(rest.len(), |end| end + 1)];
            bail!(
                "unknown placeholder {name} (known: ${{cacheTokensPerReplica}}, \
                 ${{kvEventsBind}}, ${{tokenizerPath}})"
            );
        }
        Ok(filled)
    }
}

impl Route {
    /// A short name for file names.
    pub fn slug(&self) -> String {
        let slug: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        slug.split('-')
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("-")
    }

    /// The producer's planner config, for a proxy or produce-then-direct route.
    pub fn planner(&self) -> Option<PlannerConfig> {
        let (RouteKind::Proxy { planner_yaml } | RouteKind::ProduceThenDirect { planner_yaml, .. }) =
            &self.kind
        else {
            return None;
        };
        let yaml = format!("{}\nendpoints: []\n", planner_yaml.trim_end());
        Some(
            ProducerConfig::from_yaml(&yaml)
                .expect("checked when parsed")
                .planner,
        )
    }

    /// Whether the route is a proxy that listens to the engines' KV events
    /// (`engines.kvEvents`, docs/behaviour.md §7): only vLLM publishes them.
    pub fn hears_kv_events(&self) -> bool {
        self.planner()
            .is_some_and(|p| p.engines.kv_events.is_some())
    }
}

/// The routes named in `names` (all when it is empty), in the file's order; a name that is no
/// route of `file` is refused (the `--only-routes` of the benches).
pub fn only(
    routes: Vec<Route>,
    names: &[String],
    file: &std::path::Path,
) -> anyhow::Result<Vec<Route>> {
    if let Some(unknown) = names
        .iter()
        .find(|name| !routes.iter().any(|r| &&r.name == name))
    {
        bail!("--only-routes: no route {unknown:?} in {}", file.display());
    }
    Ok(routes
        .into_iter()
        .filter(|r| names.is_empty() || names.contains(&r.name))
        .collect())
}

/// Parses routes.yaml, fills in the placeholders, and checks every proxy config.
pub fn parse(text: &str, placeholders: &Placeholders) -> anyhow::Result<Vec<Route>> {
    let entries: Vec<Entry> = serde_yaml::from_str(text).context("routes")?;
    let mut routes: Vec<Route> = Vec::with_capacity(entries.len());
    for entry in entries {
        let name = entry.name;
        let mut kinds = Vec::new();
        if let Some(direct) = entry.direct {
            kinds.push(RouteKind::Direct(direct));
        }
        if let Some(yaml) = entry.proxy {
            let planner_yaml = placeholders
                .fill(&yaml)
                .with_context(|| format!("route {name:?}"))?;
            ProducerConfig::from_yaml(&format!("{}\nendpoints: []\n", planner_yaml.trim_end()))
                .map_err(|e| anyhow!("route {name:?}: the proxy's config is refused: {e}"))?;
            kinds.push(RouteKind::Proxy { planner_yaml });
        }
        if let Some(of) = entry.produce_then_direct {
            let planner_yaml = match routes.iter().find(|r| r.name == of).map(|r| &r.kind) {
                Some(RouteKind::Proxy { planner_yaml }) => planner_yaml.clone(),
                _ => bail!(
                    "route {name:?}: produceThenDirect names {of:?}, not a proxy route above it"
                ),
            };
            kinds.push(RouteKind::ProduceThenDirect { of, planner_yaml });
        }
        if let Some(args) = entry.sglang_router {
            kinds.push(RouteKind::Peer {
                peer: Peer::SglangRouter,
                args,
            });
        }
        if let Some(args) = entry.vllm_router {
            kinds.push(RouteKind::Peer {
                peer: Peer::VllmRouter,
                args,
            });
        }
        let kind = match <[RouteKind; 1]>::try_from(kinds) {
            Ok([kind]) => kind,
            Err(kinds) => bail!(
                "route {name:?}: needs exactly one of direct, proxy, produceThenDirect, \
                 sglangRouter, vllmRouter ({} given)",
                kinds.len()
            ),
        };
        let producers = match (entry.producers, &kind) {
            (None, _) => 1,
            (Some(0), _) => bail!("route {name:?}: producers must be at least 1"),
            (Some(n), RouteKind::Proxy { .. }) => n,
            (Some(_), _) => bail!("route {name:?}: producers is for a proxy route"),
        };
        let route = Route {
            name,
            kind,
            session_header: entry.session_header,
            pending: entry.pending,
            producers,
        };
        if routes
            .iter()
            .any(|r| r.name == route.name || r.slug() == route.slug())
        {
            bail!("route {:?}: a second route of that name", route.name);
        }
        routes.push(route);
    }
    if !routes
        .iter()
        .any(|r| r.kind == RouteKind::Direct(Direct::RoundRobin))
    {
        bail!("routes: every figure is a ratio to round-robin's, and no route is round-robin");
    }
    Ok(routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placeholders() -> Placeholders {
        Placeholders {
            cache_tokens_per_replica: 6_400,
            kv_events_bind: "tcp://127.0.0.1:5557".into(),
            tokenizer_path: "/models/tiny".into(),
        }
    }

    #[test]
    fn the_shipped_routes_parse() {
        let text = include_str!("../../../bench/engine/routes.yaml");
        let routes = parse(text, &placeholders()).unwrap();
        assert!(routes.len() >= 4);
        let memory_on = routes
            .iter()
            .filter_map(Route::planner)
            .find_map(|p| p.memory_settings())
            .expect("a proxy route with memory");
        assert_eq!(memory_on.capacity_blocks.get() as u64 * 64, 6_400);
        // The windowed routes run with the product's default: no load carried across windows.
        let windowed_memory = routes
            .iter()
            .filter_map(Route::planner)
            .filter(|p| p.placement() == burst_prefix_api::Placement::Window)
            .filter_map(|p| p.memory_settings());
        assert!(windowed_memory.clone().count() >= 3);
        for memory in windowed_memory {
            assert_eq!(memory.load_half_life_ms, 0);
        }
        let events = routes
            .iter()
            .find(|r| r.name == "proxy with events")
            .expect("the route with KV events");
        assert!(events.hears_kv_events());
        let engines = events.planner().unwrap().engines;
        let kv_events = engines.kv_events.unwrap();
        assert_eq!(kv_events.bind.as_deref(), Some("tcp://127.0.0.1:5557"));
        assert_eq!(engines.tokenizer.unwrap().path, "/models/tiny");
        let zero_wait = routes
            .iter()
            .find(|r| r.name == "proxy, zero-wait")
            .and_then(Route::planner)
            .expect("the zero-wait route");
        assert_eq!(zero_wait.window_duration_ms, Some(0));
        assert!(!routes[0].hears_kv_events());
        // The proxy's main route has its placements sent straight as a baseline.
        let baseline = routes
            .iter()
            .find(|r| r.name == "produce + direct, memory on")
            .expect("the baseline of proxy, memory on");
        let RouteKind::ProduceThenDirect { of, .. } = &baseline.kind else {
            panic!("{baseline:?}");
        };
        assert_eq!(of, "proxy, memory on");
    }

    #[test]
    fn an_unknown_placeholder_is_refused() {
        let text = "- {name: rr, direct: round-robin}\n\
                    - {name: p, proxy: 'blockSizeTokens: ${blockSize}'}";
        let error = format!("{:#}", parse(text, &placeholders()).unwrap_err());
        assert!(error.contains("${blockSize}"), "{error}");
    }

    #[test]
    fn a_route_names_exactly_one_way() {
        let two = "- {name: a, direct: round-robin, sglangRouter: [--policy, cache_aware]}";
        let error = parse(two, &placeholders()).unwrap_err().to_string();
        assert!(error.contains("exactly one"), "{error}");
        let bad_proxy =
            "- {name: rr, direct: round-robin}\n- {name: p, proxy: 'windowDurationMs: 0.5'}";
        let error = format!("{:#}", parse(bad_proxy, &placeholders()).unwrap_err());
        assert!(error.contains("refused"), "{error}");
        let no_rr = "- {name: ll, direct: least-loaded}";
        assert!(parse(no_rr, &placeholders()).is_err());
    }

    #[test]
    fn only_the_named_routes_are_kept_and_an_unknown_name_is_refused() {
        let text = "- {name: rr, direct: round-robin}\n- {name: ll, direct: least-loaded}";
        let routes = parse(text, &placeholders()).unwrap();
        let file = std::path::Path::new("routes.yaml");
        assert_eq!(only(routes.clone(), &[], file).unwrap().len(), 2);
        let kept = only(routes.clone(), &["ll".to_string()], file).unwrap();
        assert_eq!(kept[0].name, "ll");
        let error = only(routes, &["nope".to_string()], file)
            .unwrap_err()
            .to_string();
        assert!(error.contains("\"nope\""), "{error}");
    }

    #[test]
    fn produce_then_direct_takes_its_proxy_routes_config() {
        let text = "- {name: rr, direct: round-robin}\n\
                    - {name: p, proxy: 'windowDurationMs: 7'}\n\
                    - {name: p + direct, produceThenDirect: p}";
        let routes = parse(text, &placeholders()).unwrap();
        assert_eq!(
            routes[2].kind,
            RouteKind::ProduceThenDirect {
                of: "p".into(),
                planner_yaml: "windowDurationMs: 7".into()
            }
        );
        assert_eq!(routes[2].planner().unwrap().window_duration_ms, Some(7));
        for bad in ["rr", "nowhere"] {
            let text = format!(
                "- {{name: rr, direct: round-robin}}\n- {{name: d, produceThenDirect: {bad}}}"
            );
            let error = parse(&text, &placeholders()).unwrap_err().to_string();
            assert!(error.contains("not a proxy route"), "{error}");
        }
    }

    #[test]
    fn producers_side_by_side_are_for_proxy_routes() {
        let text = "- {name: rr, direct: round-robin}\n- {name: p, proxy: 'placement: window', producers: 3}";
        let routes = parse(text, &placeholders()).unwrap();
        assert_eq!((routes[0].producers, routes[1].producers), (1, 3));
        for (bad, why) in [
            ("- {name: rr, direct: round-robin, producers: 2}", "for a proxy route"),
            ("- {name: rr, direct: round-robin}\n- {name: p, proxy: 'placement: window', producers: 0}", "at least 1"),
        ] {
            let error = parse(bad, &placeholders()).unwrap_err().to_string();
            assert!(error.contains(why), "{error}");
        }
    }

    #[test]
    fn slugs_are_file_names() {
        let route = Route {
            name: "sglang-router cache_aware, --balance-abs-threshold 8".into(),
            kind: RouteKind::Direct(Direct::RoundRobin),
            session_header: None,
            pending: None,
            producers: 1,
        };
        assert_eq!(
            route.slug(),
            "sglang-router-cache-aware-balance-abs-threshold-8"
        );
    }
}
