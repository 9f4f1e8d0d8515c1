//! The simulated etcd + scheduler + kubelet: pods keyed like etcd (`namespace/name`,
//! byte order), a global resource version, consistent list snapshots for pagination, and
//! a queue of time-stamped kubelet events.
//!
//! Everything is a function of the `Instant`s passed in: every operation first applies
//! the events that fell due up to `now`, in due order, and timestamps written into
//! objects are those of the events themselves. So behaviour is deterministic given the
//! clock, whether or not the background thread has run.
//!
//! Every change of a pod (create, update, delete) also goes into the watch feed
//! (`watch.rs`) under the same lock, with its resourceVersion.
//!
//! This file is the API half (create, get, patch, delete, lists, quota); `kubelet.rs` is the
//! simulated scheduler and kubelet that carry out the queued events. ConfigMaps, Leases and
//! Events, and the resourceVersion counter, RNG and clock every kind shares, are the
//! registry's (`registry.rs`), held here as `reg` under the same lock.

mod kubelet;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::containers;
use super::feed::{self, Change, Feed};
use super::options::SimStats;
use super::pod::{self, Phase, PodFields, APP_LABEL, DEFAULT_GRACE_SECONDS, EXEC_ID_LABEL};
use super::registry::{assign_name, prepare_create_metadata, DeleteOptions, Registry};
use super::resources::Kind;
use super::status::ApiError;
use super::util::{fnv64, unit_draw, uuid_v4, SplitMix64, WallClock};

/// How long after the containers stop the kubelet's final delete removes the object.
const REMOVAL_DELAY: Duration = Duration::from_millis(100);
/// Most list snapshots kept for continue tokens; the oldest go first (their tokens then
/// get 410 Expired, as after an etcd compaction).
const MAX_SNAPSHOTS: usize = 64;
/// Mixed into the seed for the start-up jitter and the unschedulable draws, so that they
/// are independent of the failure draws.
const JITTER_STREAM: u64 = 0x6A09_E667_F3BC_C908;
const HOLD_STREAM: u64 = 0xBB67_AE85_84CA_A73B;

/// The knobs of the simulation (see `SimOptions` for their meaning).
#[derive(Clone, Debug)]
pub(crate) struct StoreConfig {
    pub schedule_latency: Duration,
    pub startup_latency: Duration,
    pub stop_latency: Duration,
    pub failure_rate: f64,
    pub seed: u64,
    pub nodes: usize,
    pub max_page: Option<usize>,
    pub continue_ttl: Duration,
    /// The `pods` hard limit of the `sim-quota` ResourceQuota in every namespace.
    pub pod_quota: Option<u64>,
    /// Spread of the start-up latency, in `[0, 1]`.
    pub startup_jitter: f64,
    /// Share of the pods reaching the scheduler before `unschedulable_until` (after the
    /// clock's start) held Unschedulable until then.
    pub unschedulable_fraction: f64,
    pub unschedulable_until: Duration,
}

/// One stored version of a pod: its JSON (without `kind`/`apiVersion`, like items of a
/// typed list) plus what selectors need. Immutable and shared by list snapshots.
#[derive(Debug)]
pub(crate) struct StoredPod {
    /// `namespace/name`, the etcd key below `/registry/pods/`.
    pub key: String,
    ns_len: usize,
    pub labels: BTreeMap<String, String>,
    pub fields: PodFields,
    /// `metadata.resourceVersion`.
    pub rv: String,
    pub json: String,
    /// Its `v1.Pod` Protobuf message, made from `json` when first asked for (`protobuf.rs`).
    pub protobuf: std::sync::OnceLock<Vec<u8>>,
}

impl StoredPod {
    /// The stored form of pod `v` under `key` (`namespace/name`, the namespace `ns_len`
    /// bytes long).
    pub(crate) fn new(key: &str, ns_len: usize, v: &Value) -> Self {
        let (labels, fields) = pod::extract(v);
        StoredPod {
            key: key.to_string(),
            ns_len,
            labels,
            fields,
            rv: v
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            json: serde_json::to_string(v).unwrap_or_else(|_| "{}".into()),
            protobuf: std::sync::OnceLock::new(),
        }
    }

    /// `metadata.name`.
    pub(crate) fn name(&self) -> &str {
        &self.key[self.ns_len + 1..]
    }

    /// `metadata.namespace`.
    pub(crate) fn namespace(&self) -> &str {
        &self.key[..self.ns_len]
    }

    /// The value of a pod field label (empty when unset).
    pub(crate) fn field(&self, f: &str) -> &str {
        let fl = &self.fields;
        match f {
            "metadata.name" => self.name(),
            "metadata.namespace" => self.namespace(),
            "spec.nodeName" => &fl.node_name,
            "spec.restartPolicy" => &fl.restart_policy,
            "spec.schedulerName" => &fl.scheduler_name,
            "spec.serviceAccountName" => &fl.service_account_name,
            "spec.hostNetwork" => fl.host_network,
            "status.phase" => &fl.phase,
            "status.podIP" => &fl.pod_ip,
            "status.podIPs" => &fl.pod_ips,
            "status.nominatedNodeName" => &fl.nominated_node_name,
            _ => "",
        }
    }

    /// The object as a single-object response: `kind` and `apiVersion` first.
    pub(crate) fn object_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.json.len() + 32);
        out.extend_from_slice(br#"{"kind":"Pod","apiVersion":"v1""#);
        let rest = &self.json[1..];
        if !rest.starts_with('}') {
            out.push(b',');
        }
        out.extend_from_slice(rest.as_bytes());
        out
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for the scheduler.
    Unscheduled,
    /// The scheduler found no node (there are none).
    Unschedulable,
    /// Bound; the kubelet is creating containers.
    Creating,
    /// Containers started (running, or crash-looping).
    Started,
    /// Containers terminated.
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum EvKind {
    Schedule,
    Start,
    /// An image pull failed earlier: `ErrImagePull` turns into `ImagePullBackOff`.
    BackOff,
    Stop,
    Remove,
    Gc,
}

#[derive(Debug, PartialEq, Eq)]
struct Event {
    due: Instant,
    order: u64,
    kind: EvKind,
    key: String,
    uid: String,
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.order).cmp(&(other.due, other.order))
    }
}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// apimachinery's `ValidateNoNewFinalizers`: an update of a pod being deleted may remove
/// finalizers but not add one (422, `metadata.finalizers: Forbidden`).
fn no_new_finalizers(old: &Value, new: &Value, name: &str) -> Result<(), ApiError> {
    if old["metadata"]["deletionTimestamp"].is_null() {
        return Ok(());
    }
    let list = |v: &Value| -> BTreeSet<String> {
        (v["metadata"]["finalizers"].as_array().into_iter().flatten())
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect()
    };
    let before = list(old);
    let extra: Vec<String> = (list(new).into_iter())
        .filter(|f| !before.contains(f))
        .map(|f| format!("{f:?}"))
        .collect();
    if extra.is_empty() {
        return Ok(());
    }
    let detail = format!(
        "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
        extra.join(", ")
    );
    Err(ApiError::invalid(
        "Pod",
        name,
        &[crate::validation::FieldError::forbidden(
            "metadata.finalizers",
            detail,
        )],
    ))
}

/// Whether `metadata.finalizers` of the pod is a non-empty list.
fn has_finalizers(pod: &StoredPod) -> bool {
    pod.json.contains("\"finalizers\"")
        && serde_json::from_str::<Value>(&pod.json)
            .ok()
            .and_then(|v| {
                v["metadata"]["finalizers"]
                    .as_array()
                    .map(|a| !a.is_empty())
            })
            .unwrap_or(false)
}

fn node_name(i: usize) -> String {
    format!("sim-node-{}", i + 1)
}

fn host_ip(node: &str) -> String {
    match node
        .strip_prefix("sim-node-")
        .and_then(|n| n.parse::<u64>().ok())
    {
        Some(n) if n < 250 => format!("172.18.0.{}", n + 1),
        _ => format!("172.18.1.{}", fnv64(&[node]) % 250 + 2),
    }
}

fn pod_ip(seq: u64) -> String {
    format!(
        "10.{}.{}.{}",
        244 + ((seq >> 16) & 7),
        (seq >> 8) & 255,
        seq & 255
    )
}

#[derive(Clone, Debug)]
struct Deletion {
    /// When the (first) graceful delete was accepted.
    requested: Instant,
    /// `deletionTimestamp`.
    deadline: Instant,
    grace: i64,
    /// When the kubelet will have stopped the containers.
    stop_due: Instant,
    stopped: bool,
    /// The deletion is complete (`deletionGracePeriodSeconds: 0`) but `metadata.finalizers`
    /// keeps the object until an update empties them.
    held: bool,
}

#[derive(Debug)]
struct Entry {
    pod: Arc<StoredPod>,
    uid: String,
    seq: u64,
    phase: Phase,
    stage: Stage,
    /// Seeded with a phase or given one through `/sim`: the kubelet leaves it alone
    /// (except to carry out a deletion).
    pinned: bool,
    grace: i64,
    restart_policy: String,
    deletion: Option<Deletion>,
    app: Option<String>,
    live: bool,
    /// Uids of owners that are v1 Pods (garbage collection is simulated for those).
    pod_owners: Vec<String>,
    /// Owners of other kinds, which the simulator cannot see: they keep the pod alive.
    other_owners: bool,
}

struct Snapshot {
    created: Instant,
    items: Arc<Vec<Arc<StoredPod>>>,
}

#[derive(Default)]
struct Counters {
    lists: u64,
    creates: u64,
    create_conflicts: u64,
    deletes: u64,
    live: u64,
    max_live: u64,
    live_by_app: HashMap<String, u64>,
    max_by_app: BTreeMap<String, u64>,
    quota_rejections: u64,
    duplicate_exec_ids: u64,
    /// Every (app, executor id) label pair a pod was ever created with.
    exec_ids_used: HashSet<(String, String)>,
    exec_ids_created: BTreeMap<String, Vec<u64>>,
    creates_by_app: BTreeMap<String, u64>,
}

/// How a create came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CreateMode {
    /// `POST /api/v1/namespaces/{ns}/pods`: status is reset, the kubelet takes over.
    Api,
    /// `POST /sim/pods/{ns}`: a given `status.phase` is kept and the pod is pinned.
    Seed,
}

/// `POST /sim/pods/{ns}/{name}/phase`.
#[derive(Clone, Debug)]
pub(crate) struct PhaseOverride {
    pub phase: Phase,
    pub exit_code: Option<i64>,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// With phase Failed: the reason of a `DisruptionTarget=True` condition, as the
    /// controller or kubelet that ended the pod adds it (KEP-3329), e.g. `EvictionByEvictionAPI`.
    pub disruption: Option<String>,
    /// With phase Pending: every container waits with this reason (the kubelet's start-up
    /// errors, e.g. `ErrImageNeverPull`), the pod scheduled.
    pub waiting: Option<String>,
}

/// A decoded continue token: the list snapshot's resource version (-1: the latest) and
/// the key (relative to the list's prefix) to continue after, ending in `\0`.
#[derive(Clone, Debug)]
pub(crate) struct Continue {
    pub rv: i64,
    pub start: String,
}

/// The items a list request pages through.
pub(crate) struct ListSnap {
    pub rv: u64,
    pub items: Arc<Vec<Arc<StoredPod>>>,
    /// Index of the first item to consider.
    pub start: usize,
    /// Length of the key prefix (`namespace/`, or empty across namespaces).
    pub prefix_len: usize,
    /// The page size after the `max_page` cap; `None`: everything.
    pub limit: Option<usize>,
}

/// The whole simulated cluster state.
pub(crate) struct Store {
    cfg: StoreConfig,
    /// Every other kind's objects, and the resourceVersion counter, RNG and clock every
    /// kind shares.
    pub(crate) reg: Registry,
    seq: u64,
    order: u64,
    pods: BTreeMap<String, Entry>,
    uids: HashMap<String, String>,
    dependents: HashMap<String, BTreeSet<String>>,
    events: BinaryHeap<Reverse<Event>>,
    snapshots: HashMap<(String, u64), Snapshot>,
    counters: Counters,
    /// Images the simulated registry does not have (exact references).
    missing_images: Vec<String>,
    /// Every pod change, for watches (`watch.rs`).
    feed: Arc<Feed<StoredPod>>,
}

fn secs(n: i64) -> Duration {
    Duration::from_secs(n.max(0) as u64)
}

impl Store {
    pub(crate) fn new(cfg: StoreConfig, clock: WallClock) -> Self {
        let mut reg = Registry::new(SplitMix64::from_entropy(), clock);
        reg.rv = 1000;
        // The history starts with the store, as a fresh cluster's watch cache starts at
        // etcd's first revision: a watch from any older resourceVersion replays every change
        // until the ring has dropped one.
        let feed = Arc::new(Feed::new(feed::HISTORY, 0));
        Store {
            cfg,
            reg,
            seq: 0,
            order: 0,
            pods: BTreeMap::new(),
            uids: HashMap::new(),
            dependents: HashMap::new(),
            events: BinaryHeap::new(),
            snapshots: HashMap::new(),
            counters: Counters::default(),
            missing_images: Vec::new(),
            feed,
        }
    }

    /// The pod feed watches read.
    pub(crate) fn feed(&self) -> &Arc<Feed<StoredPod>> {
        &self.feed
    }

    /// Where a pod watch in `ns` (every namespace with `None`) starts: the current pods,
    /// the resourceVersion they are at, and the feed of the changes after it.
    pub(crate) fn watch_start(&mut self, ns: Option<&str>, now: Instant) -> feed::Start<StoredPod> {
        self.advance(now);
        let prefix = ns.map(|n| format!("{n}/")).unwrap_or_default();
        feed::Start::new(&self.feed, self.reg.rv, self.collect(&prefix))
    }

    /// The current (global) resource version.
    pub(crate) fn rv(&self) -> u64 {
        self.reg.rv
    }

    /// Parses the stored JSON, lets `f` change it, bumps the resource version and stores
    /// the new version. Returns it.
    fn rewrite<F>(&mut self, key: &str, f: F) -> Option<Arc<StoredPod>>
    where
        F: FnOnce(&mut Value, &mut Entry),
    {
        let entry = self.pods.get_mut(key)?;
        let mut v: Value = serde_json::from_str(&entry.pod.json).ok()?;
        f(&mut v, entry);
        self.reg.rv += 1;
        v["metadata"]["resourceVersion"] = json!(self.reg.rv.to_string());
        let ns_len = entry.pod.ns_len;
        let stored = Arc::new(StoredPod::new(key, ns_len, &v));
        entry.phase = Phase::parse(&stored.fields.phase).unwrap_or(entry.phase);
        let prev = std::mem::replace(&mut entry.pod, Arc::clone(&stored));
        self.feed.push(Change {
            rv: self.reg.rv,
            obj: Some(Arc::clone(&stored)),
            prev: Some(prev),
        });
        self.refresh_live(key);
        Some(stored)
    }

    fn refresh_live(&mut self, key: &str) {
        let Some(e) = self.pods.get_mut(key) else {
            return;
        };
        let live = e.deletion.is_none() && matches!(e.phase, Phase::Pending | Phase::Running);
        if live == e.live {
            return;
        }
        e.live = live;
        let app = e.app.clone();
        self.count_live(app.as_deref(), live);
    }

    fn count_live(&mut self, app: Option<&str>, up: bool) {
        let c = &mut self.counters;
        if up {
            c.live += 1;
            c.max_live = c.max_live.max(c.live);
        } else {
            c.live = c.live.saturating_sub(1);
        }
        if let Some(app) = app {
            let n = c.live_by_app.entry(app.to_string()).or_insert(0);
            if up {
                *n += 1;
                let m = c.max_by_app.entry(app.to_string()).or_insert(0);
                *m = (*m).max(*n);
            } else {
                *n = n.saturating_sub(1);
            }
        }
    }

    /// The end of a deletion (grace 0, a pod never scheduled or already terminal, or the
    /// kubelet done): the etcd delete ([`Store::remove`]), unless `metadata.finalizers` is
    /// not empty. Then, as kube-apiserver's generic registry does, the pod stays with
    /// `deletionTimestamp` (now, if it had none) and `deletionGracePeriodSeconds: 0` until an
    /// update empties its finalizers; a scheduled pod still running is stopped by the kubelet
    /// at once. Returns the pod as removed or as kept.
    fn remove_or_hold(&mut self, key: &str, now: Instant) -> Option<Arc<StoredPod>> {
        let e = self.pods.get(key)?;
        if !has_finalizers(&e.pod) {
            return self.remove(key, now);
        }
        if e.deletion.as_ref().is_some_and(|d| d.held) {
            return Some(Arc::clone(&e.pod));
        }
        let stop = !e.pod.fields.node_name.is_empty()
            && !e.phase.is_terminal()
            && !e.deletion.as_ref().is_some_and(|d| d.stopped);
        let (ts, uid) = (self.reg.clock.rfc3339(now), e.uid.clone());
        let out = self.rewrite(key, |v, e| {
            if v["metadata"]["deletionTimestamp"].is_null() {
                v["metadata"]["deletionTimestamp"] = json!(ts);
            }
            v["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            let d = e.deletion.get_or_insert(Deletion {
                requested: now,
                deadline: now,
                grace: 0,
                stop_due: now,
                stopped: false,
                held: false,
            });
            (d.grace, d.held) = (0, true);
            if stop {
                (d.deadline, d.stop_due) = (now, now);
            }
        });
        if stop {
            self.push(now, EvKind::Stop, key, &uid);
        }
        out
    }

    /// Removes a pod from the store (etcd delete) and lets the garbage collector look at
    /// its dependents.
    fn remove(&mut self, key: &str, now: Instant) -> Option<Arc<StoredPod>> {
        let e = self.pods.remove(key)?;
        self.reg.rv += 1;
        self.feed.push(Change {
            rv: self.reg.rv,
            obj: None,
            prev: Some(Arc::clone(&e.pod)),
        });
        if e.live {
            self.count_live(e.app.as_deref(), false);
        }
        self.uids.remove(&e.uid);
        for owner in &e.pod_owners {
            if let Some(set) = self.dependents.get_mut(owner) {
                set.remove(key);
                if set.is_empty() {
                    self.dependents.remove(owner);
                }
            }
        }
        if let Some(deps) = self.dependents.remove(&e.uid) {
            for dep in deps {
                if let Some(uid) = self.pods.get(&dep).map(|d| d.uid.clone()) {
                    self.push(now, EvKind::Gc, &dep, &uid);
                }
            }
        }
        Some(e.pod)
    }

    /// Creates a pod from a decoded body (see `pod::decode`). Errors: 404 for a namespace
    /// name that is not a DNS-1123 label, 400 namespace mismatch or bad seeded phase, 422
    /// invalid, 409 name taken, 500 resourceVersion set.
    pub(crate) fn create(
        &mut self,
        ns: &str,
        mut v: Value,
        mode: CreateMode,
        dry_run: bool,
        now: Instant,
    ) -> Result<Arc<StoredPod>, ApiError> {
        self.advance(now);
        // Every namespace exists in the simulator, except names no namespace can have.
        if !super::validation::dns1123_label(ns).is_empty() {
            return Err(ApiError::namespace_not_found(ns));
        }
        if let Some(obj) = v.as_object_mut() {
            // Stored objects carry no type meta; responses add it.
            obj.remove("kind");
            obj.remove("apiVersion");
        }
        let rv_set = prepare_create_metadata(&mut v, ns)?;
        let (seeded_status, seeded_phase) = seeded_status(&v, mode)?;
        let (name, generated) = self.assign_name(&mut v, ns);
        pod::apply_defaults(&mut v);
        pod::initial_status(&mut v);
        let errs = pod::validate(&v);
        if !errs.is_empty() {
            return Err(ApiError::invalid("Pod", &name, &errs));
        }
        // The ResourceQuota admission plugin runs after validation, before storage.
        if mode == CreateMode::Api {
            self.admit_quota(ns, &name, now)?;
        }
        if rv_set {
            return Err(ApiError::unknown_server_error(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let key = format!("{ns}/{name}");
        if self.pods.contains_key(&key) {
            if mode == CreateMode::Api {
                self.counters.create_conflicts += 1;
            }
            return Err(ApiError::already_exists(&name, generated));
        }
        let uid = uuid_v4(&mut self.reg.rng);
        let created = self.reg.clock.rfc3339(now);
        v["metadata"]["uid"] = json!(uid);
        v["metadata"]["creationTimestamp"] = json!(created);
        v["metadata"]["generation"] = json!(1);
        if dry_run {
            return Ok(Arc::new(StoredPod::new(&key, ns.len(), &v)));
        }
        self.seq += 1;
        let seq = self.seq;
        let mut stage = Stage::Unscheduled;
        if let Some(phase) = seeded_phase {
            stage = self.seed_status(&mut v, phase, seq, &uid, &created);
            if let Some(Value::Object(given)) = seeded_status {
                for (k, val) in given {
                    v["status"][k.as_str()] = val;
                }
            }
        }
        self.reg.rv += 1;
        v["metadata"]["resourceVersion"] = json!(self.reg.rv.to_string());
        let stored = Arc::new(StoredPod::new(&key, ns.len(), &v));
        let entry = Entry::new(&stored, &v, &uid, seq, stage, seeded_phase.is_some());
        let gc = !entry.pod_owners.is_empty() && !entry.other_owners;
        self.index(&key, entry);
        self.feed.push(Change {
            rv: self.reg.rv,
            obj: Some(Arc::clone(&stored)),
            prev: None,
        });
        if mode == CreateMode::Api {
            self.counters.creates += 1;
        }
        self.count_executor_id(&stored, mode);
        if seeded_phase.is_none() {
            let delay = if stored.fields.node_name.is_empty() {
                self.cfg.schedule_latency
            } else {
                Duration::ZERO
            };
            self.push(now + delay, EvKind::Schedule, &key, &uid);
        }
        if gc {
            self.push(now, EvKind::Gc, &key, &uid);
        }
        Ok(stored)
    }

    /// Stores a new pod's entry under `key`: by uid, as a dependent of its owning pods,
    /// and in the live counts.
    fn index(&mut self, key: &str, entry: Entry) {
        self.uids.insert(entry.uid.clone(), key.to_string());
        for o in &entry.pod_owners {
            self.dependents
                .entry(o.clone())
                .or_default()
                .insert(key.to_string());
        }
        self.pods.insert(key.to_string(), entry);
        self.refresh_live(key);
    }

    /// Names a pod being created (see [`assign_name`]) against the pods of `ns`.
    fn assign_name(&mut self, v: &mut Value, ns: &str) -> (String, bool) {
        let taken = &self.pods;
        assign_name(&mut self.reg.rng, v, |c| {
            taken.contains_key(&format!("{ns}/{c}"))
        })
    }

    /// The ResourceQuota admission of one more pod in `ns`: 403 "exceeded quota" (and a
    /// count of it) when the `pods` quota is already used up.
    fn admit_quota(&mut self, ns: &str, name: &str, now: Instant) -> Result<(), ApiError> {
        let Some(limit) = self.cfg.pod_quota else {
            return Ok(());
        };
        let used = self.quota_used(ns, now);
        if used + 1 > limit {
            self.counters.quota_rejections += 1;
            return Err(ApiError::forbidden(
                "pods",
                name,
                &format!(
                    "exceeded quota: sim-quota, requested: pods=1, used: pods={used}, limited: pods={limit}"
                ),
            ));
        }
        Ok(())
    }

    /// Pods of `ns` that the `pods` quota counts (`QuotaV1Pod`): not Succeeded/Failed,
    /// and not stuck terminating past `deletionTimestamp + deletionGracePeriodSeconds`.
    fn quota_used(&self, ns: &str, now: Instant) -> u64 {
        let prefix = format!("{ns}/");
        self.pods
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .filter(|(_, e)| {
                !e.phase.is_terminal()
                    && e.deletion
                        .as_ref()
                        .is_none_or(|d| now <= d.deadline + secs(d.grace))
            })
            .count() as u64
    }

    /// Sets (or lifts, with `None`) the `pods` quota of every namespace.
    pub(crate) fn set_pod_quota(&mut self, limit: Option<u64>) {
        self.cfg.pod_quota = limit;
    }

    /// The `pods` quota in force.
    pub(crate) fn pod_quota(&self) -> Option<u64> {
        self.cfg.pod_quota
    }

    /// Records a created pod's (`spark-app-selector`, `spark-exec-id`) pair; an API create
    /// of a pair seen before (on any pod ever created) counts as a duplicate.
    fn count_executor_id(&mut self, p: &StoredPod, mode: CreateMode) {
        let c = &mut self.counters;
        let app = p.labels.get(APP_LABEL);
        if let (Some(app), CreateMode::Api) = (app, mode) {
            *c.creates_by_app.entry(app.clone()).or_insert(0) += 1;
        }
        let (Some(app), Some(id)) = (app, p.labels.get(EXEC_ID_LABEL)) else {
            return;
        };
        let fresh = c.exec_ids_used.insert((app.clone(), id.clone()));
        if mode == CreateMode::Api {
            if !fresh {
                c.duplicate_exec_ids += 1;
            }
            if let Ok(n) = id.parse::<u64>() {
                c.exec_ids_created.entry(app.clone()).or_default().push(n);
            }
        }
    }

    /// Builds the status of a pod seeded in `phase`; returns the kubelet stage it is in.
    fn seed_status(&mut self, v: &mut Value, phase: Phase, seq: u64, uid: &str, t: &str) -> Stage {
        let preset = v
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if phase == Phase::Pending && preset.is_empty() {
            return Stage::Unscheduled;
        }
        let node = if preset.is_empty() {
            node_name((seq as usize - 1) % self.cfg.nodes.max(1))
        } else {
            preset
        };
        pod::mark_scheduled(v, &node, &host_ip(&node), t);
        if phase == Phase::Pending {
            return Stage::Creating;
        }
        pod::mark_running(v, uid, &pod_ip(seq), t);
        match phase {
            Phase::Succeeded => {
                pod::mark_terminated(
                    v,
                    uid,
                    &pod::Termination::exited(Phase::Succeeded, 0, "Completed"),
                    t,
                );
                Stage::Stopped
            }
            Phase::Failed => {
                pod::mark_terminated(
                    v,
                    uid,
                    &pod::Termination::exited(Phase::Failed, 1, "Error"),
                    t,
                );
                Stage::Stopped
            }
            Phase::Unknown => {
                pod::mark_unknown(v, t);
                Stage::Started
            }
            _ => Stage::Started,
        }
    }

    /// The current version of a pod, or 404.
    pub(crate) fn get(
        &mut self,
        ns: &str,
        name: &str,
        now: Instant,
    ) -> Result<Arc<StoredPod>, ApiError> {
        self.live(ns, name, now).map(|(_, e)| Arc::clone(&e.pod))
    }

    /// Runs the clock to `now`, then [`Store::entry`].
    fn live(&mut self, ns: &str, name: &str, now: Instant) -> Result<(String, &Entry), ApiError> {
        self.advance(now);
        self.entry(ns, name)
    }

    /// Pod `ns/name`'s key and entry, or the pod's 404.
    fn entry(&self, ns: &str, name: &str) -> Result<(String, &Entry), ApiError> {
        let key = format!("{ns}/{name}");
        match self.pods.get(&key) {
            Some(e) => Ok((key, e)),
            None => Err(ApiError::pod_not_found(name)),
        }
    }

    /// Applies a merge patch to a pod (`PATCH`, see the `patch` module): the new version
    /// with its resourceVersion bumped, or the apiserver's error (404, 409, 422).
    pub(crate) fn patch(
        &mut self,
        ns: &str,
        name: &str,
        patch: &Value,
        now: Instant,
    ) -> Result<Arc<StoredPod>, ApiError> {
        let (key, e) = self.live(ns, name, now)?;
        let old: Value = serde_json::from_str(&e.pod.json)
            .map_err(|e| ApiError::internal_error(&e.to_string()))?;
        let new = crate::patch::apply(&old, patch, name)?;
        no_new_finalizers(&old, &new, name)?;
        let ungated = pod::is_gated(&old) && !pod::is_gated(&new);
        let out =
            (self.rewrite(&key, |v, _| *v = new)).ok_or_else(|| ApiError::pod_not_found(name))?;
        // A deleted pod whose last finalizer this update removed is deleted now.
        let held =
            (self.pods.get(&key)).is_some_and(|e| e.deletion.as_ref().is_some_and(|d| d.held));
        if held && !has_finalizers(&out) {
            self.remove(&key, now);
            return Ok(out);
        }
        if let Some(e) = self
            .pods
            .get(&key)
            .filter(|e| ungated && e.stage == Stage::Unscheduled)
        {
            let uid = e.uid.clone();
            self.push(
                now + self.cfg.schedule_latency,
                EvKind::Schedule,
                &key,
                &uid,
            );
        }
        Ok(out)
    }

    /// Deletes a pod as the apiserver's pod strategy does (see the module docs of
    /// `api`). Counts as an API delete in the stats.
    pub(crate) fn delete(
        &mut self,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
        dry_run: bool,
        now: Instant,
    ) -> Result<Arc<StoredPod>, ApiError> {
        self.advance(now);
        let out = self.delete_at(ns, name, opts, dry_run, now)?;
        if !dry_run {
            self.counters.deletes += 1;
        }
        Ok(out)
    }

    /// [`Store::delete`] without running the clock or counting an API delete (the garbage
    /// collector's, from within the clock).
    fn delete_at(
        &mut self,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
        dry_run: bool,
        now: Instant,
    ) -> Result<Arc<StoredPod>, ApiError> {
        let (key, e) = self.entry(ns, name)?;
        opts.check("Pod", name, &e.uid, &e.pod.rv)?;
        let pod = Arc::clone(&e.pod);
        let deletion = e.deletion.clone();
        let unscheduled = e.pod.fields.node_name.is_empty();
        let terminal = e.phase.is_terminal();
        let spec_grace = e.grace;
        // Negative values are treated as 1s on the delete path.
        let asked = opts.grace_period_seconds.map(|g| if g < 0 { 1 } else { g });
        let remove_now = |store: &mut Store| {
            if dry_run {
                Arc::clone(&pod)
            } else {
                store
                    .remove_or_hold(&key, now)
                    .unwrap_or_else(|| Arc::clone(&pod))
            }
        };
        if let Some(d) = deletion {
            // Already terminating: the grace period can only be shortened.
            let Some(p) = asked.filter(|p| *p < d.grace) else {
                return Ok(Arc::clone(&pod));
            };
            if p == 0 {
                return Ok(remove_now(self));
            }
            let deadline = d.requested + secs(p);
            let stop_due = d.stop_due.min(deadline.max(now));
            return Ok(self.mark_deleting(&key, deadline, p, d.requested, stop_due, dry_run));
        }
        let mut period = asked.unwrap_or(spec_grace);
        if unscheduled || terminal {
            period = 0;
        }
        if period < 0 {
            period = 1;
        }
        if period == 0 {
            return Ok(remove_now(self));
        }
        let deadline = now + secs(period);
        let stop_due = now + self.cfg.stop_latency.min(secs(period));
        Ok(self.mark_deleting(&key, deadline, period, now, stop_due, dry_run))
    }

    /// Sets `deletionTimestamp`/`deletionGracePeriodSeconds` and queues the kubelet's stop.
    fn mark_deleting(
        &mut self,
        key: &str,
        deadline: Instant,
        grace: i64,
        requested: Instant,
        stop_due: Instant,
        dry_run: bool,
    ) -> Arc<StoredPod> {
        let ts = self.reg.clock.rfc3339(deadline);
        if dry_run {
            let Some(e) = self.pods.get(key) else {
                return Arc::new(StoredPod::new(key, 0, &json!({})));
            };
            let mut v: Value = serde_json::from_str(&e.pod.json).unwrap_or_default();
            v["metadata"]["deletionTimestamp"] = json!(ts);
            v["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            return Arc::new(StoredPod::new(key, e.pod.ns_len, &v));
        }
        let out = self.rewrite(key, |v, e| {
            v["metadata"]["deletionTimestamp"] = json!(ts);
            v["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            e.deletion = Some(Deletion {
                requested,
                deadline,
                grace,
                stop_due,
                stopped: false,
                held: false,
            });
        });
        self.push_current(stop_due, EvKind::Stop, key);
        out.unwrap_or_else(|| Arc::new(StoredPod::new(key, 0, &json!({}))))
    }

    /// `POST /sim/pods/{ns}/{name}/phase`: forces a phase; the pod is pinned from then on.
    pub(crate) fn set_phase(
        &mut self,
        ns: &str,
        name: &str,
        o: &PhaseOverride,
        now: Instant,
    ) -> Result<Arc<StoredPod>, ApiError> {
        let (key, e) = self.live(ns, name, now)?;
        let (uid, seq) = (e.uid.clone(), e.seq);
        let mut node = e.pod.fields.node_name.clone();
        if node.is_empty() && o.phase != Phase::Pending {
            node = node_name((seq as usize - 1) % self.cfg.nodes.max(1));
        }
        let t = self.reg.clock.rfc3339(now);
        let o = o.clone();
        self.rewrite(&key, |v, e| {
            e.pinned = true;
            let scheduled = !v
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty();
            if !scheduled && !node.is_empty() {
                pod::mark_scheduled(v, &node, &host_ip(&node), &t);
            }
            match o.phase {
                Phase::Pending => {
                    v["status"]["phase"] = json!("Pending");
                    if let Some(w) = &o.waiting {
                        containers::mark_waiting(v, w, o.message.as_deref());
                    }
                }
                Phase::Running => {
                    pod::mark_running(v, &uid, &pod_ip(seq), &t);
                    e.stage = Stage::Started;
                }
                Phase::Succeeded | Phase::Failed => {
                    let (code, reason) = if o.phase == Phase::Succeeded {
                        (0, "Completed")
                    } else {
                        (1, "Error")
                    };
                    let term = pod::Termination {
                        phase: o.phase,
                        exit_code: o.exit_code.unwrap_or(code),
                        reason: o.reason.clone().unwrap_or_else(|| reason.to_string()),
                        message: o.message.clone(),
                        force_reason: true,
                    };
                    pod::mark_terminated(v, &uid, &term, &t);
                    if let Some(d) = &o.disruption {
                        pod::mark_disrupted(v, d, &t);
                    }
                    e.stage = Stage::Stopped;
                }
                Phase::Unknown => pod::mark_unknown(v, &t),
            }
        })
        .ok_or_else(|| ApiError::pod_not_found(name))
    }

    /// Takes (or reuses) the snapshot a list request pages through. Errors: 410 Expired
    /// for a continue token whose snapshot is gone (its body carries a token that
    /// continues from the latest state).
    pub(crate) fn begin_list(
        &mut self,
        ns: Option<&str>,
        cont: Option<&Continue>,
        limit: Option<usize>,
        now: Instant,
    ) -> Result<ListSnap, ApiError> {
        self.advance(now);
        self.counters.lists += 1;
        let prefix = ns.map(|n| format!("{n}/")).unwrap_or_default();
        let limit = match (limit, self.cfg.max_page) {
            (Some(l), Some(m)) => Some(l.min(m).max(1)),
            (l, _) => l,
        };
        let (rv, items) = match cont {
            Some(c) if c.rv > 0 => {
                let Some(s) = self
                    .snapshots
                    .get(&(prefix.clone(), c.rv as u64))
                    .filter(|s| now.saturating_duration_since(s.created) <= self.cfg.continue_ttl)
                else {
                    return Err(ApiError::expired(
                        EXPIRED_CONTINUE,
                        Some(encode_continue(-1, &c.start)),
                    ));
                };
                (c.rv as u64, Arc::clone(&s.items))
            }
            _ => (self.reg.rv, Arc::new(self.collect(&prefix))),
        };
        let start = match cont {
            Some(c) => items.partition_point(|p| p.key[prefix.len()..] < *c.start),
            None => 0,
        };
        if let Some(l) = limit {
            let first_page_of_snapshot = cont.is_none_or(|c| c.rv <= 0);
            if first_page_of_snapshot && items.len() - start > l {
                let key = (prefix.clone(), rv);
                let fresh = self.snapshots.get(&key).is_some_and(|s| {
                    now.saturating_duration_since(s.created) <= self.cfg.continue_ttl
                });
                if !fresh {
                    if self.snapshots.len() >= MAX_SNAPSHOTS {
                        if let Some(oldest) = self
                            .snapshots
                            .iter()
                            .min_by_key(|(_, s)| s.created)
                            .map(|(k, _)| k.clone())
                        {
                            self.snapshots.remove(&oldest);
                        }
                    }
                    self.snapshots.insert(
                        key,
                        Snapshot {
                            created: now,
                            items: Arc::clone(&items),
                        },
                    );
                }
            }
        }
        Ok(ListSnap {
            rv,
            items,
            start,
            prefix_len: prefix.len(),
            limit,
        })
    }

    fn collect(&self, prefix: &str) -> Vec<Arc<StoredPod>> {
        self.pods
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, e)| Arc::clone(&e.pod))
            .collect()
    }

    /// Keys (`ns/name`) of the pods in `ns`, for delete-collection.
    pub(crate) fn keys_in(&mut self, ns: &str, now: Instant) -> Vec<Arc<StoredPod>> {
        self.advance(now);
        self.collect(&format!("{ns}/"))
    }

    /// The counters (with `requests` left at 0 for the caller to fill in).
    pub(crate) fn stats(&mut self, now: Instant) -> SimStats {
        self.advance(now);
        let c = &self.counters;
        SimStats {
            requests: 0,
            lists: c.lists,
            creates: c.creates,
            create_conflicts: c.create_conflicts,
            deletes: c.deletes,
            live_pods: c.live,
            max_live_pods: c.max_live,
            max_live_pods_by_app: c.max_by_app.clone(),
            quota_rejections: c.quota_rejections,
            duplicate_executor_ids: c.duplicate_exec_ids,
            executor_ids_created: c.exec_ids_created.clone(),
            creates_by_app: c.creates_by_app.clone(),
            ..SimStats::default()
        }
    }
}

/// A seeded pod's status (side door only: `CreateMode::Seed`) and its phase, if it names
/// one; 400 for an unknown phase.
fn seeded_status(v: &Value, mode: CreateMode) -> Result<(Option<Value>, Option<Phase>), ApiError> {
    let status = match mode {
        CreateMode::Seed => v.get("status").cloned().filter(Value::is_object),
        CreateMode::Api => None,
    };
    let phase = match status
        .as_ref()
        .and_then(|s| s.get("phase"))
        .and_then(Value::as_str)
    {
        None | Some("") => None,
        Some(p) => Some(Phase::parse(p).ok_or_else(|| {
            ApiError::bad_request(format!("unknown pod phase {p:?} in status.phase"))
        })?),
    };
    Ok((status, phase))
}

impl Entry {
    /// The entry of a pod just stored as `stored` (its object `v`), in `stage`; `pinned`
    /// when seeded with a phase.
    fn new(
        stored: &Arc<StoredPod>,
        v: &Value,
        uid: &str,
        seq: u64,
        stage: Stage,
        pinned: bool,
    ) -> Entry {
        let (pod_owners, other_owners) = owners(v);
        Entry {
            pod: Arc::clone(stored),
            uid: uid.to_string(),
            seq,
            phase: Phase::parse(&stored.fields.phase).unwrap_or(Phase::Pending),
            stage,
            pinned,
            grace: v
                .pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(DEFAULT_GRACE_SECONDS),
            restart_policy: stored.fields.restart_policy.clone(),
            deletion: None,
            app: stored.labels.get(APP_LABEL).cloned(),
            live: false,
            pod_owners,
            other_owners,
        }
    }
}

/// A pod's owner references: the uids of owning pods (`v1` `Pod`), and whether anything
/// else owns it too (then the garbage collector leaves it alone).
fn owners(v: &Value) -> (Vec<String>, bool) {
    let mut pod_owners = Vec::new();
    let mut other_owners = false;
    if let Some(refs) = v
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
    {
        for r in refs {
            let is_pod = r.get("kind").and_then(Value::as_str) == Some("Pod")
                && r.get("apiVersion").and_then(Value::as_str) == Some("v1");
            match r.get("uid").and_then(Value::as_str) {
                Some(u) if is_pod => pod_owners.push(u.to_string()),
                _ => other_owners = true,
            }
        }
    }
    (pod_owners, other_owners)
}

/// The apiserver's message for a continue token whose revision was compacted.
pub(crate) const EXPIRED_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueJson {
    v: String,
    rv: i64,
    start: String,
}

/// Encodes a continue token like `storage.EncodeContinue`: unpadded URL-safe base64 of
/// `{"v":"meta.k8s.io/v1","rv":N,"start":"key\u0000"}`.
pub(crate) fn encode_continue(rv: i64, start: &str) -> String {
    use base64::Engine as _;
    let j = ContinueJson {
        v: "meta.k8s.io/v1".into(),
        rv,
        start: start.to_string(),
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&j).unwrap_or_default())
}

/// Decodes a continue token; the error text is `storage.DecodeContinue`'s.
pub(crate) fn decode_continue(token: &str) -> Result<Continue, String> {
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|e| format!("continue key is not valid: {e}"))?;
    let j: ContinueJson =
        serde_json::from_slice(&raw).map_err(|e| format!("continue key is not valid: {e}"))?;
    if j.v != "meta.k8s.io/v1" {
        return Err(
            "continue key is not valid: server does not recognize this encoded version".into(),
        );
    }
    if j.rv == 0 {
        return Err("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)".into());
    }
    if j.start.is_empty() {
        return Err("continue key is not valid: encoded start key empty".into());
    }
    Ok(Continue {
        rv: j.rv,
        start: j.start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A store (wall clock) in which every pod that starts fails.
    fn failing() -> Store {
        let c = StoreConfig {
            failure_rate: 1.0,
            ..cfg()
        };
        Store::new(c, WallClock::new())
    }

    fn cfg() -> StoreConfig {
        StoreConfig {
            schedule_latency: 200 * MS,
            startup_latency: 1000 * MS,
            stop_latency: 500 * MS,
            failure_rate: 0.0,
            seed: 0,
            nodes: 3,
            max_page: None,
            continue_ttl: Duration::from_secs(300),
            pod_quota: None,
            startup_jitter: 0.0,
            unschedulable_fraction: 0.0,
            unschedulable_until: Duration::ZERO,
        }
    }

    fn body(name: &str, policy: &str, extra_meta: Value) -> Value {
        let mut v = json!({"metadata": {"name": name, "labels": {"spark-app-selector": "app"}},
                           "spec": {"restartPolicy": policy,
                                    "containers": [{"name": "c", "image": "img:1"}]}});
        if let (Some(m), Value::Object(extra)) = (v["metadata"].as_object_mut(), extra_meta) {
            m.extend(extra);
        }
        v
    }

    fn view(s: &mut Store, name: &str, at: Instant) -> Option<Value> {
        s.get("ns", name, at)
            .ok()
            .map(|p| serde_json::from_str(&p.json).unwrap())
    }

    /// The phase of pod `name` as served at `at` (the pod must exist).
    fn phase(s: &mut Store, name: &str, at: Instant) -> String {
        let p = view(s, name, at).unwrap();
        p["status"]["phase"].as_str().unwrap().to_string()
    }

    /// The resourceVersion of pod JSON `p`, as a number.
    fn rv(p: &Value) -> u64 {
        p["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    fn create(s: &mut Store, name: &str, policy: &str, at: Instant) -> Value {
        let p = s
            .create(
                "ns",
                body(name, policy, json!({})),
                CreateMode::Api,
                false,
                at,
            )
            .unwrap();
        serde_json::from_str(&p.json).unwrap()
    }

    #[test]
    fn kubelet_transitions_happen_exactly_when_due() {
        let clock = WallClock::new();
        let mut s = Store::new(cfg(), clock);
        let t0 = Instant::now();
        let created = create(&mut s, "p", "Never", t0);
        let rv0 = rv(&created);
        let p = view(&mut s, "p", t0 + 199 * MS).unwrap();
        assert!(p["spec"].get("nodeName").is_none());
        assert!(p["status"].get("conditions").is_none());
        let p = view(&mut s, "p", t0 + 200 * MS).unwrap();
        assert_eq!(p["spec"]["nodeName"], "sim-node-1");
        assert_eq!(p["status"]["hostIP"], "172.18.0.2");
        assert_eq!(p["status"]["phase"], "Pending");
        let sched = p["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "PodScheduled")
            .unwrap()
            .clone();
        assert_eq!(sched["status"], "True");
        assert_eq!(sched["lastTransitionTime"], clock.rfc3339(t0 + 200 * MS));
        let rv1 = rv(&p);
        assert!(rv1 > rv0);
        assert_eq!(phase(&mut s, "p", t0 + 1199 * MS), "Pending");
        let p = view(&mut s, "p", t0 + 1200 * MS).unwrap();
        assert_eq!(p["status"]["phase"], "Running");
        assert_eq!(
            p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"],
            clock.rfc3339(t0 + 1200 * MS)
        );
        assert!(rv(&p) > rv1);
        // Pods are spread over the nodes in creation order.
        create(&mut s, "q", "Never", t0);
        assert_eq!(
            view(&mut s, "q", t0 + 300 * MS).unwrap()["spec"]["nodeName"],
            "sim-node-2"
        );
    }

    #[test]
    fn failures_follow_the_restart_policy_and_the_seed() {
        let mut s = failing();
        let t0 = Instant::now();
        create(&mut s, "never", "Never", t0);
        create(&mut s, "always", "Always", t0);
        let t = t0 + 2 * Duration::from_secs(1);
        let never = view(&mut s, "never", t).unwrap();
        assert_eq!(never["status"]["phase"], "Failed");
        let term = &never["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(
            (term["exitCode"].as_i64(), term["reason"].as_str()),
            (Some(1), Some("Error"))
        );
        let always = view(&mut s, "always", t).unwrap();
        assert_eq!(always["status"]["phase"], "Running");
        assert_eq!(
            always["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
            "CrashLoopBackOff"
        );
        assert_eq!(s.stats(t).live_pods, 1);

        let run = |seed: u64| -> Vec<String> {
            let mut s = Store::new(
                StoreConfig {
                    failure_rate: 0.5,
                    seed,
                    ..cfg()
                },
                WallClock::new(),
            );
            let t0 = Instant::now();
            (0..40)
                .map(|i| {
                    create(&mut s, &format!("p{i}"), "Never", t0);
                    phase(&mut s, &format!("p{i}"), t0 + 2 * Duration::from_secs(1))
                })
                .collect()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        assert!(a.iter().any(|p| p == "Failed") && a.iter().any(|p| p == "Running"));
    }

    #[test]
    fn graceful_deletion_timeline() {
        let clock = WallClock::new();
        let mut s = Store::new(cfg(), clock);
        let t0 = Instant::now();
        create(&mut s, "p", "Never", t0);
        let t1 = t0 + 2 * Duration::from_secs(1);
        assert_eq!(s.stats(t1).live_pods, 1);
        let d = s
            .delete("ns", "p", &DeleteOptions::default(), false, t1)
            .unwrap();
        let d: Value = serde_json::from_str(&d.json).unwrap();
        assert_eq!(
            d["metadata"]["deletionTimestamp"],
            clock.rfc3339(t1 + Duration::from_secs(30))
        );
        assert_eq!(d["metadata"]["deletionGracePeriodSeconds"], 30);
        assert_eq!(d["status"]["phase"], "Running");
        assert_eq!(s.stats(t1).live_pods, 0);
        assert_eq!(phase(&mut s, "p", t1 + 499 * MS), "Running");
        let stopped = view(&mut s, "p", t1 + 500 * MS).unwrap();
        assert_eq!(stopped["status"]["phase"], "Failed");
        assert_eq!(
            stopped["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            143
        );
        assert!(view(&mut s, "p", t1 + 599 * MS).is_some());
        assert!(view(&mut s, "p", t1 + 600 * MS).is_none());

        // Grace shorter than the stop latency: SIGKILL at the deadline (137).
        let mut s = Store::new(
            StoreConfig {
                stop_latency: Duration::from_secs(5),
                ..cfg()
            },
            clock,
        );
        create(&mut s, "k", "Never", t0);
        let opts = DeleteOptions {
            grace_period_seconds: Some(2),
            ..DeleteOptions::default()
        };
        s.delete("ns", "k", &opts, false, t1).unwrap();
        let k = view(&mut s, "k", t1 + Duration::from_secs(2)).unwrap();
        assert_eq!(
            k["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            137
        );
    }

    #[test]
    fn a_second_delete_only_shortens_the_grace_period() {
        let clock = WallClock::new();
        let mut s = Store::new(
            StoreConfig {
                stop_latency: Duration::from_secs(60),
                ..cfg()
            },
            clock,
        );
        let t0 = Instant::now();
        create(&mut s, "p", "Never", t0);
        let t1 = t0 + 2 * Duration::from_secs(1);
        let grace = |g: i64| DeleteOptions {
            grace_period_seconds: Some(g),
            ..DeleteOptions::default()
        };
        s.delete("ns", "p", &grace(30), false, t1).unwrap();
        let rv = view(&mut s, "p", t1).unwrap()["metadata"]["resourceVersion"].clone();
        let later = t1 + Duration::from_secs(3);
        let same = s.delete("ns", "p", &grace(45), false, later).unwrap();
        let same: Value = serde_json::from_str(&same.json).unwrap();
        assert_eq!(
            same["metadata"]["deletionTimestamp"],
            clock.rfc3339(t1 + Duration::from_secs(30))
        );
        assert_eq!(same["metadata"]["resourceVersion"], rv);
        let unchanged = s
            .delete("ns", "p", &DeleteOptions::default(), false, later)
            .unwrap();
        assert_eq!(unchanged.rv, rv.as_str().unwrap());
        let shorter = s.delete("ns", "p", &grace(10), false, later).unwrap();
        let shorter: Value = serde_json::from_str(&shorter.json).unwrap();
        assert_eq!(
            shorter["metadata"]["deletionTimestamp"],
            clock.rfc3339(t1 + Duration::from_secs(10))
        );
        assert_eq!(shorter["metadata"]["deletionGracePeriodSeconds"], 10);
        // The kubelet now kills at the shortened deadline.
        let p = view(&mut s, "p", t1 + Duration::from_secs(10)).unwrap();
        assert_eq!(p["status"]["phase"], "Failed");
        assert!(s
            .delete("ns", "p", &grace(0), false, t1 + Duration::from_secs(10))
            .is_ok());
        assert!(view(&mut s, "p", t1 + Duration::from_secs(10)).is_none());
    }

    #[test]
    fn terminal_and_unscheduled_pods_go_at_once() {
        let mut s = failing();
        let t0 = Instant::now();
        create(&mut s, "failed", "Never", t0);
        create(&mut s, "fresh", "Never", t0);
        let t = t0 + Duration::from_secs(2);
        s.delete("ns", "failed", &DeleteOptions::default(), false, t)
            .unwrap();
        assert!(view(&mut s, "failed", t).is_none());
        create(&mut s, "fresh2", "Never", t);
        let gone = s
            .delete("ns", "fresh2", &DeleteOptions::default(), false, t)
            .unwrap();
        assert!(!gone.json.contains("deletionTimestamp"));
        assert!(view(&mut s, "fresh2", t).is_none());
        assert_eq!(
            s.delete("ns", "fresh2", &DeleteOptions::default(), false, t)
                .unwrap_err()
                .code,
            404
        );
        // Preconditions: a 409 naming the first that fails.
        let uid = DeleteOptions {
            uid: Some("x".into()),
            ..DeleteOptions::default()
        };
        let rv = DeleteOptions {
            resource_version: Some("1".into()),
            ..DeleteOptions::default()
        };
        for (opts, what) in [
            (uid, "the UID in the precondition (x)"),
            (
                rv,
                "the ResourceVersion in the precondition (1) does not match",
            ),
        ] {
            let e = s.delete("ns", "fresh", &opts, false, t).unwrap_err();
            assert_eq!((e.code, e.reason), (409, "Conflict"));
            let want = format!("Operation cannot be fulfilled on Pod \"fresh\": {what}");
            assert!(e.message.starts_with(&want), "{}", e.message);
        }
        // Dry run changes nothing.
        s.delete("ns", "fresh", &DeleteOptions::default(), true, t)
            .unwrap();
        assert!(!view(&mut s, "fresh", t).unwrap()["metadata"]
            .as_object()
            .unwrap()
            .contains_key("deletionTimestamp"));
    }

    #[test]
    fn no_nodes_means_unschedulable() {
        let mut s = Store::new(StoreConfig { nodes: 0, ..cfg() }, WallClock::new());
        let t0 = Instant::now();
        create(&mut s, "p", "Never", t0);
        let p = view(&mut s, "p", t0 + Duration::from_secs(10)).unwrap();
        assert_eq!(p["status"]["phase"], "Pending");
        assert_eq!(p["status"]["conditions"][0]["reason"], "Unschedulable");
        assert!(p["spec"].get("nodeName").is_none());
    }

    #[test]
    fn startup_jitter_spreads_start_up_deterministically() {
        let store = |seed, j| {
            let c = StoreConfig {
                seed,
                startup_jitter: j,
                ..cfg()
            };
            Store::new(c, WallClock::new())
        };
        let lat = |s: &Store| (1..=200).map(|n| s.startup_latency(n)).collect::<Vec<_>>();
        let a = lat(&store(7, 0.5));
        assert_eq!(a, lat(&store(7, 0.5)));
        assert_ne!(a, lat(&store(8, 0.5)));
        assert!(
            a.iter().all(|d| (500 * MS..=1500 * MS).contains(d)),
            "{a:?}"
        );
        let (lo, hi) = (a.iter().min().unwrap(), a.iter().max().unwrap());
        assert!(*lo < 600 * MS && *hi > 1400 * MS, "{lo:?} {hi:?}");
        let mean = a.iter().sum::<Duration>() / 200;
        assert!(mean > 930 * MS && mean < 1070 * MS, "{mean:?}");
        assert!(lat(&store(7, 0.0)).iter().all(|d| *d == 1000 * MS));
        // The kubelet uses it: a pod is Running exactly its own latency after scheduling.
        let mut s = store(7, 0.5);
        let t0 = Instant::now();
        create(&mut s, "p", "Never", t0);
        let d = s.startup_latency(1);
        assert_eq!(phase(&mut s, "p", t0 + 200 * MS + d - MS), "Pending");
        assert_eq!(phase(&mut s, "p", t0 + 200 * MS + d), "Running");
    }

    #[test]
    fn a_share_of_early_pods_is_unschedulable_until_a_node_is_added() {
        let clock = WallClock::new();
        let c = StoreConfig {
            unschedulable_fraction: 0.3,
            unschedulable_until: Duration::from_secs(10),
            ..cfg()
        };
        let mut s = Store::new(c, clock);
        let t0 = clock.start();
        for i in 0..60 {
            create(&mut s, &format!("p{i}"), "Never", t0);
        }
        let mut held = Vec::new();
        for i in 0..60 {
            let p = view(&mut s, &format!("p{i}"), t0 + Duration::from_secs(5)).unwrap();
            if p["status"]["phase"] == "Pending" {
                let c = &p["status"]["conditions"][0];
                assert_eq!(
                    (&c["type"], &c["status"]),
                    (&json!("PodScheduled"), &json!("False"))
                );
                assert_eq!(c["reason"], "Unschedulable");
                assert_eq!(c["message"], "0/3 nodes are available: 3 Insufficient cpu.");
                assert!(p["spec"].get("nodeName").is_none());
                held.push(i);
            } else {
                assert_eq!(p["status"]["phase"], "Running");
            }
        }
        assert!((8..=30).contains(&held.len()), "{held:?}");
        let release = t0 + Duration::from_secs(10);
        for &i in &held {
            let p = view(&mut s, &format!("p{i}"), release).unwrap();
            assert_eq!(p["status"]["phase"], "Pending");
            assert!(
                p["spec"]["nodeName"].is_string(),
                "scheduled at the release"
            );
        }
        for &i in &held {
            let p = view(&mut s, &format!("p{i}"), release + 1000 * MS).unwrap();
            assert_eq!(p["status"]["phase"], "Running");
        }
        // Pods reaching the scheduler after the release are never held.
        for i in 0..30 {
            create(&mut s, &format!("q{i}"), "Never", release);
        }
        for i in 0..30 {
            let p = view(&mut s, &format!("q{i}"), release + 1200 * MS).unwrap();
            assert_eq!(p["status"]["phase"], "Running");
        }
    }

    #[test]
    fn garbage_collection_of_pod_owned_pods() {
        let mut s = Store::new(cfg(), WallClock::new());
        let t0 = Instant::now();
        let orphan = json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "gone", "uid": "u-gone"}]});
        s.create(
            "ns",
            body("orphan", "Never", orphan),
            CreateMode::Api,
            false,
            t0,
        )
        .unwrap();
        let rs = json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u-rs"}]});
        s.create(
            "ns",
            body("rs-owned", "Never", rs),
            CreateMode::Api,
            false,
            t0,
        )
        .unwrap();
        assert!(
            view(&mut s, "orphan", t0).is_none(),
            "owner absent: collected"
        );
        assert!(view(&mut s, "rs-owned", t0).is_some());

        let mut driver = body("driver", "Never", json!({}));
        driver["status"] = json!({"phase": "Running"});
        let d = s.create("ns", driver, CreateMode::Seed, false, t0).unwrap();
        let d: Value = serde_json::from_str(&d.json).unwrap();
        let uid = d["metadata"]["uid"].as_str().unwrap();
        let owned = json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "driver", "uid": uid, "controller": true}]});
        s.create(
            "ns",
            body("exec", "Never", owned),
            CreateMode::Api,
            false,
            t0,
        )
        .unwrap();
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(phase(&mut s, "exec", t1), "Running");
        let zero = DeleteOptions {
            grace_period_seconds: Some(0),
            ..DeleteOptions::default()
        };
        s.delete("ns", "driver", &zero, false, t1).unwrap();
        let exec = view(&mut s, "exec", t1).unwrap();
        assert!(
            exec["metadata"]["deletionTimestamp"].is_string(),
            "dependent deleted gracefully"
        );
        assert!(view(&mut s, "exec", t1 + Duration::from_secs(1)).is_none());
    }

    #[test]
    fn seeded_phases_stick_and_stats_count_live_pods_per_app() {
        let mut s = Store::new(cfg(), WallClock::new());
        let t0 = Instant::now();
        for (name, phase) in [
            ("d", "Running"),
            ("f", "Failed"),
            ("s", "Succeeded"),
            ("u", "Unknown"),
        ] {
            let mut v = body(name, "Never", json!({}));
            v["status"] = json!({"phase": phase});
            let p = s.create("ns", v, CreateMode::Seed, false, t0).unwrap();
            assert_eq!(p.fields.phase, phase);
        }
        let mut bad = body("x", "Never", json!({}));
        bad["status"] = json!({"phase": "Exploded"});
        assert_eq!(
            s.create("ns", bad, CreateMode::Seed, false, t0)
                .unwrap_err()
                .code,
            400
        );
        let later = t0 + Duration::from_secs(30);
        assert_eq!(phase(&mut s, "d", later), "Running");
        assert_eq!(phase(&mut s, "f", later), "Failed");
        for i in 0..3 {
            create(&mut s, &format!("e{i}"), "Never", later);
        }
        let st = s.stats(later);
        assert_eq!(st.live_pods, 4);
        assert_eq!(st.max_live_pods_by_app.get("app"), Some(&4));
        assert_eq!(st.creates, 3);

        // Create-time rules: a set resourceVersion is a 500, dry runs store nothing.
        let mut rv = body("rv", "Never", json!({}));
        rv["metadata"]["resourceVersion"] = json!("5");
        let e = s
            .create("ns", rv, CreateMode::Api, false, later)
            .unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                500,
                "resourceVersion should not be set on objects to be created"
            )
        );
        let dry = s
            .create(
                "ns",
                body("dry", "Never", json!({})),
                CreateMode::Api,
                true,
                later,
            )
            .unwrap();
        assert_eq!(dry.name(), "dry");
        assert!(view(&mut s, "dry", later).is_none());
    }

    #[test]
    fn continue_tokens_round_trip_and_expire() {
        let t = encode_continue(42, "p-1\u{0}");
        let c = decode_continue(&t).unwrap();
        assert_eq!((c.rv, c.start.as_str()), (42, "p-1\u{0}"));
        assert!(decode_continue("!!").is_err());
        assert!(decode_continue(&encode_continue(0, "x")).is_err());

        let mut s = Store::new(cfg(), WallClock::new());
        let t0 = Instant::now();
        for i in 0..5 {
            create(&mut s, &format!("p{i}"), "Never", t0);
        }
        let first = s.begin_list(Some("ns"), None, Some(2), t0).unwrap();
        let c = Continue {
            rv: first.rv as i64,
            start: "p1\u{0}".into(),
        };
        let page = s
            .begin_list(Some("ns"), Some(&c), Some(2), t0 + Duration::from_secs(299))
            .unwrap();
        assert_eq!(page.start, 2);
        let e = s
            .begin_list(Some("ns"), Some(&c), Some(2), t0 + Duration::from_secs(301))
            .err()
            .unwrap();
        assert_eq!((e.code, e.reason), (410, "Expired"));
        let fresh = decode_continue(e.continue_token.as_deref().unwrap()).unwrap();
        assert_eq!((fresh.rv, fresh.start.as_str()), (-1, "p1\u{0}"));
    }
}
