//! A benchmark server that is never the bottleneck: it serves one namespace's PodList pages
//! over HTTPS (HTTP/1.1 keep-alive), every page encoded once up front and held in memory both
//! as JSON and gzip-compressed, so a request costs a lookup and a write.
//!
//! It pages like kube-apiserver: `limit` cuts the list into pages of that many pods, each page
//! but the last carries `metadata.continue` (an opaque token) and `remainingItemCount`, and
//! `continue=TOKEN` returns the next page. Without `limit` (or with `--ignore-limit`, as
//! kube-apiserver does for a `resourceVersion=0` list served from its watch cache) the whole
//! list is one response. A body over 128 KiB is gzip-compressed (level 1) when the request's
//! `Accept-Encoding` names gzip, which is kube-apiserver's rule. The label selector is not
//! evaluated: every pod in the file is served.
//!
//! ```text
//! cargo run --release -p podalloc-sim --example pageserver -- \
//!     --pods pods.jsonl --write-kubeconfig kc.json
//! ```
//!
//! `--pods`: one pod per line (JSON). `--pods-pb FILE`: the same pods, in the same order, as
//! kube-apiserver encodes them in Protobuf (each a `v1.Pod` message behind a 4-byte
//! big-endian length): then a request whose `Accept` names
//! `application/vnd.kubernetes.protobuf` gets the same pages in Protobuf (`k8s\0` +
//! `runtime.Unknown` + `v1.PodList`, the same continue tokens), as kube-apiserver answers
//! client-go. Prints `serving https://127.0.0.1:PORT` once it listens; `--write-kubeconfig` writes a kubeconfig (CA, bearer token) for it, and
//! `PATH-nogzip` with `disable-compression: true`.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// kube-apiserver compresses bodies above this size (`defaultGzipThresholdBytes`).
const GZIP_THRESHOLD: usize = 128 * 1024;

/// One encoded response.
struct Body {
    json: Vec<u8>,
    gzip: Vec<u8>,
}

/// The list cut at one `limit`: page bodies (JSON, and Protobuf when the pods are given so)
/// and the token → page index map.
struct Pages {
    pages: Vec<Body>,
    protobuf: Vec<Body>,
    tokens: HashMap<String, usize>,
}

struct Server {
    pods: Vec<Vec<u8>>,
    /// The same pods as `v1.Pod` Protobuf messages (empty: JSON only).
    pb_pods: Vec<Vec<u8>>,
    names: Vec<String>,
    ignore_limit: bool,
    /// Pages by limit (0 = everything in one), encoded on first use.
    cache: Mutex<HashMap<usize, Arc<Pages>>>,
}

/// A Protobuf field `num` of wire type 2 (length-delimited) holding `data`, appended to `out`.
fn pb_field(out: &mut Vec<u8>, num: u64, data: &[u8]) {
    pb_varint(out, num << 3 | 2);
    pb_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

fn pb_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A Protobuf page as kube-apiserver writes one: `k8s\0`, then `runtime.Unknown` {typeMeta
/// {v1, PodList}, raw = `v1.PodList` {ListMeta {selfLink "", resourceVersion, continue,
/// remainingItemCount}, items}, contentEncoding "", contentType ""}.
fn pb_page(items: &[Vec<u8>], token: &str, remaining: Option<usize>) -> Vec<u8> {
    let mut meta = Vec::new();
    pb_field(&mut meta, 1, b"");
    pb_field(&mut meta, 2, b"1000");
    pb_field(&mut meta, 3, token.as_bytes());
    if let Some(r) = remaining {
        pb_varint(&mut meta, 4 << 3);
        pb_varint(&mut meta, r as u64);
    }
    let mut list = Vec::new();
    pb_field(&mut list, 1, &meta);
    for item in items {
        pb_field(&mut list, 2, item);
    }
    let mut type_meta = Vec::new();
    pb_field(&mut type_meta, 1, b"v1");
    pb_field(&mut type_meta, 2, b"PodList");
    let mut out = b"k8s\0".to_vec();
    pb_field(&mut out, 1, &type_meta);
    pb_field(&mut out, 2, &list);
    pb_field(&mut out, 3, b"");
    pb_field(&mut out, 4, b"");
    out
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1));
    e.write_all(data).expect("in memory");
    e.finish().expect("in memory")
}

impl Server {
    fn pages(&self, limit: usize) -> Arc<Pages> {
        let limit = if self.ignore_limit || limit == 0 {
            self.pods.len().max(1)
        } else {
            limit
        };
        if let Some(p) = self.cache.lock().unwrap().get(&limit) {
            return Arc::clone(p);
        }
        let chunks: Vec<&[Vec<u8>]> = if self.pods.is_empty() {
            vec![&[]]
        } else {
            self.pods.chunks(limit).collect()
        };
        let mut pages = Vec::new();
        let mut protobuf = Vec::new();
        let mut tokens = HashMap::new();
        let mut done = 0;
        for (i, chunk) in chunks.iter().enumerate() {
            let first = done;
            done += chunk.len();
            let mut meta = r#"{"resourceVersion":"1000""#.to_string();
            let mut pb_token = (String::new(), None);
            if i + 1 < chunks.len() {
                // A token shaped like the apiserver's: base64 of its JSON continue key.
                let key = format!(
                    r#"{{"v":"meta.k8s.io/v1","rv":1000,"start":"{}\u0000"}}"#,
                    self.names[done - 1]
                );
                let token = base64::engine::general_purpose::STANDARD.encode(key);
                meta.push_str(&format!(
                    r#","continue":"{token}","remainingItemCount":{}"#,
                    self.pods.len() - done
                ));
                pb_token = (token.clone(), Some(self.pods.len() - done));
                tokens.insert(token, i + 1);
            }
            if !self.pb_pods.is_empty() {
                let items = &self.pb_pods[first..done];
                let pb = pb_page(items, &pb_token.0, pb_token.1);
                let gz = gzip(&pb);
                protobuf.push(Body { json: pb, gzip: gz });
            }
            meta.push('}');
            let mut json =
                format!(r#"{{"kind":"PodList","apiVersion":"v1","metadata":{meta},"items":["#)
                    .into_bytes();
            for (j, pod) in chunk.iter().enumerate() {
                if j > 0 {
                    json.push(b',');
                }
                json.extend_from_slice(pod);
            }
            json.extend_from_slice(b"]}\n");
            let gz = gzip(&json);
            pages.push(Body { json, gzip: gz });
        }
        let p = Arc::new(Pages {
            pages,
            protobuf,
            tokens,
        });
        self.cache.lock().unwrap().insert(limit, Arc::clone(&p));
        p
    }

    /// The pages and the page index for one request target, or an error status and body.
    fn answer(&self, target: &str) -> Result<(Arc<Pages>, usize), (u16, String)> {
        let query = target.split_once('?').map_or("", |(_, q)| q);
        let mut limit = 0;
        let mut cont = None;
        for kv in query.split('&') {
            match kv.split_once('=') {
                Some(("limit", v)) => limit = v.parse().unwrap_or(0),
                Some(("continue", v)) => cont = Some(percent_decode(v)),
                _ => {}
            }
        }
        let pages = self.pages(limit);
        let index = match cont {
            None => 0,
            Some(t) => match pages.tokens.get(&t) {
                Some(&i) => i,
                None => return Err((410, expired())),
            },
        };
        Ok((pages, index))
    }
}

fn expired() -> String {
    r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.","reason":"Expired","code":410}"#.to_string()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn serve(server: &Server, stream: &mut dyn ReadWrite) -> io::Result<()> {
    let mut reader = BufReader::new(ReadHalf(stream));
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let mut gzip_ok = false;
        let mut protobuf_ok = false;
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((name, value)) = h.split_once(':') {
                if name.eq_ignore_ascii_case("accept-encoding") {
                    gzip_ok = value.split(',').any(|v| v.trim().starts_with("gzip"));
                } else if name.eq_ignore_ascii_case("accept") {
                    protobuf_ok = value.contains("application/vnd.kubernetes.protobuf");
                } else if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        io::copy(&mut (&mut reader).take(length as u64), &mut io::sink())?;
        let w = reader.get_mut().0.as_mut_write();
        match server.answer(&target) {
            Ok((pages, i)) => {
                let pb = protobuf_ok && !pages.protobuf.is_empty();
                let (body, ctype) = match pb {
                    true => (&pages.protobuf[i], "application/vnd.kubernetes.protobuf"),
                    false => (&pages.pages[i], "application/json"),
                };
                let gz = gzip_ok && body.json.len() > GZIP_THRESHOLD;
                let data = if gz { &body.gzip } else { &body.json };
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\n{}Content-Length: {}\r\n\r\n",
                    if gz {
                        "Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n"
                    } else {
                        ""
                    },
                    data.len()
                );
                w.write_all(head.as_bytes())?;
                w.write_all(data)?;
            }
            Err((code, msg)) => {
                let head = format!(
                    "HTTP/1.1 {code} Gone\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    msg.len()
                );
                w.write_all(head.as_bytes())?;
                w.write_all(msg.as_bytes())?;
            }
        }
        w.flush()?;
    }
}

trait ReadWrite: Read + Write {
    fn as_mut_write(&mut self) -> &mut dyn Write;
}
impl<T: Read + Write> ReadWrite for T {
    fn as_mut_write(&mut self) -> &mut dyn Write {
        self
    }
}
struct ReadHalf<'a>(&'a mut dyn ReadWrite);
impl Read for ReadHalf<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

fn tls_config() -> (Arc<rustls::ServerConfig>, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "pageserver-ca");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let srv = rcgen::CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let cert = srv.signed_by(&key, &issuer).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    (Arc::new(cfg), ca_cert.pem())
}

fn kubeconfig(url: &str, ca_pem: &str, nogzip: bool) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut cluster = serde_json::json!({"server": url, "certificate-authority-data": ca});
    if nogzip {
        cluster["disable-compression"] = true.into();
    }
    serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": cluster}],
        "users": [{"name": "bench", "user": {"token": "bench-token"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench", "namespace": "default"}}],
    })
    .to_string()
}

/// Length-prefixed records (a 4-byte big-endian length, then that many bytes).
fn read_records(mut b: &[u8]) -> io::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let (len, rest) = b
            .split_at_checked(4)
            .ok_or_else(|| io::Error::other("cut record"))?;
        let n = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        let (rec, rest) = rest
            .split_at_checked(n)
            .ok_or_else(|| io::Error::other("cut record"))?;
        out.push(rec.to_vec());
        b = rest;
    }
    Ok(out)
}

fn main() -> io::Result<()> {
    let mut pods_file = None;
    let mut pb_file = None;
    let mut kubeconfig_path = None;
    let mut ignore_limit = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pods" => pods_file = args.next(),
            "--pods-pb" => pb_file = args.next(),
            "--write-kubeconfig" => kubeconfig_path = args.next(),
            "--ignore-limit" => ignore_limit = true,
            _ => {
                eprintln!("usage: pageserver --pods FILE.jsonl [--pods-pb FILE] [--ignore-limit] [--write-kubeconfig PATH]");
                std::process::exit(2);
            }
        }
    }
    let file = std::fs::File::open(pods_file.expect("--pods is required"))?;
    let mut pods = Vec::new();
    let mut names = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&line).map_err(io::Error::other)?;
        names.push(v["metadata"]["name"].as_str().unwrap_or("").to_string());
        pods.push(serde_json::to_vec(&v).map_err(io::Error::other)?);
    }
    let pb_pods = match pb_file {
        Some(f) => read_records(&std::fs::read(f)?)?,
        None => Vec::new(),
    };
    if !pb_pods.is_empty() && pb_pods.len() != pods.len() {
        return Err(io::Error::other(format!(
            "--pods-pb holds {} pods, --pods {}: they must be the same pods",
            pb_pods.len(),
            pods.len()
        )));
    }
    let server = Arc::new(Server {
        pods,
        pb_pods,
        names,
        ignore_limit,
        cache: Mutex::new(HashMap::new()),
    });
    let (tls, ca_pem) = tls_config();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("https://{}", listener.local_addr()?);
    if let Some(p) = kubeconfig_path {
        std::fs::write(&p, kubeconfig(&url, &ca_pem, false))?;
        std::fs::write(format!("{p}-nogzip"), kubeconfig(&url, &ca_pem, true))?;
    }
    println!("serving {url}");
    io::stdout().flush()?;
    for conn in listener.incoming() {
        let tcp: TcpStream = match conn {
            Ok(c) => c,
            Err(_) => continue,
        };
        let server = Arc::clone(&server);
        let tls = Arc::clone(&tls);
        std::thread::spawn(move || {
            let _ = tcp.set_nodelay(true);
            let Ok(conn) = rustls::ServerConnection::new(tls) else {
                return;
            };
            let mut stream = rustls::StreamOwned::new(conn, tcp);
            let _ = serve(&server, &mut stream);
        });
    }
    Ok(())
}
