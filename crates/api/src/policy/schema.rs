//! The `BurstPrefixPolicy` CRD: its schema generated from the types, every config rule
//! ([`RULES`]) and the rules of [`super::rules`] as CEL on it, and its descriptions tidied for
//! `kubectl explain`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
    ValidationRule,
};
use kube::CustomResourceExt;

use super::rules::{
    CelRule, EPP_TLS_RULES, KV_EVENTS_RULES, PRODUCER_RULES, SELECTOR_REQUIREMENT_RULES,
    SPEC_RULES, TOKENIZER_RULES,
};
use super::BurstPrefixPolicy;
use crate::config::RULES;
use crate::kv_events;

/// What `kubectl explain burstprefixpolicy` says about the kind.
const KIND_DESCRIPTION: &str = "A BurstPrefixPolicy co-locates bursts of prefix-sharing LLM \
    requests on the inference pods it selects. For each policy the operator runs a producer \
    (Deployment, Service and ConfigMap `<policy>-producer`) that collects the requests of a short \
    window, groups the ones that share a prompt prefix and places each group on one replica. \
    Clients ask it where a request goes (`POST /v1/produce`), send the request through it (the \
    OpenAI-compatible proxy), or use it as an InferencePool's endpoint picker (gRPC ext_proc).";

/// k8s-openapi's description of a Quantity is four screens long; `kubectl explain` shows it
/// under every resource.
const QUANTITY_DESCRIPTION: &str =
    "A quantity: a number with an optional suffix, e.g. 500m, 2, 512Mi or 4Gi.";

/// The CRD, with every config rule of [`RULES`] as CEL on `spec` (and no second OpenAPI bound
/// for the same rule), the rules above, and a description on every field.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = BurstPrefixPolicy::crd();
    let root = crd
        .spec
        .versions
        .iter_mut()
        .filter_map(|v| v.schema.as_mut()?.open_api_v3_schema.as_mut())
        .next()
        .expect("the generated CRD has a schema");
    root.description = Some(KIND_DESCRIPTION.to_string());
    let spec = property(root, "spec").expect("the generated CRD has a spec schema");
    let mut rules: Vec<ValidationRule> = Vec::new();
    for rule in RULES {
        // One message per broken rule: the CEL rule carries it, so the field loses the OpenAPI
        // bounds generated from the same constants.
        if let Some(field) = path(spec, rule.field) {
            field.minimum = None;
            field.maximum = None;
        }
        rules.push(ValidationRule {
            rule: rule.cel.to_string(),
            message: Some(rule.message()),
            field_path: Some(format!(".{}", rule.field)),
            reason: Some("FieldValueInvalid".to_string()),
            ..ValidationRule::default()
        });
    }
    rules.extend(SPEC_RULES.iter().map(validation));
    spec.x_kubernetes_validations = Some(rules);
    let producer = property(spec, "producer").expect("spec.producer");
    producer.x_kubernetes_validations = Some(PRODUCER_RULES.iter().map(validation).collect());
    if let Some(image) = property(producer, "image") {
        image.max_length = Some(1024);
    }
    let epp_tls = property(producer, "eppTls").expect("spec.producer.eppTls");
    epp_tls.x_kubernetes_validations = Some(EPP_TLS_RULES.iter().map(validation).collect());
    let tokenizer = property(producer, "tokenizer").expect("spec.producer.tokenizer");
    tokenizer.x_kubernetes_validations = Some(TOKENIZER_RULES.iter().map(validation).collect());
    if let Some(image) = property(tokenizer, "image") {
        image.max_length = Some(1024);
        image.min_length = Some(1);
    }
    let events = path(spec, "engines.kvEvents").expect("spec.engines.kvEvents");
    events.x_kubernetes_validations = Some(
        KV_EVENTS_RULES
            .iter()
            .map(|rule| ValidationRule {
                field_path: Some(".bind".to_string()),
                ..validation(rule)
            })
            .collect(),
    );
    if let Some(bind) = property(events, "bind") {
        bind.max_length = Some(kv_events::BIND_MAX_LENGTH);
    }
    let expressions = path(spec, "selector.matchExpressions").expect("spec.selector");
    // Bounded, so that the API server's cost estimate of the CEL rules stays small.
    expressions.max_items = Some(32);
    if let Some(JSONSchemaPropsOrArray::Schema(requirement)) = expressions.items.as_mut() {
        requirement.x_kubernetes_validations =
            Some(SELECTOR_REQUIREMENT_RULES.iter().map(validation).collect());
        if let Some(values) = property(requirement, "values") {
            values.max_items = Some(256);
        }
    }
    tidy_descriptions(root);
    crd
}

fn validation(rule: &CelRule) -> ValidationRule {
    ValidationRule {
        rule: rule.rule.to_string(),
        message: Some(
            rule.message
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        ),
        reason: Some("FieldValueInvalid".to_string()),
        ..ValidationRule::default()
    }
}

fn property<'a>(schema: &'a mut JSONSchemaProps, name: &str) -> Option<&'a mut JSONSchemaProps> {
    schema.properties.as_mut()?.get_mut(name)
}

/// The schema of `a.b.c` below `schema`.
fn path<'a>(schema: &'a mut JSONSchemaProps, dotted: &str) -> Option<&'a mut JSONSchemaProps> {
    dotted
        .split('.')
        .try_fold(schema, |schema, name| property(schema, name))
}

/// Doc comments are wrapped at 100 columns; `kubectl explain` would break their sentences
/// there. Lines are joined, paragraphs kept.
fn tidy_descriptions(schema: &mut JSONSchemaProps) {
    if let Some(description) = schema.description.as_mut() {
        *description = if description.starts_with("Quantity is a fixed-point representation") {
            QUANTITY_DESCRIPTION.to_string()
        } else {
            description
                .split("\n\n")
                .map(|paragraph| paragraph.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
                .join("\n\n")
        };
    }
    for child in children(schema) {
        tidy_descriptions(child);
    }
}

/// The schemas directly below `schema`: properties, items, additional properties.
fn children(schema: &mut JSONSchemaProps) -> Vec<&mut JSONSchemaProps> {
    let mut children: Vec<&mut JSONSchemaProps> = Vec::new();
    if let Some(properties) = schema.properties.as_mut() {
        children.extend(properties.values_mut());
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(item)) => children.push(item),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => children.extend(items.iter_mut()),
        None => {}
    }
    if let Some(JSONSchemaPropsOrBool::Schema(additional)) = schema.additional_properties.as_mut() {
        children.push(additional);
    }
    children
}

/// The CRD as the YAML checked into `crds/` and the chart.
pub fn crd_yaml() -> String {
    let mut yaml = String::from(
        "# Generated by `burst-prefix-operator crd` from crates/api/src/policy/: do not edit.\n",
    );
    yaml.push_str(&serde_yaml::to_string(&crd()).expect("a CRD always serializes"));
    yaml
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{OBJECT_NAME_PATTERN, SECRET_NAME_PATTERN};

    fn root_schema() -> JSONSchemaProps {
        crd().spec.versions[0]
            .schema
            .clone()
            .unwrap()
            .open_api_v3_schema
            .unwrap()
    }

    fn spec_schema() -> JSONSchemaProps {
        root_schema().properties.unwrap()["spec"].clone()
    }

    #[test]
    fn spec_schema_has_flat_planner_fields_with_defaults() {
        let spec = spec_schema();
        let properties = spec.properties.as_ref().unwrap();
        for field in [
            "selector",
            "poolRef",
            "targetPorts",
            "windowDurationMs",
            "maxPerReplica",
            "blockSizeTokens",
            "maxPrefixTokensToMatch",
            "minColocateBlocks",
            "maxBatchSize",
            "balanceBy",
            "producer",
        ] {
            assert!(properties.contains_key(field), "spec.{field} missing");
        }
        // Unset is meaningful (placement on arrival unless a window is asked for), so the API
        // server must not fill it in.
        let window = &properties["windowDurationMs"];
        assert!(window.default.is_none(), "{:?}", window.default);
        assert_eq!(properties["targetPorts"].max_items, Some(8));
    }

    #[test]
    fn every_config_rule_is_cel_on_spec_and_only_there() {
        let spec = spec_schema();
        let rules = spec.x_kubernetes_validations.clone().unwrap();
        for rule in RULES {
            assert!(
                rules
                    .iter()
                    .any(|r| r.rule == rule.cel && r.message.as_deref() == Some(&rule.message())),
                "{} missing",
                rule.field
            );
            // No second message from an OpenAPI bound on the same field.
            let mut spec = spec.clone();
            if let Some(field) = path(&mut spec, rule.field) {
                assert_eq!(
                    (field.minimum, field.maximum),
                    (None, None),
                    "{}",
                    rule.field
                );
            }
        }
        assert_eq!(rules.len(), RULES.len() + SPEC_RULES.len());
    }

    #[test]
    fn the_image_has_no_default_so_stored_policies_follow_the_operator() {
        let mut spec = spec_schema();
        let producer = property(&mut spec, "producer").unwrap();
        let default = producer.default.as_ref().unwrap().0.clone();
        assert!(default.get("image").is_none(), "{default}");
        assert!(property(producer, "image").unwrap().default.is_none());
        assert_eq!(default["eppPort"], 9002);
    }

    #[test]
    fn tls_and_drain_have_no_defaults_so_stored_policies_follow_the_producer() {
        let mut spec = spec_schema();
        let producer = property(&mut spec, "producer").unwrap();
        let default = producer.default.as_ref().unwrap().0.clone();
        for field in ["eppTls", "apiTls", "drainTimeoutMs"] {
            assert!(default.get(field).is_none(), "{field} in {default}");
        }
        let drain = property(producer, "drainTimeoutMs").unwrap();
        assert_eq!(
            (drain.minimum, drain.maximum),
            (Some(0.0), Some(3_600_000.0))
        );
        let epp_tls = property(producer, "eppTls").unwrap();
        let rules = epp_tls.x_kubernetes_validations.clone().unwrap();
        assert_eq!(rules.len(), EPP_TLS_RULES.len());
        assert!(rules[0].rule.contains("self.plaintext") && rules[0].rule.contains("secretName"));
        for secret in [
            path(epp_tls, "secretName").unwrap().clone(),
            path(producer, "apiTls.secretName").unwrap().clone(),
        ] {
            assert_eq!(secret.max_length, Some(253));
            assert_eq!(secret.pattern.as_deref(), Some(SECRET_NAME_PATTERN));
        }
    }

    #[test]
    fn ha_is_one_of_two_modes_and_defaults_to_leader_election() {
        let mut spec = spec_schema();
        let producer = property(&mut spec, "producer").unwrap();
        let default = producer.default.as_ref().unwrap().0.clone();
        assert_eq!(default["ha"], "leaderElection");
        let ha = property(producer, "ha").unwrap();
        let modes: Vec<_> = ha
            .enum_
            .clone()
            .unwrap()
            .into_iter()
            .map(|mode| mode.0)
            .collect();
        assert_eq!(modes, ["leaderElection", "activeActive"]);
    }

    /// Every field `kubectl explain` shows has a description, in whole sentences on one line.
    #[test]
    fn every_field_is_described_without_broken_lines() {
        fn walk(schema: &JSONSchemaProps, at: &str, missing: &mut Vec<String>) {
            let mut schema = schema.clone();
            if let Some(properties) = schema.properties.clone() {
                for (name, property) in properties {
                    let here = format!("{at}.{name}");
                    match property.description.as_deref() {
                        None | Some("") => missing.push(here.clone()),
                        Some(text) if text.contains('\n') && !text.contains("\n\n") => {
                            missing.push(format!("{here} (broken line)"))
                        }
                        Some(_) => {}
                    }
                    walk(&property, &here, missing);
                }
            }
            for child in children(&mut schema) {
                walk(child, &format!("{at}[]"), missing);
            }
        }
        let root = root_schema();
        assert!(root
            .description
            .as_deref()
            .unwrap()
            .starts_with("A BurstPrefixPolicy"));
        let mut missing = Vec::new();
        walk(&root, "", &mut missing);
        // apiVersion, kind and metadata are described by Kubernetes itself.
        missing.retain(|m| ![".apiVersion", ".kind", ".metadata"].contains(&m.as_str()));
        assert!(
            missing.is_empty(),
            "fields without a description: {missing:?}"
        );
    }

    #[test]
    fn the_bind_and_tokenizer_rules_sit_on_their_own_fields() {
        let mut spec = spec_schema();
        let events = path(&mut spec, "engines.kvEvents").unwrap().clone();
        let rules = events.x_kubernetes_validations.clone().unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].rule, kv_events::BIND_CEL);
        assert_eq!(rules[0].field_path.as_deref(), Some(".bind"));
        assert!(rules[0]
            .message
            .as_deref()
            .unwrap()
            .starts_with("engines.kvEvents.bind must be tcp://HOST:PORT"));
        assert_eq!(
            events.properties.unwrap()["bind"].max_length,
            Some(kv_events::BIND_MAX_LENGTH)
        );
        let spec_rules = spec.x_kubernetes_validations.clone().unwrap();
        assert!(spec_rules
            .iter()
            .any(|r| r.rule == kv_events::BIND_PORT_CLASH_CEL));

        let tokenizer = path(&mut spec, "producer.tokenizer").unwrap().clone();
        let rules = tokenizer.x_kubernetes_validations.unwrap();
        assert_eq!(rules.len(), TOKENIZER_RULES.len());
        assert!(rules[0].rule.contains("size() == 1"), "{}", rules[0].rule);
        // The regex as the API server reads it: `\.` in CEL, `\.` in RE2.
        assert!(
            rules[1].rule.contains(r"'(^|/)\\.\\.(/|$)'"),
            "{}",
            rules[1].rule
        );
        let fields = tokenizer.properties.unwrap();
        for name in ["configMap", "persistentVolumeClaim"] {
            assert_eq!(
                fields[name].pattern.as_deref(),
                Some(OBJECT_NAME_PATTERN),
                "{name}"
            );
        }
        assert_eq!(fields["image"].max_length, Some(1024));
        // No default: a policy without a tokenizer mounts nothing.
        let producer_default = path(&mut spec, "producer")
            .unwrap()
            .default
            .clone()
            .unwrap()
            .0;
        assert!(
            producer_default.get("tokenizer").is_none(),
            "{producer_default}"
        );
    }
}
