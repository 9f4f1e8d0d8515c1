//! Leader election over a `coordination.k8s.io/v1` Lease, with the semantics of client-go's
//! `tools/leaderelection` package (`LeaderElector.tryAcquireOrRenew`, the renew deadline,
//! `ReleaseOnCancel`), so that several `podalloc run --leader-elect` replicas act one at a
//! time.
//!
//! Two halves, in the sans-IO style of `crate::engine::alloc`:
//! - [`Elector`], the pure core: fed the Lease it read (or its absence) and the time, it says
//!   which write to make ([`Write`]) and whether this process leads. It reads no clock and
//!   makes no call; time comes in as a monotonic `Duration` since any fixed origin, plus the
//!   wall time (ms since the Unix epoch) to stamp `acquireTime` / `renewTime`.
//! - [`LeaderElection`], the thin shell, driven by the loop ([`LeaderElection::tick`], no
//!   thread): every retry period it GETs the Lease, asks the core, and makes the create or
//!   update; it releases the Lease when stopped.
//!   A leader first tries client-go's fast path: it updates the Lease it last wrote without
//!   reading it ([`Elector::fast_renew`]), and reads only when that fails.
//!
//! The rules, as client-go has them:
//! - A missing Lease is created with us as holder. An existing one may be taken over when its
//!   `holderIdentity` is empty (released) or when it has not changed for
//!   `leaseDurationSeconds` *as measured by our own clock since we last saw it change*
//!   (client-go's `observedTime`): clocks of different machines are never compared.
//! - Every write carries the `resourceVersion` read, so of two candidates racing for the same
//!   expired Lease the API server accepts one and answers the other 409 Conflict (or 409
//!   AlreadyExists for two creates).
//! - `leaseTransitions` counts changes of holder; `acquireTime` is kept while we renew.
//! - Fencing: we lead only while our last successful acquire or renew *started* less than
//!   the renew deadline ago. Since the renew deadline is shorter than the lease duration,
//!   and every other candidate measures the lease duration from a moment no earlier than
//!   that start, we stop acting before anyone else may take the Lease over.
//! - Released (`ReleaseOnCancel`): on shutdown a leader writes the Lease with an empty
//!   holder (and `leaseDurationSeconds: 1`), so a standby takes it at its next retry.
//! - Timing is validated as `NewLeaderElector` does: lease duration > renew deadline >
//!   retry period × 1.2 (the jitter factor), all greater than zero (the lease duration at
//!   least 1 s, since the Lease holds whole seconds).

use crate::sync::lock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use log::{debug, info, warn};
use serde_json::{json, Value};

use crate::kube::{Api, KubeClient, KubeError, PostParams, LEASES};

/// client-go's `JitterFactor`: a candidate that does not lead waits between one and
/// 1 + 1.2 retry periods between attempts, and the renew deadline must exceed
/// 1.2 retry periods.
pub(crate) const JITTER_FACTOR: f64 = 1.2;

/// client-go's defaults (kube-controller-manager's `--leader-elect-*` flags).
pub(crate) const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// See [`DEFAULT_LEASE_DURATION`].
pub(crate) const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// See [`DEFAULT_LEASE_DURATION`].
pub(crate) const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The longest duration a leader-election flag may give (one day): the clock arithmetic
/// on them can never overflow.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(86_400);

/// The three durations of leader election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timing {
    /// How long a Lease that stopped changing keeps others out (written to the Lease in
    /// whole seconds, truncated, as client-go does).
    pub lease_duration: Duration,
    /// How long a leader keeps acting after the start of its last successful renew.
    pub renew_deadline: Duration,
    /// Time between attempts.
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
        }
    }
}

impl Timing {
    /// The Lease's `leaseDurationSeconds`.
    pub(crate) fn lease_seconds(&self) -> u64 {
        self.lease_duration.as_secs()
    }

    /// Checks the durations as client-go's `NewLeaderElector` does. Errors: a message naming
    /// the flags.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if [self.lease_duration, self.renew_deadline, self.retry_period]
            .iter()
            .any(|d| *d > MAX_DURATION)
        {
            return Err(format!(
                "--leader-elect-lease-duration, --leader-elect-renew-deadline and \
                 --leader-elect-retry-period must be at most {}",
                humantime::format_duration(MAX_DURATION)
            ));
        }
        let lease = Duration::from_secs(self.lease_seconds());
        if lease.is_zero() {
            return Err("--leader-elect-lease-duration must be at least 1s".into());
        }
        if self.renew_deadline.is_zero() || self.retry_period.is_zero() {
            return Err(
                "--leader-elect-renew-deadline and --leader-elect-retry-period must be greater than zero"
                    .into(),
            );
        }
        if lease <= self.renew_deadline {
            return Err(format!(
                "--leader-elect-lease-duration ({}, in whole seconds) must be greater than \
                 --leader-elect-renew-deadline ({})",
                humantime::format_duration(lease),
                humantime::format_duration(self.renew_deadline)
            ));
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * JITTER_FACTOR {
            return Err(format!(
                "--leader-elect-renew-deadline ({}) must be greater than \
                 --leader-elect-retry-period ({}) × {JITTER_FACTOR}",
                humantime::format_duration(self.renew_deadline),
                humantime::format_duration(self.retry_period)
            ));
        }
        Ok(())
    }
}

/// The spec of a Lease as leader election reads and writes it (client-go's
/// `LeaderElectionRecord`). Times are `MicroTime` strings (RFC 3339 with microseconds).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LeaseRecord {
    /// `spec.holderIdentity`; empty: nobody holds it.
    pub holder_identity: String,
    /// `spec.leaseDurationSeconds` in seconds; 0 when absent or out of the API's range
    /// (1 ..= 2³¹−1, an `int32` greater than zero).
    pub lease_duration_seconds: u64,
    /// `spec.acquireTime`.
    pub acquire_time: String,
    /// `spec.renewTime`.
    pub renew_time: String,
    /// `spec.leaseTransitions`.
    pub lease_transitions: u64,
    /// The [`HOME`] annotation: where the holder keeps the app's intent and state, when it
    /// says (`None`: a Lease written by an older podalloc, by `apps`, or released).
    pub home: Option<String>,
}

/// The annotation a `run --leader-elect` holder writes on acquire and keeps on every
/// renewal, naming the home it uses: `executorset/NAME`, `configmap/NAME` or `file` (its
/// host's state file). Commands read it to find the leader's home
/// (`crate::commands::home`); a release drops it with the holder.
pub(crate) const HOME: &str = "podalloc.io/home";

/// The annotation a release writes (`ReleaseOnCancel`), naming the identity that gave the
/// Lease up. Only a Lease with an empty holder *and* this mark counts as released: a holder
/// emptied by hand (`kubectl edit`) is not a release, since the leader it names may still
/// be acting.
pub(crate) const RELEASED_BY: &str = "podalloc.io/released-by";

/// The largest `int32`, the API's bound on `leaseDurationSeconds` and `leaseTransitions`.
const INT32_MAX: u64 = i32::MAX as u64;

/// A Lease as read: its record and `metadata.resourceVersion`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    /// The spec.
    pub record: LeaseRecord,
    /// `metadata.resourceVersion`, sent back with the next update.
    pub resource_version: String,
    /// Some spec field did not read as the API types it (`holderIdentity` not a string, a
    /// duration or count not an `int32` in range). Such a Lease is never ours and never
    /// released: it is held by someone unknown, for our own lease duration.
    pub unreadable: bool,
    /// The [`RELEASED_BY`] annotation, when present.
    pub released_by: Option<String>,
}

impl Observed {
    /// Reads a Lease object. Missing fields are empty or 0; every number is bounded to the
    /// API's `int32` range (anything else, such as 2⁶⁴−1 or −1, is 0 and marks the Lease
    /// [`Observed::unreadable`]), so no duration read from the API can overflow.
    pub(crate) fn from_lease(v: &Value) -> Observed {
        let spec = &v["spec"];
        let mut unreadable = false;
        let mut s = |k: &str| match &spec[k] {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            _ => {
                unreadable = true;
                String::new()
            }
        };
        let (holder, acquire, renew) = (s("holderIdentity"), s("acquireTime"), s("renewTime"));
        let mut n = |k: &str, min: u64| match &spec[k] {
            Value::Null => 0,
            x => match x.as_u64().filter(|n| (min..=INT32_MAX).contains(n)) {
                Some(n) => n,
                None => {
                    unreadable = true;
                    0
                }
            },
        };
        let record = LeaseRecord {
            holder_identity: holder,
            lease_duration_seconds: n("leaseDurationSeconds", 1),
            acquire_time: acquire,
            renew_time: renew,
            lease_transitions: n("leaseTransitions", 0),
            home: annotation(v, HOME),
        };
        let released_by = annotation(v, RELEASED_BY);
        Observed {
            record,
            resource_version: v["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            unreadable,
            released_by,
        }
    }

    /// Whether this Lease was given up by its holder ([`RELEASED_BY`], empty holder, every
    /// field readable).
    fn released(&self) -> bool {
        !self.unreadable && self.record.holder_identity.is_empty() && self.released_by.is_some()
    }

    /// Whether this Lease names `identity` as its holder (and reads).
    fn names(&self, identity: &str) -> bool {
        !self.unreadable && self.record.holder_identity == identity
    }
}

/// Annotation `key` of object `v`, when it is a string.
fn annotation(v: &Value, key: &str) -> Option<String> {
    v["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_string)
}

impl LeaseRecord {
    /// The Lease object `name` carrying this record; `resource_version` makes an update
    /// conditional. Empty time fields are left out (they are optional in the API).
    pub(crate) fn to_lease(&self, name: &str, resource_version: Option<&str>) -> Value {
        let mut spec = json!({
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.lease_transitions,
        });
        for (k, v) in [
            ("acquireTime", &self.acquire_time),
            ("renewTime", &self.renew_time),
        ] {
            if !v.is_empty() {
                spec[k] = json!(v);
            }
        }
        let mut lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "podalloc"}},
            "spec": spec,
        });
        if let Some(rv) = resource_version {
            lease["metadata"]["resourceVersion"] = json!(rv);
        }
        if let Some(home) = &self.home {
            lease["metadata"]["annotations"] = json!({ HOME: home });
        }
        lease
    }
}

/// The write the core asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// No Lease exists: create it with this record.
    Create(LeaseRecord),
    /// Update the Lease with this record, conditional on `resource_version`.
    Update {
        /// The new spec.
        record: LeaseRecord,
        /// The version read; a newer one on the server makes the update a 409 Conflict.
        resource_version: String,
    },
}

impl Write {
    /// The Lease object to send for Lease `name`; `released_by` adds the [`RELEASED_BY`]
    /// mark (only [`Elector::release`]'s write has it).
    pub(crate) fn to_lease(&self, name: &str, released_by: Option<&str>) -> Value {
        let mut v = match self {
            Write::Create(r) => r.to_lease(name, None),
            Write::Update {
                record,
                resource_version,
            } => record.to_lease(name, Some(resource_version)),
        };
        if let Some(who) = released_by {
            v["metadata"]["annotations"][RELEASED_BY] = json!(who);
        }
        v
    }
}

/// `MicroTime` of a wall-clock time in ms since the Unix epoch: `2024-05-01T10:00:00.123000Z`.
pub(crate) fn micro_time(wall_ms: u64) -> String {
    let t = UNIX_EPOCH
        .checked_add(Duration::from_millis(wall_ms))
        .unwrap_or(UNIX_EPOCH);
    humantime::format_rfc3339_micros(t).to_string()
}

/// The pure election state of one candidate.
///
/// The safety rule, stronger than client-go's: no two identities ever act at overlapping
/// times, whatever is done to the Lease object (deleted, holder edited, `renewTime` moved,
/// a field made unreadable). A leader acts only while the Lease names it *and* its last
/// confirmed acquire or renew started less than the renew deadline ago; it stops at once
/// when a read shows the Lease gone or naming someone else. Every other Lease state
/// (missing, held by another, named us without our confirmed write, emptied by hand,
/// unreadable) is taken over only once it has not changed, by our own clock, for our lease
/// duration or its `leaseDurationSeconds`, whichever is longer. The old leader's last renew
/// started before we first saw that state, so its renew deadline (shorter than the lease
/// duration) ended before we act. Only a release ([`RELEASED_BY`]) is taken at once: its
/// writer stopped acting before it wrote it.
#[derive(Clone, Debug)]
pub(crate) struct Elector {
    identity: String,
    timing: Timing,
    /// The last Lease read or written; `None`: none read yet, or the last read was a 404.
    observed: Option<Observed>,
    /// Whether any read was made (a first 404 is then a change, as a first Lease is).
    seen: bool,
    /// When (our monotonic clock) what we read last changed, a 404 included.
    observed_at: Duration,
    /// When our last confirmed acquire or renew started.
    renewed_at: Option<Duration>,
    /// Claim mode ([`Elector::claiming`]): a Lease missing at our very first read is
    /// created at once.
    claim: bool,
    /// When we first read the Lease.
    first_seen_at: Option<Duration>,
    /// The [`HOME`] annotation our writes carry as holder ([`Elector::with_home`]).
    home: Option<String>,
    /// Why a missing Lease is not created at once ([`Elector::missing_because`]), for the
    /// line that says it waits.
    missing_why: Option<String>,
}

impl Elector {
    /// A candidate named `identity` (must be unique among candidates) with `timing`.
    pub(crate) fn new(identity: &str, timing: Timing) -> Elector {
        Elector {
            identity: identity.to_string(),
            timing,
            observed: None,
            seen: false,
            observed_at: Duration::ZERO,
            renewed_at: None,
            claim: false,
            first_seen_at: None,
            home: None,
            missing_why: None,
        }
    }

    /// `why` a missing Lease is not created at once (what was found that someone may have
    /// led from, e.g. `the namespace holds ConfigMap NAME of podalloc's`): named in the
    /// line logged when it waits.
    pub(crate) fn missing_because(mut self, why: String) -> Elector {
        self.missing_why = Some(why);
        self
    }

    /// Our writes as holder (acquire and every renewal) carry the [`HOME`] annotation
    /// `home` (`executorset/NAME`, `configmap/NAME`, `file`), so that commands find the
    /// home this process uses.
    pub(crate) fn with_home(mut self, home: String) -> Elector {
        self.home = Some(home);
        self
    }

    /// Claim mode, for a process that is meant to run alone (`apps` without
    /// `--leader-elect`, whose claim makes a second process refuse), or a `run
    /// --leader-elect` on an app of which the namespace holds nothing (no home, so nobody
    /// led it): a Lease missing at our very first read is created at once instead of a
    /// lease duration later. Only a `kubectl delete lease` under a running process, just
    /// before this one starts, is then not covered; otherwise it is.
    pub(crate) fn claiming(mut self) -> Elector {
        self.claim = true;
        self
    }

    /// The holder, when the Lease names another identity and has changed since our first
    /// read: someone else holds it and renews it (a live process).
    pub(crate) fn renewed_by_other(&self) -> Option<&str> {
        let o = self.observed.as_ref()?;
        let first = self.first_seen_at?;
        let other = !o.unreadable
            && !o.record.holder_identity.is_empty()
            && o.record.holder_identity != self.identity;
        (other && self.observed_at > first).then_some(o.record.holder_identity.as_str())
    }

    /// This candidate's identity.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// The holder of the Lease as last seen (empty when released), if one was seen.
    pub(crate) fn holder(&self) -> Option<&str> {
        self.observed
            .as_ref()
            .map(|o| o.record.holder_identity.as_str())
    }

    /// Whether the last Lease seen names us.
    fn holds(&self) -> bool {
        self.observed
            .as_ref()
            .is_some_and(|o| o.names(&self.identity))
    }

    /// Whether we lead at `now`: the Lease names us and our last confirmed acquire or renew
    /// started less than the renew deadline ago (the fence).
    pub(crate) fn is_leader(&self, now: Duration) -> bool {
        self.holds()
            && self
                .renewed_at
                .is_some_and(|t| now < t.saturating_add(self.timing.renew_deadline))
    }

    /// How long the Lease as last seen must stay unchanged before we may take it over: the
    /// longer of our lease duration and its own (bounded) `leaseDurationSeconds`; one lease
    /// duration more when it names us but our fence has lapsed (a leader whose renewals
    /// land unanswered yields to the others instead of keeping its Lease alive).
    fn hold_time(&self, now: Duration) -> Duration {
        let own = self.timing.lease_duration;
        let field = self.observed.as_ref().map_or(Duration::ZERO, |o| {
            Duration::from_secs(o.record.lease_duration_seconds)
        });
        let base = own.max(field);
        if self.holds() && self.renewed_at.is_some() && !self.is_leader(now) {
            base.saturating_add(own)
        } else {
            base
        }
    }

    /// The record we write as holder, stamped `wall_ms`.
    fn our_record(&self, wall_ms: u64) -> LeaseRecord {
        let stamp = micro_time(wall_ms);
        LeaseRecord {
            holder_identity: self.identity.clone(),
            lease_duration_seconds: self.timing.lease_seconds(),
            acquire_time: stamp.clone(),
            renew_time: stamp,
            lease_transitions: 0,
            home: self.home.clone(),
        }
    }

    /// Records a read: `lease` (`None`: 404) at `now`. Returns whether we led just before,
    /// and stops us at once when the read shows the Lease is no longer ours.
    fn record_read(&mut self, lease: Option<Observed>, now: Duration) -> bool {
        let was_leader = self.is_leader(now);
        self.first_seen_at.get_or_insert(now);
        let changed = !self.seen
            || match (&self.observed, &lease) {
                (None, None) => false,
                (Some(o), Some(l)) => {
                    o.resource_version != l.resource_version || o.record != l.record
                }
                _ => true,
            };
        if changed {
            self.observed_at = now;
        }
        self.seen = true;
        self.observed = lease;
        if !self.holds() {
            self.renewed_at = None;
        }
        was_leader && self.holds()
    }

    /// client-go's `tryAcquireOrRenew` after its GET: `lease` is what was read (`None`:
    /// 404). Returns the write to make, or `None` while the Lease must be left alone
    /// (see [`Elector`] for the rule). `now` is when the read answered; `wall_ms` stamps
    /// the record.
    pub(crate) fn observe(
        &mut self,
        lease: Option<Observed>,
        now: Duration,
        wall_ms: u64,
    ) -> Option<Write> {
        let first = !self.seen;
        let renewing = self.record_read(lease, now);
        let mut record = self.our_record(wall_ms);
        let released = self.observed.as_ref().is_some_and(Observed::released);
        let claim = self.claim && first && self.observed.is_none();
        if !renewing && !released && !claim {
            let until = self.observed_at.saturating_add(self.hold_time(now));
            if until > now {
                return None;
            }
        }
        let Some(old) = self.observed.as_ref() else {
            return Some(Write::Create(record));
        };
        if renewing {
            record.acquire_time = old.record.acquire_time.clone();
            record.lease_transitions = old.record.lease_transitions;
        } else if self.holds() {
            record.lease_transitions = old.record.lease_transitions;
        } else {
            record.lease_transitions = (old.record.lease_transitions + 1).min(INT32_MAX);
        }
        Some(Write::Update {
            record,
            resource_version: old.resource_version.clone(),
        })
    }

    /// A write of ours answered 404: the Lease is gone, so we stop at once (the next read
    /// confirms it).
    pub(crate) fn vanished(&mut self) {
        self.renewed_at = None;
    }

    /// client-go's fast path: a leader (fence valid) updates the Lease it last wrote
    /// directly with the version it last wrote, without reading it first (`None`: take the
    /// slow path, [`Elector::observe`] after a GET). A 409 then means someone else wrote the
    /// Lease; the caller falls back to the slow path.
    pub(crate) fn fast_renew(&self, now: Duration, wall_ms: u64) -> Option<Write> {
        if !self.is_leader(now) {
            return None;
        }
        let o = self.observed.as_ref()?;
        let mut record = self.our_record(wall_ms);
        record.acquire_time = o.record.acquire_time.clone();
        record.lease_transitions = o.record.lease_transitions;
        Some(Write::Update {
            record,
            resource_version: o.resource_version.clone(),
        })
    }

    /// A write succeeded: `lease` is the Lease the server returned, `started` when the
    /// attempt began (the fence counts from there).
    pub(crate) fn written(&mut self, lease: Observed, started: Duration) {
        self.observed_at = started;
        self.observed = Some(lease);
        self.seen = true;
        if self.holds() {
            self.renewed_at = Some(started);
        } else {
            self.renewed_at = None;
        }
    }

    /// `ReleaseOnCancel`: the update that gives the Lease up (empty holder, one second, sent
    /// with the [`RELEASED_BY`] mark by the shell), or `None` when the Lease we last saw
    /// does not name us or we never held it in this process.
    pub(crate) fn release(&self, wall_ms: u64) -> Option<Write> {
        let o = self.observed.as_ref().filter(|_| self.holds())?;
        self.renewed_at?;
        let stamp = micro_time(wall_ms);
        Some(Write::Update {
            record: LeaseRecord {
                holder_identity: String::new(),
                lease_duration_seconds: 1,
                acquire_time: stamp.clone(),
                renew_time: stamp,
                lease_transitions: o.record.lease_transitions,
                home: None,
            },
            resource_version: o.resource_version.clone(),
        })
    }

    /// A release answered 409 (someone wrote the Lease in between): `lease` is the Lease
    /// read again. Returns the release to send once more when it still names us, else
    /// `None` (it is no longer ours to give up). Never retried blindly.
    pub(crate) fn release_after_conflict(
        &mut self,
        lease: Option<Observed>,
        wall_ms: u64,
    ) -> Option<Write> {
        self.observed = lease;
        if !self.holds() {
            self.renewed_at = None;
        }
        self.release(wall_ms)
    }
}

/// The default Lease name for an app: `podalloc-<app id>`, lower-cased, with every character
/// a DNS-1123 subdomain does not allow replaced by `-`, at most 253 characters, ending in
/// an alphanumeric.
pub(crate) fn default_lease_name(app_id: &str) -> String {
    dns_subdomain(&format!("podalloc-{app_id}"))
}

/// `s` made a DNS-1123 subdomain: lower-cased, every character a subdomain does not allow
/// replaced by `-`, at most 253 characters, ending in an alphanumeric (an object name for a
/// Lease or a ConfigMap; `s` must start with an alphanumeric for it to be valid).
pub(crate) fn dns_subdomain(s: &str) -> String {
    let mut name: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(253)
        .collect();
    while name.ends_with(['-', '.']) {
        name.pop();
    }
    name
}

/// This process's identity: the `POD_NAME` environment variable (set from the downward
/// API's `metadata.name`), else the host name plus `_` and a random suffix (as client-go's
/// examples do), so two processes on one host differ.
pub(crate) fn default_identity() -> String {
    if let Ok(p) = std::env::var("POD_NAME") {
        if !p.trim().is_empty() {
            return p.trim().to_string();
        }
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "podalloc".to_string());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mix =
        (nanos ^ u64::from(std::process::id()).rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    format!("{host}_{:08x}", mix >> 32)
}

/// The candidate: the elector, its clock, and the leadership last reported.
struct Candidate {
    elector: Mutex<Elector>,
    origin: Instant,
    stop: AtomicBool,
    /// Leadership as last reported (logged and counted on change).
    reported: Mutex<Reported>,
}

#[derive(Default)]
struct Reported {
    leading: bool,
    transitions: u64,
    /// The last Lease read was unreadable (warned once per such spell).
    unreadable: bool,
    /// The verb (`get`, `create`, `update`) of the last Lease call when the RBAC refused it
    /// with 403.
    forbidden: Option<String>,
    /// The wait for a missing Lease was logged (once per process).
    said_missing: bool,
}

impl Candidate {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Whether we lead now (never once stopping); logs and counts a change since the last
    /// report.
    fn leading(&self) -> bool {
        let stopping = self.stop.load(Ordering::SeqCst);
        let (leading, holder, me) = {
            let e = lock(&self.elector);
            let leading = !stopping && e.is_leader(self.now());
            (
                leading,
                e.holder().map(str::to_string),
                e.identity().to_string(),
            )
        };
        let mut r = lock(&self.reported);
        if r.leading != leading {
            r.leading = leading;
            r.transitions += 1;
            match holder {
                _ if leading => info!("leader election: {me} became the leader"),
                _ if stopping => info!("leader election: {me} stopped leading (shutting down)"),
                Some(h) if h == me => warn!("leader election: {me} could not renew the lease within the renew deadline; stopped acting"),
                None => warn!("leader election: {me} stopped acting at once: the lease was deleted"),
                Some(h) => warn!("leader election: {me} stopped acting at once: the lease now names {h:?}"),
            }
        }
        leading
    }

    /// Whether we lead now ([`Candidate::leading`]: a change is logged and counted) and how
    /// many times that changed.
    fn leadership(&self) -> (bool, u64) {
        let leading = self.leading();
        (leading, lock(&self.reported).transitions)
    }
}

/// An election the loop drives: [`LeaderElection::tick`] makes the attempt (acquire or
/// renew) when it is due, from the loop's wait and from the hook its requests run between
/// them and while they wait (`crate::controller::runner::Control::poll`), so that a slow
/// request never makes a renewal late. No thread. Drop (or [`LeaderElection::stop`])
/// releases the Lease if we hold it.
pub(crate) struct LeaderElection {
    shared: Arc<Candidate>,
    /// The Lease calls' own client: timeouts of one renew deadline, no retries.
    client: KubeClient,
    name: String,
    timing: Timing,
    /// When the next attempt is due; `None`: at once.
    next: Mutex<Option<Instant>>,
    /// The jitter's xorshift state.
    rng: Mutex<u64>,
    /// Set while an attempt runs: a tick re-entered from its own request does nothing.
    busy: AtomicBool,
}

impl LeaderElection {
    /// Starts electing on Lease `name` in `client`'s namespace with the core `elector` (its
    /// identity and timing; [`Elector::claiming`] for a claim); the first attempt is made at
    /// the first [`LeaderElection::tick`]. The Lease calls use their own client (derived:
    /// it shares `client`'s hook) with timeouts of one renew deadline and no retries (an
    /// attempt is retried at the next retry period), as kube-controller-manager gives its
    /// election client a timeout of the renew deadline. Installs the write fence on
    /// `client`, so that pod and state writes stop when leadership does, also in the middle
    /// of a tick.
    ///
    /// Errors: the Lease client cannot be built.
    pub(crate) fn start(
        client: &KubeClient,
        name: &str,
        elector: Elector,
    ) -> Result<LeaderElection, KubeError> {
        let timing = elector.timing;
        let identity = elector.identity().to_string();
        let mut options = crate::kube::ClientOptions::default();
        options.timeouts.connect = timing.renew_deadline;
        options.timeouts.per_read = timing.renew_deadline;
        options.timeouts.global = timing.renew_deadline;
        options.retry = crate::kube::RetryPolicy::none();
        let lease_client = client.derive(options)?;
        let shared = Arc::new(Candidate {
            elector: Mutex::new(elector),
            origin: Instant::now(),
            stop: AtomicBool::new(false),
            reported: Mutex::new(Reported::default()),
        });
        info!(
            "leader election: {identity} is a candidate for lease {}/{name} (lease {}, renew deadline {}, retry {})",
            client.namespace(),
            humantime::format_duration(timing.lease_duration),
            humantime::format_duration(timing.renew_deadline),
            humantime::format_duration(timing.retry_period)
        );
        let le = LeaderElection {
            shared,
            client: lease_client,
            name: name.to_string(),
            timing,
            next: Mutex::new(None),
            rng: Mutex::new(wall_ms() | 1),
            busy: AtomicBool::new(false),
        };
        le.fence(client);
        Ok(le)
    }

    /// Makes the attempt when it is due (client-go's `tryAcquireOrRenew`), then schedules
    /// the next: a retry period later when leading; jittered by up to [`JITTER_FACTOR`]
    /// more when not, as client-go's `wait.JitterUntil`. Does nothing once stopped, before
    /// it is due, or re-entered from its own request.
    pub(crate) fn tick(&self) {
        let s = &self.shared;
        let due = lock(&self.next).is_none_or(|at| Instant::now() >= at);
        if !due || s.stop.load(Ordering::SeqCst) || self.busy.swap(true, Ordering::SeqCst) {
            return;
        }
        attempt(s, &self.client.api(&LEASES), &self.name);
        let mut period = self.timing.retry_period;
        if !s.leading() {
            let mut rng = lock(&self.rng);
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            let f = (*rng % 1000) as f64 / 1000.0 * JITTER_FACTOR;
            period += self.timing.retry_period.mul_f64(f);
        }
        *lock(&self.next) = Some(Instant::now() + period);
        self.busy.store(false, Ordering::SeqCst);
    }

    /// Installs the write fence on `client` (every client that writes pods or state must
    /// have it: `apps` has one per namespace): its pod and state writes stop when
    /// leadership does, also in the middle of a tick.
    pub(crate) fn fence(&self, client: &KubeClient) {
        let fence = Arc::clone(&self.shared);
        client.set_write_fence(Arc::new(move || fence.leading()));
    }

    /// Whether this process leads now (logs and counts a change).
    pub(crate) fn is_leader(&self) -> bool {
        self.shared.leading()
    }

    /// Whether this process leads and how many times that changed since it started, for
    /// the metrics (`podalloc_is_leader`, `podalloc_leader_transitions_total`).
    pub(crate) fn leadership(&self) -> (bool, u64) {
        self.shared.leadership()
    }

    /// [`LeaderElection::leadership`] as a function the endpoints keep and ask whenever
    /// `/metrics` is scraped (`crate::controller::serve::Probe::follow_leadership`), so the
    /// leader-election series are those of that moment. It holds the candidate, not the
    /// election: once the election has stopped (its Lease released) it says not leading.
    pub(crate) fn live(&self) -> crate::controller::serve::Leadership {
        let candidate = Arc::clone(&self.shared);
        Arc::new(move || candidate.leadership())
    }

    /// The Lease's holder as last read (`None`: none read, or missing).
    pub(crate) fn holder(&self) -> Option<String> {
        lock(&self.shared.elector).holder().map(str::to_string)
    }

    /// The verb (`get`, `create`, `update`) of the last Lease call when it was refused with
    /// 403 Forbidden (RBAC lacks leases); `None` otherwise.
    pub(crate) fn forbidden(&self) -> Option<String> {
        lock(&self.shared.reported).forbidden.clone()
    }

    /// The Lease's namespace and name.
    pub(crate) fn lease(&self) -> (&str, &str) {
        (self.client.namespace(), &self.name)
    }

    /// [`Elector::renewed_by_other`]: another live holder.
    pub(crate) fn renewed_by_other(&self) -> Option<String> {
        lock(&self.shared.elector)
            .renewed_by_other()
            .map(str::to_string)
    }

    /// Stops electing and releases the Lease if we hold it (once).
    pub(crate) fn stop(&mut self) {
        if !self.shared.stop.swap(true, Ordering::SeqCst) {
            release(&self.shared, &self.client.api(&LEASES), &self.name);
        }
    }
}

impl Drop for LeaderElection {
    fn drop(&mut self) {
        self.stop();
    }
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One `tryAcquireOrRenew`: the leader's fast path (update what it last wrote), else GET,
/// ask the core, write. A 404 on the fast path stops us at once; a 409 is settled by the
/// read that follows.
fn attempt(s: &Candidate, leases: &Api<'_>, name: &str) {
    let started = s.now();
    let fast = lock(&s.elector).fast_renew(started, wall_ms());
    if let Some(w) = fast {
        match leases.replace(name, &w.to_lease(name, None)) {
            Ok(v) => return lock(&s.elector).written(Observed::from_lease(&v), started),
            Err(e) => {
                if e.status_code() == Some(404) {
                    lock(&s.elector).vanished();
                }
                debug!("leader election: renewing {name} optimistically failed ({e}); reading it")
            }
        }
    }
    let lease = match leases.get(name) {
        Ok(l) => l.map(|v| Observed::from_lease(&v)),
        Err(e) => return report(s, &e),
    };
    let unreadable = lease.as_ref().is_some_and(|l| l.unreadable);
    let missing = lease.is_none();
    // The observation is dated when the read answered, so the wait for a changed Lease
    // counts from no earlier than the change itself.
    let write = lock(&s.elector).observe(lease, s.now(), wall_ms());
    s.leading();
    if std::mem::replace(&mut lock(&s.reported).unreadable, unreadable) != unreadable && unreadable
    {
        warn!("leader election: lease {name} has a field that does not read as the API types it; treated as held by someone unknown");
    }
    let Some(write) = write else {
        debug!("leader election: lease {name} is held by another candidate or changed lately");
        if missing && !std::mem::replace(&mut lock(&s.reported).said_missing, true) {
            let why = (lock(&s.elector).missing_why.as_ref())
                .map_or(String::new(), |w| format!(" ({w})"));
            info!(
                "leader election: lease {name} is missing: it is created once it has stayed \
                 missing for a lease duration, since it may have been deleted under a leader \
                 that still acts{why}"
            );
        }
        return;
    };
    let res = match &write {
        Write::Create(_) => {
            (leases.create(&write.to_lease(name, None), &PostParams::default())).map(|c| c.object)
        }
        Write::Update { .. } => leases.replace(name, &write.to_lease(name, None)),
    };
    match res {
        Ok(v) => lock(&s.elector).written(Observed::from_lease(&v), started),
        Err(e) if e.status_code() == Some(409) => {
            debug!("leader election: another candidate wrote lease {name} first: {e}")
        }
        Err(e) => report(s, &e),
    }
}

/// Logs a failed Lease call; a 403 is remembered instead ([`LeaderElection::forbidden`]):
/// the command ends on it with one line that says which permission is missing
/// (`crate::commands::elect::refused`), as a retry would meet the same refusal.
fn report(s: &Candidate, e: &KubeError) {
    let forbidden = match e {
        KubeError::Api { verb, status } if status.code == 403 => {
            Some(verb.split(' ').next().unwrap_or_default().to_string())
        }
        _ => None,
    };
    match &forbidden {
        Some(_) => debug!("leader election: {e}"),
        None => warn!("leader election: {e}"),
    }
    lock(&s.reported).forbidden = forbidden;
}

/// `ReleaseOnCancel`: gives the Lease up if we hold it. A 409 (someone wrote it in
/// between) is not retried blindly: the Lease is read again and released only if it still
/// names us (client-go#1417).
fn release(s: &Candidate, leases: &Api<'_>, name: &str) {
    let me = lock(&s.elector).identity().to_string();
    let mut write = lock(&s.elector).release(wall_ms());
    for _ in 0..2 {
        let Some(w) = write.take() else { break };
        match leases.replace(name, &w.to_lease(name, Some(&me))) {
            Ok(v) => {
                lock(&s.elector).written(Observed::from_lease(&v), s.now());
                info!("leader election: released lease {name}");
            }
            Err(e) if e.status_code() == Some(409) => {
                info!("leader election: lease {name} was written by someone else before the release; reading it again");
                match leases.get(name) {
                    Ok(l) => {
                        let l = l.map(|v| Observed::from_lease(&v));
                        write = lock(&s.elector).release_after_conflict(l, wall_ms());
                        if write.is_none() {
                            info!("leader election: lease {name} no longer names {me}; nothing to release");
                        }
                    }
                    Err(e) => {
                        warn!("leader election: could not read lease {name} to release it: {e}")
                    }
                }
            }
            Err(e) => warn!("leader election: could not release lease {name}: {e}"),
        }
    }
    s.leading();
}

#[cfg(test)]
mod tests {

    /// The record and version of an update (the test fails on a create).
    fn update_of(w: &Write) -> (&LeaseRecord, &String) {
        match w {
            Write::Update {
                record,
                resource_version,
            } => (record, resource_version),
            Write::Create(_) => panic!("a create, not an update: {w:?}"),
        }
    }
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn timing() -> Timing {
        Timing {
            lease_duration: 3 * S,
            renew_deadline: 2 * S,
            retry_period: S / 2,
        }
    }

    fn lease(holder: &str, rv: &str, renew: &str, transitions: u64) -> Observed {
        Observed {
            record: LeaseRecord {
                holder_identity: holder.into(),
                lease_duration_seconds: 3,
                acquire_time: "a".into(),
                renew_time: renew.into(),
                lease_transitions: transitions,
                home: None,
            },
            resource_version: rv.into(),
            ..Observed::default()
        }
    }

    /// A missing Lease seen first a lease duration (3 s) before `at`, then again at `at`:
    /// the create. Before that, nothing is written.
    fn first_create(e: &mut Elector, at: Duration, wall: u64) -> Write {
        assert_eq!(e.observe(None, at - 3 * S, wall), None, "a first 404 waits");
        assert_eq!(
            e.observe(None, at - S / 10, wall),
            None,
            "until a lease duration"
        );
        e.observe(None, at, wall).expect("then creates")
    }

    fn applied(w: &Write, rv: &str) -> Observed {
        let record = match w {
            Write::Create(r) | Write::Update { record: r, .. } => r.clone(),
        };
        Observed {
            record,
            resource_version: rv.into(),
            ..Observed::default()
        }
    }

    #[test]
    fn validation_follows_client_go() {
        assert!(Timing::default().validate().is_ok());
        assert!(timing().validate().is_ok());
        let bad = |l: u64, r: u64, p: u64| Timing {
            lease_duration: Duration::from_millis(l),
            renew_deadline: Duration::from_millis(r),
            retry_period: Duration::from_millis(p),
        };
        assert!(bad(3000, 3000, 500)
            .validate()
            .unwrap_err()
            .contains("greater than"));
        // 3.9 s is written as 3 s: not above a 3 s renew deadline.
        assert!(bad(3900, 3000, 500).validate().is_err());
        // 1.2 × 1 s is not below 1.2 s.
        assert!(bad(3000, 1200, 1000)
            .validate()
            .unwrap_err()
            .contains("1.2"));
        assert!(bad(3000, 1300, 1000).validate().is_ok());
        assert!(bad(500, 100, 50).validate().is_err());
        assert!(bad(3000, 2000, 0).validate().is_err());
    }

    #[test]
    fn a_missing_lease_is_created_and_then_renewed_keeping_the_acquire_time() {
        let mut e = Elector::new("a", timing());
        assert!(!e.is_leader(Duration::ZERO));
        let w = first_create(&mut e, 3 * S, 1_000);
        let Write::Create(r) = &w else { panic!() };
        assert_eq!(r.holder_identity, "a");
        assert_eq!(r.lease_duration_seconds, 3);
        assert_eq!(r.renew_time, "1970-01-01T00:00:01.000000Z");
        assert!(!e.is_leader(3 * S), "not before the write succeeded");
        e.written(applied(&w, "1"), 3 * S);
        assert!(e.is_leader(4 * S));
        let w = e.observe(Some(applied(&w, "1")), 4 * S, 2_000).unwrap();
        let (record, resource_version) = update_of(&w);
        assert_eq!(resource_version, "1");
        assert_eq!(record.acquire_time, "1970-01-01T00:00:01.000000Z");
        assert_eq!(record.renew_time, "1970-01-01T00:00:02.000000Z");
        assert_eq!(record.lease_transitions, 0);
    }

    #[test]
    fn the_leader_stops_acting_at_the_renew_deadline_before_the_lease_expires() {
        let mut e = Elector::new("a", timing());
        let w = first_create(&mut e, 10 * S, 0);
        e.written(applied(&w, "1"), 10 * S);
        assert!(e.is_leader(10 * S + 1999 * S / 1000));
        // Renewals failed since: no longer leading at start + renew deadline (2 s), while
        // the others may take over only at their observation + 3 s.
        assert!(!e.is_leader(12 * S));
        // A fenced leader does not keep its Lease alive: it leaves it alone for a lease
        // duration more than the others would (6 s since it last wrote at 10 s)...
        assert_eq!(e.observe(Some(applied(&w, "1")), 13 * S, 0), None);
        assert_eq!(
            e.observe(Some(applied(&w, "1")), 15_900 * S / 1000, 0),
            None
        );
        // ...then a renewal that succeeds makes it the leader again.
        let w = e.observe(Some(applied(&w, "1")), 16 * S, 0).unwrap();
        e.written(applied(&w, "2"), 16 * S);
        assert!(e.is_leader(17 * S));
    }

    #[test]
    fn a_held_lease_is_taken_over_only_after_it_stops_changing_for_its_duration() {
        let mut b = Elector::new("b", timing());
        assert_eq!(b.observe(Some(lease("a", "5", "t1", 0)), 10 * S, 0), None);
        // Unchanged for 2.9 s by our clock: still a's.
        assert_eq!(
            b.observe(Some(lease("a", "5", "t1", 0)), 12_900 * S / 1000, 0),
            None
        );
        // a renewed: the clock starts again.
        assert_eq!(
            b.observe(Some(lease("a", "6", "t2", 0)), 12_950 * S / 1000, 0),
            None
        );
        assert_eq!(
            b.observe(Some(lease("a", "6", "t2", 0)), 15_900 * S / 1000, 0),
            None
        );
        let w = b
            .observe(Some(lease("a", "6", "t2", 0)), 16 * S, 0)
            .unwrap();
        let (record, resource_version) = update_of(&w);
        assert_eq!(record.holder_identity, "b");
        assert_eq!(record.lease_transitions, 1, "a change of holder is counted");
        assert_eq!(resource_version, "6", "conditional on the version read");
        assert!(!b.is_leader(16 * S));
        b.written(applied(&w, "7"), 16 * S);
        assert!(b.is_leader(16 * S));
    }

    #[test]
    fn a_released_lease_is_taken_at_once_and_release_needs_the_lease() {
        let mut a = Elector::new("a", timing());
        assert_eq!(a.release(0), None, "never held");
        let w = first_create(&mut a, 3 * S, 0);
        a.written(applied(&w, "1"), 3 * S);
        let rel = a.release(5_000).unwrap();
        let (record, resource_version) = update_of(&rel);
        assert_eq!(record.holder_identity, "");
        assert_eq!(record.lease_duration_seconds, 1);
        assert_eq!(resource_version, "1");
        a.written(applied(&rel, "2"), 4 * S);
        assert!(!a.is_leader(4 * S));
        let mut b = Elector::new("b", timing());
        let mut released = applied(&rel, "2");
        released.released_by = Some("a".into());
        let w = b.observe(Some(released), 4 * S, 0).unwrap();
        assert!(matches!(w, Write::Update { ref record, .. } if record.holder_identity == "b"));
    }

    #[test]
    fn the_leader_renews_without_reading_while_its_lease_is_valid() {
        let mut a = Elector::new("a", timing());
        assert_eq!(a.fast_renew(Duration::ZERO, 0), None, "not the holder");
        let w = first_create(&mut a, 3 * S, 1_000);
        a.written(applied(&w, "1"), 3 * S);
        let Some(Write::Update {
            record,
            resource_version,
        }) = a.fast_renew(4 * S, 2_000)
        else {
            panic!()
        };
        assert_eq!(resource_version, "1");
        assert_eq!(record.holder_identity, "a");
        assert_eq!(record.acquire_time, "1970-01-01T00:00:01.000000Z");
        assert_eq!(record.renew_time, "1970-01-01T00:00:02.000000Z");
        // Past the lease duration since it was last written: read it first.
        assert_eq!(a.fast_renew(6 * S, 0), None);
        // Past the renew deadline (the fence) already: read it first.
        assert_eq!(a.fast_renew(5 * S, 0), None);
        let mut b = Elector::new("b", timing());
        b.observe(Some(lease("a", "1", "t", 0)), S, 0);
        assert_eq!(b.fast_renew(S, 0), None, "a follower always reads");
    }

    #[test]
    fn a_lost_race_leaves_the_candidate_a_follower() {
        let mut b = Elector::new("b", timing());
        let w = first_create(&mut b, 3 * S, 0);
        assert!(matches!(w, Write::Create(_)));
        // The create got 409: nothing written. The next read shows a's fresh lease.
        assert_eq!(b.observe(Some(lease("a", "1", "t", 0)), 4 * S, 0), None);
        assert!(!b.is_leader(4 * S));
        assert_eq!(b.holder(), Some("a"));
    }

    /// A leader `a` holding version "1", created at 3 s.
    fn leader_a() -> (Elector, Observed) {
        let mut a = Elector::new("a", timing());
        let w = first_create(&mut a, 3 * S, 0);
        let held = applied(&w, "1");
        a.written(held.clone(), 3 * S);
        assert!(a.is_leader(3 * S));
        (a, held)
    }

    #[test]
    fn a_deleted_lease_stops_the_leader_at_once_and_is_recreated_only_after_a_lease_duration() {
        let (mut a, held) = leader_a();
        let mut b = Elector::new("b", timing());
        assert_eq!(b.observe(Some(held), 4 * S, 0), None);
        // `kubectl delete lease`: both see the 404 at 4.5 s.
        assert_eq!(a.observe(None, 4_500 * S / 1000, 0), None);
        assert!(!a.is_leader(4_500 * S / 1000), "stopped at once");
        assert_eq!(b.observe(None, 4_500 * S / 1000, 0), None);
        assert_eq!(b.observe(None, 7_400 * S / 1000, 0), None);
        // a's fence (renewed at 3 s) ended at 5 s; b creates at 7.5 s.
        assert!(matches!(
            b.observe(None, 7_500 * S / 1000, 0),
            Some(Write::Create(_))
        ));
        let mut a2 = a.clone();
        a2.vanished();
        assert!(!a2.is_leader(4 * S), "a 404 on a renewal stops at once too");
    }

    #[test]
    fn a_holder_edited_by_hand_stops_the_leader_and_is_not_taken_at_once() {
        for edited_to in ["b", "", "x"] {
            let (mut a, held) = leader_a();
            let mut b = Elector::new("b", timing());
            assert_eq!(b.observe(Some(held.clone()), 4 * S, 0), None);
            let mut edited = held.clone();
            edited.record.holder_identity = edited_to.into();
            edited.resource_version = "2".into();
            assert_eq!(
                b.observe(Some(edited.clone()), 4_100 * S / 1000, 0),
                None,
                "{edited_to:?}"
            );
            assert!(
                !b.is_leader(4_100 * S / 1000),
                "named by hand is not leading"
            );
            assert_eq!(a.observe(Some(edited.clone()), 4_200 * S / 1000, 0), None);
            assert!(
                !a.is_leader(4_200 * S / 1000),
                "{edited_to:?}: a stopped at once"
            );
            assert_eq!(
                b.observe(Some(edited.clone()), 7 * S, 0),
                None,
                "{edited_to:?}"
            );
            let w = b.observe(Some(edited), 7_100 * S / 1000, 0).unwrap();
            let (record, rv) = update_of(&w);
            assert_eq!((record.holder_identity.as_str(), rv.as_str()), ("b", "2"));
        }
    }

    #[test]
    fn a_renew_time_moved_by_hand_keeps_the_leader_and_resets_the_standbys_wait() {
        for renew in ["2099-01-01T00:00:00.000000Z", "1999-01-01T00:00:00.000000Z"] {
            let (mut a, held) = leader_a();
            let mut edited = held.clone();
            edited.record.renew_time = renew.into();
            edited.resource_version = "2".into();
            let w = a.observe(Some(edited.clone()), 4 * S, 0).unwrap();
            assert_eq!(update_of(&w).0.holder_identity, "a");
            assert!(a.is_leader(4 * S), "still ours");
            let mut b = Elector::new("b", timing());
            assert_eq!(b.observe(Some(edited.clone()), 4 * S, 0), None);
            assert_eq!(
                b.observe(Some(edited), 6_900 * S / 1000, 0),
                None,
                "{renew}"
            );
        }
    }

    #[test]
    fn unreadable_and_out_of_range_fields_are_bounded_and_never_released() {
        for spec in [
            json!({"holderIdentity": "a", "leaseDurationSeconds": u64::MAX}),
            json!({"holderIdentity": "a", "leaseDurationSeconds": -1}),
            json!({"holderIdentity": 7, "leaseDurationSeconds": 3}),
            json!({"holderIdentity": "", "leaseDurationSeconds": 1e300}),
        ] {
            let v = json!({"metadata": {"resourceVersion": "5"}, "spec": spec});
            let o = Observed::from_lease(&v);
            assert!(o.unreadable, "{v}");
            assert!(o.record.lease_duration_seconds <= INT32_MAX);
            let mut b = Elector::new("b", timing());
            assert_eq!(b.observe(Some(o.clone()), 10 * S, 0), None, "{v}");
            assert_eq!(
                b.observe(Some(o.clone()), 12_900 * S / 1000, 0),
                None,
                "{v}"
            );
            assert!(
                b.observe(Some(o), 13 * S, 0).is_some(),
                "{v}: our own duration"
            );
        }
        // The largest valid duration does not overflow either.
        let v = json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": i32::MAX}});
        let mut b = Elector::new("b", timing());
        assert_eq!(
            b.observe(Some(Observed::from_lease(&v)), Duration::MAX / 2, 0),
            None
        );
    }

    #[test]
    fn a_release_that_meets_a_conflict_reads_again_and_gives_up_only_its_own_lease() {
        let (mut a, held) = leader_a();
        let mut renewed = held.clone();
        renewed.record.renew_time = "x".into();
        renewed.resource_version = "2".into();
        let w = a.release_after_conflict(Some(renewed), 0).unwrap();
        assert_eq!(update_of(&w).1, "2");
        let mut taken = held;
        taken.record.holder_identity = "b".into();
        taken.resource_version = "3".into();
        assert_eq!(a.release_after_conflict(Some(taken), 0), None);
        assert_eq!(a.release_after_conflict(None, 0), None);
        let v = w.to_lease("l", Some("a"));
        assert_eq!(v["metadata"]["annotations"][RELEASED_BY], "a");
        assert!(Observed::from_lease(&v).released());
        let unmarked = w.to_lease("l", None);
        assert!(
            !Observed::from_lease(&unmarked).released(),
            "emptied by hand"
        );
    }

    #[test]
    fn the_holder_s_home_is_written_on_acquire_kept_on_renew_and_dropped_on_release() {
        let mut a = Elector::new("a", timing()).with_home("executorset/etl".into());
        let w = first_create(&mut a, 3 * S, 0);
        let v = w.to_lease("l", None);
        assert_eq!(v["metadata"]["annotations"][HOME], "executorset/etl");
        let held = Observed::from_lease(&v);
        assert_eq!(held.record.home.as_deref(), Some("executorset/etl"));
        a.written(held.clone(), 3 * S);
        let fast = a.fast_renew(4 * S, 0).unwrap().to_lease("l", None);
        assert_eq!(fast["metadata"]["annotations"][HOME], "executorset/etl");
        let slow = a.observe(Some(held), 4 * S, 0).unwrap();
        assert_eq!(update_of(&slow).0.home.as_deref(), Some("executorset/etl"));
        let rel = a.release(0).unwrap().to_lease("l", Some("a"));
        assert_eq!(rel["metadata"]["annotations"], json!({ RELEASED_BY: "a" }));
        // A standby taking a Lease over writes its own home.
        let mut b = Elector::new("b", timing()).with_home("configmap/st".into());
        let mut released = Observed::from_lease(&rel);
        released.resource_version = "2".into();
        let w = b.observe(Some(released), 5 * S, 0).unwrap();
        assert_eq!(update_of(&w).0.home.as_deref(), Some("configmap/st"));
    }

    #[test]
    fn the_loggers_leader_target_is_this_modules_path() {
        let here = module_path!().strip_suffix("::tests");
        assert_eq!(here, Some(crate::controller::LEADER_LOG_TARGET));
    }

    #[test]
    fn lease_names_and_objects() {
        assert_eq!(default_lease_name("spark-etl"), "podalloc-spark-etl");
        assert_eq!(default_lease_name("Spark_App 1-"), "podalloc-spark-app-1");
        let valid = |n: &str| crate::engine::podspec::validate_dns1123_subdomain("", n).is_ok();
        assert!(valid(&default_lease_name("Spark_App 1-")));
        assert!(!valid("-x") && !valid("X") && !valid("") && !valid("a..b"));
        let l = lease("a", "9", "t", 2).record.to_lease("n", Some("9"));
        assert_eq!(l["kind"], "Lease");
        assert_eq!(l["apiVersion"], "coordination.k8s.io/v1");
        assert_eq!(l["metadata"]["resourceVersion"], "9");
        assert_eq!(Observed::from_lease(&l), lease("a", "9", "t", 2));
    }
}
