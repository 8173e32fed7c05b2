//! The producer's TLS (docs/behaviour.md §9): which Secrets its pods mount, where, and what its
//! command line says about them. The endpoint picker serves TLS unless the policy asks for
//! plaintext, with a self-signed certificate unless it names a Secret; the API port serves TLS
//! only when the policy names a Secret. The Service's `appProtocol`s and the status's
//! `producerUrl` follow from the same answers.

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_runtime::producer::{EppTransport, TlsFiles};
use k8s_openapi::api::core::v1::{SecretVolumeSource, Volume, VolumeMount};

/// The keys of a `kubernetes.io/tls` Secret (cert-manager writes the same).
const CERT_KEY: &str = "tls.crt";
const PRIVATE_KEY_KEY: &str = "tls.key";

/// Owner and group may read the files, nobody else (the pod's `fsGroup` is the producer's).
const SECRET_FILE_MODE: i32 = 0o440;

/// A Secret the producer pods mount: the volume's name, the directory and the Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretMount {
    pub volume: &'static str,
    pub dir: &'static str,
    pub secret: String,
}

impl SecretMount {
    fn files(&self) -> TlsFiles {
        TlsFiles {
            cert: format!("{}/{CERT_KEY}", self.dir),
            key: format!("{}/{PRIVATE_KEY_KEY}", self.dir),
        }
    }

    /// The whole Secret as a directory (no `subPath`), so the kubelet updates the files in
    /// place when the Secret changes and the producer reloads them.
    pub fn volume(&self) -> Volume {
        Volume {
            name: self.volume.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(self.secret.clone()),
                default_mode: Some(SECRET_FILE_MODE),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        }
    }

    pub fn volume_mount(&self) -> VolumeMount {
        VolumeMount {
            name: self.volume.into(),
            mount_path: self.dir.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        }
    }
}

/// Whether the policy asks for a plaintext endpoint picker.
fn epp_plaintext(policy: &BurstPrefixPolicy) -> bool {
    let tls = policy.spec.producer.epp_tls.as_ref();
    tls.is_some_and(|tls| tls.plaintext)
}

/// The endpoint picker's Secret, if the policy names one and wants TLS. (The CRD refuses
/// plaintext with a Secret; an older CRD may have let both through: plaintext wins.)
fn epp_mount(policy: &BurstPrefixPolicy) -> Option<SecretMount> {
    let tls = policy.spec.producer.epp_tls.as_ref()?;
    if tls.plaintext {
        return None;
    }
    Some(SecretMount {
        volume: "epp-tls",
        dir: "/etc/burst-prefix/epp-tls",
        secret: tls.secret_name.clone()?,
    })
}

/// The API port's Secret, if the policy names one.
fn api_mount(policy: &BurstPrefixPolicy) -> Option<SecretMount> {
    Some(SecretMount {
        volume: "api-tls",
        dir: "/etc/burst-prefix/api-tls",
        secret: policy.spec.producer.api_tls.as_ref()?.secret_name.clone(),
    })
}

/// Every Secret the producer pods mount.
pub fn mounts(policy: &BurstPrefixPolicy) -> Vec<SecretMount> {
    epp_mount(policy)
        .into_iter()
        .chain(api_mount(policy))
        .collect()
}

/// How the endpoint picker serves.
pub fn epp_transport(policy: &BurstPrefixPolicy) -> EppTransport {
    match (epp_plaintext(policy), epp_mount(policy)) {
        (true, _) => EppTransport::Plaintext,
        (false, Some(mount)) => EppTransport::Tls(mount.files()),
        (false, None) => EppTransport::SelfSignedTls,
    }
}

/// The API port's certificate files, when it serves TLS.
pub fn api_tls(policy: &BurstPrefixPolicy) -> Option<TlsFiles> {
    api_mount(policy).map(|mount| mount.files())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::policy_with;
    use serde_json::json;

    #[test]
    fn the_endpoint_picker_serves_self_signed_tls_unless_told_otherwise_and_the_api_plain_http() {
        let policy = policy_with(json!({}));
        assert_eq!(epp_transport(&policy), EppTransport::SelfSignedTls);
        assert_eq!(api_tls(&policy), None);
        assert!(mounts(&policy).is_empty());
    }

    #[test]
    fn named_secrets_are_mounted_whole_read_only_and_named_on_the_command_line() {
        let policy = policy_with(json!({
            "eppTls": {"secretName": "picker-cert"},
            "apiTls": {"secretName": "api-cert"},
        }));
        assert_eq!(
            epp_transport(&policy),
            EppTransport::Tls(TlsFiles {
                cert: "/etc/burst-prefix/epp-tls/tls.crt".into(),
                key: "/etc/burst-prefix/epp-tls/tls.key".into(),
            })
        );
        assert_eq!(
            api_tls(&policy),
            Some(TlsFiles {
                cert: "/etc/burst-prefix/api-tls/tls.crt".into(),
                key: "/etc/burst-prefix/api-tls/tls.key".into(),
            })
        );
        let mounts = mounts(&policy);
        let secrets: Vec<_> = mounts
            .iter()
            .map(|m| {
                let volume = m.volume();
                let source = volume.secret.unwrap();
                (
                    volume.name,
                    source.secret_name.unwrap(),
                    source.default_mode,
                )
            })
            .collect();
        assert_eq!(
            secrets,
            [
                (
                    "epp-tls".to_string(),
                    "picker-cert".to_string(),
                    Some(0o440)
                ),
                ("api-tls".to_string(), "api-cert".to_string(), Some(0o440)),
            ]
        );
        for mount in &mounts {
            let volume_mount = mount.volume_mount();
            assert_eq!(volume_mount.read_only, Some(true));
            // The whole directory: a subPath mount would never see the Secret change.
            assert_eq!(volume_mount.sub_path, None);
            assert_eq!(volume_mount.mount_path, mount.dir);
        }
    }

    #[test]
    fn plaintext_mounts_nothing_for_the_endpoint_picker() {
        let policy = policy_with(json!({"eppTls": {"plaintext": true}}));
        assert_eq!(epp_transport(&policy), EppTransport::Plaintext);
        assert!(mounts(&policy).is_empty());
        // The CRD refuses both at once; an older one let them through: plaintext wins, and the
        // Secret is not mounted for a listener that does not use it.
        let both = policy_with(json!({"eppTls": {"plaintext": true, "secretName": "c"}}));
        assert_eq!(epp_transport(&both), EppTransport::Plaintext);
        assert!(mounts(&both).is_empty());
    }
}
