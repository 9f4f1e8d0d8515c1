//! What only a real kube-apiserver can show: RBAC as `kubectl auth can-i` reports it for the
//! recipe's Role, API Priority and Fairness answering 429 to a user whose FlowSchema leaves
//! it no seats, and a `continue` token that expires once etcd compacts its revision (410).
//! Each test needs the real control plane (`tests/real/`) and says so in one line without it.

use crate::both::{Env, Pods};
use crate::real;
use crate::util::{assert_contains_all, stderr};
use serde_json::json;
use std::time::{Duration, Instant};

/// Every verb `deploy/rbac.yaml` grants, and some it does not, as `kubectl auth can-i --as
/// podalloc` reports them in the test's namespace.
#[test]
fn kubectl_auth_can_i_agrees_with_the_recipe_role() {
    let Some(e) = Env::real("can-i", "can-i", &Pods::default()) else {
        return;
    };
    let cp = e.control_plane().unwrap();
    // `RESOURCE/SUB` is a subresource (kubectl's own `R/NAME` would name an object).
    let can = |verb: &str, resource: &str| -> bool {
        let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
        let out = cp
            .kubectl()
            .args([
                "auth", "can-i", verb, resource, "-n", &e.ns, "--as", "podalloc",
            ])
            .args((!sub.is_empty()).then(|| format!("--subresource={sub}")))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    for (verbs, resource) in [
        (
            &["get", "list", "create", "delete", "deletecollection"][..],
            "pods",
        ),
        (&["create", "patch", "get"][..], "events"),
        (&["get", "list", "create", "update"][..], "configmaps"),
        (
            &["get", "create", "update"][..],
            "leases.coordination.k8s.io",
        ),
        (
            &["get", "list", "watch", "create", "update", "patch"][..],
            "executorsets.podalloc.io",
        ),
        (
            &["get", "update", "patch"][..],
            "executorsets.podalloc.io/status",
        ),
        (
            &["get", "update", "patch"][..],
            "executorsets.podalloc.io/scale",
        ),
    ] {
        for v in verbs {
            assert!(can(v, resource), "podalloc cannot {v} {resource}");
        }
    }
    for (v, resource) in [
        ("watch", "pods"),
        ("patch", "pods"),
        ("delete", "configmaps"),
        ("delete", "executorsets.podalloc.io"),
        ("get", "secrets"),
        ("list", "nodes"),
    ] {
        assert!(
            !can(v, resource),
            "podalloc can {v} {resource}, beyond the recipe"
        );
    }
    // And nothing outside its namespace.
    let out = cp
        .kubectl()
        .args([
            "auth", "can-i", "list", "pods", "-n", "default", "--as", "podalloc",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
}

const APF: &str = "apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata:
  name: podalloc-throttled
spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 0
    borrowingLimitPercent: 0
    lendablePercent: 0
    limitResponse:
      type: Reject
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata:
  name: podalloc-throttled
spec:
  priorityLevelConfiguration:
    name: podalloc-throttled
  matchingPrecedence: 500
  distinguisherMethod:
    type: ByUser
  rules:
  - subjects:
    - kind: User
      user:
        name: podalloc-throttled
    resourceRules:
    - verbs: ['*']
      apiGroups: ['*']
      resources: ['*']
      namespaces: ['*']
";

/// The apiserver's count of requests API Priority and Fairness rejected for the
/// `podalloc-throttled` FlowSchema.
fn rejected(e: &Env) -> u64 {
    let cp = e.control_plane().unwrap();
    let out = cp
        .kubectl()
        .args(["get", "--raw", "/metrics"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_flowcontrol_rejected_requests_total{")
                && l.contains("flow_schema=\"podalloc-throttled\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A FlowSchema whose priority level has no seats: API Priority and Fairness still runs a
/// request when none of its level is executing (so a lone client is never starved), and
/// rejects the others at once with 429 `Too many requests` and `Retry-After`. Two other
/// clients of the same user keep a request in flight (a list at a resourceVersion the server
/// has not reached blocks for 3 s, then answers 504 `Too large resource version`), so every
/// call of podalloc's meets a 429: it backs off and retries each (its log names them) until
/// its tick's time is spent, fails the tick (exit 1: retried next tick), and acts once the
/// others stop.
#[test]
fn a_429_from_api_priority_and_fairness_is_retried() {
    let Some(e) = Env::real("apf", "apf", &Pods::default()) else {
        return;
    };
    let cp = e.control_plane().unwrap();
    cp.kubectl_stdin(&["apply", "-f", "-"], APF, "the FlowSchema");
    let pods = format!("/api/v1/namespaces/{}/pods", e.ns);
    let throttled =
        |path: &str| real::call(&cp.url, &cp.ca_pem, &cp.throttled_token, "GET", path, None).0;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let blocking = format!("{pods}?resourceVersion=999999999&resourceVersionMatch=NotOlderThan");
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            let (stop, pods) = (stop.clone(), blocking.clone());
            let (url, ca, token) = (
                cp.url.clone(),
                cp.ca_pem.clone(),
                cp.throttled_token.clone(),
            );
            std::thread::spawn(move || {
                let end = Instant::now() + Duration::from_secs(120);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < end {
                    real::call(&url, &ca, &token, "GET", &pods, None);
                }
            })
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(30);
    while (0..20).all(|_| throttled(&pods) != 429) {
        assert!(Instant::now() < end, "the FlowSchema never took effect");
    }
    let before = rejected(&e);
    let out = e
        .cmd_with_token(&cp.throttled_token, &["reconcile", "--target", "1"])
        .output()
        .unwrap();
    let err = stderr(&out);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for h in hogs {
        h.join().unwrap();
    }
    assert!(err.contains(": 429 TooManyRequests; retry "), "{err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(e.live().is_empty());
    assert!(
        rejected(&e) > before,
        "no request of podalloc-throttled was rejected"
    );
    // Alone again, podalloc's requests run.
    let out = e
        .cmd_with_token(
            &cp.throttled_token,
            &[
                "run",
                "--target",
                "1",
                "--until-converged",
                "--timeout",
                "60s",
            ],
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(e.live(), vec![1]);
    cp.kubectl()
        .args(["delete", "flowschema", "podalloc-throttled", "--wait=false"])
        .output()
        .unwrap();
}

/// A `continue` token outlives its revision only until etcd compacts it: then 410 `Expired`,
/// the code, reason and message the simulator gives when its list snapshot has expired.
#[test]
fn an_expired_continue_token_is_410_expired() {
    let Some(e) = Env::real("expired-continue", "cont", &Pods::default()) else {
        return;
    };
    for i in 1..=3 {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("cont-{i}")},
            "spec": {"containers": [{"name": "c", "image": "img"}]}});
        let (code, b) = e.admin(
            "POST",
            &format!("/api/v1/namespaces/{}/pods", e.ns),
            Some(&pod),
        );
        assert_eq!(code, 201, "{b}");
    }
    let (code, page) = e.as_podalloc(
        "GET",
        &format!("/api/v1/namespaces/{}/pods?limit=1", e.ns),
        None,
    );
    assert_eq!(code, 200, "{page}");
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    // Writes move the revision on; compaction (every 5 s here) then drops the token's.
    let end = Instant::now() + Duration::from_secs(60);
    let next = format!("/api/v1/namespaces/{}/pods?limit=1&continue={token}", e.ns);
    let body = loop {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"generateName": "tick-"}, "data": {}});
        e.admin(
            "POST",
            &format!("/api/v1/namespaces/{}/configmaps", e.ns),
            Some(&cm),
        );
        let (code, body) = e.as_podalloc("GET", &next, None);
        if code == 410 {
            break body;
        }
        assert_eq!(code, 200, "{body}");
        assert!(Instant::now() < end, "the continue token never expired");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(body["reason"], "Expired", "{body}");
    assert_eq!(body["code"], 410, "{body}");
    // The simulator's expired token says the same (crates/podalloc-sim, `api.rs`).
    let msg = body["message"].as_str().unwrap_or("");
    assert!(
        msg.starts_with("The provided continue parameter is too old"),
        "{msg}"
    );
}

/// Every file of `deploy/` is a Kubernetes manifest that kube-apiserver accepts as it is
/// (`kubectl apply --dry-run=server -f deploy/`: schema, defaulting, admission and RBAC
/// validation, nothing stored); the admin host's files live in `deploy/host/`.
#[test]
fn every_deploy_recipe_passes_server_side_dry_run() {
    let Some(e) = Env::real("dry-run", "dry-run", &Pods::default()) else {
        return;
    };
    let cp = e.control_plane().unwrap();
    // The recipes name their namespace, `batch`.
    let ns = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: batch\n";
    cp.kubectl_stdin(&["apply", "-f", "-"], ns, "namespace batch");
    let dir = crate::util::root().join("deploy");
    let out = cp
        .kubectl()
        .args(["apply", "--dry-run=server", "-f"])
        .arg(&dir)
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{se}{so}");
    let kinds = [
        "cronjob.batch/",
        "deployment.apps/",
        "role.rbac.authorization.k8s.io/",
        "configmap/",
    ];
    assert_contains_all(&so, &kinds);
    assert!(so.lines().all(|l| l.ends_with("(server dry run)")), "{so}");
}

/// A token for service account `sa` of `ns` from the TokenRequest API (`kubectl create
/// token`), as the kubelet projects one into a pod.
fn sa_token(cp: &real::ControlPlane, ns: &str, sa: &str) -> String {
    let out = cp
        .kubectl()
        .args(["create", "token", sa, "-n", ns, "--duration", "1h"])
        .output()
        .unwrap();
    assert!(out.status.success(), "create token {sa}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A recipe's podalloc (its container's arguments, the template path pointing at the
/// executor-template ConfigMap's content in `dir`) connected to the control plane as the
/// holder of `token` in `ns`, as in its pod; `--log-level debug` logs every API answer.
fn recipe_cmd(e: &Env, token: &str, args: &[String], pod: &str) -> std::process::Command {
    let cp = e.control_plane().unwrap();
    let tpl = e.dir.path().join("executor.yaml");
    if !tpl.exists() {
        // Written once: a replica already started may be reading it.
        let d = crate::deploy::docs("executor-template.yaml");
        std::fs::write(&tpl, d[0]["data"]["executor.yaml"].as_str().unwrap()).unwrap();
    }
    let args = args[1..].iter().map(|a| match a.as_str() {
        "/etc/podalloc/executor.yaml" => tpl.display().to_string(),
        // Replicas share this host: any free port instead of the pod's own.
        ":8080" | ":8081" => "127.0.0.1:0".to_string(),
        _ => a.clone(),
    });
    let mut c = crate::util::podalloc();
    c.args(args)
        .args(["--log-level", "debug"])
        .env("PODALLOC_SERVER", &cp.url)
        .env("PODALLOC_TOKEN", token)
        .env("PODALLOC_CERTIFICATE_AUTHORITY", &cp.ca_file)
        .env("PODALLOC_NAMESPACE", &e.ns)
        .env("POD_NAME", pod)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    c
}

/// The Running, not deleted executors of `app` in the test's namespace.
fn running_executors(e: &Env, app: &str) -> usize {
    let path = format!(
        "/api/v1/namespaces/{}/pods?labelSelector=spark-role%3Dexecutor%2Cspark-app-selector%3D{app}",
        e.ns
    );
    let (code, list) = e.admin("GET", &path, None);
    assert_eq!(code, 200, "{list}");
    (list["items"].as_array().into_iter().flatten())
        .filter(|p| {
            p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
        })
        .count()
}

/// The processes of one recipe (`what`) exited 0 and were never refused by RBAC (every API
/// answer is logged at debug level: none is a 403), and they did create.
fn assert_no_403(what: &str, outs: &[std::process::Output]) {
    let logs: Vec<String> = outs.iter().map(stderr).collect();
    let said = || {
        (logs.iter().enumerate())
            .flat_map(|(i, l)| {
                l.lines()
                    .filter(|l| l.contains("-> ") || l.contains("leader"))
                    .map(move |l| format!("[{i}] {l}"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (out, log) in outs.iter().zip(&logs) {
        assert_eq!(out.status.code(), Some(0), "{what}: {log}");
        assert!(
            !log.contains("-> 403"),
            "{what} was refused by RBAC: {}",
            said()
        );
    }
    assert!(
        logs.iter().any(|l| l.contains("-> 201")),
        "{what}: no create: {}",
        said()
    );
}

/// Waits up to 60 s for `n` Running executors of `app`; on timeout stops the processes and
/// panics with what they logged.
fn converged(
    e: &Env,
    procs: [std::process::Child; 2],
    app: &str,
    n: usize,
) -> [std::process::Child; 2] {
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        if running_executors(e, app) == n {
            return procs;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs: Vec<String> = (procs.into_iter())
        .map(|p| {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(p.id() as i32, libc::SIGTERM) };
            stderr(&p.wait_with_output().unwrap())
        })
        .collect();
    panic!(
        "{app}: not {n} running executors within 60 s: {}",
        logs.join("\n----\n")
    );
}

/// Two replicas of the Deployment `what` (pods `PREFIX-a` and `PREFIX-b`, podalloc arguments
/// `args`, service account token `token`) until `app` has `n` Running executors
/// ([`converged`]); then stops them and checks that no call was answered 403.
fn replicas_converge(
    e: &Env,
    token: &str,
    args: &[String],
    (what, prefix): (&str, &str),
    (app, n): (&str, usize),
) {
    let procs = ["a", "b"].map(|r| {
        recipe_cmd(e, token, args, &format!("{prefix}-{r}"))
            .spawn()
            .unwrap()
    });
    let procs = converged(e, procs, app, n);
    assert_no_403(what, &crate::util::stop_all("the replicas", procs.into()));
}

/// Each form of `deploy/` runs for real on kube-apiserver under exactly its own RBAC: the
/// CronJob's job and the HA `run` Deployment as service account `podalloc`
/// (`deploy/rbac.yaml`), the HA `apps` Deployment as `podalloc-apps` (its own Role), each
/// with a token from the TokenRequest API, two replicas for the Deployments. Each converges
/// its app; no API call anywhere is answered 403.
#[test]
fn every_recipe_runs_under_its_own_service_account_without_a_403() {
    let Some(e) = Env::real("recipes", "recipes", &Pods::default()) else {
        return;
    };
    let cp = e.control_plane().unwrap();
    // deploy/rbac.yaml is applied in every test namespace; the apps recipe brings its own.
    let text = std::fs::read_to_string(crate::util::root().join("deploy/apps-deployment.yaml"))
        .unwrap()
        .replace("namespace: batch", &format!("namespace: {}", e.ns));
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let apps_rbac: Vec<_> = docs.iter().filter(|d| d["kind"] != "Deployment").collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": apps_rbac});
    cp.kubectl_stdin(
        &["apply", "-f", "-"],
        &list.to_string(),
        "the apps recipe's RBAC",
    );
    let (pod_sa, apps_sa) = (
        sa_token(cp, &e.ns, "podalloc"),
        sa_token(cp, &e.ns, "podalloc-apps"),
    );
    let spec = |file: &str, k: &str| {
        let d = crate::deploy::docs(file);
        let t = crate::deploy::kind(&d, k)["spec"].clone();
        let t = if k == "CronJob" {
            t["jobTemplate"]["spec"].clone()
        } else {
            t
        };
        crate::deploy::podalloc_args(&t["template"]["spec"])
    };

    // The CronJob: one job, to its end.
    let cron = spec("cronjob.yaml", "CronJob");
    let out = recipe_cmd(&e, &pod_sa, &cron, "podalloc-spark-nightly-1")
        .output()
        .unwrap();
    assert_no_403("the CronJob's job", std::slice::from_ref(&out));
    assert_eq!(
        running_executors(&e, "spark-nightly"),
        20,
        "{}",
        stderr(&out)
    );

    // The HA run Deployment: two replicas until its app converges.
    let dep = spec("deployment.yaml", "Deployment");
    let run = ("the run Deployment", "podalloc-spark-etl");
    replicas_converge(&e, &pod_sa, &dep, run, ("spark-etl", 20));

    // The HA apps Deployment: two replicas, one annotated driver to discover.
    let driver = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "spark-discovered-driver",
            "labels": {"spark-role": "driver", "spark-app-selector": "spark-discovered"},
            "annotations": {"podalloc.io/executors": "3"}},
        "spec": {"containers": [{"name": "driver", "image": "registry.example/spark:3.5.0"}]}});
    e.create_pod(&driver);
    let apps = spec("apps-deployment.yaml", "Deployment");
    let apps_dep = ("the apps Deployment", "podalloc-apps");
    replicas_converge(&e, &apps_sa, &apps, apps_dep, ("spark-discovered", 3));
}

/// The kubelet emulator runs the pods a namespace already had when it starts following it
/// (`scripts/controlplane.sh start`, a pod created, then the kubelet example started: the pod
/// stayed Pending for ever, as the watch had passed it over while the namespace was not
/// followed).
#[test]
fn the_kubelet_emulator_runs_the_pods_a_namespace_had_before_it_was_followed() {
    let Some(cp) = real::control_plane() else {
        return;
    };
    let ns = format!("before-{}", std::process::id());
    cp.kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: early, namespace: {ns}}}\n\
             spec: {{containers: [{{name: c, image: spark:3.5}}]}}\n"
        ),
        "a namespace and a pod before the emulator follows it",
    );
    cp.emulator
        .manage(&ns, podalloc_sim::emulator::EmulatorOptions::default())
        .unwrap();
    let t = Instant::now();
    let phase = || {
        let out = (cp.kubectl())
            .args([
                "get",
                "pod",
                "early",
                "-n",
                &ns,
                "-o",
                "jsonpath={.status.phase}",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    while phase() != "Running" {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the pod created before the emulator followed {ns} is {:?} after 20 s",
            phase()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
