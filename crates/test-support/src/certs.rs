//! The certificates and keys kube-apiserver needs: a CA, a serving certificate for 127.0.0.1
//! (and, for in-cluster clients, the node's address and the `kubernetes` Service's names) signed
//! by it, and the key pair that signs service-account tokens.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use std::net::{IpAddr, Ipv4Addr};

/// PEM and DER material, all ECDSA P-256 (kube-apiserver accepts ES256 for service-account tokens).
pub(crate) struct Pki {
    pub ca_cert_pem: String,
    pub ca_cert_der: Vec<u8>,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub service_account_key_pem: String,
    pub service_account_public_pem: String,
}

/// `extra_ips` and `extra_names`: more subject alternative names of the serving certificate.
pub(crate) fn generate(extra_ips: &[IpAddr], extra_names: &[&str]) -> Result<Pki, rcgen::Error> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "burst-prefix test CA");
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut serving_params = CertificateParams::new(vec!["localhost".to_owned()])?;
    serving_params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    for ip in extra_ips {
        serving_params
            .subject_alt_names
            .push(SanType::IpAddress(*ip));
    }
    for name in extra_names {
        serving_params
            .subject_alt_names
            .push(SanType::DnsName((*name).try_into()?));
    }
    serving_params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving_params.use_authority_key_identifier_extension = true;
    let serving_key = KeyPair::generate()?;
    let serving_cert = serving_params.signed_by(&serving_key, &issuer)?;

    let service_account_key = KeyPair::generate()?;

    Ok(Pki {
        ca_cert_pem: ca_cert.pem(),
        ca_cert_der: ca_cert.der().to_vec(),
        serving_cert_pem: serving_cert.pem(),
        serving_key_pem: serving_key.serialize_pem(),
        service_account_key_pem: service_account_key.serialize_pem(),
        service_account_public_pem: service_account_key.public_key_pem(),
    })
}
