//! Highly available `run`: several `run --leader-elect` processes on one app, each with a
//! bearer token of its own, on the simulator's Leases and on a real kube-apiserver's (most
//! cases run as `NAME::on_sim` and `NAME::on_real`, see `tests/both.rs`). The server's own
//! record names the process behind every request: the simulator's request log, or
//! kube-apiserver's audit log (`scripts/controlplane.sh` audits the candidates' pod,
//! configmap and lease requests at ResponseComplete). Short durations: lease 3 s, renew
//! deadline 2 s, retry period 500 ms.
//!
//! What is checked: exactly one process ticks at any time (the pod lists and writes of the
//! processes form disjoint, ordered intervals in the server's record: on the real server
//! from the first request's arrival to the last one's answer); a SIGTERM hands over within
//! about one retry period (the leader releases the Lease); a SIGKILL within lease duration +
//! retry period; a leader cut off from the API stops acting before its lease can expire; no
//! overshoot and no duplicate executor id through any of it.

use crate::both::{both, Act, Env, Pods, CANDIDATES};
use crate::util::{agent, spawn_replica, stderr, SimWorld, World, FAST_LEADER_ELECT};
use serde_json::{json, Value};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const APP: &str = "ha";
const LEASE: &str = "podalloc-ha";
const TARGET: u64 = 4;

/// `run --leader-elect` as process `who` (`POD_NAME=pod-WHO`, user `podalloc-WHO`).
fn candidate(e: &Env, who: &str) -> Child {
    candidate_with(e, who, &[])
}

/// [`candidate`] with extra environment variables (the pause hook).
fn candidate_with(e: &Env, who: &str, env: &[(&str, &str)]) -> Child {
    let metrics = metrics_path(e, who);
    let (metrics, target) = (metrics.to_str().unwrap(), TARGET.to_string());
    let args = crate::util::ha_run_args(&["--metrics-file", metrics], &target);
    let mut cmd = e.candidate_cmd(who, &args);
    cmd.envs(env.iter().copied());
    spawn_replica(&mut cmd, &format!("pod-{who}"), Stdio::piped())
}

/// Candidate a, started and waited for until it leads and has converged.
fn leading_a(e: &Env) -> Child {
    let a = candidate(e, "a");
    until(20, "a leads", || holder(e).as_deref() == Some("pod-a"));
    until(20, "a converges", || live_len(e) == TARGET);
    a
}

fn metrics_path(e: &Env, who: &str) -> std::path::PathBuf {
    e.dir.path().join(format!("metrics-{who}.prom"))
}

/// The value of metric `name` in process `who`'s metrics file.
fn metric(e: &Env, who: &str, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(metrics_path(e, who)).ok()?;
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string)
}

/// The path of Lease `name` in the test's namespace.
fn lease_path(e: &Env, name: &str) -> String {
    format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/{name}",
        e.ns
    )
}

/// Lease `name`'s holder (`None`: no Lease; `""`: no holder).
pub(crate) fn lease_holder(e: &Env, name: &str) -> Option<String> {
    let (code, v) = e.admin("GET", &lease_path(e, name), None);
    (code == 200).then(|| {
        v["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string()
    })
}

/// The app's Lease's holder.
fn holder(e: &Env) -> Option<String> {
    lease_holder(e, LEASE)
}

/// Polls until `f` holds, at most `secs`; returns how long it took.
fn until(secs: u64, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(secs), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    t.elapsed()
}

fn signal(c: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(c.id() as i32, sig) }, 0);
}

/// Whether `user` is one of the candidates.
fn is_candidate(user: &str) -> bool {
    CANDIDATES.iter().any(|w| user == format!("podalloc-{w}"))
}

/// A candidate's tick request (pods and the state ConfigMap) that reached the server (not
/// the simulator's 504 of a cut, which is not carried out), whatever its answer. A list of
/// ConfigMaps is not a tick's (a tick reads its ConfigMap by name): it is the search for the
/// app's home every command makes when it starts.
fn acting(a: &Act, writes_only: bool) -> bool {
    let search = a.resource == "configmaps" && a.verb == "list";
    let tick = a.resource == "pods" || (a.resource == "configmaps" && !search);
    is_candidate(&a.user) && tick && a.code != 504 && (a.is_write() || !writes_only)
}

/// Each user's first acting request's arrival and last one's answer (µs), in the order they
/// first acted.
fn terms(acts: &[Act], writes_only: bool) -> Vec<(String, u64, u64)> {
    let mut out: Vec<(String, u64, u64)> = Vec::new();
    for a in acts.iter().filter(|a| acting(a, writes_only)) {
        match out.iter_mut().find(|t| t.0 == a.user) {
            Some(t) => t.2 = t.2.max(a.done_us),
            None => out.push((a.user.clone(), a.at_us, a.done_us)),
        }
    }
    out
}

/// `terms` in ms since the first one began, for the reports.
fn relative(terms: &[(String, u64, u64)]) -> Vec<(String, u64, u64)> {
    let t0 = terms.first().map_or(0, |t| t.1);
    (terms.iter())
        .map(|(u, a, b)| (u.clone(), (a - t0) / 1000, (b - t0) / 1000))
        .collect()
}

/// The terms do not overlap: each user's last acting request was answered before the next
/// user's first arrived.
fn assert_disjoint(terms: &[(String, u64, u64)]) {
    for pair in terms.windows(2) {
        assert!(
            pair[0].2 < pair[1].1,
            "{} acted until {} µs, {} from {} µs: overlap",
            pair[0].0,
            pair[0].2,
            pair[1].0,
            pair[1].1
        );
    }
}

/// How many times a candidate's acting requests (`writes_only`: its pod and state writes;
/// else also its ticks' pod lists) resume after another candidate's began, in the order the
/// server received them: the number of overlapping (interleaved) terms. 0 when terms are
/// disjoint.
fn overlaps(acts: &[Act], writes_only: bool) -> usize {
    let mut runs: Vec<&str> = Vec::new();
    for a in acts.iter().filter(|a| acting(a, writes_only)) {
        if runs.last() != Some(&a.user.as_str()) {
            runs.push(&a.user);
        }
    }
    let mut distinct = runs.clone();
    distinct.sort();
    distinct.dedup();
    runs.len() - distinct.len()
}

/// [`overlaps`] of the writes that succeeded (2xx) only.
fn successful_write_overlaps(acts: &[Act]) -> usize {
    let ok: Vec<Act> = (acts.iter())
        .filter(|a| (200..300).contains(&a.code))
        .cloned()
        .collect();
    overlaps(&ok, true)
}

/// The server's name, for the reports.
pub(crate) fn server(e: &Env) -> &'static str {
    if e.control_plane().is_some() {
        "real"
    } else {
        "sim"
    }
}

fn fail_pod(e: &Env, id: u64) {
    e.set_phase(&e.exec(id), "Failed", 137, "OOMKilled");
}

fn live_len(e: &Env) -> u64 {
    e.live().len() as u64
}

fn assert_no_overshoot(e: &Env) {
    let s = e.stats();
    assert_eq!(s.duplicate_executor_ids, 0, "{s:?}");
    assert!(e.max_live() <= TARGET, "max live {}", e.max_live());
}

// The instrument itself: without leader election, two allocators with states of their own
// on one app tick a, b, a; the server's record must show exactly that interleaving (one
// overlap of writes, one of ticks), so a 0 elsewhere is a measurement, not a blind spot.
both!(
    the_servers_record_shows_two_unfenced_allocators_interleave,
    APP,
    Pods::default(),
    |e| {
        let tick = |who: &str, target: &str| {
            let store = format!("configmap:own-{who}");
            let args = ["--state-store", &store, "reconcile", "--target", target];
            let out = e.candidate_cmd(who, &args).output().unwrap();
            assert_eq!(out.status.code(), Some(0), "{who}: {}", stderr(&out));
        };
        tick("a", "2");
        tick("b", "2");
        tick("a", "3");
        let acts = e.acts();
        let t = terms(&acts, true);
        eprintln!(
            "leader[{}]: two unfenced allocators: overlapping writes {}, ticks {}; terms {:?}",
            server(e),
            overlaps(&acts, true),
            overlaps(&acts, false),
            relative(&t)
        );
        let users: Vec<&str> = t.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(users, ["podalloc-a", "podalloc-b"], "{t:?}");
        assert_eq!(overlaps(&acts, true), 1, "{t:?}");
        assert_eq!(overlaps(&acts, false), 1, "{:?}", terms(&acts, false));
        assert!(t[0].2 > t[1].1, "a's writes surround b's: {t:?}");
    }
);

/// Candidate a holds the Lease and says it leads, while b says it does not and has only
/// ever touched the Lease (besides the search for the app's home, a list of ConfigMaps or
/// ExecutorSets, when it started).
fn assert_a_leads_and_b_stands_by(e: &Env) {
    let b_calls: Vec<Act> = (e.acts().into_iter())
        .filter(|a| a.user == "podalloc-b")
        .filter(|a| {
            let home = a.resource == "configmaps" || a.resource == "executorsets";
            !(home && a.verb == "list")
        })
        .collect();
    assert!(!b_calls.is_empty());
    assert!(
        b_calls.iter().all(|a| a.resource == "leases"),
        "{b_calls:?}"
    );
    assert_eq!(holder(e).as_deref(), Some("pod-a"));
    assert_eq!(metric(e, "a", "podalloc_is_leader").as_deref(), Some("1"));
    assert_eq!(metric(e, "b", "podalloc_is_leader").as_deref(), Some("0"));
    assert_eq!(
        metric(e, "b", "podalloc_leader_transitions_total").as_deref(),
        Some("0")
    );
}

both!(
    one_leader_acts_and_sigterm_then_sigkill_hand_over,
    APP,
    Pods::default(),
    |e| {
        let a = leading_a(e);
        let mut b = candidate(e, "b");
        std::thread::sleep(Duration::from_millis(1500));
        assert_a_leads_and_b_stands_by(e);

        // SIGTERM: a finishes its tick, releases the Lease, exits 0; b takes over within one
        // retry period (plus client-go's jitter of up to 1.2 periods while standing by).
        signal(&a, libc::SIGTERM);
        let took = until(5, "b leads after SIGTERM", || {
            holder(e).as_deref() == Some("pod-b")
        });
        let out = a.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("released lease podalloc-ha"), "{err}");
        assert!(err.contains("pod-a became the leader"), "{err}");
        let sigterm = took;
        assert!(took < Duration::from_millis(2500), "{took:?}");

        // b acts: a failed executor is replaced by b.
        fail_pod(e, 2);
        until(5, "b's metrics say it leads", || {
            metric(e, "b", "podalloc_is_leader").as_deref() == Some("1")
        });
        assert_eq!(
            metric(e, "b", "podalloc_leader_transitions_total").as_deref(),
            Some("1")
        );
        until(10, "b replaces executor 2", || {
            let live = e.live();
            live.len() as u64 == TARGET && !live.contains(&2)
        });

        // SIGKILL: no release; c takes over once the Lease has not changed for its duration.
        let c = candidate(e, "c");
        std::thread::sleep(Duration::from_millis(700));
        signal(&b, libc::SIGKILL);
        let killed = Instant::now();
        until(10, "c leads after SIGKILL", || {
            holder(e).as_deref() == Some("pod-c")
        });
        let took = killed.elapsed();
        assert!(took < Duration::from_millis(3000 + 1100 + 1500), "{took:?}");
        let _ = b.wait();
        fail_pod(e, 3);
        until(10, "c replaces executor 3", || {
            let live = e.live();
            live.len() as u64 == TARGET && !live.contains(&3)
        });
        signal(&c, libc::SIGTERM);
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

        let acts = e.acts();
        let t = terms(&acts, false);
        eprintln!(
            "leader[{}]: SIGTERM handover {:.2}s, SIGKILL handover {:.2}s; overlapping ticks {}, \
             writes {} (successful writes {}); terms (ms) {:?}",
            server(e),
            sigterm.as_secs_f64(),
            took.as_secs_f64(),
            overlaps(&acts, false),
            overlaps(&acts, true),
            successful_write_overlaps(&acts),
            relative(&t)
        );
        let users: Vec<&str> = t.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(users, ["podalloc-a", "podalloc-b", "podalloc-c"], "{t:?}");
        assert_disjoint(&t);
        assert_eq!(overlaps(&acts, false), 0, "{t:?}");
        assert_no_overshoot(e);
        // Pod creates: each term's creates come from its own leader only.
        let creates: Vec<String> = (acts.iter())
            .filter(|a| a.verb == "create" && a.resource == "pods" && is_candidate(&a.user))
            .map(|a| a.user.clone())
            .collect();
        assert!(
            creates.starts_with(&vec!["podalloc-a".to_string(); TARGET as usize]),
            "{creates:?}"
        );
        assert!(
            creates.contains(&"podalloc-b".to_string())
                && creates.contains(&"podalloc-c".to_string()),
            "{creates:?}"
        );
    }
);

// A partition between the leader and the API server ([`Env::cut_off`]: on the simulator
// its calls hang, then 504; on the real server its route drops every byte).
both!(
    a_leader_cut_off_from_the_api_stops_acting_before_its_lease_expires,
    APP,
    Pods::default(),
    |e| {
        let mut a = leading_a(e);
        let mut b = candidate(e, "b");
        std::thread::sleep(Duration::from_millis(800));
        let cut = Instant::now();
        e.cut_off("a", Duration::from_secs(6));
        // b may take the Lease only 3 s after a's last renewal, which a cannot make now.
        let took = until(10, "b leads while a is cut off", || {
            holder(e).as_deref() == Some("pod-b")
        });
        assert!(took >= Duration::from_millis(2000), "{took:?}");
        // b acts while a is cut off, and again after the cut ended.
        fail_pod(e, 1);
        until(10, "b replaces executor 1", || {
            let live = e.live();
            live.len() as u64 == TARGET && !live.contains(&1)
        });
        let rest = Duration::from_secs(6).saturating_sub(cut.elapsed());
        std::thread::sleep(rest + Duration::from_millis(1500));
        fail_pod(e, 2);
        until(10, "b replaces executor 2", || {
            let live = e.live();
            live.len() as u64 == TARGET && !live.contains(&2)
        });
        assert_eq!(
            holder(e).as_deref(),
            Some("pod-b"),
            "a did not take it back"
        );
        // a stood down: became leader, then stopped (2 transitions); `status` names b.
        until(5, "a's metrics say it stood down", || {
            metric(e, "a", "podalloc_is_leader").as_deref() == Some("0")
        });
        assert_eq!(
            metric(e, "a", "podalloc_leader_transitions_total").as_deref(),
            Some("2")
        );
        let st = e.ok_out(&["--state-store", "configmap:ha-state", "status"]);
        assert!(
            st.contains("leader: pod-b (lease podalloc-ha, renewed 20"),
            "{st}"
        );
        let st = e.ok_out(&[
            "--state-store",
            "configmap:ha-state",
            "status",
            "-o",
            "json",
        ]);
        let v: Value = serde_json::from_str(&st).unwrap();
        assert_eq!(v["leader"]["holder"], "pod-b");
        assert_eq!(v["leader"]["transitions"], 1);
        for p in [&mut a, &mut b] {
            signal(p, libc::SIGTERM);
        }
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let a_err = stderr(&a);
        assert!(
            a_err.contains("could not renew the lease within the renew deadline; stopped acting"),
            "{a_err}"
        );
        assert_eq!(a.status.code(), Some(0), "{a_err}");
        assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
        // Writes (pods and the state ConfigMap) carried out by a all come before b's first.
        let acts = e.acts();
        let t = terms(&acts, true);
        eprintln!(
            "leader[{}]: takeover from a cut-off leader after {:.2}s; overlapping writes {} \
         (successful writes {}); writes of each term (user, first ms, last ms): {:?}",
            server(e),
            took.as_secs_f64(),
            overlaps(&acts, true),
            successful_write_overlaps(&acts),
            relative(&t)
        );
        let users: Vec<&str> = t.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(users, ["podalloc-a", "podalloc-b"], "{t:?}");
        assert_disjoint(&t);
        assert_eq!(overlaps(&acts, true), 0, "{t:?}");
        assert_no_overshoot(e);
    }
);

/// Two candidates; `edit` changes the Lease under them (as `kubectl` would) while pods keep
/// failing, so whoever thinks it leads writes. Then: no overlapping writes or ticks, someone
/// leads and acts again, `expect_holder` (if given) holds it, no overshoot.
fn lease_edit_keeps_one_actor(
    e: &Env,
    what: &str,
    edit: impl Fn(&Env),
    expect_holder: Option<&str>,
) {
    let started = Instant::now();
    let a = leading_a(e);
    let b = candidate(e, "b");
    std::thread::sleep(Duration::from_millis(1200));
    // Failures from 1 s before the edit to 5 s after it, one every 250 ms: whoever thinks it
    // leads has deletes and creates to make when the Lease changes.
    let mut edited = Instant::now();
    for i in 0..24 {
        if i == 4 {
            edited = Instant::now();
            edit(e);
        }
        if let Some(&id) = e.live().iter().min() {
            let _ = e.try_set_phase(&e.exec(id), "Failed", 1, "Error");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let held = until(30, "a candidate leads again", || {
        matches!(holder(e).as_deref(), Some("pod-a" | "pod-b"))
    });
    until(30, "the app converges again", || live_len(e) == TARGET);
    let recovered = edited.elapsed();
    if let Some(h) = expect_holder {
        assert_eq!(holder(e).as_deref(), Some(h), "{what}");
    }
    crate::util::stop_all(what, vec![a, b]);
    let acts = e.acts();
    let t = terms(&acts, true);
    let n = overlaps(&acts, true);
    let ticks = overlaps(&acts, false);
    let (last_old, first_new) = pause_after_edit(&acts);
    eprintln!(
        "leader[{}]: {what}: overlapping writes between identities: {n} (successful writes {}), \
         overlapping ticks: {ticks}; after the edit the leader's last write at +{last_old} ms, \
         the next term's first at +{first_new} ms (lease held again {:.1}s, converged {:.1}s \
         after it; case {:.1}s); terms (ms) {:?}",
        server(e),
        successful_write_overlaps(&acts),
        held.as_secs_f64() + 5.0,
        recovered.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        relative(&t)
    );
    assert_eq!(n, 0, "{what}: {t:?}");
    assert_eq!(ticks, 0, "{what}: {:?}", terms(&acts, false));
    assert_disjoint(&t);
    assert_disjoint(&terms(&acts, false));
    assert_no_overshoot(e);
}

/// Around the test's own Lease edit: how long after it (ms) the last write before the
/// longest pause in writes came, and the first after that pause (both 0 when the writes
/// did not pause for a second: the leader went on).
fn pause_after_edit(acts: &[Act]) -> (u64, u64) {
    let edit = acts
        .iter()
        .find(|a| {
            a.resource == "leases"
                && matches!(a.verb.as_str(), "update" | "delete")
                && (200..300).contains(&a.code)
                && !is_candidate(&a.user)
        })
        .map(|a| a.at_us / 1000)
        .expect("the edit is in the server's record");
    let writes: Vec<u64> = (acts.iter())
        .filter(|a| acting(a, true))
        .map(|a| a.at_us / 1000)
        .filter(|&ms| ms >= edit)
        .collect();
    let Some((a, b)) = std::iter::once(edit)
        .chain(writes)
        .collect::<Vec<_>>()
        .windows(2)
        .map(|p| (p[0], p[1]))
        .max_by_key(|(a, b)| b - a)
        .filter(|(a, b)| b - a >= 1000)
    else {
        return (0, 0);
    };
    (a - edit, b - edit)
}

/// A Lease PUT by hand: the current Lease with `spec` fields replaced (`null` removes).
/// Read and written again on 409, as `kubectl edit` has the user do when the leader renewed
/// in between.
pub(crate) fn put_lease(e: &Env, spec: Value) {
    put_lease_named(e, LEASE, spec);
}

/// [`put_lease`] on Lease `name`.
pub(crate) fn put_lease_named(e: &Env, name: &str, spec: Value) {
    let path = lease_path(e, name);
    for _ in 0..10 {
        let (code, mut l) = e.admin("GET", &path, None);
        assert_eq!(code, 200, "{l}");
        for (k, v) in spec.as_object().unwrap() {
            if v.is_null() {
                l["spec"].as_object_mut().unwrap().remove(k);
            } else {
                l["spec"][k] = v.clone();
            }
        }
        let (code, body) = e.admin("PUT", &path, Some(&l));
        if code != 409 {
            assert_eq!(code, 200, "{body}");
            return;
        }
    }
    panic!("the Lease kept changing under 10 edits");
}

both!(
    a_deleted_lease_never_gives_two_leaders,
    APP,
    Pods::default(),
    |e| {
        lease_edit_keeps_one_actor(
            e,
            "kubectl delete lease",
            |e| {
                let (code, body) = e.admin("DELETE", &lease_path(e, LEASE), None);
                assert_eq!(code, 200, "{body}");
            },
            None,
        );
    }
);

both!(
    a_holder_edited_to_the_standby_never_gives_two_leaders,
    APP,
    Pods::default(),
    |e| {
        lease_edit_keeps_one_actor(
            e,
            "holder edited to the standby",
            |e| put_lease(e, json!({"holderIdentity": "pod-b"})),
            None,
        );
    }
);

both!(
    a_holder_emptied_or_renamed_by_hand_never_gives_two_leaders,
    APP,
    Pods::default(),
    |e| {
        lease_edit_keeps_one_actor(
            e,
            "holder emptied by hand",
            |e| put_lease(e, json!({"holderIdentity": ""})),
            None,
        );
        lease_edit_keeps_one_actor(
            &e.sibling("a_holder_renamed_by_hand"),
            "holder renamed to a stranger",
            |e| put_lease(e, json!({"holderIdentity": "someone-else"})),
            None,
        );
    }
);

both!(
    a_renew_time_moved_by_hand_keeps_the_leader,
    APP,
    Pods::default(),
    |e| {
        lease_edit_keeps_one_actor(
            e,
            "renewTime set in the future",
            |e| put_lease(e, json!({"renewTime": "2099-01-01T00:00:00.000000Z"})),
            Some("pod-a"),
        );
        lease_edit_keeps_one_actor(
            &e.sibling("a_renew_time_moved_to_the_past"),
            "renewTime set in the past",
            |e| put_lease(e, json!({"renewTime": "2001-01-01T00:00:00.000000Z"})),
            Some("pod-a"),
        );
    }
);

both!(
    a_lease_stripped_of_its_fields_never_gives_two_leaders,
    APP,
    Pods::default(),
    |e| {
        lease_edit_keeps_one_actor(
            e,
            "holder, duration and times removed",
            |e| {
                put_lease(
                    e,
                    json!({"holderIdentity": null, "leaseDurationSeconds": null,
                           "renewTime": null, "acquireTime": null}),
                )
            },
            None,
        );
    }
);

/// The executor ids the state ConfigMap `ha-state` lists as unacknowledged.
fn unacknowledged_in_state(e: &Env) -> Vec<u64> {
    let (code, cm) = e.admin(
        "GET",
        &format!("/api/v1/namespaces/{}/configmaps/ha-state", e.ns),
        None,
    );
    if code != 200 {
        return Vec::new();
    }
    let st: Value =
        serde_json::from_str(cm["data"]["state.json"].as_str().unwrap_or("{}")).unwrap_or_default();
    (st["unacknowledged"].as_array().into_iter().flatten())
        .filter_map(|u| u["executor_id"].as_u64())
        .collect()
}

// A leader that loses its Lease between its write-ahead save and its creates (a tick
// stalled past the renew deadline while the holder is edited away) makes none of them: its
// fence stops the calls and the save that would record it. When it leads again it must
// settle those saved ids by name at once (each created now, or found), not wait out the
// 60 s creation timeout with the app short of its target; and no id is handed out twice.
both!(
    a_leader_fenced_between_its_save_and_its_creates_sends_them_when_it_leads_again,
    APP,
    Pods::default(),
    |e| {
        let a = candidate_with(e, "a", &[("PODALLOC_PAUSE_AT", "after-write-ahead:1:3000")]);
        until(20, "a saves its first batch ahead of the creates", || {
            unacknowledged_in_state(e).len() as u64 == TARGET
        });
        let saved = unacknowledged_in_state(e);
        assert!(e.live().is_empty(), "paused before any create");
        put_lease(e, json!({"holderIdentity": "someone-else"}));
        let t = until(25, "the app converges on the saved ids", || {
            live_len(e) == TARGET
        });
        let mut live = e.live();
        live.sort();
        assert_eq!(live, saved, "the saved ids are created by name, none fresh");
        assert_eq!(holder(e).as_deref(), Some("pod-a"));
        signal(&a, libc::SIGTERM);
        let out = a.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("stopped acting at once"), "{err}");
        eprintln!(
            "leader[{}]: a fenced batch was created {:.1}s after the edit",
            server(e),
            t.as_secs_f64()
        );
        assert_no_overshoot(e);
    }
);

/// Real server only (the simulator's cut never delivers late): the leader is paused between
/// its write-ahead save and its creates; when it resumes, its Lease still fresh, its fence
/// lets the first create go, and its route to the server starts holding bytes for 8 s with
/// that create (a TCP outage, not a loss). Its Lease renewals are held too, so its fence
/// lapses, and its loop cuts the create's wait then (the request of a term that is over is
/// not waited for): the connection is closed behind the held request. The standby takes
/// the Lease 3 s after the leader's last renewal and creates the saved ids itself; then the
/// hold ends and the old leader's create, and its close, reach the server during the
/// standby's term. Leader election alone cannot stop a write delivered late; what must hold
/// is that the server does not carry it out (refused: the ids are names, AlreadyExists; or
/// dropped with its closed connection), so no write of two identities both succeeds in one
/// span, no id is made twice, and the app never overshoots.
mod a_create_delivered_late_by_a_partition_is_refused {
    use super::*;

    #[test]
    fn on_real() {
        let Some(env) = Env::real("late_delivery", APP, &Pods::default()) else {
            return;
        };
        let e = &env;
        // a's pods carry a large annotation: its creates are the requests the hold waits for.
        let note = "x".repeat(2000);
        let t = e.template(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  annotations:\n    note: {note}\nspec:\n  \
             containers:\n  - name: executor\n    image: img\n"
        ));
        let metrics = metrics_path(e, "a");
        let front = [
            "--template",
            &t,
            "--metrics-file",
            metrics.to_str().unwrap(),
        ];
        let target = TARGET.to_string();
        let mut cmd = e.candidate_cmd("a", &crate::util::ha_run_args(&front, &target));
        cmd.env("PODALLOC_PAUSE_AT", "after-write-ahead:1:3000");
        let a = spawn_replica(&mut cmd, "pod-a", Stdio::piped());
        until(20, "a saves its first batch ahead of the creates", || {
            unacknowledged_in_state(e).len() as u64 == TARGET
        });
        let paused = Instant::now();
        let b = candidate(e, "b");
        assert_eq!(holder(e).as_deref(), Some("pod-a"));
        std::thread::sleep(Duration::from_millis(2700).saturating_sub(paused.elapsed()));
        // Long enough that b has made the saved ids before a's create arrives: b leads about
        // 3 s after a's last renewal (seen 4.5 s into the hold) and creates at once.
        e.hold_from_next_write("a", Duration::from_secs(8));
        let held = Instant::now();
        until(30, "b leads", || holder(e).as_deref() == Some("pod-b"));
        let took = held.elapsed();
        until(30, "the app converges", || live_len(e) == TARGET);
        std::thread::sleep(Duration::from_secs(9).saturating_sub(held.elapsed()));
        until(30, "the app converges after the hold", || {
            live_len(e) == TARGET
        });
        let outs = crate::util::stop_all("the candidates", vec![a, b]);
        let a_err = stderr(&outs[0]);
        let cut = (a_err.lines())
            .find(|l| l.contains("create pod") && l.contains("no longer holds the leader lease"));
        let acts = e.acts();
        let t = terms(&acts, true);
        let b_first = (acts.iter())
            .find(|x| x.user == "podalloc-b" && acting(x, true))
            .map(|x| x.at_us)
            .expect("b wrote");
        let late: Vec<&Act> = (acts.iter())
            .filter(|x| x.user == "podalloc-a" && acting(x, true) && x.at_us > b_first)
            .collect();
        eprintln!(
            "leader[real]: creates delivered late: b led {:.2}s into the hold; a's create cut: \
             {cut:?}; a's writes received after b's first: {:?}; overlapping writes {} \
             (successful writes {}); terms (ms) {:?}",
            took.as_secs_f64(),
            late.iter()
                .map(|x| (&x.verb, &x.resource, x.code, (x.at_us - b_first) / 1000))
                .collect::<Vec<_>>(),
            overlaps(&acts, true),
            successful_write_overlaps(&acts),
            relative(&t)
        );
        // The scenario happened: a create was sent under a's fence and held, then cut.
        assert!(cut.is_some(), "a's held create was cut: {a_err}");
        assert!(
            late.iter().all(|x| x.code == 409),
            "every late write refused: {late:?}"
        );
        assert_eq!(successful_write_overlaps(&acts), 0, "{t:?}");
        assert_no_overshoot(e);
    }
}

/// `apps --leader-elect --discover` as process `who`, the states in ConfigMaps
/// (`podalloc-state-<app id>`) that every replica reads.
pub(crate) fn apps_candidate(e: &Env, who: &str) -> Child {
    apps_candidate_with(e, who, &FAST_LEADER_ELECT)
}

/// [`apps_candidate`] with the election flags `elect`.
pub(crate) fn apps_candidate_with(e: &Env, who: &str, elect: &[&str]) -> Child {
    let mut cmd = e.connect(&e.candidate_token(who));
    cmd.args([
        "--batch-delay",
        "200ms",
        "--image",
        "spark:3.5",
        "apps",
        "--discover",
        "spark-role=driver",
        "--state-configmaps",
        "podalloc-state",
        "--interval",
        "200ms",
    ])
    .args(elect);
    spawn_replica(&mut cmd, &format!("pod-{who}"), Stdio::piped())
}

const DRIVERS: usize = 20;

/// Live (Pending or Running, not terminating) executors per app.
pub(crate) fn live_by_app(e: &Env) -> std::collections::BTreeMap<String, u64> {
    let (code, list) = e.admin(
        "GET",
        &format!(
            "/api/v1/namespaces/{}/pods?labelSelector=spark-role%3Dexecutor",
            e.ns
        ),
        None,
    );
    assert_eq!(code, 200, "{list}");
    (crate::util::live_by_app(&list).into_iter())
        .map(|(app, n)| (app, n as u64))
        .collect()
}

both!(
    two_apps_replicas_on_twenty_discovered_apps_act_one_at_a_time_and_hand_over_on_sigkill,
    APP,
    Pods::default(),
    |e| {
        let started = Instant::now();
        let want: std::collections::BTreeMap<String, u64> = (0..DRIVERS)
            .map(|i| (format!("app-{i}"), (i % 4 + 1) as u64))
            .collect();
        for i in 0..DRIVERS {
            e.create_pod(&json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("drv-{i}"),
                "labels": {"spark-role": "driver", "spark-app-selector": format!("app-{i}")},
                "annotations": {"podalloc.io/executors": want[&format!("app-{i}")].to_string()}},
                "spec": {"containers": [{"name": "d", "image": "spark"}]}}));
        }
        let mut procs = vec![("a", apps_candidate(e, "a")), ("b", apps_candidate(e, "b"))];
        until(60, "every app at its target", || live_by_app(e) == want);
        let leader = lease_holder(e, "podalloc-apps").expect("a Lease");
        let li = procs
            .iter()
            .position(|p| format!("pod-{}", p.0) == leader)
            .unwrap();
        let (dead, mut killed) = procs.remove(li);
        let (alive, survivor) = procs.remove(0);
        // Failures keep the leader writing when it is killed.
        for id in 1..=3 {
            let _ = e.try_set_phase(&format!("app-3-exec-{id}"), "Failed", 1, "Error");
        }
        std::thread::sleep(Duration::from_millis(150));
        signal(&killed, libc::SIGKILL);
        let t = Instant::now();
        until(20, "the survivor takes the Lease", || {
            lease_holder(e, "podalloc-apps").as_deref() == Some(&format!("pod-{alive}"))
        });
        let took = t.elapsed();
        let _ = killed.wait();
        until(60, "every app at its target again", || {
            live_by_app(e) == want
        });
        signal(&survivor, libc::SIGTERM);
        let out = survivor.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!("pod-{alive} became the leader")),
            "{err}"
        );
        let acts = e.acts();
        let t_all = terms(&acts, false);
        let (n, n_writes) = (overlaps(&acts, false), overlaps(&acts, true));
        let s = e.stats();
        let creates = (acts.iter())
            .filter(|a| a.verb == "create" && a.resource == "pods" && is_candidate(&a.user))
            .count();
        eprintln!(
            "leader[{}]: apps --leader-elect, {DRIVERS} apps: {dead} led, SIGKILL, {alive} held the \
             lease {:.2}s later; overlapping ticks {n}, writes {n_writes} (successful writes {}); \
             {} executor creates, duplicate ids {}; {:.1}s in all; terms (ms) {:?}{}",
            server(e),
            took.as_secs_f64(),
            successful_write_overlaps(&acts),
            creates,
            s.duplicate_executor_ids,
            started.elapsed().as_secs_f64(),
            relative(&t_all),
            if e.record_is_whole() {
                ""
            } else {
                " (the simulator's request log kept only the last 1000 requests)"
            }
        );
        assert!(took < Duration::from_millis(3000 + 1100 + 1500), "{took:?}");
        assert_eq!((n, n_writes), (0, 0), "{t_all:?}");
        assert_disjoint(&t_all);
        assert_eq!(t_all.len(), 2, "{t_all:?}");
        assert_eq!(s.duplicate_executor_ids, 0);
        // Every live pod with the app's label counts: the driver is one of them.
        for (app, max) in &s.max_live_pods_by_app {
            if let Some(target) = want.get(app) {
                assert!(
                    *max <= target + 1,
                    "{app}: {max} live pods for a target of {target} and the driver"
                );
            }
        }
        assert!(s.max_live_pods_by_app.len() >= DRIVERS, "{s:?}");
    }
);

both!(
    the_first_apps_leader_elect_takes_a_missing_lease_at_once_as_run_does,
    APP,
    Pods::default(),
    |e| {
        // Nothing of podalloc's in the namespace: nobody led there, so the Lease is created
        // at once (with the default 15 s lease it was taken ~17 s later, silently).
        let a = apps_candidate_with(e, "a", &["--leader-elect"]);
        let took = until(30, "a leads", || {
            lease_holder(e, "podalloc-apps").as_deref() == Some("pod-a")
        });
        eprintln!("apps --leader-elect: a fresh namespace's Lease taken in {took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        signal(&a, libc::SIGTERM);
        let err = stderr(&a.wait_with_output().unwrap());
        assert!(!err.contains("is missing"), "{err}");
        // Beside a state ConfigMap of podalloc's, or an ExecutorSet (a discovered app's home
        // that an apps leader acts on without making a ConfigMap), a missing Lease may be one
        // deleted under a leader that still acts: it waits one lease duration, and says why.
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": "podalloc-state-x", "labels": {"app.kubernetes.io/managed-by": "podalloc"}}});
        let es = json!({"apiVersion": "podalloc.io/v1alpha1", "kind": "ExecutorSet",
            "metadata": {"name": "x", "labels": {"spark-app-selector": "x"}},
            "spec": {"appId": "x"}});
        let homes = [
            (
                "appsleasewait",
                "api/v1",
                "configmaps",
                cm,
                "(the namespace holds ConfigMap podalloc-state-x of podalloc's)",
            ),
            (
                "appsleasewaites",
                "apis/podalloc.io/v1alpha1",
                "executorsets",
                es,
                "(the namespace holds ExecutorSet x)",
            ),
        ];
        for (test, api, plural, home, found) in homes {
            let e = e.sibling(test);
            let path = format!("/{api}/namespaces/{}/{plural}", e.ns);
            assert_eq!(e.admin("POST", &path, Some(&home)).0, 201, "{plural}");
            let b = apps_candidate(&e, "b");
            let took = until(30, "b leads", || {
                lease_holder(&e, "podalloc-apps").as_deref() == Some("pod-b")
            });
            assert!(took >= Duration::from_secs(3), "{plural}: {took:?}");
            signal(&b, libc::SIGTERM);
            let err = stderr(&b.wait_with_output().unwrap());
            let said = "lease podalloc-apps is missing: it is created once it has stayed \
                        missing for a lease duration";
            assert!(err.contains(said), "{plural}: {err}");
            // It names what it found (issue 30: trial findings).
            assert!(err.contains(found), "{plural}: {err}");
        }
    }
);

both!(
    a_lease_the_rbac_refuses_ends_run_and_apps_leader_elect_with_exit_4_and_one_line,
    APP,
    Pods::default(),
    |env| {
        let e = env.sibling_forbidding("leasesforbidden", "lease-get", ("leases", "get"));
        // The Role's change is in force once a Lease read as podalloc is refused.
        e.wait_for("the Role without leases get", |e| {
            e.as_podalloc("GET", &lease_path(e, LEASE), None).0 == 403
        });
        // It retried every retry period for ever, a warning each time (a new user's trial:
        // 258 lines in 10 minutes); now the first refusal ends it, as `apps`' claim does.
        let t0 = Instant::now();
        let args = [
            "--state-store",
            "configmap:ha-state",
            "run",
            "--target",
            "1",
        ];
        let args = [&args[..], &["--timeout", "20s"], &FAST_LEADER_ELECT[..]].concat();
        let err = e.exits(&args, 4);
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        let lease = format!("Lease {}/{LEASE}", e.ns);
        let fix = "grant leases get/create/update in API group coordination.k8s.io";
        let line = format!("run --leader-elect: the RBAC refused get on {lease} (403 Forbidden)");
        crate::util::assert_contains_all(&err, &[&line, fix]);
        assert_eq!(err.matches("403").count(), 1, "one line: {err}");
        assert!(
            e.live().is_empty(),
            "a replica without the Lease never acts"
        );
        // `apps --leader-elect` alike, on its own Lease.
        let mut apps = e.connect(&e.candidate_token("a"));
        apps.args(["--image", "img", "apps", "--discover", "spark-role=driver"])
            .args(["--timeout", "20s"])
            .args(FAST_LEADER_ELECT);
        let err = crate::util::exits(&mut apps, 4);
        let line = format!(
            "apps --leader-elect: the RBAC refused get on Lease {}/podalloc-apps",
            e.ns
        );
        crate::util::assert_contains_all(&err, &[&line, fix]);
        assert_eq!(err.matches("403").count(), 1, "one line: {err}");
    }
);

#[test]
fn leader_election_flags_are_validated_as_client_go_does() {
    let w = SimWorld::new().start();
    let bad = |extra: &[&str], want: &str| {
        let mut args = vec!["run", "--target", "1", "--leader-elect"];
        args.extend_from_slice(extra);
        let out = w.run(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{extra:?}: {}", stderr(&out));
    };
    bad(
        &["--leader-elect-lease-duration", "10s"],
        "--leader-elect-lease-duration (10s, in whole seconds) must be greater than --leader-elect-renew-deadline (10s)",
    );
    bad(
        &[
            "--leader-elect-renew-deadline",
            "2s",
            "--leader-elect-retry-period",
            "2s",
        ],
        "must be greater than --leader-elect-retry-period (2s) × 1.2",
    );
    bad(
        &["--leader-elect-resource-name", "Not_A_Name"],
        "is not a valid Lease name",
    );
    assert_eq!(w.sim.stats().requests, 0, "nothing was sent");
}

/// A client of a simulator's Leases as the podalloc user.
struct LeaseClient {
    http: ureq::Agent,
    auth: String,
    /// The Leases of namespace default.
    url: String,
}

impl LeaseClient {
    fn new(w: &World) -> LeaseClient {
        LeaseClient {
            http: agent(w.sim.ca_pem().unwrap().as_bytes()),
            auth: format!("Bearer {}", w.token),
            url: format!(
                "{}/apis/coordination.k8s.io/v1/namespaces/default/leases",
                w.sim.url()
            ),
        }
    }

    /// `method` on `url` with `body`: the code, and the JSON body (Null if none).
    fn send(&self, method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
        let b = ureq::http::Request::builder()
            .method(method)
            .uri(url)
            .header("Authorization", &self.auth)
            .header("Content-Type", "application/json");
        let mut resp = match body {
            Some(v) => self.http.run(b.body(v.to_string()).unwrap()),
            None => self.http.run(b.body(()).unwrap()),
        }
        .unwrap();
        let code = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        (code, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// Lease `l`, held by `holder`, at resourceVersion `rv` when given.
fn lease_of(holder: &str, rv: Option<&str>) -> Value {
    let mut l = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 0}});
    if let Some(rv) = rv {
        l["metadata"]["resourceVersion"] = json!(rv);
    }
    l
}

/// The simulator's Leases: create, 409 on a second create or a stale update, get, delete.
#[test]
fn the_simulator_serves_leases_with_optimistic_concurrency() {
    let w = SimWorld::new().start();
    let c = LeaseClient::new(&w);
    let (url, send) = (c.url.clone(), |m: &str, u: &str, b| c.send(m, u, b));
    let (code, created) = send("POST", &url, Some(lease_of("a", None)));
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["kind"], "Lease");
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, st) = send("POST", &url, Some(lease_of("b", None)));
    assert_eq!(code, 409);
    assert_eq!(st["reason"], "AlreadyExists");
    assert_eq!(
        st["message"],
        "leases.coordination.k8s.io \"l\" already exists"
    );
    assert_eq!(st["details"]["group"], "coordination.k8s.io");
    let one = format!("{url}/l");
    let (code, updated) = send("PUT", &one, Some(lease_of("a", Some(&rv))));
    assert_eq!(code, 200, "{updated}");
    let (code, updated) = send("PUT", &one, Some(lease_of("b", Some(&rv))));
    assert_eq!(code, 200, "a changed spec writes a new version: {updated}");
    let (code, st) = send("PUT", &one, Some(lease_of("c", Some(&rv))));
    assert_eq!(code, 409);
    assert_eq!(st["reason"], "Conflict");
    assert_eq!(
        st["message"],
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"l\": the object has been modified; please apply your changes to the latest version and try again"
    );
    let (code, got) = send("GET", &one, None);
    assert_eq!(
        (code, got["spec"]["holderIdentity"].clone()),
        (200, json!("b"))
    );
    let (code, st) = send(
        "PUT",
        &one,
        Some(json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 0}})),
    );
    assert_eq!(code, 422, "{st}");
    let (code, _) = send("DELETE", &one, None);
    assert_eq!(code, 200);
    let (code, st) = send("GET", &one, None);
    assert_eq!(code, 404);
    assert_eq!(st["message"], "leases.coordination.k8s.io \"l\" not found");
}

/// A partitioned user's Lease calls hang until the cut ends, then 504, not carried out.
#[test]
fn a_lease_create_cut_off_from_the_simulator_is_504_and_not_carried_out() {
    let w = SimWorld::new().start();
    let c = LeaseClient::new(&w);
    let (url, send) = (c.url.clone(), |m: &str, u: &str, b| c.send(m, u, b));
    let one = format!("{url}/l");
    // A partition: the user's calls hang until the cut ends, then 504, not carried out.
    let (code, _) = w.api(
        "POST",
        "/sim/cut",
        Some(&json!({"user": "system:serviceaccount:default:podalloc", "seconds": 0.5})),
    );
    assert_eq!(code, 200);
    let t = Instant::now();
    let (code, _) = send("POST", &url, Some(lease_of("a", None)));
    assert_eq!(code, 504);
    assert!(
        t.elapsed() >= Duration::from_millis(450),
        "{:?}",
        t.elapsed()
    );
    let (code, _) = send("GET", &one, None);
    assert_eq!(code, 404, "the cut-off create was not carried out");
    let last: Value = serde_json::from_str(w.sim.request_log().lines().last().unwrap()).unwrap();
    assert_eq!(last["user"], "system:serviceaccount:default:podalloc");
    assert_eq!(last["verb"], "lease-get");
}

/// The simulator's Leases as the apiserver has them: an update without
/// `metadata.resourceVersion` is 422 (Leases allow no unconditional update), and a
/// `renewTime` must be a `MicroTime` with six fractional digits (400 otherwise).
#[test]
fn the_simulator_refuses_unconditional_lease_updates_and_loose_times() {
    let w = SimWorld::new().start();
    let url = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let lease = |renew: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
               "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": renew}})
    };
    let (code, st) = w.api("POST", url, Some(&lease("2026-01-01T00:00:00Z")));
    assert_eq!(code, 400, "{st}");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains(r#"cannot parse "Z" as ".000000""#),
        "{st}"
    );
    let (code, st) = w.api("POST", url, Some(&lease("2026-01-01T00:00:00.000000Z")));
    assert_eq!(code, 201, "{st}");
    let (code, st) = w.api(
        "PUT",
        &format!("{url}/l"),
        Some(&lease("2026-01-01T00:00:01.000000Z")),
    );
    assert_eq!(code, 422, "{st}");
    assert_eq!(
        st["message"],
        "Lease.coordination.k8s.io \"l\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
    );
}

// The loop renews its Lease itself, between its requests and while one waits: a pod list
// slower than the renew deadline (3 s against 2 s) does not make the leader's renewal late.
// The leader keeps the Lease through a minute of slow lists, replaces a failed executor,
// and the standby never acts: one term, 0 overlaps in the server's record.
both!(
    a_list_slower_than_the_renew_deadline_keeps_one_leader,
    APP,
    Pods::default(),
    |e| {
        let a = leading_a(e);
        let b = candidate(e, "b");
        std::thread::sleep(Duration::from_millis(800));
        e.slow_lists("a", Duration::from_secs(3));
        let slowed = e.server_now_us();
        fail_pod(e, 1);
        until(30, "a replaces executor 1 through its slow lists", || {
            let live = e.live();
            live.len() as u64 == TARGET && !live.contains(&1)
        });
        std::thread::sleep(Duration::from_secs(4));
        assert_eq!(holder(e).as_deref(), Some("pod-a"), "a kept the Lease");
        let outs = crate::util::stop_all("the candidates", vec![a, b]);
        let a_err = stderr(&outs[0]);
        assert!(!a_err.contains("stopped acting"), "{a_err}");
        let acts = e.acts();
        // a's pod lists after the slowing (arrivals, µs), and its Lease renewals between two
        // of them: each list waited 3 s for its answer, and a renewed meanwhile.
        let lists: Vec<u64> = (acts.iter())
            .filter(|x| x.user == "podalloc-a" && x.resource == "pods" && x.verb == "list")
            .filter(|x| x.at_us >= slowed)
            .map(|x| x.at_us)
            .collect();
        let renewals = |from: u64, to: u64| {
            (acts.iter())
                .filter(|x| x.user == "podalloc-a" && x.resource == "leases")
                .filter(|x| x.verb == "update" && x.code == 200)
                .filter(|x| (from..to).contains(&x.at_us))
                .count()
        };
        let gaps: Vec<(u64, usize)> = (lists.windows(2))
            .map(|w| ((w[1] - w[0]) / 1000, renewals(w[0], w[1])))
            .collect();
        let t = terms(&acts, false);
        eprintln!(
            "leader[{}]: pod lists slower than the renew deadline: between a's lists (ms, its \
             Lease renewals meanwhile) {gaps:?}; overlapping ticks {}, writes {}; terms (ms) {:?}",
            server(e),
            overlaps(&acts, false),
            overlaps(&acts, true),
            relative(&t)
        );
        assert!(!gaps.is_empty(), "{lists:?}");
        for (ms, renewed) in &gaps {
            assert!(*ms >= 2500 && *renewed >= 3, "{gaps:?}");
        }
        let users: Vec<&str> = t.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(users, ["podalloc-a"], "{t:?}");
        assert_eq!(overlaps(&acts, false), 0, "{t:?}");
        assert_no_overshoot(e);
    }
);

// A leader whose credential comes from a slow exec plugin (1.5 s a run, a token valid for
// 4 s, so renewed every 2 s or so) with a 3 s Lease and a 2 s renew deadline: the renewal
// runs beside the loop's requests, one run serves the Lease's client and the loop's, and no
// Lease renewal is late (the server's record of the candidate's Lease updates shows no gap
// of a renew deadline), so the leader never stops acting. Before, the Lease client ran a
// plugin of its own inside a renewal and lost the Lease.
both!(
    a_slow_exec_plugin_never_makes_a_lease_renewal_late,
    APP,
    Pods::default(),
    |e| {
        use std::os::unix::fs::PermissionsExt as _;
        let kube = e.dir.path().join("kube");
        std::fs::create_dir_all(&kube).unwrap();
        std::fs::write(kube.join("ca.crt"), e.ca_pem()).unwrap();
        let plugin = kube.join("plugin.sh");
        std::fs::write(
            &plugin,
            format!(
                r#"#!/bin/sh
d=$(dirname "$0")
echo run >> "$d/runs"
n=$(wc -l < "$d/runs" | tr -d ' ')
if [ "$n" -ge 2 ]; then sleep 1.5; fi
exp=$(date -u -d "@$(( $(date +%s) + 4 ))" +%Y-%m-%dT%H:%M:%SZ)
printf '{{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{{"token":"{}","expirationTimestamp":"%s"}}}}\n' "$exp"
"#,
                e.candidate_token("a")
            ),
        )
        .unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let kc = kube.join("config");
        std::fs::write(
            &kc,
            format!(
                "apiVersion: v1
kind: Config
current-context: c
clusters: [{{name: c, cluster: {{server: '{}', certificate-authority: ca.crt}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u, namespace: {}}}}}]
users:
- name: u
  user:
    exec: {{apiVersion: client.authentication.k8s.io/v1, command: ./plugin.sh, interactiveMode: Never}}
",
                e.url(),
                e.ns
            ),
        )
        .unwrap();
        let since = e.server_now_us();
        let mut cmd = crate::util::podalloc();
        cmd.arg("--kubeconfig").arg(&kc);
        cmd.args([
            "--app-id",
            &e.app,
            "--image",
            "img",
            "--state-store",
            "configmap:ha-state",
        ]);
        let out = (cmd.args(crate::util::with_fast_leader_elect(&crate::util::args(
            "run --target 2 --interval 500ms --timeout 12s",
        ))))
        .output()
        .unwrap();
        let log = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{log}");
        assert!(log.contains("became the leader"), "{log}");
        assert!(!log.contains("stopped acting"), "the Lease was lost: {log}");
        let runs = std::fs::read_to_string(kube.join("runs"))
            .unwrap()
            .lines()
            .count();
        // One run to start, then a renewal about every 3.5 s: a run per client would be twice.
        assert!((3..=5).contains(&runs), "{runs} runs: {log}");
        let updates: Vec<u64> = (e.acts().iter())
            .filter(|a| a.at_us >= since && a.user == "podalloc-a" && a.resource == "leases")
            .filter(|a| a.verb == "update" && a.code == 200)
            .map(|a| a.at_us)
            .collect();
        let gap = updates.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        eprintln!(
            "leader[{}]: slow exec plugin: {runs} runs, {} Lease updates, longest gap {} ms",
            server(e),
            updates.len(),
            gap / 1000
        );
        assert!(updates.len() >= 15, "{updates:?}");
        assert!(gap < 2_000_000, "a renewal {} ms late: {log}", gap / 1000);
    }
);
