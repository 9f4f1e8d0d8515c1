//! Steering requests: `scale`, `add` and `remove` handed to the loop that owns an app, queued
//! in its store (a request file, a ConfigMap key) and applied by its next tick, in order,
//! exactly once. This half is pure data and the rule that folds queued requests into one
//! step's [`Request`]; the queues themselves live in the shell (`src/steer.rs`,
//! `src/cmstore.rs`).

use super::plan::{Request, TargetChange};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a steering request asks (the seed's semantics, Spark's SPARK-9493 API).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum SteerOp {
    /// `scale N`: set the target to N (`requestTotalExecutors`).
    Scale {
        /// The new target.
        target: u32,
    },
    /// `add N`: raise the target by N (`requestExecutors`).
    Add {
        /// How many executors to add.
        count: u32,
    },
    /// `remove ID…`: delete these executors, lowering the target by those that count
    /// (`killExecutors` with `adjustTargetNumExecutors = true`).
    Remove {
        /// The executor ids.
        ids: Vec<u64>,
        /// Through the Eviction API (`remove --evict`), so a PodDisruptionBudget applies,
        /// whatever the loop that applies it was started with (issue 31 H2: a loop without
        /// `--evict` made it a plain delete). Absent (an older podalloc): false, as before.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        evict: bool,
    },
}

impl fmt::Display for SteerOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SteerOp::Scale { target } => write!(f, "scale {target}"),
            SteerOp::Add { count } => write!(f, "add {count}"),
            SteerOp::Remove { ids, evict } => {
                let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
                let how = if *evict { "--evict " } else { "" };
                write!(f, "remove {how}{}", ids.join(" "))
            }
        }
    }
}

/// One queued steering request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Steering {
    /// Unique across all requests ever made for the app: the submission time in ns since the
    /// Unix epoch (20 digits, so ids sort by submission), the submitter's pid and random
    /// letters, e.g. `01764625123456789012-4242-a1b2c3`.
    pub id: String,
    /// What it asks.
    #[serde(flatten)]
    pub op: SteerOp,
    /// When it was submitted, ms since the Unix epoch (for `status`).
    #[serde(default)]
    pub submitted_ms: u64,
    /// Who submitted it: `podalloc scale` on host H, pid P (for `status` and logs).
    #[serde(default)]
    pub by: String,
    /// The resource profile whose target `scale` and `add` change (`--profile P`; Spark
    /// 3.1+'s stage-level scheduling, SPARK-33288); absent: 0, the default profile. A
    /// `remove` lowers the target of each executor's own profile; one written to another
    /// profile's ExecutorSet than the executor's is refused ([`Request::filed`]).
    #[serde(default, skip_serializing_if = "is_default_profile")]
    pub profile: u32,
}

#[cfg(test)]
impl Steering {
    /// A request `id` asking `op` of the default profile, with no submission time or
    /// submitter (the tests' requests).
    pub(crate) fn bare(id: &str, op: SteerOp) -> Steering {
        Steering {
            id: id.into(),
            op,
            submitted_ms: 0,
            by: String::new(),
            profile: 0,
        }
    }
}

/// Whether a profile id is the default profile's (a request then omits it).
fn is_default_profile(p: &u32) -> bool {
    *p == 0
}

/// Folds the queued requests `pending` (oldest first, already-applied ones left out) into
/// the step's request after `base` (the caller's own: `run --target`'s seed, a one-shot
/// command's change). Returns the request and how many of `pending` it takes: the longest
/// prefix whose combined effect is exactly that of applying them one by one. A target change
/// after a removal, or an add after a seed, waits for the next step (a step changes the target
/// before it removes, and an add after a seed depends on whether the state had a target).
/// A request of profile P changes P's target ([`Request::profiles`]; profile 0's is
/// [`Request::target`]). Pure.
pub fn take_requests(base: &Request, pending: &[Steering]) -> (Request, usize) {
    let mut acc = base.clone();
    let mut taken = 0;
    for r in pending {
        match &r.op {
            SteerOp::Remove { ids, evict } => {
                acc.remove.extend(ids.iter().copied());
                for &id in ids {
                    acc.filed.entry(id).or_insert(r.profile);
                }
                if *evict {
                    acc.evict.extend(ids.iter().copied());
                }
            }
            op => {
                if !acc.remove.is_empty() {
                    break;
                }
                let slot = match r.profile {
                    0 => &mut acc.target,
                    p => acc.profiles.entry(p).or_default(),
                };
                let Some(t) = compose(*slot, op) else {
                    break;
                };
                *slot = t;
            }
        }
        taken += 1;
    }
    (acc, taken)
}

/// `first` then the target change of `op`, as one change; `None` when it cannot be one.
fn compose(first: TargetChange, op: &SteerOp) -> Option<TargetChange> {
    use TargetChange::*;
    match (first, op) {
        (_, SteerOp::Scale { target }) => Some(Set(*target)),
        (Seed(_) | Absolute(_), _) => None,
        (Keep, SteerOp::Add { count }) => Some(Add(*count)),
        (Set(n), SteerOp::Add { count }) => Some(Set(n.saturating_add(*count))),
        (Add(a), SteerOp::Add { count }) => Some(Add(a.saturating_add(*count))),
        (_, SteerOp::Remove { .. }) => Some(first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: &str, op: SteerOp) -> Steering {
        Steering::bare(id, op)
    }

    #[test]
    fn a_request_of_a_profile_changes_that_profiles_target() {
        let of = |id: &str, op: SteerOp, profile: u32| Steering {
            profile,
            ..req(id, op)
        };
        let q = [
            of("1", SteerOp::Scale { target: 3 }, 1),
            of("2", SteerOp::Add { count: 2 }, 1),
            of("3", SteerOp::Add { count: 1 }, 0),
            of("4", SteerOp::Add { count: 4 }, 2),
        ];
        let (r, n) = take_requests(&Request::target(None), &q);
        assert_eq!(n, 4);
        assert_eq!(r.target, TargetChange::Add(1));
        assert_eq!(r.profiles[&1], TargetChange::Set(5));
        assert_eq!(r.profiles[&2], TargetChange::Add(4));
        let wire = serde_json::to_value(&q[0]).unwrap();
        assert_eq!(wire["profile"], 1);
        assert!(serde_json::to_value(&q[2])
            .unwrap()
            .get("profile")
            .is_none());
    }

    #[test]
    fn requests_fold_in_order_and_stop_where_one_step_cannot_express_them() {
        let keep = Request::target(None);
        let q = [
            req("1", SteerOp::Add { count: 2 }),
            req("2", SteerOp::Add { count: 3 }),
            req("3", SteerOp::Scale { target: 7 }),
            req("4", SteerOp::Add { count: 1 }),
            req(
                "5",
                SteerOp::Remove {
                    ids: vec![4],
                    evict: false,
                },
            ),
            req(
                "6",
                SteerOp::Remove {
                    ids: vec![9],
                    evict: true,
                },
            ),
            req("7", SteerOp::Add { count: 1 }),
        ];
        let (r, n) = take_requests(&keep, &q);
        assert_eq!(n, 6);
        assert_eq!(r.target, TargetChange::Set(8));
        assert_eq!(r.remove, vec![4, 9]);
        assert_eq!(r.evict, vec![9], "only the removal that asked for eviction");
        let (r, n) = take_requests(&keep, &q[6..]);
        assert_eq!((r.target, n), (TargetChange::Add(1), 1));
        // Adds compose with adds; a seed goes alone.
        let (r, n) = take_requests(&Request::target(None), &q[..2]);
        assert_eq!((r.target, n), (TargetChange::Add(5), 2));
        let seed = Request {
            target: TargetChange::Seed(4),
            remove: vec![],
            ..Request::default()
        };
        assert_eq!(take_requests(&seed, &q).1, 0);
        // A scale after a seed is a scale, whatever the state holds.
        let (r, n) = take_requests(&seed, &q[2..]);
        assert_eq!((r.target, n), (TargetChange::Set(8), 4));
        let wire = serde_json::to_string(&q[4]).unwrap();
        assert_eq!(
            wire,
            r#"{"id":"5","op":"remove","ids":[4],"submitted_ms":0,"by":""}"#
        );
        assert_eq!(serde_json::from_str::<Steering>(&wire).unwrap(), q[4]);
        // `remove --evict` says so on the wire; an old request without the field is a plain
        // removal (above).
        let wire = serde_json::to_string(&q[5]).unwrap();
        assert!(wire.contains(r#""ids":[9],"evict":true"#), "{wire}");
        assert_eq!(serde_json::from_str::<Steering>(&wire).unwrap(), q[5]);
    }
}
