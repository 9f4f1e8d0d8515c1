//! The server's plumbing: binding, the TLS set-up, the threads (one accepting, one per
//! connection with HTTP/1.1 keep-alive, one for the kubelet) and their shutdown. Each
//! request goes to `api::handle`.

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustls::pki_types::CertificateDer;

use super::options::SimOptions;
use super::shared::{relock, Shared};
use super::store::{Store, StoreConfig};
use super::util::{invalid_input, WallClock};
use super::{api, faults, http, reqlog, status, tls};

/// How long an idle keep-alive connection is kept open.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a blocked write to a client may take before the connection is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// A started server: its shared state, base URL, CA PEM and PKI (the last two with TLS).
pub(crate) struct Started {
    pub shared: Arc<Shared>,
    pub url: String,
    pub ca_pem: Option<String>,
    pub pki: Option<tls::Pki>,
}

/// Binds `opts.listen`, generates the PKI (with `tls`), writes `ca_out` and starts the
/// threads. Errors: see `SimServer::start`.
pub(crate) fn start(opts: &SimOptions) -> io::Result<Started> {
    let client_roots = check_options(opts)?;
    let listener = TcpListener::bind(opts.listen)?;
    let addr = listener.local_addr()?;
    let host_ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let wake_addr = SocketAddr::new(host_ip, addr.port());
    let (tls, ca_pem, pki) = setup_tls(opts, addr, client_roots)?;
    let scheme = if opts.tls { "https" } else { "http" };
    let url = match host_ip {
        IpAddr::V4(ip) => format!("{scheme}://{ip}:{}", addr.port()),
        IpAddr::V6(ip) => format!("{scheme}://[{ip}]:{}", addr.port()),
    };
    let shared = Arc::new(Shared {
        store: Mutex::new(new_store(opts)),
        kubelet: Condvar::new(),
        token: opts.token.clone(),
        requests: AtomicU64::new(0),
        faults: Mutex::new(faults::FaultState::new(opts.faults.clone(), opts.seed)),
        forbid: opts.forbid.clone(),
        latency: opts.latency,
        log: Mutex::new(reqlog::RequestLog::new()),
        users: opts.users.clone(),
        cuts: Mutex::new(HashMap::new()),
        tls,
        stopping: AtomicBool::new(false),
        stopped: Mutex::new(false),
        stopped_cv: Condvar::new(),
        conns: Mutex::new(HashMap::new()),
        next_conn: AtomicU64::new(0),
        threads: Mutex::new(Vec::new()),
        wake_addr,
    });
    let acceptor = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("sim-accept".into())
            .spawn(move || accept_loop(&shared, listener))?
    };
    relock(&shared.threads).push(acceptor);
    let kubelet = {
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("sim-kubelet".into())
            .spawn(move || kubelet_loop(&shared))
    };
    match kubelet {
        Ok(h) => relock(&shared.threads).push(h),
        Err(e) => {
            shared.shutdown();
            return Err(e);
        }
    }
    log::info!("sim: serving the pods API at {url}");
    Ok(Started {
        shared,
        url,
        ca_pem,
        pki,
    })
}

impl Shared {
    /// Stops the server: wakes and joins the acceptor and the kubelet, closes and joins
    /// every connection (idempotent; a second caller waits for the first).
    pub(crate) fn shutdown(&self) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            self.wait_stopped(None);
            return;
        }
        // Wake the acceptor blocked in accept(); if that fails it is left detached.
        let woke = TcpStream::connect_timeout(&self.wake_addr, Duration::from_secs(1)).is_ok();
        {
            let store = relock(&self.store);
            self.kubelet.notify_all();
            // Open watches end now, so the connection threads below can be joined.
            store.feed().stop();
        }
        let threads: Vec<JoinHandle<()>> = std::mem::take(&mut *relock(&self.threads));
        for (i, h) in threads.into_iter().enumerate() {
            // Thread 0 is the acceptor.
            if i > 0 || woke {
                let _ = h.join();
            }
        }
        let conns: Vec<(TcpStream, Option<JoinHandle<()>>)> =
            relock(&self.conns).drain().map(|(_, c)| c).collect();
        for (s, _) in &conns {
            let _ = s.shutdown(Shutdown::Both);
        }
        for (_, h) in conns {
            if let Some(h) = h {
                let _ = h.join();
            }
        }
        *relock(&self.stopped) = true;
        self.stopped_cv.notify_all();
    }

    /// Waits until stopped, at most `timeout`; true when stopped.
    pub(crate) fn wait_stopped(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut g = relock(&self.stopped);
        while !*g {
            match deadline {
                None => g = self.stopped_cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    g = self
                        .stopped_cv
                        .wait_timeout(g, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        true
    }
}

fn write_atomically(path: &std::path::Path, contents: &str) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
    tmp.write_all(contents.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Checks the settings `SimServer::start` cannot take (`InvalidInput`) and parses
/// `client_ca`: its certificates, if given.
fn check_options(opts: &SimOptions) -> io::Result<Option<Vec<CertificateDer<'static>>>> {
    if !(0.0..=1.0).contains(&opts.failure_rate) {
        return Err(invalid_input(format!(
            "failure_rate must be within [0, 1], got {}",
            opts.failure_rate
        )));
    }
    for r in &opts.faults {
        r.validate()
            .map_err(|e| invalid_input(format!("fault rule \"{r}\": {e}")))?;
    }
    for v in &opts.forbid {
        faults::check_verb(v).map_err(|e| invalid_input(format!("forbid: {e}")))?;
    }
    let client_certs = opts.client_ca.is_some() || opts.require_client_cert;
    if client_certs && !opts.tls {
        return Err(invalid_input(
            "client certificates (client_ca, require_client_cert) need tls".to_string(),
        ));
    }
    match &opts.client_ca {
        Some(pem) => Ok(Some(tls::parse_pem_certs(pem)?)),
        None => Ok(None),
    }
}

/// The server's TLS set-up (with `opts.tls`): a fresh PKI whose server certificate also
/// names `addr`'s IP when it is neither loopback nor unspecified, the CA written to
/// `ca_out`, and client certificates checked against `client_roots` (or the simulator's
/// own CA with `require_client_cert`). Returns the rustls config, the CA PEM and the PKI;
/// all `None` for plain HTTP.
fn setup_tls(
    opts: &SimOptions,
    addr: SocketAddr,
    client_roots: Option<Vec<CertificateDer<'static>>>,
) -> io::Result<TlsSetup> {
    if !opts.tls {
        if opts.ca_out.is_some() {
            log::warn!("sim: ca_out is ignored without TLS");
        }
        return Ok((None, None, None));
    }
    let extra: Vec<IpAddr> = [addr.ip()]
        .into_iter()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .collect();
    let pki = tls::Pki::generate(&extra)?;
    if let Some(path) = &opts.ca_out {
        write_atomically(path, &pki.ca_pem)?;
    }
    let roots = match client_roots {
        Some(r) => Some(r),
        None if opts.require_client_cert => Some(vec![pki.ca_der().clone()]),
        None => None,
    };
    let optional = opts.client_cert_optional && !opts.require_client_cert;
    let cfg = pki.server_config(roots.as_deref(), optional)?;
    Ok((Some(cfg), Some(pki.ca_pem.clone()), Some(pki)))
}

/// What [`setup_tls`] returns: the rustls server config, the CA PEM, the PKI.
type TlsSetup = (
    Option<Arc<rustls::ServerConfig>>,
    Option<String>,
    Option<tls::Pki>,
);

/// The store (pods, ConfigMaps, the kubelet's schedule) `opts` asks for.
fn new_store(opts: &SimOptions) -> Store {
    let cfg = StoreConfig {
        schedule_latency: opts.schedule_latency,
        startup_latency: opts.startup_latency,
        stop_latency: opts.stop_latency,
        failure_rate: opts.failure_rate,
        seed: opts.seed,
        nodes: opts.nodes,
        max_page: opts.max_page,
        continue_ttl: opts.continue_ttl,
        pod_quota: opts.pod_quota,
        startup_jitter: opts.startup_jitter,
        unschedulable_fraction: opts.unschedulable_fraction,
        unschedulable_until: opts.unschedulable_until,
    };
    let mut store = Store::new(cfg, WallClock::new());
    store.set_missing_images(opts.missing_images.clone());
    store.reg.set_namespaces(
        opts.namespaces
            .as_ref()
            .map(|n| n.iter().cloned().collect()),
    );
    store
}

fn accept_loop(shared: &Arc<Shared>, listener: TcpListener) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                log::debug!("sim: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        relock(&shared.conns).insert(id, (clone, None));
        let sh = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("sim-conn".into())
            .spawn(move || {
                serve_connection(&sh, stream);
                relock(&sh.conns).remove(&id);
            });
        match spawned {
            Ok(h) => {
                if let Some(entry) = relock(&shared.conns).get_mut(&id) {
                    entry.1 = Some(h);
                }
            }
            Err(e) => {
                log::warn!("sim: cannot start a connection thread: {e}");
                relock(&shared.conns).remove(&id);
            }
        }
    }
}

fn kubelet_loop(shared: &Shared) {
    let mut store = relock(&shared.store);
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        store.advance(now);
        let wait = store
            .next_due()
            .map_or(Duration::from_secs(1), |d| d.saturating_duration_since(now))
            .min(Duration::from_secs(1));
        store = shared
            .kubelet
            .wait_timeout(store, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

fn serve_connection(shared: &Shared, tcp: TcpStream) {
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_read_timeout(Some(IDLE_TIMEOUT));
    let _ = tcp.set_write_timeout(Some(WRITE_TIMEOUT));
    match &shared.tls {
        Some(cfg) => {
            let conn = match rustls::ServerConnection::new(Arc::clone(cfg)) {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("sim: TLS session setup failed: {e}");
                    return;
                }
            };
            let mut stream = rustls::StreamOwned::new(conn, tcp);
            // Finish the handshake first: the client certificate names the user.
            while stream.conn.is_handshaking() {
                match stream.conn.complete_io(&mut stream.sock) {
                    Ok((0, 0)) => return,
                    Ok(_) => {}
                    Err(e) => {
                        log::debug!("sim: TLS handshake failed: {e}");
                        return;
                    }
                }
            }
            let user = stream
                .conn
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| tls::subject_common_name(c.as_ref()))
                .filter(|cn| !cn.is_empty());
            if serve_http(shared, &mut stream, user.as_deref()) {
                // Abort: no close_notify, as when the server process dies mid-request.
                let _ = stream.sock.shutdown(Shutdown::Both);
                return;
            }
            stream.conn.send_close_notify();
            let _ = stream.flush();
        }
        None => {
            let mut tcp = tcp;
            if serve_http(shared, &mut tcp, None) {
                let _ = tcp.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Serves requests until the connection ends; true when it must be aborted (a fault
/// dropped or truncated a response).
fn serve_http<S: io::Read + Write>(
    shared: &Shared,
    stream: &mut S,
    client_user: Option<&str>,
) -> bool {
    let mut conn = http::Conn::new(stream);
    loop {
        match conn.read_request() {
            Ok(None) => return false,
            Ok(Some(req)) => {
                let resp = match api::handle(shared, &req, client_user) {
                    api::Reply::Send(r) => r,
                    api::Reply::Drop => return true,
                    api::Reply::Truncate(r) => {
                        let _ = http::write_truncated(&mut conn.stream, r);
                        return true;
                    }
                    api::Reply::Trickle(r, every) => {
                        let _ = http::write_trickled(&mut conn.stream, r, every);
                        return false;
                    }
                };
                let keep = req.keep_alive && !shared.stopping.load(Ordering::SeqCst);
                let mut w = BufWriter::with_capacity(64 * 1024, &mut conn.stream);
                let written = http::write_response(&mut w, resp, keep, req.accepts_gzip())
                    .and_then(|()| w.flush());
                if written.is_err() || !keep {
                    return false;
                }
            }
            Err(http::ReadError::Bad(msg)) => {
                log::debug!("sim: malformed request: {msg}");
                let _ = http::write_plain_error(&mut conn.stream, 400);
                return false;
            }
            Err(http::ReadError::TooLarge(413)) => {
                let body = status::ApiError::too_large(http::MAX_BODY).to_json();
                let _ = http::write_response(
                    &mut conn.stream,
                    http::Response::json(413, body),
                    false,
                    false,
                );
                return false;
            }
            Err(http::ReadError::TooLarge(code)) => {
                let _ = http::write_plain_error(&mut conn.stream, code);
                return false;
            }
            Err(http::ReadError::Io(e)) => {
                log::trace!("sim: connection closed: {e}");
                return false;
            }
        }
    }
}
