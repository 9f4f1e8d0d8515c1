//! The ExecutorSet store (`--state-store executorset:NAME`): an app's intent and the
//! allocator's own state in an `ExecutorSet` of the app's namespace (group `podalloc.io`,
//! version `v1alpha1`; the contract is `docs/executorset.md`, the CRD `deploy/crd.yaml`).
//!
//! - **Spec is read, never written** by the controller: the target followed is
//!   clamp(`spec.replicas`, `spec.minReplicas`, `spec.maxReplicas`) ([`StateStore::home_target`],
//!   one log line and one Event each time the clamp changes it); `spec.removals` not yet in
//!   `status.appliedRemovals` are the steering requests ([`StateStore::requests`]: one `remove`
//!   each, its request id the entry's, an id seen twice taken once); `spec.template`, when
//!   present, is the executor pod template ([`StateStore::home_template`]).
//! - **Status is the controller's**: every write is `PUT …/status` carrying the
//!   `resourceVersion` last read, made only when the status it would write differs from the
//!   stored one (none at rest). It holds the allocator state (`status.allocator`, the state
//!   file's JSON), the removals applied (`status.appliedRemovals`, written in the same write
//!   as the state that reflects them: exactly once), and what the tick saw (`replicas`,
//!   `readyReplicas`, `pending`, `unacknowledged`, `target`, `selector`,
//!   `observedGeneration`, conditions `Progressing` and `Blocked`).
//! - **A retried write**: a 409 after a status write whose answer was lost is our own write
//!   when the stored status is exactly the one sent (counted as saved); a 409 caused by a
//!   change of `spec` or metadata only (the stored status is the one read) is made again on
//!   the new version; any other status means another writer: [`StoreError::Conflict`] (exit
//!   3), so a tick that loses its write-ahead save does not act.
//! - **Missing**: a tick's first save creates the object (label `spark-app-selector`,
//!   `spec.appId`, `spec.replicas` seeded by the state's target, i.e. `--target`), then
//!   writes its status. An existing object of another app (`spec.appId`) is refused (exit 2,
//!   naming both).
//! - **Deleted or wiped under a running loop**: a store that loaded or saved a state creates
//!   the home again from its last read, or writes the state back into a wiped status, with a
//!   log line and a Warning Event (`Recreated`, `StateRestored`), so the loop goes on at its
//!   target and its id counter never goes back.
//! - **Resource profiles**: the object `NAME` is profile 0's, the app's home (its status
//!   holds the state and the one id counter). Each other profile P has an object of its own
//!   (`spec.resourceProfile: P`, label `spark-app-selector`, found by one list by that label;
//!   created as `NAME-rpP` when the state gives P a target and none exists), whose clamped
//!   `spec.replicas`, `spec.template` and `spec.removals` are P's
//!   ([`StateStore::home_profiles`], [`StateStore::requests`]) and whose status shows P's
//!   counts, so each profile has its own `/scale`.
//! - **Who acts**: a `run` loop without `--leader-elect` ([`ExecutorSetStore::holding`])
//!   writes its holder record into `status.holder` once, when it claims the home, and never
//!   renews it; another loop that finds a live-looking holder there asks it whether it lives
//!   (`status.ping`, answered by the holder's next read of its home with `status.pong`:
//!   `crate::store::liveness`) and waits as a standby while it answers, taking the home over
//!   (a conditional status write of its own record) when it does not answer within the
//!   holder's deadline; a one-shot `reconcile` beside a live holder exits 3. A ping is a
//!   status field, written through `/status` like everything the controller writes, so it
//!   is neither intent (no generation bump) nor a write of people's spec or annotations.
//! - **Instant, still polling**: [`StateStore::intent_changed`] is one list by label (and a
//!   GET of a home without the label), compared by `metadata.generation` (every `spec`
//!   change bumps it), which a loop at rest makes every `--interval`.
//!
//! The steering commands write `spec` ([`submit`]): `scale` sets `spec.replicas`, `add`
//! raises it, `remove` appends to `spec.removals` and lowers it, each one write conditional on
//! the version read and carrying its request id in annotations [`REQUEST_KEY`] (the last) and
//! [`REQUESTS_KEY`] (the last [`REQUESTS_KEEP`]), so that a retry after a lost answer (409)
//! sees that it landed, even when other requests landed after it.

use crate::engine::alloc::{AllocatorState, Blocked, ProfileSummary, SteerOp, Steering, Summary};
use crate::engine::podspec::PodTemplate;
use crate::engine::snapshot::{LABEL_APP, LABEL_PROFILE, LABEL_ROLE, ROLE_EXECUTOR};
use crate::kube::{Api, KubeClient, KubeError, ListParams, PostParams, EVENTS, EXECUTOR_SETS};
use crate::store::file::{parse, Holder, HomeProfile, StateStore, StoreError};
use crate::store::liveness::{self, Asker, Found, Home, Mode, Seen};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

/// The annotation holding the request id of the last podalloc write of `spec` (also written
/// by the Spark allocator plugin; read as one more id of [`REQUESTS_KEY`]).
pub const REQUEST_KEY: &str = "podalloc.io/request";
/// The annotation holding the ids of the last [`REQUESTS_KEEP`] requests written into
/// `spec` by podalloc commands, oldest first, as a JSON array of strings: a retry after a lost
/// answer finds its id there even when later requests landed after it (exactly once).
/// podalloc's own (its `podalloc.io/` prefix), like [`REQUEST_KEY`]; the controller never
/// writes it.
pub const REQUESTS_KEY: &str = "podalloc.io/requests";
/// How many request ids [`REQUESTS_KEY`] keeps (the newest): a retry comes within one
/// command's few attempts, far fewer than 32 writes later; about 1 KB of annotation.
pub const REQUESTS_KEEP: usize = 32;
/// The `apiVersion` of an ExecutorSet.
pub const API_VERSION: &str = "podalloc.io/v1alpha1";
/// How many times a write is made again after a 409 that is not another writer's status.
const RETRIES: u32 = 8;

/// What a tick saw and decided ([`StateStore::observe`]), published in `status`.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    running: u32,
    pending: u32,
    /// The `Blocked` condition's reason (CamelCase) and message, when blocked.
    blocked: Option<(String, String)>,
    /// Each resource profile's counts ([`Summary::profiles`]).
    profiles: BTreeMap<u32, ProfileSummary>,
}

/// A state store in ExecutorSet `name` of the client's namespace (see the module doc).
pub(crate) struct ExecutorSetStore<'a> {
    sets: Api<'a>,
    events: Option<Api<'a>>,
    name: String,
    app_id: String,
    /// The object as last read or written; `None`: it does not exist (yet).
    loaded: Option<Value>,
    /// `metadata.generation` of the spec the loaded state follows (`status.observedGeneration`).
    generation: Option<i64>,
    observed: Option<Observed>,
    /// The objects of the app's other resource profiles (`spec.resourceProfile` P >= 1), by
    /// P, as last read.
    profiles: BTreeMap<u32, Value>,
    /// Each profile object's (generation, uid) as the last load read it: what the loop
    /// follows. Not `profiles`' own, which a status write's 409 retry moves to a newer
    /// generation the tick did not follow (a `kubectl scale` racing that write was then not
    /// seen until the idle tick).
    followed: Vec<(u32, Option<i64>, Value)>,
    /// The state as last loaded or saved: each profile object's status shows its part.
    state: Option<AllocatorState>,
    /// By profile, the last (spec.replicas, min, max, clamped) logged as clamped: logged
    /// once per change.
    clamp_said: BTreeMap<u32, (u64, u64, u64, u32)>,
    /// By profile, the last usable `spec.template`: followed while a later one is not.
    good_templates: RefCell<BTreeMap<u32, PodTemplate>>,
    /// By profile, the unusable `spec.template` last reported (once per change) and the
    /// `Blocked` condition's message about it.
    refused_templates: RefCell<BTreeMap<u32, (Value, String)>>,
    mode: Mode,
    /// By profile P >= 1, the template an object this store creates for P carries in
    /// `spec.template` (`--profile-template P=FILE`).
    seeds: BTreeMap<u32, Value>,
    /// The (profile, kept, ignored) objects of one profile already warned about.
    duplicates_said: RefCell<std::collections::BTreeSet<(u32, String, String)>>,
    /// A loop's question to another holder, between its claims.
    asker: Asker,
    /// What this tick's [`StateStore::claim`] loaded: the tick's load returns it.
    claimed: Option<Option<AllocatorState>>,
}

impl<'a> ExecutorSetStore<'a> {
    /// A store for ExecutorSet `name` (a DNS-1123 subdomain) of app `app_id`, in the client's
    /// namespace; `events`: post an Event when the target is clamped (off: `--no-events`).
    pub(crate) fn new(
        client: &'a KubeClient,
        name: &str,
        app_id: &str,
        events: bool,
    ) -> ExecutorSetStore<'a> {
        ExecutorSetStore {
            sets: client.api(&EXECUTOR_SETS),
            events: events.then(|| client.api(&EVENTS)),
            name: name.to_string(),
            app_id: app_id.to_string(),
            loaded: None,
            generation: None,
            observed: None,
            profiles: BTreeMap::new(),
            followed: Vec::new(),
            state: None,
            clamp_said: BTreeMap::new(),
            good_templates: RefCell::default(),
            refused_templates: RefCell::default(),
            duplicates_said: RefCell::default(),
            seeds: BTreeMap::new(),
            mode: Mode::Read,
            asker: Asker::default(),
            claimed: None,
        }
    }

    /// For a `run` loop reading its home every `every.0` (its tick budget `every.1`): writes
    /// `holder` into `status.holder` once, when it claims the home, with its answer deadline
    /// ([`Mode::looping`]), and answers the pings it finds.
    pub(crate) fn holding(mut self, holder: Holder, every: (Duration, Duration)) -> Self {
        self.mode = Mode::looping(holder, every);
        self
    }

    /// The objects this store creates for resource profiles P >= 1 carry `templates[P]` in
    /// `spec.template` (`--profile-template P=FILE`), so that a restart without the flag
    /// keeps each profile's shape.
    pub(crate) fn seeding(mut self, templates: &BTreeMap<u32, PodTemplate>) -> Self {
        self.seeds = (templates.iter())
            .filter(|(&p, _)| p != 0)
            .map(|(&p, t)| {
                let mut pod = t.pod().clone();
                if let Some(m) = pod.as_object_mut() {
                    m.remove("apiVersion");
                    m.remove("kind");
                }
                (p, pod)
            })
            .collect();
        self
    }

    /// For a one-shot command: a live holder stops it (exit 3); `ping`: asked first.
    pub(crate) fn once(mut self, ping: bool) -> Self {
        self.mode = Mode::Once { ping };
        self
    }

    fn what_of(&self, name: &str) -> String {
        format!("ExecutorSet {}/{name}", self.sets.namespace())
    }

    /// Reads the home (profile 0's object, `None` when missing) and the objects of the app's
    /// other resource profiles, by profile: one list by label `spark-app-selector` (the home
    /// too when it carries the label), and a get of the home when the list lacks it. Objects
    /// of the label with another `spec.appId`, and other objects of profile 0, are not this
    /// home's: left out. Of two objects of one profile the older (by
    /// `metadata.creationTimestamp`, then name) is kept, the other ignored with a warning
    /// ([`Self::warn_duplicate`]). Errors: the API's; the home of another app or profile
    /// ([`StoreError::Mismatch`], exit 2, naming it).
    fn read_all(&self) -> Result<(Option<Value>, BTreeMap<u32, Value>), StoreError> {
        let selector = format!("{LABEL_APP}={}", self.app_id);
        let lp = ListParams {
            label_selector: &selector,
            ..ListParams::default()
        };
        let (items, _) = self.sets.list_items(&lp).map_err(|e| self.backend(e))?;
        let (mut home, mut profiles) = (None, BTreeMap::<u32, Value>::new());
        for mut es in items {
            es["apiVersion"] = json!(API_VERSION);
            es["kind"] = json!("ExecutorSet");
            let name = es["metadata"]["name"].as_str().unwrap_or_default();
            let p = profile_of(&es);
            if name == self.name {
                home = Some(es);
            } else if es["spec"]["appId"] != self.app_id.as_str() || p == 0 {
                continue;
            } else if let Some(first) = profiles.get(&p) {
                // Two objects of one profile: the older one is that profile's (anyone who
                // can create an ExecutorSet must not stop the app's controller).
                let (kept, ignored) = match older(first, &es) {
                    true => (first.clone(), es),
                    false => (es, first.clone()),
                };
                self.warn_duplicate(p, &kept, &ignored);
                profiles.insert(p, kept);
            } else {
                profiles.insert(p, es);
            }
        }
        let home = match home {
            Some(h) => Some(h),
            None => self.sets.get(&self.name).map_err(|e| self.backend(e))?,
        };
        if let Some(h) = &home {
            check_app(h, &self.app_id, &self.what())?;
            if profile_of(h) != 0 {
                return Err(StoreError::Mismatch(format!(
                    "{} keeps resource profile {} (spec.resourceProfile): --state-store \
                     executorset:NAME names the app's profile-0 ExecutorSet, which holds its \
                     state; this command did nothing (exit 2)",
                    self.what(),
                    profile_of(h)
                )));
            }
        }
        Ok((home, profiles))
    }

    /// Says once per (profile, object kept, object ignored) that `ignored` also keeps resource
    /// profile `p` and is left out for `kept` (the older): a `WARN` line naming the fix, and
    /// a Warning Event `DuplicateProfile` on the ignored object when this store posts Events.
    fn warn_duplicate(&self, p: u32, kept: &Value, ignored: &Value) {
        let name = |es: &Value| {
            es["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        let key = (p, name(kept), name(ignored));
        if !self.duplicates_said.borrow_mut().insert(key) {
            return;
        }
        let message = format!(
            "{} also keeps resource profile {p} of app {:?} (spec.resourceProfile): ignored; \
             {} (the older by metadata.creationTimestamp, then name) is that profile's. Fix: \
             kubectl delete executorset {}",
            self.what_of(&name(ignored)),
            self.app_id,
            self.what_of(&name(kept)),
            name(ignored)
        );
        log::warn!("{message}");
        let uid = ignored["metadata"]["uid"].as_str().unwrap_or_default();
        self.event("DuplicateProfile", &message, (&name(ignored), uid));
    }

    /// Creates the object `name` of resource profile `profile` (0: the home), seeded by
    /// `target` (`spec.replicas`) and, for P >= 1, its template ([`Self::seeding`]:
    /// `spec.template`), and returns it as stored; an object created meanwhile by
    /// someone else is read instead (it must be that profile's of this app). Errors: the
    /// API's, a name taken by another app or profile (exit 2).
    fn create(&self, name: &str, profile: u32, target: Option<u32>) -> Result<Value, StoreError> {
        let mut spec = json!({"appId": self.app_id});
        if profile != 0 {
            spec["resourceProfile"] = json!(profile);
        }
        if let Some(t) = target {
            spec["replicas"] = json!(t);
        }
        if let Some(t) = self.seeds.get(&profile).filter(|_| profile != 0) {
            spec["template"] = t.clone();
        }
        let es = json!({
            "apiVersion": API_VERSION,
            "kind": "ExecutorSet",
            "metadata": {"name": name, "labels": {LABEL_APP: self.app_id}},
            "spec": spec,
        });
        let what = self.what_of(name);
        match self.sets.create(&es, &PostParams::default()) {
            Ok(c) => {
                let replicas = target.map_or_else(|| "unset".to_string(), |t| t.to_string());
                log::info!("created {what} (profile {profile}, spec.replicas {replicas})");
                Ok(c.object)
            }
            Err(e) if e.is_already_exists() => {
                let es = self.sets.get(name).map_err(|e| self.backend(e))?;
                let es = es.ok_or_else(|| self.conflict())?;
                check_app(&es, &self.app_id, &what)?;
                if profile_of(&es) != profile {
                    return Err(StoreError::Mismatch(format!(
                        "{what} keeps resource profile {}, not {profile}: give profile \
                         {profile} an ExecutorSet of its own (spec.resourceProfile: {profile}, \
                         label {LABEL_APP}={}); this command did nothing (exit 2)",
                        profile_of(&es),
                        self.app_id
                    )));
                }
                Ok(es)
            }
            Err(e) => Err(self.backend(e)),
        }
    }

    /// Creates an object for each resource profile the state gives a target and no object
    /// has (`NAME-rpP`, seeded by that target), so that each is scalable on its own.
    /// Errors: as [`Self::create`].
    fn create_profiles(&mut self, state: &AllocatorState) -> Result<(), StoreError> {
        for (&p, &t) in &state.profile_targets {
            if self.profiles.contains_key(&p) {
                continue;
            }
            let es = self.create(&format!("{}-rp{p}", self.name), p, Some(t))?;
            self.profiles.insert(p, es);
        }
        Ok(())
    }

    /// The status to store for `state` (`None`: the loaded one's allocator state) on the
    /// loaded object's status, with what was observed; conditions keep their transition time
    /// while their status stays.
    fn compose(&self, state: Option<&AllocatorState>) -> Value {
        let loaded = self.loaded.as_ref();
        let old = loaded.map_or(Value::Null, |es| es["status"].clone());
        let mut status = match &old {
            Value::Object(_) => old.clone(),
            _ => json!({}),
        };
        if let Some(st) = state {
            let mut own = st.clone();
            let applied = std::mem::take(&mut own.applied_requests);
            status["allocator"] = serde_json::to_value(&own).expect("state serializes");
            status["appliedRemovals"] = json!(applied);
        }
        let allocator = &status["allocator"];
        let unack = (allocator["unacknowledged"].as_array().into_iter().flatten())
            .filter(|u| u["profile"].as_u64().unwrap_or(0) == 0)
            .count();
        status["target"] = allocator["target"].clone();
        status["unacknowledged"] = json!(unack);
        // Profile 0's pods are those of no other profile (a pod without the label is 0's).
        let others: Vec<String> = self.profiles.keys().map(u32::to_string).collect();
        status["selector"] = json!(match others.is_empty() {
            true => self.selector(),
            false => format!(
                "{},{LABEL_PROFILE} notin ({})",
                self.selector(),
                others.join(",")
            ),
        });
        if let Some(g) = self.generation {
            status["observedGeneration"] = json!(g);
        }
        if let Some(o) = &self.observed {
            let mine = o.profiles.get(&0).copied().unwrap_or(ProfileSummary {
                target: 0,
                running: o.running,
                pending: o.pending,
            });
            let blocked = self.blocked_with_template(o.blocked.as_ref());
            observed_counts(&mut status, &old, (mine, unack as u32), blocked.as_ref());
        } else if let Some(b) = self.blocked_with_template(None) {
            status["conditions"] = conditions(&old, true, Some(&b));
        }
        if status["appliedRemovals"]
            .as_array()
            .is_some_and(Vec::is_empty)
        {
            status.as_object_mut().map(|m| m.remove("appliedRemovals"));
        }
        match &self.mode {
            Mode::Loop(h) => status["holder"] = serde_json::to_value(h).expect("holder"),
            Mode::Once { .. } => {
                status.as_object_mut().map(|m| m.remove("holder"));
            }
            Mode::Read => {}
        }
        status
    }

    /// The label selector of every executor of the app.
    fn selector(&self) -> String {
        format!("{LABEL_APP}={},{LABEL_ROLE}={ROLE_EXECUTOR}", self.app_id)
    }

    /// The status of the object `es` of resource profile `p` >= 1: profile P's part of the
    /// state last saved (its target, its unacknowledged creates, the removals of its spec
    /// applied) and of what the tick saw; no allocator state (the home holds it).
    fn compose_profile(&self, p: u32, es: &Value) -> Value {
        let old = es["status"].clone();
        let mut status = match &old {
            Value::Object(m) => Value::Object(m.clone()),
            _ => json!({}),
        };
        status.as_object_mut().map(|m| m.remove("allocator"));
        let state = self.state.clone().unwrap_or_default();
        status["target"] = json!(state.profile_targets.get(&p));
        let unack = (state.unacknowledged.iter())
            .filter(|u| u.profile == p)
            .count() as u32;
        status["unacknowledged"] = json!(unack);
        status["selector"] = json!(format!("{},{LABEL_PROFILE}={p}", self.selector()));
        status["observedGeneration"] = es["metadata"]["generation"].clone();
        let requests: Vec<String> = (removals(es, "").into_iter()).map(|r| r.id).collect();
        let applied: Vec<&String> = (state.applied_requests.iter())
            .filter(|id| requests.contains(id))
            .collect();
        status["appliedRemovals"] = json!(applied);
        if applied.is_empty() {
            status.as_object_mut().map(|m| m.remove("appliedRemovals"));
        }
        if let Some(o) = &self.observed {
            let mine = o.profiles.get(&p).copied().unwrap_or_default();
            observed_counts(&mut status, &old, (mine, unack), o.blocked.as_ref());
        }
        status
    }

    /// Writes `status` on the object `slot` holds with `PUT …/status` on its version (see
    /// the module doc for a 409), and keeps the object as stored in `slot`. Nothing is
    /// written when it equals the stored status, or when there is no object. Errors: as
    /// `save`.
    fn put_status(&self, slot: &mut Option<Value>, mut status: Value) -> Result<(), StoreError> {
        without_nulls(&mut status);
        for _ in 0..RETRIES {
            let Some(base) = slot.clone() else {
                return Ok(());
            };
            if base["status"] == status {
                return Ok(());
            }
            let name = base["metadata"]["name"].as_str().unwrap_or(&self.name);
            let mut es = base.clone();
            es["status"] = status.clone();
            match self.sets.replace_status(name, &es) {
                Ok(stored) => {
                    *slot = Some(stored);
                    return Ok(());
                }
                Err(e) if e.status_code() == Some(409) => {
                    let now = self.sets.get(name).map_err(|e| self.backend(e))?;
                    let now = now.ok_or_else(|| self.conflict())?;
                    if now["status"] == status {
                        log::info!(
                            "{}: the status write answered 409 had already been applied (a \
                             retried request); counted as saved",
                            self.what_of(name)
                        );
                        *slot = Some(now);
                        return Ok(());
                    }
                    // A ping written meanwhile (a standby asking whether we live) is no
                    // rival: made again on the new version, the ping kept.
                    let without_ping = |s: &Value| {
                        let mut s = s.clone();
                        s.as_object_mut().map(|m| m.remove("ping"));
                        s
                    };
                    if without_ping(&now["status"]) != without_ping(&base["status"]) {
                        return Err(self.conflict());
                    }
                    match now["status"].get("ping") {
                        Some(p) => status["ping"] = p.clone(),
                        None => {
                            status.as_object_mut().map(|m| m.remove("ping"));
                        }
                    }
                    *slot = Some(now);
                }
                Err(e) => return Err(self.backend(e)),
            }
        }
        Err(self.conflict())
    }

    /// Writes the home's `status` (see [`Self::put_status`]).
    fn put_home(&mut self, status: Value) -> Result<(), StoreError> {
        let mut slot = self.loaded.take();
        let done = self.put_status(&mut slot, status);
        self.loaded = slot;
        done
    }

    /// Writes the status of each other profile's object (see [`Self::put_status`]).
    fn put_profiles(&mut self) -> Result<(), StoreError> {
        for p in self.profiles.keys().copied().collect::<Vec<_>>() {
            let status = self.compose_profile(p, &self.profiles[&p]);
            let mut slot = self.profiles.remove(&p);
            let done = self.put_status(&mut slot, status);
            self.profiles.extend(slot.map(|es| (p, es)));
            done?;
        }
        Ok(())
    }

    /// The clamped target of the loaded spec of profile `p`'s object (0: the home), logged
    /// (and an Event posted) when the clamp changes it, once per change. `None`: no object
    /// or no `spec.replicas`.
    fn clamped(&mut self, p: u32) -> Option<u32> {
        let es = match p {
            0 => self.loaded.as_ref()?,
            p => self.profiles.get(&p)?,
        };
        let name = es["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let spec = &es["spec"];
        let replicas = spec["replicas"].as_u64()?;
        let min = spec["minReplicas"].as_u64().unwrap_or(0);
        let max = spec["maxReplicas"].as_u64().unwrap_or(u64::MAX).max(min);
        let limit = u64::from(crate::engine::alloc::MAX_TARGET);
        let t = replicas.clamp(min, max).min(limit) as u32;
        let said = (replicas, min, max, t);
        if u64::from(t) != replicas && self.clamp_said.get(&p) != Some(&said) {
            let why = format!(
                "{}: spec.replicas {replicas} is outside [{min}, {}]: following {t}",
                self.what_of(&name),
                match spec["maxReplicas"].as_u64() {
                    Some(m) => m.to_string(),
                    None => limit.to_string(),
                }
            );
            log::warn!("{why}");
            let uid = es["metadata"]["uid"].as_str().unwrap_or("").to_string();
            self.event("TargetClamped", &why, (&name, &uid));
        }
        self.clamp_said.insert(p, said);
        Some(t)
    }

    /// Posts a Warning Event about ExecutorSet (`name`, `uid`) (never fails the tick: a
    /// failure is logged).
    fn event(&self, reason: &str, message: &str, (name, uid): (&str, &str)) {
        let Some(events) = &self.events else {
            return;
        };
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let ns = self.sets.namespace();
        let ev = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": format!("{name}."), "namespace": ns},
            "involvedObject": {
                "apiVersion": API_VERSION, "kind": "ExecutorSet", "namespace": ns,
                "name": name, "uid": uid,
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "podalloc"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "podalloc",
            "reportingInstance": "",
        });
        if let Err(e) = events.create(&ev, &PostParams::default()) {
            log::debug!(
                "event {reason} about {} not posted: {e}",
                self.what_of(name)
            );
        }
    }
}

impl ExecutorSetStore<'_> {
    /// The executor pod template `spec.template` of `es`, when present. One that cannot be
    /// used is reported once per change (one `WARN` line, a Warning Event
    /// `TemplateRefused`, the home's `Blocked` condition) and the last usable one of that
    /// object is followed instead. Errors: an unusable one and none usable before
    /// ([`StoreError::Backend`], exit 1: the loop backs off and goes on, creating nothing,
    /// until it is fixed).
    fn template_of(&self, es: &Value) -> Result<Option<PodTemplate>, StoreError> {
        let p = profile_of(es);
        let t = &es["spec"]["template"];
        if t.is_null() {
            self.good_templates.borrow_mut().remove(&p);
            self.refused_templates.borrow_mut().remove(&p);
            return Ok(None);
        }
        let mut pod = t.clone();
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        let name = es["metadata"]["name"].as_str().unwrap_or_default();
        let why = match PodTemplate::from_value(pod, None) {
            Ok(good) => {
                self.good_templates.borrow_mut().insert(p, good.clone());
                self.refused_templates.borrow_mut().remove(&p);
                return Ok(Some(good));
            }
            Err(e) => format!("{}: spec.template: {}", self.what_of(name), e.0),
        };
        let kept = self.good_templates.borrow().get(&p).cloned();
        let what = match kept {
            Some(_) => "the last usable template is followed until it is fixed",
            None => "no executor is created until it is fixed",
        };
        let message = format!("{why}; {what}");
        self.report_template(es, (p, t), &message);
        kept.map(Some)
            .ok_or_else(|| StoreError::Backend(format!("{message} (the loop goes on)")))
    }

    /// Reports unusable template `t` of profile `p`'s object `es` once per change: a `WARN`
    /// line, a Warning Event `TemplateRefused`, and, with no usable template to follow, the
    /// home's `Blocked` condition written at once (the tick that fails does not publish).
    fn report_template(&self, es: &Value, (p, t): (u32, &Value), message: &str) {
        let said = self
            .refused_templates
            .borrow()
            .get(&p)
            .map(|(v, _)| v.clone());
        if said.as_ref() == Some(t) {
            return;
        }
        (self.refused_templates.borrow_mut()).insert(p, (t.clone(), message.to_string()));
        log::warn!("{message}");
        let meta = &es["metadata"];
        let name = meta["name"].as_str().unwrap_or_default();
        let uid = meta["uid"].as_str().unwrap_or_default();
        self.event("TemplateRefused", message, (name, uid));
        if p == 0 && self.good_templates.borrow().get(&0).is_none() {
            let mut slot = self.loaded.clone();
            if let Err(e) = self.put_status(&mut slot, self.compose(None)) {
                log::debug!("{}: the Blocked condition not written: {e}", self.what());
            }
        }
    }

    /// The `Blocked` condition a refused template of the home sets, else `blocked`.
    fn blocked_with_template(
        &self,
        blocked: Option<&(String, String)>,
    ) -> Option<(String, String)> {
        let refused = self.refused_templates.borrow();
        match refused.get(&0) {
            Some((_, message)) => Some(("TemplateRefused".to_string(), message.clone())),
            None => blocked.cloned(),
        }
    }

    /// Creates the home, or a profile's object, again as `last` (its last read) had it,
    /// after it was deleted under this store, which had loaded or saved `prev`: same name,
    /// labels, annotations and spec (a profile's `spec.template` too: the Spark plugin never
    /// sends it again), less the removals `prev` applied. Logged and posted as a Warning
    /// Event `Recreated`; one created meanwhile by someone else is read instead. Errors: as
    /// [`Self::create`].
    fn recreate(&self, last: &Value, prev: &AllocatorState) -> Result<Value, StoreError> {
        let profile = profile_of(last);
        let name = match profile {
            0 => self.name.clone(),
            _ => last["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        };
        let mut spec = last["spec"].clone();
        if let Some(list) = spec["removals"].as_array_mut() {
            list.retain(|r| !(prev.applied_requests.iter()).any(|a| r["request"] == a.as_str()));
        }
        let meta = &last["metadata"];
        let mut es = json!({
            "apiVersion": API_VERSION,
            "kind": "ExecutorSet",
            "metadata": {"name": name, "labels": meta["labels"],
                         "annotations": meta["annotations"]},
            "spec": spec,
        });
        without_nulls(&mut es);
        let created = match self.sets.create(&es, &PostParams::default()) {
            Ok(c) => c.object,
            Err(e) if e.is_already_exists() && profile == 0 => {
                return self.read()?.ok_or_else(|| self.conflict())
            }
            Err(e) if e.is_already_exists() => return self.taken(&name, profile),
            Err(e) => return Err(self.backend(e)),
        };
        let replicas = (es["spec"]["replicas"].as_u64())
            .map_or_else(|| "unset".to_string(), |n| n.to_string());
        let why = match profile {
            0 => format!(
                "{} was deleted under its running controller: recreated from its last known \
                 spec (spec.replicas {replicas}) with the controller's last state (executor \
                 ids above {} only); to stop the app, scale it to 0 or stop the controller",
                self.what(),
                prev.highest_id()
            ),
            p => format!(
                "{} (resource profile {p}) was deleted under its running controller: \
                 recreated from its last known spec (spec.replicas {replicas}, {}); to stop \
                 this shape, scale it to 0",
                self.what_of(&name),
                match es["spec"]["template"].is_null() {
                    true => "no spec.template",
                    false => "its spec.template",
                }
            ),
        };
        log::warn!("{why}");
        let uid = created["metadata"]["uid"].as_str().unwrap_or_default();
        self.event("Recreated", &why, (&name, uid));
        Ok(created)
    }

    /// The object `name` created meanwhile by someone else, read; it must be profile
    /// `profile`'s of this app. Errors: the API's; another app's or profile's (exit 2).
    fn taken(&self, name: &str, profile: u32) -> Result<Value, StoreError> {
        let what = self.what_of(name);
        let es = self.sets.get(name).map_err(|e| self.backend(e))?;
        let es = es.ok_or_else(|| self.conflict())?;
        check_app(&es, &self.app_id, &what)?;
        if profile_of(&es) != profile {
            return Err(StoreError::Mismatch(format!(
                "{what} keeps resource profile {}, not {profile}: this command did nothing \
                 (exit 2)",
                profile_of(&es)
            )));
        }
        Ok(es)
    }

    /// The state to go on with when the loaded home has no `status.allocator` though this
    /// store loaded or saved `prev` (the home `recreated`, or its status wiped): `prev`
    /// itself, written back into the status at once (the id counter never goes back, no id
    /// is handed out twice); a wiped status is logged and posted as a Warning Event
    /// `StateRestored`. `None` without `prev`. Errors: as `save`'s status write.
    fn restore(
        &mut self,
        prev: Option<AllocatorState>,
        recreated: bool,
    ) -> Result<Option<AllocatorState>, StoreError> {
        let Some(prev) = prev else {
            return Ok(None);
        };
        if !recreated {
            let why = format!(
                "{}: status.allocator is gone (the status was wiped): restored from the \
                 controller's last state (executor ids above {} only)",
                self.what(),
                prev.highest_id()
            );
            log::warn!("{why}");
            let uid = (self.loaded.as_ref())
                .and_then(|es| es["metadata"]["uid"].as_str())
                .unwrap_or_default()
                .to_string();
            self.event("StateRestored", &why, (&self.name, &uid));
        }
        let status = self.compose(Some(&prev));
        self.put_home(status)?;
        self.state = Some(prev.clone());
        Ok(Some(prev))
    }

    /// The removals of the ExecutorSet not yet applied, oldest first, for `status` and
    /// `--wait`. Errors: as `load`.
    pub(crate) fn queued(mut self) -> Result<Vec<Steering>, StoreError> {
        let state = self.load()?.unwrap_or_default();
        let all = self.requests()?;
        Ok((all.into_iter())
            .filter(|r| !state.applied_requests.contains(&r.id))
            .collect())
    }
}

/// Whether ExecutorSet `a` is older than `b`: by `metadata.creationTimestamp` (RFC 3339 in
/// UTC, compared as text; a missing one counts as newest), then by name.
fn older(a: &Value, b: &Value) -> bool {
    let key = |es: &Value| {
        let m = &es["metadata"];
        let at = m["creationTimestamp"].as_str().unwrap_or("~").to_string();
        (at, m["name"].as_str().unwrap_or_default().to_string())
    };
    key(a) < key(b)
}

/// The resource profile an ExecutorSet keeps (`spec.resourceProfile`; absent: 0).
fn profile_of(es: &Value) -> u32 {
    es["spec"]["resourceProfile"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or(0)
}

/// Sets what a tick saw of one profile in `status` (whose `target` is set): `replicas`
/// and `readyReplicas` (running: Spark counts a running executor as registered),
/// `pending`, and the conditions, `Progressing` from the counts `(seen, unacknowledged)`
/// and `Blocked` (the app's) keeping `old`'s transition times.
fn observed_counts(
    status: &mut Value,
    old: &Value,
    (seen, unack): (ProfileSummary, u32),
    blocked: Option<&(String, String)>,
) {
    status["replicas"] = json!(seen.running);
    status["readyReplicas"] = json!(seen.running);
    status["pending"] = json!(seen.pending);
    let target = status["target"].as_u64().unwrap_or(0);
    let known = u64::from(seen.running) + u64::from(seen.pending) + u64::from(unack);
    status["conditions"] = conditions(old, known != target, blocked);
}

/// Removes every `null` member of `v`'s objects, at any depth: kube-apiserver prunes a null
/// field the schema does not declare nullable, so a status sent with one would never equal
/// the stored one (a write at every tick, and a lost answer not recognised as our write).
fn without_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(without_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(without_nulls),
        _ => {}
    }
}

/// Errors with [`StoreError::Mismatch`] (exit 2, naming both apps) when ExecutorSet `es`
/// belongs to another app than `app_id` (`spec.appId`).
fn check_app(es: &Value, app_id: &str, what: &str) -> Result<(), StoreError> {
    match es["spec"]["appId"].as_str() {
        Some(a) if a == app_id => Ok(()),
        Some(a) => Err(StoreError::Mismatch(format!(
            "{what} belongs to app {a:?} (spec.appId), not {app_id:?}; this command did \
             nothing (exit 2): choose another name for --state-store executorset:NAME"
        ))),
        None => Err(StoreError::Mismatch(format!(
            "{what} has no spec.appId (it must name app {app_id:?}); this command did nothing \
             (exit 2)"
        ))),
    }
}

/// The conditions `Progressing` and `Blocked` (`metav1.Condition`), each keeping the
/// `lastTransitionTime` of `old`'s when its status did not change.
fn conditions(old: &Value, progressing: bool, blocked: Option<&(String, String)>) -> Value {
    let word = |b: bool| if b { "True" } else { "False" };
    let (reason, message) = match blocked {
        Some((r, m)) => (r.clone(), m.clone()),
        None => ("NotBlocked".to_string(), String::new()),
    };
    let (p_reason, p_message) = match progressing {
        true => (
            "Scaling",
            "running + pending + unacknowledged differ from the target",
        ),
        false => (
            "AtTarget",
            "running + pending + unacknowledged equal the target",
        ),
    };
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let one = |kind: &str, status: &str, reason: &str, message: &str| {
        let prior = (old["conditions"].as_array().into_iter().flatten())
            .find(|c| c["type"] == kind && c["status"] == status);
        let at = prior.map_or(json!(now), |c| c["lastTransitionTime"].clone());
        json!({"type": kind, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": at})
    };
    json!([
        one("Progressing", word(progressing), p_reason, p_message),
        one("Blocked", word(blocked.is_some()), &reason, &message),
    ])
}

/// The `Blocked` condition's reason (kebab-case tag → CamelCase) and message of `b`; a quota
/// back-off's message leaves out its time left, which changes every tick.
fn blocked_condition(b: &Blocked) -> (String, String) {
    let tag = serde_json::to_value(b).expect("blocked serializes")["reason"]
        .as_str()
        .unwrap_or("blocked")
        .to_string();
    let reason: String = (tag.split('-'))
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    let message = match b {
        Blocked::Backoff { message, .. } => {
            format!("creation backs off after a quota rejection: {message}")
        }
        other => other.to_string(),
    };
    (reason, message)
}

/// The entries of `spec.removals` of `es`, in order, as `remove` requests, those already
/// applied included (the tick leaves out the ids the state lists, i.e.
/// `status.appliedRemovals`: dedupe on take); an id seen twice is taken once. Entries that
/// are not `{request, executors}` are skipped with a warning.
fn removals(es: &Value, what: &str) -> Vec<Steering> {
    let mut out: Vec<Steering> = Vec::new();
    for r in es["spec"]["removals"].as_array().into_iter().flatten() {
        let id = r["request"].as_str().unwrap_or_default();
        let ids: Option<Vec<u64>> =
            (r["executors"].as_array()).map(|a| a.iter().filter_map(Value::as_u64).collect());
        let Some(ids) = ids.filter(|_| !id.is_empty()) else {
            log::warn!("{what}: spec.removals entry {r} is not {{request, executors}}: ignored");
            continue;
        };
        if out.iter().any(|s| s.id == id) {
            continue;
        }
        out.push(Steering {
            id: id.to_string(),
            op: SteerOp::Remove {
                ids,
                evict: r["evict"].as_bool().unwrap_or(false),
            },
            submitted_ms: 0,
            by: format!("spec.removals of {what}"),
            profile: profile_of(es),
        });
    }
    out
}

/// The holder record, ping and pong of an ExecutorSet are fields of its status (`holder`,
/// `ping`, `pong`), written through `/status`.
impl Home for ExecutorSetStore<'_> {
    const FORBIDDEN_HINT: &'static str = "RBAC: grant the verb the server names in the Role bound \
        to podalloc's user; a controller needs executorsets get, list, create and \
        executorsets/status update: deploy/rbac.yaml";
    const NOT_FOUND_HINT: Option<&'static str> =
        Some("is the ExecutorSet CRD installed? kubectl apply -f deploy/crd.yaml");
    const WRITES: &'static str = "the status of ";
    const KEYS: [&'static str; 3] = ["holder", "ping", "pong"];

    fn encode<T: serde::Serialize>(v: &T) -> Value {
        serde_json::to_value(v).expect("JSON serializes")
    }

    fn seen(es: &Value) -> Seen {
        seen_of(es)
    }

    fn what(&self) -> String {
        self.what_of(&self.name)
    }

    fn mode(&self) -> &Mode {
        &self.mode
    }

    fn asker(&mut self) -> &mut Asker {
        &mut self.asker
    }

    /// Reads the object; `None` when it does not exist. Errors: the API's, or an object of
    /// another app ([`StoreError::Mismatch`], exit 2, naming both).
    fn read(&self) -> Result<Option<Value>, StoreError> {
        let es = self.sets.get(&self.name).map_err(|e| self.backend(e))?;
        if let Some(es) = &es {
            check_app(es, &self.app_id, &self.what())?;
        }
        Ok(es)
    }

    fn fields(es: &mut Value) -> &mut Value {
        &mut es["status"]
    }

    fn replace(&self, es: &Value) -> Result<Value, KubeError> {
        self.sets.replace_status(&self.name, es)
    }
}

impl StateStore for ExecutorSetStore<'_> {
    fn describe(&self) -> String {
        self.what()
    }

    /// Reads the home and the profiles' objects, and the state from the home's status. A
    /// home deleted, or its `status.allocator` wiped, under this store after it loaded or
    /// saved a state (a running loop) is recreated from its last known spec and given that
    /// state back ([`Self::recreate`], [`Self::restore`]), so the loop goes on at its target
    /// and its id counter never goes back; a profile's object deleted so is recreated from
    /// its last known spec, template included.
    fn load(&mut self) -> Result<Option<AllocatorState>, StoreError> {
        if let Some(st) = self.claimed.take() {
            return Ok(st);
        }
        let (es, mut profiles) = self.read_all()?;
        let prev = self.state.take();
        let last = self.loaded.take();
        let recreated = es.is_none() && last.is_some() && prev.is_some();
        let es = match (es, last, &prev) {
            (None, Some(last), Some(p)) => Some(self.recreate(&last, p)?),
            (es, _, _) => es,
        };
        // A profile's object deleted under a running loop: recreated at once from its last
        // read, as the home (it came back at the next save, without its template).
        let last_profiles = std::mem::take(&mut self.profiles);
        if let Some(p) = &prev {
            for (q, last) in last_profiles {
                if let std::collections::btree_map::Entry::Vacant(slot) = profiles.entry(q) {
                    slot.insert(self.recreate(&last, p)?);
                }
            }
        }
        self.generation = es
            .as_ref()
            .and_then(|e| e["metadata"]["generation"].as_i64());
        self.loaded = es;
        self.followed = marks(&profiles);
        self.profiles = profiles;
        if let Some(mut es) = self.loaded.clone() {
            let settled = liveness::settle(self, &mut es);
            self.loaded = Some(es);
            settled?;
        }
        let Some(es) = &self.loaded else {
            return Ok(None);
        };
        let allocator = &es["status"]["allocator"];
        if !allocator.is_object() {
            return self.restore(prev, recreated);
        }
        let bytes = serde_json::to_vec(allocator).expect("JSON serializes");
        let mut state = parse(&bytes).map_err(|why| {
            StoreError::Corrupt(
                std::path::PathBuf::from(format!("executorset:{}", self.name)),
                format!("status.allocator: {why}"),
            )
        })?;
        state.applied_requests = (es["status"]["appliedRemovals"].as_array().into_iter())
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        self.state = Some(state.clone());
        Ok(Some(state))
    }

    /// Writes the state into the home's status (creating the home first when missing),
    /// then creates the object of each profile the state gives a target and none has.
    fn save(&mut self, state: &AllocatorState) -> Result<(), StoreError> {
        if self.loaded.is_none() {
            let created = self.create(&self.name, 0, state.target)?;
            // Created meanwhile by another loop that holds it: not ours to write.
            if let Mode::Loop(mine) = &self.mode {
                let text = seen_of(&created).holder;
                if !matches!(
                    liveness::judge(text.as_deref(), Some(mine), ""),
                    Found::Ours | Found::Free(_)
                ) {
                    return Err(self.conflict());
                }
            }
            self.generation = created["metadata"]["generation"].as_i64();
            self.loaded = Some(created);
        }
        let status = self.compose(Some(state));
        self.put_home(status)?;
        self.state = Some(state.clone());
        self.create_profiles(state)
    }

    /// A loop's claim, before each tick: loads (the tick's load returns that), writing its
    /// holder record when it claims the home, answering a ping; another live holder:
    /// [`StoreError::Owned`] (the loop waits as a standby).
    fn claim(&mut self) -> Result<(), StoreError> {
        if !matches!(self.mode, Mode::Loop(_)) {
            return Ok(());
        }
        let st = self.load()?;
        self.claimed = Some(st);
        Ok(())
    }

    /// Removes the loop's own holder record (one conditional status write), so the next
    /// loop starts at once; nothing when the record is not ours.
    fn release(&mut self) -> Result<(), StoreError> {
        liveness::release(self)
    }

    /// The removals of the home's spec, then those of each other profile's object.
    fn requests(&mut self) -> Result<Vec<Steering>, StoreError> {
        let homes = self.loaded.iter().chain(self.profiles.values());
        let mut all: Vec<Steering> = Vec::new();
        for es in homes {
            let name = es["metadata"]["name"].as_str().unwrap_or_default();
            for r in removals(es, &self.what_of(name)) {
                if !all.iter().any(|a| a.id == r.id) {
                    all.push(Steering {
                        profile: profile_of(es),
                        ..r
                    });
                }
            }
        }
        Ok(all)
    }

    /// The ids of `spec.removals` stay in the spec until a `remove` prunes them: none is gone.
    fn consumed(&mut self, _ids: &[String]) -> Vec<String> {
        Vec::new()
    }

    fn home_target(&mut self) -> Option<u32> {
        self.clamped(0)
    }

    fn home_template(&self) -> Result<Option<PodTemplate>, StoreError> {
        self.loaded
            .as_ref()
            .map_or(Ok(None), |es| self.template_of(es))
    }

    /// Each other profile's object: its clamped `spec.replicas` and its `spec.template`.
    fn home_profiles(&mut self) -> Result<BTreeMap<u32, HomeProfile>, StoreError> {
        let mut out = BTreeMap::new();
        for p in self.profiles.keys().copied().collect::<Vec<_>>() {
            let target = self.clamped(p);
            let template = self.template_of(&self.profiles[&p])?;
            out.insert(p, HomeProfile { target, template });
        }
        Ok(out)
    }

    fn observe(&mut self, summary: &Summary, blocked: Option<&Blocked>) {
        self.observed = Some(Observed {
            running: summary.counts.running,
            pending: summary.counts.pending,
            blocked: blocked.map(blocked_condition),
            profiles: summary.profiles.clone(),
        });
    }

    /// Writes what the tick saw into the home's status and each other profile's.
    fn publish(&mut self) -> Result<(), StoreError> {
        if self.loaded.is_none() || self.observed.is_none() {
            return Ok(());
        }
        let status = self.compose(None);
        self.put_home(status)?;
        self.put_profiles()
    }

    /// One list (and a get of a home without the label): whether the home or any other
    /// profile's object appeared, went or changed its `metadata.generation`. A loop answers
    /// a ping on its home here (one conditional status write), which wakes nothing; a holder
    /// record not its own wakes it (the tick's claim finds out).
    fn intent_changed(&mut self) -> Result<bool, StoreError> {
        let (mut es, profiles) = self.read_all()?;
        if let (Some(e), Mode::Loop(mine)) = (&es, &self.mode) {
            let seen = seen_of(e);
            match liveness::judge(seen.holder.as_deref(), Some(mine), "") {
                Found::Ours => {
                    if let Some(stored) = liveness::answer(self, e, &seen)? {
                        let same = stored["metadata"]["generation"].as_i64() == self.generation;
                        if same && self.loaded.is_some() {
                            self.loaded = Some(stored.clone());
                        }
                        es = Some(stored);
                    }
                }
                _ => return Ok(true),
            }
        }
        let generation = |e: &Value| e["metadata"]["generation"].as_i64();
        // A status whose allocator state was wiped (kubectl patch --subresource=status)
        // does not bump the generation: tick at once, so the state is restored within an
        // interval, not at the next idle tick (a kill in between lost the ids of executors
        // already gone, and a successor handed them out again; the attack on issue 28).
        let wiped = |e: &Value| e["status"]["allocator"].is_null();
        let was_kept = (self.loaded.as_ref()).is_some_and(|e| !wiped(e));
        Ok(es.is_some() != self.loaded.is_some()
            || es.as_ref().and_then(generation) != self.generation
            || marks(&profiles) != self.followed
            || (was_kept && es.as_ref().is_some_and(wiped)))
    }
}

/// Each profile object's (profile, `metadata.generation`, `metadata.uid`).
fn marks(m: &BTreeMap<u32, Value>) -> Vec<(u32, Option<i64>, Value)> {
    (m.iter())
        .map(|(&p, e)| {
            let meta = &e["metadata"];
            (p, meta["generation"].as_i64(), meta["uid"].clone())
        })
        .collect()
}

/// What home `es` carries about its holder: `status.holder` (as JSON text), `status.ping`,
/// `status.pong`.
fn seen_of(es: &Value) -> Seen {
    let status = &es["status"];
    Seen {
        holder: (status["holder"].is_object()).then(|| status["holder"].to_string()),
        ping: serde_json::from_value(status["ping"].clone()).ok(),
        pong: status["pong"].as_str().map(str::to_string),
    }
}

/// The holder record of ExecutorSet `es` when it looks live (not asked: not of a process
/// gone from this host), for `status` and the search for the app's home.
pub(crate) fn holder_of(es: &Value) -> Option<Holder> {
    liveness::looks_live(seen_of(es).holder.as_deref(), "ExecutorSet")
}

/// The loop that owns app `app_id` through ExecutorSet `name` now ([`holder_of`]); `None`
/// when it is missing or holds no live-looking record. Errors: the read's.
pub(crate) fn holder(
    client: &KubeClient,
    name: &str,
    app_id: &str,
) -> Result<Option<Holder>, StoreError> {
    let store = ExecutorSetStore::new(client, name, app_id, false);
    Ok(store.read()?.as_ref().and_then(holder_of))
}

/// Hands steering request `req` to the controller of app `app_id` through ExecutorSet
/// `name` of the client's namespace (`docs/executorset.md`): `scale N` sets `spec.replicas`,
/// `add N` raises it, `remove ID…` appends `{request, executors}` to `spec.removals` and
/// lowers `spec.replicas` by the number of ids, pruning the entries `status.appliedRemovals`
/// lists (`lowering`: the ids that lower it, those of the executors that count by the step's
/// rule 6, [`removal_lowers`]; `None`: every id, each once). One `PUT` conditional on the
/// version read, with the request id in annotations
/// [`REQUEST_KEY`] and [`REQUESTS_KEY`]; after a 409 it reads again and is done when the
/// object already carries the id (its write landed, the answer was lost: found among the
/// recent ids even when later requests landed after it, so it is never applied twice nor
/// over a newer one), else applies itself to the new version.
/// Returns the object's `metadata.generation` with the request in it (`--wait` waits until
/// `status.observedGeneration` reaches it: [`followed`]).
/// Errors: a missing ExecutorSet or one of another app (exit 2), the API's, a conflict after
/// [`RETRIES`] attempts.
pub fn submit(
    client: &KubeClient,
    name: &str,
    app_id: &str,
    req: &Steering,
    lowering: Option<&[u64]>,
) -> Result<i64, StoreError> {
    let store = ExecutorSetStore::new(client, name, app_id, false);
    let generation = |es: &Value| es["metadata"]["generation"].as_i64().unwrap_or(0);
    for _ in 0..RETRIES {
        let Some(mut es) = store.read()? else {
            return Err(StoreError::Mismatch(format!(
                "{} does not exist: start the controller with --state-store executorset:{name} \
                 --target N (it creates it), or kubectl apply one; this command did nothing",
                store.what()
            )));
        };
        if carries(&es, &req.id) {
            return Ok(generation(&es));
        }
        edit_spec(&mut es, req, lowering);
        match store.sets.replace(name, &es) {
            Ok(stored) => {
                warn_clamped(&store.what(), &stored["spec"]);
                return Ok(generation(&stored));
            }
            Err(e) if e.status_code() == Some(409) => {
                if let Some(now) = store.read()?.filter(|now| carries(now, &req.id)) {
                    return Ok(generation(&now));
                }
            }
            Err(e) => return Err(store.backend(e)),
        }
    }
    Err(StoreError::Conflict(format!(
        "{} changed at every attempt; the request was not made",
        store.what()
    )))
}

/// The name of the ExecutorSet that keeps resource profile `profile` of app `app_id`, whose
/// home (profile 0's) is ExecutorSet `name` of the client's namespace: `name` itself for
/// profile 0, else the object labelled `spark-app-selector=<app id>` with that
/// `spec.resourceProfile` (`docs/executorset.md`; of two, the older, with a warning).
/// Errors: none keeps it (exit 2), the API's.
pub fn profile_home(
    client: &KubeClient,
    name: &str,
    app_id: &str,
    profile: u32,
) -> Result<String, StoreError> {
    if profile == 0 {
        return Ok(name.to_string());
    }
    let store = ExecutorSetStore::new(client, name, app_id, false);
    let (_, profiles) = store.read_all()?;
    let Some(es) = profiles.get(&profile) else {
        return Err(StoreError::Mismatch(format!(
            "no ExecutorSet of namespace {} keeps resource profile {profile} of app \
             {app_id:?}: run its controller with --profile-target {profile}=N (it creates \
             {name}-rp{profile}), or kubectl apply one with spec.resourceProfile: {profile}, \
             spec.appId and label {LABEL_APP}={app_id}; this command did nothing",
            client.namespace()
        )));
    };
    Ok(es["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// Whether the controller of ExecutorSet `name` has followed its spec up to `generation`
/// (`status.observedGeneration`) and converged on the target it follows (`status.replicas`
/// = `status.target`, nothing pending or unacknowledged), for `--wait`. Errors: a missing
/// ExecutorSet or one of another app (exit 2), the API's.
pub fn followed(
    client: &KubeClient,
    name: &str,
    app_id: &str,
    generation: i64,
) -> Result<bool, StoreError> {
    let store = ExecutorSetStore::new(client, name, app_id, false);
    let Some(es) = store.read()? else {
        return Err(StoreError::Mismatch(format!(
            "{} does not exist",
            store.what()
        )));
    };
    let s = &es["status"];
    let seen = s["observedGeneration"].as_i64().unwrap_or(0) >= generation;
    let converged = s["target"].is_u64()
        && s["replicas"] == s["target"]
        && s["pending"] == 0
        && s["unacknowledged"] == 0;
    Ok(seen && converged)
}

/// Whether ExecutorSet `es` already carries request `id`: in its [`REQUESTS_KEY`] or
/// [`REQUEST_KEY`] annotation, in `spec.removals` or in `status.appliedRemovals`.
fn carries(es: &Value, id: &str) -> bool {
    let in_list = |v: &Value, key: Option<&str>| {
        (v.as_array().into_iter().flatten()).any(|e| match key {
            Some(k) => e[k] == id,
            None => e == id,
        })
    };
    es["metadata"]["annotations"][REQUEST_KEY] == id
        || recent_requests(es).iter().any(|r| r == id)
        || in_list(&es["spec"]["removals"], Some("request"))
        || in_list(&es["status"]["appliedRemovals"], None)
}

/// The request ids of annotation [`REQUESTS_KEY`] of `es`, oldest first (none when absent
/// or not a JSON array of strings: a hand-edited value is not trusted, and is replaced by
/// the next write).
fn recent_requests(es: &Value) -> Vec<String> {
    (es["metadata"]["annotations"][REQUESTS_KEY].as_str())
        .and_then(|text| serde_json::from_str::<Vec<String>>(text).ok())
        .unwrap_or_default()
}

/// `replicas` clamped by `spec`'s `minReplicas` and `maxReplicas`, as the controller follows
/// it.
/// After a steering command's write: one line when `spec.replicas` is outside
/// `spec.minReplicas`..`spec.maxReplicas` of ExecutorSet `what`, saying what its controller
/// follows instead (the controller says it too, with an Event, when it applies it).
fn warn_clamped(what: &str, spec: &Value) {
    let Some(replicas) = spec["replicas"].as_u64() else {
        return;
    };
    let followed = clamped_replicas(spec, replicas);
    if followed != replicas {
        let bound = |k: &str| {
            spec[k]
                .as_u64()
                .map_or("none".to_string(), |v| v.to_string())
        };
        log::warn!(
            "{what}: spec.replicas is {replicas}, outside spec.minReplicas {} and \
             spec.maxReplicas {}: its controller follows {followed} (change the bounds with \
             kubectl patch es to go further)",
            bound("minReplicas"),
            bound("maxReplicas")
        );
    }
}

/// The target ExecutorSet `name` (of app `app_id`) sets now: its `spec.replicas` clamped to
/// its bounds; `None` when it is missing or names none. Errors: the read's.
pub(crate) fn target_set(
    client: &KubeClient,
    name: &str,
    app_id: &str,
) -> Result<Option<u64>, StoreError> {
    let es = ExecutorSetStore::new(client, name, app_id, false).read()?;
    Ok(es.and_then(|es| {
        let n = es["spec"]["replicas"].as_u64()?;
        Some(clamped_replicas(&es["spec"], n))
    }))
}

fn clamped_replicas(spec: &Value, replicas: u64) -> u64 {
    let min = spec["minReplicas"].as_u64().unwrap_or(0);
    let max = spec["maxReplicas"].as_u64().unwrap_or(u64::MAX).max(min);
    replicas.clamp(min, max)
}

/// How many of executors `ids` a removal lowers the target by, and which, by the step's own
/// rule 6 (each id once; an executor that counts: running, pending, unknown or
/// unacknowledged, and not already being deleted or evicted): the step run on `snap` and
/// `state` with a target of [`crate::engine::alloc::MAX_TARGET`] for `profile`, whose
/// target it lowers once per such executor. Pure. Errors: the step's.
pub fn removal_lowers(
    snap: &crate::engine::snapshot::Snapshot,
    state: &AllocatorState,
    settings: &crate::engine::alloc::Settings,
    (ids, profile): (&[u64], u32),
    now_ms: u64,
) -> Result<Vec<u64>, crate::engine::alloc::StepError> {
    use crate::engine::alloc::{step, Request, MAX_TARGET};
    let mut st = state.clone();
    match profile {
        0 => st.target = Some(MAX_TARGET),
        p => {
            st.profile_targets.insert(p, MAX_TARGET);
        }
    }
    let mut out: Vec<u64> = Vec::new();
    let mut before = MAX_TARGET;
    for &id in ids {
        let req = Request {
            remove: out.iter().copied().chain([id]).collect(),
            ..Request::default()
        };
        let plan = step(snap, &st, settings, &req, now_ms)?;
        let after = match profile {
            0 => plan.state.target,
            p => plan.state.profile_targets.get(&p).copied(),
        };
        if after.unwrap_or(MAX_TARGET) < before {
            before = after.unwrap_or(MAX_TARGET);
            out.push(id);
        }
    }
    Ok(out)
}

/// Records request `id` in the annotations of `es`: [`REQUEST_KEY`] names it, and
/// [`REQUESTS_KEY`] gets it appended, keeping the newest [`REQUESTS_KEEP`].
fn record_request(es: &mut Value, id: &str) {
    let mut ids = recent_requests(es);
    ids.retain(|r| r != id);
    ids.push(id.to_string());
    let extra = ids.len().saturating_sub(REQUESTS_KEEP);
    ids.drain(..extra);
    if !es["metadata"]["annotations"].is_object() {
        es["metadata"]["annotations"] = json!({});
    }
    let annotations = &mut es["metadata"]["annotations"];
    annotations[REQUEST_KEY] = json!(id);
    annotations[REQUESTS_KEY] = json!(serde_json::to_string(&ids).expect("ids serialize"));
}

/// Applies request `req` to the `spec` of `es` (see [`submit`]) and records its id in the
/// [`REQUEST_KEY`] and [`REQUESTS_KEY`] annotations. Without `spec.replicas`, `add` and
/// `remove` start from `status.target` (else 0). A `remove` lowers the target followed (the
/// clamped `spec.replicas`, so a removal under `maxReplicas` is not replaced) by the ids of
/// `lowering` (`None`: all of them), each once, leaving out those a removal not yet applied
/// already names.
fn edit_spec(es: &mut Value, req: &Steering, lowering: Option<&[u64]>) {
    let current = (es["spec"]["replicas"].as_u64())
        .or_else(|| es["status"]["target"].as_u64())
        .unwrap_or(0);
    let limit = u64::from(crate::engine::alloc::MAX_TARGET);
    match &req.op {
        SteerOp::Scale { target } => es["spec"]["replicas"] = json!(target),
        SteerOp::Add { count } => {
            // From the target followed, as `remove` lowers it: with spec.replicas 10 and
            // maxReplicas 3, one more is 4, not 11.
            let followed = clamped_replicas(&es["spec"], current);
            es["spec"]["replicas"] = json!((followed + u64::from(*count)).min(limit));
        }
        SteerOp::Remove { ids, evict } => {
            let applied = es["status"]["appliedRemovals"].clone();
            let mut list: Vec<Value> = (es["spec"]["removals"].as_array().cloned())
                .unwrap_or_default()
                .into_iter()
                .filter(|r| !(applied.as_array().into_iter().flatten()).any(|a| *a == r["request"]))
                .collect();
            let named: Vec<u64> = (list.iter())
                .flat_map(|r| r["executors"].as_array().cloned().unwrap_or_default())
                .filter_map(|v| v.as_u64())
                .collect();
            let mut lowers: Vec<u64> = lowering.unwrap_or(ids).to_vec();
            lowers.sort_unstable();
            lowers.dedup();
            lowers.retain(|id| !named.contains(id));
            let mut entry = json!({"request": req.id, "executors": ids});
            if *evict {
                entry["evict"] = json!(true);
            }
            list.push(entry);
            let followed = clamped_replicas(&es["spec"], current);
            es["spec"]["removals"] = json!(list);
            es["spec"]["replicas"] = json!(followed.saturating_sub(lowers.len() as u64));
        }
    }
    record_request(es, &req.id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::testutil::{FakeServer, Recorded, Reply};
    use std::sync::{Arc, Mutex};

    /// A one-object ExecutorSet API (`etl` in namespace `ns`) keeping `resourceVersion` and
    /// `generation` as kube-apiserver does (a spec change bumps the generation, a status
    /// write does not; a write of another version is 409); `lose` status or spec writes are
    /// applied and then answered 503, so the client sends them again (409); `meddle`: the
    /// requests another writer lands between a lost spec answer and its retry.
    struct FakeEs {
        server: FakeServer,
        obj: Arc<Mutex<Option<Value>>>,
        lose: Arc<Mutex<(u32, u32)>>,
        meddle: Arc<Mutex<Vec<Steering>>>,
        client: KubeClient,
    }

    /// Gives object `o` the next `resourceVersion`, as the API server does at each write.
    fn next_version(o: &mut Value) {
        let rv: u64 = o["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        o["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
    }

    /// Another writer's write of `o`: request `req` applied, a new version and generation.
    fn meddle_with(o: &mut Value, req: &Steering) {
        edit_spec(o, req, None);
        next_version(o);
        let g = o["metadata"]["generation"].as_i64().unwrap();
        o["metadata"]["generation"] = json!(g + 1);
    }

    fn status(code: u16, reason: &str) -> Reply {
        let body = json!({"kind": "Status", "code": code, "reason": reason, "message": reason});
        Reply::json(code, &body.to_string())
    }

    type Faults<'a> = (&'a Mutex<(u32, u32)>, &'a Mutex<Vec<Steering>>);

    fn answer(obj: &Mutex<Option<Value>>, (lose, meddle): Faults<'_>, r: &Recorded) -> Reply {
        let mut obj = obj.lock().unwrap();
        let body: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let path = r.path();
        if path.contains("/events") {
            return Reply::json(201, &body.to_string());
        }
        let status_write = path.ends_with("/status");
        if r.method == "GET" && path.ends_with("/executorsets") {
            // A list by label: the object when it carries one.
            let labelled = (obj.iter()).filter(|o| o["metadata"]["labels"].is_object());
            let items: Vec<Value> = labelled.cloned().collect();
            return Reply::json(
                200,
                &json!({"kind": "ExecutorSetList", "items": items}).to_string(),
            );
        }
        match (r.method.as_str(), obj.as_mut()) {
            ("GET", None) => status(404, "NotFound"),
            ("GET", Some(o)) => Reply::json(200, &o.to_string()),
            ("POST", None) => {
                let mut o = body.clone();
                o["metadata"]["resourceVersion"] = json!("1");
                o["metadata"]["generation"] = json!(1);
                o["metadata"]["uid"] = json!("u-1");
                *obj = Some(o.clone());
                Reply::json(201, &o.to_string())
            }
            ("POST", Some(_)) => status(409, "AlreadyExists"),
            ("PUT", Some(o))
                if o["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"] =>
            {
                status(409, "Conflict")
            }
            ("PUT", Some(o)) => {
                next_version(o);
                if status_write {
                    o["status"] = body["status"].clone();
                } else {
                    if o["spec"] != body["spec"] {
                        let g = o["metadata"]["generation"].as_i64().unwrap();
                        o["metadata"]["generation"] = json!(g + 1);
                    }
                    o["spec"] = body["spec"].clone();
                    o["metadata"]["annotations"] = body["metadata"]["annotations"].clone();
                }
                let mut lose = lose.lock().unwrap();
                let left = if status_write {
                    &mut lose.0
                } else {
                    &mut lose.1
                };
                if *left > 0 {
                    *left -= 1;
                    if !status_write {
                        for other in meddle.lock().unwrap().drain(..) {
                            meddle_with(o, &other);
                        }
                    }
                    return status(503, "ServiceUnavailable");
                }
                Reply::json(200, &o.to_string())
            }
            _ => status(404, "NotFound"),
        }
    }

    impl FakeEs {
        fn new() -> FakeEs {
            let obj = Arc::new(Mutex::new(None::<Value>));
            let lose = Arc::new(Mutex::new((0, 0)));
            let meddle = Arc::new(Mutex::new(Vec::new()));
            let (o, l, m) = (Arc::clone(&obj), Arc::clone(&lose), Arc::clone(&meddle));
            let server = FakeServer::http(move |r, _| answer(&o, (&l, &m), r));
            let retry = crate::kube::RetryPolicy {
                base_delay: std::time::Duration::from_millis(1),
                ..Default::default()
            };
            let client = server.client("ns", retry);
            FakeEs {
                server,
                obj,
                lose,
                meddle,
                client,
            }
        }

        fn obj(&self) -> Value {
            self.obj.lock().unwrap().clone().unwrap()
        }

        /// The requests made so far by method and whether they went to `/status`.
        fn writes(&self, status_only: bool) -> usize {
            (self.server.recorded().iter())
                .filter(|r| r.method == "PUT" && r.path().ends_with("/status") == status_only)
                .count()
        }
    }

    #[test]
    fn a_tick_creates_it_seeded_and_a_restart_changes_nothing() {
        let f = FakeEs::new();
        let mut store = ExecutorSetStore::new(&f.client, "etl", "app", false);
        assert_eq!(store.load().unwrap(), None);
        assert_eq!(store.home_target(), None);
        let mut st = AllocatorState::new();
        st.target = Some(4);
        store.save(&st).unwrap();
        let o = f.obj();
        assert_eq!(o["spec"], json!({"appId": "app", "replicas": 4}));
        assert_eq!(o["metadata"]["labels"][LABEL_APP], "app");
        assert_eq!(o["status"]["target"], 4);
        assert_eq!(
            o["status"]["selector"],
            "spark-app-selector=app,spark-role=executor"
        );
        assert_eq!(o["status"]["observedGeneration"], 1);
        assert!(!o.to_string().contains("null"), "no null is sent: {o}");
        // Another process: the spec is the target, whatever its own seed; nothing written.
        let mut again = ExecutorSetStore::new(&f.client, "etl", "app", false);
        assert_eq!(again.load().unwrap(), Some(st.clone()));
        assert_eq!(again.home_target(), Some(4));
        let before = f.server.recorded().len();
        again.save(&st).unwrap();
        for _ in 0..2 {
            let summary = Summary {
                target: 4,
                ..Summary::default()
            };
            again.observe(&summary, None);
            again.publish().unwrap();
        }
        let puts = (f.server.recorded()[before..].iter())
            .filter(|r| r.method == "PUT")
            .count();
        assert_eq!(puts, 1, "the observation once, then nothing at rest");
        assert!(!again.intent_changed().unwrap());
    }

    /// A store that loaded a new home and saved a state of target 3 there, and that state.
    fn saved_at_3(f: &FakeEs) -> (ExecutorSetStore<'_>, AllocatorState) {
        let mut store = ExecutorSetStore::new(&f.client, "etl", "app", false);
        store.load().unwrap();
        let mut st = AllocatorState::new();
        st.target = Some(3);
        store.save(&st).unwrap();
        (store, st)
    }

    #[test]
    fn a_removal_is_applied_once_when_its_status_write_is_retried() {
        let f = FakeEs::new();
        let (mut store, _) = saved_at_3(&f);
        let rm = req(
            "r1",
            SteerOp::Remove {
                ids: vec![2],
                evict: false,
            },
        );
        let generation = submit(&f.client, "etl", "app", &rm, None).unwrap();
        assert_eq!(generation, 2);
        assert!(
            store.intent_changed().unwrap(),
            "a spec change is seen by one GET"
        );
        let loaded = store.load().unwrap().unwrap();
        assert_eq!(store.home_target(), Some(2), "remove lowered spec.replicas");
        let queued = store.requests().unwrap();
        assert_eq!(
            queued,
            vec![Steering {
                by: queued[0].by.clone(),
                ..rm.clone()
            }]
        );
        // The tick's write-ahead save records it; the answer is lost, the retry gets 409.
        f.lose.lock().unwrap().0 = 1;
        let before = f.writes(true);
        let mut next = loaded.clone();
        next.target = Some(2);
        next.applied_requests = vec!["r1".into()];
        store.save(&next).unwrap();
        assert_eq!(f.writes(true) - before, 2, "one write, sent twice");
        assert_eq!(f.obj()["status"]["appliedRemovals"], json!(["r1"]));
        // A fresh load lists it as applied: the tick leaves it out.
        let mut other = ExecutorSetStore::new(&f.client, "etl", "app", false);
        assert_eq!(
            other.load().unwrap().unwrap().applied_requests,
            vec!["r1".to_string()]
        );
        assert!(ExecutorSetStore::new(&f.client, "etl", "app", false)
            .queued()
            .unwrap()
            .is_empty());
        // A later remove prunes it from the spec in its own write.
        submit(
            &f.client,
            "etl",
            "app",
            &req(
                "r2",
                SteerOp::Remove {
                    ids: vec![3],
                    evict: false,
                },
            ),
            None,
        )
        .unwrap();
        assert_eq!(
            f.obj()["spec"]["removals"],
            json!([{"request": "r2", "executors": [3]}])
        );
        assert_eq!(f.obj()["spec"]["replicas"], 1);
    }

    #[test]
    fn an_add_whose_answer_is_lost_is_applied_once() {
        let f = FakeEs::new();
        saved_at_3(&f);
        f.lose.lock().unwrap().1 = 1;
        submit(
            &f.client,
            "etl",
            "app",
            &req("a1", SteerOp::Add { count: 2 }),
            None,
        )
        .unwrap();
        assert_eq!(f.writes(false), 2, "sent twice: the retry met 409");
        assert_eq!(f.obj()["spec"]["replicas"], 5);
        assert_eq!(f.obj()["metadata"]["annotations"][REQUEST_KEY], "a1");
    }

    /// A store at target 3 whose next spec write's answer is lost, `other` landing before
    /// the retry.
    fn lost_then(other: Steering) -> FakeEs {
        let f = FakeEs::new();
        saved_at_3(&f);
        f.lose.lock().unwrap().1 = 1;
        f.meddle.lock().unwrap().push(other);
        f
    }

    #[test]
    fn a_lost_add_is_applied_once_when_another_add_lands_before_its_retry() {
        let f = lost_then(req("b10", SteerOp::Add { count: 10 }));
        let a1 = req("a1", SteerOp::Add { count: 1 });
        submit(&f.client, "etl", "app", &a1, None).unwrap();
        assert_eq!(f.writes(false), 2, "sent twice: the retry met 409");
        assert_eq!(f.obj()["spec"]["replicas"], 14, "3 + 1 + 10: {}", f.obj());
        assert_eq!(recent_requests(&f.obj()), ["a1", "b10"]);
    }

    #[test]
    fn a_lost_scale_is_not_applied_again_over_a_later_scale() {
        let f = lost_then(req("s8", SteerOp::Scale { target: 8 }));
        let s5 = req("s5", SteerOp::Scale { target: 5 });
        submit(&f.client, "etl", "app", &s5, None).unwrap();
        assert_eq!(f.obj()["spec"]["replicas"], 8, "{}", f.obj());
        assert_eq!(f.obj()["metadata"]["annotations"][REQUEST_KEY], "s8");
    }

    #[test]
    fn the_recent_request_ids_are_bounded_and_a_bad_list_is_replaced() {
        let mut e = es(json!({"appId": "a", "replicas": 1}), json!({}));
        e["metadata"]["annotations"] = json!({REQUESTS_KEY: "not json", "team": "x"});
        assert!(recent_requests(&e).is_empty());
        for i in 0..40 {
            edit_spec(
                &mut e,
                &req(&format!("r{i}"), SteerOp::Add { count: 1 }),
                None,
            );
        }
        let ids = recent_requests(&e);
        assert_eq!(ids.len(), REQUESTS_KEEP);
        assert_eq!((ids[0].as_str(), ids[31].as_str()), ("r8", "r39"));
        assert!(carries(&e, "r8") && !carries(&e, "r7"));
        assert_eq!(
            e["metadata"]["annotations"]["team"], "x",
            "people's annotations kept"
        );
        assert_eq!(e["spec"]["replicas"], 41);
    }

    /// The reasons of the Events posted so far.
    fn event_reasons(f: &FakeEs) -> Vec<String> {
        (f.server.recorded().iter())
            .filter(|r| r.path().contains("/events"))
            .map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["reason"].to_string())
            .collect()
    }

    /// A store that saved a state at target 3 with ids up to 7 handed out and removal r1
    /// applied (its spec: replicas 3, removals r1 and r2, an annotation of people's).
    fn saved_at_7(f: &FakeEs) -> (ExecutorSetStore<'_>, AllocatorState) {
        let mut store = ExecutorSetStore::new(&f.client, "etl", "app", true);
        store.load().unwrap();
        let mut st = AllocatorState::new();
        st.target = Some(3);
        st.last_executor_id = 7;
        st.applied_requests = vec!["r1".into()];
        store.save(&st).unwrap();
        let mut o = f.obj();
        o["metadata"]["annotations"] = json!({"team": "etl"});
        o["spec"]["removals"] = json!([{"request": "r1", "executors": [2]},
                                       {"request": "r2", "executors": [5]}]);
        *f.obj.lock().unwrap() = Some(o);
        assert_eq!(store.load().unwrap(), Some(st.clone()));
        (store, st)
    }

    #[test]
    fn a_home_deleted_under_a_loop_is_recreated_with_its_last_state() {
        let f = FakeEs::new();
        let (mut store, st) = saved_at_7(&f);
        *f.obj.lock().unwrap() = None;
        assert!(store.intent_changed().unwrap());
        assert_eq!(
            store.load().unwrap(),
            Some(st),
            "the loop goes on: no 'no target'"
        );
        let o = f.obj();
        assert_eq!(o["spec"]["replicas"], 3);
        assert_eq!(o["metadata"]["labels"][LABEL_APP], "app");
        assert_eq!(o["metadata"]["annotations"]["team"], "etl");
        assert_eq!(
            o["spec"]["removals"],
            json!([{"request": "r2", "executors": [5]}]),
            "the applied removal is not brought back"
        );
        assert_eq!(o["status"]["allocator"]["last_executor_id"], 7);
        assert_eq!(store.home_target(), Some(3));
        assert_eq!(event_reasons(&f), ["\"Recreated\""]);
        // A fresh process (a command) has no state to give back: nothing is created.
        *f.obj.lock().unwrap() = None;
        let mut fresh = ExecutorSetStore::new(&f.client, "etl", "app", true);
        assert_eq!(fresh.load().unwrap(), None);
        assert!(f.obj.lock().unwrap().is_none());
    }

    #[test]
    fn a_wiped_state_is_restored_from_the_loops_last_state() {
        let f = FakeEs::new();
        let (mut store, st) = saved_at_7(&f);
        let mut o = f.obj();
        o["status"] = json!({});
        *f.obj.lock().unwrap() = Some(o);
        assert_eq!(store.load().unwrap(), Some(st));
        assert_eq!(f.obj()["status"]["allocator"]["last_executor_id"], 7);
        assert_eq!(f.obj()["status"]["appliedRemovals"], json!(["r1"]));
        assert_eq!(event_reasons(&f), ["\"StateRestored\""]);
        store.load().unwrap();
        assert_eq!(event_reasons(&f).len(), 1, "restored once");
    }

    #[test]
    fn a_removal_lowers_the_followed_target_once_per_executor_that_counts() {
        let spec = json!({"appId": "a", "replicas": 10, "maxReplicas": 3,
                          "removals": [{"request": "p", "executors": [7]}]});
        let mut e = es(spec.clone(), json!({}));
        let rm = req(
            "r",
            SteerOp::Remove {
                ids: vec![2, 2, 7, 9],
                evict: false,
            },
        );
        edit_spec(&mut e, &rm, Some(&[2, 7]));
        assert_eq!(
            e["spec"]["replicas"], 2,
            "the clamped 3, less 2 (7: not applied yet)"
        );
        let mut e = es(spec, json!({}));
        edit_spec(&mut e, &rm, None);
        assert_eq!(e["spec"]["replicas"], 1, "each id once: 2 and 9");
        // The step's rule 6: 2 runs, 3 is being deleted, 4 ended, 5 unacknowledged, 6 being
        // evicted, 99 gone.
        use crate::engine::snapshot::{ExecutorPod, ExecutorState::*, Snapshot};
        let pods = [
            (1, Running),
            (2, Running),
            (3, Deleted),
            (4, Failed),
            (6, Running),
        ];
        let snap = Snapshot {
            executors: (pods.iter())
                .map(|&(i, s)| (i, ExecutorPod::example(i, s)))
                .collect(),
            ..Snapshot::default()
        };
        let mut st = AllocatorState::new();
        st.last_executor_id = 99;
        st.unacknowledged = vec![crate::engine::alloc::Unacknowledged {
            executor_id: 5,
            created_ms: 0,
            retry: false,
            profile: 0,
        }];
        st.removing = vec![6];
        let settings = crate::engine::alloc::Settings::new("app");
        let ids = [2, 2, 3, 4, 5, 6, 99];
        let lowers = removal_lowers(&snap, &st, &settings, (&ids, 0), 0).unwrap();
        assert_eq!(lowers, [2, 5]);
    }

    #[test]
    fn a_bad_template_is_reported_once_and_the_last_good_one_followed() {
        let f = FakeEs::new();
        let bad = json!({"spec": {"containers": [{"name": "executor"}]}});
        let good = json!({"spec": {"containers": [{"name": "executor", "image": "img:1"}]}});
        *f.obj.lock().unwrap() = Some(json!({
            "kind": "ExecutorSet",
            "metadata": {"name": "etl", "generation": 1, "resourceVersion": "1", "uid": "u"},
            "spec": {"appId": "app", "replicas": 2, "template": bad},
        }));
        let mut store = ExecutorSetStore::new(&f.client, "etl", "app", true);
        store.load().unwrap();
        let err = store.home_template().unwrap_err();
        assert!(
            matches!(err, StoreError::Backend(_)),
            "exit 1, retried: {err}"
        );
        assert!(err.to_string().contains("no executor is created"), "{err}");
        let blocked = &f.obj()["status"]["conditions"][1];
        assert_eq!(blocked["reason"], "TemplateRefused", "{}", f.obj());
        assert!(store.home_template().is_err());
        assert_eq!(
            event_reasons(&f),
            ["\"TemplateRefused\""],
            "once per change"
        );
        // Fixed, then broken again: the last good one is followed.
        f.obj.lock().unwrap().as_mut().unwrap()["spec"]["template"] = good;
        store.load().unwrap();
        let kept = store.home_template().unwrap().unwrap();
        f.obj.lock().unwrap().as_mut().unwrap()["spec"]["template"] = bad;
        store.load().unwrap();
        assert_eq!(store.home_template().unwrap(), Some(kept));
        assert_eq!(event_reasons(&f).len(), 2);
        store.observe(&Summary::default(), None);
        let status = store.compose(None);
        assert_eq!(status["conditions"][1]["reason"], "TemplateRefused");
        assert!(status["conditions"][1]["message"]
            .as_str()
            .unwrap()
            .contains("the last usable template is followed"));
    }

    #[test]
    fn another_writers_status_is_a_conflict() {
        let f = FakeEs::new();
        let (mut store, mut st) = saved_at_3(&f);
        let mut rival = ExecutorSetStore::new(&f.client, "etl", "app", false);
        rival.load().unwrap();
        store.load().unwrap();
        st.target = Some(5);
        rival.save(&st).unwrap();
        st.target = Some(6);
        assert!(matches!(store.save(&st), Err(StoreError::Conflict(_))));
        // A spec change alone is not: the status is written on the new version.
        store.load().unwrap();
        submit(
            &f.client,
            "etl",
            "app",
            &req("s", SteerOp::Scale { target: 9 }),
            None,
        )
        .unwrap();
        st.target = Some(7);
        store.save(&st).unwrap();
        assert_eq!(f.obj()["status"]["target"], 7);
        assert_eq!(f.obj()["spec"]["replicas"], 9);
    }

    #[test]
    fn the_target_is_clamped_with_one_line_and_one_event() {
        let f = FakeEs::new();
        *f.obj.lock().unwrap() = Some(json!({
            "kind": "ExecutorSet",
            "metadata": {"name": "etl", "generation": 1, "resourceVersion": "1", "uid": "u"},
            "spec": {"appId": "app", "replicas": 10, "minReplicas": 1, "maxReplicas": 3},
        }));
        let mut store = ExecutorSetStore::new(&f.client, "etl", "app", true);
        store.load().unwrap();
        assert_eq!(store.home_target(), Some(3));
        assert_eq!(store.home_target(), Some(3));
        let events: Vec<Value> = (f.server.recorded().iter())
            .filter(|r| r.path().contains("/events"))
            .map(|r| serde_json::from_slice(&r.body).unwrap())
            .collect();
        assert_eq!(events.len(), 1, "once per change");
        assert_eq!(events[0]["reason"], "TargetClamped");
        assert_eq!(events[0]["involvedObject"]["kind"], "ExecutorSet");
        f.obj.lock().unwrap().as_mut().unwrap()["spec"]["replicas"] = json!(0);
        store.load().unwrap();
        assert_eq!(store.home_target(), Some(1));
    }

    fn es(spec: Value, status: Value) -> Value {
        json!({"metadata": {"name": "etl", "generation": 3, "resourceVersion": "7"},
               "spec": spec, "status": status})
    }

    fn req(id: &str, op: SteerOp) -> Steering {
        Steering::bare(id, op)
    }

    #[test]
    fn removals_are_requests_each_id_once() {
        let e = es(
            json!({"appId": "a", "removals": [
                {"request": "r1", "executors": [5, 7]},
                {"request": "r2", "executors": [9]},
                {"request": "r2", "executors": [9]},
                {"request": "", "executors": [1]},
            ]}),
            json!({"appliedRemovals": ["r1"]}),
        );
        let got = removals(&e, "es");
        let ids: Vec<&str> = got.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["r1", "r2"]);
        assert_eq!(
            got[1].op,
            SteerOp::Remove {
                ids: vec![9],
                evict: false
            }
        );
    }

    #[test]
    fn requests_edit_the_spec_and_carry_their_id() {
        let mut e = es(
            json!({"appId": "a", "replicas": 5, "removals": [{"request": "old", "executors": [1]}]}),
            json!({"appliedRemovals": ["old"], "target": 5}),
        );
        edit_spec(&mut e, &req("x1", SteerOp::Add { count: 2 }), None);
        assert_eq!(e["spec"]["replicas"], 7);
        assert!(carries(&e, "x1") && !carries(&e, "x2"));
        edit_spec(
            &mut e,
            &req(
                "x2",
                SteerOp::Remove {
                    ids: vec![3, 4],
                    evict: false,
                },
            ),
            None,
        );
        assert_eq!(e["spec"]["replicas"], 5);
        assert_eq!(
            e["spec"]["removals"],
            json!([{"request": "x2", "executors": [3, 4]}]),
            "the applied entry is pruned in the same write"
        );
        edit_spec(&mut e, &req("x3", SteerOp::Scale { target: 9 }), None);
        assert_eq!(e["spec"]["replicas"], 9);
        assert_eq!(e["metadata"]["annotations"][REQUEST_KEY], "x3");
        assert!(carries(&e, "x2"), "a removal is found in spec.removals");
    }

    #[test]
    fn another_apps_executorset_is_refused_naming_both() {
        let e = es(json!({"appId": "other"}), json!({}));
        let err = check_app(&e, "mine", "ExecutorSet ns/etl").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("\"other\"") && text.contains("\"mine\""),
            "{text}"
        );
        assert_eq!(
            crate::store::file::store_error(err).code,
            crate::error::ExitCode::Usage
        );
        assert!(check_app(&es(json!({"appId": "mine"}), json!({})), "mine", "x").is_ok());
    }

    #[test]
    fn conditions_keep_their_transition_time_while_their_status_stays() {
        let old = json!({"conditions": [
            {"type": "Progressing", "status": "False", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Blocked", "status": "False", "lastTransitionTime": "2026-01-02T00:00:00Z"},
        ]});
        let c = conditions(&old, false, None);
        assert_eq!(c[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(c[1]["lastTransitionTime"], "2026-01-02T00:00:00Z");
        let b = ("Waiting".to_string(), "2 pending".to_string());
        let c = conditions(&old, true, Some(&b));
        assert_eq!(c[0]["status"], "True");
        assert_ne!(c[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(
            (c[1]["reason"].as_str(), c[1]["status"].as_str()),
            (Some("Waiting"), Some("True"))
        );
        let (r, _) = blocked_condition(&Blocked::MaxPending { pending: 2, cap: 2 });
        assert_eq!(r, "MaxPending");
    }
}
