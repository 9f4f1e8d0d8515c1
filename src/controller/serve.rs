//! `--metrics-bind-address` and `--health-probe-bind-address`: the endpoints a platform
//! scrapes and probes, as controller-runtime serves them (its `metrics.bindAddress` and
//! `healthProbeBindAddress`). Both are opt-in; the `--metrics-file` textfile stays for cron.
//!
//! - `GET /metrics` (on the metrics address): Prometheus text format 0.0.4, the textfile's
//!   metric names, one series per app (`app`, `namespace` labels: target, executors by
//!   state, ticks, API errors by code, leadership), families merged across apps so each
//!   `# HELP`/`# TYPE` appears once; and the process's API requests by verb, resource and
//!   code (`podalloc_api_requests_total`, no app labels: one client serves every app), and
//!   for `apps` its leadership (no app labels: one Lease for every app). The texts are
//!   rendered at the end of a tick, but the leader-election samples are answered as the
//!   election says at the moment of the scrape ([`Probe::follow_leadership`]): a leader
//!   that loses its Lease at rest says `podalloc_is_leader 0` at once, not at its next tick.
//! - `GET /healthz` (liveness, on the probe address): 200 `ok` while the loop has finished a
//!   pass (a tick, or a standby's look at the Lease) within its stuck limit, else 500 naming
//!   how long it has been. A loop stuck past its watchdog is what a kubelet should restart.
//! - `GET /readyz` (readiness): 200 once a pass has reached the API server with the state
//!   loaded (or, for a standby, the Lease read), 503 before that and while shutting down.
//!
//! No thread of their own: the loop answers them. Its wait between ticks is a `poll(2)` on
//! the listeners and their connections ([`Probe::wait`]), and every API request the loop
//! makes is preceded by a look at them ([`Probe::nap`]), so a probe is answered while the
//! loop waits and between its requests. Each connection is non-blocking and bounded: a
//! request head of at most [`MAX_HEAD`] bytes (431 past it), no request body (413), at most
//! [`MAX_CONNECTIONS`] open (one more closes the quietest), [`READ_TIMEOUT`] to send a
//! request and [`WRITE_TIMEOUT`] to take an answer, [`REQUESTS_PER_PASS`] requests answered
//! per connection per pass. A slow or hostile client therefore holds neither another
//! client's answer nor the loop (`tests/endpoints.rs`, the hostile clients).

use crate::sync::lock;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the endpoints report, updated by the loop: cheap to clone (one `Arc`).
#[derive(Clone)]
pub(crate) struct Probe {
    inner: Arc<Mutex<Live>>,
    /// The endpoints' sockets, once [`start`] has bound them.
    server: Arc<Mutex<Server>>,
}

struct Live {
    /// Per app (key `namespace/app`): the latest rendered exposition text of that app.
    metrics: BTreeMap<String, String>,
    /// When the loop last finished a pass (or started, before the first).
    last_pass: Instant,
    /// Liveness fails once no pass has finished for this long.
    stuck_after: Duration,
    /// Why the process is not ready (`None`: ready).
    not_ready: Option<String>,
    /// The election's leadership now ([`Probe::follow_leadership`]), asked at every
    /// `/metrics` answer; `None` without an election.
    leadership: Option<Leadership>,
}

/// Whether this process leads now and how many times that changed (the election's
/// `LeaderElection::live`): the leader-election series `/metrics` answers with.
pub(crate) type Leadership = Arc<dyn Fn() -> (bool, u64) + Send + Sync>;

impl Probe {
    /// A probe for a loop whose passes may take up to `stuck_after` apart before liveness
    /// fails (the caller's watchdog limit plus its longest sleep); not ready yet.
    pub(crate) fn new(stuck_after: Duration) -> Probe {
        Probe {
            inner: Arc::new(Mutex::new(Live {
                metrics: BTreeMap::new(),
                last_pass: Instant::now(),
                stuck_after,
                not_ready: Some("no pass has reached the API server yet".into()),
                leadership: None,
            })),
            server: Arc::default(),
        }
    }

    /// Replaces app `namespace/app`'s exposition text (as `metrics::render` makes it);
    /// both empty: the process's own series.
    pub(crate) fn set_app_metrics(&self, namespace: &str, app: &str, text: String) {
        let key = if namespace.is_empty() && app.is_empty() {
            String::new()
        } else {
            format!("{namespace}/{app}")
        };
        lock(&self.inner).metrics.insert(key, text);
    }

    /// The loop finished a pass; `ready`: it reached the API server with its state loaded
    /// (`Err` says why not, for `/readyz`).
    pub(crate) fn pass_finished(&self, ready: Result<(), String>) {
        let mut l = lock(&self.inner);
        l.last_pass = Instant::now();
        l.not_ready = ready.err();
    }

    /// The process's own series (`metrics::render_requests`), for `/metrics` beside the
    /// apps' (under the empty key, which sorts before every `namespace/app`: the process's
    /// families first).
    pub(crate) fn set_process_metrics(&self, text: String) {
        self.set_app_metrics("", "", text);
    }

    /// Answers `/metrics` with the leader-election series of `leadership`, asked at that
    /// moment ([`crate::controller::metrics::with_leadership`] on every text), not with
    /// those the texts were rendered with at their last tick: a leader that stops acting
    /// (its Lease lost or taken) says `podalloc_is_leader 0` from then on, and a standby
    /// that takes over says 1, although neither ticks until its next tick is due.
    pub(crate) fn follow_leadership(&self, leadership: Leadership) {
        lock(&self.inner).leadership = Some(leadership);
    }

    /// The loop is alive (a wait between ticks ended): liveness only, readiness unchanged.
    pub(crate) fn alive(&self) {
        lock(&self.inner).last_pass = Instant::now();
    }

    /// The process is shutting down: not ready from now on.
    pub(crate) fn stopping(&self) {
        lock(&self.inner).not_ready = Some("shutting down".into());
    }

    /// Waits at most `max` for a connection or a request to the endpoints (a `poll(2)` on
    /// the listeners and their connections), answers what came, and returns: after the
    /// first batch answered, or once `max` has passed, or on a signal. Without endpoints
    /// bound it sleeps `max`.
    pub(crate) fn wait(&self, max: Duration) {
        let mut s = lock(&self.server);
        if s.listeners.is_empty() {
            drop(s);
            std::thread::sleep(max);
            return;
        }
        let timeout = s.timeout(Instant::now(), max);
        let ready = s.poll(timeout);
        s.serve(&ready, &self.inner);
    }

    /// Waits `d` in all, answering the endpoints meanwhile ([`Probe::wait`]). `d` zero
    /// (between two API requests): answers what is there now without waiting, unless
    /// another thread is answering them.
    pub(crate) fn nap(&self, d: Duration) {
        if d.is_zero() {
            if let Ok(mut s) = self.server.try_lock() {
                if !s.listeners.is_empty() {
                    let ready = s.poll(Duration::ZERO);
                    s.serve(&ready, &self.inner);
                }
            }
            return;
        }
        let end = Instant::now() + d;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            self.wait(left);
        }
    }
}

/// The answer to `GET path`: (HTTP status, body, content type).
fn answer(l: &Live, path: &str) -> (u16, String, &'static str) {
    match path.split('?').next().unwrap_or("") {
        "/metrics" => {
            let body = match l.leadership.as_ref().map(|now| now()) {
                None => merge_families(l.metrics.values().map(String::as_str)),
                Some(now) => {
                    let live = |t: &String| crate::controller::metrics::with_leadership(t, now);
                    let texts: Vec<String> = l.metrics.values().map(live).collect();
                    merge_families(texts.iter().map(String::as_str))
                }
            };
            (200, body, "text/plain; version=0.0.4; charset=utf-8")
        }
        "/healthz" | "/livez" => {
            let age = l.last_pass.elapsed();
            if age <= l.stuck_after {
                (200, "ok\n".into(), TEXT)
            } else {
                let msg = format!(
                    "the loop has not finished a pass for {:.0}s (stuck after {}s)\n",
                    age.as_secs_f64(),
                    l.stuck_after.as_secs()
                );
                (500, msg, TEXT)
            }
        }
        "/readyz" => match &l.not_ready {
            None => (200, "ok\n".into(), TEXT),
            Some(why) => (503, format!("not ready: {why}\n"), TEXT),
        },
        _ => (
            404,
            "not found: try /metrics, /healthz or /readyz\n".into(),
            TEXT,
        ),
    }
}

/// Prometheus text of several renderings merged by family: a family's `# HELP` and `# TYPE`
/// lines once, then every sample of it from every text, identical samples once (the leader
/// series every app's text carries). Families keep their first-seen order.
pub(crate) fn merge_families<'a>(texts: impl Iterator<Item = &'a str>) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut fams: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for text in texts {
        let mut current = String::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let meta = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "));
            if let Some(rest) = meta {
                current = rest.split(' ').next().unwrap_or("").to_string();
            }
            let entry = fams.entry(current.clone()).or_insert_with(|| {
                order.push(current.clone());
                (Vec::new(), Vec::new())
            });
            let list = if meta.is_some() {
                &mut entry.0
            } else {
                &mut entry.1
            };
            if !list.iter().any(|l| l == line) {
                list.push(line.to_string());
            }
        }
    }
    let mut out = String::new();
    for name in &order {
        let (meta, samples) = &fams[name];
        for l in meta.iter().chain(samples) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Starts the endpoints the flags ask for (`metrics`: `--metrics-bind-address`, `probes`:
/// `--health-probe-bind-address`; a bare `:PORT` listens on every address), with a
/// liveness limit of `stuck_after`; `None` when neither is given. The [`Probe`] returned
/// feeds them and answers them ([`Probe::wait`]; the process's services keep it).
///
/// Errors: an address that cannot be bound, naming its flag.
pub(crate) fn serve(
    metrics: Option<&str>,
    probes: Option<&str>,
    stuck_after: Duration,
) -> Result<Option<(Endpoints, Probe)>, String> {
    if metrics.is_none() && probes.is_none() {
        return Ok(None);
    }
    let any = |a: &str| match a.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => a.to_string(),
    };
    let (m, p) = (metrics.map(any), probes.map(any));
    let probe = Probe::new(stuck_after);
    let e = start(m.as_deref(), p.as_deref(), &probe)?;
    for (at, serves) in &e.bound {
        log::info!(
            "serving http://{at} ({}, {})",
            serves.paths(),
            serves.flags()
        );
    }
    Ok(Some((e, probe)))
}

/// The endpoints' listening sockets; dropping this closes them and their connections.
pub(crate) struct Endpoints {
    server: Arc<Mutex<Server>>,
    /// The addresses bound (a port 0 in the flag becomes the port the system chose), with
    /// what each serves.
    bound: Vec<(SocketAddr, Serves)>,
}

impl Drop for Endpoints {
    fn drop(&mut self) {
        let mut s = lock(&self.server);
        s.listeners.clear();
        s.conns.clear();
    }
}

/// Binds a listener for each address given, answered by `probe`'s [`Probe::wait`]:
/// `metrics` serves `/metrics`, `probes` serves `/healthz` and `/readyz` (the same address
/// for both serves all three).
///
/// Errors: an address that cannot be bound (in use, not local, malformed), naming the flag.
pub(crate) fn start(
    metrics: Option<&str>,
    probes: Option<&str>,
    probe: &Probe,
) -> Result<Endpoints, String> {
    // One address given twice is one listener for all three paths (port 0, "any free
    // port", is two).
    let same = metrics.is_some_and(|m| !m.ends_with(":0")) && metrics == probes;
    let wanted = [
        (metrics, "--metrics-bind-address", Serves::Metrics),
        (
            probes.filter(|_| !same),
            "--health-probe-bind-address",
            Serves::Probes,
        ),
    ];
    let mut bound = Vec::new();
    let mut listeners = Vec::new();
    for (addr, flag, mut serves) in wanted {
        let Some(addr) = addr else { continue };
        if same {
            serves = Serves::All;
        }
        let cannot = |err: std::io::Error| format!("{flag} {addr:?}: cannot listen there: {err}");
        let l = TcpListener::bind(addr).map_err(cannot)?;
        l.set_nonblocking(true).map_err(cannot)?;
        bound.push((l.local_addr().map_err(cannot)?, serves));
        listeners.push((l, serves));
    }
    lock(&probe.server).listeners.extend(listeners);
    Ok(Endpoints {
        server: Arc::clone(&probe.server),
        bound,
    })
}

/// Which paths one listener answers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Serves {
    Metrics,
    Probes,
    All,
}

impl Serves {
    /// The paths, for the line that says where they are served.
    fn paths(self) -> &'static str {
        match self {
            Serves::Metrics => "/metrics",
            Serves::Probes => "/healthz, /livez, /readyz",
            Serves::All => "/metrics, /healthz, /livez, /readyz",
        }
    }

    /// The flags that asked for them.
    fn flags(self) -> &'static str {
        match self {
            Serves::Metrics => "--metrics-bind-address",
            Serves::Probes => "--health-probe-bind-address",
            Serves::All => "--metrics-bind-address and --health-probe-bind-address",
        }
    }
}

/// The most bytes of a request's line and headers; a longer head is answered 431 and its
/// connection closed, so a header that never ends costs at most this much memory.
pub(crate) const MAX_HEAD: usize = 8 * 1024;

/// The most headers one request may carry (then 431).
const MAX_HEADERS: usize = 32;

/// The most connections open at once; one more closes the connection that has been quiet
/// longest, so a flood of connections can neither exhaust the process's descriptors nor keep
/// a fresh client out.
pub(crate) const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send a whole request head, counted from its accept or
/// its last answer (a silent half-request, an idle keep-alive): then it is closed.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an answer may take to be written (a client that sends and never reads): then the
/// connection is closed.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The most requests of one connection answered per pass, so a pipelining client cannot hold
/// the loop; the rest wait for the next pass (which then does not sleep).
const REQUESTS_PER_PASS: usize = 8;

/// The listeners and their open connections: a non-blocking server the loop drives from its
/// wait ([`Probe::wait`]) and between its API requests ([`Probe::nap`]).
#[derive(Default)]
struct Server {
    listeners: Vec<(TcpListener, Serves)>,
    conns: Vec<Conn>,
}

/// One client connection: the request head read so far, the answer being written.
struct Conn {
    stream: TcpStream,
    serves: Serves,
    /// Bytes received and not yet answered (at most [`MAX_HEAD`] once a head is incomplete).
    head: Vec<u8>,
    /// The answer being written, and how much of it is written.
    out: Vec<u8>,
    sent: usize,
    /// Close once `out` is written.
    close_after: bool,
    /// When it must next make progress (a whole request, or the answer written).
    deadline: Instant,
    /// Its last progress (the connection quiet longest is closed first at the cap).
    active: Instant,
}

/// What [`Conn::step`] left the connection as.
#[derive(PartialEq, Eq)]
enum Left {
    Open,
    Closed,
}

impl Conn {
    fn new(stream: TcpStream, serves: Serves, now: Instant) -> Conn {
        Conn {
            stream,
            serves,
            head: Vec::new(),
            out: Vec::new(),
            sent: 0,
            close_after: false,
            deadline: now + READ_TIMEOUT,
            active: now,
        }
    }

    /// Whether an answer is still being written.
    fn writing(&self) -> bool {
        self.sent < self.out.len()
    }

    /// Whether a whole request is buffered already (the next pass must not sleep).
    fn ready(&self) -> bool {
        !self.writing() && !self.head.is_empty() && parse(&self.head).is_some()
    }

    /// Writes what it can of the answer, answers the requests it has, reads what is there,
    /// without blocking: at most [`REQUESTS_PER_PASS`] requests and [`MAX_HEAD`] bytes.
    fn step(&mut self, live: &Mutex<Live>, now: Instant) -> Left {
        let mut answered = 0;
        loop {
            if self.writing() {
                match self.stream.write(&self.out[self.sent..]) {
                    Ok(0) => return Left::Closed,
                    Ok(n) => self.sent += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Left::Open,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => return Left::Closed,
                }
                self.active = now;
                if self.writing() {
                    continue;
                }
                if self.close_after {
                    return Left::Closed;
                }
                (self.out, self.sent) = (Vec::new(), 0);
                self.deadline = now + READ_TIMEOUT;
            }
            if answered == REQUESTS_PER_PASS {
                return Left::Open;
            }
            if let Some(request) = parse(&self.head) {
                answered += 1;
                self.answer(request, live, now);
                continue;
            }
            if self.head.len() >= MAX_HEAD {
                let body = format!("request line and headers over {MAX_HEAD} bytes\n");
                self.reply(431, &body, TEXT, false, now);
                self.close_after = true;
                continue;
            }
            if self.read() == Left::Closed {
                return Left::Closed;
            }
            if parse(&self.head).is_none() && self.head.len() < MAX_HEAD {
                return Left::Open;
            }
        }
    }

    /// Reads what has arrived, up to [`MAX_HEAD`] bytes buffered; `Closed` on the end of
    /// the stream or an error; `Open` otherwise (also when nothing was there).
    fn read(&mut self) -> Left {
        let mut chunk = [0u8; 2048];
        let room = (MAX_HEAD - self.head.len()).min(chunk.len());
        match self.stream.read(&mut chunk[..room]) {
            Ok(0) => Left::Closed,
            Ok(n) => {
                self.head.extend_from_slice(&chunk[..n]);
                Left::Open
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                Left::Open
            }
            Err(_) => Left::Closed,
        }
    }

    /// Answers the parsed request at the front of `head` and drops it from there.
    fn answer(&mut self, request: Parsed, live: &Mutex<Live>, now: Instant) {
        let Parsed {
            len,
            method,
            path,
            keep_alive,
            body,
        } = request;
        self.head.drain(..len);
        let (code, text, ctype, keep) = match request_answer(&method, &path, body, self.serves) {
            Err((code, text)) => (code, text, TEXT, keep_alive && code != 400 && code != 413),
            Ok(()) => {
                let (code, text, ctype) = answer(&lock(live), &path);
                (code, text, ctype, keep_alive)
            }
        };
        let text = if method == "HEAD" {
            String::new()
        } else {
            text
        };
        self.reply(code, &text, ctype, keep, now);
        self.close_after = !keep;
    }

    /// Queues an answer (`keep`: the connection stays open after it).
    fn reply(&mut self, code: u16, body: &str, ctype: &str, keep: bool, now: Instant) {
        self.out = response(code, body, ctype, keep).into_bytes();
        self.sent = 0;
        self.deadline = now + WRITE_TIMEOUT;
        self.active = now;
    }
}

/// A request head parsed from the front of a buffer.
struct Parsed {
    /// The head's length in bytes.
    len: usize,
    method: String,
    path: String,
    /// HTTP/1.1 without `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`.
    keep_alive: bool,
    /// It announces a body (`Content-Length` other than 0, or `Transfer-Encoding`); `None`
    /// for a malformed `Content-Length`.
    body: Option<bool>,
}

/// The request head at the front of `buf`: `None` while incomplete; a malformed one is a
/// `Parsed` with an empty method (answered 400). Bounded by [`MAX_HEADERS`] (more: 431).
fn parse(buf: &[u8]) -> Option<Parsed> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let bad = |len, method: &str| {
        Some(Parsed {
            len,
            method: method.into(),
            path: String::new(),
            keep_alive: false,
            body: Some(false),
        })
    };
    let len = match req.parse(buf) {
        Ok(httparse::Status::Partial) => return None,
        Ok(httparse::Status::Complete(len)) => len,
        Err(httparse::Error::TooManyHeaders) => return bad(buf.len(), "TOO-MANY-HEADERS"),
        Err(_) => return bad(buf.len(), ""),
    };
    let header = |name: &str| {
        req.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
            .next()
    };
    let connection = header("connection").unwrap_or_default();
    let keep_alive = match req.version {
        Some(1) => !connection.contains("close"),
        _ => connection.contains("keep-alive"),
    };
    let body = match content_length(req.headers) {
        _ if header("transfer-encoding").is_some() => Some(true),
        Ok(n) => Some(n.is_some_and(|n| n > 0)),
        Err(()) => None,
    };
    Some(Parsed {
        len,
        method: req.method.unwrap_or("").to_string(),
        path: req.path.unwrap_or("").to_string(),
        keep_alive,
        body,
    })
}

/// The body length the `Content-Length` headers give (`None`: none). Several headers, or a
/// list in one, are one length only when every value is the same (RFC 9112 §6.3: differing
/// values are unrecoverable, answered 400 and the connection closed, since another reader
/// of the same bytes may take the other length); `Err` for differing or malformed values.
fn content_length(headers: &[httparse::Header<'_>]) -> Result<Option<u64>, ()> {
    let values = (headers.iter())
        .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
        .flat_map(|h| h.value.split(|&b| b == b','));
    let mut length = None;
    for v in values {
        let n = std::str::from_utf8(v).map_err(drop)?.trim();
        let n = match n.bytes().all(|b| b.is_ascii_digit()) {
            true => n.parse::<u64>().map_err(drop)?,
            false => return Err(()),
        };
        if length.is_some_and(|l| l != n) {
            return Err(());
        }
        length = Some(n);
    }
    Ok(length)
}

const TEXT: &str = "text/plain; charset=utf-8";

/// Whether a request is one the endpoints answer: `Err` is the refusal (code, body).
fn request_answer(
    method: &str,
    path: &str,
    body: Option<bool>,
    serves: Serves,
) -> Result<(), (u16, String)> {
    match (method, body) {
        ("TOO-MANY-HEADERS", _) => {
            return Err((431, format!("more than {MAX_HEADERS} headers\n")));
        }
        ("", _) | (_, None) => return Err((400, "malformed request\n".into())),
        (_, Some(true)) => {
            return Err((413, "the endpoints take no request body\n".into()));
        }
        ("GET" | "HEAD", _) => {}
        _ => return Err((405, "only GET\n".into())),
    }
    let allowed = match serves {
        Serves::All => true,
        Serves::Metrics => path.starts_with("/metrics"),
        Serves::Probes => !path.starts_with("/metrics"),
    };
    match allowed {
        true => Ok(()),
        false => Err((404, "not served on this address\n".into())),
    }
}

/// An HTTP/1.1 response with a body of `body`'s length.
fn response(code: u16, body: &str, ctype: &str, keep: bool) -> String {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Service Unavailable",
    };
    let connection = if keep { "keep-alive" } else { "close" };
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Connection: {connection}\r\n\r\n{body}",
        body.len()
    )
}

impl Server {
    /// How long a wait of at most `max` may sleep: not past a connection's deadline, not at
    /// all while a connection has a whole request buffered.
    fn timeout(&self, now: Instant, max: Duration) -> Duration {
        let mut t = max;
        for c in &self.conns {
            t = t.min(c.deadline.saturating_duration_since(now));
            if c.ready() {
                return Duration::ZERO;
            }
        }
        t
    }

    /// Serves after a poll: `ready` holds the poll's answer for each listener, then each
    /// connection, in [`Server::poll_fds`]'s order.
    fn serve(&mut self, ready: &[bool], live: &Mutex<Live>) {
        let now = Instant::now();
        let (on_listeners, on_conns) = ready.split_at(self.listeners.len().min(ready.len()));
        let mut i = 0;
        self.conns.retain_mut(|c| {
            let woke = on_conns.get(i).copied().unwrap_or(false);
            i += 1;
            if now >= c.deadline {
                log::debug!("endpoint connection closed: no request or answer in time");
                return false;
            }
            !(woke || c.ready()) || c.step(live, now) == Left::Open
        });
        for (k, &woke) in on_listeners.iter().enumerate() {
            if woke {
                self.accept(k, live, now);
            }
        }
    }

    /// Accepts what listener `k` has waiting (at most [`MAX_CONNECTIONS`] per pass), closing
    /// the quietest connection for each one over the cap, and reads each new one at once.
    fn accept(&mut self, k: usize, live: &Mutex<Live>, now: Instant) {
        for _ in 0..MAX_CONNECTIONS {
            let (stream, serves) = match self.listeners[k].0.accept() {
                Ok((s, _)) => (s, self.listeners[k].1),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // EMFILE and the like: the connection stays queued; try next pass.
                    log::debug!("endpoint: cannot accept a connection: {e}");
                    return;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            if self.conns.len() >= MAX_CONNECTIONS {
                let quietest = (0..self.conns.len()).min_by_key(|&i| self.conns[i].active);
                if let Some(i) = quietest {
                    log::debug!(
                        "endpoint: {MAX_CONNECTIONS} connections open: closing the quietest"
                    );
                    self.conns.swap_remove(i);
                }
            }
            let mut c = Conn::new(stream, serves, now);
            if c.step(live, now) == Left::Open {
                self.conns.push(c);
            }
        }
    }
}

impl Server {
    /// One `poll(2)` of the listeners (readable: a connection to accept) and connections
    /// (readable, or writable while an answer is being written) for at most `timeout`:
    /// whether each woke, listeners first. Interrupted by a signal: none woke.
    fn poll(&self, timeout: Duration) -> Vec<bool> {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let conns = self.conns.iter().map(|c| {
            let want = if c.writing() {
                PollFlags::OUT
            } else {
                PollFlags::IN
            };
            PollFd::new(&c.stream, want)
        });
        let mut fds: Vec<PollFd<'_>> = (self.listeners.iter())
            .map(|(l, _)| PollFd::new(l, PollFlags::IN))
            .chain(conns)
            .collect();
        let ts = Timespec {
            tv_sec: timeout.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: timeout.subsec_nanos().into(),
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(_) => fds.iter().map(|f| !f.revents().is_empty()).collect(),
            Err(_) => vec![false; fds.len()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `GET path` from another thread while this one answers, as the loop does.
    fn get(probe: &Probe, addr: SocketAddr, path: &str) -> (u16, String) {
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                let mut r = agent.get(format!("http://{addr}{path}")).call().unwrap();
                let code = r.status().as_u16();
                (code, r.body_mut().read_to_string().unwrap())
            });
            while !h.is_finished() {
                probe.wait(Duration::from_millis(10));
            }
            h.join().unwrap()
        })
    }

    #[test]
    fn families_merge_across_apps_with_one_help_and_type_each() {
        let a = "# HELP m x\n# TYPE m gauge\nm{app=\"a\"} 1\n# HELP l y\n# TYPE l gauge\nl 1\n";
        let b = "# HELP m x\n# TYPE m gauge\nm{app=\"b\"} 2\n# HELP l y\n# TYPE l gauge\nl 1\n";
        let got = merge_families([a, b].into_iter());
        assert_eq!(
            got,
            "# HELP m x\n# TYPE m gauge\nm{app=\"a\"} 1\nm{app=\"b\"} 2\n# HELP l y\n# TYPE l gauge\nl 1\n"
        );
    }

    #[test]
    fn probes_answer_ready_live_and_stuck() {
        let probe = Probe::new(Duration::from_millis(300));
        let e = start(Some("127.0.0.1:0"), Some("127.0.0.1:0"), &probe).unwrap();
        let (m, p) = (e.bound[0].0, e.bound[1].0);
        assert_eq!(get(&probe, p, "/healthz"), (200, "ok\n".into()));
        let (code, body) = get(&probe, p, "/readyz");
        assert_eq!(code, 503, "{body}");
        probe.set_app_metrics(
            "ns",
            "a",
            "# HELP m x\n# TYPE m gauge\nm{app=\"a\"} 1\n".into(),
        );
        probe.pass_finished(Ok(()));
        assert_eq!(get(&probe, p, "/readyz"), (200, "ok\n".into()));
        assert!(get(&probe, m, "/metrics").1.contains("m{app=\"a\"} 1"));
        assert_eq!(
            get(&probe, m, "/healthz").0,
            404,
            "probes are not on the metrics address"
        );
        assert_eq!(
            get(&probe, p, "/metrics").0,
            404,
            "metrics are not on the probe address"
        );
        std::thread::sleep(Duration::from_millis(400));
        let (code, body) = get(&probe, p, "/healthz");
        assert_eq!(code, 500, "{body}");
        assert!(body.contains("has not finished a pass"), "{body}");
        probe.stopping();
        assert_eq!(get(&probe, p, "/readyz").0, 503);
    }

    #[test]
    fn one_address_for_both_serves_all_and_a_taken_one_names_the_flag() {
        let probe = Probe::new(Duration::from_secs(60));
        let e = start(Some("127.0.0.1:0"), None, &probe).unwrap();
        let addr = e.bound[0].0.to_string();
        let err = start(None, Some(&addr), &probe).err().unwrap();
        assert!(err.starts_with("--health-probe-bind-address"), "{err}");
        drop(e);
        let both = start(Some("127.0.0.1:0"), Some("127.0.0.1:0"), &probe).unwrap();
        assert_eq!(both.bound.len(), 2);
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn heads_say_their_body_and_keep_alive() {
        let p = parse(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET").unwrap();
        assert_eq!((p.method.as_str(), p.path.as_str()), ("GET", "/healthz"));
        assert_eq!((p.len, p.keep_alive, p.body), (34, true, Some(false)));
        let p = parse(b"GET / HTTP/1.1\r\nContent-Length: 100000000000\r\n\r\n").unwrap();
        assert_eq!(p.body, Some(true));
        let p = parse(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n").unwrap();
        assert_eq!(p.body, None, "malformed: 400");
        // RFC 9112 §6.3: differing lengths are a 400, the same one repeated is that length.
        for two in [
            &b"Content-Length: 0\r\nContent-Length: 24\r\n"[..],
            b"Content-Length: 0, 24\r\n",
            b"Content-Length: 0\r\nContent-Length: +0\r\n",
            b"Content-Length: 0,\r\n",
        ] {
            let head = [&b"GET / HTTP/1.1\r\n"[..], two, b"\r\n"].concat();
            let p = parse(&head).unwrap();
            assert_eq!(p.body, None, "{}", String::from_utf8_lossy(two));
        }
        let p = parse(b"GET / HTTP/1.1\r\nContent-Length: 0\r\ncontent-length: 0, 0\r\n\r\n");
        assert_eq!(p.unwrap().body, Some(false));
        let p = parse(b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        assert_eq!(p.body, Some(true));
        let p = parse(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(!p.keep_alive);
        let p = parse(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
        assert!(!p.keep_alive);
        assert!(parse(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").is_none());
        assert_eq!(parse(b"\x00\x01 nonsense\r\n\r\n").unwrap().method, "");
    }

    #[test]
    fn refusals_name_their_reason() {
        let ok = request_answer("GET", "/healthz", Some(false), Serves::Probes);
        assert!(ok.is_ok());
        let code = |m, p, b, s| request_answer(m, p, b, s).unwrap_err().0;
        assert_eq!(code("GET", "/healthz", Some(true), Serves::All), 413);
        assert_eq!(code("POST", "/healthz", Some(false), Serves::All), 405);
        assert_eq!(code("GET", "/metrics", Some(false), Serves::Probes), 404);
        assert_eq!(code("GET", "/healthz", Some(false), Serves::Metrics), 404);
        assert_eq!(code("TOO-MANY-HEADERS", "", Some(false), Serves::All), 431);
        let r = response(200, "ok\n", TEXT, true);
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\nok\n"),
            "{r}"
        );
        assert!(
            r.contains("Content-Length: 3\r\nConnection: keep-alive"),
            "{r}"
        );
    }
}
