use super::*;
use crate::engine::snapshot::{DriverState, ExecutorPod, ExecutorState};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn pod(id: u64, state: ExecutorState) -> ExecutorPod {
    ExecutorPod::example(id, state)
}

fn snap(pods: &[(u64, ExecutorState)]) -> Snapshot {
    Snapshot {
        executors: pods.iter().map(|&(id, s)| (id, pod(id, s))).collect(),
        ..Snapshot::default()
    }
}

fn settings(batch: u32) -> Settings {
    Settings {
        batch_size: batch,
        ..Settings::new("app")
    }
}

/// The step on `s` from a fresh start (no state) toward `target`, at `now_ms`.
fn from_fresh(s: &Snapshot, set: &Settings, target: u32, now_ms: u64) -> Plan {
    step(
        s,
        &AllocatorState::new(),
        set,
        &Request::set(target),
        now_ms,
    )
    .unwrap()
}

/// A state at `target` with every id up to it handed out and `unacked` (id, created ms,
/// retry) unacknowledged.
fn awaiting(target: u32, unacked: &[(u64, u64, bool)]) -> AllocatorState {
    let mut st = AllocatorState::new();
    st.target = Some(target);
    st.last_executor_id = u64::from(target);
    st.unacknowledged = (unacked.iter())
        .map(|&(executor_id, created_ms, retry)| Unacknowledged {
            executor_id,
            created_ms,
            retry,
            profile: 0,
        })
        .collect();
    st
}

/// The outcome of a tick whose eviction of `not_now` a PodDisruptionBudget put off while
/// `deleted` was deleted.
fn put_off(not_now: u64, deleted: u64) -> Outcomes {
    Outcomes {
        not_now: vec![not_now],
        deleted_ids: vec![deleted],
        deleted: 1,
        ..Outcomes::default()
    }
}

/// Asserts that one of the plan's warnings contains `text`.
fn assert_warns(p: &Plan, text: &str) {
    let found = p.warnings.iter().any(|w| w.contains(text));
    assert!(found, "no warning with {text:?}: {:?}", p.warnings);
}

fn ids_c(p: &Plan) -> Vec<u64> {
    p.create.iter().map(|c| c.executor_id).collect()
}
fn ids_d(p: &Plan) -> Vec<u64> {
    let mut v: Vec<u64> = p.delete.iter().map(|d| d.executor_id).collect();
    v.sort();
    v
}

#[test]
fn creation_timeout_default_and_override() {
    let mut s = settings(5);
    assert_eq!(s.creation_timeout(), 60_000);
    s.batch_delay_ms = 20_000;
    assert_eq!(s.creation_timeout(), 100_000);
    s.creation_timeout_ms = Some(5);
    assert_eq!(s.creation_timeout(), 5);
}

#[test]
fn no_target_is_an_error() {
    let e = step(
        &snap(&[]),
        &AllocatorState::new(),
        &settings(5),
        &Request::default(),
        0,
    );
    assert_eq!(e.unwrap_err(), StepError::NoTarget);
}

#[test]
fn first_batch_then_wait_then_next() {
    let st = AllocatorState::new();
    let req = Request {
        target: TargetChange::Set(7),
        remove: vec![],
        ..Request::default()
    };
    let p = step(&snap(&[]), &st, &settings(5), &req, 10).unwrap();
    assert_eq!(ids_c(&p), vec![1, 2, 3, 4, 5]);
    assert_eq!(p.create[0].pod_name, "app-exec-1");
    // Seen but pending: nothing new.
    use ExecutorState::*;
    let s2 = snap(&[
        (1, Running),
        (2, Running),
        (3, Running),
        (4, Running),
        (5, Pending),
    ]);
    let p2 = step(&s2, &p.state, &settings(5), &Request::default(), 20).unwrap();
    assert!(p2.create.is_empty() && p2.delete.is_empty());
    assert!(p2.state.unacknowledged.is_empty());
    let s3 = snap(&[
        (1, Running),
        (2, Running),
        (3, Running),
        (4, Running),
        (5, Running),
    ]);
    let p3 = step(&s3, &p2.state, &settings(5), &Request::default(), 30).unwrap();
    assert_eq!(ids_c(&p3), vec![6, 7]);
    assert!(!p3.summary.converged);
}

#[test]
fn excess_takes_unacknowledged_then_unscheduled_pending_newest_first() {
    use ExecutorState::*;
    let st = awaiting(6, &[(5, 0, false), (6, 0, false)]);
    let mut s = snap(&[(1, Running), (2, Pending), (3, Pending), (4, Pending)]);
    s.executors.get_mut(&2).unwrap().scheduled = true;
    // known = 1 + 3 + 2 = 6; target 2 → excess 4: 6, 5, then unscheduled 4, 3 (not 2).
    let p = step(
        &s,
        &st,
        &settings(5),
        &Request {
            target: TargetChange::Set(2),
            remove: vec![],
            ..Request::default()
        },
        1,
    )
    .unwrap();
    assert_eq!(ids_d(&p), vec![3, 4, 5, 6]);
    assert!(p
        .delete
        .iter()
        .all(|d| d.reason == DeleteReason::Excess && d.if_pending));
    assert!(p.state.unacknowledged.is_empty());
    assert!(p.create.is_empty());
}

#[test]
fn remove_lowers_target_only_for_existing() {
    use ExecutorState::*;
    let s = snap(&[(1, Running), (2, Running), (3, Failed), (4, Deleted)]);
    let req = Request {
        target: TargetChange::Set(4),
        remove: vec![2, 3, 4, 99, 2],
        ..Request::default()
    };
    let p = step(&s, &AllocatorState::new(), &settings(5), &req, 0).unwrap();
    assert_eq!(p.state.target, Some(3));
    assert_eq!(ids_d(&p), vec![2, 3]);
    assert!(p.delete.iter().all(|d| d.reason == DeleteReason::Removed));
    assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
    // running 1 < target 3 → 2 more, ids above everything seen.
    assert_eq!(ids_c(&p), vec![5, 6]);
}

#[test]
fn an_absolute_target_already_accounts_for_the_removals() {
    use ExecutorState::*;
    // An ExecutorSet's spec.replicas went 4 → 2 in the write that asked to remove 2 and 3.
    let s = snap(&[(1, Running), (2, Running), (3, Running), (4, Pending)]);
    let req = Request {
        target: TargetChange::Absolute(2),
        remove: vec![2, 3],
        ..Request::default()
    };
    let p = step(&s, &AllocatorState::new(), &settings(5), &req, 0).unwrap();
    assert_eq!(p.state.target, Some(2));
    assert_eq!(ids_d(&p), vec![2, 3]);
    assert!(
        p.create.is_empty(),
        "running 1 + pending 1 = 2: {:?}",
        p.create
    );
    assert_eq!(TargetChange::Absolute(7).apply(Some(3)), Some(7));
}

#[test]
fn keep_terminated_does_not_delete_but_still_replaces() {
    use ExecutorState::*;
    let mut set = settings(5);
    set.delete_terminated = false;
    let p = step(
        &snap(&[(1, Running), (2, Failed)]),
        &AllocatorState::new(),
        &set,
        &Request {
            target: TargetChange::Set(2),
            remove: vec![],
            ..Request::default()
        },
        0,
    )
    .unwrap();
    assert!(p.delete.is_empty());
    assert_eq!(ids_c(&p), vec![3]);
}

#[test]
fn quota_backoff_holds_creates_until_it_expires() {
    let mut st = AllocatorState::new();
    st.target = Some(3);
    st.create_backoff = Some(Backoff::after_rejection(
        None,
        1000,
        10_000,
        "exceeded quota: q".into(),
    ));
    assert_eq!(st.create_backoff.as_ref().unwrap().until_ms, 20_000);
    let p = step(&snap(&[]), &st, &settings(5), &Request::default(), 19_999).unwrap();
    assert!(p.create.is_empty());
    assert_warns(&p, "exceeded quota");
    assert_eq!(
        p.state.create_backoff, st.create_backoff,
        "kept until a create succeeds"
    );
    let p = step(&snap(&[]), &st, &settings(5), &Request::default(), 20_000).unwrap();
    assert_eq!(ids_c(&p), vec![1, 2, 3]);
    // Doubling, capped.
    let mut b = Backoff::after_rejection(None, 1000, 0, String::new());
    for _ in 0..20 {
        b = Backoff::after_rejection(Some(&b), 1000, 0, String::new());
    }
    assert_eq!(b.delay_ms, MAX_BACKOFF_MS);
}

#[test]
fn clock_going_backwards_does_not_time_out() {
    let st = awaiting(1, &[(1, 1_000_000, false)]);
    let p = step(&snap(&[]), &st, &settings(5), &Request::default(), 0).unwrap();
    assert!(p.delete.is_empty() && p.create.is_empty());
}

// ---- failure loops: refused creates, kubelet rejections, the failure limit (issue 31) -----

#[test]
fn refused_creates_back_off_doubling_and_give_their_ids_back() {
    let set = settings(5);
    let plan = planned(3);
    assert_eq!(ids_c(&plan), vec![1, 2, 3]);
    let refused = Outcomes {
        returned: vec![1, 2, 3],
        refused: Some("quantities must match the regular expression".into()),
        failed: true,
        ..Outcomes::default()
    };
    let st = record(&plan, &refused, &set, 1_000);
    assert_eq!(st.last_executor_id, 0, "no pod ever had ids 1-3");
    assert!(st.unacknowledged.is_empty());
    let b = st.create_backoff.clone().unwrap();
    assert_eq!((b.delay_ms, b.until_ms, b.refusals), (10_000, 11_000, 1));
    assert_eq!(b.cause, BackoffCause::Refused);
    // Nothing while it holds; then the same ids again, and a second refusal doubles it.
    let p2 = step(&snap(&[]), &st, &set, &Request::default(), 10_999).unwrap();
    assert!(p2.create.is_empty());
    assert!(matches!(p2.blocked, Some(Blocked::Backoff { .. })));
    let p3 = step(&snap(&[]), &st, &set, &Request::default(), 11_000).unwrap();
    assert_eq!(ids_c(&p3), vec![1, 2, 3]);
    let st3 = record(&p3, &refused, &set, 11_000);
    let b3 = st3.create_backoff.clone().unwrap();
    assert_eq!((b3.delay_ms, b3.refusals), (20_000, 2));
    // A create refused after one that made a pod gives back only the ids above it.
    let half = Outcomes {
        created: vec![1],
        returned: vec![2, 3],
        refused: Some("admission webhook \"w\" denied the request".into()),
        ..Outcomes::default()
    };
    let st4 = record(&p3, &half, &set, 11_000);
    assert_eq!(st4.last_executor_id, 1);
    assert_eq!(st4.create_backoff.unwrap().refusals, 2);
    // Ten refusals in a row: capped at 6 minutes.
    let mut b = Backoff::after_rejection(None, 1000, 0, String::new());
    for _ in 0..10 {
        b = Backoff::after_rejection(Some(&b), 1000, 0, String::new());
    }
    assert_eq!(b.delay_ms, 360_000);
}

#[test]
fn a_successful_create_ends_a_refusal_back_off() {
    let set = settings(5);
    let mut st = AllocatorState::new();
    st.target = Some(2);
    st.create_backoff = Some(
        Backoff::after_rejection(None, 1000, 0, "denied".into()).because(BackoffCause::Refused),
    );
    let p = step(&snap(&[]), &st, &set, &Request::default(), 10_000).unwrap();
    assert_eq!(ids_c(&p), vec![1, 2]);
    let ok = Outcomes {
        created: vec![1, 2],
        ..Outcomes::default()
    };
    assert_eq!(record(&p, &ok, &set, 10_000).create_backoff, None);
}

#[test]
fn a_changed_template_ends_a_refusal_back_off() {
    let mut set = settings(5);
    set.template_fingerprint = Some("aaaa".into());
    let plan = from_fresh(&snap(&[]), &set, 1, 0);
    let refused = Outcomes {
        returned: vec![1],
        refused: Some("quantities must match".into()),
        ..Outcomes::default()
    };
    let st = record(&plan, &refused, &set, 0);
    assert_eq!(
        st.create_backoff.as_ref().unwrap().template.as_deref(),
        Some("aaaa")
    );
    // The same template waits; a fixed one is tried at once.
    assert!(step(&snap(&[]), &st, &set, &Request::default(), 1)
        .unwrap()
        .create
        .is_empty());
    set.template_fingerprint = Some("bbbb".into());
    let p = step(&snap(&[]), &st, &set, &Request::default(), 1).unwrap();
    assert_eq!(ids_c(&p), vec![1]);
    assert_eq!(p.state.create_backoff, None);
}

fn rejected(id: u64, reason: &str) -> ExecutorPod {
    ExecutorPod {
        reason: Some(reason.into()),
        ..pod(id, ExecutorState::Failed)
    }
}

#[test]
fn kubelet_rejections_back_off_until_a_later_executor_runs() {
    use ExecutorState::*;
    let set = settings(5);
    let st = awaiting(2, &[]);
    let s = of(vec![rejected(1, "OutOfcpu"), pod(2, Running)]);
    let p = step(&s, &st, &set, &Request::default(), 0).unwrap();
    // Deleted, not replaced yet: the replacement would meet the same node.
    assert_eq!(ids_d(&p), vec![1]);
    assert!(p.create.is_empty(), "{:?}", p.create);
    let b = p.state.create_backoff.clone().unwrap();
    assert_eq!(
        (b.cause, b.delay_ms, b.executor_id),
        (BackoffCause::Rejected, 10_000, Some(2))
    );
    assert!(
        b.reason.contains("OutOfcpu") && b.reason.contains("executor 1"),
        "{}",
        b.reason
    );
    assert_eq!(p.state.failures.len(), 1, "a failure for the limit too");
    // The same pod seen again (still listed while it goes) does not double it.
    let again = step(&s, &p.state, &set, &Request::default(), 1_000).unwrap();
    assert_eq!(again.state.create_backoff.unwrap().delay_ms, 10_000);
    // After the back-off the replacement; a created replacement does not end the back-off
    // (the kubelet may reject it too), a second rejection doubles it.
    let gone = snap(&[(2, Running)]);
    let p2 = step(&gone, &p.state, &set, &Request::default(), 10_000).unwrap();
    assert_eq!(ids_c(&p2), vec![3]);
    let ok = Outcomes {
        created: vec![3],
        ..Outcomes::default()
    };
    let st2 = record(&p2, &ok, &set, 10_000);
    assert!(st2.create_backoff.is_some());
    let s3 = of(vec![rejected(3, "NodeAffinity"), pod(2, Running)]);
    let p3 = step(&s3, &st2, &set, &Request::default(), 11_000).unwrap();
    let b3 = p3.state.create_backoff.clone().unwrap();
    assert_eq!(
        (b3.delay_ms, b3.refusals, b3.executor_id),
        (20_000, 2, Some(3))
    );
    // An executor above the rejected ones runs: the back-off ends.
    let p4 = step(
        &snap(&[(2, Running), (4, Running)]),
        &p3.state,
        &set,
        &Request::default(),
        12_000,
    )
    .unwrap();
    assert_eq!(p4.state.create_backoff, None);
    // An ordinary failure is replaced at once, as before.
    let p5 = step(
        &of(vec![failed_by(5, None), pod(2, Running)]),
        &AllocatorState::new(),
        &set,
        &Request::set(2),
        0,
    )
    .unwrap();
    assert_eq!(ids_c(&p5), vec![6]);
    assert!(is_kubelet_rejection("OutOfnvidia.com/gpu") && !is_kubelet_rejection("OutOf"));
    assert!(!is_kubelet_rejection("OOMKilled") && !is_kubelet_rejection("Error"));
    // Evicted at admission (the snapshot gives a pod evicted after it ran a disruption
    // instead): backed off as the other rejections.
    let s6 = of(vec![rejected(6, "Evicted"), pod(2, Running)]);
    let p6 = step(&s6, &AllocatorState::new(), &set, &Request::set(2), 0).unwrap();
    assert!(p6.create.is_empty(), "{:?}", p6.create);
    assert_eq!(
        p6.state.create_backoff.unwrap().cause,
        BackoffCause::Rejected
    );
}

#[test]
fn a_stored_back_off_beyond_the_cap_is_clamped() {
    let mut st = AllocatorState::new();
    st.target = Some(1);
    st.create_backoff = Some(Backoff {
        until_ms: 1_000_000_000,
        delay_ms: 999_999_999,
        reason: "exceeded quota".into(),
        cause: BackoffCause::Quota,
        refusals: 1,
        executor_id: None,
        template: None,
    });
    let p = step(&snap(&[]), &st, &settings(5), &Request::default(), 1_000).unwrap();
    let b = p.state.create_backoff.clone().unwrap();
    assert_eq!(
        (b.until_ms, b.delay_ms),
        (1_000 + MAX_BACKOFF_MS, MAX_BACKOFF_MS)
    );
    assert_eq!(p.requeue_after_ms, Some(MAX_BACKOFF_MS));
    // Saved clamped, so it ends within the cap of the first tick that read it.
    let p2 = step(
        &snap(&[]),
        &p.state,
        &settings(5),
        &Request::default(),
        1_000 + MAX_BACKOFF_MS,
    )
    .unwrap();
    assert_eq!(ids_c(&p2), vec![1]);
}

#[test]
fn a_stored_back_off_delay_below_the_first_never_shrinks_the_next() {
    // A hand-edited `delay_ms: 0` doubled to 0 for ever: a refusal every tick.
    let zero = Backoff {
        until_ms: 0,
        delay_ms: 0,
        reason: "x".into(),
        cause: BackoffCause::Refused,
        refusals: 1,
        executor_id: None,
        template: None,
    };
    let b = Backoff::after_rejection(Some(&zero), 1_000, 5_000, String::new());
    assert_eq!(
        (b.delay_ms, b.until_ms),
        (MIN_BACKOFF_MS, 5_000 + MIN_BACKOFF_MS)
    );
    let b = Backoff::after_rejection(Some(&b), 1_000, 5_000, String::new());
    assert_eq!(b.delay_ms, 2 * MIN_BACKOFF_MS);
}

#[test]
fn the_failure_limit_is_on_by_default_at_twice_the_target_at_least_three() {
    assert_eq!(
        Settings::new("app").policies.max_failures,
        FailureLimit::TwiceTarget
    );
    assert_eq!(FailureLimit::TwiceTarget.limit(1), Some(3));
    assert_eq!(FailureLimit::TwiceTarget.limit(5), Some(10));
    assert_eq!(FailureLimit::Off.limit(5), None);
    let set = settings(5);
    // Target 1: a fourth failure within the window halts, the third does not.
    let mut st = AllocatorState::new();
    st.target = Some(1);
    for (i, n) in [(1u64, 3usize), (2, 4)] {
        let fails: Vec<ExecutorPod> = (1..=n as u64)
            .map(|id| failed_by(id + i * 10, None))
            .collect();
        let p = step(&of(fails), &st, &set, &Request::default(), 0).unwrap();
        assert_eq!(p.halt.is_some(), n > 3, "{n} failures: {:?}", p.halt);
    }
    let mut off = settings(5);
    off.policies.max_failures = FailureLimit::Off;
    let fails: Vec<ExecutorPod> = (1..=9).map(|id| failed_by(id, None)).collect();
    let p = step(&of(fails), &st, &off, &Request::default(), 0).unwrap();
    assert_eq!(p.halt, None);
}

#[test]
fn scale_down_takes_not_ready_executors_before_ready_ones() {
    let mut set = settings(5);
    set.policies.scale_down_running = true;
    // 1 is Ready with the lowest deletion cost; 2 runs but is not Ready: 2 goes (B55).
    let ready = ExecutorPod {
        deletion_cost: -10,
        ..pod(1, ExecutorState::Running)
    };
    let not_ready = ExecutorPod {
        ready: false,
        ..pod(2, ExecutorState::Running)
    };
    let mut st = AllocatorState::new();
    st.last_executor_id = 2;
    let p = step(&of(vec![ready, not_ready]), &st, &set, &Request::set(1), 0).unwrap();
    assert_eq!(ids_d(&p), vec![2]);
}

/// Issue 31 item 3 (B50): under `--evict`, running executors removed or scaled down go
/// through the Eviction API; pending ones are deleted. A removal a disruption budget puts
/// off (429, "not now") is asked again each step without lowering the target again, and
/// stops once the pod is gone.
#[test]
fn evictions_of_running_executors_put_off_by_a_budget_are_asked_again() {
    use ExecutorState::{Pending, Running};
    let mut set = settings(5);
    set.policies.evict = true;
    set.policies.scale_down_running = true;
    let st = awaiting(3, &[]);
    let s = snap(&[(1, Running), (2, Running), (3, Pending)]);
    let req = Request {
        target: TargetChange::Keep,
        remove: vec![1, 3],
        ..Request::default()
    };
    let p = step(&s, &st, &set, &req, 0).unwrap();
    let evict: Vec<(u64, bool)> = p.delete.iter().map(|d| (d.executor_id, d.evict)).collect();
    assert_eq!(
        evict,
        vec![(1, true), (3, false)],
        "only running executors are evicted"
    );
    assert_eq!(p.state.target, Some(1));
    assert_eq!(p.state.removing, vec![1, 3]);
    // The budget refuses executor 1 for now: asked again, the target stays 1.
    let out = put_off(1, 3);
    let st = record(&p, &out, &set, 10);
    assert_eq!(st.removing, vec![1]);
    assert!(!st.deleted.contains(&1), "not deleted: {:?}", st.deleted);
    let s = snap(&[(1, Running), (2, Running)]);
    let again = Request {
        target: TargetChange::Keep,
        remove: vec![1],
        ..Request::default()
    };
    for req in [Request::default(), again] {
        let q = step(&s, &st, &set, &req, 1_000).unwrap();
        assert_eq!(ids_d(&q), vec![1], "{req:?}");
        assert!(q.delete[0].evict);
        assert_eq!(q.delete[0].reason, DeleteReason::Removed);
        assert_eq!(q.state.target, Some(1), "never lowered twice: {req:?}");
        assert!(q.create.is_empty(), "{req:?}");
    }
    // Gone: nothing more to ask.
    let q = step(
        &snap(&[(2, Running)]),
        &st,
        &set,
        &Request::default(),
        2_000,
    )
    .unwrap();
    assert!(q.delete.is_empty() && q.state.removing.is_empty());
    // Excess under --scale-down-running is evicted too; without --evict, deleted.
    let mut st = AllocatorState::new();
    st.last_executor_id = 2;
    let s = snap(&[(1, Running), (2, Running)]);
    let p = step(&s, &st, &set, &Request::set(1), 0).unwrap();
    assert!(p.delete.len() == 1 && p.delete[0].evict && p.state.removing.is_empty());
    set.policies.evict = false;
    let p = step(&s, &st, &set, &Request::set(1), 0).unwrap();
    assert!(p.delete.len() == 1 && !p.delete[0].evict);
}

/// B52: with `--count-terminating`, a stuck pod deleted in this step counts as the
/// terminating pod it is about to be: no replacement while it terminates.
#[test]
fn with_count_terminating_a_stuck_pod_is_not_replaced_in_the_step_that_deletes_it() {
    let mut set = settings(5);
    set.policies.startup_grace_ms = Some(10_000);
    let waiting = ExecutorPod {
        waiting: Some("ImagePullBackOff (image spark:bad)".into()),
        scheduled: true,
        ..pod(1, ExecutorState::Pending)
    };
    let s = of(vec![waiting]);
    for (count, created) in [(true, vec![]), (false, vec![2])] {
        set.policies.count_terminating = count;
        let p = step(&s, &AllocatorState::new(), &set, &Request::set(1), 0).unwrap();
        let p = step(&s, &p.state, &set, &Request::default(), 10_001).unwrap();
        assert_eq!(p.delete[0].reason, DeleteReason::Stuck);
        assert_eq!(ids_c(&p), created, "--count-terminating {count}");
    }
}

/// R3: an `add` queued before a bigger one landed cannot take the target above the largest
/// one: it stops there, with a warning, and the saved state loads again.
#[test]
fn an_add_stops_at_the_largest_target() {
    let mut st = AllocatorState::new();
    st.target = Some(5);
    let req = Request {
        target: TargetChange::Add(MAX_TARGET),
        ..Request::default()
    };
    let p = step(&snap(&[]), &st, &settings(5), &req, 0).unwrap();
    assert_eq!(p.state.target, Some(MAX_TARGET));
    assert_warns(&p, "above the largest target");
    p.state.validate().unwrap();
}

/// Issue 31 item 4: a create the API server answered whose pod a later list does not show
/// was deleted before any list saw it. It is replaced in that step under a new id, for the
/// process that made it and for a successor that inherited the state, and a copy that shows
/// up later is deleted (`late`), never counted.
#[test]
fn an_answered_create_missing_from_a_later_list_is_replaced_at_once() {
    let set = settings(5);
    let first = from_fresh(&snap(&[]), &set, 3, 0);
    assert_eq!(ids_c(&first), vec![1, 2, 3]);
    let out = Outcomes {
        created: vec![1, 2, 3],
        ..Outcomes::default()
    };
    let after = record(&first, &out, &set, 100);
    assert_eq!(after.answered, vec![1, 2, 3]);
    use ExecutorState::Running;
    let listed = snap(&[(1, Running), (2, Running)]);
    for (who, st) in [
        ("maker", after.clone()),
        ("successor", after.clone().inherited()),
    ] {
        let p = step(&listed, &st, &set, &Request::default(), 1_000).unwrap();
        assert_eq!(ids_c(&p), vec![4], "{who}: replaced now, under a new id");
        assert!(p.create.iter().all(|c| !c.retry), "{who}");
        assert!(
            p.delete.is_empty(),
            "{who}: the server said it is gone: no delete"
        );
        assert!(
            p.state.unacknowledged.iter().all(|u| u.executor_id == 4),
            "{who}"
        );
        assert!(
            p.warnings.iter().any(|w| w.contains("executor 3 ")),
            "{who}: {:?}",
            p.warnings
        );
        assert!(
            p.state.deleted_unseen.iter().any(|u| u.executor_id == 3),
            "{who}"
        );
        // A copy of executor 3 that shows up later is deleted, and never counted.
        let later = record(
            &p,
            &Outcomes {
                created: vec![4],
                ..Outcomes::default()
            },
            &set,
            1_100,
        );
        let copy = snap(&[(1, Running), (2, Running), (3, Running), (4, Running)]);
        let q = step(&copy, &later, &set, &Request::default(), 2_000).unwrap();
        assert_eq!(ids_d(&q), vec![3], "{who}");
        assert_eq!(q.delete[0].reason, DeleteReason::Late, "{who}");
        assert!(q.create.is_empty(), "{who}");
    }
    // Not answered (the write-ahead save only): a successor sends it again by name; the
    // maker that has no answer waits (its outcome is unknown, not known lost).
    let ahead = first.state.clone();
    assert!(ahead.answered.is_empty());
    let p = step(
        &listed,
        &ahead.clone().inherited(),
        &set,
        &Request::default(),
        1_000,
    )
    .unwrap();
    assert_eq!(ids_c(&p), vec![3]);
    assert!(p.create[0].retry);
    let p = step(&listed, &ahead, &set, &Request::default(), 1_000).unwrap();
    assert!(p.create.is_empty() && p.state.unacknowledged.len() == 1);
}

#[test]
fn ids_named_anywhere_in_the_state_are_never_handed_out_again() {
    // F11: deleted and deleted_unseen ids above the counter.
    let mut st = AllocatorState::new();
    st.target = Some(2);
    st.last_executor_id = 3;
    st.deleted = vec![7];
    st.deleted_unseen = vec![Unacknowledged {
        executor_id: 9,
        created_ms: 0,
        retry: false,
        profile: 0,
    }];
    let p = step(&snap(&[]), &st, &settings(5), &Request::default(), 1).unwrap();
    assert_eq!(ids_c(&p), vec![10, 11]);
}

// ---- property tests: a random cluster driven by the step --------------------------------

#[derive(Clone, Debug)]
enum Event {
    Target(u32),
    Progress(u8),
    Fail(u8),
    LoseCreates,
    Advance(u32),
    Remove(u8),
    LoseState,
    /// The next creates are rejected by a quota (fed back through `record`).
    Quota,
    /// The next creates are refused as the template is (400): creates back off.
    Refused,
    /// The next creates' outcome is unknown; `true`: they happened.
    Ambiguous(bool),
    /// A running pod's node stops reporting: the pod turns Unknown.
    NodeLost(u8),
    /// Another process takes over: it reads the state as a successor does.
    Successor,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (0u32..30).prop_map(Event::Target),
        any::<u8>().prop_map(Event::Progress),
        any::<u8>().prop_map(Event::Fail),
        Just(Event::LoseCreates),
        (0u32..90_000).prop_map(Event::Advance),
        any::<u8>().prop_map(Event::Remove),
        Just(Event::LoseState),
        Just(Event::Quota),
        Just(Event::Refused),
        any::<bool>().prop_map(Event::Ambiguous),
        any::<u8>().prop_map(Event::NodeLost),
        Just(Event::Successor),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    /// Invariants over random runs: no overshoot, ≤ batch per tick, ids strictly increasing
    /// and never reused, running never deleted for excess, terminating never deleted again.
    #[test]
    fn invariants_hold(
        batch in 1u32..8,
        events in proptest::collection::vec(event(), 1..60),
        vanish in prop_oneof![Just(0u8), any::<u8>()],
    ) {
        let set = settings(batch);
        let mut cluster: BTreeMap<u64, ExecutorState> = BTreeMap::new();
        let mut state = AllocatorState::new();
        let mut now = 0u64;
        let mut target = 0u32;
        let mut highest_ever = 0u64;
        let mut lose_next_creates = false;
        let mut quota_next = false;
        let mut refused_next = false;
        let mut ambiguous_next: Option<bool> = None;
        let mut remove: Vec<u64> = vec![];
        for ev in events {
            match ev {
                Event::Target(t) => target = t,
                Event::Progress(k) => {
                    for (i, (_, s)) in cluster.iter_mut().enumerate() {
                        if *s == ExecutorState::Pending && (k as usize + i).is_multiple_of(2) {
                            *s = ExecutorState::Running;
                        }
                    }
                }
                Event::Fail(k) => {
                    if let Some((_, s)) = cluster.iter_mut().nth(k as usize % 8) {
                        if *s == ExecutorState::Running { *s = ExecutorState::Failed; }
                    }
                }
                Event::NodeLost(k) => {
                    if let Some((_, s)) = cluster.iter_mut().nth(k as usize % 8) {
                        if *s == ExecutorState::Running { *s = ExecutorState::Unknown; }
                    }
                }
                Event::LoseCreates => lose_next_creates = true,
                Event::Quota => quota_next = true,
                Event::Refused => refused_next = true,
                Event::Ambiguous(happened) => ambiguous_next = Some(happened),
                Event::Successor => state = state.clone().inherited(),
                Event::Advance(ms) => now += ms as u64,
                Event::Remove(k) => remove = cluster.keys().copied().nth(k as usize % 6).into_iter().collect(),
                Event::LoseState => {
                    // Without a state file only the cluster remembers ids: new ids must
                    // still be above every id it shows.
                    state = AllocatorState::new();
                    highest_ever = cluster.keys().next_back().copied().unwrap_or(0);
                }
            }
            let snapshot = snap(&cluster.iter().map(|(&i, &s)| (i, s)).collect::<Vec<_>>());
            let req = Request { target: TargetChange::Set(target), remove: std::mem::take(&mut remove), ..Request::default() };
            let removing: Vec<u64> = req.remove.clone();
            let plan = step(&snapshot, &state, &set, &req, now).unwrap();
            let new_target = plan.state.target.unwrap();
            // Known lost, not waited out: an answered create the list does not show is no
            // longer waited for (nor sent again) after this step.
            for &id in state.answered.iter().filter(|id| !snapshot.executors.contains_key(id)) {
                let waited = state.unacknowledged.iter().any(|u| u.executor_id == id && !u.retry);
                if waited {
                    prop_assert!(plan.state.unacknowledged.iter().all(|u| u.executor_id != id), "{} still waited for", id);
                    prop_assert!(plan.create.iter().all(|c| c.executor_id != id), "{} sent again", id);
                }
            }
            // ≤ a batch per tick; none while a quota back-off is in force.
            prop_assert!(plan.create.len() <= batch as usize);
            if state.create_backoff.as_ref().is_some_and(|b| now < b.until_ms) {
                prop_assert!(plan.create.is_empty(), "created during a back-off");
            }
            prop_assert!(plan.requeue_after_ms != Some(0));
            // Ids strictly increasing and never seen before.
            let mut prev = highest_ever;
            for c in plan.create.iter().filter(|c| !c.retry) {
                prop_assert!(c.executor_id > prev, "id {} not above {}", c.executor_id, prev);
                prop_assert!(!cluster.contains_key(&c.executor_id));
                prev = c.executor_id;
            }
            // A create is sent again only for our own unseen, ambiguous request.
            for c in plan.create.iter().filter(|c| c.retry) {
                prop_assert!(!cluster.contains_key(&c.executor_id), "retry of a seen id");
                prop_assert!(state.unacknowledged.iter().any(|u| u.executor_id == c.executor_id && u.retry));
            }
            // No overshoot: creating only from a quiet state, up to the target.
            let running = snapshot.executors.values()
                .filter(|p| p.state == ExecutorState::Running && !removing.contains(&p.id))
                .count() as u32;
            let fresh = plan.create.iter().filter(|c| !c.retry).count() as u32;
            if fresh > 0 {
                prop_assert!(running + plan.create.len() as u32 <= new_target);
                // Unknown pods not yet lost count too (as ReplicaSet counts them).
                let unknown = snapshot.executors.values()
                    .filter(|p| p.state == ExecutorState::Unknown && !removing.contains(&p.id))
                    .filter(|p| !plan.delete.iter().any(|d| d.executor_id == p.id))
                    .count() as u32;
                prop_assert!(running + unknown + plan.create.len() as u32 <= new_target);
                // Nothing pending (removed pods are going away and do not block).
                let pending = snapshot.executors.values()
                    .filter(|p| p.state == ExecutorState::Pending && !removing.contains(&p.id))
                    .count();
                prop_assert_eq!(pending, 0);
            }
            for d in &plan.delete {
                match cluster.get(&d.executor_id) {
                    Some(ExecutorState::Running) => prop_assert_eq!(d.reason, DeleteReason::Removed),
                    Some(ExecutorState::Deleted) => prop_assert!(false, "deleted twice"),
                    _ => {}
                }
            }
            // Apply the plan to the model cluster.
            for d in &plan.delete {
                if d.if_pending && cluster.get(&d.executor_id) == Some(&ExecutorState::Running) {
                    continue;
                }
                if cluster.contains_key(&d.executor_id) {
                    cluster.insert(d.executor_id, ExecutorState::Deleted);
                }
            }
            cluster.retain(|_, s| *s != ExecutorState::Deleted || !now.is_multiple_of(3));
            let mut out = Outcomes::default();
            for (i, c) in plan.create.iter().enumerate() {
                if (quota_next || refused_next) && !c.retry {
                    // Refused: no pod ever had the id; the shell returns it.
                    out.returned.push(c.executor_id);
                    match quota_next {
                        true => out.quota = Some("exceeded quota: pods=10".into()),
                        false => out.refused = Some("quantities must match".into()),
                    }
                    continue;
                }
                highest_ever = highest_ever.max(c.executor_id);
                if let Some(happened) = ambiguous_next {
                    out.ambiguous.push(c.executor_id);
                    if happened == (i % 2 == 0) {
                        cluster.insert(c.executor_id, ExecutorState::Pending);
                    }
                } else if quota_next || refused_next {
                    out.ambiguous.push(c.executor_id);
                } else if vanish & (1 << (c.executor_id % 8)) != 0 {
                    // Answered, then deleted before any list saw it (half the runs: never).
                    out.created.push(c.executor_id);
                } else if !lose_next_creates {
                    out.created.push(c.executor_id);
                    cluster.insert(c.executor_id, ExecutorState::Pending);
                }
            }
            quota_next = false;
            refused_next = false;
            ambiguous_next = None;
            lose_next_creates = false;
            // The live count never exceeds the larger of the target and running before.
            let live = cluster.values().filter(|s| matches!(s, ExecutorState::Pending | ExecutorState::Running)).count() as u32;
            prop_assert!(live <= new_target.max(running), "live {} > target {}", live, new_target);
            state = record(&plan, &out, &set, now);
            // Refused ids are not waited for and are given back: the counter is below them
            // and at or above every id that may name a pod.
            prop_assert!(state.unacknowledged.iter().all(|u| !out.returned.contains(&u.executor_id)));
            prop_assert!(out.returned.iter().all(|&id| id > state.last_executor_id));
            prop_assert!(state.last_executor_id >= highest_ever.min(plan.state.last_executor_id));
            if !out.returned.is_empty() {
                prop_assert!(state.create_backoff.as_ref().is_some_and(|b| b.until_ms > now));
            }
            highest_ever = highest_ever.max(state.last_executor_id);
            now += 1000;
        }
    }
}

// ---- record: outcomes folded into the next state ------------------------------------------

fn planned(n: u32) -> Plan {
    from_fresh(&snap(&[]), &settings(5), n, 1_000)
}

#[test]
fn quota_sets_a_doubling_backoff_and_a_create_clears_it() {
    let plan = planned(3);
    let out = Outcomes {
        dropped: vec![1, 2, 3],
        quota: Some("exceeded quota".into()),
        failed: true,
        ..Outcomes::default()
    };
    let st = record(&plan, &out, &settings(5), 1_000);
    assert!(st.unacknowledged.is_empty());
    let b = st.create_backoff.clone().unwrap();
    assert_eq!(
        (b.delay_ms, b.until_ms),
        (MIN_BACKOFF_MS, 1_000 + MIN_BACKOFF_MS)
    );
    assert_eq!(st.counters.last_success_ms, None);
    // The step while backing off creates nothing and says when to come back.
    let p2 = step(&snap(&[]), &st, &settings(5), &Request::default(), 2_000).unwrap();
    assert!(p2.create.is_empty());
    assert_eq!(p2.requeue_after_ms, Some(MIN_BACKOFF_MS - 1_000));
    // A second rejection doubles it; a successful create clears it.
    let st2 = record(&p2, &out, &settings(5), 2_000);
    assert_eq!(
        st2.create_backoff.as_ref().unwrap().delay_ms,
        2 * MIN_BACKOFF_MS
    );
    let p3 = step(&snap(&[]), &st2, &settings(5), &Request::default(), 60_000).unwrap();
    assert_eq!(p3.create.len(), 3);
    let ok = Outcomes {
        created: vec![4, 5, 6],
        ..Outcomes::default()
    };
    let st3 = record(&p3, &ok, &settings(5), 60_000);
    assert_eq!(st3.create_backoff, None);
    assert_eq!(st3.counters.created, 3);
    assert_eq!(st3.counters.last_success_ms, Some(60_000));
}

#[test]
fn throttling_is_remembered_for_adaptive_batches_and_api_errors_counted() {
    let mut set = settings(4);
    set.policies.adaptive_max_batch = Some(16);
    let plan = from_fresh(&snap(&[]), &set, 10, 0);
    let out = Outcomes {
        created: vec![1, 2, 3, 4],
        throttled: true,
        api_errors: [(429, 2), (404, 1)].into_iter().collect(),
        ..Outcomes::default()
    };
    let st = record(&plan, &out, &set, 0);
    assert!(st.adaptive.as_ref().unwrap().throttled);
    assert_eq!(st.counters.api_errors.get("429"), Some(&2));
    assert_eq!(st.counters.api_errors.get("404"), None);
    // The next batch halves after throttling.
    use ExecutorState::*;
    let seen = snap(&[(1, Running), (2, Running), (3, Running), (4, Running)]);
    let p2 = step(&seen, &st, &set, &Request::default(), 1_000).unwrap();
    assert_eq!(p2.create.len(), 2);
}

#[test]
fn requeue_after_is_the_creation_deadline() {
    let plan = planned(2);
    // Created at 1 000 ms; timed out once strictly older than 60 s.
    assert_eq!(plan.requeue_after_ms, Some(60_001));
    let p2 = step(
        &snap(&[]),
        &plan.state,
        &settings(5),
        &Request::default(),
        31_000,
    )
    .unwrap();
    assert_eq!(p2.requeue_after_ms, Some(30_001));
}

#[test]
fn add_raises_the_target_and_keep_without_one_is_an_error() {
    let st = planned(3).state;
    let req = Request {
        target: TargetChange::Add(2),
        remove: vec![],
        ..Request::default()
    };
    let p = step(&snap(&[]), &st, &settings(5), &req, 2_000).unwrap();
    assert_eq!(p.summary.target, 5);
    assert_eq!(TargetChange::Add(4).apply(None), Some(4));
    assert_eq!(TargetChange::Keep.apply(None), None);
    assert_eq!(TargetChange::Add(1).apply(Some(u32::MAX)), Some(MAX_TARGET));
    assert_eq!(
        TargetChange::Add(2).apply(Some(MAX_TARGET - 1)),
        Some(MAX_TARGET)
    );
}

/// Spark 3.1+ (SPARK-33099): a target that dips and comes back within the executor idle
/// timeout deletes nothing and creates nothing new.
#[test]
fn idle_timeout_protects_fresh_requests_and_pending_pods() {
    let mut set = settings(5);
    set.policies.executor_idle_timeout_ms = Some(60_000);
    set.policies.max_pending = Some(u32::MAX);
    set.creation_timeout_floor_ms = SPARK3X_CREATION_TIMEOUT_MS;
    let p1 = from_fresh(&snap(&[]), &set, 5, 0);
    assert_eq!(p1.create.len(), 5);
    let mut pods = snap(&[(1, ExecutorState::Pending), (2, ExecutorState::Pending)]);
    for p in pods.executors.values_mut() {
        p.created_ms = Some(1_000);
    }
    let p2 = step(&pods, &p1.state, &set, &Request::set(0), 10_000).unwrap();
    assert!(p2.delete.is_empty() && p2.create.is_empty());
    let p3 = step(&pods, &p2.state, &set, &Request::set(5), 20_000).unwrap();
    assert!(p3.delete.is_empty() && p3.create.is_empty());
    // Once older than the timeout, the excess goes: requests oldest first, then pending pods.
    let p4 = step(&pods, &p2.state, &set, &Request::set(1), 70_000).unwrap();
    let ids: Vec<u64> = p4.delete.iter().map(|d| d.executor_id).collect();
    assert_eq!(ids, vec![3, 4, 5, 1]);
    assert!(p4.delete.iter().all(|d| d.if_pending));
}

// ---- the driver's lifecycle (`--driver-pod`) ------------------------------------------------

fn with_driver(mut s: Snapshot, d: DriverState) -> Snapshot {
    s.driver = Some(d);
    s
}

#[test]
fn a_pending_driver_blocks_creation_and_says_so() {
    let s = with_driver(snap(&[]), DriverState::Pending);
    let p = from_fresh(&s, &settings(5), 3, 0);
    assert!(p.create.is_empty());
    assert_eq!(p.blocked, Some(Blocked::DriverPending));
    let running = with_driver(snap(&[]), DriverState::Running);
    let p2 = step(&running, &p.state, &settings(5), &Request::default(), 1).unwrap();
    assert_eq!(p2.create.len(), 3);
    assert_eq!(p2.driver_ended, None);
}

#[test]
fn a_finished_or_deleted_driver_takes_every_executor_with_it() {
    use ExecutorState::*;
    let st = awaiting(5, &[(5, 0, true)]);
    let pods = snap(&[(1, Running), (2, Pending), (3, Failed), (4, Deleted)]);
    for d in [
        DriverState::Finished("Succeeded".into()),
        DriverState::Finished("Failed".into()),
        DriverState::Deleting,
    ] {
        let p = step(
            &with_driver(pods.clone(), d),
            &st,
            &settings(5),
            &Request::default(),
            9,
        )
        .unwrap();
        assert!(p.create.is_empty());
        let mut ids: Vec<u64> = p.delete.iter().map(|d| d.executor_id).collect();
        ids.sort();
        assert_eq!(
            ids,
            vec![1, 2, 3, 5],
            "every executor but the one already going"
        );
        assert!(p
            .delete
            .iter()
            .all(|d| d.reason == DeleteReason::DriverEnded && !d.if_pending));
        assert!(p.state.unacknowledged.is_empty());
        assert!(p.driver_ended.is_some() && !p.summary.converged);
        // The next tick (pods going) repeats nothing harmful: no create, no second delete.
        let gone = with_driver(
            snap(&[(1, Deleted), (2, Deleted), (3, Deleted)]),
            DriverState::Deleting,
        );
        let p2 = step(&gone, &p.state, &settings(5), &Request::default(), 10).unwrap();
        assert!(p2.create.is_empty() && p2.delete.is_empty());
    }
}

// ---- adaptive batches and Unschedulable pods -------------------------------------------------

/// A pending pod the scheduler could not place (`PodScheduled=False`, reason Unschedulable).
fn unschedulable_pod(id: u64) -> ExecutorPod {
    ExecutorPod {
        unschedulable: true,
        ..pod(id, ExecutorState::Pending)
    }
}

/// Running pods `running`, and Unschedulable pods `held`.
fn snap_held(running: impl IntoIterator<Item = u64>, held: &[u64]) -> Snapshot {
    let mut s = snap(
        &running
            .into_iter()
            .map(|i| (i, ExecutorState::Running))
            .collect::<Vec<_>>(),
    );
    for &i in held {
        s.executors.insert(i, unschedulable_pod(i));
    }
    s
}

/// Steps at `now` and records every create as done.
fn tick(
    snapshot: &Snapshot,
    st: &AllocatorState,
    set: &Settings,
    now: u64,
) -> (Plan, AllocatorState) {
    let p = step(snapshot, st, set, &Request::default(), now).unwrap();
    let out = Outcomes {
        created: ids_c(&p),
        ..Outcomes::default()
    };
    let next = record(&p, &out, set, now);
    (p, next)
}

#[test]
fn a_pod_that_stays_unschedulable_halves_the_adaptive_batch_once() {
    let mut set = settings(8);
    set.policies.adaptive_max_batch = Some(16);
    set.policies.max_pending = Some(100);
    let p = from_fresh(&snap(&[]), &set, 100, 0);
    assert_eq!(ids_c(&p), (1..=8).collect::<Vec<_>>());
    let out = Outcomes {
        created: ids_c(&p),
        ..Outcomes::default()
    };
    let st = record(&p, &out, &set, 0);
    // Pod 8 is Unschedulable: a new signal, the batch halves (8 → 4).
    let (p, st) = tick(&snap_held(1..=7, &[8]), &st, &set, 1_000);
    assert_eq!(ids_c(&p), vec![9, 10, 11, 12]);
    assert_eq!(st.adaptive.as_ref().unwrap().unschedulable_seen, 8);
    // Pod 8 still waits for a node; the new batch was all seen and scheduled: the batch
    // grows again (4 → 8) instead of halving on every tick the same pod waits.
    let (p, st) = tick(&snap_held((1..=7).chain(9..=12), &[8]), &st, &set, 2_000);
    assert_eq!(p.create.len(), 8, "{:?}", st.adaptive);
    assert_eq!(ids_c(&p), (13..=20).collect::<Vec<_>>());
    // A pod of the new batch turns Unschedulable: a new signal, halve again (8 → 4).
    let running = (1..=7).chain(9..=12).chain(13..=19);
    let (p, st) = tick(&snap_held(running, &[8, 20]), &st, &set, 3_000);
    assert_eq!(p.create.len(), 4);
    assert_eq!(st.adaptive.as_ref().unwrap().unschedulable_seen, 20);
    // The watermark persists through the state file.
    let json = serde_json::to_string(&st).unwrap();
    let back: AllocatorState = serde_json::from_str(&json).unwrap();
    assert_eq!(back.adaptive, st.adaptive);
    // A state written before the watermark existed reads as "none seen".
    let old: AdaptiveState = serde_json::from_str(r#"{"batch":3}"#).unwrap();
    assert_eq!(old.unschedulable_seen, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Adaptive batches with pods turning Unschedulable at random: the batch stays within
    /// 1 ..= the cap, the watermark never falls, a step halves at most once, and it shrinks
    /// only for a pod above the last watermark (or throttling).
    #[test]
    fn adaptive_batch_shrinks_only_on_new_unschedulable_pods(
        cap in 1u32..40,
        ticks in proptest::collection::vec((any::<u64>(), any::<bool>(), any::<bool>()), 1..40),
    ) {
        let mut set = settings(5);
        set.policies.adaptive_max_batch = Some(cap);
        set.policies.max_pending = Some(1_000);
        let mut st = AllocatorState::new();
        let mut held: Vec<u64> = vec![];
        let mut running: Vec<u64> = vec![];
        let mut last_created: Vec<u64> = vec![];
        for (k, (bits, release, throttle)) in ticks.into_iter().enumerate() {
            // Each pod of the last batch is held or runs, by one bit of `bits`.
            for (j, id) in last_created.drain(..).enumerate() {
                if bits >> (j % 64) & 1 == 1 { held.push(id) } else { running.push(id) }
            }
            if release {
                running.append(&mut held);
            }
            let snapshot = snap_held(running.iter().copied(), &held);
            let before = st.adaptive.clone();
            let p = step(&snapshot, &st, &set, &Request::set(10_000), k as u64 * 1_000).unwrap();
            let out = Outcomes { created: ids_c(&p), throttled: throttle, ..Outcomes::default() };
            st = record(&p, &out, &set, k as u64 * 1_000);
            last_created = ids_c(&p);
            let a = st.adaptive.clone().unwrap();
            prop_assert!((1..=cap).contains(&a.batch), "batch {} cap {}", a.batch, cap);
            prop_assert!(p.create.len() as u32 <= cap);
            if let Some(b) = before {
                prop_assert!(a.unschedulable_seen >= b.unschedulable_seen);
                prop_assert!(a.batch >= (b.batch / 2).max(1), "halved more than once");
                let new_held = held.iter().any(|&i| i > b.unschedulable_seen);
                if a.batch < b.batch {
                    prop_assert!(b.throttled || new_held, "shrank without a new signal");
                }
            }
        }
    }
}

// ---- slow-start within a tick ---------------------------------------------------------------

#[test]
fn slow_start_sends_the_batch_in_doubling_groups_up_to_the_cap() {
    let mut set = settings(20);
    set.policies.adaptive_max_batch = Some(20);
    set.policies.slow_start = true;
    set.policies.max_pending = Some(u32::MAX);
    let p = from_fresh(&snap(&[]), &set, 50, 0);
    assert_eq!(p.create.len(), 20, "the whole cap in one tick");
    assert_eq!(p.create_groups, vec![1, 2, 4, 8, 5]);
    let small = from_fresh(&snap(&[]), &set, 3, 0);
    assert_eq!(small.create_groups, vec![1, 2]);
    // Throttled last tick: the cap halves, as adaptive batches do.
    let out = Outcomes {
        created: (1..=20).collect(),
        throttled: true,
        ..Outcomes::default()
    };
    let st = record(&p, &out, &set, 0);
    let seen = snap(
        &(1..=20)
            .map(|i| (i, ExecutorState::Running))
            .collect::<Vec<_>>(),
    );
    let p2 = step(&seen, &st, &set, &Request::default(), 1_000).unwrap();
    assert_eq!(p2.create.len(), 10);
    assert_eq!(p2.create_groups, vec![1, 2, 4, 3]);
    // Without slow-start there are no groups.
    assert!(planned(3).create_groups.is_empty());
}

// ---- real clusters: disruptions, gates, terminating and Unknown pods ------------

fn failed_by(id: u64, disruption: Option<&str>) -> ExecutorPod {
    ExecutorPod {
        disruption: disruption.map(str::to_string),
        reason: Some("exit code 1".into()),
        ..pod(id, ExecutorState::Failed)
    }
}

fn of(pods: Vec<ExecutorPod>) -> Snapshot {
    Snapshot {
        executors: pods.into_iter().map(|p| (p.id, p)).collect(),
        ..Snapshot::default()
    }
}

#[test]
fn disruptions_are_replaced_but_never_trip_the_crash_loop_guard() {
    let mut set = settings(5);
    set.policies.max_failures = FailureLimit::Max(3);
    let evicted = [
        "EvictionByEvictionAPI",
        "PreemptionByScheduler",
        "Evicted",
        "TerminationByKubelet",
    ];
    let s = of((1..=4)
        .map(|i| failed_by(i, Some(evicted[i as usize - 1])))
        .collect());
    let p = step(&s, &AllocatorState::new(), &set, &Request::set(4), 0).unwrap();
    assert_eq!(p.halt, None);
    assert_eq!(ids_c(&p), vec![5, 6, 7, 8]);
    assert!(p.delete.iter().all(|d| d.reason == DeleteReason::Disrupted));
    assert!(p.state.failures.is_empty());
    assert_warns(&p, "PreemptionByScheduler");
    // Four real failures (exit 1) still halt.
    let s = of((5..=8).map(|i| failed_by(i, None)).collect());
    let p = step(&s, &p.state, &set, &Request::default(), 1000).unwrap();
    assert!(p.halt.is_some());
    assert!(p.create.is_empty());
}

#[test]
fn scheduling_gated_pods_count_but_do_not_hold_the_next_batch() {
    let gated = |id| ExecutorPod {
        gated: true,
        ..pod(id, ExecutorState::Pending)
    };
    let mut pods = vec![pod(1, ExecutorState::Running), gated(2)];
    let p = from_fresh(&of(pods.clone()), &settings(5), 4, 0);
    assert_eq!(ids_c(&p), vec![3, 4], "room = 4 - running 1 - gated 1");
    pods.extend([gated(3), gated(4)]);
    let p = step(
        &of(pods.clone()),
        &p.state,
        &settings(5),
        &Request::default(),
        1,
    )
    .unwrap();
    assert!(p.create.is_empty());
    assert_eq!(p.blocked, Some(Blocked::Gated { pods: 3 }));
    assert_eq!(
        p.blocked.unwrap().to_string(),
        "waiting for 3 scheduling-gated pods"
    );
    // With --max-pending, gated pods take no pending slot.
    let mut set = settings(5);
    set.policies.max_pending = Some(1);
    let p = from_fresh(&of(pods[..2].to_vec()), &set, 3, 0);
    assert_eq!(ids_c(&p), vec![3]);
}

#[test]
fn unknown_pods_count_until_lost_then_are_deleted_and_replaced() {
    let set = settings(5);
    let s = snap(&[(1, ExecutorState::Running), (2, ExecutorState::Unknown)]);
    let p = step(&s, &AllocatorState::new(), &set, &Request::set(2), 1000).unwrap();
    assert!(p.create.is_empty() && p.delete.is_empty());
    assert_eq!(
        p.blocked,
        Some(Blocked::Unknown {
            pods: 1,
            lost_in_ms: DEFAULT_UNKNOWN_TIMEOUT_MS + 1
        })
    );
    assert_eq!(p.requeue_after_ms, Some(DEFAULT_UNKNOWN_TIMEOUT_MS + 1));
    assert_eq!(p.state.unknown[0].since_ms, 1000);
    // Exactly at the timeout it still counts; strictly after it, it is lost.
    let at = 1000 + DEFAULT_UNKNOWN_TIMEOUT_MS;
    let p2 = step(&s, &p.state, &set, &Request::default(), at).unwrap();
    assert!(p2.delete.is_empty());
    let p3 = step(&s, &p2.state, &set, &Request::default(), at + 1).unwrap();
    assert_eq!(ids_d(&p3), vec![2]);
    assert_eq!(p3.delete[0].reason, DeleteReason::Lost);
    assert_eq!(ids_c(&p3), vec![3]);
    assert!(p3.state.unknown.is_empty() && p3.state.failures.is_empty());
    // A pod that leaves Unknown forgets its clock.
    let back = snap(&[(1, ExecutorState::Running), (2, ExecutorState::Running)]);
    let p4 = step(&back, &p2.state, &set, &Request::default(), at + 1).unwrap();
    assert!(p4.delete.is_empty() && p4.state.unknown.is_empty());
}

#[test]
fn count_terminating_counts_as_quota_charges_and_says_what_holds_the_app() {
    let mut set = settings(5);
    set.policies.count_terminating = true;
    let at = 100_000;
    let terminating = |id, terminal_phase| ExecutorPod {
        deletion_ms: Some(at),
        deletion_grace_ms: Some(30_000),
        terminal_phase,
        ..pod(id, ExecutorState::Deleted)
    };
    let s = of(vec![
        pod(1, ExecutorState::Running),
        terminating(2, false),
        terminating(3, true),
    ]);
    let p = from_fresh(&s, &set, 3, at + 5_000);
    assert_eq!(
        ids_c(&p),
        vec![4],
        "the Failed terminating pod does not count"
    );
    let s = of(vec![
        pod(1, ExecutorState::Running),
        pod(4, ExecutorState::Running),
        terminating(2, false),
    ]);
    let p = step(&s, &p.state, &set, &Request::default(), at + 5_000).unwrap();
    assert!(p.create.is_empty());
    let b = p.blocked.clone().unwrap();
    assert_eq!(
        b,
        Blocked::Terminating {
            pods: 1,
            oldest_ms: Some(35_000)
        }
    );
    assert!(
        b.to_string().contains("1 terminating pods") && b.to_string().contains("35s"),
        "{b}"
    );
    // Past deletionTimestamp + grace (the node is lost), it stops counting: replaced.
    let p = step(&s, &p.state, &set, &Request::default(), at + 30_001).unwrap();
    assert_eq!(ids_c(&p), vec![5]);
}

#[test]
fn every_permanent_startup_error_is_stuck_after_the_grace() {
    for r in [
        "ErrImageNeverPull",
        "CreateContainerError",
        "ImageInspectError",
        "RegistryUnavailable",
        "SignatureValidationFailed",
        "PreCreateHookError",
        "PreStartHookError",
    ] {
        assert!(STUCK_REASONS.contains(&r), "{r}");
        let mut set = settings(5);
        set.policies.startup_grace_ms = Some(10_000);
        let waiting = ExecutorPod {
            waiting: Some(format!("{r} (image spark:3.5)")),
            scheduled: true,
            ..pod(1, ExecutorState::Pending)
        };
        let s = of(vec![waiting]);
        let p = step(&s, &AllocatorState::new(), &set, &Request::set(1), 0).unwrap();
        assert!(p.delete.is_empty(), "{r}");
        let p = step(&s, &p.state, &set, &Request::default(), 10_001).unwrap();
        assert_eq!(p.delete[0].reason, DeleteReason::Stuck, "{r}");
        assert_eq!(
            ids_c(&p),
            vec![2],
            "{r}: replaced, not blocking every later batch"
        );
    }
}

#[test]
fn an_inconsistent_state_never_hands_an_id_out_again() {
    // A deleted id (or a failure record) above the counter: written by hand or another tool.
    let st = AllocatorState {
        last_executor_id: 5,
        deleted: vec![7],
        failures: vec![FailureRecord {
            executor_id: 9,
            at_ms: 0,
            reason: "exit code 1".into(),
        }],
        ..AllocatorState::new()
    };
    assert_eq!(st.highest_id(), 9);
    let p = step(&snap(&[]), &st, &settings(5), &Request::set(2), 0).unwrap();
    assert_eq!(ids_c(&p), vec![10, 11]);
}

#[test]
fn a_state_beyond_the_documented_limits_is_refused() {
    let ok = AllocatorState {
        target: Some(MAX_TARGET),
        ..AllocatorState::new()
    };
    assert!(ok.validate().is_ok());
    let big = AllocatorState {
        target: Some(MAX_TARGET + 1),
        ..AllocatorState::new()
    };
    assert!(big.validate().unwrap_err().contains("target 1000001"));
    for bad in [0, crate::engine::snapshot::MAX_EXECUTOR_ID + 1] {
        let s = AllocatorState {
            deleted: vec![bad],
            ..AllocatorState::new()
        };
        assert!(
            s.validate().unwrap_err().contains("deleted executor id"),
            "{bad}"
        );
    }
}

#[test]
fn with_count_terminating_a_lost_pod_is_not_replaced_in_the_step_that_deletes_it() {
    let mut set = settings(5);
    set.policies.count_terminating = true;
    set.policies.unknown_timeout_ms = Some(1000);
    let s = snap(&[(1, ExecutorState::Running), (2, ExecutorState::Unknown)]);
    let p = step(&s, &AllocatorState::new(), &set, &Request::set(2), 0).unwrap();
    let p = step(&s, &p.state, &set, &Request::default(), 1001).unwrap();
    assert_eq!(p.delete[0].reason, DeleteReason::Lost);
    assert!(
        p.create.is_empty(),
        "it is about to be a counted terminating pod"
    );
    set.policies.count_terminating = false;
    let p = step(&s, &AllocatorState::new(), &set, &Request::set(2), 0).unwrap();
    let p = step(&s, &p.state, &set, &Request::default(), 1001).unwrap();
    assert_eq!(
        ids_c(&p),
        vec![3],
        "without --count-terminating: replaced at once"
    );
}

/// One event of the multi-profile property test.
#[derive(Clone, Debug)]
enum ProfileEvent {
    /// Set profile P's target.
    Target(u32, u32),
    /// Pending pods turn Running.
    Start,
    /// Every request shows up as a Pending pod of its profile.
    Appear,
    /// One running pod fails.
    Fail(u8),
    /// Time passes, ms.
    Advance(u32),
}

fn profile_event() -> impl Strategy<Value = ProfileEvent> {
    prop_oneof![
        (0u32..3, 0u32..12).prop_map(|(p, t)| ProfileEvent::Target(p, t)),
        Just(ProfileEvent::Start),
        Just(ProfileEvent::Appear),
        any::<u8>().prop_map(ProfileEvent::Fail),
        (0u32..30_000).prop_map(ProfileEvent::Advance),
    ]
}

/// A snapshot of `cluster` (id → state, profile label).
fn profile_snap(cluster: &BTreeMap<u64, (ExecutorState, u32)>) -> Snapshot {
    of(cluster
        .iter()
        .map(|(&id, &(state, profile))| ExecutorPod {
            profile,
            created_ms: Some(0),
            ..pod(id, state)
        })
        .collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Resource profiles, under both policies: at most a batch per profile per tick, no
    /// profile's running + pending + requests above its target after a create, ids from one
    /// counter never reused across profiles, and every create for a profile with a target.
    #[test]
    fn profile_invariants_hold(
        batch in 1u32..6,
        spark3x in any::<bool>(),
        max_pending in proptest::option::of(1u32..6),
        events in proptest::collection::vec(profile_event(), 1..50),
    ) {
        let mut set = settings(batch);
        if spark3x {
            set.policies.max_pending = Some(max_pending.unwrap_or(u32::MAX));
            set.policies.executor_idle_timeout_ms = Some(10_000);
        }
        let mut cluster: BTreeMap<u64, (ExecutorState, u32)> = BTreeMap::new();
        let mut state = AllocatorState::new();
        let (mut now, mut highest) = (0u64, 0u64);
        let mut req = Request::set(0);
        for ev in events {
            match ev {
                ProfileEvent::Target(0, t) => req.target = TargetChange::Set(t),
                ProfileEvent::Target(p, t) => { req.profiles.insert(p, TargetChange::Set(t)); }
                ProfileEvent::Start => cluster.values_mut()
                    .filter(|(s, _)| *s == ExecutorState::Pending)
                    .for_each(|(s, _)| *s = ExecutorState::Running),
                ProfileEvent::Appear => for u in &state.unacknowledged {
                    cluster.insert(u.executor_id, (ExecutorState::Pending, u.profile));
                },
                ProfileEvent::Fail(k) => if let Some((s, _)) = cluster.values_mut()
                    .filter(|(s, _)| *s == ExecutorState::Running).nth(k as usize % 4) {
                    *s = ExecutorState::Failed;
                },
                ProfileEvent::Advance(ms) => now += ms as u64,
            }
            let plan = step(&profile_snap(&cluster), &state, &set, &req, now).unwrap();
            let targets = plan.state.targets();
            let multi = targets.len() > 1;
            let counted = |label: u32| if multi { label } else { 0 };
            let fresh: Vec<&Create> = plan.create.iter().filter(|c| !c.retry).collect();
            for (&p, &target) in &targets {
                let made = fresh.iter().filter(|c| counted(c.profile) == p).count() as u32;
                prop_assert!(made <= batch, "profile {p}: {made} creates, batch {batch}");
                if made == 0 {
                    continue;
                }
                let gone = |id: u64| plan.delete.iter().any(|d| d.executor_id == id);
                let live = cluster.iter()
                    .filter(|(&id, &(s, l))| counted(l) == p && !gone(id)
                        && matches!(s, ExecutorState::Running | ExecutorState::Pending))
                    .count() as u32;
                let unack = plan.state.unacknowledged.iter()
                    .filter(|u| counted(u.profile) == p && !cluster.contains_key(&u.executor_id))
                    .count() as u32;
                prop_assert!(live + unack <= target, "profile {p}: {live} + {unack} > {target}");
            }
            prop_assert!(fresh.iter().all(|c| targets.contains_key(&c.profile)));
            for c in &fresh {
                prop_assert!(c.executor_id > highest, "id {} reused", c.executor_id);
                highest = c.executor_id;
            }
            for d in &plan.delete {
                cluster.remove(&d.executor_id);
            }
            state = plan.state;
            req = Request::default();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Ids are never reused, even by a state whose counter is behind the cluster (a home
    /// recreated, its status wiped, a state written by hand): every id the step hands out is
    /// above every id the snapshot shows, in any state, and above every id handed out before.
    #[test]
    fn ids_never_reused_when_the_counter_is_behind_the_snapshot(
        pods in proptest::collection::btree_map(1u64..500, 0usize..6, 0..20),
        counter in 0u64..500,
        targets in proptest::collection::vec(0u32..40, 1..8),
    ) {
        use ExecutorState::*;
        let states = [Pending, Running, Failed, Succeeded, Deleted, Unknown];
        let mut cluster: BTreeMap<u64, ExecutorState> =
            pods.into_iter().map(|(id, s)| (id, states[s])).collect();
        let mut st = AllocatorState::new();
        st.last_executor_id = counter.min(cluster.keys().next_back().copied().unwrap_or(0));
        let mut seen: Vec<u64> = cluster.keys().copied().collect();
        let set = settings(10);
        for (k, target) in targets.into_iter().enumerate() {
            let now = 1_000 * (k as u64 + 1);
            let s = snap(&cluster.iter().map(|(&i, &s)| (i, s)).collect::<Vec<_>>());
            let p = step(&s, &st, &set, &Request::set(target), now).unwrap();
            for c in &p.create {
                prop_assert!(!seen.contains(&c.executor_id), "id {} reused", c.executor_id);
                seen.push(c.executor_id);
                cluster.insert(c.executor_id, Pending);
            }
            let out = Outcomes { created: ids_c(&p), ..Outcomes::default() };
            st = record(&p, &out, &set, now);
            // The state forgets at random (wiped, recreated): its counter falls back.
            if k % 3 == 2 {
                st = AllocatorState::new();
            }
        }
    }
}

/// Issue 31 H1: a removal whose delete failed (5xx after the retries, 403: not in
/// [`Outcomes::deleted_ids`]) is kept ([`AllocatorState::removing`]) and asked again each
/// step without lowering the target again; a second request naming it is not a second
/// removal; done once the pod is deleted. It was forgotten, and the target lowered twice.
#[test]
fn a_removal_whose_delete_failed_is_asked_again_without_lowering_the_target_twice() {
    use ExecutorState::{Deleted, Running};
    let set = settings(5);
    let st = awaiting(3, &[]);
    let s = snap(&[(1, Running), (2, Running), (3, Running)]);
    let req = Request {
        target: TargetChange::Keep,
        remove: vec![2],
        ..Request::default()
    };
    let p = step(&s, &st, &set, &req, 0).unwrap();
    assert_eq!((ids_d(&p), p.state.target), (vec![2], Some(2)));
    let failed = Outcomes {
        failed: true,
        ..Outcomes::default()
    };
    let st = record(&p, &failed, &set, 10);
    assert_eq!((st.target, st.removing.clone()), (Some(2), vec![2]));
    for req in [Request::default(), req.clone()] {
        let q = step(&s, &st, &set, &req, 1_000).unwrap();
        assert_eq!(ids_d(&q), vec![2], "asked again: {req:?}");
        assert!(!q.delete[0].evict);
        assert_eq!(q.state.target, Some(2), "never lowered twice: {req:?}");
        assert!(q.create.is_empty(), "{req:?}");
        assert!(!q.summary.converged, "{req:?}");
        // Failing again: still kept.
        assert_eq!(record(&q, &failed, &set, 1_010).removing, vec![2]);
    }
    // Deleted: done, and not asked again while it terminates.
    let q = step(&s, &st, &set, &Request::default(), 2_000).unwrap();
    let done = Outcomes {
        deleted: 1,
        deleted_ids: vec![2],
        ..Outcomes::default()
    };
    let st = record(&q, &done, &set, 2_010);
    assert!(st.removing.is_empty(), "{:?}", st.removing);
    let s = snap(&[(1, Running), (2, Deleted), (3, Running)]);
    let q = step(&s, &st, &set, &req, 3_000).unwrap();
    assert!(q.delete.is_empty() && q.create.is_empty());
    assert_eq!(q.state.target, Some(2));
}

/// A state written when only put-off evictions were kept (`evicting`) reads as removals in
/// progress, and is written back under the new name.
#[test]
fn a_state_with_evicting_reads_as_removals_in_progress() {
    let st: AllocatorState =
        serde_json::from_str(r#"{"version":1,"target":2,"evicting":[4]}"#).unwrap();
    assert_eq!(st.removing, vec![4]);
    let json = serde_json::to_value(&st).unwrap();
    assert_eq!(json["removing"], serde_json::json!([4]));
}

/// Issue 31 H2: a removal that asked for the Eviction API (`remove --evict` handed to a loop
/// started without `--evict`: [`Request::evict`]) is evicted whatever the tick's flag, and
/// kept so ([`AllocatorState::removing_evict`]) when a budget puts it off; a removal that
/// did not ask follows the tick's flag, as before.
#[test]
fn a_removal_that_asked_for_eviction_is_evicted_whatever_the_loop_s_flag() {
    use ExecutorState::Running;
    let set = settings(5);
    assert!(!set.policies.evict);
    let st = awaiting(3, &[]);
    let s = snap(&[(1, Running), (2, Running), (3, Running)]);
    let queued = [
        Steering::bare(
            "a",
            SteerOp::Remove {
                ids: vec![2],
                evict: true,
            },
        ),
        Steering::bare(
            "b",
            SteerOp::Remove {
                ids: vec![3],
                evict: false,
            },
        ),
    ];
    let (req, taken) = take_requests(&Request::default(), &queued);
    assert_eq!((taken, req.evict.clone()), (2, vec![2]));
    let p = step(&s, &st, &set, &req, 0).unwrap();
    let how: Vec<(u64, bool)> = p.delete.iter().map(|d| (d.executor_id, d.evict)).collect();
    assert_eq!(how, vec![(2, true), (3, false)]);
    assert_eq!(p.state.removing_evict, vec![2]);
    let out = put_off(2, 3);
    let st = record(&p, &out, &set, 10);
    assert_eq!(
        (st.removing.clone(), st.removing_evict.clone()),
        (vec![2], vec![2])
    );
    // A later tick without --evict asks again through the Eviction API.
    let s = snap(&[(1, Running), (2, Running)]);
    let q = step(&s, &st, &set, &Request::default(), 1_000).unwrap();
    assert!(q.delete.len() == 1 && q.delete[0].evict, "{:?}", q.delete);
    assert_eq!(q.state.target, Some(1));
    // Evicted: nothing kept.
    let done = Outcomes {
        deleted_ids: vec![2],
        deleted: 1,
        ..Outcomes::default()
    };
    let st = record(&q, &done, &set, 1_010);
    assert!(st.removing.is_empty() && st.removing_evict.is_empty());
}

/// Attack H2: a removal written to one profile's ExecutorSet naming another profile's
/// executor (`kubectl patch es app1-rp1` removing executor 1, profile 0's, and lowering
/// rp1's spec.replicas 2 -> 1; and the reverse, on the home naming a profile-1 executor) was
/// applied: the executor deleted, its own profile replacing it (its absolute target not
/// lowered), the other profile one short. It is refused now: nothing deleted, nothing
/// replaced, each profile at its spec.replicas; the same removal on the executor's own
/// object is applied as before, and a queued one (no absolute targets) lowers the
/// executor's own profile.
#[test]
fn a_removal_written_to_another_profiles_object_is_refused() {
    use ExecutorState::Running;
    let set = settings(5);
    let cluster: BTreeMap<u64, (ExecutorState, u32)> = [
        (1, (Running, 0)),
        (2, (Running, 0)),
        (3, (Running, 1)),
        (4, (Running, 1)),
    ]
    .into();
    let s = profile_snap(&cluster);
    let mut st = AllocatorState::new();
    st.target = Some(2);
    st.profile_targets.insert(1, 2);
    st.last_executor_id = 4;
    let absolute = |home: u32, rp1: u32, id: u64, filed: u32| Request {
        target: TargetChange::Absolute(home),
        profiles: [(1, TargetChange::Absolute(rp1))].into(),
        remove: vec![id],
        filed: [(id, filed)].into(),
        ..Request::default()
    };
    for (req, what) in [
        (
            absolute(2, 1, 1, 1),
            "on rp1, naming profile 0's executor 1",
        ),
        (
            absolute(1, 2, 3, 0),
            "on the home, naming profile 1's executor 3",
        ),
    ] {
        let p = step(&s, &st, &set, &req, 0).unwrap();
        assert!(p.delete.is_empty(), "{what}: {:?}", p.delete);
        assert!(p.create.is_empty(), "{what}: {:?}", p.create);
        assert_eq!(p.refused_removals.len(), 1, "{what}");
        assert!(
            p.warnings.iter().any(|w| w.contains("refused")),
            "{what}: {:?}",
            p.warnings
        );
        let next = Request {
            remove: vec![],
            filed: BTreeMap::new(),
            ..req.clone()
        };
        let q = step(&s, &p.state, &set, &next, 1_000).unwrap();
        assert!(q.create.is_empty(), "{what}: replaced {:?}", q.create);
    }
    // The same removals on the executor's own object: applied, not replaced.
    for req in [absolute(1, 2, 1, 0), absolute(2, 1, 3, 1)] {
        let p = step(&s, &st, &set, &req, 0).unwrap();
        assert_eq!(ids_d(&p), req.remove);
        assert!(p.create.is_empty() && p.refused_removals.is_empty());
    }
    // A queued removal (targets not absolute) lowers the executor's own profile.
    let queued = Request {
        remove: vec![1],
        filed: [(1, 1)].into(),
        ..Request::default()
    };
    let p = step(&s, &st, &set, &queued, 0).unwrap();
    assert_eq!(ids_d(&p), vec![1]);
    assert_eq!((p.state.target, p.state.profile_targets[&1]), (Some(1), 2));
}
