//! Test helpers: fixture paths, a tiny fake API server over plain HTTP or rustls, and an
//! rcgen PKI. Loopback only; every server thread ends when its handle is dropped.
//!
//! Compiled for the unit tests only (`#[cfg(test)]` on the module in `kube/mod.rs`); the
//! library never contains it. Crate-visible so that the unit tests of the client's callers
//! (the Events recorder) can answer its calls too.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Path of a recorded fixture in the repository: `fixtures/external/NAME` under the crate
/// root (`fixtures/external/SOURCES.md` says where each file comes from).
pub(crate) fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/external")
        .join(name)
}

/// One request as the fake server saw it.
#[derive(Clone, Debug)]
pub(crate) struct Recorded {
    pub method: String,
    /// Path and query, as sent.
    pub target: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    pub(crate) fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
    /// Query parameters, percent-decoded.
    pub(crate) fn query(&self, key: &str) -> Option<String> {
        let q = self.target.split_once('?')?.1;
        q.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == key).then(|| percent_decode(v))
        })
    }
}

pub(crate) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else if b[i] == b'+' {
            out.push(b' ');
            i += 1;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// What the fake server does with one request.
pub(crate) enum Reply {
    /// Answer with this status, extra headers and body.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Close the connection without answering (a reset, for the client).
    Close,
}

impl Reply {
    pub(crate) fn json(status: u16, body: &str) -> Reply {
        Reply::Respond {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.as_bytes().to_vec(),
        }
    }
    pub(crate) fn with_header(mut self, k: &str, v: &str) -> Reply {
        if let Reply::Respond { headers, .. } = &mut self {
            headers.push((k.into(), v.into()));
        }
        self
    }
}

type Handler = dyn Fn(&Recorded, usize) -> Reply + Send + Sync;

/// A fake API server on 127.0.0.1. The handler gets each request and its 0-based index.
pub(crate) struct FakeServer {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeServer {
    /// Plain HTTP.
    pub(crate) fn http(
        handler: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static,
    ) -> FakeServer {
        Self::start(None, Arc::new(handler))
    }

    /// HTTPS with the given rustls server configuration.
    pub(crate) fn https(
        cfg: Arc<rustls::ServerConfig>,
        handler: impl Fn(&Recorded, usize) -> Reply + Send + Sync + 'static,
    ) -> FakeServer {
        Self::start(Some(cfg), Arc::new(handler))
    }

    fn start(tls: Option<Arc<rustls::ServerConfig>>, handler: Arc<Handler>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (reqs, stop2) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(tcp) = conn else { continue };
                tcp.set_read_timeout(Some(Duration::from_secs(10))).ok();
                // One thread per connection: clients keep pooled connections open.
                let (tls, handler, reqs) = (tls.clone(), handler.clone(), reqs.clone());
                std::thread::spawn(move || match tls {
                    None => serve_conn(tcp, &handler, &reqs),
                    Some(cfg) => {
                        if let Ok(sc) = rustls::ServerConnection::new(cfg) {
                            serve_conn(rustls::StreamOwned::new(sc, tcp), &handler, &reqs);
                        }
                    }
                });
            }
        });
        FakeServer {
            addr,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client of this (plain HTTP) server in namespace `ns` that retries as `retry` says,
    /// its other options at their defaults.
    pub(crate) fn client(
        &self,
        ns: &str,
        retry: crate::kube::RetryPolicy,
    ) -> crate::kube::KubeClient {
        let cfg = crate::kube::ClusterConfig::for_server(&self.url(), ns);
        let options = crate::kube::ClientOptions {
            retry,
            ..Default::default()
        };
        crate::kube::KubeClient::with_options(cfg, options).unwrap()
    }

    pub(crate) fn recorded(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves requests on one connection until the client closes it (keep-alive).
fn serve_conn<S: Read + Write>(stream: S, handler: &Arc<Handler>, log: &Mutex<Vec<Recorded>>) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return;
        };
        let (method, target) = (method.to_string(), target.to_string());
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let rec = Recorded {
            method,
            target,
            headers,
            body,
        };
        let index = {
            let mut l = log.lock().unwrap();
            l.push(rec.clone());
            l.len() - 1
        };
        match handler(&rec, index) {
            Reply::Close => return,
            Reply::Respond {
                status,
                headers,
                body,
            } => {
                let mut head = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n", body.len());
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let w = reader.get_mut();
                if w.write_all(head.as_bytes()).is_err()
                    || w.write_all(&body).is_err()
                    || w.flush().is_err()
                {
                    return;
                }
            }
        }
    }
}

/// A throwaway CA that issues server and client certificates.
pub(crate) struct Pki {
    pub ca_pem: String,
    pub ca_der: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A certificate with its PKCS#8 key.
pub(crate) struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: Vec<u8>,
}

impl Pki {
    pub(crate) fn new(cn: &str) -> Pki {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.self_signed(&key).unwrap();
        Pki {
            ca_pem: cert.pem(),
            ca_der: cert.der().clone(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    fn issue(&self, names: &[&str], eku: rcgen::ExtendedKeyUsagePurpose) -> Issued {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.extended_key_usages = vec![eku];
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            names.first().copied().unwrap_or("client"),
        );
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }

    pub(crate) fn server(&self, names: &[&str]) -> Issued {
        self.issue(names, rcgen::ExtendedKeyUsagePurpose::ServerAuth)
    }

    pub(crate) fn client(&self, cn: &str) -> Issued {
        self.issue(&[cn], rcgen::ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A rustls server config presenting `server`; with `client_ca`, client certificates
    /// issued by that CA are required.
    pub(crate) fn server_config(
        server: &Issued,
        client_ca: Option<&Pki>,
    ) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(ca.ca_der.clone()).unwrap();
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
        };
        let cfg = builder
            .with_single_cert(
                vec![server.cert_der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server.key_der.clone())),
            )
            .unwrap();
        Arc::new(cfg)
    }
}
