//! Client configuration for the control plane: a `kube::Config` for the Rust tests and a
//! kubeconfig file for kubectl, helm and binaries under test.

use std::path::Path;
use std::time::Duration;

/// A kube-rs config that trusts the test CA and sends `token`.
pub(crate) fn kube_config(server: &str, ca_cert_der: &[u8], token: &str) -> kube::Config {
    let url = server.parse().expect("the control plane's URL is valid");
    let mut config = kube::Config::new(url);
    config.root_cert = Some(vec![ca_cert_der.to_vec()]);
    // AuthInfo's token is a secrecy::SecretString, which kube does not re-export: deserialize it.
    config.auth_info = serde_json::from_value(serde_json::json!({ "token": token }))
        .expect("an AuthInfo with a token deserializes");
    config.connect_timeout = Some(Duration::from_secs(5));
    config
}

/// The text of a kubeconfig with one cluster, one user and one context, all selected.
pub(crate) fn kubeconfig_yaml(server: &str, ca_file: &Path, user: &str, token: &str) -> String {
    // JSON strings are YAML strings: quote every value that comes from outside.
    let q = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let server = q(server);
    let ca_file = q(&ca_file.to_string_lossy());
    let user = q(user);
    let token = q(token);
    format!(
        "apiVersion: v1
kind: Config
clusters:
  - name: burst-prefix-test
    cluster:
      server: {server}
      certificate-authority: {ca_file}
users:
  - name: {user}
    user:
      token: {token}
contexts:
  - name: burst-prefix-test
    context:
      cluster: burst-prefix-test
      user: {user}
current-context: burst-prefix-test
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfig_parses_with_kube() {
        let yaml = kubeconfig_yaml(
            "https://127.0.0.1:6443",
            Path::new("/tmp/x/ca.crt"),
            "system:serviceaccount:a:b",
            "t0k",
        );
        let parsed = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        assert_eq!(parsed.current_context.as_deref(), Some("burst-prefix-test"));
        let cluster = parsed.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some("/tmp/x/ca.crt")
        );
        assert_eq!(parsed.auth_infos[0].name, "system:serviceaccount:a:b");
    }

    #[test]
    fn kube_config_carries_the_token_and_ca() {
        let config = kube_config("https://127.0.0.1:6443", b"der", "t0k");
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(config.root_cert, Some(vec![b"der".to_vec()]));
        assert!(config.auth_info.token.is_some());
    }
}
