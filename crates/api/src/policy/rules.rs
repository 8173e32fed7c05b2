//! The CEL rules the CRD carries beyond the config's own ([`crate::config::RULES`]): across
//! `spec` fields, and on the fields the children would otherwise refuse later.

use crate::kv_events;

/// A CEL rule with its message, on the schema node named by its place in the CRD.
pub(super) struct CelRule {
    pub rule: &'static str,
    pub message: &'static str,
}

/// Rules across `spec` fields that the OpenAPI schema alone cannot say.
pub(super) const SPEC_RULES: &[CelRule] = &[
    CelRule {
        rule: "has(self.selector) != has(self.poolRef)",
        message: "exactly one of selector and poolRef must be set",
    },
    CelRule {
        rule: kv_events::BIND_PORT_CLASH_CEL,
        message: kv_events::BIND_PORT_CLASH,
    },
    CelRule {
        rule: "has(self.poolRef) || (has(self.targetPorts) && size(self.targetPorts) >= 1)",
        message: "targetPorts needs 1 to 8 ports when selector is used",
    },
];

/// Rules on `spec.engines.kvEvents` (crate::kv_events).
pub(super) const KV_EVENTS_RULES: &[CelRule] = &[CelRule {
    rule: kv_events::BIND_CEL,
    message: kv_events::BIND_REQUIREMENT,
}];

/// Rules on `spec.producer.tokenizer`.
pub(super) const TOKENIZER_RULES: &[CelRule] = &[
    CelRule {
        rule: "[has(self.configMap), has(self.persistentVolumeClaim), has(self.image)].filter(set, set).size() == 1",
        message: "producer.tokenizer needs exactly one of configMap, persistentVolumeClaim and \
                  image",
    },
    CelRule {
        rule: "!has(self.subPath) || (!self.subPath.startsWith('/') && !self.subPath.matches('(^|/)\\\\.\\\\.(/|$)'))",
        message: "producer.tokenizer.subPath must be a relative path inside the volume, without \
                  a '..' element",
    },
];

/// Rules on `spec.producer` that the Deployment and Service would otherwise refuse later.
pub(super) const PRODUCER_RULES: &[CelRule] = &[
    CelRule {
        rule: "!has(self.image) || self.image.matches('^[^\\\\s]+$')",
        message: "producer.image must be an image reference without spaces; leave it out to use \
                  the operator's --producer-image",
    },
    CelRule {
        rule: "self.port != self.metricsPort && self.port != self.eppPort && self.metricsPort != self.eppPort",
        message: "producer.port, producer.metricsPort and producer.eppPort must be three \
                  different ports",
    },
];

/// Rules on `spec.producer.eppTls`.
pub(super) const EPP_TLS_RULES: &[CelRule] = &[CelRule {
    rule: "!(has(self.plaintext) && self.plaintext && has(self.secretName))",
    message: "producer.eppTls: plaintext and secretName exclude each other: a plaintext \
              endpoint picker has no certificate",
}];

/// Rules on each `spec.selector.matchExpressions[]`, as Kubernetes validates a label selector.
pub(super) const SELECTOR_REQUIREMENT_RULES: &[CelRule] = &[
    CelRule {
        rule: "self.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist']",
        message: "selector.matchExpressions[].operator must be In, NotIn, Exists or DoesNotExist",
    },
    CelRule {
        rule: "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
        message: "selector.matchExpressions[].values must not be empty for In and NotIn",
    },
    CelRule {
        rule: "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
        message: "selector.matchExpressions[].values must be empty for Exists and DoesNotExist",
    },
];
