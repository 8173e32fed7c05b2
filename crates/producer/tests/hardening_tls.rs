//! TLS (docs/behaviour.md §9), as the real binary on loopback: the endpoint picker serves TLS
//! by default (a self-signed certificate, ALPN h2, gRPC health over it); certificate files are
//! served and read again when they change; `--epp-plaintext` serves h2c; `--tls-cert` serves the
//! API over TLS. Every loop is bounded; deadlines are generous.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{endpoints, Binary, PATIENCE};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

fn config_file(dir: &Path) -> String {
    let path = dir.join("config.yaml");
    std::fs::write(&path, endpoints(2)).unwrap();
    path.to_str().unwrap().to_string()
}

/// Accepts any certificate, as a gateway does for the picker's self-signed one; the test checks
/// which certificate it got itself.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A TLS client that accepts any certificate and offers `alpn`.
fn connector(alpn: &[&[u8]]) -> TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

/// A TLS handshake with `address`: the stream, the certificate served and the protocol agreed.
async fn handshake(
    address: &str,
    alpn: &[&[u8]],
) -> (TlsStream<TcpStream>, Vec<u8>, Option<Vec<u8>>) {
    let tcp = TcpStream::connect(address).await.unwrap();
    let tls = tokio::time::timeout(
        PATIENCE,
        connector(alpn).connect(ServerName::try_from("localhost").unwrap(), tcp),
    )
    .await
    .expect("a handshake in time")
    .expect("a TLS handshake");
    let (_, session) = tls.get_ref();
    let certificate = session.peer_certificates().expect("a certificate")[0].to_vec();
    let protocol = session.alpn_protocol().map(<[u8]>::to_vec);
    (tls, certificate, protocol)
}

/// Connects a gRPC channel over TLS (any certificate accepted, ALPN h2).
#[derive(Clone)]
struct TlsConnect(String);

impl tonic::codegen::Service<http::Uri> for TlsConnect {
    type Response = hyper_util::rt::TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let address = self.0.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect(&address).await?;
            let tls = connector(&[b"h2"])
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        })
    }
}

/// gRPC health of `service` on a channel; errors as they come.
async fn health(
    channel: tonic::transport::Channel,
    service: &str,
) -> Result<ServingStatus, tonic::Status> {
    let mut client = HealthClient::new(channel);
    let request = HealthCheckRequest {
        service: service.to_string(),
    };
    tokio::time::timeout(PATIENCE, client.check(request))
        .await
        .expect("an answer in time")
        .map(|r| r.into_inner().status())
}

/// gRPC health of `service` until it answers (the status task starts with the server).
async fn health_when_up(channel: tonic::transport::Channel, service: &str) -> ServingStatus {
    let started = Instant::now();
    loop {
        match health(channel.clone(), service).await {
            Ok(status) => return status,
            Err(status) => assert!(started.elapsed() < PATIENCE, "{service}: {status:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_picker_serves_tls_by_default_with_h2_and_grpc_health() {
    let dir = tempfile::tempdir().unwrap();
    let producer = Binary::serve(&["--config", &config_file(dir.path())]);
    let (_, certificate, protocol) = handshake(&producer.epp, &[b"h2"]).await;
    assert_eq!(protocol.as_deref(), Some(&b"h2"[..]));
    // Generated at start, for localhost (its subject alternative name holds the bare name).
    assert!(
        certificate
            .windows(b"localhost".len())
            .any(|w| w == b"localhost"),
        "no localhost in the certificate"
    );

    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(TlsConnect(producer.epp.clone()))
        .await
        .unwrap();
    for service in [
        "liveness",
        "readiness",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ] {
        assert_eq!(
            health_when_up(channel.clone(), service).await,
            ServingStatus::Serving,
            "{service}"
        );
    }
    // Plaintext HTTP/2 to the TLS port gets nothing.
    let plaintext = tonic::transport::Endpoint::from_shared(format!("http://{}", producer.epp))
        .unwrap()
        .connect_timeout(PATIENCE)
        .connect()
        .await;
    if let Ok(plaintext) = plaintext {
        assert!(health(plaintext, "liveness").await.is_err());
    }
}

/// A certificate for localhost, as PEM (certificate, key) and its DER.
fn certificate() -> (String, String, Vec<u8>) {
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    (
        generated.cert.pem(),
        generated.signing_key.serialize_pem(),
        generated.cert.der().to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_files_are_served_and_read_again_when_they_change() {
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let (cert, key, first) = certificate();
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    let producer = Binary::serve(&[
        "--config",
        &config_file(dir.path()),
        "--epp-tls-cert",
        cert_path.to_str().unwrap(),
        "--epp-tls-key",
        key_path.to_str().unwrap(),
    ]);
    let (_, served, _) = handshake(&producer.epp, &[b"h2"]).await;
    assert_eq!(served, first, "the file's certificate is served");

    // A renewed Secret: both files change; within a few polls (5 s) the new one is served.
    let (cert, key, second) = certificate();
    std::fs::write(&key_path, key).unwrap();
    std::fs::write(&cert_path, cert).unwrap();
    let started = Instant::now();
    loop {
        let (_, served, _) = handshake(&producer.epp, &[b"h2"]).await;
        if served == second {
            break;
        }
        assert_eq!(served, first);
        assert!(
            started.elapsed() < PATIENCE,
            "the renewed certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(producer.logs().contains("TLS certificate reloaded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epp_plaintext_serves_h2c_and_tls_cert_serves_the_api_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("api.crt"), dir.path().join("api.key"));
    let (cert, key, der) = certificate();
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    let producer = Binary::serve(&[
        "--config",
        &config_file(dir.path()),
        "--epp-plaintext",
        "--tls-cert",
        cert_path.to_str().unwrap(),
        "--tls-key",
        key_path.to_str().unwrap(),
    ]);
    let plaintext = tonic::transport::Endpoint::from_shared(format!("http://{}", producer.epp))
        .unwrap()
        .connect()
        .await
        .unwrap();
    assert_eq!(
        health_when_up(plaintext, "readiness").await,
        ServingStatus::Serving
    );

    // The API over TLS, with the file's certificate; HTTP/1.1 on it.
    let api = producer.base.trim_start_matches("http://").to_string();
    let (mut tls, served, protocol) = handshake(&api, &[b"http/1.1"]).await;
    assert_eq!(served, der);
    assert_eq!(protocol.as_deref(), Some(&b"http/1.1"[..]));
    tls.write_all(b"GET /v1/endpoints HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, tls.read_to_end(&mut answer))
        .await
        .expect("an answer in time")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("ns/p1-rank-0"), "{answer}");

    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = reqwest::Client::builder()
        .timeout(PATIENCE)
        .build()
        .unwrap()
        .get(format!("{}/v1/endpoints", producer.base))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
}
