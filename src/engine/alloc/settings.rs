//! Allocation settings: Spark's allocation knobs and podalloc's opt-in policies. Durations
//! are milliseconds.

/// The largest target (executors) accepted anywhere: flags, apps files, state files.
pub const MAX_TARGET: u32 = 1_000_000;

/// Default batch size (Spark's `spark.kubernetes.allocation.batch.size`): pods per batch.
pub const DEFAULT_BATCH_SIZE: u32 = 5;
/// Default batch delay (Spark's `spark.kubernetes.allocation.batch.delay`): 1 s, in ms.
pub const DEFAULT_BATCH_DELAY_MS: u64 = 1000;
/// Floor of the default creation timeout (Spark 3.0: `max(batch delay × 5, 60000)`), in ms.
pub const MIN_CREATION_TIMEOUT_MS: u64 = 60_000;

/// Allocation settings. Durations are milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Pods created per tick at most (≥ 1).
    pub batch_size: u32,
    /// Time between ticks, ms; also sets the default creation timeout.
    pub batch_delay_ms: u64,
    /// How long a created pod may stay unseen before it is deleted and replaced, ms.
    /// `None`: max(5 × batch delay, [`Settings::creation_timeout_floor_ms`]), as Spark.
    pub creation_timeout_ms: Option<u64>,
    /// The floor of the default creation timeout, ms: 60 s as Spark 3.0, 600 s as Spark 3.1+
    /// (`spark.kubernetes.allocation.executor.timeout`, SPARK-33231).
    pub creation_timeout_floor_ms: u64,
    /// Delete Failed/Succeeded executor pods (default true, as Spark's
    /// `spark.kubernetes.executor.deleteOnTermination`).
    pub delete_terminated: bool,
    /// The pod name prefix (see [`crate::engine::podspec::name_prefix`]).
    pub name_prefix: String,
    /// The executor container (`--executor-container`): the container whose termination ends
    /// the executor, whatever its sidecars do (see [`crate::engine::snapshot`]). `None`: each pod's
    /// first container in `spec.containers` (for pods podalloc creates, the template's first).
    pub executor_container: Option<String>,
    /// Opt-in policies beyond Spark 3.0's (all off by default).
    pub policies: Policies,
    /// A fingerprint of the pod template in use ([`crate::engine::podspec::PodTemplate::fingerprint`];
    /// `None`: none given). A back-off set by refused creates ends when it changes: the
    /// refusal was about another template.
    pub template_fingerprint: Option<String>,
}

/// Allocation policies beyond Spark 3.0's allocator. All off by default but the failure
/// limit ([`Policies::max_failures`], on as in Spark 3.5): Spark 3.0's behaviour and the
/// conformance corpus are unchanged unless one is set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policies {
    /// Spark's `spark.kubernetes.allocation.maxPendingPods` (SPARK-33262, SPARK-36052):
    /// pending pods no longer block; a new batch is allowed once every earlier request was
    /// seen, sized min(target − known, batch size, max_pending − pending).
    pub max_pending: Option<u32>,
    /// Adaptive batches (`--batch-size auto`) up to this cap: the batch doubles after a batch
    /// whose pods were all seen with none newly unschedulable, and halves after throttling
    /// (429/5xx/quota, reported by the tick) or when a pod turns Unschedulable (once per pod,
    /// not on every tick it waits; see [`crate::engine::alloc::AdaptiveState::unschedulable_seen`]).
    pub adaptive_max_batch: Option<u32>,
    /// Crash-loop guard (Spark 3.5's `spark.executor.maxNumFailures`, SPARK-41210): more
    /// than this many executor failures within [`Policies::failure_window_ms`] stop all
    /// creation ([`crate::engine::alloc::Plan::halt`]). On by default, as in Spark 3.5:
    /// twice the target, at least 3 ([`FailureLimit::TwiceTarget`]).
    pub max_failures: FailureLimit,
    /// The crash-loop guard's window, ms (default 10 minutes).
    pub failure_window_ms: u64,
    /// A pod waiting (in an init container or a container) in one of [`STUCK_REASONS`] (the
    /// kubelet's permanent start-up errors, CrashLoopBackOff, or — once scheduled —
    /// ContainerCreating or PodInitializing) longer than this (ms) counts as a failure:
    /// deleted once (reason `stuck`) and counted by the guard. Unschedulable alone is not a
    /// failure.
    pub startup_grace_ms: Option<u64>,
    /// Also delete running executors above the target (off by default, as Spark), lowest
    /// pod-deletion-cost first, then most restarts, then newest.
    pub scale_down_running: bool,
    /// Remove running executors (`remove`, and excess under `scale_down_running`) through
    /// the Eviction API instead of a plain delete, so the PodDisruptionBudgets that cover
    /// them apply (`--evict`; off by default, as Spark deletes): each such delete is
    /// [`crate::engine::alloc::Delete::evict`]. A budget's refusal is "not now"
    /// ([`crate::engine::alloc::Outcomes::not_now`]).
    pub evict: bool,
    /// Spark 3.1+'s excess rule (SPARK-33099, SPARK-34334): unacknowledged requests and
    /// pending pods are deleted as excess only once older than this, ms (Spark's
    /// `spark.dynamicAllocation.executorIdleTimeout`), oldest first. `None`: Spark 3.0's rule
    /// (any age, newest first).
    pub executor_idle_timeout_ms: Option<u64>,
    /// Pods being deleted (`deletionTimestamp` set) keep counting toward the target until
    /// they are gone (off by default, as Spark), so a namespace under a pod-count
    /// ResourceQuota never holds more executor pods than the target during replacements.
    pub count_terminating: bool,
    /// How long a pod may stay in phase Unknown (its node stopped reporting) before it is
    /// lost: deleted (reason `lost`) and replaced, ms (`--unknown-timeout`). Until then it
    /// counts toward the target, as the ReplicaSet controller counts it (`IsPodActive`:
    /// only Succeeded, Failed and terminating pods are inactive). `None`:
    /// [`DEFAULT_UNKNOWN_TIMEOUT_MS`].
    pub unknown_timeout_ms: Option<u64>,
    /// Slow-start within a tick (`--batch-size slow-start`), as Kubernetes' ReplicaSet
    /// controller creates its pods: the batch is sent in groups of 1, 2, 4, … back to back,
    /// stopping at the first error, throttling or quota signal ([`crate::engine::alloc::Plan::create_groups`]);
    /// the batch cap adapts across ticks as `adaptive_max_batch` does.
    pub slow_start: bool,
}

/// How many executor failures within the window stop creation ([`Policies::max_failures`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailureLimit {
    /// No limit (`--max-failures 0`).
    Off,
    /// More than this many failures halt creation (`--max-failures N`).
    Max(u32),
    /// Spark 3.5's default for `spark.executor.maxNumFailures`
    /// (`YarnSparkHadoopUtil`/`ExecutorFailureTracker`: max(2 × executors, 3)): twice the
    /// target, at least 3, following the target as it changes.
    #[default]
    TwiceTarget,
}

impl FailureLimit {
    /// The limit for `target` executors (`None`: off).
    pub fn limit(self, target: u32) -> Option<u32> {
        match self {
            FailureLimit::Off => None,
            FailureLimit::Max(n) => Some(n),
            FailureLimit::TwiceTarget => Some(target.saturating_mul(2).max(3)),
        }
    }
}

/// Default crash-loop guard window: 10 minutes, in ms.
pub const DEFAULT_FAILURE_WINDOW_MS: u64 = 600_000;

/// Default [`Policies::unknown_timeout_ms`]: 5 minutes, the `tolerationSeconds` the
/// `DefaultTolerationSeconds` admission plugin gives every pod for the
/// `node.kubernetes.io/unreachable` and `not-ready` taints (after it, a real cluster's taint
/// manager evicts the pod too).
pub const DEFAULT_UNKNOWN_TIMEOUT_MS: u64 = 300_000;

/// Waiting reasons that mean a pod will not start by itself (see [`Policies::startup_grace_ms`]),
/// in an init container or a container: every waiting reason the kubelet sets for a start-up
/// error that retrying does not fix (`pkg/kubelet/images/types.go`,
/// `pkg/kubelet/container/sync_result.go`, `pkg/kubelet/kuberuntime/kuberuntime_container.go`;
/// `docs/semantics.md` lists every waiting reason and why it is or is not here), and a
/// scheduled pod still setting up (a volume that never mounts, a sandbox that never starts)
/// after the grace.
pub const STUCK_REASONS: &[&str] = &[
    // images (pkg/kubelet/images/types.go)
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "ImageInspectError",
    "RegistryUnavailable",
    "SignatureValidationFailed",
    // containers (kuberuntime_container.go, sync_result.go)
    "CreateContainerConfigError",
    "CreateContainerError",
    "PreCreateHookError",
    "PreStartHookError",
    "PostStartHookError",
    "RunContainerError",
    "RunInitContainerError",
    "VerifyNonRootError",
    "CrashLoopBackOff",
    // still setting up once scheduled (kubelet_pods.go)
    "ContainerCreating",
    "PodInitializing",
];

/// `status.reason`s the kubelet writes on a pod it rejects at admission (phase Failed, no
/// container ever started): resources the node lacks (`OutOf` + the resource, e.g.
/// `OutOfcpu`, `OutOfmemory`, `OutOfpods`, `OutOfnvidia.com/gpu`; `pkg/kubelet/lifecycle`'s
/// `InsufficientResourceError`), and the predicate, topology and OS checks
/// (`pkg/kubelet/lifecycle/predicate.go`, `pkg/kubelet/cm/topologymanager`). Such pods are
/// failures for the guard, and each sets the creation back-off ([`crate::engine::alloc::Backoff`]):
/// their replacements would meet the same node.
pub const KUBELET_REJECTIONS: &[&str] = &[
    "NodeAffinity",
    "NodeName",
    "NodePorts",
    "NodeSelectorMismatching",
    "InvalidNodeInfo",
    "UnexpectedAdmissionError",
    "TopologyAffinityError",
    "SMTAlignmentError",
    "PodOSNotSupported",
    "PodOSSelectorNodeLabelDoesNotMatch",
];

/// Whether a Failed pod's `reason` is a kubelet admission rejection ([`KUBELET_REJECTIONS`],
/// `OutOf` followed by a resource name, or `Evicted`: the eviction manager's admission on a
/// node under pressure). Asked only of a pod that is no disruption: a pod evicted after it
/// ran is one (the snapshot's `disruption`), replaced without a back-off.
pub fn is_kubelet_rejection(reason: &str) -> bool {
    reason.strip_prefix("OutOf").is_some_and(|r| !r.is_empty())
        || KUBELET_REJECTIONS.contains(&reason)
        || reason == "Evicted"
}

impl Settings {
    /// Settings with Spark's defaults for pods named after `name_prefix`.
    pub fn new(name_prefix: impl Into<String>) -> Settings {
        Settings {
            batch_size: DEFAULT_BATCH_SIZE,
            batch_delay_ms: DEFAULT_BATCH_DELAY_MS,
            creation_timeout_ms: None,
            creation_timeout_floor_ms: MIN_CREATION_TIMEOUT_MS,
            delete_terminated: true,
            name_prefix: name_prefix.into(),
            executor_container: None,
            template_fingerprint: None,
            policies: Policies {
                failure_window_ms: DEFAULT_FAILURE_WINDOW_MS,
                ..Policies::default()
            },
        }
    }

    /// The Unknown-phase timeout in effect, ms (see [`Policies::unknown_timeout_ms`]).
    pub fn unknown_timeout(&self) -> u64 {
        (self.policies.unknown_timeout_ms).unwrap_or(DEFAULT_UNKNOWN_TIMEOUT_MS)
    }

    /// The creation timeout in effect, ms: the configured one, else
    /// max(5 × batch delay, the floor) (Spark's `podCreationTimeout`).
    pub fn creation_timeout(&self) -> u64 {
        self.creation_timeout_ms.unwrap_or_else(|| {
            self.batch_delay_ms
                .saturating_mul(5)
                .max(self.creation_timeout_floor_ms)
        })
    }
}

/// Floor of the default creation timeout under Spark 3.1+'s policy (SPARK-33231:
/// `spark.kubernetes.allocation.executor.timeout`, 600 s), in ms.
pub const SPARK3X_CREATION_TIMEOUT_MS: u64 = 600_000;
/// Default executor idle timeout (Spark's `spark.dynamicAllocation.executorIdleTimeout`,
/// 60 s), in ms.
pub const DEFAULT_EXECUTOR_IDLE_TIMEOUT_MS: u64 = 60_000;
