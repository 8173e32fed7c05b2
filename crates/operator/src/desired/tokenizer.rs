//! The model's tokenizer in the producer pods (docs/behaviour.md §7, the operator's side): the
//! volume `spec.producer.tokenizer` names (a ConfigMap, a PersistentVolumeClaim or an image),
//! mounted whole and read-only at [`TOKENIZER_DIR`], and the directory the producer's config
//! then names as `engines.tokenizer.path` when the policy does not name one itself.

use burst_prefix_api::policy::{BurstPrefixPolicy, TokenizerVolume, TokenizerVolumeKind};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, ImageVolumeSource, PersistentVolumeClaimVolumeSource, Volume,
    VolumeMount,
};

/// Where the tokenizer's volume is mounted in the producer container.
pub const TOKENIZER_DIR: &str = "/etc/burst-prefix/tokenizer";
const VOLUME: &str = "tokenizer";

/// The policy's tokenizer volume, if it names exactly one kind of volume (the CRD and the operator's
/// validation refuse the others).
fn named_volume(policy: &BurstPrefixPolicy) -> Option<(&TokenizerVolume, TokenizerVolumeKind<'_>)> {
    let tokenizer = policy.spec.producer.tokenizer.as_ref()?;
    Some((tokenizer, tokenizer.kind()?))
}

/// The pod's volume. The whole ConfigMap, claim or image (no `subPath` mount), so that the
/// kubelet updates a ConfigMap's files in place.
pub fn volume(policy: &BurstPrefixPolicy) -> Option<Volume> {
    let volume = Volume {
        name: VOLUME.into(),
        ..Volume::default()
    };
    Some(match named_volume(policy)?.1 {
        TokenizerVolumeKind::ConfigMap(name) => Volume {
            config_map: Some(ConfigMapVolumeSource {
                name: name.into(),
                ..ConfigMapVolumeSource::default()
            }),
            ..volume
        },
        TokenizerVolumeKind::PersistentVolumeClaim(claim) => Volume {
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: Some(true),
            }),
            ..volume
        },
        TokenizerVolumeKind::Image(reference) => Volume {
            image: Some(ImageVolumeSource {
                reference: Some(reference.into()),
                // Kubernetes' default: Always for `:latest` or no tag, else IfNotPresent.
                pull_policy: None,
            }),
            ..volume
        },
    })
}

/// The container's mount of [`volume`], read-only.
pub fn volume_mount(policy: &BurstPrefixPolicy) -> Option<VolumeMount> {
    named_volume(policy)?;
    Some(VolumeMount {
        name: VOLUME.into(),
        mount_path: TOKENIZER_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    })
}

/// The tokenizer's directory in the producer container: [`TOKENIZER_DIR`], or its `subPath`.
pub fn dir(policy: &BurstPrefixPolicy) -> Option<String> {
    let (tokenizer, _) = named_volume(policy)?;
    let sub_path = tokenizer
        .sub_path
        .as_deref()
        .map(|path| path.trim_matches('/'))
        .filter(|path| !path.is_empty());
    Some(match sub_path {
        Some(path) => format!("{TOKENIZER_DIR}/{path}"),
        None => TOKENIZER_DIR.to_string(),
    })
}

/// A claim is a model's whole volume, maybe many files: the kubelet gives its files the pod's
/// `fsGroup` only when the volume's root does not have it yet, not on every start. (ConfigMaps,
/// Secrets and images are not affected by the policy.)
pub fn fs_group_change_policy(policy: &BurstPrefixPolicy) -> Option<String> {
    matches!(
        named_volume(policy)?.1,
        TokenizerVolumeKind::PersistentVolumeClaim(_)
    )
    .then(|| "OnRootMismatch".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::policy_with;
    use serde_json::json;

    #[test]
    fn no_tokenizer_mounts_nothing() {
        let policy = policy_with(json!({}));
        assert_eq!(volume(&policy), None);
        assert_eq!(volume_mount(&policy), None);
        assert_eq!(dir(&policy), None);
        assert_eq!(fs_group_change_policy(&policy), None);
    }

    #[test]
    fn each_source_is_mounted_whole_and_read_only_at_the_tokenizer_dir() {
        let config_map = policy_with(json!({"tokenizer": {"configMap": "qwen-tokenizer"}}));
        let built = volume(&config_map).unwrap();
        assert_eq!(built.name, "tokenizer");
        let source = built.config_map.unwrap();
        assert_eq!(source.name, "qwen-tokenizer");
        assert_eq!(source.items, None, "every key, as a file");
        assert_eq!(fs_group_change_policy(&config_map), None);

        let claim = policy_with(json!({"tokenizer": {"persistentVolumeClaim": "models"}}));
        let source = volume(&claim).unwrap().persistent_volume_claim.unwrap();
        assert_eq!(
            (source.claim_name.as_str(), source.read_only),
            ("models", Some(true))
        );
        assert_eq!(
            fs_group_change_policy(&claim).as_deref(),
            Some("OnRootMismatch")
        );

        let image = policy_with(
            json!({"tokenizer": {"image": "registry.internal/models/qwen3-8b-tokenizer:1"}}),
        );
        let source = volume(&image).unwrap().image.unwrap();
        assert_eq!(
            source.reference.as_deref(),
            Some("registry.internal/models/qwen3-8b-tokenizer:1")
        );

        for policy in [&config_map, &claim, &image] {
            let mount = volume_mount(policy).unwrap();
            assert_eq!(mount.name, "tokenizer");
            assert_eq!(mount.mount_path, TOKENIZER_DIR);
            assert_eq!(mount.read_only, Some(true));
            assert_eq!(mount.sub_path, None);
            assert_eq!(dir(policy).as_deref(), Some("/etc/burst-prefix/tokenizer"));
        }
    }

    #[test]
    fn the_sub_path_is_the_directory_inside_the_mount() {
        let dir_of = |sub_path: &str| {
            dir(&policy_with(
                json!({"tokenizer": {"persistentVolumeClaim": "models", "subPath": sub_path}}),
            ))
        };
        assert_eq!(
            dir_of("Qwen3-8B").as_deref(),
            Some("/etc/burst-prefix/tokenizer/Qwen3-8B")
        );
        assert_eq!(
            dir_of("hub/Qwen3-8B/").as_deref(),
            Some("/etc/burst-prefix/tokenizer/hub/Qwen3-8B")
        );
        assert_eq!(dir_of("").as_deref(), Some("/etc/burst-prefix/tokenizer"));
    }

    #[test]
    fn two_sources_or_none_mount_nothing() {
        for tokenizer in [
            json!({"configMap": "a", "image": "b:1"}),
            json!({"subPath": "x"}),
        ] {
            let policy = policy_with(json!({"tokenizer": tokenizer}));
            assert_eq!(volume(&policy), None, "{tokenizer}");
            assert_eq!(volume_mount(&policy), None, "{tokenizer}");
            assert_eq!(dir(&policy), None, "{tokenizer}");
        }
    }
}
