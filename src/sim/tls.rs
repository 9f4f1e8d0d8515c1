//! The simulator's PKI: a fresh CA generated at start-up (rcgen, ECDSA P-256) and a
//! server certificate it signs for `127.0.0.1`, `localhost` and `::1`, served through a
//! rustls `ServerConfig` on the ring provider.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

fn err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("simulator TLS setup: {e}"))
}

/// The generated CA and server certificate.
pub(crate) struct Pki {
    /// The CA certificate, PEM (what clients put in `--certificate-authority`).
    pub ca_pem: String,
    ca_der: CertificateDer<'static>,
    /// Kept to sign more certificates (client certificates, in tests today).
    #[cfg_attr(not(test), allow(dead_code))]
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: Vec<u8>,
}

impl Pki {
    /// Generates a CA and a server certificate valid for the loopback names plus
    /// `extra_ips` (the listen address when it is neither loopback nor unspecified).
    pub(crate) fn generate(extra_ips: &[IpAddr]) -> io::Result<Pki> {
        let ca_key = rcgen::KeyPair::generate().map_err(err)?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name = rcgen::DistinguishedName::new();
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "podalloc-sim-ca");
        ca.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
        let issuer = rcgen::Issuer::new(ca, ca_key);

        let mut names = vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            "::1".to_string(),
        ];
        names.extend(extra_ips.iter().map(IpAddr::to_string));
        let server_key = rcgen::KeyPair::generate().map_err(err)?;
        let mut srv = rcgen::CertificateParams::new(names).map_err(err)?;
        srv.distinguished_name = rcgen::DistinguishedName::new();
        srv.distinguished_name
            .push(rcgen::DnType::CommonName, "podalloc-sim-apiserver");
        srv.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let srv_cert = srv.signed_by(&server_key, &issuer).map_err(err)?;
        Ok(Pki {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().clone(),
            issuer,
            server_chain: vec![srv_cert.der().clone()],
            server_key: server_key.serialize_der(),
        })
    }

    /// A rustls server configuration. With `client_roots`, clients must present a
    /// certificate chaining to one of them (mutual TLS); without, none is asked for.
    pub(crate) fn server_config(
        &self,
        client_roots: Option<&[CertificateDer<'static>]>,
    ) -> io::Result<Arc<ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(err)?;
        let builder = match client_roots {
            None => builder.with_no_client_auth(),
            Some(roots) => {
                let mut store = RootCertStore::empty();
                for r in roots {
                    store.add(r.clone()).map_err(err)?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider)
                        .build()
                        .map_err(err)?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key.clone()));
        let mut cfg = builder
            .with_single_cert(self.server_chain.clone(), key)
            .map_err(err)?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// The CA certificate (DER), e.g. as the root for client certificates.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn ca_der(&self) -> &CertificateDer<'static> {
        &self.ca_der
    }

    /// Issues a client certificate for `common_name`; returns (certificate PEM, key PEM).
    #[cfg(test)]
    pub(crate) fn issue_client_cert(&self, common_name: &str) -> io::Result<(String, String)> {
        let key = rcgen::KeyPair::generate().map_err(err)?;
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &self.issuer).map_err(err)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}
