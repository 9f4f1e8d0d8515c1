//! The ConfigMap state store (`--state-store configmap:NAME`): the allocator state kept in a
//! ConfigMap of the app's namespace, key `state.json`, with optimistic concurrency.
//!
//! Loading remembers the ConfigMap's `resourceVersion`; every save is an update carrying it
//! (or a create when the ConfigMap did not exist). If another instance saved in between, the
//! API server answers 409 (Conflict on update, AlreadyExists on create) and the save fails
//! with [`StoreError::Conflict`]. Since the tick saves before it makes any call
//! (write-ahead), the instance that loses the race has not acted: it ends the tick with exit
//! 3, exactly like a run that finds the file lock taken. This is what lets a Kubernetes
//! CronJob (no volume) or several admin hosts run podalloc safely.
//!
//! Ownership: a `run` loop ([`ConfigMapStore::holding`]) writes a holder record (annotation
//! [`HOLDER_KEY`]: command, host, pid, since, answer deadline) once, when it claims the
//! ConfigMap, and never renews it. Whether that holder lives is asked on demand
//! ([`crate::store::liveness`]): a process that finds another holder's record writes a ping
//! (annotation [`PING_KEY`]), the holder's loop answers it at its next read of the ConfigMap
//! (annotation [`PONG_KEY`]). Answered: a second loop waits as a standby (asking again every
//! [`crate::store::liveness::PING_PERIOD`]), a one-shot `reconcile` stops with
//! [`StoreError::Owned`] (exit 3) naming the holder; not answered within the holder's
//! deadline (3 × its interval + 2 s + its tick budget): the holder is dead, taken over (a loop writes its own
//! record, conditionally). A holder on this host whose pid is gone is free at once. The
//! steering commands do not ask: they queue their request and wait for the loop to take it.
//! Read-only commands (`status`, `--dry-run`) ignore the record.
//!
//! A retried write: the API server may apply an update and still answer 5xx (or the answer
//! may be lost), and the client's retry then gets 409 because the `resourceVersion` moved.
//! Each save carries a fresh nonce (annotation [`WRITE_ID_KEY`]); after a 409 the store
//! re-reads the ConfigMap and, when it holds exactly the state and nonce just sent, counts
//! the save as done instead of reporting a rival.
//!
//! Steering ([`crate::store::queue`]): the ConfigMap also holds the requests handed to its owner
//! (data key [`REQUESTS_KEY`], a JSON array of [`Steering`], appended by [`submit`] with
//! `resourceVersion`, retried on 409) and the target people set (annotation [`TARGET_KEY`],
//! `kubectl annotate`-able). The annotation belongs to people: the controller never writes
//! it. A change of it since the controller last took it into account (the value recorded
//! under [`APPLIED_KEY`]) is a `scale` request of its own, placed among the queued requests
//! in the order they were made (each queued request records the annotation it was made
//! under, so one made before the edit comes before it, one made after comes after).
//!
//! Exactly once: a request carries an id; [`submit`] does not append an id already queued or
//! already applied (a write whose answer was lost and whose retry got 409), and the
//! controller records the ids it applied under [`APPLIED_KEY`] (the last [`APPLIED_KEEP`]),
//! skipping them when it takes requests. A save keeps every annotation and key it does not
//! own, and drops the requests the saved state has applied in the same write that records
//! their effect. A save answered 409 because a request was appended meanwhile (the state and
//! the target annotation unchanged) is made again on the new version, keeping the new
//! request.
//!
//! At rest a tick writes nothing (the holder record is not renewed), and the loop's claim
//! and the tick share one GET. Between ticks a `run` loop reads the ConfigMap
//! every `--interval` ([`StateStore::intent_changed`]: one GET, `resourceVersion` compared),
//! so a request or an annotation edit is followed within about one interval while the pods
//! are still listed every `--idle-interval`.

use crate::engine::alloc::{AllocatorState, SteerOp, Steering};
use crate::kube::{Api, KubeClient, KubeError, PostParams, CONFIG_MAPS};
use crate::store::file::{parse, Holder, StateStore, StoreError};
use crate::store::liveness::{self, Asker, Found, Home, Mode, Seen};
use serde_json::{json, Value};
use std::time::Duration;

/// The data key holding the state JSON.
pub(crate) const DATA_KEY: &str = "state.json";
/// The label podalloc puts on its ConfigMaps (and requires before writing over one).
pub(crate) const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The annotation holding a `run` loop's [`Holder`] record (JSON).
pub(crate) const HOLDER_KEY: &str = "podalloc.io/holder";
/// The annotation holding a question to the holder ([`Ping`](liveness::Ping), JSON), written by a process
/// that would act and finds another holder's record.
pub(crate) const PING_KEY: &str = "podalloc.io/ping";
/// The annotation holding the holder's answer: the nonce of the last ping it read.
pub(crate) const PONG_KEY: &str = "podalloc.io/pong";
/// The annotation holding the nonce of the last save (see the module doc).
pub(crate) const WRITE_ID_KEY: &str = "podalloc.io/write-id";
/// The data key holding the queued steering requests (a JSON array of [`Steering`]).
pub(crate) const REQUESTS_KEY: &str = "requests.json";
/// The annotation holding the target people set (a whole number); never written by the
/// controller.
pub(crate) const TARGET_KEY: &str = "podalloc.io/executors";
/// The data key holding what the controller has taken into account (JSON [`Applied`]): the
/// last value of [`TARGET_KEY`] it followed and the ids of the requests it applied.
pub(crate) const APPLIED_KEY: &str = "applied.json";
/// The field of a queued request (in [`REQUESTS_KEY`]) holding the value of [`TARGET_KEY`]
/// when it was queued: it orders the request against an edit of the annotation.
const AT_SUBMIT: &str = "executors_at_submit";
/// How many applied request ids [`APPLIED_KEY`] keeps (the newest).
pub(crate) const APPLIED_KEEP: usize = 256;
/// How many times a save or a submission is made again after a 409 caused by a request
/// appended meanwhile.
const RETRIES: u32 = 8;

/// A state store in ConfigMap `name` of the client's namespace.
pub(crate) struct ConfigMapStore<'a> {
    /// The ConfigMaps of the client's namespace.
    cms: Api<'a>,
    name: String,
    /// `metadata.resourceVersion` seen at the last load or save; `None`: does not exist.
    resource_version: Option<String>,
    app_id: String,
    mode: Mode,
    writes: u64,
    /// The ConfigMap as last read or written: the base of the next save (annotations and
    /// keys podalloc does not own are kept) and the source of [`StateStore::requests`].
    loaded: Option<Value>,
    /// `loaded` was read by this tick's [`StateStore::claim`]: the tick's load uses it
    /// instead of a second GET.
    fresh: bool,
    /// What [`StateStore::requests`] made of the target annotation of `loaded` (cleared by
    /// each load): the next save records it.
    intent: Option<Intent>,
    /// A save took in a version it had not loaded (made again after a 409 on a request
    /// appended or an annotation edited meanwhile, or a 409 on our own landed write): the
    /// next [`StateStore::intent_changed`] says so, since `resource_version` then already
    /// names that version.
    unseen: bool,
    /// A loop's question to another holder, between its claims.
    asker: Asker,
}

/// What the controller has taken into account, kept in data key [`APPLIED_KEY`].
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Applied {
    /// The value of annotation [`TARGET_KEY`] last followed (or found equal to the target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) executors: Option<String>,
    /// The ids of the requests applied, oldest first, the last [`APPLIED_KEEP`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) requests: Vec<String>,
}

/// The target annotation as one tick read it.
#[derive(Clone, Debug)]
struct Intent {
    /// An edit not yet followed: the id of its `scale` request and the annotation's text.
    edit: Option<(String, String)>,
    /// The value to record when the edit is not applied (or there is none).
    seen: Option<String>,
}

impl<'a> ConfigMapStore<'a> {
    /// A store for ConfigMap `name` (a DNS-1123 subdomain) holding `app_id`'s state.
    pub(crate) fn new(client: &'a KubeClient, name: &str, app_id: &str) -> ConfigMapStore<'a> {
        ConfigMapStore {
            cms: client.api(&CONFIG_MAPS),
            name: name.to_string(),
            resource_version: None,
            app_id: app_id.to_string(),
            mode: Mode::Once { ping: true },
            writes: 0,
            loaded: None,
            fresh: false,
            intent: None,
            unseen: false,
            asker: Asker::default(),
        }
    }

    /// For read-only commands: the holder record is ignored.
    pub(crate) fn read_only(mut self) -> Self {
        self.mode = Mode::Read;
        self
    }

    /// For the steering commands: a holder record that looks live is taken as live without
    /// asking it (they queue their request and wait for the loop to take it).
    pub(crate) fn steering(mut self) -> Self {
        self.mode = Mode::Once { ping: false };
        self
    }

    /// For a `run` loop reading its ConfigMap every `every.0` (its tick budget `every.1`):
    /// writes `holder` once, when it claims the ConfigMap, with its answer deadline
    /// ([`Mode::looping`]), and answers the pings it finds.
    pub(crate) fn holding(mut self, holder: Holder, every: (Duration, Duration)) -> Self {
        self.mode = Mode::looping(holder, every);
        self
    }

    /// A nonce for one save: pid, wall clock in ns, and a counter.
    fn next_write_id(&mut self) -> String {
        self.writes += 1;
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("{}-{ns}-{}", std::process::id(), self.writes)
    }

    /// After a 409: whether the ConfigMap already holds exactly `text` under `write_id`
    /// (our own write, applied but answered with an error and retried). Updates the
    /// remembered `resourceVersion` when so.
    fn own_write_landed(&mut self, text: &str, write_id: &str) -> bool {
        let Ok(Some(cm)) = self.cms.get(&self.name) else {
            return false;
        };
        let landed = cm["data"][DATA_KEY].as_str() == Some(text)
            && cm["metadata"]["annotations"][WRITE_ID_KEY].as_str() == Some(write_id);
        if landed {
            // People may have written after it: the next intent read ticks once to see.
            self.unseen = true;
            log::info!(
                "{}: the write answered 409 had already been applied (a retried request); \
                 counted as saved",
                self.what()
            );
            self.resource_version = cm["metadata"]["resourceVersion"]
                .as_str()
                .map(str::to_string);
            // The version saved is the base of the tick's next save: the queue it left and
            // the request ids it recorded (a stale base put back requests this write had
            // taken, and the next tick applied them again).
            self.loaded = Some(cm);
        }
        landed
    }

    fn corrupt(&self, why: String) -> StoreError {
        StoreError::Corrupt(
            std::path::PathBuf::from(format!("configmap:{}", self.name)),
            why,
        )
    }

    fn not_ours(&self) -> StoreError {
        self.corrupt(format!(
            "{} exists and was not created by podalloc (no label {MANAGED_BY}=podalloc); \
             choose another name for --state-store",
            self.what()
        ))
    }
}

impl ConfigMapStore<'_> {
    /// The ConfigMap `save` sends for `text` (the state JSON) on `base` (the object read
    /// last, whose other annotations and keys are kept, the target annotation included:
    /// never written here; `None`: a new one): our labels, the nonce, the holder record of a
    /// loop (removed otherwise), the `record` of what was taken into account, and the
    /// requests of `base` that `record` does not list.
    fn object(&self, base: Option<&Value>, text: &str, record: &Applied, write_id: &str) -> Value {
        let mut cm = base.cloned().unwrap_or_else(|| json!({"metadata": {}}));
        cm["apiVersion"] = json!("v1");
        cm["kind"] = json!("ConfigMap");
        let meta = &mut cm["metadata"];
        meta["name"] = json!(self.name);
        if !meta["labels"].is_object() {
            meta["labels"] = json!({});
        }
        meta["labels"][MANAGED_BY] = json!("podalloc");
        meta["labels"]["spark-app-selector"] = json!(self.app_id);
        if !meta["annotations"].is_object() {
            meta["annotations"] = json!({});
        }
        let ann = meta["annotations"].as_object_mut().expect("an object");
        ann.insert(WRITE_ID_KEY.into(), json!(write_id));
        match &self.mode {
            Mode::Loop(h) => {
                ann.insert(
                    HOLDER_KEY.into(),
                    json!(serde_json::to_string(h).expect("holder")),
                );
            }
            Mode::Once { .. } => {
                ann.remove(HOLDER_KEY);
            }
            // Never writes.
            Mode::Read => {}
        }
        if !cm["data"].is_object() {
            cm["data"] = json!({});
        }
        let left: Vec<Value> = raw_queue(&cm)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| !record.requests.iter().any(|id| r["id"] == id.as_str()))
            .collect();
        let data = cm["data"].as_object_mut().expect("an object");
        data.insert(DATA_KEY.into(), json!(text));
        match *record == Applied::default() {
            true => data.remove(APPLIED_KEY),
            false => data.insert(
                APPLIED_KEY.into(),
                json!(serde_json::to_string(record).expect("record")),
            ),
        };
        match left.is_empty() {
            true => data.remove(REQUESTS_KEY),
            false => data.insert(
                REQUESTS_KEY.into(),
                json!(serde_json::to_string(&left).expect("requests")),
            ),
        };
        cm
    }

    /// After a 409 that is not our own write: re-reads the ConfigMap and returns it when only
    /// people's part changed since `base` (a request appended, the target annotation edited;
    /// the same state and record, no new owner), so the save can be made again on it, which
    /// keeps their change for the next tick; `None`: a rival wrote.
    fn only_requests_changed(&self, base: Option<&Value>) -> Option<Value> {
        let base = base?;
        let cm = self.cms.get(&self.name).ok()??;
        let same = |k: &str| cm["data"][k] == base["data"][k];
        // No new owner: the holder record is the one the save was based on.
        let holder = |c: &Value| c["metadata"]["annotations"][HOLDER_KEY].clone();
        (same(DATA_KEY) && same(APPLIED_KEY) && holder(&cm) == holder(base)).then_some(cm)
    }

    /// The record of what is taken into account after a save on `base` that applies requests
    /// `ids`: `base`'s record plus `ids` (the newest [`APPLIED_KEEP`] kept), and the target
    /// annotation's value followed when this tick's edit of it is recorded as applied, by
    /// this save or an earlier one of the tick (its write-ahead save: the tick's final save
    /// no longer lists the ids the first one dropped from the queue); else the value this
    /// tick found already followed; `base`'s when no tick read the requests.
    fn record_after(&self, base: Option<&Value>, ids: &[String]) -> Applied {
        let mut r = base.map(applied_of).unwrap_or_default();
        for id in ids {
            if !r.requests.contains(id) {
                r.requests.push(id.clone());
            }
        }
        let extra = r.requests.len().saturating_sub(APPLIED_KEEP);
        r.requests.drain(..extra);
        if let Some(i) = &self.intent {
            r.executors = match &i.edit {
                Some((id, text)) if r.requests.contains(id) => Some(text.clone()),
                _ => i.seen.clone(),
            };
        }
        r
    }
}

/// The steering requests queued in ConfigMap `cm` as JSON objects (none when the key is
/// absent). Errors: the key does not hold a JSON array of requests.
fn raw_queue(cm: &Value) -> Result<Vec<Value>, String> {
    let Some(text) = cm["data"][REQUESTS_KEY].as_str() else {
        return Ok(Vec::new());
    };
    let items: Vec<Value> =
        serde_json::from_str(text).map_err(|e| format!("key {REQUESTS_KEY}: {e}"))?;
    for item in &items {
        serde_json::from_value::<Steering>(item.clone())
            .map_err(|e| format!("key {REQUESTS_KEY}: {e}"))?;
    }
    Ok(items)
}

/// The steering requests queued in ConfigMap `cm` (none when the key is absent).
/// Errors: as [`raw_queue`].
fn queue_of(cm: &Value) -> Result<Vec<Steering>, String> {
    Ok(raw_queue(cm)?
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect())
}

/// What the controller recorded in `cm` as taken into account ([`APPLIED_KEY`]); an
/// unreadable record counts as none, with a warning.
pub(crate) fn applied_of(cm: &Value) -> Applied {
    let Some(text) = cm["data"][APPLIED_KEY].as_str() else {
        return Applied::default();
    };
    serde_json::from_str(text).unwrap_or_else(|e| {
        log::warn!("ConfigMap key {APPLIED_KEY} unreadable ({e}): taken as empty");
        Applied::default()
    })
}

/// The target annotation of `cm`, trimmed (`None`: absent).
fn annotation_of(cm: &Value) -> Option<String> {
    (cm["metadata"]["annotations"][TARGET_KEY].as_str()).map(|t| t.trim().to_string())
}

/// What the target annotation of `cm` asks, against `record` (what the controller followed)
/// and `state_target`: an edit when its value differs from the one last followed (with no
/// record: from the state's target), as a `scale` request; an annotation that is not a whole
/// number up to [`crate::engine::alloc::MAX_TARGET`] is ignored with a warning.
fn intent_of(cm: &Value, record: &Applied, state_target: Option<u32>, what: &str) -> Intent {
    let seen = record.executors.clone();
    let none = |seen| Intent { edit: None, seen };
    let Some(text) = annotation_of(cm) else {
        return none(seen);
    };
    if seen.as_deref() == Some(text.as_str()) {
        return none(seen);
    }
    let Some(n) = text
        .parse::<u32>()
        .ok()
        .filter(|&n| n <= crate::engine::alloc::MAX_TARGET)
    else {
        log::warn!("{what}: annotation {TARGET_KEY}={text:?} is not a target (a whole number up to {}): ignored", crate::engine::alloc::MAX_TARGET);
        return none(seen);
    };
    if seen.is_none() && Some(n) == state_target {
        return none(Some(text));
    }
    let rv = cm["metadata"]["resourceVersion"].as_str().unwrap_or("");
    Intent {
        edit: Some((format!("annotation-{n}-rv{rv}"), text)),
        seen,
    }
}

/// The queued requests of `cm` not yet applied, in the order they were made, the edit of
/// the target annotation (`intent`) among them: after the requests queued under another
/// value of the annotation (made before the edit), before those queued under its new value.
fn ordered_requests(
    cm: &Value,
    record: &Applied,
    intent: &Intent,
) -> Result<Vec<Steering>, String> {
    let raw = raw_queue(cm)?;
    let fresh: Vec<&Value> = (raw.iter())
        .filter(|r| !record.requests.iter().any(|id| r["id"] == id.as_str()))
        .collect();
    let mut out: Vec<Steering> = Vec::new();
    let mut pending_edit = intent.edit.clone();
    for r in fresh {
        if let Some((id, text)) = pending_edit.as_ref() {
            if r[AT_SUBMIT].as_str() == Some(text.as_str()) {
                out.push(edit_request(id, text));
                pending_edit = None;
            }
        }
        out.push(serde_json::from_value(r.clone()).map_err(|e| e.to_string())?);
    }
    if let Some((id, text)) = pending_edit {
        out.push(edit_request(&id, &text));
    }
    Ok(out)
}

/// The `scale` request of an edit of the target annotation to `text` (a whole number).
fn edit_request(id: &str, text: &str) -> Steering {
    Steering {
        id: id.to_string(),
        op: SteerOp::Scale {
            target: text.parse().unwrap_or(0),
        },
        submitted_ms: 0,
        by: format!("the {TARGET_KEY} annotation"),
        profile: 0,
    }
}

/// What ConfigMap `cm` carries about its holder: the record, the ping, the pong.
fn seen_of(cm: &Value) -> Seen {
    let ann = &cm["metadata"]["annotations"];
    let text = |k: &str| ann[k].as_str().map(str::to_string);
    Seen {
        holder: text(HOLDER_KEY),
        ping: text(PING_KEY).and_then(|t| serde_json::from_str(&t).ok()),
        pong: text(PONG_KEY),
    }
}

/// Whether ConfigMaps `a` and `b` differ at most by a ping or a pong (and their version):
/// the same data, labels and other annotations.
fn same_but_ping(a: &Value, b: &Value) -> bool {
    let rest = |c: &Value| {
        let mut ann = c["metadata"]["annotations"].clone();
        if let Some(m) = ann.as_object_mut() {
            m.remove(PING_KEY);
            m.remove(PONG_KEY);
        }
        (c["data"].clone(), c["metadata"]["labels"].clone(), ann)
    };
    rest(a) == rest(b)
}

/// The loop that owns app `app_id` through state ConfigMap `name` now, for `status`: its
/// holder record when one is there and looks live (not asked: not of a process gone from
/// this host, not an older podalloc's stale one); `None` when there is no ConfigMap, no
/// record, an unreadable one, or one nobody holds. Errors: the API call's, as
/// [`StoreError::Backend`].
pub(crate) fn holder(
    client: &KubeClient,
    name: &str,
    app_id: &str,
) -> Result<Option<Holder>, StoreError> {
    Ok(read_only(client, name, app_id)?
        .1
        .as_ref()
        .and_then(holder_of))
}

/// ConfigMap `name` as a read-only store of app `app_id` reads it (`None`: there is none),
/// and that store, whose messages name it. Errors: the API call's, as
/// [`StoreError::Backend`].
fn read_only<'c>(
    client: &'c KubeClient,
    name: &str,
    app_id: &str,
) -> Result<(ConfigMapStore<'c>, Option<Value>), StoreError> {
    let store = ConfigMapStore::new(client, name, app_id).read_only();
    let cm = store.read()?;
    Ok((store, cm))
}

/// The holder record of ConfigMap `cm` when it looks live (see [`holder`]).
pub(crate) fn holder_of(cm: &Value) -> Option<Holder> {
    liveness::looks_live(
        cm["metadata"]["annotations"][HOLDER_KEY].as_str(),
        "ConfigMap",
    )
}

/// Appends `req` to the request queue of ConfigMap `name` (creating the ConfigMap when it
/// does not exist), with `resourceVersion`, again after each 409 (at most [`RETRIES`]
/// times), recording the target annotation it was made under. A request whose id is
/// already queued or already applied is not appended again: a write that landed although
/// its answer was lost (then retried, answered 409) counts once. Errors:
/// [`StoreError::Corrupt`] for a ConfigMap podalloc did not create or an unreadable queue,
/// [`StoreError::Conflict`] after the retries, [`StoreError::Backend`].
pub(crate) fn submit(
    client: &KubeClient,
    name: &str,
    app_id: &str,
    req: &Steering,
) -> Result<(), StoreError> {
    let store = ConfigMapStore::new(client, name, app_id).read_only();
    for _ in 0..RETRIES {
        let cm = store.read()?;
        let mut cm =
            cm.unwrap_or_else(|| queue_only(store.object(None, "", &Applied::default(), "")));
        if cm["metadata"]["labels"][MANAGED_BY] != "podalloc" {
            return Err(store.not_ours());
        }
        let mut queue = raw_queue(&cm).map_err(|why| store.corrupt(why))?;
        let known = |id: &str| {
            queue.iter().any(|r| r["id"] == id) || applied_of(&cm).requests.iter().any(|a| a == id)
        };
        if known(&req.id) {
            log::info!(
                "request {} is already in {} (a write whose answer was lost): not queued twice",
                req.id,
                store.what()
            );
            return Ok(());
        }
        let mut item = serde_json::to_value(req).expect("request");
        if let Some(a) = annotation_of(&cm) {
            item[AT_SUBMIT] = json!(a);
        }
        queue.push(item);
        cm["data"][REQUESTS_KEY] = json!(serde_json::to_string(&queue).expect("requests"));
        let res = match cm["metadata"]["resourceVersion"].is_string() {
            true => store.cms.replace(name, &cm),
            false => store
                .cms
                .create(&cm, &PostParams::default())
                .map(|c| c.object),
        };
        match res {
            Ok(_) => return Ok(()),
            Err(e) if e.status_code() == Some(409) => continue,
            // The write may have landed (the connection closed before its answer, a 5xx):
            // read again, and the request's id says whether it did.
            Err(e) if e.is_retryable() => {
                log::info!(
                    "queueing request {}: {e}; checking whether it landed",
                    req.id
                )
            }
            Err(e) => return Err(store.backend(e)),
        }
    }
    Err(store.conflict())
}

/// The steering requests queued in ConfigMap `name` and the state's applied ids, for
/// `status` and `--wait`. Errors: as [`submit`].
pub(crate) fn queued(
    client: &KubeClient,
    name: &str,
    app_id: &str,
) -> Result<Vec<Steering>, StoreError> {
    let (store, cm) = read_only(client, name, app_id)?;
    match cm {
        None => Ok(Vec::new()),
        Some(cm) => {
            let applied = applied_of(&cm).requests;
            let queue = queue_of(&cm).map_err(|why| store.corrupt(why))?;
            Ok(queue
                .into_iter()
                .filter(|r| !applied.contains(&r.id))
                .collect())
        }
    }
}

/// `cm` without the state key and the nonce: a new ConfigMap holding only a request queue.
fn queue_only(mut cm: Value) -> Value {
    if let Some(d) = cm["data"].as_object_mut() {
        d.remove(DATA_KEY);
    }
    if let Some(a) = cm["metadata"]["annotations"].as_object_mut() {
        a.remove(WRITE_ID_KEY);
    }
    cm
}

/// The holder record, ping and pong of a state ConfigMap are annotations ([`HOLDER_KEY`],
/// [`PING_KEY`], [`PONG_KEY`]), the record and the ping as JSON text.
impl Home for ConfigMapStore<'_> {
    const FORBIDDEN_HINT: &'static str = "RBAC: grant the verb the server names on configmaps in \
        the Role bound to podalloc's user; deploy/rbac.yaml lists every verb podalloc needs";
    const NOT_FOUND_HINT: Option<&'static str> = None;
    const WRITES: &'static str = "";
    const KEYS: [&'static str; 3] = [HOLDER_KEY, PING_KEY, PONG_KEY];

    fn encode<T: serde::Serialize>(v: &T) -> Value {
        Value::String(serde_json::to_string(v).expect("JSON serializes"))
    }

    fn seen(cm: &Value) -> Seen {
        seen_of(cm)
    }

    fn what(&self) -> String {
        format!("ConfigMap {}/{}", self.cms.namespace(), self.name)
    }

    fn mode(&self) -> &Mode {
        &self.mode
    }

    fn asker(&mut self) -> &mut Asker {
        &mut self.asker
    }

    fn read(&self) -> Result<Option<Value>, StoreError> {
        self.cms.get(&self.name).map_err(|e| self.backend(e))
    }

    fn fields(cm: &mut Value) -> &mut Value {
        &mut cm["metadata"]["annotations"]
    }

    fn replace(&self, cm: &Value) -> Result<Value, KubeError> {
        self.cms.replace(&self.name, cm)
    }
}

impl StateStore for ConfigMapStore<'_> {
    fn describe(&self) -> String {
        self.what()
    }

    fn load(&mut self) -> Result<Option<AllocatorState>, StoreError> {
        let cm = match std::mem::take(&mut self.fresh) {
            true => self.loaded.clone(),
            false => self.read()?,
        };
        self.intent = None;
        let Some(cm) = cm else {
            self.resource_version = None;
            self.loaded = None;
            return Ok(None);
        };
        // Never take over a ConfigMap that podalloc did not create: saving replaces it whole.
        if cm["metadata"]["labels"][MANAGED_BY] != "podalloc" {
            return Err(self.not_ours());
        }
        let mut cm = cm;
        liveness::settle(self, &mut cm)?;
        self.resource_version = cm["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        let text = cm["data"][DATA_KEY].as_str().map(str::to_string);
        self.loaded = Some(cm);
        match text {
            None => Ok(None),
            Some(text) => parse(text.as_bytes())
                .map(Some)
                .map_err(|why| self.corrupt(format!("key {DATA_KEY}: {why}"))),
        }
    }

    fn save(&mut self, state: &AllocatorState) -> Result<(), StoreError> {
        // The requests this state applied leave the queue in this same write.
        let applied = state.applied_requests.clone();
        let mut st = state.clone();
        st.applied_requests.clear();
        let text = serde_json::to_string_pretty(&st).expect("state serializes");
        let write_id = self.next_write_id();
        let mut base = self.loaded.clone();
        for _ in 0..RETRIES {
            let record = self.record_after(base.as_ref(), &applied);
            let mut cm = self.object(base.as_ref(), &text, &record, &write_id);
            let res = match &self.resource_version {
                Some(rv) => {
                    cm["metadata"]["resourceVersion"] = Value::String(rv.clone());
                    self.cms.replace(&self.name, &cm)
                }
                None => (self.cms.create(&cm, &PostParams::default())).map(|c| c.object),
            };
            match res {
                Ok(saved) => {
                    self.resource_version = saved["metadata"]["resourceVersion"]
                        .as_str()
                        .map(str::to_string);
                    self.loaded = Some(saved);
                    return Ok(());
                }
                Err(e) if e.status_code() == Some(409) => {
                    if self.own_write_landed(&text, &write_id) {
                        return Ok(());
                    }
                    let Some(now) = self.only_requests_changed(base.as_ref()) else {
                        return Err(self.conflict());
                    };
                    self.resource_version = now["metadata"]["resourceVersion"]
                        .as_str()
                        .map(str::to_string);
                    // Its request or edit is kept for the next tick, which the next intent
                    // read asks for at once.
                    self.unseen = true;
                    base = Some(now);
                }
                Err(e) => return Err(self.backend(e)),
            }
        }
        Err(self.conflict())
    }

    /// Loads (the tick's load then uses that read): a loop claims the ConfigMap (its record
    /// written once), answers a ping, or finds another live holder ([`StoreError::Owned`]:
    /// it waits as a standby).
    fn claim(&mut self) -> Result<(), StoreError> {
        self.load()?;
        self.fresh = true;
        Ok(())
    }

    /// Removes the loop's own holder record (one conditional write), so the next loop
    /// starts at once; nothing when the record is not ours.
    fn release(&mut self) -> Result<(), StoreError> {
        liveness::release(self)
    }

    fn requests(&mut self) -> Result<Vec<Steering>, StoreError> {
        let Some(cm) = &self.loaded else {
            return Ok(Vec::new());
        };
        let target = (cm["data"][DATA_KEY].as_str())
            .and_then(|t| parse(t.as_bytes()).ok())
            .and_then(|st| st.target);
        let record = applied_of(cm);
        let intent = intent_of(cm, &record, target, &self.what());
        let queue = ordered_requests(cm, &record, &intent).map_err(|why| self.corrupt(why))?;
        self.intent = Some(intent);
        Ok(queue)
    }

    /// One GET of the ConfigMap: changed when its `resourceVersion` is not the one this
    /// store last loaded or wrote (a request appended by `add`, `scale` or `remove`, the
    /// target annotation edited by `kubectl annotate`, any other edit: one tick finds out),
    /// or when a save took in a version it had not loaded. The loop's own writes (its saves,
    /// its pongs) leave the version it remembers, so they wake nothing; nor does a ping: a
    /// loop answers it here (one conditional write) and goes on. A holder record not its own
    /// wakes it (the tick's claim finds out). Errors: the GET's and the pong's
    /// ([`StoreError::Backend`]).
    fn intent_changed(&mut self) -> Result<bool, StoreError> {
        let cm = self.read()?;
        let now = (cm.as_ref()).and_then(|c| c["metadata"]["resourceVersion"].as_str());
        let mut moved = now != self.resource_version.as_deref();
        if let (Some(mut cm), Mode::Loop(mine)) = (cm, &self.mode) {
            let seen = seen_of(&cm);
            let what = self.what();
            match liveness::judge(seen.holder.as_deref(), Some(mine), &what) {
                Found::Ours => {
                    if let Some(stored) = liveness::answer(self, &cm, &seen)? {
                        cm = stored;
                    }
                    let quiet = (self.loaded.as_ref()).is_some_and(|l| same_but_ping(l, &cm));
                    if moved && quiet {
                        self.resource_version = cm["metadata"]["resourceVersion"]
                            .as_str()
                            .map(str::to_string);
                        self.loaded = Some(cm);
                        moved = false;
                    }
                }
                _ => moved = true,
            }
        }
        Ok(std::mem::take(&mut self.unseen) || moved)
    }
}
