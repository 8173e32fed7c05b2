//! The routes a workload is sent through, as data (bench/engine/routes.yaml): a list of named
//! routes, each straight to the replicas, through burst-prefix's proxy with a planner config, or
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
    /// burst-prefix's proxy with this planner config (SPEC §2; the bench adds the endpoints).
    Proxy {
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
}

/// An entry of routes.yaml: a name and exactly one of the ways.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    name: String,
    direct: Option<Direct>,
    proxy: Option<String>,
    sglang_router: Option<Vec<String>>,
    vllm_router: Option<Vec<String>>,
    session_header: Option<String>,
}

/// Placeholders of a proxy's planner YAML, filled in by the bench from the engine.
pub struct Placeholders {
    /// `${cacheTokensPerReplica}`: the prompt tokens one replica's cache holds.
    pub cache_tokens_per_replica: u64,
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

    /// The proxy's planner config, for a proxy route.
    pub fn planner(&self) -> Option<PlannerConfig> {
        let RouteKind::Proxy { planner_yaml } = &self.kind else {
            return None;
        };
        let yaml = format!("{}\nendpoints: []\n", planner_yaml.trim_end());
        Some(
            ProducerConfig::from_yaml(&yaml)
                .expect("checked when parsed")
                .planner,
        )
    }
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
            let planner_yaml = yaml.replace(
                "${cacheTokensPerReplica}",
                &placeholders.cache_tokens_per_replica.to_string(),
            );
            ProducerConfig::from_yaml(&format!("{}\nendpoints: []\n", planner_yaml.trim_end()))
                .map_err(|e| anyhow!("route {name:?}: the proxy's config is refused: {e}"))?;
            kinds.push(RouteKind::Proxy { planner_yaml });
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
                "route {name:?}: needs exactly one of direct, proxy, sglangRouter, vllmRouter \
                 ({} given)",
                kinds.len()
            ),
        };
        let route = Route {
            name,
            kind,
            session_header: entry.session_header,
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

    const PLACEHOLDERS: Placeholders = Placeholders {
        cache_tokens_per_replica: 6_400,
    };

    #[test]
    fn the_shipped_routes_parse() {
        let text = include_str!("../../../bench/engine/routes.yaml");
        let routes = parse(text, &PLACEHOLDERS).unwrap();
        assert!(routes.len() >= 4);
        let memory_on = routes
            .iter()
            .filter_map(Route::planner)
            .find_map(|p| p.memory_settings())
            .expect("a proxy route with memory");
        assert_eq!(memory_on.capacity_blocks.get() as u64 * 64, 6_400);
    }

    #[test]
    fn a_route_names_exactly_one_way() {
        let two = "- {name: a, direct: round-robin, sglangRouter: [--policy, cache_aware]}";
        let error = parse(two, &PLACEHOLDERS).unwrap_err().to_string();
        assert!(error.contains("exactly one"), "{error}");
        let bad_proxy =
            "- {name: rr, direct: round-robin}\n- {name: p, proxy: 'windowDurationMs: 0.5'}";
        let error = format!("{:#}", parse(bad_proxy, &PLACEHOLDERS).unwrap_err());
        assert!(error.contains("refused"), "{error}");
        let no_rr = "- {name: ll, direct: least-loaded}";
        assert!(parse(no_rr, &PLACEHOLDERS).is_err());
    }

    #[test]
    fn slugs_are_file_names() {
        let route = Route {
            name: "sglang-router cache_aware, --balance-abs-threshold 8".into(),
            kind: RouteKind::Direct(Direct::RoundRobin),
            session_header: None,
        };
        assert_eq!(
            route.slug(),
            "sglang-router-cache-aware-balance-abs-threshold-8"
        );
    }
}
