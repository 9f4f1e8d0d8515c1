//! `watch=true` on pod lists, modelled on kube-apiserver's watch cache (`storage/cacher`)
//! and its watch handler (`endpoints/handlers/watch.go`).
//!
//! The store appends every pod create, update (spec, metadata or status) and delete to a
//! `Feed` (`feed.rs`): a bounded ring of the most recent changes, each with its resourceVersion, under
//! the store's lock (so a list snapshot and the feed never disagree). A watch then streams
//! newline-delimited `{"type":…,"object":…}` events, one HTTP chunk per batch, flushed as
//! they happen:
//!
//! - `resourceVersion` unset or `"0"`: a synthetic `ADDED` for every current pod the
//!   selectors match (in key order), then every change after that state, as the cacher
//!   serves "Get State and Start at Most Recent"/"Start at Any".
//! - `resourceVersion=N`: the changes after N. The history starts with the store (as a
//!   fresh cluster's watch cache starts at etcd's first revision), so until the ring has
//!   dropped a change every N replays all changes after it; N older than the oldest change
//!   the ring still holds is the cacher's `too old resource version: N (OLDEST)`, sent as an
//!   `ERROR` event carrying a 410 `Expired` Status, after which the stream ends (the client
//!   relists).
//! - `labelSelector`/`fieldSelector` filter as `cacheWatcher.convertToWatchEvent` does: a
//!   change that makes a pod match is an `ADDED`, one that makes it stop matching a
//!   `DELETED` (the old object with the change's resourceVersion), and a `DELETED` carries
//!   the last state with the deletion's resourceVersion.
//! - `allowWatchBookmarks=true`: a `BOOKMARK` (an empty Pod with only
//!   `metadata.resourceVersion`) a minute after the start and every minute after, and 2 s
//!   before the timeout when that comes first, as the cacher schedules them.
//! - `sendInitialEvents=true` (needs `resourceVersionMatch=NotOlderThan` and
//!   `allowWatchBookmarks=true`, else 422 as `ValidateListOptions`): the initial `ADDED`s,
//!   then a `BOOKMARK` annotated `k8s.io/initial-events-end: "true"` (the watch-list stream).
//! - `timeoutSeconds`: the stream ends then; unset or 0 is the apiserver's random
//!   `minRequestTimeout * [1, 2)`, 30 to 60 minutes. The stream also ends when the server
//!   shuts down, and when a watcher falls so far behind that the ring dropped changes it
//!   had not read (the cacher closes such a watcher too).
//! - A `Table` `Accept` (kubectl `get -w`): each object is a one-row Table, with the column
//!   definitions in the first event only (`NoHeaders` after it, as `watchEmbeddedEncoder`).
//!
//! Deliberately not modelled: a resourceVersion ahead of the store waits for changes after
//! it (the cacher may answer "Too large resource version" after 3 s); bookmarks are never
//! converted to Tables; the watch-list bookmark has no `initial-events-list-blueprint`
//! annotation; watch over WebSocket, Protobuf and CBOR are not served; ConfigMaps, Leases
//! and Events do not serve watch (a 400 says so).

use std::io::{self, Write};

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::feed::{Change, Start, Wait};
use super::http::{Body, Response};
use super::respond::pod_table_of;
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::StoredPod;
use super::util::SplitMix64;
use super::validation::FieldError;

/// The cacher's bookmark period (`bookmarkFrequency`).
const BOOKMARK_EVERY: Duration = Duration::from_secs(60);
/// A bookmark goes this long before the watch's timeout (the cacher's `nextBookmarkTime`).
const BOOKMARK_BEFORE_END: Duration = Duration::from_secs(2);
/// The apiserver's `--min-request-timeout` default: a watch without `timeoutSeconds` lasts
/// this long times a random factor in `[1, 2)`.
const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(1800);
/// The annotation of the bookmark that ends a watch-list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// The parameters of a pod watch (`ListOptions` as a watch reads them).
pub(crate) struct WatchParams {
    /// `resourceVersion`; `None`: unset or `"0"` (start from the current state).
    pub rv: Option<u64>,
    /// `timeoutSeconds`, or the random default.
    pub timeout: Duration,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true` (a watch-list).
    pub initial_events: bool,
    /// The client asked for Tables (`Accept`).
    pub table: bool,
    /// The namespace of the request; `None` across namespaces.
    pub ns: Option<String>,
    /// `labelSelector`.
    pub label: LabelSelector,
    /// `fieldSelector` (the pod fields).
    pub field: FieldSelector,
}

fn invalid_list_options(errs: &[FieldError]) -> ApiError {
    ApiError::invalid("ListOptions.meta.k8s.io", "", errs)
}

fn flag(v: Option<&str>) -> bool {
    matches!(v, Some("true" | "1"))
}

impl WatchParams {
    /// Reads the watch's query: `param` looks a parameter up. Errors: 400 for a
    /// resourceVersion or timeoutSeconds that is not a number, 422 for the combinations
    /// `ValidateListOptions` forbids.
    pub(crate) fn parse<'a>(
        param: impl Fn(&str) -> Option<&'a str>,
        ns: Option<&str>,
        label: LabelSelector,
        field: FieldSelector,
        table: bool,
    ) -> Result<WatchParams, ApiError> {
        let rv =
            match param("resourceVersion").unwrap_or("") {
                "" | "0" => None,
                s => Some(s.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!("invalid resource version: {s:?}"))
                })?),
            };
        let timeout = match param("timeoutSeconds").unwrap_or("") {
            "" | "0" => random_timeout(),
            s => Duration::from_secs(s.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("strconv.ParseInt: parsing {s:?}: invalid syntax"))
            })?),
        };
        let bookmarks = flag(param("allowWatchBookmarks"));
        let initial_events = flag(param("sendInitialEvents"));
        let rv_match = param("resourceVersionMatch").unwrap_or("");
        let mut errs = Vec::new();
        if param("sendInitialEvents").is_some() {
            if rv_match != "NotOlderThan" {
                errs.push(FieldError::forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !bookmarks {
                errs.push(FieldError::forbidden(
                    "allowWatchBookmarks",
                    "sendInitialEvents requires setting allowWatchBookmarks to true",
                ));
            }
        } else if !rv_match.is_empty() {
            errs.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
        if !errs.is_empty() {
            return Err(invalid_list_options(&errs));
        }
        Ok(WatchParams {
            rv,
            timeout,
            bookmarks,
            initial_events,
            table,
            ns: ns.map(str::to_string),
            label,
            field,
        })
    }

    fn selects(&self, p: &StoredPod) -> bool {
        self.ns.as_deref().is_none_or(|ns| p.namespace() == ns)
            && self.label.matches(&p.labels)
            && self.field.matches(|f| p.field(f))
    }
}

/// `minRequestTimeout * (1 + rand)`, as the apiserver's watch handler draws it.
fn random_timeout() -> Duration {
    let draw = (SplitMix64::from_entropy().next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    MIN_REQUEST_TIMEOUT.mul_f64(1.0 + draw)
}

/// The pod's JSON as a single object with `metadata.resourceVersion` set to `rv` (a
/// `DELETED` event's object).
fn with_rv(p: &StoredPod, rv: u64) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&p.object_json()).unwrap_or_default();
    v["metadata"]["resourceVersion"] = json!(rv.to_string());
    serde_json::to_vec(&v).unwrap_or_default()
}

/// The event `c` is for a watcher with `w`'s selectors, if any: its type and object JSON.
fn event_for(c: &Change<StoredPod>, w: &WatchParams) -> Option<(&'static str, Vec<u8>)> {
    let cur = c.obj.as_ref().filter(|p| w.selects(p));
    let old = c.prev.as_ref().filter(|p| w.selects(p));
    match (cur, old) {
        (Some(p), None) => Some(("ADDED", p.object_json())),
        (Some(p), Some(_)) => Some(("MODIFIED", p.object_json())),
        (None, Some(p)) => Some(("DELETED", with_rv(p, c.rv))),
        (None, None) => None,
    }
}

/// An empty Pod carrying only `metadata.resourceVersion` (and the watch-list annotation
/// for the bookmark that ends the initial events).
fn bookmark(rv: u64, initial_end: bool) -> Vec<u8> {
    let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end {
        meta["annotations"] = json!({ INITIAL_EVENTS_END: "true" });
    }
    json!({"kind": "Pod", "apiVersion": "v1", "metadata": meta,
           "spec": {"containers": null}, "status": {}})
    .to_string()
    .into_bytes()
}

/// Writes events in the framing of the JSON watch stream, converting objects to Tables
/// when asked.
struct Encoder<'w> {
    out: &'w mut dyn Write,
    table: bool,
    /// The column definitions have been sent (only the first Table carries them).
    headers_sent: bool,
}

impl Encoder<'_> {
    fn event(&mut self, kind: &str, object: &[u8]) -> io::Result<()> {
        write!(self.out, r#"{{"type":"{kind}","object":"#)?;
        if self.table && matches!(kind, "ADDED" | "MODIFIED" | "DELETED") {
            let table = self.as_table(object);
            self.out.write_all(&table)?;
        } else {
            self.out.write_all(object)?;
        }
        self.out.write_all(b"}\n")
    }

    /// A one-row Table of the pod `object`, at its resourceVersion.
    fn as_table(&mut self, object: &[u8]) -> Vec<u8> {
        let Body::Bytes(b) = pod_table_of(object).body else {
            return Vec::new();
        };
        if !self.headers_sent {
            self.headers_sent = true;
            return b;
        }
        let mut t: Value = serde_json::from_slice(&b).unwrap_or_default();
        t["columnDefinitions"] = Value::Null;
        serde_json::to_vec(&t).unwrap_or_default()
    }
}

/// The 200 response streaming the watch `w` from `start` (see the module docs).
pub(crate) fn response(start: Start<StoredPod>, w: WatchParams) -> Response {
    Response {
        status: 200,
        content_type: "application/json",
        headers: Vec::new(),
        body: Body::Watch(Box::new(move |out| stream(out, start, &w))),
    }
}

/// Runs a watch until its timeout, the server's shutdown, a write error or a too-old
/// resourceVersion; each batch of events is one flushed chunk.
fn stream(out: &mut dyn Write, start: Start<StoredPod>, w: &WatchParams) -> io::Result<()> {
    let begun = Instant::now();
    let deadline = begun + w.timeout;
    let mut enc = Encoder {
        out,
        table: w.table,
        headers_sent: false,
    };
    let mut seen = match w.rv {
        Some(rv) if !w.initial_events => rv,
        _ => {
            for p in start.current.iter().filter(|p| w.selects(p)) {
                enc.event("ADDED", &p.object_json())?;
            }
            if w.initial_events {
                enc.event("BOOKMARK", &bookmark(start.rv, true))?;
            }
            start.rv
        }
    };
    enc.out.flush()?;
    let mut next_bookmark = w
        .bookmarks
        .then(|| bookmark_after(begun, deadline))
        .flatten();
    // Only a start from the client's resourceVersion can be too old; later, the ring
    // dropped changes this watcher had not read, and the cacher closes such a watcher.
    let mut client_rv = w.rv.is_some() && !w.initial_events;
    loop {
        let until = next_bookmark.map_or(deadline, |b| b.min(deadline));
        let got = start.feed.wait_after(seen, until);
        let first = std::mem::replace(&mut client_rv, false);
        match got {
            Wait::Stopped => return Ok(()),
            Wait::TooOld(_) if !first => return Ok(()),
            Wait::TooOld(oldest) => {
                let e =
                    ApiError::expired(format!("too old resource version: {seen} ({oldest})"), None);
                enc.event("ERROR", &e.to_json())?;
                return enc.out.flush();
            }
            Wait::Changes(changes) => {
                for c in &changes {
                    if let Some((kind, obj)) = event_for(c, w) {
                        enc.event(kind, &obj)?;
                    }
                    seen = c.rv;
                }
                enc.out.flush()?;
            }
            Wait::Timeout => {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(());
                }
                if next_bookmark.is_some_and(|b| now >= b) {
                    enc.event("BOOKMARK", &bookmark(seen, false))?;
                    enc.out.flush()?;
                    next_bookmark = bookmark_after(now, deadline);
                }
            }
        }
    }
}

/// When the next periodic bookmark is due after `from`: a minute later, or 2 s before the
/// deadline if that is sooner; `None` when neither is still ahead.
fn bookmark_after(from: Instant, deadline: Instant) -> Option<Instant> {
    let before_end = deadline
        .checked_sub(BOOKMARK_BEFORE_END)
        .filter(|t| *t > from);
    let periodic = from + BOOKMARK_EVERY;
    match before_end {
        Some(e) => Some(e.min(periodic)),
        None => (periodic < deadline).then_some(periodic),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feed::Feed;
    use std::sync::Arc;

    fn change(rv: u64) -> Change<u64> {
        Change {
            rv,
            obj: Some(Arc::new(rv)),
            prev: None,
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_and_says_when_a_start_is_too_old() {
        let feed: Feed<u64> = Feed::new(3, 100);
        for rv in [101, 102, 103, 104, 105] {
            feed.push(change(rv));
        }
        // 101 and 102 were dropped: a watch can start from 102 (it needs 103..) but not 101.
        assert_eq!(feed.oldest(), 102);
        let soon = Instant::now();
        assert!(matches!(feed.wait_after(101, soon), Wait::TooOld(102)));
        let Wait::Changes(c) = feed.wait_after(102, soon) else {
            panic!("changes expected");
        };
        assert_eq!(c.iter().map(|c| c.rv).collect::<Vec<_>>(), [103, 104, 105]);
        assert!(matches!(feed.wait_after(105, soon), Wait::Timeout));
    }

    #[test]
    fn a_waiting_watcher_wakes_on_a_push_and_on_stop() {
        let feed: Arc<Feed<u64>> = Arc::new(Feed::new(8, 0));
        let f = Arc::clone(&feed);
        let waiter = std::thread::spawn(move || {
            let far = Instant::now() + Duration::from_secs(30);
            let got = match f.wait_after(0, far) {
                Wait::Changes(c) => c[0].rv,
                _ => 0,
            };
            (got, matches!(f.wait_after(got, far), Wait::Stopped))
        });
        std::thread::sleep(Duration::from_millis(50));
        feed.push(change(7));
        std::thread::sleep(Duration::from_millis(50));
        let t = Instant::now();
        feed.stop();
        assert_eq!(waiter.join().unwrap(), (7, true));
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    /// A writer that, at its first flush, pushes `burst` changes into `feed` (a watcher that
    /// reads too slowly: the ring moves past it between two waits).
    struct Burst {
        out: Vec<u8>,
        feed: Arc<Feed<StoredPod>>,
        burst: u64,
    }

    impl Write for Burst {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.out.extend_from_slice(b);
            Ok(b.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            for rv in 1..=std::mem::take(&mut self.burst) {
                let name = format!("p{rv}");
                let v = json!({"metadata": {"name": name, "namespace": "ns",
                                            "resourceVersion": rv.to_string()}});
                let p = Arc::new(StoredPod::new(&format!("ns/{name}"), 2, &v));
                self.feed.push(Change {
                    rv,
                    obj: Some(p),
                    prev: None,
                });
            }
            Ok(())
        }
    }

    /// A watch of every namespace with a 5 s timeout, from `rv`.
    fn params(rv: Option<u64>) -> WatchParams {
        let param = |k: &str| (k == "timeoutSeconds").then_some("5");
        let (label, field) = (LabelSelector::default(), FieldSelector::default());
        let mut w = WatchParams::parse(param, None, label, field, false).unwrap();
        w.rv = rv;
        w
    }

    #[test]
    fn a_watcher_the_ring_left_behind_is_closed_without_an_error_event() {
        let feed = Arc::new(Feed::new(4, 0));
        let mut out = Burst {
            out: Vec::new(),
            feed: Arc::clone(&feed),
            burst: 10,
        };
        let t = Instant::now();
        stream(&mut out, Start::new(&feed, 0, Vec::new()), &params(None)).unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "it waited for the timeout"
        );
        assert!(out.out.is_empty(), "{}", String::from_utf8_lossy(&out.out));
        // The same start given by the client is a 410 ERROR event.
        let mut out = Burst {
            out: Vec::new(),
            feed: Arc::clone(&feed),
            burst: 0,
        };
        stream(
            &mut out,
            Start::new(&feed, 10, Vec::new()),
            &params(Some(1)),
        )
        .unwrap();
        let text = String::from_utf8(out.out).unwrap();
        assert!(
            text.starts_with(r#"{"type":"ERROR","object":{"kind":"Status""#),
            "{text}"
        );
        assert!(text.contains("too old resource version: 1 (6)"), "{text}");
    }

    #[test]
    fn bookmarks_come_every_minute_and_just_before_the_end() {
        let t = Instant::now();
        let long = t + Duration::from_secs(600);
        assert_eq!(bookmark_after(t, long), Some(t + BOOKMARK_EVERY));
        let short = t + Duration::from_secs(10);
        assert_eq!(bookmark_after(t, short), Some(short - BOOKMARK_BEFORE_END));
        assert_eq!(bookmark_after(short - Duration::from_secs(1), short), None);
    }

    #[test]
    fn the_default_timeout_is_thirty_to_sixty_minutes() {
        for _ in 0..100 {
            let d = random_timeout();
            assert!(
                d >= MIN_REQUEST_TIMEOUT && d < 2 * MIN_REQUEST_TIMEOUT,
                "{d:?}"
            );
        }
    }
}
