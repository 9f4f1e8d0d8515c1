//! Many apps in one process (`podalloc apps`), end to end against the simulator: an apps
//! file with a broken app, discovery from annotated driver pods (targets changed by
//! annotation, drivers finishing, deleted, badly annotated), one executor list per namespace
//! per pass, and the simulator's merge-patch that `kubectl annotate` relies on.

use crate::util::{agent, args, code, exits, podalloc, stderr, write, SimWorld, World};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn world() -> World {
    SimWorld::new()
        .schedule(Duration::from_millis(50))
        .startup(Duration::from_millis(100))
        .stop(Duration::from_millis(100))
        .start()
}

/// podalloc connected to the simulator, with no app flags.
fn apps_cmd(w: &World, args: &[&str]) -> Command {
    let mut c = podalloc();
    c.args(["--server", &w.sim.url(), "--token", &w.token])
        .arg("--certificate-authority")
        .arg(&w.ca)
        .args(["--batch-delay", "100ms", "apps", "--state-dir"])
        .arg(w.path("states"))
        .args(args);
    c
}

/// Live (not terminating; Pending or Running) executor pods per app, from one list.
fn live_by_app(w: &World) -> BTreeMap<String, usize> {
    let (code, list) = w.api(
        "GET",
        "/api/v1/namespaces/default/pods?labelSelector=spark-role%3Dexecutor",
        None,
    );
    assert_eq!(code, 200, "{list}");
    crate::util::live_by_app(&list)
}

/// Waits up to 30 s for `f`.
fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}");
}

/// A PATCH as `kubectl annotate` sends it: (status, body).
fn patch(w: &World, name: &str, content_type: &str, body: &Value) -> (u16, Value) {
    let agent = agent(w.sim.ca_pem().unwrap().as_bytes());
    let url = format!("{}/api/v1/namespaces/default/pods/{name}", w.sim.url());
    let mut resp = agent
        .patch(&url)
        .header("Authorization", &format!("Bearer {}", w.token))
        .content_type(content_type)
        .send(body.to_string())
        .unwrap();
    let code = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    (code, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn annotate(w: &World, name: &str, key: &str, value: &str) {
    let body = json!({"metadata": {"annotations": {key: value}}});
    let (code, pod) = patch(w, name, "application/merge-patch+json", &body);
    assert_eq!(code, 200, "{pod}");
}

fn seed(w: &World, pod: &Value) {
    let (status, body) = w.api("POST", "/sim/pods/default", Some(pod));
    assert!(status == 200 || status == 201, "{status} {body}");
}

fn seed_driver(w: &World, i: usize, executors: &str) {
    seed(
        w,
        &json!({"metadata": {"name": format!("drv-{i}"),
            "labels": {"spark-role": "driver", "spark-app-selector": format!("app-{i}")},
            "annotations": {"podalloc.io/executors": executors}},
            "spec": {"containers": [{"name": "d", "image": "spark"}]},
            "status": {"phase": "Running"}}),
    );
}

#[test]
fn an_apps_file_runs_every_app_and_reports_the_broken_one() {
    let w = world();
    write(&w.path("bad.yaml"), "kind: Service\nmetadata: {name: x}\n");
    write(
        &w.path("apps.yaml"),
        "apps:\n\
         - app-id: etl\n  image: spark:3.5\n  target: 3\n\
         - app-id: broken\n  template: bad.yaml\n  target: 2\n\
         - app-id: ml\n  image: spark:3.5\n  target: 4\n  batch-size: 2\n",
    );
    let file = w.path("apps.yaml");
    let err = exits(
        apps_cmd(&w, &["--until-converged", "--timeout", "30s", "--file"]).arg(&file),
        2,
    );
    assert!(err.contains("app broken: pod template"), "{err}");
    assert!(err.contains("1 app(s) failed; the first, broken"), "{err}");
    let live = live_by_app(&w);
    assert_eq!(live.get("etl"), Some(&3), "{live:?}");
    assert_eq!(live.get("ml"), Some(&4), "{live:?}");
    assert_eq!(live.get("broken"), None);
    assert_eq!(w.sim.stats().duplicate_executor_ids, 0);
    // One app's flags make no sense for many: a usage error naming the flag.
    for flag in [["--app-id", "etl"], ["--state-store", "configmap:one"]] {
        let mut c = podalloc();
        c.args(flag).args(["apps", "--once", "--file"]).arg(&file);
        let out = c.output().unwrap();
        assert_eq!(code(&out), 2, "{}", stderr(&out));
        assert!(stderr(&out).contains(flag[0]), "{}", stderr(&out));
    }
    // Each app has its own state file.
    for app in ["etl", "ml"] {
        let st: Value = serde_json::from_slice(
            &std::fs::read(w.path(&format!("states/default/{app}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(st["target"], if app == "etl" { 3 } else { 4 });
    }
}

/// The simulator's request log, one JSON object a line.
fn sim_log(w: &World) -> String {
    let agent = agent(w.sim.ca_pem().unwrap().as_bytes());
    let mut resp = agent
        .get(format!("{}/sim/log", w.sim.url()))
        .header("Authorization", &format!("Bearer {}", w.token))
        .call()
        .unwrap();
    let text = resp.body_mut().read_to_string().unwrap();
    text
}

/// Lines of the simulator's request log after `after` (by seq): lists of pods and their
/// label selectors.
fn pod_lists_after(w: &World, after: u64) -> Vec<String> {
    let text = sim_log(w);
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["seq"].as_u64().unwrap_or(0) > after && l["verb"] == "list")
        .map(|l| {
            l["query"]["labelSelector"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

fn last_seq(w: &World) -> u64 {
    let text = sim_log(w);
    (text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok()))
    .filter_map(|l| l["seq"].as_u64())
    .max()
    .unwrap_or(0)
}

const DRIVERS: usize = 50;

fn target_of(i: usize) -> usize {
    i % 4 + 1
}

/// A [`world`] with the drivers of all but the last of the [`DRIVERS`], each annotated with
/// its [`target_of`].
fn world_with_drivers() -> World {
    let w = world();
    for i in 0..DRIVERS - 1 {
        seed_driver(&w, i, &target_of(i).to_string());
    }
    w
}

/// The log says once that driver `drv-BAD`'s annotation podalloc.io/executors ("lots") is
/// not a number, and a Warning Event on that driver pod says so too.
fn assert_warned_once_and_told_on_the_driver(w: &World, text: &str, bad: usize) {
    assert!(
        text.contains(&format!(
            "driver pod \"drv-{bad}\": annotation podalloc.io/executors=\"lots\""
        )),
        "{text}"
    );
    assert_eq!(
        text.matches("annotation podalloc.io/executors=\"lots\"")
            .count(),
        1,
        "warned once"
    );
    // …and told on the driver pod as a Warning Event, for `kubectl describe pod`.
    let (_, events) = w.api("GET", "/api/v1/namespaces/default/events", None);
    let on_bad = (events["items"].as_array().unwrap().iter()).find(|e| {
        e["involvedObject"]["name"] == format!("drv-{bad}").as_str()
            && e["reason"] == "AllocationSkipped"
    });
    let ev = on_bad.unwrap_or_else(|| panic!("no event on drv-{bad}: {events}"));
    assert_eq!(ev["type"], "Warning");
    assert!(
        ev["message"]
            .as_str()
            .unwrap()
            .contains("podalloc.io/executors"),
        "{ev}"
    );
}

/// Fifty discovered apps follow their drivers' annotations and end with them; a bad one is told.
#[test]
fn discovery_follows_annotations_and_drivers_across_fifty_apps() {
    let w = world_with_drivers();
    // A badly annotated driver: its executor stays as it is.
    let bad = DRIVERS - 1;
    seed_driver(&w, bad, "lots");
    seed(
        &w,
        &json!({"metadata": {"name": format!("app-{bad}-exec-1"), "labels": {"spark-role": "executor",
            "spark-app-selector": format!("app-{bad}"), "spark-exec-id": "1"}},
            "spec": {"containers": [{"name": "e", "image": "spark"}]},
            "status": {"phase": "Running"}}),
    );
    let log = w.path("apps.log");
    let mut child = apps_cmd(
        &w,
        &["--discover", "spark-role=driver", "--image", "spark:3.5"],
    )
    .stderr(std::fs::File::create(&log).unwrap())
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    let want = |changed: &BTreeMap<usize, usize>| -> BTreeMap<String, usize> {
        let mut m: BTreeMap<String, usize> = (0..DRIVERS - 1)
            .map(|i| (format!("app-{i}"), target_of(i)))
            .collect();
        for (&i, &t) in changed {
            m.insert(format!("app-{i}"), t);
        }
        m.retain(|_, t| *t > 0);
        m.insert(format!("app-{bad}"), 1);
        m
    };
    wait("every app at its annotated target", || {
        live_by_app(&w) == want(&BTreeMap::new())
    });
    // Scale two apps by annotation; finish two drivers, delete a third.
    annotate(&w, "drv-0", "podalloc.io/executors", "5");
    annotate(&w, "drv-2", "podalloc.io/executors", "6");
    for i in [3, 7] {
        let (s, b) = w.api(
            "POST",
            &format!("/sim/pods/default/drv-{i}/phase"),
            Some(&json!({"phase": "Succeeded"})),
        );
        assert_eq!(s, 200, "{b}");
    }
    let (s, b) = delete(&w, "drv-11");
    assert_eq!(s, 200, "{b}");
    let changed: BTreeMap<usize, usize> = [(0, 5), (2, 6), (3, 0), (7, 0), (11, 0)].into();
    wait("the new targets, and ended apps cleaned up", || {
        live_by_app(&w) == want(&changed)
    });
    wait("the ended apps' state files removed", || {
        [3, 7, 11]
            .iter()
            .all(|i| !w.path(&format!("states/default/app-{i}.json")).exists())
    });
    stop(&mut child);
    let text = std::fs::read_to_string(&log).unwrap();
    assert_warned_once_and_told_on_the_driver(&w, &text, bad);
    assert!(
        text.contains("app app-3: driver pod \"drv-3\" has finished"),
        "{text}"
    );
    assert!(text.contains("app app-11"), "{text}");
    assert_eq!(w.sim.stats().duplicate_executor_ids, 0);
    // Executors are owned by their driver.
    let (_, pod) = w.api("GET", "/api/v1/namespaces/default/pods/app-0-exec-1", None);
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["name"], "drv-0",
        "{pod}"
    );
}

/// One `--discover` pass lists the drivers and the executors once for the namespace, not per app.
#[test]
fn one_discovery_pass_lists_the_namespace_not_each_app() {
    let w = world_with_drivers();
    // One pass: one list of the drivers and one of the executors for the namespace, none
    // per app.
    let before = last_seq(&w);
    let out = apps_cmd(
        &w,
        &[
            "--discover",
            "spark-role=driver",
            "--image",
            "spark:3.5",
            "--once",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let lists = pod_lists_after(&w, before);
    assert_eq!(
        lists,
        ["spark-role=driver", "spark-role=executor"],
        "{lists:?}"
    );
}

fn delete(w: &World, name: &str) -> (u16, Value) {
    let agent = agent(w.sim.ca_pem().unwrap().as_bytes());
    let mut resp = agent
        .delete(format!(
            "{}/api/v1/namespaces/default/pods/{name}",
            w.sim.url()
        ))
        .header("Authorization", &format!("Bearer {}", w.token))
        .call()
        .unwrap();
    let code = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    (code, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// SIGTERM, then the exit status must be 0.
fn stop(child: &mut std::process::Child) {
    let pid = child.id().to_string();
    let ok = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(ok.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn the_simulator_applies_a_merge_patch_as_kubectl_annotate_sends_it() {
    let w = world();
    seed_driver(&w, 0, "1");
    let (_, before) = w.api("GET", "/api/v1/namespaces/default/pods/drv-0", None);
    let rv: u64 = before["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let (code, pod) = patch(
        &w,
        "drv-0",
        "application/merge-patch+json",
        &json!({"metadata": {"annotations": {"podalloc.io/executors": "20", "x": null}}}),
    );
    assert_eq!(code, 200, "{pod}");
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(
        pod["metadata"]["annotations"]["podalloc.io/executors"],
        "20"
    );
    let rv2: u64 = pod["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv, "resourceVersion bumped: {rv} → {rv2}");
    let (code, status) = patch(&w, "drv-0", "application/json", &json!({}));
    assert_eq!(code, 415, "{status}");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "UnsupportedMediaType");
    let spec = json!({"spec": {"nodeName": "elsewhere"}});
    let (code, status) = patch(&w, "drv-0", "application/merge-patch+json", &spec);
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["reason"], "Invalid");
    let (code, _) = patch(&w, "nope", "application/merge-patch+json", &json!({}));
    assert_eq!(code, 404);
}

fn recipe() -> Vec<Value> {
    let p = crate::util::root().join("deploy/apps-deployment.yaml");
    serde_saphyr::from_multiple::<Value>(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn of_kind<'a>(docs: &'a [Value], k: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == k).unwrap()
}

/// The command line of the recipe's Deployment: `podalloc` and its container's arguments.
fn recipe_args(docs: &[Value]) -> Vec<String> {
    let spec = &of_kind(docs, "Deployment")["spec"]["template"]["spec"];
    let mut args = vec!["podalloc".to_string()];
    args.extend(
        (spec["containers"][0]["args"].as_array().unwrap().iter())
            .map(|a| a.as_str().unwrap().to_string()),
    );
    args
}

/// The "one podalloc for a namespace" recipe: its Role is exactly pods get/list/create/delete/deletecollection,
/// configmaps get/create/update, events create/get/patch, leases get/create/update and the
/// ExecutorSet rules (`crate::deploy::assert_documented_minimum`), it
/// runs two replicas named by POD_NAME, and its arguments parse.
#[test]
fn the_namespace_deployment_recipe_runs_two_replicas_with_arguments_that_parse() {
    use clap::Parser;
    let d = recipe();
    crate::deploy::assert_documented_minimum(of_kind(&d, "Role"));
    let dep = of_kind(&d, "Deployment");
    assert_eq!(dep["spec"]["replicas"], 2, "highly available");
    let env = &dep["spec"]["template"]["spec"]["containers"][0]["env"][0];
    assert_eq!(env["name"], "POD_NAME");
    assert_eq!(env["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
    let spec = &of_kind(&d, "Deployment")["spec"]["template"]["spec"];
    assert_eq!(
        spec["serviceAccountName"],
        of_kind(&d, "ServiceAccount")["metadata"]["name"]
    );
    let args = recipe_args(&d);
    podalloc::cli::Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
}

/// One pass of the recipe's arguments manages the annotated drivers, one with its own template.
#[test]
fn the_namespace_deployment_recipe_discovers_and_scales_annotated_drivers() {
    let args = recipe_args(&recipe());
    let w = world();
    let tpl = w.path("executor.yaml");
    let cm = crate::util::root().join("deploy/executor-template.yaml");
    let cm: Value = serde_saphyr::from_str(&std::fs::read_to_string(cm).unwrap()).unwrap();
    write(&tpl, cm["data"]["executor.yaml"].as_str().unwrap());
    let args: Vec<String> = (args[1..].iter())
        .map(|a| match a.as_str() {
            "/etc/podalloc/executor.yaml" => tpl.display().to_string(),
            "/var/lib/podalloc" => w.path("states").display().to_string(),
            _ => a.clone(),
        })
        .collect();
    // Two drivers: one with the default template, one naming its own ConfigMap.
    let own = "apiVersion: v1\nkind: Pod\nmetadata:\n  labels: {team: ml}\nspec:\n  containers:\n  - {name: executor, image: spark:ml}\n";
    let (c, b) = w.api(
        "POST",
        "/api/v1/namespaces/batch/configmaps",
        Some(&json!({"metadata": {"name": "ml-executor"}, "data": {"template.yaml": own}})),
    );
    assert_eq!(c, 201, "{b}");
    for (name, ann) in [
        ("etl", json!({"podalloc.io/executors": "2"})),
        (
            "ml",
            json!({"podalloc.io/executors": "3", "podalloc.io/executor-template": "ml-executor"}),
        ),
    ] {
        let (s, b) = w.api(
            "POST",
            "/sim/pods/batch",
            Some(
                &json!({"metadata": {"name": format!("{name}-driver"), "annotations": ann,
                "labels": {"spark-role": "driver", "spark-app-selector": name}},
                "spec": {"containers": [{"name": "d", "image": "spark"}]},
                "status": {"phase": "Running"}}),
            ),
        );
        assert!(s == 200 || s == 201, "{b}");
    }
    // The recipe's --leader-elect with short durations: a first Lease is taken a lease
    // duration after it was first seen missing.
    let out = podalloc()
        .args(&args)
        .args(["--once", "--leader-elect-lease-duration", "2s"])
        .args([
            "--leader-elect-renew-deadline",
            "1s",
            "--leader-elect-retry-period",
            "200ms",
        ])
        .env("PODALLOC_SERVER", w.sim.url())
        .env("PODALLOC_TOKEN", &w.token)
        .env("PODALLOC_CERTIFICATE_AUTHORITY", &w.ca)
        .env("PODALLOC_NAMESPACE", "batch")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let (_, list) = w.api(
        "GET",
        "/api/v1/namespaces/batch/pods?labelSelector=spark-role%3Dexecutor",
        None,
    );
    let mut teams: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in list["items"].as_array().unwrap() {
        let l = &p["metadata"]["labels"];
        teams
            .entry(l["spark-app-selector"].as_str().unwrap().to_string())
            .or_default()
            .push(l["team"].as_str().unwrap_or("").to_string());
    }
    assert_eq!(teams["etl"], ["data", "data"], "{teams:?}");
    assert_eq!(teams["ml"], ["ml", "ml", "ml"], "{teams:?}");
}

/// `--until-converged` with `--discover` ends once every annotated driver's app has
/// converged; a driver naming a missing template ConfigMap is one warning naming it, and its
/// app gets no executors.
#[test]
fn discovery_until_converged_exits_once_every_found_app_converged() {
    let w = world();
    seed_driver(&w, 0, "2");
    seed_driver(&w, 1, "3");
    annotate(&w, "drv-1", "podalloc.io/executor-template", "nowhere");
    let err = exits(
        &mut apps_cmd(
            &w,
            &args("--discover spark-role=driver --image spark:3.5 --until-converged --timeout 20s"),
        ),
        0,
    );
    assert!(
        err.contains("driver pod \"drv-1\": no ConfigMap \"nowhere\""),
        "{err}"
    );
    let live = live_by_app(&w);
    assert_eq!(live.get("app-0"), Some(&2), "{live:?}");
    assert_eq!(live.get("app-1"), None, "{live:?}");
}

/// `apps -h` shows the global flags that are every app's defaults, not the one-app ones.
#[test]
fn apps_short_help_lists_the_defaults_not_the_one_app_flags() {
    let out = podalloc().args(["apps", "-h"]).output().unwrap();
    let text = crate::util::stdout(&out);
    for shown in [
        "--file",
        "--discover",
        "--state-dir",
        "--template",
        "--image",
        "--batch-size",
    ] {
        assert!(text.contains(shown), "{shown}: {text}");
    }
    for hidden in [
        "--app-id <ID>",
        "--state-file <FILE>",
        "--driver-pod <NAME>",
    ] {
        assert!(!text.contains(hidden), "{hidden}: {text}");
    }
}

/// Every one-app command's `-h` shows `--state-store`: where the app's target lives is the
/// first thing a steering command needs (it was only in `--help`).
#[test]
fn one_app_commands_short_help_shows_the_state_store() {
    for cmd in ["run", "reconcile", "scale", "add", "remove", "status"] {
        let out = podalloc().args([cmd, "-h"]).output().unwrap();
        let text = crate::util::stdout(&out);
        assert!(text.contains("--state-store <STORE>"), "{cmd}: {text}");
    }
}

/// Two `apps` processes on one namespace with file stores (each its own state directory,
/// as two pods with emptyDirs): the second finds the apps Lease held and renewed and
/// refuses with exit 3 and one clear line; the first keeps every app at its target with no
/// id reused. (Before, both acted: 4 of 10 apps over target, 7 ids reused.)
#[test]
fn a_second_apps_process_on_the_namespace_refuses_instead_of_managing_twice() {
    let w = world();
    let mut text = String::from("apps:\n");
    for i in 0..10 {
        text.push_str(&format!(
            "- app-id: app-{i}\n  image: spark:3.5\n  target: 3\n"
        ));
    }
    write(&w.path("apps.yaml"), &text);
    let file = w.path("apps.yaml");
    let mut first = apps_cmd(&w, &["--file", file.to_str().unwrap()])
        .env("POD_NAME", "first")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let want: BTreeMap<String, usize> = (0..10).map(|i| (format!("app-{i}"), 3)).collect();
    wait("every app at 3", || live_by_app(&w) == want);
    let mut second = podalloc();
    second
        .args(["--server", &w.sim.url(), "--token", &w.token])
        .arg("--certificate-authority")
        .arg(&w.ca)
        .args(["--batch-delay", "100ms", "apps", "--state-dir"])
        .arg(w.path("other-states"))
        .args(["--file", file.to_str().unwrap()])
        .env("POD_NAME", "second");
    let t = Instant::now();
    let err = exits(&mut second, 3);
    eprintln!(
        "multi: a second apps process refused after {:.1}s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        err.contains("another podalloc apps (first) holds the apps Lease"),
        "{err}"
    );
    assert!(err.contains("this process did nothing"), "{err}");
    assert_eq!(live_by_app(&w), want);
    let s = w.sim.stats();
    assert_eq!(s.duplicate_executor_ids, 0);
    for (app, max) in &s.max_live_pods_by_app {
        assert!(*max <= 3, "{app}: {max}");
    }
    stop(&mut first);
}

/// `--discover` reads each resource profile's target from the driver's annotation
/// `podalloc.io/profile-executors` (`P=N,…`) beside `podalloc.io/executors` (profile 0's):
/// the app converges with its executors of each profile labelled with it, ids unique.
#[test]
fn discovery_reads_each_profiles_target_from_the_driver() {
    let w = world();
    seed_driver(&w, 0, "1");
    annotate(&w, "drv-0", "podalloc.io/profile-executors", "1=2");
    exits(
        &mut apps_cmd(
            &w,
            &args("--discover spark-role=driver --image spark:3.5 --until-converged --timeout 20s"),
        ),
        0,
    );
    let (code, list) = w.api(
        "GET",
        "/api/v1/namespaces/default/pods?labelSelector=spark-app-selector%3Dapp-0,spark-role%3Dexecutor",
        None,
    );
    assert_eq!(code, 200, "{list}");
    let mut by_profile: BTreeMap<String, usize> = BTreeMap::new();
    let mut ids: Vec<String> = Vec::new();
    for p in list["items"].as_array().unwrap() {
        let l = &p["metadata"]["labels"];
        let profile = l["spark-exec-resourceprofile-id"].as_str().unwrap_or("0");
        *by_profile.entry(profile.to_string()).or_default() += 1;
        ids.push(l["spark-exec-id"].as_str().unwrap().to_string());
    }
    let want = BTreeMap::from([("0".to_string(), 1), ("1".to_string(), 2)]);
    assert_eq!(by_profile, want, "{list}");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "one id counter: {ids:?}");
}
