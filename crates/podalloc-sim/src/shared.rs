//! The state the server's threads share (`server.rs` starts them; `api.rs` handles each
//! request with it).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::faults::FaultState;
use super::options::SimStats;
use super::reqlog::RequestLog;
use super::store::Store;

pub(crate) type ConnMap = HashMap<u64, (TcpStream, Option<JoinHandle<()>>)>;

/// State shared by the server's threads.
pub(crate) struct Shared {
    pub(crate) store: Mutex<Store>,
    /// Wakes the kubelet thread when new events are queued (and on shutdown).
    pub(crate) kubelet: Condvar,
    pub(crate) token: Option<String>,
    pub(crate) requests: AtomicU64,
    pub(crate) faults: Mutex<FaultState>,
    /// Verbs denied as RBAC would.
    pub(crate) forbid: Vec<String>,
    /// Added before every `/api` request.
    pub(crate) latency: Duration,
    pub(crate) log: Mutex<RequestLog>,
    /// `SimOptions::users`.
    pub(crate) users: Vec<(String, String)>,
    /// Users cut off from the API until the given time (`SimServer::cut_off`).
    pub(crate) cuts: Mutex<HashMap<String, Instant>>,
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    /// Set once by `shutdown`; every loop checks it.
    pub(crate) stopping: AtomicBool,
    pub(crate) stopped: Mutex<bool>,
    pub(crate) stopped_cv: Condvar,
    /// Open connections, to close them on shutdown.
    pub(crate) conns: Mutex<ConnMap>,
    pub(crate) next_conn: AtomicU64,
    /// The acceptor first, then the kubelet.
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
    /// Where `shutdown` connects to wake the acceptor.
    pub(crate) wake_addr: SocketAddr,
}

/// Locks `m`, also when a thread panicked holding it.
pub(crate) fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The counters now, for `SimServer::stats` and `GET /sim/stats`.
pub(crate) fn collect_stats(shared: &Shared, now: Instant) -> SimStats {
    let mut s = relock(&shared.store).stats(now);
    s.requests = shared.requests.load(Ordering::Relaxed);
    s.faults_injected = relock(&shared.faults).injected();
    s
}

impl Shared {
    /// Whether namespace `ns` exists (see `SimOptions::namespaces`).
    pub(crate) fn namespace_exists(&self, ns: &str) -> bool {
        relock(&self.store).reg.namespace_exists(ns)
    }
}
