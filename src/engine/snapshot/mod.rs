//! The snapshot: a PodList (as `GET /api/v1/namespaces/NS/pods?labelSelector=…` returns it)
//! turned into executor id → [`ExecutorState`]. Pure: no I/O, no clock.
//!
//! Only the fields the allocation step needs are decoded (name, uid, resourceVersion, the three
//! Spark labels, deletionTimestamp, phase, node name, the PodScheduled condition, container
//! termination details); unknown fields are skipped without being built, so a 5 KB executor pod
//! costs a scan, not an allocation per field.
//!
//! Both encodings the API server speaks are read, each by one decoder, page by page while
//! the body arrives (`stream.rs`): Kubernetes' Protobuf (a body that begins `k8s\0`,
//! `proto.rs`) and JSON through serde_json (`json.rs`), into the same raw values, so a pod
//! reads the same whichever way it came (held by a differential test on kube-apiserver's own
//! encoding). Two entry points: [`Snapshot::read_page`] (a page of a list, from any
//! [`std::io::Read`]: a connection, or bytes already in memory) and [`Snapshot::read_pod`]
//! (one Pod object); the split of a namespace-wide list by app reads its pages with the same
//! decoder (`Split`).
//!
//! What counts as a pod list (anything else is [`SnapshotError::Malformed`], quoting the
//! body's first bytes): a Protobuf `PodList`, a JSON object whose `kind` is `PodList` — what the API server sends —
//! or, for a file given offline ([`ListSource::Offline`], `plan --pods`), kubectl's `List`
//! (`kubectl get pods -o json`). A `PodList`'s `items` may be `null` or missing (an empty
//! list: Go's `nil` slice); a `List` must carry an `items` array. A body without `kind`
//! (`{}`, `{"items": null}`) is never read as "no pods": that would make the step create a
//! whole target's worth of executors next to the running ones. Two equal keys in one pod's
//! `labels` or `annotations` (which the API server never sends) make the body malformed too.
//!
//! Executor ids: Spark's executor ids are positive longs, so the valid range is
//! 1 ..= 9223372036854775807 ([`MAX_EXECUTOR_ID`], `i64::MAX`), written in canonical decimal.
//! An id outside it (`0`, `18446744073709551615`) is not an executor id: such a pod is ignored
//! with a warning naming it — not counted, never deleted, and not taken into account for new
//! ids (one stray label must not push the id counter to its end).
//!
//! Classification (docs/semantics.md; conformance c09/c12):
//! - pods whose `spark-app-selector` is not the app id or whose `spark-role` is not `executor`
//!   are not ours and are skipped silently (a label selector may be wider than our app);
//! - our pods without a valid `spark-exec-id` (canonical decimal in the range above) are
//!   ignored with a warning and never touched;
//! - `metadata.deletionTimestamp` set → [`ExecutorState::Deleted`] whatever the phase
//!   (as Kubernetes' ReplicaSet controller: a terminating pod no longer counts);
//! - otherwise, when the executor container has terminated: Succeeded (exit code 0) or Failed
//!   (anything else, or OOMKilled), whatever the phase and the other containers say — podalloc
//!   creates pods with `restartPolicy: Never`, so a terminated container never comes back,
//!   while a sidecar that keeps running holds the pod in phase Running;
//! - otherwise by `status.phase`: Pending (also a pod without a phase: the API server sets
//!   Pending on every create, so a pod without one was just created), Running, Failed,
//!   Succeeded; anything else (`Unknown`) → Unknown.
//!
//! Besides the state, each pod records what the rules of real clusters need
//! (`docs/semantics.md`, "Rules for real clusters"): whether it is scheduling-gated, whether
//! Kubernetes ended it (`DisruptionTarget`, KEP-3329), and, while terminating, its
//! `deletionTimestamp`, `deletionGracePeriodSeconds` and whether its phase is terminal (how a
//! ResourceQuota decides whether it still charges it).
//!
//! The executor container is the one named by `--executor-container`, else the pod's first
//! container in `spec.containers` (for pods podalloc creates: the template's first container).
//! Init containers with `restartPolicy: Always` are native sidecars (Kubernetes 1.29+,
//! KEP-753): they are not init steps, so their exit never explains a failure; deleting the pod
//! deletes them with it.

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

mod json;
mod proto;
mod split;
mod stream;

pub(crate) use split::Split;

/// Label carrying the application id (Spark's `SPARK_APP_ID_LABEL`).
pub const LABEL_APP: &str = "spark-app-selector";
/// Label carrying the role (Spark's `SPARK_ROLE_LABEL`); executors carry `executor`.
pub const LABEL_ROLE: &str = "spark-role";
/// Label carrying the numeric executor id (Spark's `SPARK_EXECUTOR_ID_LABEL`).
pub const LABEL_EXEC_ID: &str = "spark-exec-id";
/// The value of [`LABEL_ROLE`] on executor pods.
pub const ROLE_EXECUTOR: &str = "executor";
/// Label carrying the executor's resource profile id (Spark 3.1+'s
/// `SPARK_RESOURCE_PROFILE_ID_LABEL`, SPARK-33288); a pod without it is profile 0.
pub const LABEL_PROFILE: &str = "spark-exec-resourceprofile-id";

/// The largest valid executor id: Spark's executor ids are positive `Long`s, so `i64::MAX`.
/// Valid ids are `1 ..= MAX_EXECUTOR_ID`.
pub const MAX_EXECUTOR_ID: u64 = i64::MAX as u64;

/// Where a pod list comes from, which decides the list kinds accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListSource {
    /// An API server's answer to `GET …/pods`: `kind` must be `PodList`.
    ApiServer,
    /// A file given offline (`plan --pods`): `PodList`, or kubectl's `List` with `items`.
    Offline,
}

/// Whose pods a list is read for, and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct For<'a> {
    /// The app id: pods whose `spark-app-selector` is another are not ours.
    pub app_id: &'a str,
    /// The container whose state decides the executor's (`--executor-container`); `None`:
    /// each pod's first container in `spec.containers`.
    pub container: Option<&'a str>,
    /// Which list kinds are accepted.
    pub source: ListSource,
}

impl<'a> For<'a> {
    /// App `app_id`'s pods from the API server, each pod's first container the executor's.
    pub fn app(app_id: &'a str) -> Self {
        For {
            app_id,
            container: None,
            source: ListSource::ApiServer,
        }
    }

    /// The same with the executor container named (`None`: each pod's first).
    pub fn container(self, container: Option<&'a str>) -> Self {
        For { container, ..self }
    }

    /// The same for a list from `source`.
    pub fn source(self, source: ListSource) -> Self {
        For { source, ..self }
    }
}

/// One app's page while it is read: its pods classified into a part of their own, added to
/// the snapshot only once the whole page has been read.
struct AppPage<'a> {
    of: For<'a>,
    part: Snapshot,
    /// The first duplicate id inside the page, reported once the page has been read.
    duplicate: Option<SnapshotError>,
}

impl stream::Sink for AppPage<'_> {
    fn pod(&mut self, pod: RawPod<'_>) {
        if let Err(e) = self.part.add_pod(pod, self.of.app_id, self.of.container) {
            self.duplicate.get_or_insert(e);
        }
    }
}

/// What a pod's state means for allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorState {
    /// `status.phase` Pending, or no phase: accepted, not yet running (unscheduled, gated,
    /// pulling, starting).
    Pending,
    /// `status.phase` Running.
    Running,
    /// `status.phase` Failed: does not count toward the target; deleted and replaced.
    Failed,
    /// `status.phase` Succeeded: does not count toward the target; deleted and replaced.
    Succeeded,
    /// `metadata.deletionTimestamp` is set: going away; never deleted again, not counted
    /// (unless `--count-terminating`: then as a ResourceQuota charges it).
    Deleted,
    /// Phase `Unknown` (or any phase Kubernetes does not define): its node stopped
    /// reporting. Counts toward the target until `--unknown-timeout`, then deleted as lost.
    Unknown,
}

/// One executor pod as the snapshot keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutorPod {
    /// The executor id from the `spark-exec-id` label (`1 ..= MAX_EXECUTOR_ID`).
    pub id: u64,
    /// The resource profile from the [`LABEL_PROFILE`] label (0 without it).
    pub profile: u32,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid` (empty if absent); used for delete preconditions.
    pub uid: String,
    /// `metadata.resourceVersion` (empty if absent); used for delete preconditions.
    pub resource_version: String,
    /// The classified state.
    pub state: ExecutorState,
    /// True when the pod is bound to a node (`spec.nodeName` set, or PodScheduled=True).
    pub scheduled: bool,
    /// A short why for Failed/Succeeded/waiting pods (e.g. `OOMKilled exit 137`), for logs.
    pub detail: Option<String>,
    /// Why it failed, for the crash-loop guard: `status.reason` (`Evicted`), else the executor
    /// container's termination (`OOMKilled`; `exit code N` for a plain `Error`), else — when
    /// the executor container never terminated — the first failed init step or container,
    /// else the [`ExecutorPod::waiting`] message (`ImagePullBackOff (image …)`). A sidecar's
    /// exit code is never the reason when the executor container has one.
    pub reason: Option<String>,
    /// Why the executor has not started, while its container has neither run nor terminated:
    /// the first waiting init container (native sidecars included: the executor waits for
    /// them too), then the executor container, then the other containers, a real failure (`ErrImagePull`,
    /// `CrashLoopBackOff`, …) before a [`STARTING_REASONS`] one (only reported once the pod
    /// is scheduled). Written `REASON (image IMAGE)`, `REASON (init container NAME, image
    /// IMAGE)`, or the bare reason when the status names no image.
    pub waiting: Option<String>,
    /// PodScheduled=False with reason Unschedulable: the scheduler cannot place it.
    pub unschedulable: bool,
    /// The `Ready` condition is `True` (the kubelet's readiness: every container ready).
    /// Scale-down takes not-Ready executors before Ready ones, as the ReplicaSet ranks
    /// pods (`ActivePodsWithRanks`: not ready < ready).
    pub ready: bool,
    /// The `controller.kubernetes.io/pod-deletion-cost` annotation (default 0): lower goes
    /// first on scale-down, as ReplicaSet.
    pub deletion_cost: i32,
    /// The largest container restartCount.
    pub restarts: u32,
    /// `metadata.creationTimestamp` (RFC 3339, set by the API server), ms since the Unix
    /// epoch; `None` when absent or unparsable. Spark 3.1+ ages pending pods by it.
    pub created_ms: Option<u64>,
    /// The pod carries scheduling gates (`spec.schedulingGates` not empty, or
    /// `PodScheduled=False` with reason `SchedulingGated`, KEP-3521): the scheduler does not
    /// look at it until something (Kueue, …) removes them, so it is not waiting on the
    /// scheduler and does not hold back the next batch (it still counts toward the target).
    pub gated: bool,
    /// Kubernetes ended the pod, not the executor (KEP-3329): the reason of its
    /// `DisruptionTarget=True` condition (`PreemptionByScheduler`, `DeletionByTaintManager`,
    /// `EvictionByEvictionAPI`, `DeletionByPodGC`, `TerminationByKubelet`), else — on a
    /// cluster that does not set the condition — the kubelet's `status.reason` for a
    /// node-pressure eviction (`Evicted`) or a graceful node shutdown (`Terminated`,
    /// `Shutdown`). `None`: no disruption.
    pub disruption: Option<String>,
    /// `metadata.deletionTimestamp`, ms since the Unix epoch (`None` when absent or
    /// unparsable). The API server sets it to the delete's time plus its grace period.
    pub deletion_ms: Option<u64>,
    /// `metadata.deletionGracePeriodSeconds`, in ms (`None` when absent or negative).
    pub deletion_grace_ms: Option<u64>,
    /// `status.phase` is Failed or Succeeded (whether or not the pod is being deleted):
    /// such a pod holds no resources, so neither quota nor a Job counts it.
    pub terminal_phase: bool,
}

impl ExecutorPod {
    /// The [`ExecutorPod::waiting`] message when its reason (the text before ` (`) is one of
    /// `reasons`, e.g. the start-up reasons `--startup-grace` acts on.
    pub fn waiting_in(&self, reasons: &[&str]) -> Option<&str> {
        let w = self.waiting.as_deref()?;
        let reason = w.split(" (").next().unwrap_or(w);
        reasons.contains(&reason).then_some(w)
    }

    /// Whether a terminating pod still counts toward the target at `now_ms` under
    /// `--count-terminating`, as a ResourceQuota charges it (kube-apiserver's `QuotaV1Pod`,
    /// `pkg/quota/v1/evaluator/core/pods.go`, kubernetes/kubernetes#46542): not when its phase
    /// is Failed or Succeeded, and not once `deletionTimestamp + deletionGracePeriodSeconds`
    /// has passed (its node is lost and will never confirm the delete). `false` for a pod
    /// that is not being deleted.
    pub fn terminating_counts(&self, now_ms: u64) -> bool {
        if self.state != ExecutorState::Deleted || self.terminal_phase {
            return false;
        }
        match (self.deletion_ms, self.deletion_grace_ms) {
            (Some(at), Some(grace)) => now_ms <= at.saturating_add(grace),
            _ => true,
        }
    }

    /// When the delete of a terminating pod was asked for, ms since the Unix epoch:
    /// `deletionTimestamp − deletionGracePeriodSeconds` (the API server sets the timestamp
    /// to the delete's time plus the grace). `None` when either is unknown.
    pub fn deleted_at_ms(&self) -> Option<u64> {
        Some(self.deletion_ms?.saturating_sub(self.deletion_grace_ms?))
    }
}

#[cfg(test)]
impl Snapshot {
    /// Tests: a whole list given offline (`plan --pods`), in memory.
    pub(crate) fn from_pod_list(bytes: &[u8], app_id: &str) -> Result<Snapshot, SnapshotError> {
        let mut s = Snapshot::default();
        s.read_page(bytes, For::app(app_id).source(ListSource::Offline))?;
        Ok(s)
    }

    /// Tests: [`Snapshot::from_pod_list`] with the executor container named.
    pub(crate) fn from_pod_list_for(
        bytes: &[u8],
        app_id: &str,
        container: Option<&str>,
    ) -> Result<Snapshot, SnapshotError> {
        let mut s = Snapshot::default();
        let of = For::app(app_id).container(container);
        s.read_page(bytes, of.source(ListSource::Offline))?;
        Ok(s)
    }

    /// Tests: one page from the API server, in memory.
    pub(crate) fn add_page(
        &mut self,
        bytes: &[u8],
        app_id: &str,
    ) -> Result<Option<String>, SnapshotError> {
        self.read_page(bytes, For::app(app_id))
    }
}

#[cfg(test)]
impl ExecutorPod {
    /// A pod for tests: executor `id` in `state`, named `app-exec-ID`, scheduled unless
    /// pending, nothing else set.
    pub(crate) fn example(id: u64, state: ExecutorState) -> ExecutorPod {
        ExecutorPod {
            id,
            profile: 0,
            name: format!("app-exec-{id}"),
            uid: format!("uid-{id}"),
            resource_version: "1".into(),
            state,
            scheduled: state != ExecutorState::Pending,
            detail: None,
            reason: None,
            waiting: None,
            unschedulable: false,
            ready: state == ExecutorState::Running,
            deletion_cost: 0,
            restarts: 0,
            created_ms: None,
            gated: false,
            disruption: None,
            deletion_ms: None,
            deletion_grace_ms: None,
            terminal_phase: false,
        }
    }
}

/// Executor id → pod, plus what was skipped. Built from one or more PodList pages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Our executors by id (ordered).
    pub executors: BTreeMap<u64, ExecutorPod>,
    /// One line per pod of ours that was ignored (no `spark-exec-id`, or one outside
    /// `1 ..= MAX_EXECUTOR_ID`), naming the pod.
    pub warnings: Vec<String>,
    /// Pods in the list that belong to another app or role (skipped, counted for logs).
    pub foreign: u64,
    /// The highest executor id among our pods set aside for their resource profile label
    /// (one that is not a profile id, e.g. `abc` or `01`; 0 when none). Such a pod is not an
    /// executor here, but its id stays taken: [`Snapshot::max_id`] counts it, so no new
    /// executor gets it (a fixed label would otherwise make two pods carry one id).
    pub aside_max_id: u64,
    /// The driver pod as the tick read it (`--driver-pod`); `None` when no driver is named.
    pub driver: Option<DriverState>,
}

/// The driver pod's lifecycle as it matters for its executors (Spark: the executors live and
/// die with the driver; Kubernetes garbage-collects them only once the driver object is gone).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverState {
    /// Phase Pending: no executors yet.
    Pending,
    /// Phase Running (or Unknown: a node that stopped reporting is not an ended app).
    Running,
    /// Phase Succeeded or Failed (the phase).
    Finished(String),
    /// `metadata.deletionTimestamp` is set.
    Deleting,
    /// The pod no longer exists, after the app had executors.
    Gone,
}

impl DriverState {
    /// Classifies a driver pod by `metadata.deletionTimestamp` and `status.phase`.
    pub fn of(deleting: bool, phase: &str) -> DriverState {
        match phase {
            _ if deleting => DriverState::Deleting,
            "Pending" | "" => DriverState::Pending,
            "Succeeded" | "Failed" => DriverState::Finished(phase.to_string()),
            _ => DriverState::Running,
        }
    }
}

/// Why a PodList could not be read. `Display` names the input and the problem in one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// The bytes are not a PodList JSON document (truncated, malformed, wrong shape, no or
    /// another `kind`, duplicate label keys). The message quotes the body's first bytes.
    Malformed(String),
    /// Two pods carry the same executor id.
    DuplicateId {
        /// The executor id.
        id: u64,
        /// The first pod's name.
        first: String,
        /// The second pod's name.
        second: String,
    },
    /// The body could not be read to its end ([`Snapshot::read_page`]: the connection
    /// failed, bad gzip, over a body limit); the I/O error's message.
    Read(String),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Malformed(m) => write!(f, "not a PodList: {m}"),
            SnapshotError::Read(m) => write!(f, "the pod list could not be read: {m}"),
            SnapshotError::DuplicateId { id, first, second } => write!(
                f,
                "pods {:?} and {:?} both carry {LABEL_EXEC_ID}={id}; \
                 delete or relabel the one podalloc did not create",
                clip(first),
                clip(second)
            ),
        }
    }
}

impl std::error::Error for SnapshotError {}

/// At most 253 characters (the longest valid pod name) of a name from the input, for messages.
fn clip(name: &str) -> &str {
    match name.char_indices().nth(253) {
        Some((i, _)) => &name[..i],
        None => name,
    }
}

impl Snapshot {
    /// The highest executor id among our pods in any state, those set aside for their
    /// profile label included (0 when none): new ids start above it.
    pub fn max_id(&self) -> u64 {
        let listed = self.executors.keys().next_back().copied().unwrap_or(0);
        listed.max(self.aside_max_id)
    }

    /// Count of executors in `state`.
    pub fn count(&self, state: ExecutorState) -> usize {
        self.executors.values().filter(|p| p.state == state).count()
    }

    /// Reads one page of a pod list from `body` (see the module doc), while it arrives, for
    /// the app `of` names, and returns the page's `metadata.continue` token (`None` when
    /// absent or empty: the last page). Each pod is decoded as soon as it is complete and
    /// its bytes are dropped, so memory stays at one buffer of 256 KiB (more only for a
    /// single pod larger than that) plus the snapshot, however large the page. A page that
    /// fails adds nothing.
    ///
    /// Errors: [`SnapshotError::Read`] when `body` fails (the connection, gzip, a body
    /// limit); [`SnapshotError::Malformed`] for a body that is not a pod list from
    /// `of.source` (see the module doc), or one value over 16 MiB (one pod, which etcd could
    /// not store); [`SnapshotError::DuplicateId`] when two pods carry the same executor id.
    pub fn read_page<R: std::io::Read>(
        &mut self,
        body: R,
        of: For<'_>,
    ) -> Result<Option<String>, SnapshotError> {
        self.read_sized(body, of, stream::START_BUFFER)
    }

    /// [`Snapshot::read_page`] with a first buffer of `buffer` bytes.
    fn read_sized<R: std::io::Read>(
        &mut self,
        body: R,
        of: For<'_>,
        buffer: usize,
    ) -> Result<Option<String>, SnapshotError> {
        let mut sink = AppPage {
            of,
            part: Snapshot::default(),
            duplicate: None,
        };
        let offline = of.source == ListSource::Offline;
        let page = stream::read(body, &mut sink, offline, buffer)?;
        if let Some(e) = sink.duplicate {
            return Err(e);
        }
        self.merge(sink.part)?;
        Ok(page.cont.flatten().filter(|c| !c.is_empty()))
    }

    /// Adds one Pod object (`GET …/pods/NAME`'s body, JSON or Protobuf), classified exactly
    /// as a listed pod: the tick asks it whether a pod is still pending before deleting it
    /// as excess. Errors: [`SnapshotError::Malformed`] for bytes that are not a Pod object,
    /// [`SnapshotError::DuplicateId`] as [`Snapshot::read_page`].
    pub fn read_pod(&mut self, body: &[u8], of: For<'_>) -> Result<(), SnapshotError> {
        let pod = match body.starts_with(crate::wire::protobuf::MAGIC) {
            true => proto::pod_object(body),
            false => serde_json::from_slice::<RawPod<'_>>(body).map_err(|e| e.to_string()),
        };
        let pod = pod.map_err(|e| {
            SnapshotError::Malformed(format!(
                "not a Pod: {e}; the body begins: {}",
                excerpt(body)
            ))
        })?;
        self.add_pod(pod, of.app_id, of.container)
    }

    /// Adds the pods of `part` (one page), or none of them when one's id is already here.
    fn merge(&mut self, part: Snapshot) -> Result<(), SnapshotError> {
        if let Some((id, pod)) = part
            .executors
            .iter()
            .find(|(id, _)| self.executors.contains_key(id))
        {
            return Err(SnapshotError::DuplicateId {
                id: *id,
                first: self.executors[id].name.clone(),
                second: pod.name.clone(),
            });
        }
        if self.executors.is_empty() {
            self.executors = part.executors;
        } else {
            self.executors.extend(part.executors);
        }
        self.warnings.extend(part.warnings);
        self.foreign += part.foreign;
        self.aside_max_id = self.aside_max_id.max(part.aside_max_id);
        Ok(())
    }

    /// A pod's executor id and resource profile from its labels; `None` (with a warning
    /// naming the pod, which is then ignored) when either is not valid. A valid id on a pod
    /// set aside for its profile label is still reserved ([`Snapshot::aside_max_id`]).
    fn ids(
        &mut self,
        name: &str,
        exec_id: Option<&str>,
        profile: Option<&str>,
    ) -> Option<(u64, u32)> {
        let Some(id) = exec_id.and_then(parse_executor_id) else {
            self.warnings.push(bad_id_warning(name, exec_id));
            return None;
        };
        let Some(profile) = profile.map_or(Some(0), parse_profile) else {
            self.aside_max_id = self.aside_max_id.max(id);
            self.warnings.push(bad_profile_warning(name, profile));
            return None;
        };
        Some((id, profile))
    }

    fn add_pod(
        &mut self,
        pod: RawPod<'_>,
        app_id: &str,
        executor_container: Option<&str>,
    ) -> Result<(), SnapshotError> {
        let meta = pod.metadata.unwrap_or_default();
        let labels = meta.labels.unwrap_or_default();
        let [app, role, exec_id, profile] = labels.0;
        if app.as_deref() != Some(app_id) || role.as_deref() != Some(ROLE_EXECUTOR) {
            self.foreign += 1;
            return Ok(());
        }
        let name = meta.name.map(Str::into_owned).unwrap_or_default();
        let Some((id, profile)) = self.ids(&name, exec_id.as_deref(), profile.as_deref()) else {
            return Ok(());
        };
        let status = pod.status.unwrap_or_default();
        let spec = pod.spec.unwrap_or_default();
        let node = spec.node_name.as_deref().is_some_and(|n| !n.is_empty());
        let scheduled = node || status.condition_true("PodScheduled");
        let view = Containers::new(&spec, &status, executor_container);
        let state = match view.executor_exit() {
            _ if meta.deletion_timestamp.is_some() => ExecutorState::Deleted,
            Some(true) => ExecutorState::Succeeded,
            Some(false) => ExecutorState::Failed,
            None => classify(false, status.phase.as_deref()),
        };
        let detail = status.detail();
        let reason = view.reason();
        let waiting = view.waiting(scheduled);
        let unschedulable = status.scheduled_false_because("Unschedulable");
        let ready = status.condition_true("Ready");
        let gated = spec
            .scheduling_gates
            .as_ref()
            .is_some_and(|g| !g.0.is_empty())
            || status.scheduled_false_because("SchedulingGated");
        let restarts = status.restarts();
        let deletion_cost = meta
            .annotations
            .and_then(|a| {
                let [cost] = a.0;
                cost
            })
            .and_then(|v| v.trim().parse::<i32>().ok())
            .unwrap_or(0);
        let entry = ExecutorPod {
            id,
            profile,
            name,
            uid: meta.uid.map(Str::into_owned).unwrap_or_default(),
            resource_version: meta
                .resource_version
                .map(Str::into_owned)
                .unwrap_or_default(),
            state,
            scheduled,
            detail,
            reason,
            waiting,
            unschedulable,
            ready,
            deletion_cost,
            restarts,
            created_ms: (meta.creation_ms)
                .or_else(|| meta.creation_timestamp.as_deref().and_then(rfc3339_ms)),
            gated,
            disruption: status.disruption(),
            deletion_ms: meta.deletion_timestamp.and_then(|s| s.0),
            deletion_grace_ms: (meta.deletion_grace_period_seconds)
                .and_then(|g| u64::try_from(g).ok())
                .map(|g| g.saturating_mul(1000)),
            terminal_phase: matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")),
        };
        if let Some(prev) = self.executors.get(&id) {
            return Err(SnapshotError::DuplicateId {
                id,
                first: prev.name.clone(),
                second: entry.name,
            });
        }
        self.executors.insert(id, entry);
        Ok(())
    }
}

/// An RFC 3339 time (`2026-01-01T00:00:00Z`, as the API server writes `creationTimestamp`) as
/// ms since the Unix epoch; `None` when it does not parse or is before the epoch.
fn rfc3339_ms(v: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(v).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(d.as_millis()).ok()
}

/// A resource profile id as Spark writes it (`ResourceProfile.id`, a non-negative `Int`, in
/// canonical decimal).
fn parse_profile(v: &str) -> Option<u32> {
    let canonical = v == "0" || (!v.starts_with('0') && v.bytes().all(|b| b.is_ascii_digit()));
    v.parse::<u32>()
        .ok()
        .filter(|&p| canonical && p <= i32::MAX as u32)
}

/// The warning for one of our pods ignored for its resource profile label (`value`).
fn bad_profile_warning(name: &str, value: Option<&str>) -> String {
    format!(
        "pod {:?} has {LABEL_PROFILE}={:?}, not a resource profile id: ignored \
         (its executor id stays reserved)",
        clip(name),
        clip(value.unwrap_or_default())
    )
}

/// The warning for one of our pods ignored for its `spark-exec-id` label (`value`), naming it.
fn bad_id_warning(name: &str, value: Option<&str>) -> String {
    let name = clip(name);
    match value {
        Some(v) if is_canonical_decimal(v) => format!(
            "pod {name:?} has {LABEL_EXEC_ID}={:?}, outside the executor id range \
             1..={MAX_EXECUTOR_ID} (Spark's ids are positive longs): ignored, \
             not counted and never touched",
            clip(v)
        ),
        Some(v) => format!(
            "pod {name:?} has {LABEL_EXEC_ID}={:?}, not a positive integer: ignored",
            clip(v)
        ),
        None => format!("pod {name:?} has no {LABEL_EXEC_ID} label: ignored"),
    }
}

/// A pod's [`ExecutorState`]: `Deleted` when it is terminating, else by `status.phase`. A
/// pod without a phase (absent or empty) is Pending: the API server sets `Pending` on every
/// create (the pod strategy's `PrepareForCreate`), so a pod without one was just created or
/// written by something that is not the API server; reading it as Unknown would leave it
/// uncounted and replace it (10 executors for a target of 5).
fn classify(terminating: bool, phase: Option<&str>) -> ExecutorState {
    if terminating {
        return ExecutorState::Deleted;
    }
    match phase.unwrap_or("") {
        "Pending" | "" => ExecutorState::Pending,
        "Running" => ExecutorState::Running,
        "Failed" => ExecutorState::Failed,
        "Succeeded" => ExecutorState::Succeeded,
        _ => ExecutorState::Unknown,
    }
}

/// Parses an executor id label value: ASCII digits only, no sign, no leading zero, value in
/// `1 ..= MAX_EXECUTOR_ID` (Spark's executor ids are positive longs). `None` otherwise.
pub fn parse_executor_id(v: &str) -> Option<u64> {
    // Canonical decimal only: "01" is not "1" (two pods must never share an id by spelling).
    if !is_canonical_decimal(v) {
        return None;
    }
    v.parse::<u64>()
        .ok()
        .filter(|&id| (1..=MAX_EXECUTOR_ID).contains(&id))
}

/// ASCII digits, at least one, no leading zero.
fn is_canonical_decimal(v: &str) -> bool {
    !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && !v.starts_with('0')
}

/// Whether a list whose `kind` is `kind` (and that has an `items` array or not) is a pod
/// list from `source` (see the module doc). Errors: why not.
fn check_kind(kind: Option<&str>, items_array: bool, source: ListSource) -> Result<(), String> {
    let kinds = match source {
        ListSource::ApiServer => "\"PodList\"",
        ListSource::Offline => "\"PodList\" (or kubectl's \"List\")",
    };
    match kind {
        Some("PodList") => Ok(()),
        Some("List") if source == ListSource::Offline => match items_array {
            true => Ok(()),
            false => Err("a \"List\" without an \"items\" array".to_string()),
        },
        Some(kind) => Err(format!("kind is {:?}, expected {kinds}", clip(kind))),
        None => Err(format!("no \"kind\" field, expected {kinds}")),
    }
}

/// The first bytes of a body for an error message: at most 80 characters, control and
/// bidirectional-formatting characters removed (the message stays one harmless line), `…`
/// when cut.
fn excerpt(bytes: &[u8]) -> String {
    const MAX_CHARS: usize = 80;
    let head = &bytes[..bytes.len().min(4 * MAX_CHARS)];
    let text = String::from_utf8_lossy(head);
    let mut out: String = text
        .chars()
        .filter(|c| {
            !c.is_control()
                && !matches!(c, '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
                    | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
        })
        .take(MAX_CHARS)
        .collect();
    if out.is_empty() {
        out.push_str("(nothing printable)");
    }
    if out.chars().count() == MAX_CHARS || head.len() < bytes.len() {
        out.push('…');
    }
    out
}

/// Deserializes a field that is present (even as `null`) to `Some`; with `#[serde(default)]`
/// an absent one stays `None`.
#[cfg(test)]
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// A JSON string, borrowed from the input when it holds no escape. serde's own `Cow<str>`
/// impl always allocates: only a field typed exactly `#[serde(borrow)] Cow<str>` borrows, not
/// one inside an `Option`, a map key or a sequence, which is where all of ours are.
struct Str<'a>(Cow<'a, str>);

impl Str<'_> {
    fn into_owned(self) -> String {
        self.0.into_owned()
    }
}

impl std::ops::Deref for Str<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Str<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(std::marker::PhantomData))
    }
}

// ---- the decoded subset of the API's JSON -------------------------------------------------

/// A whole JSON page as serde_json decodes it: the reference the streamed decoder is tested
/// against.
#[cfg(test)]
#[derive(Deserialize)]
struct PodListPage<'a> {
    #[serde(borrow, default)]
    kind: Option<Str<'a>>,
    #[serde(borrow, default)]
    #[allow(dead_code)] // decoded and checked as the streamed reader does, not read
    metadata: Option<ListMeta<'a>>,
    /// `None`: no `items` key; `Some(None)`: `"items": null`.
    #[serde(borrow, default, deserialize_with = "present")]
    items: Option<Option<Vec<RawPod<'a>>>>,
}

#[derive(Deserialize, Default)]
struct ListMeta<'a> {
    #[serde(borrow, default, rename = "continue")]
    cont: Option<Str<'a>>,
}

#[derive(Deserialize, Default)]
struct RawPod<'a> {
    #[serde(borrow, default)]
    metadata: Option<RawMeta<'a>>,
    #[serde(borrow, default)]
    spec: Option<RawSpec<'a>>,
    #[serde(borrow, default)]
    status: Option<RawStatus<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawMeta<'a> {
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
    #[serde(borrow, default)]
    uid: Option<Str<'a>>,
    #[serde(borrow, default)]
    resource_version: Option<Str<'a>>,
    #[serde(default)]
    deletion_timestamp: Option<Stamp>,
    #[serde(default)]
    deletion_grace_period_seconds: Option<i64>,
    #[serde(borrow, default)]
    creation_timestamp: Option<Str<'a>>,
    /// `creationTimestamp` already as ms since the Unix epoch (the Protobuf decoder's; JSON
    /// gives the text above).
    #[serde(skip)]
    creation_ms: Option<u64>,
    #[serde(borrow, default)]
    labels: Option<OurLabels<'a>>,
    #[serde(borrow, default)]
    annotations: Option<OurAnnotations<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawSpec<'a> {
    #[serde(borrow, default)]
    node_name: Option<Str<'a>>,
    #[serde(borrow, default)]
    containers: Option<json::Capped<RawContainer<'a>>>,
    #[serde(borrow, default)]
    init_containers: Option<json::Capped<RawContainer<'a>>>,
    #[serde(default)]
    scheduling_gates: Option<json::Capped<json::Checked>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawContainer<'a> {
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
    #[serde(borrow, default)]
    restart_policy: Option<Str<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawStatus<'a> {
    #[serde(borrow, default)]
    phase: Option<Str<'a>>,
    #[serde(borrow, default)]
    reason: Option<Str<'a>>,
    #[serde(borrow, default)]
    conditions: Option<json::Capped<RawCondition<'a>>>,
    #[serde(borrow, default)]
    container_statuses: Option<json::Capped<RawContainerStatus<'a>>>,
    #[serde(borrow, default)]
    init_container_statuses: Option<json::Capped<RawContainerStatus<'a>>>,
}

/// Waiting reasons of a container that is still being set up (its sandbox, volumes and
/// images, or the init containers before it): progress, not failure — until a start-up grace
/// runs out (`--startup-grace`).
pub const STARTING_REASONS: [&str; 2] = ["ContainerCreating", "PodInitializing"];

/// A pod's containers as the classification reads them: which one is the executor container
/// and which init containers are native sidecars (`restartPolicy: Always`, Kubernetes 1.29+,
/// KEP-753).
struct Containers<'s, 'a> {
    status: &'s RawStatus<'a>,
    /// The executor container's status, when the kubelet reported one.
    executor: Option<&'s RawContainerStatus<'a>>,
    /// Names of the native sidecars among the init containers, sorted.
    sidecars: Vec<&'s str>,
}

impl<'s, 'a> Containers<'s, 'a> {
    /// The executor container is `name`, else the pod's first container in
    /// `spec.containers`, else (no spec) the only container reported.
    fn new(spec: &'s RawSpec<'a>, status: &'s RawStatus<'a>, name: Option<&str>) -> Self {
        let first = || spec.containers.iter().flatten().next()?.name.as_deref();
        let mains = || status.container_statuses.iter().flatten();
        let executor = match name.or_else(first) {
            Some(n) => mains().find(|c| c.name.as_deref() == Some(n)),
            None => Some(mains())
                .filter(|m| m.clone().count() == 1)
                .and_then(|mut m| m.next()),
        };
        let mut sidecars: Vec<&str> = (spec.init_containers.iter().flatten())
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .filter_map(|c| c.name.as_deref())
            .collect();
        // Sorted, so that telling init steps from sidecars is not quadratic in a pod with
        // thousands of them.
        sidecars.sort_unstable();
        Containers {
            status,
            executor,
            sidecars,
        }
    }

    /// `Some(true)` when the executor container terminated with exit code 0, `Some(false)`
    /// when it terminated otherwise (non-zero, or OOMKilled), `None` while it has not
    /// terminated. Under `restartPolicy: Never` a terminated container never runs again.
    fn executor_exit(&self) -> Option<bool> {
        let t = self.executor?.state.as_ref()?.terminated.as_ref()?;
        Some(t.exit_code.unwrap_or(0) == 0 && t.reason.as_deref() != Some("OOMKilled"))
    }

    /// Init containers that are init steps (native sidecars left out).
    fn init_steps(&self) -> impl Iterator<Item = &'s RawContainerStatus<'a>> + '_ {
        (self.status.init_container_statuses.iter().flatten()).filter(|c| {
            c.name
                .as_deref()
                .is_none_or(|n| self.sidecars.binary_search(&n).is_err())
        })
    }

    /// See [`ExecutorPod::reason`].
    fn reason(&self) -> Option<String> {
        if let Some(r) = self.status.reason.as_deref().filter(|r| !r.is_empty()) {
            return Some(r.to_string());
        }
        let failure = |cs: &RawContainerStatus<'_>| {
            let t = cs.state.as_ref()?.terminated.as_ref()?;
            let code = t.exit_code.unwrap_or(0);
            if code == 0 && t.reason.as_deref() != Some("OOMKilled") {
                return None;
            }
            Some(match t.reason.as_deref() {
                None | Some("") | Some("Error") => format!("exit code {code}"),
                Some(r) => r.to_string(),
            })
        };
        if let Some(r) = self.executor.and_then(failure) {
            return Some(r);
        }
        if self.executor_exit().is_none() {
            let mains = self.status.container_statuses.iter().flatten();
            if let Some(r) = self.init_steps().chain(mains).find_map(failure) {
                return Some(r);
            }
        }
        self.waiting(true)
    }

    /// See [`ExecutorPod::waiting`]. `scheduled`: the pod is bound to a node (only then is
    /// a [`STARTING_REASONS`] wait reported).
    fn waiting(&self, scheduled: bool) -> Option<String> {
        let started = self.executor.and_then(|c| c.state.as_ref());
        if started.is_some_and(|s| s.running.is_some() || s.terminated.is_some()) {
            return None;
        }
        let inits = self.status.init_container_statuses.iter().flatten();
        let others = (self.status.container_statuses.iter().flatten())
            .filter(|c| !self.executor.is_some_and(|e| std::ptr::eq(e, *c)));
        let mains = self.executor.into_iter().chain(others);
        let waits: Vec<(bool, &RawContainerStatus<'_>, &str)> = (inits.map(|c| (true, c)))
            .chain(mains.map(|c| (false, c)))
            .filter_map(|(init, c)| {
                let r = c.state.as_ref()?.waiting.as_ref()?.reason.as_deref()?;
                (!r.is_empty()).then_some((init, c, r))
            })
            .collect();
        let starting = |r: &str| STARTING_REASONS.contains(&r);
        let (init, c, r) = match waits.iter().find(|(_, _, r)| !starting(r)) {
            Some(w) => *w,
            None => *waits.iter().find(|_| scheduled)?,
        };
        let image = c.image.as_deref().filter(|i| !i.is_empty());
        let name = c.name.as_deref().unwrap_or("");
        Some(match (init, image) {
            (true, Some(i)) => format!("{r} (init container {name}, image {i})"),
            (true, None) => format!("{r} (init container {name})"),
            (false, Some(i)) => format!("{r} (image {i})"),
            (false, None) => r.to_string(),
        })
    }
}

/// The kubelet's `status.reason` for a pod it ended itself on a cluster without the
/// `DisruptionTarget` condition: node-pressure eviction (`Evicted`, the eviction manager)
/// and graceful node shutdown (`Terminated`; `Shutdown` before Kubernetes 1.22).
pub const KUBELET_DISRUPTION_REASONS: [&str; 3] = ["Evicted", "Terminated", "Shutdown"];

impl RawStatus<'_> {
    /// The largest container `restartCount` (0 when none).
    fn restarts(&self) -> u32 {
        (self.container_statuses.iter().flatten())
            .map(|c| c.restart_count.unwrap_or(0).clamp(0, u32::MAX as i64) as u32)
            .max()
            .unwrap_or(0)
    }

    /// Whether condition `kind` (`Ready`, `PodScheduled`) is `True`.
    fn condition_true(&self, kind: &str) -> bool {
        (self.conditions.iter().flatten())
            .any(|c| c.kind.as_deref() == Some(kind) && c.status.as_deref() == Some("True"))
    }

    /// Whether the `PodScheduled` condition is `False` with `reason`.
    fn scheduled_false_because(&self, reason: &str) -> bool {
        self.conditions.iter().flatten().any(|c| {
            c.kind.as_deref() == Some("PodScheduled")
                && c.status.as_deref() == Some("False")
                && c.reason.as_deref() == Some(reason)
        })
    }

    /// See [`ExecutorPod::disruption`].
    fn disruption(&self) -> Option<String> {
        let condition = self.conditions.iter().flatten().find(|c| {
            c.kind.as_deref() == Some("DisruptionTarget") && c.status.as_deref() == Some("True")
        });
        if let Some(c) = condition {
            let r = c.reason.as_deref().filter(|r| !r.is_empty());
            return Some(clip(r.unwrap_or("DisruptionTarget")).to_string());
        }
        let r = self.reason.as_deref()?;
        // The eviction manager also turns pods away at admission with reason `Evicted` (a
        // node under memory or disk pressure): no container ever started, so nothing was
        // disrupted; the step reads it as a kubelet rejection and backs off.
        if r == "Evicted" && !self.any_container_started() {
            return None;
        }
        KUBELET_DISRUPTION_REASONS
            .contains(&r)
            .then(|| r.to_string())
    }

    /// Whether any container (init containers included) is running or has terminated: the
    /// pod got past the kubelet's admission.
    fn any_container_started(&self) -> bool {
        let all = (self.container_statuses.iter().flatten())
            .chain(self.init_container_statuses.iter().flatten());
        all.into_iter().any(|c| {
            c.state
                .as_ref()
                .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
        })
    }

    /// `Evicted`, `OOMKilled exit 137`, `ImagePullBackOff`: a short why, for logs.
    fn detail(&self) -> Option<String> {
        let mut parts: Vec<String> = Vec::new();
        if let Some(r) = &self.reason {
            parts.push(r.to_string());
        }
        for cs in self.container_statuses.iter().flatten() {
            if let Some(st) = &cs.state {
                if let Some(t) = &st.terminated {
                    let reason = t.reason.as_deref().unwrap_or("terminated");
                    parts.push(format!("{reason} exit {}", t.exit_code.unwrap_or(0)));
                } else if let Some(w) = &st.waiting {
                    if let Some(r) = &w.reason {
                        parts.push(r.to_string());
                    }
                }
            }
        }
        if parts.is_empty() {
            None
        } else {
            Some(parts.join(", "))
        }
    }
}

#[derive(Deserialize, Default)]
struct RawCondition<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Str<'a>>,
    #[serde(borrow, default)]
    status: Option<Str<'a>>,
    #[serde(borrow, default)]
    reason: Option<Str<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawContainerStatus<'a> {
    #[serde(borrow, default)]
    name: Option<Str<'a>>,
    #[serde(borrow, default)]
    image: Option<Str<'a>>,
    #[serde(default)]
    restart_count: Option<i64>,
    #[serde(borrow, default)]
    state: Option<RawContainerState<'a>>,
}

#[derive(Deserialize, Default)]
struct RawContainerState<'a> {
    #[serde(borrow, default)]
    waiting: Option<RawReason<'a>>,
    #[serde(default)]
    running: Option<json::Checked>,
    #[serde(borrow, default)]
    terminated: Option<RawTerminated<'a>>,
}

#[derive(Deserialize, Default)]
struct RawReason<'a> {
    #[serde(borrow, default)]
    reason: Option<Str<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawTerminated<'a> {
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(borrow, default)]
    reason: Option<Str<'a>>,
}

/// A timestamp field (`metadata.deletionTimestamp`): any JSON value (its presence decides
/// whether the pod is terminating), checked in full; an RFC 3339 string is kept as ms since
/// the Unix epoch, anything else as `None`.
struct Stamp(Option<u64>);

impl<'de> Deserialize<'de> for Stamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Stamp;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E>(self, v: &str) -> Result<Stamp, E> {
                Ok(Stamp(rfc3339_ms(v)))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Stamp, E> {
                Ok(Stamp(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Stamp, E> {
                Ok(Stamp(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Stamp, E> {
                Ok(Stamp(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Stamp, E> {
                Ok(Stamp(None))
            }
            fn visit_unit<E>(self) -> Result<Stamp, E> {
                Ok(Stamp(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Stamp, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Stamp(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Stamp, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Stamp(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// The annotation ReplicaSet ranks scale-down by (`PodDeletionCost`, on since 1.22).
pub const ANNOTATION_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// A fixed set of keys to pick out of a JSON map of strings (labels, annotations).
trait Keys<const N: usize> {
    const KEYS: [&'static str; N];
}

/// The values of `K::KEYS` in a string map, in that order; every other entry is skipped
/// without allocating its value, and escape-free values are borrowed from the input. A key
/// that appears twice is an error (the API server never sends one; a decoder keeping the
/// first or the last would read such a pod differently from another client).
struct Picked<'a, const N: usize, K: Keys<N>>([Option<Str<'a>>; N], std::marker::PhantomData<K>);

impl<const N: usize, K: Keys<N>> Default for Picked<'_, N, K> {
    fn default() -> Self {
        Picked(std::array::from_fn(|_| None), std::marker::PhantomData)
    }
}

impl<'de: 'a, 'a, const N: usize, K: Keys<N>> Deserialize<'de> for Picked<'a, N, K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a, const N: usize, K>(std::marker::PhantomData<(&'a (), K)>);
        impl<'de: 'a, 'a, const N: usize, K: Keys<N>> Visitor<'de> for V<'a, N, K> {
            type Value = Picked<'a, N, K>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of names to string values")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Picked::default())
            }
            fn visit_map<M: MapAccess<'de>>(self, mut m: M) -> Result<Self::Value, M::Error> {
                let mut out = Picked::<N, K>::default();
                // The keys so far: the first few compared one by one, without allocating (a
                // pod has a handful of labels); the rest sorted at the end.
                let mut few: [Option<Str<'de>>; 12] = Default::default();
                let mut more: Vec<Str<'de>> = Vec::new();
                let duplicate = |key: &str| {
                    de::Error::custom(format_args!(
                        "duplicate key {:?} in a pod's labels or annotations",
                        clip(key)
                    ))
                };
                let mut n = 0;
                while let Some(key) = m.next_key::<Str<'de>>()? {
                    match K::KEYS.iter().position(|k| *k == &*key) {
                        Some(i) => out.0[i] = m.next_value::<Option<Str<'de>>>()?,
                        None => {
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                    if n < few.len() {
                        if few_before(&few[..n], &key) {
                            return Err(duplicate(&key));
                        }
                        few[n] = Some(key);
                    } else {
                        more.push(key);
                    }
                    n += 1;
                }
                if !more.is_empty() {
                    more.extend(few.into_iter().flatten());
                    more.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                    if let Some(w) = more.windows(2).find(|w| w[0].0 == w[1].0) {
                        return Err(duplicate(&w[0]));
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Whether `key` is among `seen`.
fn few_before(seen: &[Option<Str<'_>>], key: &str) -> bool {
    seen.iter().flatten().any(|k| &**k == key)
}

/// The four Spark labels.
struct LabelKeys;
impl Keys<4> for LabelKeys {
    const KEYS: [&'static str; 4] = [LABEL_APP, LABEL_ROLE, LABEL_EXEC_ID, LABEL_PROFILE];
}
type OurLabels<'a> = Picked<'a, 4, LabelKeys>;

/// The one annotation we read.
struct AnnotationKeys;
impl Keys<1> for AnnotationKeys {
    const KEYS: [&'static str; 1] = [ANNOTATION_DELETION_COST];
}
type OurAnnotations<'a> = Picked<'a, 1, AnnotationKeys>;

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, labels: &str, phase: &str, extra_meta: &str) -> String {
        format!(
            r#"{{"metadata":{{"name":"{name}","uid":"u-{name}","resourceVersion":"7","labels":{labels}{extra_meta}}},
               "spec":{{"containers":[{{"name":"c","image":"i"}}]}},"status":{{"phase":"{phase}"}}}}"#
        )
    }

    fn ours(id: &str) -> String {
        format!(
            r#"{{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"{id}","x":"y"}}"#
        )
    }

    fn list_text(items: &[String]) -> String {
        String::from_utf8(list(items)).unwrap()
    }

    fn list(items: &[String]) -> Vec<u8> {
        format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{}},"items":[{}]}}"#,
            items.join(",")
        )
        .into_bytes()
    }

    #[test]
    fn classifies_phases_and_deletion() {
        let body = list(&[
            pod("a-exec-1", &ours("1"), "Running", ""),
            pod("a-exec-2", &ours("2"), "Pending", ""),
            pod("a-exec-3", &ours("3"), "Failed", ""),
            pod("a-exec-4", &ours("4"), "Succeeded", ""),
            pod(
                "a-exec-5",
                &ours("5"),
                "Running",
                r#","deletionTimestamp":"2026-01-01T00:00:00Z""#,
            ),
            pod("a-exec-6", &ours("6"), "Unknown", ""),
        ]);
        let s = Snapshot::from_pod_list(&body, "app-1").unwrap();
        let states: Vec<_> = s.executors.values().map(|p| p.state).collect();
        use ExecutorState::*;
        assert_eq!(
            states,
            vec![Running, Pending, Failed, Succeeded, Deleted, Unknown]
        );
        assert_eq!(s.max_id(), 6);
        assert_eq!(s.executors[&1].uid, "u-a-exec-1");
        assert_eq!(s.executors[&1].resource_version, "7");
    }

    #[test]
    fn skips_foreign_and_warns_on_bad_ids() {
        let body = list(&[
            pod(
                "x",
                r#"{"spark-app-selector":"other","spark-role":"executor","spark-exec-id":"1"}"#,
                "Running",
                "",
            ),
            pod(
                "d",
                r#"{"spark-app-selector":"app-1","spark-role":"driver"}"#,
                "Running",
                "",
            ),
            pod(
                "n",
                r#"{"spark-app-selector":"app-1","spark-role":"executor"}"#,
                "Running",
                "",
            ),
            pod("b", &ours("abc"), "Running", ""),
            pod("z", &ours("0"), "Running", ""),
            pod("s", &ours("+3"), "Running", ""),
            r#"{"metadata":{"name":"nolabels"}}"#.to_string(),
            r#"{}"#.to_string(),
        ]);
        let s = Snapshot::from_pod_list(&body, "app-1").unwrap();
        assert!(s.executors.is_empty());
        assert_eq!(s.warnings.len(), 4, "{:?}", s.warnings);
        assert_eq!(s.foreign, 4);
    }

    /// Issue H3: a pod set aside for a malformed profile label (`abc`, `01`) kept no id, so
    /// a scale-up created app1-exec-57 beside hand-57, and once the label was fixed every
    /// tick failed on the duplicate id. Its id is reserved now, as a target-less profile's is.
    #[test]
    fn a_pod_set_aside_for_its_profile_label_keeps_its_id_reserved() {
        use crate::engine::alloc::{step, AllocatorState, Request, Settings};
        let labelled = |id: &str, profile: &str| {
            format!(
                r#"{{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"{id}","{LABEL_PROFILE}":"{profile}"}}"#
            )
        };
        let body = list(&[
            pod("app1-exec-1", &ours("1"), "Running", ""),
            pod("hand-57", &labelled("57", "abc"), "Running", ""),
            pod("hand-58", &labelled("58", "01"), "Running", ""),
            pod("hand-9", &labelled("9", "7"), "Running", ""),
        ]);
        let s = Snapshot::from_pod_list(&body, "app-1").unwrap();
        assert_eq!(s.executors.keys().copied().collect::<Vec<_>>(), vec![1, 9]);
        assert_eq!(s.warnings.len(), 2, "{:?}", s.warnings);
        assert!(s.warnings[0].contains("reserved"), "{:?}", s.warnings);
        assert_eq!((s.aside_max_id, s.max_id()), (58, 58));
        let p = step(
            &s,
            &AllocatorState::new(),
            &Settings::new("app-1"),
            &Request::set(3),
            0,
        )
        .unwrap();
        let made: Vec<u64> = p.create.iter().map(|c| c.executor_id).collect();
        assert_eq!(made.first(), Some(&59), "{made:?}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// Ids are never reused, whatever profile label a pod has: every id a step hands out
        /// is above every valid `spark-exec-id` in the list, the ids of pods set aside for
        /// their profile label (malformed, or a profile without a target) included.
        #[test]
        fn ids_of_pods_set_aside_are_never_handed_out(
            pods in proptest::collection::btree_map(1u64..300, 0usize..8, 0..12),
            counter in 0u64..300,
            target in 0u32..20,
        ) {
            use crate::engine::alloc::{step, AllocatorState, Request, Settings};
            let labels = [None, Some("0"), Some("1"), Some("7"), Some("abc"), Some("01"),
                Some("-1"), Some("2147483648")];
            let items: Vec<String> = pods.iter().map(|(&id, &l)| {
                let profile = labels[l]
                    .map(|v| format!(r#","{LABEL_PROFILE}":"{v}""#))
                    .unwrap_or_default();
                let labels = format!(
                    r#"{{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"{id}"{profile}}}"#
                );
                pod(&format!("p-{id}"), &labels, "Running", "")
            }).collect();
            let s = Snapshot::from_pod_list(&list(&items), "app-1").unwrap();
            let highest = pods.keys().next_back().copied().unwrap_or(0);
            proptest::prop_assert_eq!(s.max_id(), highest);
            let mut st = AllocatorState::new();
            st.last_executor_id = counter.min(highest);
            let p = step(&s, &st, &Settings::new("app-1"), &Request::set(target), 0).unwrap();
            for c in &p.create {
                proptest::prop_assert!(c.executor_id > highest, "id {} reused", c.executor_id);
            }
        }
    }

    #[test]
    fn missing_or_null_items_is_empty() {
        for body in [
            r#"{"kind":"PodList","metadata":{}}"#,
            r#"{"kind":"PodList","items":null}"#,
        ] {
            let s = Snapshot::from_pod_list(body.as_bytes(), "app-1").unwrap();
            assert!(s.executors.is_empty());
        }
    }

    #[test]
    fn malformed_and_wrong_kind_are_errors() {
        for body in [
            &br#"{"kind":"PodList","items":[{"metadata":{"name":"#[..],
            b"",
            b"[]",
            br#"{"kind":"Status","code":403}"#,
            br#"{"items":{}}"#,
            br#"{"items":[{"metadata":{"labels":["a"]}}]}"#,
        ] {
            assert!(matches!(
                Snapshot::from_pod_list(body, "app-1"),
                Err(SnapshotError::Malformed(_))
            ));
        }
    }

    #[test]
    fn duplicate_ids_are_an_error() {
        let body = list(&[
            pod("p1", &ours("4"), "Running", ""),
            pod("p2", &ours("4"), "Pending", ""),
        ]);
        let e = Snapshot::from_pod_list(&body, "app-1").unwrap_err();
        assert!(e.to_string().contains("\"p1\" and \"p2\""), "{e}");
    }

    #[test]
    fn strings_are_borrowed_unless_escaped() {
        let plain: Str<'_> = serde_json::from_str(r#""spark-exec-1""#).unwrap();
        assert!(matches!(plain.0, Cow::Borrowed("spark-exec-1")));
        let escaped: Str<'_> = serde_json::from_str(r#""spark\u002dexec""#).unwrap();
        assert!(matches!(escaped.0, Cow::Owned(ref s) if s == "spark-exec"));
        let labels: OurLabels<'_> =
            serde_json::from_str(r#"{"spark-role":"executor","x":"y","spark-exec-id":"7"}"#)
                .unwrap();
        assert!(matches!(labels.0[1], Some(Str(Cow::Borrowed("executor")))));
        assert!(matches!(labels.0[2], Some(Str(Cow::Borrowed("7")))));
        let e = serde_json::from_str::<Str<'_>>("1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected a string"), "{e}");
    }

    #[test]
    fn escaped_strings_decode() {
        let body = list(&[pod("a\\u002dexec-1", &ours("1"), "Running", "")]);
        let s = Snapshot::from_pod_list(&body, "app-1").unwrap();
        assert_eq!(s.executors[&1].name, "a-exec-1");
    }

    #[test]
    fn pages_merge_and_return_continue() {
        let mut s = Snapshot::default();
        let p1 = br#"{"kind":"PodList","metadata":{"continue":"tok"},"items":[{"metadata":{"name":"a","labels":{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"1"}},"status":{"phase":"Running"}}]}"#;
        let p2 = br#"{"kind":"PodList","metadata":{"continue":""},"items":[]}"#;
        assert_eq!(s.add_page(p1, "app-1").unwrap().as_deref(), Some("tok"));
        assert_eq!(s.add_page(p2, "app-1").unwrap(), None);
        assert_eq!(s.executors.len(), 1);
    }

    #[test]
    fn scheduled_and_detail() {
        let body = br#"{"kind":"PodList","items":[{"metadata":{"name":"a","labels":{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"1"}},
          "spec":{"nodeName":"n1"},
          "status":{"phase":"Failed","containerStatuses":[{"state":{"terminated":{"exitCode":137,"reason":"OOMKilled"}}}]}}]}"#;
        let s = Snapshot::from_pod_list(body, "app-1").unwrap();
        let p = &s.executors[&1];
        assert!(p.scheduled);
        assert_eq!(p.detail.as_deref(), Some("OOMKilled exit 137"));
    }

    /// An API answer that is not a pod list must never read as "no pods": with 5 executors
    /// running, `{}` made `reconcile --target 5` create 5 more.
    #[test]
    fn a_body_without_kind_is_not_an_empty_list() {
        for body in [
            &br#"{}"#[..],
            br#"{"items":null}"#,
            br#"{"items":[]}"#,
            br#"{"metadata":{}}"#,
            br#"{"kind":"List","items":[]}"#,
            br#"{"kind":"Pod","items":[]}"#,
        ] {
            let e = Snapshot::default()
                .add_page(body, "app-1")
                .unwrap_err()
                .to_string();
            let text = String::from_utf8_lossy(body);
            assert!(e.contains(&format!("the body begins: {text}")), "{e}");
            assert!(e.contains("expected \"PodList\""), "{e}");
        }
        // Offline (`plan --pods`): kubectl's List is a list, but only with items.
        for body in [
            &br#"{}"#[..],
            br#"{"items":null}"#,
            br#"{"kind":"List"}"#,
            br#"{"kind":"List","items":null}"#,
        ] {
            assert!(
                matches!(
                    Snapshot::from_pod_list(body, "app-1"),
                    Err(SnapshotError::Malformed(_))
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let kubectl = format!(
            r#"{{"kind":"List","apiVersion":"v1","metadata":{{"resourceVersion":""}},"items":[{}]}}"#,
            pod("a-exec-3", &ours("3"), "Running", "")
        );
        let s = Snapshot::from_pod_list(kubectl.as_bytes(), "app-1").unwrap();
        assert_eq!(s.max_id(), 3);
    }

    #[test]
    fn the_excerpt_is_one_bounded_printable_line() {
        let mut body = "{\"items\":\n\t[\x1b[31m\u{202E}".as_bytes().to_vec();
        body.extend(std::iter::repeat_n(b'x', 10_000));
        let e = Snapshot::default()
            .add_page(&body, "app-1")
            .unwrap_err()
            .to_string();
        let quoted = e.split("the body begins: ").nth(1).unwrap();
        assert!(quoted.starts_with("{\"items\":[[31m"), "{quoted}");
        assert!(
            quoted.ends_with('…') && quoted.chars().count() == 81,
            "{quoted}"
        );
        assert!(!e.chars().any(char::is_control), "{e}");
        let e = Snapshot::default()
            .add_page(b"\x00\x01", "app-1")
            .unwrap_err();
        assert!(e.to_string().contains("(nothing printable)"), "{e}");
    }

    #[test]
    fn duplicate_label_keys_are_a_bad_body() {
        for labels in [
            r#"{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"1","spark-exec-id":"2"}"#,
            r#"{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"1","x":"a","x":"b"}"#,
            r#"{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"1","spark\u002dexec-id":"1"}"#,
            // Past the first twelve keys, and a late key repeating an early one.
            r#"{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"1","a":"","b":"","c":"","d":"","e":"","f":"","g":"","h":"","i":"","j":"","k":"","j":""}"#,
            r#"{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"1","a":"","b":"","c":"","d":"","e":"","f":"","g":"","h":"","i":"","j":"","k":"","a":""}"#,
        ] {
            let body = list(&[pod("a-exec-1", labels, "Running", "")]);
            let e = Snapshot::from_pod_list(&body, "app-1").unwrap_err();
            assert!(
                matches!(&e, SnapshotError::Malformed(m) if m.contains("duplicate key")),
                "{labels}: {e}"
            );
        }
        let many: String = (0..20).map(|i| format!(r#","k{i}":"v""#)).collect();
        let labels = format!(
            r#"{{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"1"{many}}}"#
        );
        let body = list(&[pod("a-exec-1", &labels, "Running", "")]);
        assert_eq!(
            Snapshot::from_pod_list(&body, "app-1")
                .unwrap()
                .executors
                .len(),
            1
        );
    }

    /// Found by an attacker session: bodies serde_json takes are taken (a number too large
    /// for an f64 where it is not read), fields whose presence is read are checked in full,
    /// a pod's lists are capped, and a page that fails adds nothing.
    #[test]
    fn hostile_pages_found_by_an_attacker() {
        let ours = r#"{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"1"}"#;
        for (body, ok) in [
            (
                r#"{"kind":"PodList","n":1e400,"items":[]}"#.to_string(),
                true,
            ),
            (
                list_text(&[pod("a-exec-1", ours, "Running", r#","generation":1e400"#)]),
                true,
            ),
            (
                list_text(&[pod(
                    "a-exec-1",
                    ours,
                    "Running",
                    r#","deletionTimestamp":{"a" 1}"#,
                )]),
                false,
            ),
            (
                list_text(&[pod(
                    "a-exec-1",
                    ours,
                    "Running",
                    r#","deletionTimestamp":[1 2]"#,
                )]),
                false,
            ),
        ] {
            let got = Snapshot::from_pod_list(body.as_bytes(), "app-1");
            let theirs = serde_json::from_str::<serde::de::IgnoredAny>(&body);
            assert_eq!(got.is_ok(), ok, "{body}: {got:?}");
            assert_eq!(theirs.is_ok(), ok, "{body}");
        }
        let statuses = vec!["[]"; json::MAX_LIST + 1].join(",");
        let body = format!(
            r#"{{"kind":"PodList","items":[{{"metadata":{{"name":"a-exec-1","labels":{ours}}},"status":{{"phase":"Running","containerStatuses":[{statuses}]}}}}]}}"#
        );
        let e = Snapshot::from_pod_list(body.as_bytes(), "app-1").unwrap_err();
        assert!(e.to_string().contains("more than 10000"), "{e}");
        // An invalid byte after escapes is named where it is in the input.
        let e = Snapshot::from_pod_list(
            b"{\"kind\":\"PodList\",\"items\":[{\"status\":{\"phase\":\"\\u0041\xffY\"}}]}",
            "app-1",
        )
        .unwrap_err();
        let theirs = serde_json::from_slice::<serde_json::Value>(
            b"{\"kind\":\"PodList\",\"items\":[{\"status\":{\"phase\":\"\\u0041\xffY\"}}]}",
        )
        .unwrap_err();
        // serde_json's column 54 of the one line is byte 53, counted from 0.
        assert_eq!(theirs.column(), 54);
        assert!(e.to_string().contains("at byte 53"), "{e}");
        // A page with a duplicate of an earlier page's id adds none of its pods.
        let mut s = Snapshot::default();
        let one = |id: &str| {
            pod(
                &format!("a-exec-{id}"),
                &ours.replace("\"1\"}", &format!("\"{id}\"}}")),
                "Running",
                "",
            )
        };
        s.add_page(&list(&[one("1")]), "app-1").unwrap();
        let before = s.clone();
        assert!(s.add_page(&list(&[one("2"), one("1")]), "app-1").is_err());
        assert_eq!(s, before);
    }

    /// Spark's executor ids are positive longs: one pod labelled u64::MAX must not exhaust
    /// the id counter; it is ignored with a warning naming it.
    #[test]
    fn ids_outside_one_to_i64_max_are_ignored_with_a_warning() {
        let body = list(&[
            pod("big", &ours("18446744073709551615"), "Running", ""),
            pod("above", &ours("9223372036854775808"), "Running", ""),
            pod("huge", &ours("99999999999999999999999"), "Running", ""),
            pod("max", &ours("9223372036854775807"), "Running", ""),
            pod("a-exec-2", &ours("2"), "Running", ""),
        ]);
        let s = Snapshot::from_pod_list(&body, "app-1").unwrap();
        assert_eq!(
            s.executors.keys().copied().collect::<Vec<_>>(),
            vec![2, MAX_EXECUTOR_ID]
        );
        assert_eq!(s.warnings.len(), 3, "{:?}", s.warnings);
        assert!(
            s.warnings[0].contains("\"big\"")
                && s.warnings[0].contains("outside the executor id range 1..=9223372036854775807"),
            "{:?}",
            s.warnings
        );
        assert_eq!(
            parse_executor_id("9223372036854775807"),
            Some(MAX_EXECUTOR_ID)
        );
        assert_eq!(parse_executor_id("9223372036854775808"), None);
        assert_eq!(parse_executor_id("18446744073709551615"), None);
    }

    /// One executor pod with a full spec and status (sidecars, init containers).
    fn real(spec: &str, status: &str) -> Vec<u8> {
        format!(
            r#"{{"kind":"PodList","items":[{{"metadata":{{"name":"a-exec-1","labels":{}}},
               "spec":{spec},"status":{status}}}]}}"#,
            ours("1")
        )
        .into_bytes()
    }

    const TWO: &str = r#"{"nodeName":"n1","restartPolicy":"Never","containers":[
        {"name":"spark-kubernetes-executor","image":"spark:3.5"},{"name":"istio-proxy","image":"proxy:1"}]}"#;

    fn cs(name: &str, image: &str, state: &str) -> String {
        format!(
            r#"{{"name":"{name}","image":"{image}","imageID":"","ready":false,"restartCount":0,"state":{state}}}"#
        )
    }

    #[test]
    fn executor_container_exit_decides_while_a_sidecar_keeps_the_pod_running() {
        let status = format!(
            r#"{{"phase":"Running","containerStatuses":[{},{}]}}"#,
            cs(
                "spark-kubernetes-executor",
                "spark:3.5",
                r#"{"terminated":{"exitCode":52,"reason":"Error"}}"#
            ),
            cs(
                "istio-proxy",
                "proxy:1",
                r#"{"running":{"startedAt":"2026-01-01T00:00:00Z"}}"#
            )
        );
        let s = Snapshot::from_pod_list(&real(TWO, &status), "app-1").unwrap();
        let p = &s.executors[&1];
        assert_eq!(p.state, ExecutorState::Failed);
        assert_eq!(p.reason.as_deref(), Some("exit code 52"));

        // Exit 0 with the sidecar still running: Succeeded.
        let ok = status.replace(
            "\"exitCode\":52,\"reason\":\"Error\"",
            "\"exitCode\":0,\"reason\":\"Completed\"",
        );
        let s = Snapshot::from_pod_list(&real(TWO, &ok), "app-1").unwrap();
        assert_eq!(s.executors[&1].state, ExecutorState::Succeeded);

        // A sidecar that exited first (137) is not the reason when the executor exited 52.
        let both = format!(
            r#"{{"phase":"Failed","containerStatuses":[{},{}]}}"#,
            cs(
                "istio-proxy",
                "proxy:1",
                r#"{"terminated":{"exitCode":137,"reason":"Error"}}"#
            ),
            cs(
                "spark-kubernetes-executor",
                "spark:3.5",
                r#"{"terminated":{"exitCode":52,"reason":"Error"}}"#
            )
        );
        let s = Snapshot::from_pod_list(&real(TWO, &both), "app-1").unwrap();
        assert_eq!(s.executors[&1].reason.as_deref(), Some("exit code 52"));

        // --executor-container names another container: the sidecar's state decides.
        let s =
            Snapshot::from_pod_list_for(&real(TWO, &status), "app-1", Some("istio-proxy")).unwrap();
        assert_eq!(s.executors[&1].state, ExecutorState::Running);
    }

    #[test]
    fn a_running_executor_with_a_terminated_sidecar_is_running() {
        let status = format!(
            r#"{{"phase":"Running","containerStatuses":[{},{}]}}"#,
            cs(
                "spark-kubernetes-executor",
                "spark:3.5",
                r#"{"running":{}}"#
            ),
            cs(
                "istio-proxy",
                "proxy:1",
                r#"{"terminated":{"exitCode":1,"reason":"Error"}}"#
            )
        );
        let s = Snapshot::from_pod_list(&real(TWO, &status), "app-1").unwrap();
        assert_eq!(s.executors[&1].state, ExecutorState::Running);
        assert_eq!(s.executors[&1].waiting, None);
    }

    #[test]
    fn native_sidecars_are_not_init_steps() {
        let spec = r#"{"nodeName":"n1","initContainers":[
            {"name":"setup","image":"busybox"},
            {"name":"log-shipper","image":"fluent:2","restartPolicy":"Always"}],
            "containers":[{"name":"executor","image":"spark:3.5"}]}"#;
        // Pod failed (e.g. a deadline) before the executor ran; the native sidecar was killed
        // (137) — the reason is the init step's failure, never the sidecar's.
        let status = format!(
            r#"{{"phase":"Failed","initContainerStatuses":[{},{}],"containerStatuses":[{}]}}"#,
            cs(
                "log-shipper",
                "fluent:2",
                r#"{"terminated":{"exitCode":137,"reason":"Error"}}"#
            ),
            cs(
                "setup",
                "busybox",
                r#"{"terminated":{"exitCode":3,"reason":"Error"}}"#
            ),
            cs(
                "executor",
                "spark:3.5",
                r#"{"waiting":{"reason":"PodInitializing"}}"#
            )
        );
        let s = Snapshot::from_pod_list(&real(spec, &status), "app-1").unwrap();
        assert_eq!(s.executors[&1].reason.as_deref(), Some("exit code 3"));
        // Executor exited 0; the native sidecar was stopped with 143 afterwards: Succeeded.
        let status = format!(
            r#"{{"phase":"Succeeded","initContainerStatuses":[{},{}],"containerStatuses":[{}]}}"#,
            cs(
                "setup",
                "busybox",
                r#"{"terminated":{"exitCode":0,"reason":"Completed"}}"#
            ),
            cs(
                "log-shipper",
                "fluent:2",
                r#"{"terminated":{"exitCode":143,"reason":"Error"}}"#
            ),
            cs(
                "executor",
                "spark:3.5",
                r#"{"terminated":{"exitCode":0,"reason":"Completed"}}"#
            )
        );
        let s = Snapshot::from_pod_list(&real(spec, &status), "app-1").unwrap();
        assert_eq!(s.executors[&1].state, ExecutorState::Succeeded);
    }

    #[test]
    fn waiting_names_the_image_and_init_containers_count() {
        let spec = r#"{"nodeName":"n1","initContainers":[{"name":"fetch","image":"registry.example/fetch:bad"}],
            "containers":[{"name":"executor","image":"spark:3.5"}]}"#;
        let status = format!(
            r#"{{"phase":"Pending","initContainerStatuses":[{}],"containerStatuses":[{}]}}"#,
            cs(
                "fetch",
                "registry.example/fetch:bad",
                r#"{"waiting":{"reason":"ImagePullBackOff","message":"Back-off pulling image"}}"#
            ),
            cs(
                "executor",
                "spark:3.5",
                r#"{"waiting":{"reason":"PodInitializing"}}"#
            )
        );
        let s = Snapshot::from_pod_list(&real(spec, &status), "app-1").unwrap();
        let p = &s.executors[&1];
        assert_eq!(
            p.waiting.as_deref(),
            Some("ImagePullBackOff (init container fetch, image registry.example/fetch:bad)")
        );
        assert_eq!(p.waiting_in(&["ImagePullBackOff"]), p.waiting.as_deref());
        assert_eq!(p.waiting_in(&["ErrImagePull"]), None);

        let status = format!(
            r#"{{"phase":"Pending","containerStatuses":[{}]}}"#,
            cs(
                "executor",
                "registry.example/spark:bad",
                r#"{"waiting":{"reason":"ErrImagePull"}}"#
            )
        );
        let s = Snapshot::from_pod_list(&real(TWO, &status), "app-1").unwrap();
        assert_eq!(
            s.executors[&1].waiting.as_deref(),
            Some("ErrImagePull (image registry.example/spark:bad)")
        );

        let status = format!(
            r#"{{"phase":"Pending","containerStatuses":[{},{}]}}"#,
            cs(
                "spark-kubernetes-executor",
                "spark:3.5",
                r#"{"waiting":{"reason":"ContainerCreating"}}"#
            ),
            cs(
                "istio-proxy",
                "proxy:1",
                r#"{"waiting":{"reason":"ContainerCreating"}}"#
            )
        );
        let s = Snapshot::from_pod_list(&real(TWO, &status), "app-1").unwrap();
        assert_eq!(
            s.executors[&1].waiting.as_deref(),
            Some("ContainerCreating (image spark:3.5)")
        );
    }

    /// One executor pod with `meta` (extra metadata fields), `spec` and `status`.
    fn with_meta(meta: &str, spec: &str, status: &str) -> Vec<u8> {
        format!(
            r#"{{"kind":"PodList","items":[{{"metadata":{{"name":"a-exec-1",{meta}"labels":{}}},
               "spec":{spec},"status":{status}}}]}}"#,
            ours("1")
        )
        .into_bytes()
    }

    #[test]
    fn a_pod_without_a_phase_is_pending_not_unknown() {
        for status in [r#"{}"#, r#"{"phase":""}"#, r#"{"phase":null}"#] {
            let s = Snapshot::from_pod_list(&real(TWO, status), "app-1").unwrap();
            assert_eq!(s.executors[&1].state, ExecutorState::Pending, "{status}");
        }
        let s = Snapshot::from_pod_list(&real(TWO, r#"{"phase":"Lost"}"#), "app-1").unwrap();
        assert_eq!(s.executors[&1].state, ExecutorState::Unknown);
    }

    #[test]
    fn scheduling_gates_and_the_scheduling_gated_reason_mark_a_gated_pod() {
        let gates = r#"{"schedulingGates":[{"name":"kueue.x-k8s.io/admission"}],"containers":[]}"#;
        let s = Snapshot::from_pod_list(&real(gates, r#"{"phase":"Pending"}"#), "app-1").unwrap();
        assert!(s.executors[&1].gated);
        let cond = r#"{"phase":"Pending","conditions":[{"type":"PodScheduled","status":"False","reason":"SchedulingGated"}]}"#;
        let s = Snapshot::from_pod_list(&real("{}", cond), "app-1").unwrap();
        assert!(s.executors[&1].gated && !s.executors[&1].unschedulable);
        let none = r#"{"schedulingGates":[],"containers":[]}"#;
        let s = Snapshot::from_pod_list(&real(none, r#"{"phase":"Pending"}"#), "app-1").unwrap();
        assert!(!s.executors[&1].gated);
    }

    #[test]
    fn disruption_target_or_a_kubelet_eviction_reason_is_a_disruption() {
        let failed = |extra: &str| {
            format!(
                r#"{{"phase":"Failed"{extra},"containerStatuses":[{}]}}"#,
                cs(
                    "spark-kubernetes-executor",
                    "spark:3.5",
                    r#"{"terminated":{"exitCode":137,"reason":"Error"}}"#
                )
            )
        };
        let cases = [
            (
                r#","conditions":[{"type":"DisruptionTarget","status":"True","reason":"PreemptionByScheduler"}]"#,
                Some("PreemptionByScheduler"),
            ),
            (
                r#","conditions":[{"type":"DisruptionTarget","status":"False","reason":"PreemptionByScheduler"}]"#,
                None,
            ),
            (r#","reason":"Evicted""#, Some("Evicted")),
            // Turned away at admission by the eviction manager: see the next test.
            (r#","reason":"Terminated""#, Some("Terminated")),
            (r#","reason":"DeadlineExceeded""#, None),
            ("", None),
        ];
        for (extra, want) in cases {
            let s = Snapshot::from_pod_list(&real(TWO, &failed(extra)), "app-1").unwrap();
            assert_eq!(s.executors[&1].state, ExecutorState::Failed);
            assert_eq!(s.executors[&1].disruption.as_deref(), want, "{extra}");
        }
    }

    #[test]
    fn an_evicted_pod_whose_containers_never_started_is_no_disruption() {
        // The kubelet's eviction manager admits no pod on a node under pressure: phase
        // Failed, reason Evicted, no container state (kubelet `rejectPod`).
        let s = Snapshot::from_pod_list(
            &real(TWO, r#"{"phase":"Failed","reason":"Evicted","message":"The node had condition: [MemoryPressure]. "}"#),
            "app-1",
        )
        .unwrap();
        let p = &s.executors[&1];
        assert_eq!(
            (p.state, p.disruption.as_deref()),
            (ExecutorState::Failed, None)
        );
        assert_eq!(p.reason.as_deref(), Some("Evicted"));
        assert!(crate::engine::alloc::is_kubelet_rejection("Evicted"));
    }

    #[test]
    fn a_terminating_pod_counts_as_quota_charges_it() {
        let meta = r#""deletionTimestamp":"2026-01-01T01:00:00Z","deletionGracePeriodSeconds":30,"#;
        let at = 1_767_229_200_000u64;
        let s = Snapshot::from_pod_list(&with_meta(meta, TWO, r#"{"phase":"Running"}"#), "app-1")
            .unwrap();
        let p = &s.executors[&1];
        assert_eq!(p.state, ExecutorState::Deleted);
        assert_eq!(
            (p.deletion_ms, p.deletion_grace_ms),
            (Some(at), Some(30_000))
        );
        assert_eq!(p.deleted_at_ms(), Some(at - 30_000));
        assert!(p.terminating_counts(at + 30_000));
        assert!(
            !p.terminating_counts(at + 30_001),
            "past deletionTimestamp + grace"
        );
        let s = Snapshot::from_pod_list(&with_meta(meta, TWO, r#"{"phase":"Failed"}"#), "app-1")
            .unwrap();
        assert!(s.executors[&1].terminal_phase);
        assert!(
            !s.executors[&1].terminating_counts(at),
            "a Failed pod never counts"
        );
        // Without a grace period (not sent by the API server) it counts until gone, as quota.
        let odd = r#""deletionTimestamp":{"not":"a time"},"#;
        let s = Snapshot::from_pod_list(&with_meta(odd, TWO, r#"{"phase":"Running"}"#), "app-1")
            .unwrap();
        assert_eq!(s.executors[&1].state, ExecutorState::Deleted);
        assert!(s.executors[&1].terminating_counts(u64::MAX));
        assert!(!ExecutorPod::example(2, ExecutorState::Running).terminating_counts(0));
    }
}
