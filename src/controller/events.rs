//! Kubernetes Events, posted the way a ReplicaSet controller posts them, so that
//! `kubectl describe pod DRIVER` (or `kubectl get events`) tells what the allocator did and
//! why:
//!
//! | reason | type | when |
//! |---|---|---|
//! | `SuccessfulCreate` | Normal | an executor pod was created |
//! | `FailedCreate` | Warning | a create was refused (quota, 422, RBAC, …): `Error creating: …` |
//! | `SuccessfulDelete` | Normal | an executor pod was deleted, with why (excess, failed, timed out, stuck, removed, succeeded) |
//! | `ExecutorFailed` | Warning | an executor pod failed (exit code, OOMKilled) or cannot start (image pull) |
//! | `AllocationBlocked` | Normal/Warning | the target is not reached and nothing is created (the plan's `blocked`) |
//! | `CrashLoopHalt` | Warning | the crash-loop guard stopped creation |
//!
//! Events go on the driver pod when `--driver-pod` names one, else on the executor pod
//! concerned (`involvedObject` with its uid, which `kubectl describe` matches on); without
//! a driver, the events that concern no single pod (`AllocationBlocked`, `CrashLoopHalt`)
//! are only logged. They are core/v1 Events (`POST /api/v1/namespaces/NS/events`) with
//! `source.component` and `reportingComponent` `podalloc`. Naming the pod costs no request:
//! the driver's uid is the one the tick read for its ownerReferences, an executor's comes
//! from the list, and a pod created this tick has the uid the create's response (the Pod as
//! stored) carried; only a created pod whose answer had no uid is read (`GET`) for it.
//!
//! The [`Recorder`] correlates them as client-go's event recorder does
//! (`k8s.io/client-go/tools/record`, `EventCorrelator`):
//! - a spam filter: a token bucket per source and involved object, 25 events of burst
//!   refilled at one per 5 minutes; events beyond it (new ones and repeats alike) are
//!   dropped. The buckets live in the process: a long `run` is limited, each one-shot
//!   `reconcile` starts with a full bucket. Without a driver pod, the Normal events of an
//!   app's executor pods (`SuccessfulCreate`, `SuccessfulDelete`, …) share one bucket, the
//!   app's: a ReplicaSet posts its pods' creates on itself, so client-go bounds them at 25 a
//!   burst per ReplicaSet, and an app scaled to 100 executors is bounded the same way
//!   instead of posting 100 events (one request each). Warnings keep their pod's own
//!   bucket, so a failure is never dropped because creates used the app's tokens;
//! - an aggregator: more than 10 events within 10 minutes that differ only in their message
//!   (same source, involved object, type and reason) become one event whose message starts
//!   `(combined from similar events): `;
//! - a logger: an event identical to one already posted (same involved object, type,
//!   reason, message) PATCHes that Event's `count` and `lastTimestamp` instead of creating
//!   another.
//!
//! Unlike client-go, an Event's name is derived from what it says (`INVOLVED.HASH`) rather
//! than the time, so a later process (a CronJob's next `reconcile`) whose create meets 409
//! AlreadyExists reads the existing Event and raises its count: aggregation survives
//! restarts. Posting an event never fails a tick: an error is logged (the first as a
//! warning, later ones at debug level) and the event dropped. The loop posts a tick's
//! events itself at the end of the tick ([`Poster::post_queued`]: at most
//! [`EVENT_DEADLINE`] in all, within the tick's budget, only while this process leads);
//! there is no poster thread.

use crate::engine::alloc::{Blocked, DeleteReason, Outcomes, Plan};
use crate::engine::podspec::Owner;
use crate::engine::snapshot::{ExecutorPod, ExecutorState, Snapshot};
use crate::error::Error;
use crate::kube::{Api, KubeClient, KubeError, Patch, PostParams, EVENTS, PODS};
use log::{debug, info, warn};
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `source.component` and `reportingComponent` of every event.
pub(crate) const COMPONENT: &str = "podalloc";
/// The spam filter's burst (client-go's `defaultSpamBurst`).
pub(crate) const SPAM_BURST: f64 = 25.0;
/// The spam filter's refill: one event per 300 s (client-go's `defaultSpamQPS`, 1/300).
pub(crate) const SPAM_REFILL_MS: u64 = 300_000;
/// Distinct messages within [`AGGREGATE_WINDOW_MS`] after which similar events are combined
/// (client-go's `defaultAggregateMaxEvents`).
pub(crate) const AGGREGATE_MAX_EVENTS: usize = 10;
/// The aggregator's window (client-go's `defaultAggregateIntervalInSeconds`, 600 s).
pub(crate) const AGGREGATE_WINDOW_MS: u64 = 600_000;
/// Entries each cache keeps before it is cleared (client-go's LRUs hold 4096).
const MAX_CACHE: usize = 4096;

/// The object an event is about (core/v1 `ObjectReference`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ObjectRef {
    /// `Pod`.
    pub kind: String,
    /// The namespace (the event lives there too).
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The object's `metadata.uid` (`kubectl describe` matches on it).
    pub uid: String,
}

impl ObjectRef {
    /// A pod in `namespace`.
    pub(crate) fn pod(namespace: &str, name: &str, uid: &str) -> ObjectRef {
        ObjectRef {
            kind: "Pod".into(),
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn key(&self) -> String {
        format!(
            "{}\u{0}{}\u{0}{}\u{0}{}",
            self.kind, self.namespace, self.name, self.uid
        )
    }
}

/// One event to post.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EventSpec {
    /// What it is about.
    pub involved: ObjectRef,
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    /// A CamelCase reason (`SuccessfulCreate`, …).
    pub reason: &'static str,
    /// One human line.
    pub message: String,
    /// The spam filter's bucket when it is not the involved object's: the app's
    /// (`app\0NAMESPACE\0APP`) for the Normal events a tick posts on executor pods when
    /// there is no driver pod, so that they share one bucket as a ReplicaSet's events share
    /// the ReplicaSet's. `None`: the involved object's, as client-go.
    pub bucket: Option<String>,
}

/// What the logger remembers of a posted event.
#[derive(Clone, Debug)]
struct Posted {
    name: String,
    count: u64,
}

/// Messages seen for one aggregate key since `start_ms`.
#[derive(Clone, Debug)]
struct Similar {
    start_ms: u64,
    messages: BTreeSet<String>,
}

/// The event correlator and its caches (see the module docs). One per process.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// Spam key → (tokens, last refill ms).
    buckets: BTreeMap<String, (f64, u64)>,
    /// Aggregate key → recent distinct messages.
    similar: BTreeMap<String, Similar>,
    /// Event key → the Event posted for it.
    posted: BTreeMap<String, Posted>,
    /// A failure to post was already logged as a warning.
    warned: bool,
    /// Events posted (created or patched), for tests and logs.
    pub sent: u64,
}

/// A short stable hash (FNV-1a, 64 bits) as 16 hex digits, for event names.
fn hash_hex(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// RFC 3339 with whole seconds (metav1.Time) for `ms` since the Unix epoch.
fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

impl Recorder {
    /// Takes a token from the spam filter's bucket for `ev`; false: drop the event.
    fn allow(&mut self, ev: &EventSpec, now_ms: u64) -> bool {
        if self.buckets.len() >= MAX_CACHE {
            self.buckets.clear();
        }
        // client-go's `getSpamKey`: the source and the involved object only (or the app's
        // bucket, see `EventSpec::bucket`).
        let key = ev.bucket.clone().unwrap_or_else(|| ev.involved.key());
        let (tokens, last) = self.buckets.entry(key).or_insert((SPAM_BURST, now_ms));
        let refill = now_ms.saturating_sub(*last) as f64 / SPAM_REFILL_MS as f64;
        *tokens = (*tokens + refill).min(SPAM_BURST);
        *last = now_ms;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// The aggregator: after [`AGGREGATE_MAX_EVENTS`] distinct messages of similar events
    /// within the window, the event becomes the combined one. Returns the event and the
    /// logger's key for it: its own, or the aggregate key for a combined event (so that
    /// later similar events raise the combined Event's count).
    fn aggregate(&mut self, mut ev: EventSpec, now_ms: u64) -> (EventSpec, String) {
        if self.similar.len() >= MAX_CACHE {
            self.similar.clear();
        }
        let key = format!("{}{}{}", ev.involved.key(), ev.kind, ev.reason);
        let s = self.similar.entry(key.clone()).or_insert(Similar {
            start_ms: now_ms,
            messages: BTreeSet::new(),
        });
        if now_ms.saturating_sub(s.start_ms) > AGGREGATE_WINDOW_MS {
            s.start_ms = now_ms;
            s.messages.clear();
        }
        s.messages.insert(ev.message.clone());
        if s.messages.len() >= AGGREGATE_MAX_EVENTS {
            ev.message = format!("(combined from similar events): {}", ev.message);
            return (ev, format!("{key}\u{0}combined"));
        }
        let own = format!("{key}\u{0}{}", ev.message);
        (ev, own)
    }

    /// Correlates `ev` and posts it through `events` (the Events of the involved object's
    /// namespace): a new Event, or a PATCH of the count of the same one. Returns the
    /// Event's count after the post, `None` when the spam filter dropped it.
    ///
    /// Errors: the API's, as [`Api::create`], [`Api::get`] and [`Api::patch`] return them.
    pub(crate) fn record(
        &mut self,
        events: &Api<'_>,
        ev: EventSpec,
        now_ms: u64,
    ) -> Result<Option<u64>, KubeError> {
        if !self.allow(&ev, now_ms) {
            debug!(
                "event {} on {} dropped by the spam filter",
                ev.reason, ev.involved.name
            );
            return Ok(None);
        }
        let (ev, key) = self.aggregate(ev, now_ms);
        if self.posted.len() >= MAX_CACHE {
            self.posted.clear();
        }
        let now = rfc3339(now_ms);
        if let Some(p) = self.posted.get(&key).cloned() {
            let count = p.count + 1;
            match patch_count(events, &p.name, count, &ev.message, &now) {
                Ok(()) => {
                    self.posted.insert(key, Posted { count, ..p });
                    self.sent += 1;
                    return Ok(Some(count));
                }
                // Gone (expired or deleted): post it again as a new Event.
                Err(KubeError::Api { ref status, .. }) if status.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        // At most 253 characters (a DNS subdomain): the object's name, cut, then `.HASH`.
        let base: String = ev.involved.name.chars().take(253 - 17).collect();
        let name = format!("{base}.{}", hash_hex(&key));
        let count = match events.create(&event_json(&ev, &name, &now), &PostParams::default()) {
            Ok(_) => 1,
            Err(e) if e.is_already_exists() => {
                // Posted by an earlier process: count on from the stored Event.
                let stored = events.get(&name)?.unwrap_or_default();
                let count = stored["count"].as_u64().unwrap_or(1) + 1;
                patch_count(events, &name, count, &ev.message, &now)?;
                count
            }
            Err(e) => return Err(e),
        };
        self.posted.insert(key, Posted { name, count });
        self.sent += 1;
        Ok(Some(count))
    }

    /// [`Recorder::record`] that never fails: an error is logged once as a warning (with
    /// the RBAC hint for a 403), then at debug level; but when the client's write fence
    /// refuses now (this replica lost the Lease, also while the request waited: a process
    /// stopped and continued), one line says that instead, since it is why nothing was
    /// posted. Returns false when the request did not reach an answer (a timeout, a refused
    /// connection: a transport error) while this replica may still write.
    pub(crate) fn post(&mut self, events: &Api<'_>, ev: EventSpec, now_ms: u64) -> bool {
        let what = format!("{} on pod {}", ev.reason, ev.involved.name);
        let res = self.record(events, ev, now_ms);
        if let (Err(e), false) = (&res, events.client().write_allowed()) {
            info!(
                "event {what} not posted: this replica is no longer the leader (the leader \
                 posts the events from now on; the request: {e})"
            );
            return true;
        }
        let reached = !matches!(res, Err(KubeError::Transport { .. }));
        if let Err(e) = res {
            let hint = match &e {
                KubeError::Api { status, .. } if status.code == 403 => {
                    " (grant the service account events create, get and patch)"
                }
                _ => "",
            };
            if self.warned {
                debug!("could not post event {what}: {e}{hint}");
            } else {
                self.warned = true;
                warn!("could not post event {what}: {e}{hint}; events are best effort");
            }
        }
        reached
    }
}

/// The PATCH client-go's event sink sends for a repeated event.
fn patch_count(
    events: &Api<'_>,
    name: &str,
    count: u64,
    message: &str,
    now: &str,
) -> Result<(), KubeError> {
    let patch = json!({"count": count, "lastTimestamp": now, "message": message});
    events.patch(name, Patch::Strategic(&patch)).map(|_| ())
}

/// The core/v1 Event for `ev`, named `name`, first seen `now`.
fn event_json(ev: &EventSpec, name: &str, now: &str) -> Value {
    let o = &ev.involved;
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": o.namespace},
        "involvedObject": {
            "kind": o.kind, "namespace": o.namespace, "name": o.name,
            "uid": o.uid, "apiVersion": "v1",
        },
        "reason": ev.reason,
        "message": ev.message,
        "type": ev.kind,
        "source": {"component": COMPONENT},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": COMPONENT,
        "reportingInstance": "",
    })
}

/// The words a delete reason reads as in a message.
fn delete_words(r: DeleteReason) -> &'static str {
    match r {
        DeleteReason::TimedOut => "timed out: not seen within the creation timeout",
        DeleteReason::Excess => "excess: above the target",
        DeleteReason::Failed => "failed",
        DeleteReason::Succeeded => "succeeded",
        DeleteReason::Removed => "removed on request",
        DeleteReason::Stuck => "stuck: not started within the start-up grace",
        DeleteReason::DriverEnded => "the driver pod has ended",
        DeleteReason::Late => "created after its own delete (a late create)",
        DeleteReason::Disrupted => "disrupted: ended by Kubernetes, not a failure",
        DeleteReason::Lost => "lost: in phase Unknown longer than --unknown-timeout",
    }
}

/// The event type and message of a blocked plan (stable across ticks: no time left).
fn blocked_event(b: &Blocked) -> (&'static str, String) {
    match b {
        Blocked::Waiting { .. }
        | Blocked::MaxPending { .. }
        | Blocked::DriverPending
        | Blocked::Gated { .. } => ("Normal", format!("{b}")),
        Blocked::Terminating { pods, .. } => (
            "Normal",
            format!("waiting for {pods} terminating pods to go (--count-terminating)"),
        ),
        Blocked::Unknown { pods, .. } => (
            "Warning",
            format!("waiting for {pods} pods in phase Unknown (node not reporting)"),
        ),
        Blocked::Backoff { message, .. } => (
            "Warning",
            format!("no executor created: backing off after refused creates ({message})"),
        ),
        Blocked::CrashLoop | Blocked::IdsExhausted => {
            ("Warning", format!("no executor created: {b}"))
        }
    }
}

/// Why an executor failed or cannot start, if it did: `exit code 1`, `OOMKilled exit 137`,
/// `ImagePullBackOff`.
fn failure(p: &ExecutorPod) -> Option<String> {
    match p.state {
        ExecutorState::Failed => {
            Some((p.detail.clone().or_else(|| p.reason.clone())).unwrap_or_else(|| "failed".into()))
        }
        _ => p
            .waiting
            .as_deref()
            .filter(|w| {
                matches!(
                    *w,
                    "ErrImagePull"
                        | "ImagePullBackOff"
                        | "InvalidImageName"
                        | "CrashLoopBackOff"
                        | "CreateContainerConfigError"
                        | "CreateContainerError"
                )
            })
            .map(str::to_string),
    }
}

/// What one tick did, as the events a ReplicaSet would post (see the module docs). Pure:
/// the involved objects are resolved by the caller. `target(name, uid)` says where an
/// event about executor pod `name` goes; `None`: nowhere.
fn tick_events(
    snapshot: &Snapshot,
    plan: &Plan,
    out: &Outcomes,
    error: Option<&Error>,
    deleted: &[u64],
) -> Vec<(Option<u64>, &'static str, &'static str, String)> {
    let mut evs = Vec::new();
    for p in snapshot.executors.values() {
        if let (ExecutorState::Failed, Some(d)) = (p.state, &p.disruption) {
            let msg = format!(
                "Executor {} (pod {}) was disrupted by Kubernetes: {d}",
                p.id, p.name
            );
            evs.push((Some(p.id), "Normal", "ExecutorDisrupted", msg));
        } else if let Some(why) = failure(p) {
            let verb = match p.state {
                ExecutorState::Failed => "failed",
                _ => "cannot start",
            };
            let msg = format!("Executor {} (pod {}) {verb}: {why}", p.id, p.name);
            evs.push((Some(p.id), "Warning", "ExecutorFailed", msg));
        }
    }
    for d in plan
        .delete
        .iter()
        .filter(|d| deleted.contains(&d.executor_id))
    {
        let msg = format!(
            "Deleted executor pod: {} ({})",
            d.pod_name,
            delete_words(d.reason)
        );
        evs.push((Some(d.executor_id), "Normal", "SuccessfulDelete", msg));
    }
    for c in plan
        .create
        .iter()
        .filter(|c| out.created.contains(&c.executor_id))
    {
        let msg = format!("Created executor pod: {}", c.pod_name);
        evs.push((Some(c.executor_id), "Normal", "SuccessfulCreate", msg));
    }
    let failed = plan
        .create
        .iter()
        .find(|c| !out.created.contains(&c.executor_id));
    if let (Some(c), Some(e)) = (failed, error.filter(|_| plan.halt.is_none())) {
        let msg = format!("Error creating: {}", e.message);
        evs.push((Some(c.executor_id), "Warning", "FailedCreate", msg));
    }
    for (id, why) in &plan.refused_removals {
        evs.push((Some(*id), "Warning", "RemovalRefused", why.clone()));
    }
    if let Some(b) = &plan.blocked {
        let (kind, msg) = blocked_event(b);
        evs.push((None, kind, "AllocationBlocked", msg));
    }
    if let Some(h) = &plan.halt {
        let msg = format!("executor creation halted by the crash-loop guard: {h}");
        evs.push((None, "Warning", "CrashLoopHalt", msg));
    }
    evs
}

/// Where an executor pod's uid comes from for its events.
#[derive(Debug, PartialEq, Eq)]
enum Lookup {
    /// Known without a call: from the snapshot, the plan's delete, or the answer to this
    /// tick's create.
    Known(ObjectRef),
    /// Only the name is known (a pod created this tick whose create answer carried no uid):
    /// read the pod for it.
    Read(String),
}

/// Executor `id`'s reference, from what the tick already knows (pure): its uid from the
/// snapshot, from a planned delete, or from `created` (executor id → the uid the create's
/// response carried, see [`Done::uids`]); else the pod's name to read. `None`: the tick
/// never named that pod.
fn lookup(
    ns: &str,
    snapshot: &Snapshot,
    plan: &Plan,
    created: &BTreeMap<u64, String>,
    id: u64,
) -> Option<Lookup> {
    if let Some(p) = snapshot.executors.get(&id).filter(|p| !p.uid.is_empty()) {
        return Some(Lookup::Known(ObjectRef::pod(ns, &p.name, &p.uid)));
    }
    let create = plan.create.iter().find(|c| c.executor_id == id);
    let delete = plan.delete.iter().find(|d| d.executor_id == id);
    let name = (create.map(|c| &c.pod_name)).or_else(|| delete.map(|d| &d.pod_name))?;
    let uid = (delete.and_then(|d| d.uid.as_ref())).or_else(|| created.get(&id));
    Some(match uid {
        Some(uid) => Lookup::Known(ObjectRef::pod(ns, name, uid)),
        None => Lookup::Read(name.clone()),
    })
}

/// The executor pod's reference a [`lookup`] found: as known, or, for a pod whose uid the
/// tick does not know, read from the API (one GET).
fn executor_ref(client: &KubeClient, found: Lookup) -> Option<ObjectRef> {
    let ns = client.namespace();
    match found {
        Lookup::Known(r) => Some(r),
        Lookup::Read(name) => {
            let uid = client.api(&PODS).get(&name).ok()??["metadata"]["uid"]
                .as_str()?
                .to_string();
            Some(ObjectRef::pod(ns, &name, &uid))
        }
    }
}

/// Posts one Warning Event with `reason` and `message` on pod `name` (uid `uid`) in `ns` at
/// `now_ms` (ms since the Unix epoch),
/// through the process's recorder (correlated and rate-limited like the tick's events).
/// Does nothing with `--no-events`; never fails.
#[allow(clippy::too_many_arguments)]
pub(crate) fn warn_on_pod(
    poster: &Poster,
    client: &KubeClient,
    ns: &str,
    name: &str,
    uid: &str,
    reason: &'static str,
    message: &str,
    now_ms: u64,
) {
    if !poster.enabled {
        return;
    }
    let ev = EventSpec {
        involved: ObjectRef::pod(ns, name, uid),
        kind: "Warning",
        reason,
        message: message.to_string(),
        bucket: None,
    };
    poster.enqueue(client, ev, now_ms);
}

/// What a tick's calls did, as its events need it.
pub(crate) struct Done<'a> {
    /// The outcomes (created ids, deleted ids, …).
    pub out: &'a Outcomes,
    /// Executor id → `metadata.uid` of a pod created this tick, as the create's response
    /// (the Pod as stored) or the read that recognised our own pod after a 409 carried it.
    /// A created id missing here is read from the API for its events.
    pub uids: &'a BTreeMap<u64, String>,
    /// The tick's first error, if any.
    pub error: Option<&'a Error>,
    /// The driver pod as the tick read it (`--driver-pod`; `None`: no driver, or it is
    /// gone): the tick's events go on it. Each tick passes its own, so that one process
    /// managing many apps (`podalloc apps`) posts each app's events on that app's driver.
    pub driver: Option<&'a Owner>,
    /// The application id: without a driver, the Normal events on its executor pods share
    /// the app's spam-filter bucket ([`EventSpec::bucket`]).
    pub app_id: &'a str,
}

/// Posts the events of one tick (see the module docs): called once after the tick's calls
/// were made and its state saved. Without a driver pod, an event about a pod created this
/// tick names it with the uid in `done.uids`; only a pod missing there is read (GET) for
/// it. The queued events are then posted on this thread ([`Poster::post_queued`]) within
/// `client`'s deadline (the tick's budget). Does nothing with `--no-events`; never fails.
pub(crate) fn record_tick(
    poster: &Poster,
    client: &KubeClient,
    snapshot: &Snapshot,
    plan: &Plan,
    done: &Done<'_>,
    now_ms: u64,
) {
    if !poster.enabled {
        return;
    }
    let out = done.out;
    let evs = tick_events(snapshot, plan, out, done.error, &out.deleted_ids);
    let driver = (done.driver).map(|o| ObjectRef::pod(client.namespace(), &o.name, &o.uid));
    for (id, kind, reason, message) in evs {
        let involved = match (&driver, id) {
            (Some(d), _) => d.clone(),
            (None, Some(id)) => {
                let found = lookup(client.namespace(), snapshot, plan, done.uids, id);
                let Some(r) = found.and_then(|f| executor_ref(client, f)) else {
                    continue;
                };
                r
            }
            (None, None) => continue,
        };
        let bucket = (driver.is_none() && kind == "Normal")
            .then(|| format!("app\u{0}{}\u{0}{}", client.namespace(), done.app_id));
        let ev = EventSpec {
            involved,
            kind,
            reason,
            message,
            bucket,
        };
        poster.enqueue(client, ev, now_ms);
    }
    // Posted by the loop now, within the tick's budget (at most the events' deadline).
    let budget = client
        .deadline()
        .unwrap_or_else(|| Instant::now() + EVENT_DEADLINE);
    poster.post_queued(budget);
}

/// The deadline of one Event request (connect, each read, the whole call), with no retry:
/// an Event is best effort and never waits like a pod call. Also the time the events of one
/// tick may take in all ([`Poster::post_queued`]).
pub(crate) const EVENT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long no Event is sent after an Event request got no answer (timed out, refused):
/// an Events API that hangs costs a tick [`EVENT_DEADLINE`] once, not every tick.
pub(crate) const EVENT_BACKOFF: Duration = Duration::from_secs(30);

/// How many events may wait to be posted; one more is dropped with a log line.
pub(crate) const QUEUE_CAPACITY: usize = 256;

/// One event waiting to be posted: the client of its namespace, the event, its time.
struct Job {
    client: Arc<KubeClient>,
    ev: EventSpec,
    now_ms: u64,
}

/// How long an Event client is used before it is made again (it carries the credential
/// of the moment it was made: an exec plugin's token is not refreshed by it).
const CLIENT_TTL: Duration = Duration::from_secs(60);

/// The process's Events: whether they are posted (`--no-events`), the [`Recorder`], the
/// events waiting to be posted and the Event clients by server and namespace. Owned by the
/// process's services. No thread: the loop posts a tick's events at the end of the tick
/// ([`Poster::post_queued`]), under the tick's budget and the leader's fence; dropping it
/// posts those still queued for at most [`EVENT_DEADLINE`].
pub(crate) struct Poster {
    enabled: bool,
    recorder: RefCell<Recorder>,
    queue: RefCell<VecDeque<Job>>,
    /// No Event is sent before then ([`EVENT_BACKOFF`] after one got no answer).
    quiet_until: Cell<Option<Instant>>,
    dropped: Cell<u64>,
    /// Event clients by server and namespace (made once: [`EVENT_DEADLINE`], no retry).
    clients: RefCell<BTreeMap<String, (Instant, Arc<KubeClient>)>>,
}

impl Poster {
    /// A poster that posts (`enabled`) or does nothing (`--no-events`).
    pub(crate) fn new(enabled: bool) -> Poster {
        Poster {
            enabled,
            recorder: RefCell::new(Recorder::default()),
            queue: RefCell::new(VecDeque::new()),
            quiet_until: Cell::new(None),
            dropped: Cell::new(0),
            clients: RefCell::new(BTreeMap::new()),
        }
    }

    /// Whether Events are posted (not `--no-events`).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// The Event client for `client`'s server and namespace: its own short deadline
    /// ([`EVENT_DEADLINE`]) and no retries, the credential `client` holds now (an exec
    /// plugin is not run again for Events) and its write fence (no Event once this process
    /// is not the leader), made again after [`CLIENT_TTL`]. `None` when it cannot be made
    /// (logged at debug level).
    fn event_client(&self, client: &KubeClient) -> Option<Arc<KubeClient>> {
        let key = format!("{}|{}", client.server(), client.namespace());
        let mut clients = self.clients.borrow_mut();
        if let Some((made, c)) = clients.get(&key) {
            if made.elapsed() < CLIENT_TTL {
                return Some(Arc::clone(c));
            }
        }
        let mut options = crate::kube::ClientOptions::default();
        options.timeouts.connect = EVENT_DEADLINE;
        options.timeouts.per_read = EVENT_DEADLINE;
        options.timeouts.global = EVENT_DEADLINE;
        options.retry = crate::kube::RetryPolicy::none();
        match client.derive_with_current_credential(options) {
            Ok(c) => {
                client.share_write_fence(&c);
                let c = Arc::new(c);
                clients.insert(key, (Instant::now(), Arc::clone(&c)));
                Some(c)
            }
            Err(e) => {
                debug!("cannot make the events client: {e}");
                None
            }
        }
    }

    /// Queues an event for [`Poster::post_queued`], never blocking the tick: when
    /// [`QUEUE_CAPACITY`] events already wait, this one is dropped with a log line (a
    /// warning the first time, then debug).
    fn enqueue(&self, client: &KubeClient, ev: EventSpec, now_ms: u64) {
        let Some(client) = self.event_client(client) else {
            return;
        };
        let mut queue = self.queue.borrow_mut();
        if queue.len() < QUEUE_CAPACITY {
            queue.push_back(Job { client, ev, now_ms });
            return;
        }
        let dropped = self.dropped.get();
        self.dropped.set(dropped + 1);
        if dropped == 0 {
            warn!("{QUEUE_CAPACITY} events are waiting to be posted (the API server is slow to take them): dropping new ones; events are best effort");
        } else {
            debug!("event dropped: {QUEUE_CAPACITY} events are waiting");
        }
    }

    /// Posts the queued events in order, on the loop's thread, until `budget` has passed:
    /// each request ends by then (the Event client's deadline), and the events not posted
    /// by then wait for the next call. `budget` is the end of the tick's budget, at most
    /// [`EVENT_DEADLINE`] from now; after an Event request got no answer, none is sent
    /// for [`EVENT_BACKOFF`]. The leader's fence is asked before each event: once this
    /// process does not lead, the queued events are dropped (the leader posts its own).
    /// Returns how many are left queued.
    pub(crate) fn post_queued(&self, budget: Instant) -> usize {
        let end = budget.min(Instant::now() + EVENT_DEADLINE);
        if self.quiet_until.get().is_some_and(|q| Instant::now() < q) {
            return self.queue.borrow().len();
        }
        loop {
            let Some(job) = self.queue.borrow_mut().pop_front() else {
                return 0;
            };
            if !job.client.write_allowed() {
                let left = self.queue.borrow().len() + 1;
                self.queue.borrow_mut().clear();
                debug!("{left} event(s) not posted: this process no longer leads");
                return 0;
            }
            if Instant::now() >= end {
                self.queue.borrow_mut().push_front(job);
                let left = self.queue.borrow().len();
                debug!("{left} event(s) left for the next tick: out of the tick's budget");
                return left;
            }
            job.client
                .set_deadline(Some(end), "the events' share of the tick");
            let events = job.client.api_in(&job.ev.involved.namespace, &EVENTS);
            if !self.recorder.borrow_mut().post(&events, job.ev, job.now_ms) {
                self.quiet_until.set(Some(Instant::now() + EVENT_BACKOFF));
                let left = self.queue.borrow().len();
                debug!("{left} event(s) wait: an Event request got no answer");
                return left;
            }
        }
    }
}

/// A command's last events are posted before it exits (a one-shot `reconcile`'s too), for
/// at most one event deadline.
impl Drop for Poster {
    fn drop(&mut self) {
        let left = self.post_queued(Instant::now() + EVENT_DEADLINE);
        if left > 0 {
            debug!("{left} event(s) not posted before exit");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::testutil::{FakeServer, Reply};
    use std::sync::Arc;
    use std::sync::Mutex;

    /// A Status body for `code`/`reason`.
    fn status(code: u16, reason: &str) -> Reply {
        let body = json!({"kind": "Status", "code": code, "reason": reason, "message": reason});
        Reply::json(code, &body.to_string())
    }

    /// An events API that keeps what it is sent: a create of a taken name is 409
    /// AlreadyExists, a patch or get of a missing one 404; with `down`, every call is
    /// answered with that code instead.
    struct Events {
        server: FakeServer,
        store: Arc<Mutex<BTreeMap<String, Value>>>,
        client: KubeClient,
    }

    impl Events {
        fn new(down: Option<u16>) -> Events {
            let store = Arc::new(Mutex::new(BTreeMap::<String, Value>::new()));
            let kept = Arc::clone(&store);
            let server = FakeServer::http(move |r, _| {
                if let Some(code) = down {
                    return status(code, "Forbidden");
                }
                let mut store = kept.lock().unwrap();
                let name = r.path().rsplit('/').next().unwrap_or("").to_string();
                let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
                match r.method.as_str() {
                    "POST" => {
                        let name = body["metadata"]["name"].as_str().unwrap().to_string();
                        if store.contains_key(&name) {
                            return status(409, "AlreadyExists");
                        }
                        store.insert(name, body.clone());
                        Reply::json(201, &body.to_string())
                    }
                    "PATCH" => match store.get_mut(&name) {
                        None => status(404, "NotFound"),
                        Some(ev) => {
                            for (k, v) in body.as_object().unwrap() {
                                ev[k] = v.clone();
                            }
                            Reply::json(200, &ev.to_string())
                        }
                    },
                    _ => match store.get(&name) {
                        None => status(404, "NotFound"),
                        Some(ev) => Reply::json(200, &ev.to_string()),
                    },
                }
            });
            let client = server.client("ns", crate::kube::RetryPolicy::none());
            Events {
                server,
                store,
                client,
            }
        }

        fn api(&self) -> Api<'_> {
            self.client.api_in("ns", &EVENTS)
        }

        /// The writes sent: `create NAME`, `patch NAME COUNT`.
        fn calls(&self) -> Vec<String> {
            let writes = self.server.recorded().into_iter();
            let writes = writes.filter(|r| r.method != "GET");
            writes
                .map(|r| {
                    let body: Value = serde_json::from_slice(&r.body).unwrap();
                    match r.method.as_str() {
                        "POST" => format!("create {}", body["metadata"]["name"].as_str().unwrap()),
                        m => {
                            let name = r.path().rsplit('/').next().unwrap().to_string();
                            format!("{} {name} {}", m.to_lowercase(), body["count"])
                        }
                    }
                })
                .collect()
        }

        fn stored(&self) -> BTreeMap<String, Value> {
            self.store.lock().unwrap().clone()
        }
    }

    /// A recorder and the events API ([`Events`]) it posts to.
    struct Posting {
        events: Events,
        r: Recorder,
    }

    impl Posting {
        fn new() -> Posting {
            Posting {
                events: Events::new(None),
                r: Recorder::default(),
            }
        }

        /// What the recorder made of `ev` at `now_ms`: the count posted, `None` when its spam
        /// filter dropped it.
        fn record(&mut self, ev: EventSpec, now_ms: u64) -> Option<u64> {
            self.r.record(&self.events.api(), ev, now_ms).unwrap()
        }

        /// How many of `specs`, recorded at `now_ms`, the recorder sent (its spam filter
        /// dropped the rest).
        fn sent(&mut self, specs: impl IntoIterator<Item = EventSpec>, now_ms: u64) -> usize {
            let sent = specs.into_iter().map(|ev| self.record(ev, now_ms));
            sent.filter(Option::is_some).count()
        }
    }

    fn ev(msg: &str) -> EventSpec {
        EventSpec {
            involved: ObjectRef::pod("ns", "driver", "u1"),
            kind: "Warning",
            reason: "FailedCreate",
            message: msg.into(),
            bucket: None,
        }
    }

    #[test]
    fn the_loop_posts_queued_events_only_while_it_leads() {
        let events = Events::new(None);
        let leading = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let fence = Arc::clone(&leading);
        events.client.set_write_fence(Arc::new(move || {
            fence.load(std::sync::atomic::Ordering::SeqCst)
        }));
        let poster = Poster::new(true);
        poster.enqueue(&events.client, ev("one"), 1_000);
        poster.enqueue(&events.client, ev("two"), 1_000);
        assert!(events.calls().is_empty(), "queued, not posted");
        let t = Instant::now();
        assert_eq!(poster.post_queued(t + Duration::from_secs(5)), 0);
        assert_eq!(events.calls().len(), 2, "posted on this thread");
        leading.store(false, std::sync::atomic::Ordering::SeqCst);
        poster.enqueue(&events.client, ev("three"), 2_000);
        assert_eq!(poster.post_queued(t + Duration::from_secs(5)), 0);
        assert_eq!(events.calls().len(), 2, "not the leader: dropped");
        assert!(poster.queue.borrow().is_empty());
        leading.store(true, std::sync::atomic::Ordering::SeqCst);
        poster.enqueue(&events.client, ev("four"), 3_000);
        assert_eq!(
            poster.post_queued(Instant::now()),
            1,
            "no budget left: kept"
        );
        drop(poster);
        assert_eq!(events.calls().len(), 3, "posted before the process ends");
    }

    #[test]
    fn an_events_api_without_answers_costs_one_deadline_then_waits() {
        // Nothing listens there: each request fails at once with a transport error.
        let cfg = crate::kube::ClusterConfig::for_server("http://127.0.0.1:1", "ns");
        let client = KubeClient::with_options(cfg, Default::default()).unwrap();
        let poster = Poster::new(true);
        for i in 0..3 {
            poster.enqueue(&client, ev(&format!("e{i}")), 1_000);
        }
        let budget = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            poster.post_queued(budget),
            2,
            "stops at the first unanswered"
        );
        assert!(poster.quiet_until.get().is_some());
        assert_eq!(poster.post_queued(budget), 2, "then waits out the back-off");
        poster.queue.borrow_mut().clear();
    }

    #[test]
    fn a_repeated_event_patches_the_count() {
        let mut p = Posting::new();
        assert_eq!(p.record(ev("quota"), 1_000), Some(1));
        assert_eq!(p.record(ev("quota"), 2_000), Some(2));
        assert_eq!(p.record(ev("other"), 3_000), Some(1));
        let events = &p.events;
        let calls = events.calls();
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert!(calls[1].starts_with("patch driver.") && calls[1].ends_with(" 2"));
        let patch = &events.server.recorded()[1];
        assert_eq!(
            patch.header("content-type"),
            Some("application/strategic-merge-patch+json")
        );
        assert!(patch
            .path()
            .starts_with("/api/v1/namespaces/ns/events/driver."));
        let store = events.stored();
        assert_eq!(store.len(), 2);
        let first = store.values().find(|e| e["message"] == "quota").unwrap();
        assert_eq!(first["count"], 2);
        assert_eq!(first["firstTimestamp"], "1970-01-01T00:00:01Z");
        assert_eq!(first["lastTimestamp"], "1970-01-01T00:00:02Z");
        assert_eq!(first["source"]["component"], "podalloc");
        assert_eq!(first["involvedObject"]["uid"], "u1");
    }

    #[test]
    fn a_new_process_counts_on_from_the_stored_event() {
        let mut p = Posting::new();
        p.record(ev("quota"), 1_000);
        // Another process: nothing cached, the create meets 409 and patches the count.
        p.r = Recorder::default();
        assert_eq!(p.record(ev("quota"), 5_000), Some(2));
        assert_eq!(p.events.stored().len(), 1);
    }

    #[test]
    fn the_spam_filter_allows_a_burst_of_25_then_one_per_5_minutes() {
        let mut p = Posting::new();
        let burst = (0..40).map(|i| ev(&format!("m{}", i % 5)));
        assert_eq!(p.sent(burst, 1_000), 25);
        assert_eq!(p.record(ev("m0"), 1_000 + 299_000), None);
        assert!(p.record(ev("m0"), 1_000 + 301_000).is_some());
    }

    #[test]
    fn normal_events_of_an_apps_pods_share_the_apps_bucket_warnings_their_own() {
        let mut p = Posting::new();
        let on_pod = |i: u32, kind: &'static str, bucket: Option<&str>| EventSpec {
            involved: ObjectRef::pod("ns", &format!("app-exec-{i}"), &format!("u{i}")),
            kind,
            reason: "SuccessfulCreate",
            message: format!("Created executor pod: app-exec-{i}"),
            bucket: bucket.map(str::to_string),
        };
        let app = Some("app\u{0}ns\u{0}app");
        let creates = (0..100).map(|i| on_pod(i, "Normal", app));
        let n = p.sent(creates, 1_000);
        assert_eq!(n, 25, "100 pods' creates, one app: a burst of 25");
        let warnings = (0..30).map(|i| on_pod(i, "Warning", None));
        let n = p.sent(warnings, 2_000);
        assert_eq!(n, 30, "each pod's warning has its pod's own bucket");
        assert_eq!(p.events.calls().len(), 55);
    }

    #[test]
    fn similar_events_are_combined_after_10_messages() {
        let mut p = Posting::new();
        for i in 0..12 {
            p.record(ev(&format!("message {i}")), 1_000);
        }
        let store = p.events.stored();
        let combined: Vec<&Value> = store
            .values()
            .filter(|e| {
                e["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("(combined from similar events): ")
            })
            .collect();
        // The 10th, 11th and 12th messages: one combined Event, counted 3 times, with the
        // latest message.
        assert_eq!(combined.len(), 1);
        assert_eq!(combined[0]["count"], 3);
        assert!(combined[0]["message"]
            .as_str()
            .unwrap()
            .ends_with("message 11"));
        assert_eq!(store.len(), 10);
    }

    fn plan() -> Plan {
        Plan {
            create: Vec::new(),
            delete: Vec::new(),
            state: crate::engine::alloc::AllocatorState::new(),
            summary: Default::default(),
            warnings: Vec::new(),
            halt: None,
            requeue_after_ms: None,
            blocked: None,
            create_groups: Vec::new(),
            driver_ended: None,
            refused_removals: Vec::new(),
        }
    }

    fn pod(id: u64, state: ExecutorState, waiting: Option<&str>) -> ExecutorPod {
        ExecutorPod {
            scheduled: true,
            waiting: waiting.map(str::to_string),
            ..ExecutorPod::example(id, state)
        }
    }

    #[test]
    fn a_halt_is_crash_loop_halt_and_blocked_never_failed_create() {
        let mut p = plan();
        p.halt = Some("5 executors failed within 10m (dominant: OOMKilled)".into());
        p.blocked = Some(Blocked::CrashLoop);
        p.create.push(crate::engine::alloc::Create {
            executor_id: 9,
            pod_name: "app-exec-9".into(),
            retry: false,
            profile: 0,
        });
        let err = Error::crash_loop("halted");
        let mut snap = Snapshot::default();
        snap.executors
            .insert(3, pod(3, ExecutorState::Pending, Some("ImagePullBackOff")));
        snap.executors
            .insert(4, pod(4, ExecutorState::Running, None));
        let evs = tick_events(&snap, &p, &Outcomes::default(), Some(&err), &[]);
        let reasons: Vec<(&str, &str)> = evs.iter().map(|e| (e.1, e.2)).collect();
        assert_eq!(
            reasons,
            [
                ("Warning", "ExecutorFailed"),
                ("Warning", "AllocationBlocked"),
                ("Warning", "CrashLoopHalt"),
            ]
        );
        assert_eq!(evs[0].0, Some(3));
        assert_eq!(
            evs[0].3,
            "Executor 3 (pod app-exec-3) cannot start: ImagePullBackOff"
        );
        assert_eq!(evs[2].0, None, "about the app: the driver pod, or nowhere");
        assert!(evs[2].3.contains("dominant: OOMKilled"));
    }

    #[test]
    fn a_pod_created_this_tick_is_named_with_the_uid_its_create_returned() {
        let mut p = plan();
        p.create.push(crate::engine::alloc::Create {
            executor_id: 5,
            pod_name: "app-exec-5".into(),
            retry: false,
            profile: 0,
        });
        let snap = Snapshot::default();
        let uids = BTreeMap::from([(5, "uid-5".to_string())]);
        assert_eq!(
            lookup("ns", &snap, &p, &uids, 5),
            Some(Lookup::Known(ObjectRef::pod("ns", "app-exec-5", "uid-5"))),
            "no read of the pod: the create's answer carried its uid"
        );
        // A create answered without a uid: only then is the pod read for it.
        assert_eq!(
            lookup("ns", &snap, &p, &BTreeMap::new(), 5),
            Some(Lookup::Read("app-exec-5".into()))
        );
        assert_eq!(lookup("ns", &snap, &p, &uids, 6), None);
    }

    #[test]
    fn a_listed_pod_is_named_with_its_listed_uid() {
        let mut snap = Snapshot::default();
        let listed = pod(3, ExecutorState::Running, None);
        let (name, uid) = (listed.name.clone(), listed.uid.clone());
        assert!(!uid.is_empty());
        snap.executors.insert(3, listed);
        assert_eq!(
            lookup("ns", &snap, &plan(), &BTreeMap::new(), 3),
            Some(Lookup::Known(ObjectRef::pod("ns", &name, &uid)))
        );
    }

    #[test]
    fn post_never_fails() {
        let down = Events::new(Some(403));
        let mut r = Recorder::default();
        r.post(&down.api(), ev("x"), 0);
        r.post(&down.api(), ev("y"), 0);
        assert!(r.warned);
        assert_eq!(r.sent, 0);
        assert_eq!(down.calls().len(), 2, "one create each, refused");
    }
}
