//! TLS for a listener (docs/behaviour.md §9): the endpoint picker serves TLS by default, as
//! Gateway API Inference Extension gateways expect, and the API port optionally.
//!
//! The certificate comes from PEM files (`--epp-tls-cert`/`--epp-tls-key`, `--tls-cert`/
//! `--tls-key`, e.g. a mounted Secret) and is read again when they change, so a renewed Secret
//! applies without a restart (a broken renewal is logged and the last good certificate stays).
//! Without files the endpoint picker generates a self-signed certificate at start: the gateway's
//! side then skips verification, as the reference picker's does.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// The certificate a listener serves: where it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServingCertificate {
    /// Generated at start, self-signed.
    SelfSigned,
    /// PEM files, polled for changes.
    Files { cert: PathBuf, key: PathBuf },
}

/// How often certificate files are checked for changes.
const POLL: Duration = Duration::from_secs(5);

/// A TLS acceptor for `certificate`, offering `alpn` (e.g. `h2`). With files, a task on the current
/// runtime reloads them when they change, for as long as the acceptor lives.
pub fn acceptor(certificate: &ServingCertificate, alpn: &[&[u8]]) -> Result<TlsAcceptor, String> {
    let first = match certificate {
        ServingCertificate::SelfSigned => self_signed()?,
        ServingCertificate::Files { cert, key } => read(cert, key)?,
    };
    let resolver = Arc::new(Resolver(RwLock::new(Arc::new(first))));
    if let ServingCertificate::Files { cert, key } = certificate {
        tokio::spawn(reload(Arc::downgrade(&resolver), cert.clone(), key.clone()));
    }
    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The certificate in force, swapped on reload.
#[derive(Debug)]
struct Resolver(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// A certificate and key from PEM files.
fn read(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| format!("TLS certificate {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "TLS certificate {}: no certificate in it",
            cert.display()
        ));
    }
    let key =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("TLS key {}: {e}", key.display()))?;
    certified(chain, key)
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, String> {
    let key = default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("TLS key: {e}"))?;
    let certified = CertifiedKey::new(chain, key);
    certified
        .keys_match()
        .map_err(|e| format!("TLS certificate and key do not match: {e}"))?;
    Ok(certified)
}

/// A self-signed certificate for the pod's host name and `localhost`.
fn self_signed() -> Result<CertifiedKey, String> {
    let mut names = vec!["localhost".to_string()];
    if let Ok(host) = std::env::var("HOSTNAME") {
        if !host.is_empty() {
            names.push(host);
        }
    }
    let generated = rcgen::generate_simple_self_signed(names)
        .map_err(|e| format!("generating a self-signed TLS certificate: {e}"))?;
    let key = PrivateKeyDer::try_from(generated.signing_key.serialize_der())
        .map_err(|e| format!("generating a self-signed TLS certificate: {e}"))?;
    certified(vec![generated.cert.der().clone()], key)
}

/// Reads the files again when their bytes change, while the acceptor lives.
async fn reload(resolver: std::sync::Weak<Resolver>, cert: PathBuf, key: PathBuf) {
    let contents = || (std::fs::read(&cert).ok(), std::fs::read(&key).ok());
    let mut last = contents();
    loop {
        tokio::time::sleep(POLL).await;
        let Some(resolver) = resolver.upgrade() else {
            return;
        };
        let now = contents();
        if now == last {
            continue;
        }
        last = now;
        match read(&cert, &key) {
            Ok(certified) => {
                *resolver.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(certified);
                tracing::info!(cert = %cert.display(), "TLS certificate reloaded");
            }
            Err(error) => tracing::warn!(
                %error,
                "the changed TLS certificate or key is refused; the last good one stays"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_is_made_and_a_mismatched_key_refused() {
        assert!(self_signed().is_ok());
        let one = rcgen::generate_simple_self_signed(vec!["a".into()]).unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["b".into()]).unwrap();
        let key = PrivateKeyDer::try_from(other.signing_key.serialize_der()).unwrap();
        let error = certified(vec![one.cert.der().clone()], key).unwrap_err();
        assert!(error.contains("do not match"), "{error}");
    }

    #[test]
    fn files_that_are_missing_or_empty_are_refused_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        assert!(read(&cert, &key).unwrap_err().contains("tls.crt"));
        std::fs::write(&cert, "").unwrap();
        std::fs::write(&key, "").unwrap();
        assert!(read(&cert, &key).unwrap_err().contains("no certificate"));
    }
}
