//! Faults of a busy or broken API server, one test per row of docs/faults.md: what podalloc
//! does, its exit code, and that nothing is lost or duplicated.

use crate::util::{code, rules, stderr as err, SimWorld, World};
use podalloc_sim::SimOptions;
use std::time::{Duration, Instant};

const APP: &str = "fault-app";

fn world(faults: &[&str], tweak: impl FnOnce(&mut SimOptions)) -> World {
    SimWorld::fast(APP, "fault-token")
        .startup(Duration::from_millis(150))
        .faults(faults)
        .options(tweak)
        .start()
}

#[test]
fn throttled_429_plain_text_and_status_are_retried() {
    let w = world(&["list:429-text@1,3", "create:429-status@2"], |_| {});
    w.converge(6);
    let f = w.sim.stats().faults_injected;
    assert!(f.values().sum::<u64>() >= 3, "{f:?}");
}

#[test]
fn server_errors_and_resets_are_retried() {
    let w = world(
        &[
            "list:500@1",
            "create:503@1",
            "create:504@3",
            "get:reset@1",
            "list:reset@4",
        ],
        |_| {},
    );
    w.converge(5);
}

#[test]
fn retry_budget_ends_the_tick_cleanly_and_the_next_tick_carries_on() {
    let w = world(&["list:503@always"], |_| {});
    let started = Instant::now();
    let out = w.run(&["reconcile", "--target", "3"]);
    assert_eq!(code(&out), 1, "{}", err(&out));
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "bounded by the retry budget"
    );
    let last = err(&out).lines().last().unwrap_or("").to_string();
    assert!(last.contains("list pods") && last.contains("503"), "{last}");
    assert!(!w.state_file().exists(), "nothing acted, nothing written");
    w.sim.set_faults(vec![]);
    w.converge(3);
    // With a state file, a tick that fails before acting leaves it byte for byte as it was
    // (its API errors are not written into the totals).
    let before = std::fs::read(w.state_file()).unwrap();
    w.sim.set_faults(rules(&["list:503@always"]));
    assert_eq!(code(&w.run(&["reconcile"])), 1);
    assert_eq!(
        std::fs::read(w.state_file()).unwrap(),
        before,
        "state untouched"
    );
}

#[test]
fn lost_create_response_is_not_a_duplicate() {
    // The pod is created but the answer never arrives: the retried create gets 409
    // AlreadyExists for our own pod, which counts as created.
    let w = world(
        &["create:lost-response@1,2", "create:504-after-write@4"],
        |_| {},
    );
    w.converge(5);
    let s = w.sim.stats();
    assert!(s.create_conflicts >= 1, "the retry met the pod: {s:?}");
    assert_eq!(
        s.executor_ids_created.get(APP).unwrap(),
        &vec![1, 2, 3, 4, 5]
    );
}

#[test]
fn a_lost_create_resent_into_a_full_quota_is_counted_as_created() {
    // The third create fills the quota and its answer is lost; the client's resend meets
    // 403 `exceeded quota` (quota admission runs before the name is checked, as on
    // kube-apiserver), not 409. A GET by name finds our pod: created, no back-off, and id 3
    // is never handed out again (it was given back and reused after a delete).
    let w = world(&["create:lost-response@3"], |o| o.pod_quota = Some(3));
    let out = w.run(&["reconcile", "--target", "3"]);
    let e = err(&out);
    assert_eq!(code(&out), 0, "{e}");
    assert!(e.contains("pod fault-app-exec-3 exists and is ours"), "{e}");
    let st = w.state();
    assert_eq!(st["last_executor_id"], 3, "{st}");
    assert!(st.get("create_backoff").is_none(), "{st}");
    w.converge(3);
    assert_eq!(
        w.sim.stats().executor_ids_created.get(APP).unwrap(),
        &vec![1, 2, 3]
    );
}

#[test]
fn ticks_whose_creates_all_fail_back_off() {
    // A webhook failing with 500 (failurePolicy Fail): every create of a tick fails after
    // the client's retries. The ticks back off 1 s, 2 s, 4 s … as ticks that fail before
    // acting do (they came every ~4 s for ever: 25 webhook calls in 20 s).
    let w = world(&["create:500@always"], |_| {});
    let out = w.run(&[
        "run",
        "--target",
        "2",
        "--interval",
        "1s",
        "--timeout",
        "40s",
    ]);
    let e = err(&out);
    // When each tick line was logged (ms of the day): the waits between ticks grow 1 s, 2 s,
    // 4 s, 8 s, so the gap after the 4th tick is at least 4 s longer than after the 1st
    // (each gap also holds one tick's ~3.5 s of retries).
    let at: Vec<u64> = (e.lines())
        .filter(|l| l.contains("podalloc::controller::runner") && l.contains("] tick "))
        .filter_map(|l| {
            let t = l.get(12..24)?; // [YYYY-MM-DDTHH:MM:SS.mmmZ
            let (h, m, s) = (t.get(0..2)?, t.get(3..5)?, t.get(6..12)?);
            let s: f64 = s.parse().ok()?;
            Some(
                (h.parse::<u64>().ok()? * 3600 + m.parse::<u64>().ok()? * 60) * 1000
                    + (s * 1000.0) as u64,
            )
        })
        .collect();
    assert!(at.len() >= 5, "{e}");
    let gap = |i: usize| at[i + 1].saturating_sub(at[i]);
    assert!(
        gap(3) >= gap(0) + 4_000,
        "gaps {:?}: {e}",
        (0..at.len() - 1).map(gap).collect::<Vec<_>>()
    );
    assert!(e.contains("failed ticks in a row, next try in"), "{e}");
}

#[test]
fn truncated_bodies_are_retried_or_reported() {
    let w = world(&["list:truncate@1", "get:truncate@1"], |_| {});
    w.converge(3);
}

#[test]
fn expired_continue_token_restarts_the_list() {
    let w = world(&[], |_| {});
    w.converge(6);
    // Request 1 is the first page; request 2 carries the continue token and gets 410.
    w.sim.set_faults(rules(&["list:410@2"]));
    let out = w.run(&["--page-size", "2", "reconcile"]);
    assert!(out.status.success(), "{}", err(&out));
    assert!(w.sim.stats().faults_injected.values().sum::<u64>() >= 1);
}

#[test]
fn quota_stops_the_batch_and_backs_off() {
    let w = world(&[], |o| o.pod_quota = Some(3));
    let out = w.run(&["reconcile", "--target", "5"]);
    assert_eq!(code(&out), 1, "{}", err(&out));
    let e = err(&out);
    assert!(e.contains("exceeded quota: sim-quota"), "{e}");
    let st = w.state();
    assert_eq!(
        st["unacknowledged"].as_array().unwrap().len(),
        3,
        "rejected ids are not unacknowledged"
    );
    assert!(st["create_backoff"]["until_ms"].as_u64().unwrap() > 0);
    let creates = w.sim.stats().creates;
    // Within the back-off no create is attempted at all.
    std::thread::sleep(Duration::from_millis(400));
    let out = w.run(&["reconcile"]);
    assert!(out.status.success(), "{}", err(&out));
    assert_eq!(w.sim.stats().creates, creates);
    assert!(
        err(&out).contains("not creating executors"),
        "{}",
        err(&out)
    );
}

#[test]
fn forbidden_by_rbac_is_permanent_exit_4() {
    let w = world(&[], |o| o.forbid = vec!["create".into()]);
    let out = w.run(&["reconcile", "--target", "2"]);
    assert_eq!(code(&out), 4, "{}", err(&out));
    let e = err(&out);
    assert!(
        e.contains("forbidden") && e.contains("service account"),
        "{e}"
    );
    assert!(w.state()["unacknowledged"].as_array().unwrap().is_empty());
}

#[test]
fn invalid_pod_is_permanent_exit_4_naming_the_field() {
    let w = world(&[], |_| {});
    let tpl = w.path("bad.json");
    std::fs::write(
        &tpl,
        r#"{"metadata":{"labels":{"team":"bad value!"}},"spec":{"containers":[{"name":"e","image":"i"}]}}"#,
    )
    .unwrap();
    let out = w
        .cmd(&["reconcile", "--target", "2"])
        .arg("--template")
        .arg(&tpl)
        .output()
        .unwrap();
    assert_eq!(code(&out), 4, "{}", err(&out));
    assert!(err(&out).contains("metadata.labels"), "{}", err(&out));
    assert_eq!(w.sim.stats().live_pods, 0);
}

#[test]
fn rejected_token_file_is_a_credentials_error() {
    let w = world(&[], |_| {});
    let tf = w.path("token");
    std::fs::write(&tf, "not-the-token\n").unwrap();
    let out = w
        .cmd(&[
            "--token-file",
            tf.to_str().unwrap(),
            "reconcile",
            "--target",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 1, "{}", err(&out));
    let e = err(&out);
    assert!(e.contains("401") && e.contains("token file"), "{e}");
    assert!(!e.contains("not-the-token"));
}

#[test]
fn without_deletecollection_many_executors_are_deleted_one_by_one() {
    let w = world(&[], |o| o.forbid = vec!["deletecollection".into()]);
    w.converge(4);
    let out = w.run(&["remove", "1", "2", "3"]);
    assert!(out.status.success(), "{}", err(&out));
    let e = err(&out);
    assert_eq!(
        e.matches("refused deletecollection on pods (403)").count(),
        1,
        "one warning naming the fix: {e}"
    );
    assert!(e.contains("deleting executor pods one by one"), "{e}");
    for id in 1..=3 {
        assert!(e.contains(&format!("deleted executor {id} ")), "{e}");
    }
    w.wait_for("executor 4 alone", |w| w.live() == vec![4]);
}

#[test]
fn deleting_a_pod_that_is_already_gone_is_success() {
    let w = world(&[], |_| {});
    w.converge(3);
    let out = w.run(&["remove", "2"]);
    assert!(out.status.success(), "{}", err(&out));
    // Removing it again: already gone or terminating, nothing to do, no error.
    let out = w.run(&["remove", "2"]);
    assert!(out.status.success(), "{}", err(&out));
    w.sim.set_faults(rules(&["delete:reset@1"]));
    let out = w.run(&["remove", "3"]);
    assert!(out.status.success(), "{}", err(&out));
}

#[test]
fn a_foreign_pod_under_our_name_is_skipped_not_adopted() {
    // Someone else's pod already has the name executor 1 would get: the create gets 409
    // AlreadyExists, the pod is read, it is not ours, so id 1 is skipped (never reused) and
    // left alone; the next tick creates executor 2.
    let w = world(&[], |_| {});
    let agent_pod = serde_json::json!({
        "metadata": {"name": format!("{APP}-exec-1"), "labels": {"team": "other"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"}
    });
    let (status, _) = w.api("POST", "/sim/pods/default", Some(&agent_pod));
    assert!((200..300).contains(&status), "{status}");
    let out = w.run(&["reconcile", "--target", "1"]);
    assert!(out.status.success(), "{}", err(&out));
    assert!(err(&out).contains("not executor 1"), "{}", err(&out));
    assert!(w.state()["unacknowledged"].as_array().unwrap().is_empty());
    let out = w.run(&["run", "--until-converged", "--timeout", "30s"]);
    assert!(out.status.success(), "{}", err(&out));
    assert_eq!(
        w.sim.stats().executor_ids_created.get(APP).unwrap(),
        &vec![2]
    );
    assert_eq!(
        w.sim.stats().live_pods,
        2,
        "ours and the foreign one, untouched"
    );
}
