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
    /// Kept to sign client certificates.
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
    /// certificate chaining to one of them (mutual TLS), or, with `optional`, may present
    /// one (it is verified if they do); without, none is asked for.
    pub(crate) fn server_config(
        &self,
        client_roots: Option<&[CertificateDer<'static>]>,
        optional: bool,
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
                let mut vb = WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider);
                if optional {
                    vb = vb.allow_unauthenticated();
                }
                let verifier = vb.build().map_err(err)?;
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
    pub(crate) fn ca_der(&self) -> &CertificateDer<'static> {
        &self.ca_der
    }

    /// Issues a client certificate for `common_name`; returns (certificate PEM, key PEM).
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

/// Reads one DER TLV: (tag, contents, rest). Definite lengths up to 4 bytes only.
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let first = *b.get(1)?;
    let (len, head) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | usize::from(*b.get(2 + i)?);
        }
        (len, 2 + n)
    };
    let end = head.checked_add(len)?;
    if end > b.len() {
        return None;
    }
    Some((tag, &b[head..end], &b[end..]))
}

/// The subject's common name (OID 2.5.4.3) of an X.509 certificate: the user name the
/// apiserver's x509 authenticator takes from a client certificate.
pub(crate) fn subject_common_name(der: &[u8]) -> Option<String> {
    let (_, cert, _) = tlv(der)?;
    let (_, tbs, _) = tlv(cert)?;
    let mut rest = tbs;
    if let Some((0xA0, _, r)) = tlv(rest) {
        rest = r; // [0] version
    }
    // serialNumber, signature, issuer, validity
    for _ in 0..4 {
        rest = tlv(rest)?.2;
    }
    let (_, mut rdns, _) = tlv(rest)?;
    let mut cn = None;
    while !rdns.is_empty() {
        let (_, set, r) = tlv(rdns)?;
        rdns = r;
        let mut atvs = set;
        while !atvs.is_empty() {
            let (_, atv, r) = tlv(atvs)?;
            atvs = r;
            let (tag, oid, value) = tlv(atv)?;
            if tag == 0x06 && oid == [0x55, 0x04, 0x03] {
                cn = Some(String::from_utf8_lossy(tlv(value)?.1).into_owned());
            }
        }
    }
    cn
}

/// Parses the certificates of a PEM bundle.
pub(crate) fn parse_pem_certs(pem: &str) -> io::Result<Vec<CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject as _;
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("client_ca: {e}")))?;
    if certs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "client_ca: no CERTIFICATE block in the PEM text",
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_name_of_generated_certificates() {
        let pki = Pki::generate(&[]).unwrap();
        let (crt, _) = pki.issue_client_cert("system:node:worker-1").unwrap();
        let der = parse_pem_certs(&crt).unwrap();
        assert_eq!(
            subject_common_name(der[0].as_ref()).as_deref(),
            Some("system:node:worker-1")
        );
        assert_eq!(
            subject_common_name(pki.ca_der().as_ref()).as_deref(),
            Some("podalloc-sim-ca")
        );
        assert_eq!(subject_common_name(b"\x30\x03\x02\x01"), None);
        assert!(parse_pem_certs("nothing here").is_err());
    }
}
