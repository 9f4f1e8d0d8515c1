//! The blocking HTTPS client under [`super::Api`]: transport over `ureq` + `rustls` (ring).
//!
//! One [`KubeClient`] holds one `ureq::Agent` (connection pool, TLS configuration) for one
//! [`ClusterConfig`]; the agent is rebuilt only when an exec credential plugin hands out a new
//! client certificate. Every call retries transient failures itself (see [`RetryPolicy`]);
//! the caller sees one result per call. The client is `Send + Sync`, so calls may run from
//! several threads at once.

use crate::sync::lock;
use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use ureq::config::AutoHeaderValue;
use ureq::http::{Method, Uri};
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};

use super::config::{is_loopback_host, parse_server, redact_userinfo, ClusterConfig, Credential};
use super::error::{is_retryable_code, ApiStatus, KubeError, TransportKind};
use super::exec::{
    ExecClusterInfo, ExecConfig, ExecCredential, RunningPlugin, DEFAULT_EXEC_TIMEOUT,
};
use super::resolver::KubeResolver;
use super::resource::{Resource, LEASES};
use super::secret::{KeyData, PemData, Secret};
use super::sliced::Hook;

/// The `User-Agent` header: `podalloc/<crate version>`.
pub const USER_AGENT: &str = concat!("podalloc/", env!("CARGO_PKG_VERSION"));

/// Most bytes read from an error response body; the rest is dropped.
const ERROR_BODY_LIMIT: u64 = 1024 * 1024;

/// The message for a server certificate that does not chain to the configured CA.
pub const UNTRUSTED_CERT_MESSAGE: &str =
    "TLS: certificate not trusted; pass --certificate-authority or fix the kubeconfig";

/// HTTP timeouts. A request that hits one fails with a [`KubeError::Transport`] of kind
/// [`TransportKind::Timeout`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP connect plus TLS handshake of one attempt (`--connect-timeout`). Default 10 s.
    pub connect: Duration,
    /// Each single socket read (headers and body). Default 30 s.
    pub per_read: Duration,
    /// The whole call (`--request-timeout`): every attempt, its response body and the
    /// sleeps between retries, like client-go's request timeout, which bounds the call's
    /// context. A server that trickles its body one byte a second, or answers only after
    /// minutes, costs at most this long. Default 30 s.
    pub global: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            per_read: Duration::from_secs(30),
            global: Duration::from_secs(30),
        }
    }
}

/// The default cap of one list page's body after gzip decoding (`--max-page-bytes`) for a
/// sink that holds the page whole: 64 MiB.
pub const DEFAULT_LIST_BODY_LIMIT: u64 = 64 * 1024 * 1024;

/// The default cap of one list page's body after gzip decoding for a sink that decodes it
/// while it arrives ([`PageSink::bounded_memory`]): 4 GiB. Memory does not grow with the
/// page there, so this only bounds how long a gzip bomb of valid-looking JSON can be read; a
/// server that ignores `limit` (kube-apiserver does for a `resourceVersion=0` list served
/// from its watch cache) may send every pod of a namespace in one response, about 5.5 KB
/// per executor pod: 275 MB at 50,000 pods.
pub const DEFAULT_STREAMED_LIST_BODY_LIMIT: u64 = 4 * 1024 * 1024 * 1024;

/// The retry policy inside one call (a per-tick budget is the caller's business).
///
/// Retried: HTTP 429, 500, 502, 503, 504 and transport failures other than TLS. The delay
/// before retry `n` (0-based) is `min(base_delay × 2ⁿ, max_delay)` plus up to 20 % jitter,
/// and at least the server's `Retry-After` (header or `details.retryAfterSeconds`). A call
/// gives up after `max_retries` retries, or when the next sleep would take the client's total
/// retry sleeping past `retry_budget`. Creates are retried too: pod names are deterministic,
/// so a retried create that already happened ends in 409 AlreadyExists, which the caller
/// reads as "possibly created".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries per call after the first attempt. Default 4.
    pub max_retries: u32,
    /// First back-off delay. Default 200 ms.
    pub base_delay: Duration,
    /// Cap of the exponential back-off (a longer `Retry-After` is still honoured). Default 5 s.
    pub max_delay: Duration,
    /// Total sleeping for retries until [`KubeClient::reset_retry_budget`] (called at the
    /// start of every tick). Default 30 s.
    pub retry_budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            retry_budget: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        }
    }
}

/// Everything about a client that is not the connection itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// HTTP timeouts.
    pub timeouts: Timeouts,
    /// Retries inside one call.
    pub retry: RetryPolicy,
    /// Largest list page body, in bytes after gzip decoding (so a gzip bomb stops here), for
    /// a sink that holds the page whole. Default [`DEFAULT_LIST_BODY_LIMIT`] (64 MiB). A page
    /// over the cap is a [`KubeError::Decode`] naming the cap and suggesting a smaller
    /// `--page-size`.
    pub list_body_limit: u64,
    /// The same for a sink that decodes the page while it arrives
    /// ([`PageSink::bounded_memory`]). Default [`DEFAULT_STREAMED_LIST_BODY_LIMIT`] (4 GiB).
    pub streamed_list_body_limit: u64,
    /// Largest body of other successful calls (one pod), in bytes. Default 16 MiB.
    pub body_limit: u64,
    /// Ask for pod lists in Protobuf (`Accept: application/vnd.kubernetes.protobuf`, JSON
    /// the fallback) when the sink decodes it ([`PageSink::accepts_protobuf`]): about half
    /// the API server's CPU per list and 0.4× the client's decode time of JSON
    /// (docs/benchmarks.md). Default `true`; `false` asks for JSON only.
    pub protobuf_lists: bool,
    /// How old a token read from a file may get before it is read again. Default 60 s
    /// (client-go's `NewCachedFileTokenSource` re-reads every minute, as kubelet rotates
    /// projected service account tokens).
    pub token_refresh: Duration,
    /// How long an exec credential plugin may run before it is killed and the call fails.
    /// Default 60 s ([`DEFAULT_EXEC_TIMEOUT`]).
    pub exec_timeout: Duration,
    /// Where the bearer tokens sent are remembered, so that the logger scrubs them from
    /// quoted text (shared with the clients derived from this one). Default: a list of
    /// its own, which nothing reads.
    pub redactions: super::secret::Redactions,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
            list_body_limit: DEFAULT_LIST_BODY_LIMIT,
            streamed_list_body_limit: DEFAULT_STREAMED_LIST_BODY_LIMIT,
            body_limit: 16 * 1024 * 1024,
            protobuf_lists: true,
            token_refresh: Duration::from_secs(60),
            exec_timeout: DEFAULT_EXEC_TIMEOUT,
            redactions: super::secret::Redactions::default(),
        }
    }
}

/// Counters of one client since it was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// HTTP requests sent, retries included.
    pub requests: u64,
    /// Retries (after a transient failure, and the one re-send after a 401 with a re-read
    /// token file or a re-run exec plugin).
    pub retries: u64,
    /// Times an exec credential plugin was run (when the client was built, when its
    /// credential neared expiry, after a 401).
    pub exec_runs: u64,
    /// Response body bytes received, after gzip decoding.
    pub bytes_received: u64,
    /// Responses with HTTP code ≥ 400, by code.
    pub errors_by_code: BTreeMap<u16, u64>,
    /// Every attempt by (verb, resource, code), of this client and of every client derived
    /// from it ([`KubeClient::derive`]: the Lease and Events clients), as kube-apiserver's own
    /// `apiserver_request_total` labels them: the verb is `get`, `list`, `create`,
    /// `update`, `patch` or `delete`, the resource its plural (`pods`), the code the HTTP
    /// status or `<error>` when no HTTP answer came (client-go's `rest_client_requests_total`
    /// convention).
    pub requests_by: RequestCounts,
    /// Requests that got no HTTP answer (connect refused/reset, timeout, TLS).
    pub transport_errors: u64,
    /// Time slept before retries since the client was made or
    /// [`KubeClient::reset_retry_budget`] was last called, counted against
    /// [`RetryPolicy::retry_budget`].
    pub retry_sleep: Duration,
}

/// Result of [`super::Api::delete`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    /// The server accepted the delete (200/202); a pod may still be terminating.
    Deleted,
    /// The object did not exist (404), which an idempotent deleter treats as done.
    NotFound,
}

/// What a [`super::Api::list`] call did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListStats {
    /// Pages fetched, including pages dropped by a restart.
    pub pages: u32,
    /// Body bytes of those pages, after gzip decoding.
    pub bytes: u64,
    /// Restarts from the first page after 410 Gone (expired continue token).
    pub restarts: u32,
}

/// Most restarts of a list after 410 Gone before the error is returned.
pub const MAX_LIST_RESTARTS: u32 = 3;

/// Receives the pages of a paginated list ([`super::Api::list`]) as they arrive.
///
/// A list is a run of [`PageSink::page`] calls; a [`PageSink::restart`] between two pages
/// starts a new run (kube-runtime's watcher calls this event `Init`): everything collected
/// so far belongs to an abandoned list and must be dropped.
pub trait PageSink {
    /// What [`PageSink::page`] fails with; it ends the list and is returned as a
    /// [`KubeError`].
    type Error: Into<KubeError>;

    /// Whether [`PageSink::page_reader`] holds a bounded amount of memory whatever the size
    /// of the page (it decodes the bytes as they arrive). Then a page is capped at
    /// [`ClientOptions::streamed_list_body_limit`] instead of
    /// [`ClientOptions::list_body_limit`]. Default: `false`.
    fn bounded_memory(&self) -> bool {
        false
    }

    /// The list restarts from the first page, because the server expired the continue token
    /// (410 Gone, reason `Expired`). Drop what earlier pages gave.
    fn restart(&mut self);

    /// Whether [`PageSink::page`] and [`PageSink::page_reader`] decode a Protobuf body as
    /// well as JSON: then the list asks for Protobuf, JSON the fallback
    /// ([`ClientOptions::protobuf_lists`]). Default: `false` (JSON only).
    fn accepts_protobuf(&self) -> bool {
        false
    }

    /// One page: the body of a `…List` (`PodList`, …) (JSON or, when
    /// [`PageSink::accepts_protobuf`], Protobuf; gzip already decoded). Returns the page's
    /// `metadata.continue` token; `None` or an empty token means this was the last page.
    ///
    /// Errors: whatever the sink cannot use (e.g. a body that is not a `PodList`); the list
    /// stops there.
    fn page(&mut self, body: &[u8]) -> Result<Option<String>, Self::Error>;

    /// One page, read from `body` while it arrives (gzip already decoded, the body limit
    /// applied). A sink that can decode as the bytes come overrides this, so that neither
    /// the whole page nor a copy of it is ever held; the default reads the whole body and
    /// calls [`PageSink::page`].
    ///
    /// When reading `body` fails, the client reports that failure (and may send the request
    /// again), whatever this returns: so a sink must then keep nothing of the page. The
    /// default returns `Ok(None)` without calling `page`.
    fn page_reader(&mut self, body: &mut dyn Read) -> Result<Option<String>, Self::Error> {
        let mut buf = Vec::new();
        match body.read_to_end(&mut buf) {
            Ok(_) => self.page(&buf),
            Err(_) => Ok(None),
        }
    }
}

/// A body reader that counts bytes and keeps its first error, so that the client can tell a
/// failed read (a transport error, retryable) from a sink that rejects what it read.
struct Watched<'r> {
    inner: &'r mut dyn Read,
    bytes: u64,
    error: Option<std::io::Error>,
}

impl Read for Watched<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(e) = &self.error {
            return Err(std::io::Error::new(e.kind(), e.to_string()));
        }
        match self.inner.read(buf) {
            Ok(n) => {
                self.bytes += n as u64;
                Ok(n)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                let copy = std::io::Error::new(e.kind(), e.to_string());
                self.error = Some(e);
                Err(copy)
            }
        }
    }
}

/// Size of the chunks [`read_ahead`] hands over, and how many may wait.
const READ_AHEAD_CHUNK: usize = 64 * 1024;
const READ_AHEAD_CHUNKS: usize = 4;

/// Runs `handle` on `body` in this thread. Returns the bytes handed to `handle` and the
/// first read error. For a body that is not gzip-encoded: receiving it is then mostly
/// copying, and a second thread ([`read_ahead`]) costs more in hand-offs than it saves
/// (measured on the list benchmark: about 15 % more wall time at 10,000 pods).
fn read_inline<R: Read>(
    mut body: R,
    handle: &mut dyn FnMut(&mut dyn Read),
) -> (u64, Option<std::io::Error>) {
    let mut watched = Watched {
        inner: &mut body,
        bytes: 0,
        error: None,
    };
    handle(&mut watched);
    (watched.bytes, watched.error)
}

/// Runs `handle` on `body` while a second thread reads it ahead (TLS, gzip) in chunks of
/// [`READ_AHEAD_CHUNK`] bytes, at most [`READ_AHEAD_CHUNKS`] waiting: receiving the body and
/// decoding it overlap, and memory stays bounded. Returns the bytes handed to `handle` and
/// the first read error. For a gzip-encoded body, whose inflating costs about as much as
/// its decoding (measured: 20–30 % less wall time at 10,000–50,000 pods than reading it
/// inline).
fn read_ahead<R: Read + Send>(
    mut body: R,
    handle: &mut dyn FnMut(&mut dyn Read),
) -> (u64, Option<std::io::Error>) {
    let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Vec<u8>>>(READ_AHEAD_CHUNKS);
    // Chunks the decoder is done with come back here to be filled again (no allocation and
    // zeroing per chunk).
    let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|scope| {
        scope.spawn(move || loop {
            let mut chunk = back_rx.try_recv().unwrap_or_default();
            chunk.resize(READ_AHEAD_CHUNK, 0);
            let mut filled = 0;
            let result = loop {
                match body.read(&mut chunk[filled..]) {
                    Ok(0) => break Ok(true),
                    Ok(n) => {
                        filled += n;
                        if filled == chunk.len() {
                            break Ok(false);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            };
            chunk.truncate(filled);
            let done = !matches!(result, Ok(false));
            let sent = match result {
                Ok(_) => (filled > 0 || done) && tx.send(Ok(chunk)).is_err(),
                Err(e) => {
                    if filled > 0 {
                        let _ = tx.send(Ok(chunk));
                    }
                    let _ = tx.send(Err(e));
                    true
                }
            };
            if done || sent {
                return;
            }
        });
        let chunks = Chunks {
            rx,
            back: back_tx,
            chunk: Vec::new(),
            pos: 0,
        };
        // Dropping the receiver stops the reader at its next chunk.
        read_inline(chunks, handle)
    })
}

/// The reading end of [`read_ahead`]: an empty chunk is the end of the body.
struct Chunks {
    rx: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    /// Where a chunk read to its end goes back to the reading thread.
    back: std::sync::mpsc::Sender<Vec<u8>>,
    chunk: Vec<u8>,
    pos: usize,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.chunk.len() {
            match self.rx.recv() {
                Ok(Ok(c)) if c.is_empty() => return Ok(0),
                Ok(Ok(c)) => {
                    let done = std::mem::replace(&mut self.chunk, c);
                    if done.capacity() > 0 {
                        // The reader may have finished already: then the chunk is dropped.
                        let _ = self.back.send(done);
                    }
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Reads the body of a successful response ([`KubeClient::execute_with`]).
pub(super) type BodyHandler<'h> = &'h mut dyn FnMut(&mut dyn Read);

#[derive(Default)]
struct TokenCache {
    token: Option<Secret<String>>,
    read_at: Option<Instant>,
}

/// The credential an exec plugin returned last, shared by a client and the clients derived
/// from it (the Lease's, a release's), so that one plugin run serves them all.
#[derive(Default)]
struct ExecCache {
    /// What the plugin returned last (`None`: it has not run successfully yet). A client
    /// certificate in it has been checked to be usable.
    cred: Option<ExecCredential>,
    /// When to renew it; `None`: only after a 401.
    refresh_at: Option<SystemTime>,
    /// A renewal started while the credential was still valid: polled at each request
    /// ([`KubeClient::settle_exec`]), waited for once the credential has expired.
    renewing: Option<RunningPlugin>,
}

impl ExecCache {
    /// The credential, while it has not expired at `now`.
    fn valid(&self, now: SystemTime) -> Option<&ExecCredential> {
        (self.cred.as_ref()).filter(|c| c.expiration.is_none_or(|t| now < t))
    }

    /// The token of the credential (`None` for a certificate-only plugin).
    fn token(&self) -> Option<String> {
        let cred = self.cred.as_ref()?;
        cred.token.as_ref().map(|t| t.expose().clone())
    }
}

/// The exec credential cache and the running plugin's process id, shared by a client and
/// those derived from it.
type SharedExec = (Arc<Mutex<ExecCache>>, Arc<Mutex<Option<u32>>>);

/// A client certificate and its key, as PEM (to see when the one to present changes).
type CertPair = (Vec<u8>, Secret<Vec<u8>>);

/// A blocking Kubernetes client: one cluster and credential, calls in any namespace through
/// [`KubeClient::api_in`] (its own namespace through [`KubeClient::api`]).
///
/// `Debug` shows the server, namespace and credential source, never the credential.
pub struct KubeClient {
    /// The connection: one per cluster, shared by every namespace view
    /// ([`KubeClient::in_namespace`]).
    conn: Arc<Connection>,
    /// The default namespace of this view: where [`KubeClient::api`] calls go.
    namespace: String,
    /// A deadline over this view's calls (the tick's budget, `run --timeout`); see
    /// [`KubeClient::set_deadline`].
    deadline: Mutex<Option<Deadline>>,
}

/// What every namespace view of one client shares: the TLS agent (so one connection pool),
/// the credential and its caches, the counters and the write fence.
struct Connection {
    /// Cloned for each request; replaced when an exec plugin returns a new client certificate.
    agent: Mutex<ureq::Agent>,
    /// The configuration, kept to rebuild the agent.
    cfg: ClusterConfig,
    exec: Arc<Mutex<ExecCache>>,
    /// The process id of the exec plugin running for [`Connection::exec`], while it runs
    /// ([`KubeClient::with_options_and_hook`]); shared as that cache is.
    plugin_pid: Arc<Mutex<Option<u32>>>,
    /// The exec plugin's client certificate this connection's agent presents (each
    /// connection rebuilds its own agent when the shared credential's changes).
    exec_cert: Mutex<Option<CertPair>>,
    /// `spec.cluster` for an exec plugin with `provideClusterInfo: true`.
    exec_cluster: Option<ExecClusterInfo>,
    /// URL prefix of requests: the server URL, with the host replaced by the
    /// `tls-server-name` when one is set.
    base: String,
    server: String,
    source: String,
    credential: Credential,
    token: Mutex<TokenCache>,
    options: ClientOptions,
    stats: Mutex<ClientStats>,
    /// [`ClientStats::requests_by`], shared with the clients derived from this one.
    requests_by: Arc<Mutex<RequestCounts>>,
    rng: AtomicU64,
    /// Leader-election fencing ([`KubeClient::set_write_fence`]): asked before every write.
    write_fence: std::sync::OnceLock<WriteFence>,
    /// What runs between requests, during a retry's back-off and while a request waits
    /// for the server ([`KubeClient::set_between_requests`]); shared with the agent's
    /// connector ([`super::sliced`]) and with the clients derived from this one.
    between: Hook,
}

/// A point in time calls must end by, and what set it (for the error message).
#[derive(Clone, Debug)]
struct Deadline {
    at: Instant,
    what: String,
}

/// Attempts by (verb, resource, code): [`ClientStats::requests_by`].
type RequestCounts = BTreeMap<(&'static str, &'static str, String), u64>;

/// Says whether this process may still write (true) or has lost its leader lease (false).
pub(super) type WriteFence = Arc<dyn Fn() -> bool + Send + Sync>;

/// Waits the duration it is given (zero: does not wait), doing the caller's own work
/// meanwhile ([`KubeClient::set_between_requests`]).
/// Returns false when the work of the caller's term is over (a leader that lost its
/// Lease): the call in progress is cut and no other request is sent.
pub type Between = Arc<dyn Fn(Duration) -> bool + Send + Sync>;

impl fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeClient")
            .field("server", &self.conn.server)
            .field("namespace", &self.namespace)
            .field("source", &self.conn.source)
            .field("credential", &self.conn.credential.describe())
            .field("options", &self.conn.options)
            .finish_non_exhaustive()
    }
}

/// One HTTP request, as [`super::Api`] builds it.
pub(super) struct Request {
    pub(super) method: Method,
    pub(super) url: String,
    pub(super) body: Option<Vec<u8>>,
    /// The body's `Content-Type` (sent only with a body).
    pub(super) content_type: &'static str,
    /// Names the call in logs and errors: `get pod NAME`, `list pods`.
    pub(super) verb: String,
    /// The API verb alone (`get`, `list`, `create`, `update`, `patch`, `delete`), for the
    /// counters.
    pub(super) op: &'static str,
    /// The resource called (the write fence lets Lease calls through).
    pub(super) res: &'static Resource,
    /// The `Accept` header: JSON, or Protobuf with JSON as the fallback.
    pub(super) accept: &'static str,
    /// The most body bytes read from a 2xx answer.
    pub(super) limit: u64,
    /// Whether a 429 is retried inside the call (all but an eviction's).
    pub(super) retry_429: bool,
}

/// The final answer to one [`Request`].
pub(super) struct Response {
    pub(super) status: u16,
    /// Empty when a body handler read it.
    pub(super) body: Vec<u8>,
    /// Body bytes received (after gzip decoding).
    pub(super) received: u64,
    pub(super) retry_after: Option<u64>,
    /// The `Location` header (of a 3xx), for the error message.
    pub(super) location: Option<String>,
    /// The `Warning` response headers' texts (RFC 7234 warn-text, unquoted): what the API
    /// server says about a request it accepted, e.g. an unknown field under
    /// `fieldValidation=Warn`.
    pub(super) warnings: Vec<String>,
    /// The `Content-Type` header (JSON, or Protobuf for a list that asked for it), for logs.
    pub(super) content_type: Option<String>,
}

/// The `fieldValidation` query parameter of a create (KEP-2885, Kubernetes 1.25+).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    /// An unknown or duplicate field fails the request (400 BadRequest).
    Strict,
    /// The request succeeds; each unknown field comes back as a `Warning` header.
    Warn,
    /// Unknown fields are dropped silently (the behaviour before 1.25).
    Ignore,
}

impl FieldValidation {
    /// The parameter's value: `Strict`, `Warn` or `Ignore`.
    pub fn as_str(self) -> &'static str {
        match self {
            FieldValidation::Strict => "Strict",
            FieldValidation::Warn => "Warn",
            FieldValidation::Ignore => "Ignore",
        }
    }
}

/// The text of one `Warning` header value as the API server writes it:
/// `299 - "unknown field \"spec.foo\""` → `unknown field "spec.foo"` (code 299, agent `-`,
/// a quoted string with backslash escapes; client-go's `ParseWarningHeader`). `None` for
/// any other shape.
pub fn warning_text(header: &str) -> Option<String> {
    let rest = header.trim().strip_prefix("299")?.trim_start();
    let rest = rest.strip_prefix('-')?.trim_start();
    let mut chars = rest.strip_prefix('"')?.chars();
    let mut out = String::new();
    loop {
        match chars.next()? {
            '\\' => out.push(chars.next()?),
            '"' => return Some(out),
            c => out.push(c),
        }
    }
}

/// The first bytes of a body, quoted for an error message (at most 80 characters).
fn body_start(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(240)]);
    let cut: String = text.trim_start().chars().take(80).collect();
    format!("{cut:?}")
}

/// Percent-encodes everything but RFC 3986 unreserved characters, so selectors such as
/// `a in (x, y),!b` reach the server as `a%20in%20%28x%2C%20y%29%2C%21b` (what the
/// Kubernetes docs show; Go's query parser decodes any percent-encoding).
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn is_header_safe(token: &str) -> bool {
    !token.is_empty() && token.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

fn read_token_file(path: &Path, source: &str) -> Result<Secret<String>, KubeError> {
    let max = crate::kube::MAX_INPUT_FILE_BYTES;
    let text = crate::kube::read_regular_text(path, max).map_err(|e| {
        KubeError::Config(format!(
            "cannot read token file {} ({source}): {e}",
            path.display()
        ))
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(KubeError::Config(format!(
            "token file {} ({source}) is empty",
            path.display()
        )));
    }
    if !is_header_safe(token) {
        return Err(KubeError::Config(format!(
            "token file {} ({source}) holds characters not allowed in a bearer token",
            path.display()
        )));
    }
    Ok(Secret::new(token.to_string()))
}

/// The certificates of a PEM bundle, at least one. Errors: `cannot parse {what} SOURCE: …`,
/// `no certificate found in {empty_in}SOURCE`.
fn pem_certs(
    pem: &PemData,
    what: &str,
    empty_in: &str,
) -> Result<Vec<CertificateDer<'static>>, KubeError> {
    let ders = CertificateDer::pem_slice_iter(&pem.pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| KubeError::Config(format!("cannot parse {what} {}: {e:?}", pem.source)))?;
    if ders.is_empty() {
        return Err(KubeError::Config(format!(
            "no certificate found in {empty_in}{}",
            pem.source
        )));
    }
    Ok(ders)
}

/// Parses a CA bundle; errors name the source. Returns the certificates ureq takes.
fn ca_certs(ca: &PemData) -> Result<Vec<Certificate<'static>>, KubeError> {
    let ders = pem_certs(ca, "certificate authority", "")?;
    let mut store = rustls::RootCertStore::empty();
    let (added, ignored) = store.add_parsable_certificates(ders.iter().cloned());
    if added == 0 {
        return Err(KubeError::Config(format!(
            "no usable certificate in {} ({ignored} could not be parsed as X.509)",
            ca.source
        )));
    }
    if ignored > 0 {
        log::warn!(
            "{ignored} of {} certificates in {} could not be parsed and are ignored",
            ders.len(),
            ca.source
        );
    }
    Ok(ders
        .iter()
        .map(|d| Certificate::from_der(d.as_ref()).to_owned())
        .collect())
}

/// Checks the client certificate against its key with rustls (ureq would panic on a
/// mismatch, `ureq/src/tls/rustls.rs`) and returns ureq's form of the pair.
fn client_identity(cert: &PemData, key: &KeyData) -> Result<ClientCert, KubeError> {
    let chain = pem_certs(cert, "client certificate", "client certificate ")?;
    // The key's parse error is not shown: it could echo key material.
    let key_der = PrivateKeyDer::from_pem_slice(key.pem.expose()).map_err(|_| {
        KubeError::Config(format!(
            "no usable private key in client key {} (PEM PKCS#1, PKCS#8 or SEC1, unencrypted)",
            key.source
        ))
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| KubeError::Config(format!("TLS setup: {e}")))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(chain.clone(), key_der)
        .map_err(|e| {
            KubeError::Config(format!(
                "client certificate {} does not match client key {} ({e})",
                cert.source, key.source
            ))
        })?;
    let certs: Vec<Certificate<'static>> = chain
        .iter()
        .map(|d| Certificate::from_der(d.as_ref()).to_owned())
        .collect();
    let key = PrivateKey::from_pem(key.pem.expose()).map_err(|_| {
        KubeError::Config(format!(
            "no usable private key in client key {}",
            key.source
        ))
    })?;
    Ok(ClientCert::new_with_certs(&certs, key))
}

/// Turns a rustls error into one line that says what to do.
fn tls_message(e: &rustls::Error, host: &str) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match e {
        E::InvalidCertificate(C::UnknownIssuer) => UNTRUSTED_CERT_MESSAGE.to_string(),
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => format!(
            "TLS: the server certificate is not valid for {host}; check the server address, \
             or set tls-server-name in the kubeconfig"
        ),
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "TLS: the server certificate has expired (or this machine's clock is wrong)".to_string()
        }
        E::AlertReceived(A::CertificateRequired) => {
            "TLS: the server requires a client certificate; pass --client-certificate and \
             --client-key or fix the kubeconfig user"
                .to_string()
        }
        E::AlertReceived(
            a @ (A::BadCertificate | A::UnknownCA | A::CertificateUnknown | A::AccessDenied),
        ) => format!("TLS: the server rejected the client certificate ({a:?})"),
        other => format!("TLS: {other}"),
    }
}

fn find_rustls<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(u) = err.downcast_ref::<ureq::Error>() {
            match u {
                ureq::Error::Rustls(r) => return Some(r),
                ureq::Error::Io(io) => {
                    cur = io
                        .get_ref()
                        .map(|i| i as &(dyn std::error::Error + 'static));
                    continue;
                }
                _ => return None,
            }
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if let Some(inner) = io.get_ref() {
                cur = Some(inner);
                continue;
            }
        }
        cur = err.source();
    }
    None
}

/// Turns a ureq error into a [`KubeError`]: `Transport` with its [`TransportKind`]
/// (retryable, except TLS failures), `Config` (request setup), or `Decode` (body).
fn classify(verb: &str, host: &str, e: ureq::Error) -> KubeError {
    let transport = |kind: TransportKind, message: String| KubeError::Transport {
        verb: verb.to_string(),
        kind,
        message,
    };
    if let Some(r) = find_rustls(&e) {
        return transport(TransportKind::Tls, tls_message(r, host));
    }
    match e {
        ureq::Error::Timeout(t) => transport(TransportKind::Timeout, format!("timed out ({t})")),
        ureq::Error::Io(io) => {
            let (kind, what) = io_kind(io.kind());
            transport(kind, format!("{what} ({io})"))
        }
        ureq::Error::HostNotFound => {
            transport(TransportKind::Dns, format!("host {host} not found (DNS)"))
        }
        ureq::Error::ConnectionFailed => {
            transport(TransportKind::Connect, "connection failed".to_string())
        }
        ureq::Error::Protocol(p) => transport(
            TransportKind::Protocol,
            format!("bad HTTP from the server: {p}"),
        ),
        ureq::Error::ConnectProxyFailed(m) => {
            transport(TransportKind::Proxy, format!("proxy CONNECT failed: {m}"))
        }
        ureq::Error::Tls(m) => transport(TransportKind::Tls, format!("TLS: {m}")),
        ureq::Error::BodyExceedsLimit(n) => KubeError::Decode {
            what: format!("{verb} response"),
            message: format!("body larger than the limit of {n} bytes"),
        },
        ureq::Error::Decompress(kind, io) => KubeError::Decode {
            what: format!("{verb} response"),
            message: format!("bad {kind} body: {io}"),
        },
        ureq::Error::BadUri(_)
        | ureq::Error::Http(_)
        | ureq::Error::InvalidProxyUrl
        | ureq::Error::RequireHttpsOnly(_) => {
            KubeError::Config(format!("{verb}: bad request setup: {e}"))
        }
        other => transport(TransportKind::Other, other.to_string()),
    }
}

/// The transport kind of an I/O error, and the words that start its message.
fn io_kind(kind: std::io::ErrorKind) -> (TransportKind, &'static str) {
    use std::io::ErrorKind as K;
    match kind {
        K::ConnectionRefused => (TransportKind::Connect, "connection refused"),
        K::ConnectionReset => (TransportKind::Reset, "connection reset"),
        K::ConnectionAborted => (TransportKind::Reset, "connection aborted"),
        K::BrokenPipe => (TransportKind::Reset, "connection closed while sending"),
        K::UnexpectedEof => (
            TransportKind::Reset,
            "connection closed before the response was complete",
        ),
        K::TimedOut | K::WouldBlock => (TransportKind::Timeout, "timed out"),
        _ => (TransportKind::Other, "I/O error"),
    }
}

impl KubeClient {
    /// Builds the client with [`ClientOptions::default`]. See [`KubeClient::with_options`].
    pub fn new(cfg: ClusterConfig) -> Result<KubeClient, KubeError> {
        KubeClient::with_options(cfg, ClientOptions::default())
    }

    /// Builds the `ureq` agent for `cfg`: timeouts, TLS trust and client certificate,
    /// `Accept: application/json`, `User-Agent: podalloc/VERSION`, gzip unless
    /// `disable_compression`, no redirects, HTTP errors as responses, the environment's
    /// proxy except for loopback servers (kubeconfig `proxy-url` wins).
    ///
    /// Nothing is sent. Files are checked now so that mistakes surface here: the CA must
    /// hold at least one certificate, the client certificate must match its key (checked
    /// with rustls, since ureq would panic), a token file must be readable and non-empty.
    /// Logs a warning when TLS verification is disabled.
    ///
    /// Errors: [`KubeError::Config`] naming the file or setting at fault.
    pub fn with_options(
        cfg: ClusterConfig,
        options: ClientOptions,
    ) -> Result<KubeClient, KubeError> {
        Self::build(
            cfg,
            options,
            (Arc::default(), Hook::default(), SharedExec::default()),
        )
    }

    /// [`KubeClient::with_options`] with the hook of [`KubeClient::set_between_requests`]
    /// installed first, so that it runs already while the credential is fetched (an exec
    /// plugin's wait): the loop sees its signals from the first moment. `on_exit` is given,
    /// before anything runs, what kills the exec credential plugin this client (or one
    /// sharing its credential) is running, if any, with its process group: for a process
    /// that exits without unwinding (`std::process::exit` runs no `Drop`), so that no plugin
    /// outlives it. Errors as `with_options`.
    pub fn with_options_and_hook(
        cfg: ClusterConfig,
        options: ClientOptions,
        between: Between,
        on_exit: impl FnOnce(Box<dyn Fn() + Send + Sync>),
    ) -> Result<KubeClient, KubeError> {
        let hook = Hook::default();
        hook.set(between);
        let shared = SharedExec::default();
        let slot = Arc::clone(&shared.1);
        on_exit(Box::new(move || {
            if let Some(pid) = *lock(&slot) {
                super::exec::kill_process_group(pid);
            }
        }));
        Self::build(cfg, options, (Arc::default(), hook, shared))
    }

    /// [`KubeClient::with_options`], counting requests by verb into `requests_by`, with the
    /// hook `between` and the exec credential cache `exec` (both shared with the client this
    /// one is derived from, if any). The credential is fetched now unless `exec` holds one.
    fn build(
        cfg: ClusterConfig,
        options: ClientOptions,
        (requests_by, between, (exec, plugin_pid)): (Arc<Mutex<RequestCounts>>, Hook, SharedExec),
    ) -> Result<KubeClient, KubeError> {
        let inherited = lock(&exec).cred.is_some();
        let (agent, base) = Self::build_agent(&cfg, &options, None, &between)?;
        if let Credential::Token { token, source } = &cfg.credential {
            if !is_header_safe(token.expose()) {
                return Err(KubeError::Config(format!(
                    "the token from {source} holds characters not allowed in a bearer token"
                )));
            }
        }
        let exec_cluster = match &cfg.credential {
            Credential::Exec(exec) if exec.provide_cluster_info => Some(ExecClusterInfo {
                server: cfg.server.clone(),
                tls_server_name: cfg.tls.tls_server_name.clone(),
                insecure_skip_tls_verify: cfg.tls.insecure_skip_tls_verify,
                certificate_authority: cfg.tls.ca.as_ref().map(|c| c.pem.clone()),
                proxy_url: cfg.proxy_url.as_ref().map(|p| p.0.clone()),
                disable_compression: cfg.disable_compression,
                config: exec.cluster_config.clone(),
            }),
            _ => None,
        };
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9E37_79B9_7F4A_7C15)
            | 1;
        let namespace = cfg.namespace.clone();
        let conn = Connection {
            agent: Mutex::new(agent),
            base,
            server: cfg.server.clone(),
            source: cfg.source.clone(),
            credential: cfg.credential.clone(),
            token: Mutex::new(TokenCache::default()),
            exec,
            plugin_pid,
            exec_cert: Mutex::new(None),
            exec_cluster,
            cfg,
            options,
            stats: Mutex::new(ClientStats::default()),
            requests_by,
            rng: AtomicU64::new(seed),
            write_fence: std::sync::OnceLock::new(),
            between,
        };
        let client = KubeClient {
            conn: Arc::new(conn),
            namespace,
            deadline: Mutex::new(None),
        };
        // Reads a token file, or runs an exec plugin (which may replace the agent); a derived
        // client takes the credential its parent holds.
        client.bearer(!inherited)?;
        Ok(client)
    }

    /// The agent for `cfg` and the base URL of requests. `exec_cert`: a client certificate
    /// from an exec plugin, used when the configuration has no static one.
    fn build_agent(
        cfg: &ClusterConfig,
        options: &ClientOptions,
        exec_cert: Option<ClientCert>,
        between: &Hook,
    ) -> Result<(ureq::Agent, String), KubeError> {
        let url = parse_server(&cfg.server, cfg.allow_insecure_http, &cfg.source)?;
        let mut builder = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(options.timeouts.connect))
            .timeout_per_read(Some(options.timeouts.per_read))
            .timeout_global(Some(options.timeouts.global))
            .user_agent(USER_AGENT)
            .accept("application/json");
        if cfg.disable_compression {
            builder = builder.accept_encoding(AutoHeaderValue::None);
        }
        if is_loopback_host(&url.host) {
            // Like Go's ProxyFromEnvironment: never proxy loopback.
            builder = builder.proxy(None);
        } else if let Some(proxy) = &cfg.proxy_url {
            let p = ureq::Proxy::new(&proxy.0).map_err(|e| {
                KubeError::Config(format!(
                    "proxy-url {} ({}) is not usable: {e}",
                    redact_userinfo(&proxy.0),
                    cfg.source
                ))
            })?;
            builder = builder.proxy(Some(p));
        }

        let mut pin = None;
        let mut base = url.base_with_host(&url.host);
        if url.https {
            let mut tls = TlsConfig::builder();
            if cfg.tls.insecure_skip_tls_verify {
                log::warn!(
                    "TLS verification is disabled for {} (insecure-skip-tls-verify): the \
                     server's identity is not checked",
                    cfg.server
                );
                tls = tls.disable_verification(true);
            } else if let Some(ca) = &cfg.tls.ca {
                tls = tls.root_certs(RootCerts::new_with_certs(&ca_certs(ca)?));
            }
            match (&cfg.tls.client_cert, &cfg.tls.client_key) {
                (Some(cert), Some(key)) => {
                    tls = tls.client_cert(Some(client_identity(cert, key)?));
                }
                (None, None) => {
                    if let Some(id) = exec_cert {
                        tls = tls.client_cert(Some(id));
                    }
                }
                _ => {
                    return Err(KubeError::Config(
                        "a client certificate needs both certificate and key".to_string(),
                    ))
                }
            }
            builder = builder.tls_config(tls.build());
            if let Some(name) = cfg.tls.tls_server_name.as_deref().filter(|n| !n.is_empty()) {
                let name = name.trim_start_matches('[').trim_end_matches(']');
                let real: Uri = format!("https://{}/", url.authority_for(&url.host))
                    .parse()
                    .map_err(|e| KubeError::Config(format!("server {}: {e}", cfg.server)))?;
                base = url.base_with_host(name);
                pin = Some((name.to_string(), real));
            }
        } else if cfg.tls.client_cert.is_some() || cfg.tls.insecure_skip_tls_verify {
            log::warn!(
                "server {} uses plain http; TLS settings are ignored",
                cfg.server
            );
        }
        let resolver = KubeResolver::new(pin, between);
        let agent = ureq::Agent::with_parts(
            builder.build(),
            super::sliced::connector(between, &resolver),
            resolver,
        );
        Ok((agent, base))
    }

    /// The default namespace: where [`KubeClient::api`] calls go.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A view of this client whose default namespace is `ns`: the same connection (TLS
    /// agent and connection pool), credential, counters ([`KubeClient::stats`]) and write
    /// fence, with a deadline of its own (none). Cheap: nothing is sent or read. This is
    /// how one process serves apps in many namespaces with one client.
    pub fn in_namespace(&self, ns: &str) -> KubeClient {
        KubeClient {
            conn: Arc::clone(&self.conn),
            namespace: ns.to_string(),
            deadline: Mutex::new(None),
        }
    }

    /// The server URL as configured, e.g. `https://10.0.0.1:6443`.
    pub fn server(&self) -> &str {
        &self.conn.server
    }

    /// Where the configuration came from (see [`ClusterConfig::source`]).
    pub fn source(&self) -> &str {
        &self.conn.source
    }

    /// The URL prefix requests go to: the server URL, with the `tls-server-name` in place
    /// of the host when one is set (the connection still goes to the server's address).
    pub fn base_url(&self) -> &str {
        &self.conn.base
    }

    /// The retry policy in force.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.conn.options.retry
    }

    /// Replaces the retry policy (e.g. [`RetryPolicy::none`] for a dry run), before any
    /// namespace view shares the connection.
    ///
    /// Panics: when a view made by [`KubeClient::in_namespace`] is still alive (the policy
    /// belongs to the shared connection).
    pub fn set_retry_policy(&mut self, policy: RetryPolicy) {
        let conn = Arc::get_mut(&mut self.conn)
            .expect("set_retry_policy: the connection is shared by a namespace view");
        conn.options.retry = policy;
    }

    /// Starts a fresh retry budget: the tick calls this first, so
    /// [`RetryPolicy::retry_budget`] bounds the retry sleeping of one tick.
    pub fn reset_retry_budget(&self) {
        lock(&self.conn.stats).retry_sleep = Duration::ZERO;
    }

    /// Sets (or clears, with `None`) a deadline over every call from now on: a call ends by
    /// `at` at the latest (its attempts time out, no retry sleeps past it), and a call
    /// started after it fails at once with a [`TransportKind::Timeout`] error that names
    /// `what` (e.g. "the tick budget of 1m"). Each call also has its own
    /// [`Timeouts::global`]; the earlier of the two applies.
    pub fn set_deadline(&self, at: Option<Instant>, what: &str) {
        *lock(&self.deadline) = at.map(|at| Deadline {
            at,
            what: what.to_string(),
        });
    }

    /// The deadline of a call starting now: the request timeout, or the deadline set by
    /// [`KubeClient::set_deadline`] when that comes first.
    fn call_deadline(&self) -> Deadline {
        let own = Deadline {
            at: Instant::now() + self.conn.options.timeouts.global,
            what: format!(
                "the request timeout of {} (--request-timeout)",
                humantime::format_duration(self.conn.options.timeouts.global)
            ),
        };
        match lock(&self.deadline).clone() {
            Some(outer) if outer.at < own.at => outer,
            _ => own,
        }
    }

    /// A copy of the counters: requests, retries, bytes received, errors by HTTP code.
    pub fn stats(&self) -> ClientStats {
        let mut stats = lock(&self.conn.stats).clone();
        stats.requests_by = lock(&self.conn.requests_by).clone();
        stats
    }

    /// The bearer token to send, reading the token file when it is older than the refresh
    /// period or when `force`. A failed re-read keeps the previous token (client-go does the
    /// same) and logs a warning. An exec plugin is run when its credential is due for renewal
    /// or when `force` (see [`KubeClient::exec_token`]).
    fn bearer(&self, force: bool) -> Result<Option<String>, KubeError> {
        let token = self.bearer_uncounted(force)?;
        if let Some(t) = &token {
            self.conn.options.redactions.remember(t);
        }
        Ok(token)
    }

    /// [`KubeClient::bearer`] before the token is remembered for scrubbing.
    fn bearer_uncounted(&self, force: bool) -> Result<Option<String>, KubeError> {
        match &self.conn.credential {
            Credential::None => Ok(None),
            Credential::Token { token, .. } => Ok(Some(token.expose().clone())),
            Credential::Exec(exec) => self.exec_token(exec, force),
            Credential::TokenFile { path, source } => {
                let mut cache = lock(&self.conn.token);
                let stale = force
                    || cache.token.is_none()
                    || cache
                        .read_at
                        .is_none_or(|t| t.elapsed() >= self.conn.options.token_refresh);
                if stale {
                    match read_token_file(path, source) {
                        Ok(t) => {
                            if cache.token.as_ref().is_some_and(|old| old != &t) {
                                log::debug!("token file {} changed", path.display());
                            }
                            cache.token = Some(t);
                            cache.read_at = Some(Instant::now());
                        }
                        Err(e) if cache.token.is_some() => {
                            log::warn!("{e}; keeping the token read before");
                            cache.read_at = Some(Instant::now());
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(cache.token.as_ref().map(|t| t.expose().clone()))
            }
        }
    }

    /// The exec plugin's token (`None` for a plugin that returns only a client certificate),
    /// from the credential cache this client shares with those derived from it
    /// ([`KubeClient::settle_exec`] keeps it up to date), its client certificate presented
    /// by this connection's agent ([`KubeClient::present_exec_cert`]).
    ///
    /// The plugin runs under the cache's lock; a wait for it runs the hook between requests,
    /// and a request the hook makes meanwhile (a Lease renewal) gets
    /// [`KubeClient::exec_token_nested`]'s answer.
    fn exec_token(&self, exec: &ExecConfig, force: bool) -> Result<Option<String>, KubeError> {
        if self.conn.between.plugin_running() {
            return self.exec_token_nested(exec, force);
        }
        let (token, cert) = {
            let mut cache = lock(&self.conn.exec);
            self.settle_exec(&mut cache, exec, force)?;
            let cert = (cache.cred.as_ref()).and_then(|c| {
                let (cert, key) = (c.client_certificate.as_ref()?, c.client_key.as_ref()?);
                Some((cert.pem.clone(), key.pem.clone()))
            });
            (cache.token(), cert)
        };
        self.present_exec_cert(exec, cert)?;
        Ok(token)
    }

    /// Brings the shared credential up to date, the rules of client-go's exec authenticator
    /// with one difference: a credential due for renewal
    /// ([`ExecCredential::refresh_time`](super::exec::ExecCredential::refresh_time)) but not
    /// expired is renewed in the background: the plugin is started and the credential kept
    /// in use; each later call polls it, without waiting, and takes its credential once it
    /// has finished (a failure is logged, the old credential kept until it expires, and the
    /// renewal tried again after half the time it has left, at least a second later). The
    /// caller waits for the plugin only when no credential is valid (none yet, it has
    /// expired) or `force` (after a 401): then a renewal in progress is waited for, or a run
    /// started.
    ///
    /// Errors: the plugin's ([`super::exec::run_plugin`]) when the caller waited for it, or a
    /// client certificate it returned that cannot be used ([`KubeError::Auth`]).
    fn settle_exec(
        &self,
        cache: &mut ExecCache,
        exec: &ExecConfig,
        force: bool,
    ) -> Result<(), KubeError> {
        if let Some(done) = cache
            .renewing
            .as_mut()
            .and_then(|run| run.poll(Duration::ZERO))
        {
            cache.renewing = None;
            let now = SystemTime::now();
            match done.and_then(|cred| self.usable_exec(exec, cred)) {
                Ok(cred) => Self::adopt_exec(cache, cred),
                Err(e) => match cache.valid(now).and_then(|c| c.expiration) {
                    Some(expires) => {
                        log::warn!(
                            "{e}; keeping the credential it returned before until it expires"
                        );
                        let left = expires.duration_since(now).unwrap_or_default();
                        cache.refresh_at = Some(now + (left / 2).max(Duration::from_secs(1)));
                    }
                    None => log::debug!("renewing the credential failed: {e}"),
                },
            }
        }
        let now = SystemTime::now();
        if force || cache.valid(now).is_none() {
            let run = match cache.renewing.take() {
                Some(run) => run,
                None => self.start_exec_plugin(exec)?,
            };
            let cred = self.wait_exec_plugin(run, cache)?;
            Self::adopt_exec(cache, self.usable_exec(exec, cred)?);
        } else if cache.renewing.is_none() && cache.refresh_at.is_some_and(|t| now >= t) {
            match self.start_exec_plugin(exec) {
                Ok(run) => {
                    log::debug!("{}: renewing its credential meanwhile", exec.describe());
                    cache.renewing = Some(run);
                }
                Err(e) => {
                    log::warn!("{e}; keeping the credential it returned before until it expires");
                    cache.refresh_at = Some(now + Duration::from_secs(1));
                }
            }
        }
        Ok(())
    }

    /// Takes a new credential into the cache, with its renewal time.
    fn adopt_exec(cache: &mut ExecCache, cred: ExecCredential) {
        cache.refresh_at = cred.refresh_time(SystemTime::now());
        cache.cred = Some(cred);
    }

    /// `cred`, once its client certificate (if this client would present it) is known to be
    /// usable: checked with rustls, since ureq panics on a mismatched pair.
    ///
    /// Errors: [`KubeError::Auth`] naming the plugin.
    fn usable_exec(
        &self,
        exec: &ExecConfig,
        cred: ExecCredential,
    ) -> Result<ExecCredential, KubeError> {
        if let (Some(cert), Some(key), true) = (
            &cred.client_certificate,
            &cred.client_key,
            self.presents_exec_cert(),
        ) {
            client_identity(cert, key).map_err(|e| {
                KubeError::Auth(format!(
                    "{} returned a client certificate that cannot be used: {e}",
                    exec.describe()
                ))
            })?;
        }
        Ok(cred)
    }

    /// Whether an exec plugin's client certificate is presented: not when the kubeconfig
    /// user has one of its own, nor over plain http.
    fn presents_exec_cert(&self) -> bool {
        self.conn.cfg.tls.client_cert.is_none() && self.conn.base.starts_with("https://")
    }

    /// Makes this connection's agent present `cert` (the exec plugin's client certificate
    /// and key, or none), rebuilding it when that changes.
    ///
    /// Errors: as [`KubeClient::with_options`], when the agent cannot be rebuilt.
    fn present_exec_cert(
        &self,
        exec: &ExecConfig,
        cert: Option<CertPair>,
    ) -> Result<(), KubeError> {
        let cert = cert.filter(|_| self.presents_exec_cert());
        let mut presented = lock(&self.conn.exec_cert);
        if *presented == cert {
            return Ok(());
        }
        let id = match &cert {
            Some((c, k)) => {
                let cert = PemData {
                    source: format!("clientCertificateData from {}", exec.describe()),
                    pem: c.clone(),
                };
                let key = KeyData {
                    source: format!("clientKeyData from {}", exec.describe()),
                    pem: k.clone(),
                };
                Some(client_identity(&cert, &key)?)
            }
            None => None,
        };
        let (agent, _) =
            Self::build_agent(&self.conn.cfg, &self.conn.options, id, &self.conn.between)?;
        *lock(&self.conn.agent) = agent;
        log::debug!(
            "{}: {}",
            exec.describe(),
            match cert {
                Some(_) => "new client certificate in use",
                None => "no client certificate in use",
            }
        );
        *presented = cert;
        Ok(())
    }

    /// Starts the exec plugin (counted in [`ClientStats::exec_runs`]).
    ///
    /// Errors: as [`RunningPlugin::start`].
    fn start_exec_plugin(&self, exec: &ExecConfig) -> Result<RunningPlugin, KubeError> {
        let run = RunningPlugin::start(
            exec,
            self.conn.exec_cluster.as_ref(),
            self.conn.options.exec_timeout,
            Arc::clone(&self.conn.plugin_pid),
        )?;
        lock(&self.conn.stats).exec_runs += 1;
        Ok(run)
    }

    /// Waits for the plugin, the hook between requests run while it runs, marked as running
    /// for the clients sharing the hook ([`KubeClient::exec_token_nested`]). The first
    /// credential (`cache` has never held one) as long as the plugin may run
    /// ([`ClientOptions::exec_timeout`]); later ones at most this client's request timeout
    /// ([`Timeouts::global`]: a Lease client's is its renew deadline), after which the plugin
    /// goes on running as a renewal in `cache`, for a later request to take its credential.
    ///
    /// Errors: the plugin's, or a [`KubeError::Transport`] of kind [`TransportKind::Timeout`]
    /// (retryable, as a slow server's) when it has not finished in time.
    fn wait_exec_plugin(
        &self,
        mut run: RunningPlugin,
        cache: &mut ExecCache,
    ) -> Result<ExecCredential, KubeError> {
        let hook = &self.conn.between;
        let _running = hook.plugin_run();
        // The first credential is waited for as long as the plugin may run (it kills itself
        // at its own timeout): nothing can have been led or sent without one, and a start
        // (or a one-shot command) would only fail. Later ones at most the request's timeout,
        // so a Lease renewal is never held behind a plugin.
        let limit = if cache.cred.is_none() {
            self.conn.options.exec_timeout + Duration::from_secs(1)
        } else {
            self.conn.options.timeouts.global
        };
        match run.wait_until(Instant::now() + limit, &mut || {
            hook.run(Duration::ZERO);
        }) {
            Some(done) => done,
            None => {
                let plugin = run.plugin().to_string();
                cache.renewing = Some(run);
                Err(KubeError::Transport {
                    verb: "fetch a credential".into(),
                    kind: TransportKind::Timeout,
                    message: format!(
                        "{plugin} has not returned a credential within this request's timeout \
                         of {}: the request is not sent; the plugin goes on running (at most \
                         its own timeout) and a later request takes its credential",
                        humantime::format_duration(limit)
                    ),
                })
            }
        }
    }

    /// The exec plugin's token for a request made while a client sharing this one's hook
    /// waits for the plugin (from the hook of its wait): never a second run, nor a wait;
    /// the cached credential while it has not expired. Errors: [`KubeError::Auth`] when the
    /// cache is held by the wait in progress (the clients derived from one share it), there
    /// is no credential, it has expired, or `force` (a 401).
    fn exec_token_nested(
        &self,
        exec: &ExecConfig,
        force: bool,
    ) -> Result<Option<String>, KubeError> {
        let busy = |why: &str| {
            KubeError::Auth(format!(
                "{} is running for another request, and {why}: this request is not sent \
                 (it is not run a second time while it runs)",
                exec.describe()
            ))
        };
        let cache = match self.conn.exec.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(busy("its credential is being renewed"))
            }
        };
        let valid = cache.valid(SystemTime::now()).is_some();
        match (cache.cred.is_some(), force, valid) {
            (true, false, true) => Ok(cache.token()),
            (false, ..) => Err(busy("no credential of its is cached")),
            (_, true, _) => Err(busy("the credential it returned was rejected")),
            (_, _, false) => Err(busy("the credential it returned last has expired")),
        }
    }

    fn auth_error(&self, resp: &Response) -> KubeError {
        let status = ApiStatus::from_body(401, &resp.body, None);
        // The server's own message, unless it only repeats the reason.
        let detail = match status.message.trim() {
            m if m.is_empty() || m.eq_ignore_ascii_case("unauthorized") => String::new(),
            m => format!(": {m}"),
        };
        // `--token flag` → `the --token flag`; other sources name themselves.
        let the = |source: &str| {
            if source.ends_with(" flag") {
                format!("the {source}")
            } else {
                source.to_string()
            }
        };
        let what = match &self.conn.credential {
            Credential::None => format!(
                "the API server requires credentials (401 Unauthorized{detail}), but {} gives \
                 none: pass --token or --token-file, or use a kubeconfig user with credentials",
                self.conn.source
            ),
            Credential::Token { source, .. } => format!(
                "the token from {} was rejected by the API server (401 Unauthorized{detail}): \
                 get a fresh token, or check that this user may use the cluster",
                the(source)
            ),
            Credential::TokenFile { path, source } => format!(
                "token file {} ({source}) was rejected (401 Unauthorized{detail}), also after \
                 re-reading it: refresh the token or check the service account",
                path.display()
            ),
            Credential::Exec(exec) => format!(
                "the credential from {} was rejected (401 Unauthorized{detail}), also after \
                 re-running the plugin: check its args and env (profile, cluster name, \
                 tenant) and that this identity may use the cluster",
                exec.describe()
            ),
        };
        KubeError::Auth(what)
    }

    fn next_random(&self) -> u64 {
        // xorshift64*: cheap jitter, no crate needed.
        let mut x = self.conn.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.conn.rng.store(x, Ordering::Relaxed);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The sleep before retry number `attempt` (0-based), or `None` when out of retries or
    /// of budget. Charges the budget.
    fn next_delay(&self, attempt: u32, retry_after: Option<u64>) -> Option<Duration> {
        let p = &self.conn.options.retry;
        if attempt >= p.max_retries {
            return None;
        }
        let exp = p
            .base_delay
            .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX));
        let backoff = exp.min(p.max_delay);
        let jitter_permille = self.next_random() % 201; // 0..=20 %
        let jittered = (backoff + backoff * jitter_permille as u32 / 1000).min(p.max_delay);
        let delay = jittered.max(Duration::from_secs(retry_after.unwrap_or(0)));
        let mut stats = lock(&self.conn.stats);
        if let Some(secs) = retry_after.filter(|s| Duration::from_secs(*s) > p.retry_budget) {
            log::warn!(
                "the server asked to wait {secs} s before retrying (Retry-After), more than \
                 the retry budget of {}; not retrying",
                humantime::format_duration(p.retry_budget)
            );
            return None;
        }
        if stats.retry_sleep + delay > p.retry_budget {
            log::warn!(
                "retry budget of {} used up ({} slept); not retrying",
                humantime::format_duration(p.retry_budget),
                humantime::format_duration(stats.retry_sleep)
            );
            return None;
        }
        stats.retry_sleep += delay;
        stats.retries += 1;
        Some(delay)
    }

    fn send_once(
        &self,
        agent: &ureq::Agent,
        req: &Request,
        token: Option<&str>,
        host: &str,
        timeout: Duration,
        on_body: Option<BodyHandler<'_>>,
    ) -> Result<Response, KubeError> {
        let mut b = ureq::http::Request::builder()
            .method(req.method.clone())
            .uri(req.url.as_str());
        if let Some(t) = token {
            b = b.header("Authorization", format!("Bearer {t}"));
        }
        b = b.header("Accept", req.accept);
        // The per-attempt deadline: what is left of the call's (ureq's global timeout covers
        // connect, headers and the whole body, so a trickling body is cut off too).
        let sent = match &req.body {
            Some(body) => b
                .header("Content-Type", req.content_type)
                .body(body.clone())
                .map(|r| {
                    let r = agent.configure_request(r).timeout_global(Some(timeout));
                    agent.run(r.build())
                }),
            None => b.body(()).map(|r| {
                let r = agent.configure_request(r).timeout_global(Some(timeout));
                agent.run(r.build())
            }),
        };
        let result = sent.map_err(|_| {
            KubeError::Config(format!(
                "{}: cannot build the request for {} (bad URL or header)",
                req.verb, req.url
            ))
        })?;
        let mut resp = result.map_err(|e| classify(&req.verb, host, e))?;
        let status = resp.status().as_u16();
        let (retry_after, location, warnings) = response_headers(resp.headers());
        let content_type = (resp.headers().get("content-type"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let (true, Some(handle)) = (status < 300, on_body) {
            let gzip = (resp.headers().get("content-encoding"))
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.to_ascii_lowercase().contains("gzip"));
            let reader = resp.body_mut().with_config().limit(req.limit).reader();
            let (bytes, error) = match gzip {
                true => read_ahead(reader, handle),
                false => read_inline(reader, handle),
            };
            if let Some(e) = error {
                return Err(classify(&req.verb, host, ureq::Error::from(e)));
            }
            return Ok(Response {
                status,
                body: Vec::new(),
                received: bytes,
                retry_after,
                location,
                warnings,
                content_type,
            });
        }
        let body = if status < 300 {
            resp.body_mut()
                .with_config()
                .limit(req.limit)
                .read_to_vec()
                .map_err(|e| classify(&req.verb, host, e))?
        } else {
            let mut buf = Vec::new();
            resp.body_mut()
                .with_config()
                .limit(u64::MAX)
                .reader()
                .take(ERROR_BODY_LIMIT)
                .read_to_end(&mut buf)
                .map_err(|e| classify(&req.verb, host, ureq::Error::from(e)))?;
            buf
        };
        Ok(Response {
            status,
            received: body.len() as u64,
            body,
            retry_after,
            location,
            warnings,
            content_type,
        })
    }

    /// Sends `req`, retrying per the policy, re-reading a token file or re-running an exec
    /// plugin once after a 401 (client-go's `ResettableTokenSource` and exec authenticator).
    /// Returns the final HTTP response whatever its code, except 401 (→ `Auth`).
    ///
    /// The whole call ends by its deadline ([`KubeClient::call_deadline`]): each attempt gets
    /// what is left of it, and a retry whose sleep would pass it is not made.
    pub(super) fn execute(&self, req: &Request) -> Result<Response, KubeError> {
        self.execute_with(req, None)
    }

    /// [`KubeClient::execute`], handing the body of a 2xx response to `on_body` as it
    /// arrives instead of collecting it (the returned response's `body` is then empty). A
    /// read that fails inside `on_body` fails the attempt as a transport error would, so
    /// it may be retried, and `on_body` runs again on the new response.
    pub(super) fn execute_with(
        &self,
        req: &Request,
        mut on_body: Option<BodyHandler<'_>>,
    ) -> Result<Response, KubeError> {
        self.check_write_fence(req)?;
        let host = Uri::try_from(req.url.as_str())
            .ok()
            .and_then(|u| u.host().map(str::to_string))
            .unwrap_or_default();
        let deadline = self.call_deadline();
        let mut attempt = 0u32;
        let mut reauthenticated = false;
        loop {
            let left = deadline.at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.deadline_error(req, &deadline));
            }
            if !self.between(Duration::ZERO) {
                return Err(Self::term_over(req));
            }
            let token = self.bearer(false)?;
            // Asked again after bearer(), right before the send: a wait for an exec plugin
            // (up to the request's timeout) may have outlived this process's leadership, and
            // a write sent then lands beside the next leader's (the attacker's HIGH: a create
            // 8 s into another's term). Also covers a retry and a re-authentication.
            self.check_write_fence(req)?;
            // After bearer(): an exec plugin may just have replaced the agent.
            let agent = lock(&self.conn.agent).clone();
            lock(&self.conn.stats).requests += 1;
            let started = Instant::now();
            let handler = on_body.as_mut().map(|h| &mut **h as BodyHandler<'_>);
            let sent = self.send_once(&agent, req, token.as_deref(), &host, left, handler);
            let (outcome, delay) = match sent {
                Ok(resp) => {
                    self.record_response(req, &resp, started);
                    if resp.status == 401 {
                        if !reauthenticated && self.can_reauthenticate() {
                            reauthenticated = true;
                            self.reauthenticate(req)?;
                            continue;
                        }
                        return Err(self.auth_error(&resp));
                    }
                    let delay = self.status_retry_delay(req, &resp, attempt);
                    (Ok(resp), delay)
                }
                Err(error) if Instant::now() >= deadline.at && error.is_timeout() => {
                    lock(&self.conn.stats).transport_errors += 1;
                    self.count_answer(req, None);
                    return Err(self.deadline_error(req, &deadline));
                }
                Err(error) => {
                    self.count_answer(req, None);
                    // Cut by the hook (this process no longer leads): not retried.
                    if !self.between(Duration::ZERO) {
                        log::warn!(
                            "{}: cut while waiting for its answer: this process no longer holds \
                             the leader lease; not retried",
                            req.verb
                        );
                        return Err(Self::term_over(req));
                    }
                    let delay = self.error_retry_delay(&error, attempt);
                    (Err(error), delay)
                }
            };
            let Some(delay) = delay else {
                return outcome;
            };
            if Instant::now() + delay >= deadline.at {
                log::warn!(
                    "{}: not retrying: the retry would end after {}",
                    req.verb,
                    deadline.what
                );
                return outcome;
            }
            if !self.between(delay) {
                return Err(Self::term_over(req));
            }
            attempt += 1;
        }
    }

    /// The error of a call that ran out of time.
    fn deadline_error(&self, req: &Request, deadline: &Deadline) -> KubeError {
        KubeError::Transport {
            verb: req.verb.to_string(),
            kind: TransportKind::Timeout,
            message: format!(
                "timed out: no complete answer from {} within {}",
                self.conn.server, deadline.what
            ),
        }
    }

    /// Counts one attempt's answer under its verb and resource: the HTTP `code`, or `None`
    /// when no HTTP answer came ([`ClientStats::requests_by`]).
    fn count_answer(&self, req: &Request, code: Option<u16>) {
        let code = code.map_or_else(|| "<error>".to_string(), |c| c.to_string());
        let key = (req.op, req.res.plural, code);
        *lock(&self.conn.requests_by).entry(key).or_insert(0) += 1;
    }

    /// Counts a response's bytes and error code in the stats, and logs it (no headers).
    fn record_response(&self, req: &Request, resp: &Response, started: Instant) {
        self.count_answer(req, Some(resp.status));
        {
            let mut stats = lock(&self.conn.stats);
            stats.bytes_received += resp.received;
            if resp.status >= 400 {
                *stats.errors_by_code.entry(resp.status).or_insert(0) += 1;
            }
        }
        log::debug!(
            "{} {} -> {} ({} bytes of {}, {} ms)",
            req.method,
            req.url,
            resp.status,
            resp.received,
            resp.content_type.as_deref().unwrap_or("no content type"),
            started.elapsed().as_millis()
        );
    }

    /// Whether a 401 can be answered by fetching the credential again (a token file or an
    /// exec plugin; a fixed token would only fail the same way).
    fn can_reauthenticate(&self) -> bool {
        matches!(
            self.conn.credential,
            Credential::TokenFile { .. } | Credential::Exec(_)
        )
    }

    /// After a 401: re-reads the token file or re-runs the exec plugin, counted as a retry.
    fn reauthenticate(&self, req: &Request) -> Result<(), KubeError> {
        let what = match self.conn.credential {
            Credential::Exec(_) => "re-running",
            _ => "re-reading",
        };
        log::warn!(
            "{}: 401 Unauthorized; {what} the {} and retrying once",
            req.verb,
            self.conn.credential.describe()
        );
        self.bearer(true)?;
        lock(&self.conn.stats).retries += 1;
        Ok(())
    }

    /// The sleep before retrying a response with a retryable HTTP code (honouring
    /// `Retry-After`), or `None` to return the response as it is.
    fn status_retry_delay(&self, req: &Request, resp: &Response, attempt: u32) -> Option<Duration> {
        if !is_retryable_code(resp.status) || (resp.status == 429 && !req.retry_429) {
            return None;
        }
        let status = ApiStatus::from_body(resp.status, &resp.body, resp.retry_after);
        let delay = self.next_delay(attempt, status.retry_after_seconds)?;
        log::warn!(
            "{}: {} {}; retry {}/{} in {} ms",
            req.verb,
            status.code,
            status.reason,
            attempt + 1,
            self.conn.options.retry.max_retries,
            delay.as_millis()
        );
        Some(delay)
    }

    /// Counts a transport error, and gives the sleep before retrying a failed call, or
    /// `None` to return the error.
    fn error_retry_delay(&self, error: &KubeError, attempt: u32) -> Option<Duration> {
        if matches!(error, KubeError::Transport { .. }) {
            lock(&self.conn.stats).transport_errors += 1;
        }
        if !error.is_retryable() {
            return None;
        }
        let delay = self.next_delay(attempt, None)?;
        log::warn!(
            "{}; retry {}/{} in {} ms",
            error,
            attempt + 1,
            self.conn.options.retry.max_retries,
            delay.as_millis()
        );
        Some(delay)
    }

    /// The error of a response with a code the call does not expect. A 3xx says where the
    /// server redirected to: the client follows no redirects (a redirect of an API call
    /// means the `--server` URL points at something other than the API server).
    pub(super) fn api_error(verb: &str, resp: &Response) -> KubeError {
        let mut status = ApiStatus::from_body(resp.status, &resp.body, resp.retry_after);
        if (300..400).contains(&resp.status) {
            status.reason = "Redirect".to_string();
            status.message = format!(
                "the API server redirected to {}; podalloc does not follow redirects: check \
                 --server",
                resp.location.as_deref().unwrap_or("(no Location header)")
            );
        }
        KubeError::Api {
            verb: verb.to_string(),
            status,
        }
    }

    /// Decodes a 2xx body that must be a JSON object of `kind` (`Pod`, `ConfigMap`, …).
    /// A body that is not JSON (garbage, a proxy's HTML page), or that does not say it is a
    /// `kind` (`{}`, a `Status`), is a [`KubeError::Decode`] naming the server and quoting
    /// the body's first bytes. For a create, the caller cannot tell whether the object was
    /// made: it reads the error as ambiguous.
    pub(super) fn decode_kind(
        &self,
        what: &str,
        body: &[u8],
        kind: &str,
    ) -> Result<serde_json::Value, KubeError> {
        let bad = |why: String| KubeError::Decode {
            what: what.to_string(),
            message: format!(
                "{} answered with {why}; the body starts with {}",
                self.conn.server,
                body_start(body)
            ),
        };
        let v: serde_json::Value = serde_json::from_slice(body)
            .map_err(|e| bad(format!("a body that is not JSON ({e})")))?;
        match v.get("kind").and_then(serde_json::Value::as_str) {
            Some(k) if k == kind => Ok(v),
            Some(k) => Err(bad(format!("a {k}, not a {kind}"))),
            None => Err(bad(format!("a body without kind, not a {kind}"))),
        }
    }

    /// The body cap of one list page: [`ClientOptions::streamed_list_body_limit`] for a
    /// sink that decodes as the bytes come (`bounded`), else
    /// [`ClientOptions::list_body_limit`].
    pub(super) fn list_cap(&self, bounded: bool) -> u64 {
        match bounded {
            true => self.conn.options.streamed_list_body_limit,
            false => self.conn.options.list_body_limit,
        }
    }

    /// The options the client was built with.
    pub(super) fn options(&self) -> &ClientOptions {
        &self.conn.options
    }

    /// A list page over the cap (`cap` bytes, see [`ClientOptions::list_body_limit`]) says
    /// so, and what to do.
    pub(super) fn over_cap(&self, e: KubeError, cap: u64) -> KubeError {
        match e {
            KubeError::Decode { what, message } if message.starts_with("body larger than") => {
                KubeError::Decode {
                    what,
                    message: format!(
                        "a page from {} is larger than the cap of {} bytes ({} MiB) after gzip \
                         decoding: use a smaller --page-size, or raise --max-page-bytes",
                        self.conn.server,
                        cap,
                        cap / (1024 * 1024)
                    ),
                }
            }
            e => e,
        }
    }

    /// Installs the leader-election fence: from now on every request other than a GET and
    /// other than a call on [`LEASES`] first asks `fence`, and is
    /// not sent when it answers false (also before each retry). Installed once; a second
    /// call is ignored. The refused call fails with [`KubeError::Transport`] (kind `Other`,
    /// nothing was sent), which the tick treats like any failed call.
    pub fn set_write_fence(&self, fence: WriteFence) {
        let _ = self.conn.write_fence.set(fence);
    }

    /// Installs what runs before every request (called with a zero duration), in place of
    /// the sleep of a retry's back-off (called with the back-off, which it must wait in
    /// all) and every [`super::sliced::SLICE`] while a request waits for the server or for a
    /// new connection's name lookup (zero): the loop's single thread answers its endpoints,
    /// sees its signals and renews its Lease there. Installed once, shared with the clients of [`KubeClient::in_namespace`]
    /// and of [`KubeClient::derive`] (before or after they are made); a second call is
    /// ignored. The hook may make requests of its own on another connection (a derived
    /// client), which run it again: it must stand being re-entered. When it returns false
    /// (the term of this process is over: it no longer leads), the call in progress is cut
    /// within a slice and fails, as a fenced write does, and no further attempt is made; a
    /// derived client's calls (the Lease's, a release, Events) are never cut.
    pub fn set_between_requests(&self, between: Between) {
        self.conn.between.set(between);
    }

    /// Runs the hook of [`KubeClient::set_between_requests`] for `d`, or sleeps `d`.
    /// Returns the hook's answer: false when the caller's term is over (no hook: true).
    fn between(&self, d: Duration) -> bool {
        self.conn.between.run(d)
    }

    /// The error of a call cut because the hook said the term of this process is over
    /// (it no longer leads): nothing more is sent.
    fn term_over(req: &Request) -> KubeError {
        KubeError::Transport {
            verb: req.verb.to_string(),
            kind: TransportKind::Other,
            message: "cut: this process no longer holds the leader lease".to_string(),
        }
    }

    /// Gives `other` (a client derived from this one, e.g. with shorter timeouts) this
    /// client's write fence ([`KubeClient::set_write_fence`]), if it has one.
    pub fn share_write_fence(&self, other: &KubeClient) {
        if let Some(f) = self.conn.write_fence.get() {
            other.set_write_fence(Arc::clone(f));
        }
    }

    /// Whether a write may be sent now: the answer of the write fence
    /// ([`KubeClient::set_write_fence`]), true without one.
    pub fn write_allowed(&self) -> bool {
        self.conn.write_fence.get().is_none_or(|f| f())
    }

    /// How long one call may take, every attempt included (`--request-timeout`).
    pub fn request_timeout(&self) -> Duration {
        self.conn.options.timeouts.global
    }

    /// The deadline set by [`KubeClient::set_deadline`] (`None`: none).
    pub fn deadline(&self) -> Option<Instant> {
        lock(&self.deadline).as_ref().map(|d| d.at)
    }

    /// The fence check of [`KubeClient::set_write_fence`] for one request.
    fn check_write_fence(&self, req: &Request) -> Result<(), KubeError> {
        let Some(fence) = self.conn.write_fence.get() else {
            return Ok(());
        };
        if req.method == Method::GET || req.res == &LEASES {
            return Ok(());
        }
        if fence() {
            return Ok(());
        }
        Err(KubeError::Transport {
            verb: req.verb.to_string(),
            kind: TransportKind::Other,
            message: "not sent: this process no longer holds the leader lease".to_string(),
        })
    }

    /// Another client for the same cluster and credentials with other options (e.g. the
    /// short timeouts of leader election). Errors as [`KubeClient::with_options`].
    pub fn derive(&self, mut options: ClientOptions) -> Result<KubeClient, KubeError> {
        options.redactions = self.conn.options.redactions.clone();
        Self::build(
            self.conn.cfg.clone(),
            options,
            (
                Arc::clone(&self.conn.requests_by),
                self.conn.between.derived(),
                (
                    Arc::clone(&self.conn.exec),
                    Arc::clone(&self.conn.plugin_pid),
                ),
            ),
        )
    }

    /// [`KubeClient::derive`] for side calls (Events) that must not run an exec plugin of
    /// their own: with an exec plugin that has returned a token (and no client
    /// certificate), the new client uses that token as a fixed bearer token; a later 401
    /// is the caller's to settle by deriving again. Otherwise as `derive`. Errors as
    /// [`KubeClient::with_options`].
    pub fn derive_with_current_credential(
        &self,
        mut options: ClientOptions,
    ) -> Result<KubeClient, KubeError> {
        options.redactions = self.conn.options.redactions.clone();
        let mut cfg = self.conn.cfg.clone();
        if let Credential::Exec(exec) = &self.conn.cfg.credential {
            let cache = lock(&self.conn.exec);
            let cred = cache.cred.as_ref();
            if let Some((Some(token), None)) = cred.map(|c| (&c.token, &c.client_certificate)) {
                cfg.credential = Credential::Token {
                    token: token.clone(),
                    source: format!("{} (the token it returned last)", exec.describe()),
                };
            }
        }
        Self::build(
            cfg,
            options,
            (
                Arc::clone(&self.conn.requests_by),
                self.conn.between.derived(),
                (
                    Arc::clone(&self.conn.exec),
                    Arc::clone(&self.conn.plugin_pid),
                ),
            ),
        )
    }
}

/// What the client reads from a response's headers: `Retry-After` (whole seconds), the
/// `Location` of a redirect (userinfo removed) and the texts of `Warning` headers.
fn response_headers(h: &ureq::http::HeaderMap) -> (Option<u64>, Option<String>, Vec<String>) {
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    let retry_after = text("retry-after").and_then(|s| s.trim().parse::<u64>().ok());
    let location = text("location").map(|s| redact_userinfo(s.trim()));
    let warnings = (h.get_all("warning").iter())
        .filter_map(|v| v.to_str().ok())
        .filter_map(warning_text)
        .collect();
    (retry_after, location, warnings)
}
