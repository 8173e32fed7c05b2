//! The results of one run, as a table for people and JSON for scripts.

use std::fmt::Write;

use serde::Serialize;

use crate::simulate::Outcome;

/// One run: the workload, the bound, and every policy's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub workload: String,
    pub seed: u64,
    pub replicas: usize,
    pub cache_blocks: usize,
    pub block_size_tokens: usize,
    pub steps: usize,
    pub requests: u64,
    /// See [`crate::simulate::lower_bound`].
    pub lower_bound_tokens: u64,
    pub policies: Vec<PolicyReport>,
}

/// One policy's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReport {
    pub name: String,
    pub prefill_tokens: u64,
    /// `prefill_tokens / lower_bound_tokens` (1 when both are 0).
    pub ratio_to_lower_bound: f64,
    /// See [`Outcome::imbalance`].
    pub imbalance: f64,
    /// See [`Outcome::colocation_rate`]; `null` when no request shares a prefix.
    pub colocation_rate: Option<f64>,
    /// The step time proxy: the busiest replica's prefill tokens, summed over steps.
    pub step_time_tokens: u64,
}

impl PolicyReport {
    pub fn new(outcome: &Outcome, lower_bound_tokens: u64) -> Self {
        let ratio_to_lower_bound = if lower_bound_tokens == 0 {
            // Every prefilled block is in the bound, so nothing was prefilled either.
            1.0
        } else {
            outcome.prefill_tokens as f64 / lower_bound_tokens as f64
        };
        PolicyReport {
            name: outcome.policy.to_string(),
            prefill_tokens: outcome.prefill_tokens,
            ratio_to_lower_bound,
            imbalance: outcome.imbalance(),
            colocation_rate: outcome.colocation_rate(),
            step_time_tokens: outcome.step_time_tokens,
        }
    }
}

impl Report {
    /// The JSON document (`--json`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }

    /// The table printed on stdout.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "workload {} (seed {}): {} steps, {} requests; {} replicas, {}-block prefix cache each, \
             {}-token blocks",
            self.workload,
            self.seed,
            self.steps,
            self.requests,
            self.replicas,
            self.cache_blocks,
            self.block_size_tokens
        );
        let _ = writeln!(
            out,
            "lower bound: {} prefill tokens (each distinct block prefilled once in the cluster)\n",
            thousands(self.lower_bound_tokens)
        );
        let _ = writeln!(
            out,
            "{:<14} {:>15} {:>9} {:>10} {:>11} {:>16}",
            "policy", "prefill tokens", "x bound", "imbalance", "co-located", "step time tokens"
        );
        for policy in &self.policies {
            let colocated = policy
                .colocation_rate
                .map_or_else(|| "-".to_string(), |rate| format!("{rate:.3}"));
            let _ = writeln!(
                out,
                "{:<14} {:>15} {:>9.3} {:>10.3} {:>11} {:>16}",
                policy.name,
                thousands(policy.prefill_tokens),
                policy.ratio_to_lower_bound,
                policy.imbalance,
                colocated,
                thousands(policy.step_time_tokens)
            );
        }
        out.push_str(
            "\nx bound: prefill tokens over the lower bound. imbalance: busiest replica's prefill \
             over the mean, as sums over steps (1 = even).\nco-located: share of the requests \
             sharing a prefix within their step that ran beside a request sharing it, or on a \
             replica holding it.\nstep time tokens: the busiest replica's prefill, summed over \
             steps.",
        );
        out
    }
}

/// `1234567` as `1,234,567`.
pub(crate) fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            workload: "grpo".into(),
            seed: 1,
            replicas: 2,
            cache_blocks: 10,
            block_size_tokens: 4,
            steps: 1,
            requests: 4,
            lower_bound_tokens: 12,
            policies: vec![PolicyReport {
                name: "burst".into(),
                prefill_tokens: 12,
                ratio_to_lower_bound: 1.0,
                imbalance: 2.0,
                colocation_rate: None,
                step_time_tokens: 12,
            }],
        }
    }

    #[test]
    fn json_uses_the_documented_names() {
        let json: serde_json::Value = serde_json::from_str(&report().to_json()).unwrap();
        assert_eq!(json["workload"], "grpo");
        assert_eq!(json["lowerBoundTokens"], 12);
        let policy = &json["policies"][0];
        assert_eq!(policy["name"], "burst");
        assert_eq!(policy["prefillTokens"], 12);
        assert_eq!(policy["ratioToLowerBound"], 1.0);
        assert_eq!(policy["imbalance"], 2.0);
        assert!(policy["colocationRate"].is_null());
    }

    #[test]
    fn table_has_a_row_per_policy() {
        let table = report().to_table();
        assert!(table.contains("lower bound: 12 prefill tokens"), "{table}");
        let row = table.lines().find(|l| l.starts_with("burst")).unwrap();
        assert!(
            row.contains("1.000") && row.contains("2.000") && row.contains(" - "),
            "{row}"
        );
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
