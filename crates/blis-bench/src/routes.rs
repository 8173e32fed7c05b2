//! The routes as data (bench/blis/routes.yaml): BLIS's own routers by their flags, and ours by
//! the planner config our placer runs with.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub name: String,
    /// BLIS's routing flags (a router of its own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blis: Vec<String>,
    /// Ours: BLIS's `burst-prefix` policy asking our placer, with this planner config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planner: Option<serde_yaml::Value>,
}

impl Route {
    /// BLIS's flags for this route.
    pub fn blis_args(&self) -> Vec<String> {
        match self.planner {
            Some(_) => vec!["--routing-policy".into(), "burst-prefix".into()],
            None => self.blis.clone(),
        }
    }

    /// Ours: the planner config as YAML.
    pub fn planner_yaml(&self) -> Option<String> {
        self.planner
            .as_ref()
            .map(|p| serde_yaml::to_string(p).expect("a YAML value serializes"))
    }
}

/// Reads the routes, each either BLIS's (`blis`) or ours (`planner`), names unique.
pub fn parse(text: &str) -> Result<Vec<Route>, String> {
    let routes: Vec<Route> = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    let mut names = std::collections::HashSet::new();
    for route in &routes {
        if route.blis.is_empty() == route.planner.is_none() {
            return Err(format!(
                "route {}: give either `blis` (BLIS's flags) or `planner` (ours)",
                route.name
            ));
        }
        if !names.insert(route.name.as_str()) {
            return Err(format!("route {} is named twice", route.name));
        }
        if let Some(planner) = &route.planner {
            let config: burst_prefix_api::PlannerConfig =
                serde_yaml::from_value(planner.clone())
                    .map_err(|e| format!("route {}: {e}", route.name))?;
            config
                .validate()
                .map_err(|e| format!("route {}: {e}", route.name))?;
        }
    }
    Ok(routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_routes_parse_and_ours_runs_the_burst_prefix_policy() {
        let routes = parse(include_str!("../../../bench/blis/routes.yaml")).unwrap();
        assert_eq!(routes[0].name, crate::report::BASELINE);
        let ours = routes.iter().find(|r| r.name == "ours").unwrap();
        assert_eq!(ours.blis_args(), ["--routing-policy", "burst-prefix"]);
        assert!(ours.planner_yaml().is_some());
    }

    #[test]
    fn a_route_must_be_one_kind_and_a_bad_planner_config_is_named() {
        assert!(parse("- {name: x}").unwrap_err().contains("either"));
        assert!(parse("- {name: x, planner: {maxPerReplica: -5}}")
            .unwrap_err()
            .contains("maxPerReplica"));
        assert!(parse("- {name: x, blis: [a]}\n- {name: x, blis: [b]}")
            .unwrap_err()
            .contains("twice"));
    }
}
