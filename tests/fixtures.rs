//! The snapshot and the allocation step on recorded PodLists: our own recordings from the
//! simulator (fixtures/recorded) and real ones from public projects (fixtures/external).

use crate::util::root;
use podalloc::alloc::{step, AllocatorState, DeleteReason, Plan, Request, Settings, TargetChange};
use podalloc::podspec::PodTemplate;
use podalloc::snapshot::{ExecutorState, For, ListSource, Snapshot};
use serde_json::Value;

/// A whole pod list given offline (as `plan --pods` reads a file), for app `app_id`.
fn offline_list(bytes: &[u8], app_id: &str) -> Result<Snapshot, podalloc::snapshot::SnapshotError> {
    let mut s = Snapshot::default();
    s.read_page(bytes, For::app(app_id).source(ListSource::Offline))?;
    Ok(s)
}

fn fixture(path: &str) -> Vec<u8> {
    let p = root().join("fixtures").join(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// One of our recordings (fixtures/recorded) of the app `spark-rec-1`.
fn recorded(file: &str) -> Snapshot {
    offline_list(&fixture(&format!("recorded/{file}")), "spark-rec-1").unwrap()
}

/// The step for `spark-rec-1` from `st` to `target` executors, removing none, at time 0.
fn plan_to(s: &Snapshot, st: &AllocatorState, target: u32) -> Plan {
    step(
        s,
        st,
        &Settings::new("spark-rec-1"),
        &Request {
            target: TargetChange::Set(target),
            remove: vec![],
            ..Request::default()
        },
        0,
    )
    .unwrap()
}

fn states(s: &Snapshot) -> Vec<(u64, ExecutorState)> {
    s.executors.values().map(|p| (p.id, p.state)).collect()
}

#[test]
fn recorded_running_and_failed() {
    use ExecutorState::*;
    let s = recorded("sim-running-and-failed.json");
    assert_eq!(
        states(&s),
        vec![
            (1, Running),
            (2, Failed),
            (4, Running),
            (5, Running),
            (6, Running),
            (7, Running)
        ]
    );
    assert_eq!(
        s.executors[&2].detail.as_deref(),
        Some("OOMKilled exit 137")
    );
    // Target 7: the failed pod is deleted; 5 run, so 2 new executors above every id seen.
    let mut st = AllocatorState::new();
    st.last_executor_id = 7;
    let plan = plan_to(&s, &st, 7);
    assert_eq!(plan.delete.len(), 1);
    assert_eq!(plan.delete[0].reason, DeleteReason::Failed);
    assert_eq!(plan.delete[0].pod_name, "spark-rec-1-exec-2");
    assert_eq!(
        plan.create
            .iter()
            .map(|c| c.executor_id)
            .collect::<Vec<_>>(),
        vec![8, 9]
    );
}

#[test]
fn recorded_pending_and_terminating() {
    use ExecutorState::*;
    let s = recorded("sim-pending-and-terminating.json");
    assert_eq!(
        states(&s),
        vec![
            (1, Running),
            (4, Running),
            (5, Running),
            (6, Running),
            (7, Deleted),
            (8, Pending),
            (9, Pending),
            (10, Pending),
            (11, Pending)
        ]
    );
    assert!(!s.executors[&8].scheduled);
    // Scale down to 5: 4 running + 4 pending = 8 known → 3 excess, newest pending first.
    let plan = plan_to(&s, &AllocatorState::new(), 5);
    let mut ids: Vec<u64> = plan.delete.iter().map(|d| d.executor_id).collect();
    ids.sort();
    assert_eq!(ids, vec![9, 10, 11]);
    assert!(plan
        .delete
        .iter()
        .all(|d| d.if_pending && d.reason == DeleteReason::Excess));
    assert!(plan.create.is_empty());
}

#[test]
fn real_kube_system_list_has_no_executors() {
    // A real PodList recorded against Kubernetes v1.36 (k8s-openapi): none of it is ours.
    let s = offline_list(
        &fixture("external/k8s-openapi_v1-36_pod-list.body.json"),
        "spark-app-1",
    )
    .unwrap();
    assert!(s.executors.is_empty());
    assert_eq!(s.foreign, 8);
    assert!(s.warnings.is_empty());
}

/// Puts our labels on the real pods of a recorded list, keeping everything else as recorded.
fn relabel(list: &mut Value, app: &str) {
    for (i, item) in list["items"].as_array_mut().unwrap().iter_mut().enumerate() {
        let labels = item["metadata"]["labels"].as_object_mut();
        let labels = match labels {
            Some(l) => l,
            None => {
                item["metadata"]["labels"] = serde_json::json!({});
                item["metadata"]["labels"].as_object_mut().unwrap()
            }
        };
        labels.insert("spark-app-selector".into(), app.into());
        labels.insert("spark-role".into(), "executor".into());
        labels.insert("spark-exec-id".into(), (i + 1).to_string().into());
    }
}

#[test]
fn real_pods_relabelled_classify_as_running() {
    let mut list: Value =
        serde_json::from_slice(&fixture("external/k8s-openapi_v1-36_pod-list.body.json")).unwrap();
    relabel(&mut list, "spark-app-1");
    let s = offline_list(list.to_string().as_bytes(), "spark-app-1").unwrap();
    assert_eq!(s.executors.len(), 8);
    assert!(s
        .executors
        .values()
        .all(|p| p.state == ExecutorState::Running && p.scheduled));
    assert!(s
        .executors
        .values()
        .all(|p| !p.uid.is_empty() && !p.resource_version.is_empty()));
}

#[test]
fn real_failed_job_pod_classifies_as_failed() {
    // The Job replay's PodList holds one Failed pod (exit code 5, reason Error).
    let replay: Value = serde_json::from_slice(&fixture(
        "external/k8s-openapi_v1-36_job-create.replay.json",
    ))
    .unwrap();
    let body = replay
        .as_array()
        .unwrap()
        .iter()
        .find(|e| {
            e["request_method"] == "GET" && e["request_url"].as_str().unwrap().contains("/pods")
        })
        .map(|e| e["response_body"].as_str().unwrap().to_string())
        .unwrap();
    let mut list: Value = serde_json::from_str(&body).unwrap();
    relabel(&mut list, "spark-app-1");
    let s = offline_list(list.to_string().as_bytes(), "spark-app-1").unwrap();
    let p = &s.executors[&1];
    assert_eq!(p.state, ExecutorState::Failed);
    assert_eq!(p.detail.as_deref(), Some("Error exit 5"));
}

#[test]
fn spark_executor_template_yaml_builds_a_pod() {
    let text = String::from_utf8(fixture("external/spark_executor-template.yml")).unwrap();
    let tpl = podalloc::commands::parse_template_text(&text).unwrap();
    let tpl = PodTemplate::from_value(tpl, Some("registry.example/spark:3.5.0")).unwrap();
    let pod = tpl.build("spark-app-1", 3, "spark-app-1-exec-3", None);
    assert_eq!(pod["kind"], "Pod");
    assert!(pod.get("Kind").is_none());
    assert_eq!(pod["metadata"]["labels"]["spark-exec-id"], "3");
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        "registry.example/spark:3.5.0"
    );
}

#[test]
fn yaml_templates_read_octal_modes_like_kubectl() {
    let text = String::from_utf8(fixture("fuzz/template/octal.yaml")).unwrap();
    let v = podalloc::commands::parse_template_text(&text).unwrap();
    assert_eq!(v["spec"]["volumes"][0]["configMap"]["defaultMode"], 420);
}
