//! The deploy recipes parse, match the documented RBAC exactly, and their podalloc
//! arguments are accepted by this build's command line (no drift between docs and code).

use crate::util::{podalloc, root, stderr, SimWorld, World};
use clap::Parser;
use serde_json::Value;
use std::process::Command;

pub(crate) fn docs(file: &str) -> Vec<Value> {
    let p = root().join("deploy").join(file);
    let text = std::fs::read_to_string(&p).unwrap();
    serde_saphyr::from_multiple::<Value>(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

pub(crate) fn kind<'a>(docs: &'a [Value], k: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == k)
        .unwrap_or_else(|| panic!("no {k}"))
}

/// Checks that Role `role` grants exactly the documented minimum, one resource per rule in
/// its API group: pods get/list/create/delete/deletecollection, configmaps get/list/create/update, events
/// create/get/patch, leases (coordination.k8s.io) get/create/update, executorsets
/// (podalloc.io, `deploy/crd.yaml`) get/list/watch/create/update/patch and their `status`
/// and `scale` subresources get/update/patch.
pub(crate) fn assert_documented_minimum(role: &Value) {
    let rules = role["rules"].as_array().unwrap();
    let mut got: Vec<(String, Vec<String>)> = rules
        .iter()
        .map(|r| {
            let res = r["resources"].as_array().unwrap();
            assert_eq!(res.len(), 1);
            let name = res[0].as_str().unwrap();
            let group = if name == "leases" {
                "coordination.k8s.io"
            } else if name.starts_with("executorsets") {
                "podalloc.io"
            } else {
                ""
            };
            assert_eq!(r["apiGroups"], serde_json::json!([group]));
            let mut verbs: Vec<String> = r["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            verbs.sort();
            (res[0].as_str().unwrap().to_string(), verbs)
        })
        .collect();
    got.sort();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        got,
        vec![
            (
                "configmaps".to_string(),
                s(&["create", "get", "list", "update"])
            ),
            ("events".to_string(), s(&["create", "get", "patch"])),
            (
                "executorsets".to_string(),
                s(&["create", "get", "list", "patch", "update", "watch"])
            ),
            (
                "executorsets/scale".to_string(),
                s(&["get", "patch", "update"])
            ),
            (
                "executorsets/status".to_string(),
                s(&["get", "patch", "update"])
            ),
            ("leases".to_string(), s(&["create", "get", "update"])),
            (
                "pods".to_string(),
                s(&["create", "delete", "deletecollection", "get", "list"])
            ),
            ("pods/eviction".to_string(), s(&["create"])),
        ]
    );
}

#[test]
fn rbac_is_exactly_the_documented_minimum() {
    let d = docs("rbac.yaml");
    let role = kind(&d, "Role");
    assert_documented_minimum(role);
    let binding = kind(&d, "RoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"][0]["name"],
        kind(&d, "ServiceAccount")["metadata"]["name"]
    );
    // The README shows the same pod rule.
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.contains(r#"verbs: ["get", "list", "create", "delete", "deletecollection"]"#));
    assert!(readme.contains(r#"verbs: ["create", "patch", "get"]"#));
}

pub(crate) fn podalloc_args(pod_spec: &Value) -> Vec<String> {
    let c = &pod_spec["containers"][0];
    let mut args = vec!["podalloc".to_string()];
    args.extend(
        c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string()),
    );
    args
}

#[test]
fn cronjob_runs_a_job_a_minute_that_ticks_until_converged_without_overlap() {
    let d = docs("cronjob.yaml");
    let cj = kind(&d, "CronJob");
    assert_eq!(cj["spec"]["concurrencyPolicy"], "Forbid");
    assert_eq!(cj["spec"]["schedule"], "* * * * *");
    let job = &cj["spec"]["jobTemplate"]["spec"];
    assert!(
        job["activeDeadlineSeconds"].as_u64().unwrap() < 60,
        "ends before the next"
    );
    let spec = &job["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], "podalloc");
    let args = podalloc_args(spec);
    for a in ["run", "--until-converged", "--force-target"] {
        assert!(args.iter().any(|x| x == a), "{a} not in {args:?}");
    }
    podalloc::cli::Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
}

/// The app and the home (state ConfigMap or ExecutorSet) a recipe's podalloc manages
/// (`--app-id`, `--state-store`).
fn managed(args: &[String]) -> (String, String) {
    let after = |flag: &str| {
        let i = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("{args:?}"));
        args[i + 1].clone()
    };
    (after("--app-id"), after("--state-store"))
}

/// `kubectl apply -f deploy/` must never put two controllers on one app: the CronJob and the
/// Deployment name different apps and different homes, and the `apps` recipe
/// manages only drivers that ask for it by annotation, under its own ConfigMap prefix.
#[test]
fn no_two_recipes_manage_the_same_app() {
    let cron = docs("cronjob.yaml");
    let cron =
        podalloc_args(&kind(&cron, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]);
    let dep = docs("deployment.yaml");
    let dep = podalloc_args(&kind(&dep, "Deployment")["spec"]["template"]["spec"]);
    let (ca, cs) = managed(&cron);
    let (da, ds) = managed(&dep);
    assert_ne!(ca, da, "the CronJob and the Deployment manage one app");
    assert_ne!(cs, ds, "the CronJob and the Deployment share a home");
    let apps = docs("apps-deployment.yaml");
    let apps = podalloc_args(&kind(&apps, "Deployment")["spec"]["template"]["spec"]);
    let i = apps.iter().position(|a| a == "--state-configmaps").unwrap();
    let prefix = &apps[i + 1];
    for s in [&cs, &ds] {
        assert!(
            !s.trim_start_matches("configmap:")
                .starts_with(prefix.as_str()),
            "{s} ~ {prefix}"
        );
    }
    assert!(
        !apps.iter().any(|a| a == "--app-id"),
        "apps discovers its apps: {apps:?}"
    );
}

#[test]
fn deployment_runs_the_loop_on_two_replicas_with_leader_election() {
    let d = docs("deployment.yaml");
    let dep = kind(&d, "Deployment");
    assert_eq!(dep["spec"]["replicas"], 2);
    let spec = &dep["spec"]["template"]["spec"];
    let args = podalloc_args(spec);
    assert!(args.iter().any(|a| a == "run"));
    assert!(args.iter().any(|a| a == "--leader-elect"));
    // Replicas share no volume: the state is in the app's in-cluster home, its ExecutorSet
    // (issue 28: the in-cluster recipe uses one, so `kubectl scale es`, an HPA or KEDA
    // drive it).
    assert!(
        args.iter().any(|a| a == "executorset:spark-etl"),
        "{args:?}"
    );
    let env = &spec["containers"][0]["env"][0];
    assert_eq!(env["name"], "POD_NAME");
    assert_eq!(env["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
    let cli = podalloc::cli::Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    match cli.command {
        podalloc::cli::Command::Run(r) => assert!(r.leader.leader_elect),
        other => panic!("not run: {other:?}"),
    }
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.contains("two replicas with `--leader-elect`"));
}

#[test]
fn deployment_replicas_elect_one_leader() {
    let w = recipe_world();
    let d = docs("deployment.yaml");
    let args = podalloc_args(&kind(&d, "Deployment")["spec"]["template"]["spec"]);
    let extra = [
        "--interval",
        "200ms",
        "--leader-elect-retry-period",
        "500ms",
    ];
    let a = spawn_recipe(&args, &w, &extra, "podalloc-spark-etl-a");
    let b = spawn_recipe(&args, &w, &extra, "podalloc-spark-etl-b");
    let lease = "/apis/coordination.k8s.io/v1/namespaces/batch/leases/podalloc-spark-etl";
    let t = std::time::Instant::now();
    while w.sim.stats().live_pods < 20 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "not converged"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (code, l) = w.api("GET", lease, None);
    assert_eq!(code, 200, "{l}");
    let holder = l["spec"]["holderIdentity"].as_str().unwrap().to_string();
    assert!(holder.starts_with("podalloc-spark-etl-"), "{holder}");
    // The leader created the app's ExecutorSet, seeded by --target, and publishes its status;
    // a write of its /scale (what `kubectl scale es`, an HPA or KEDA send) is followed.
    let es = "/apis/podalloc.io/v1alpha1/namespaces/batch/executorsets/spark-etl";
    let (code, scale) = w.api("GET", &format!("{es}/scale"), None);
    assert_eq!(code, 200, "{scale}");
    assert_eq!(scale["spec"]["replicas"], 20, "{scale}");
    let mut scale = scale;
    scale["spec"]["replicas"] = serde_json::json!(22);
    let (code, out) = w.api("PUT", &format!("{es}/scale"), Some(&scale));
    assert_eq!(code, 200, "{out}");
    let o = loop {
        let (_, o) = w.api("GET", es, None);
        if o["status"]["replicas"] == 22 {
            break o;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(40),
            "the scale was not followed: {o}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(o["status"]["target"], 22, "{o}");
    assert_eq!(
        o["status"]["selector"],
        "spark-app-selector=spark-etl,spark-role=executor"
    );
    for c in [&a, &b] {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    }
    for c in [a, b] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let s = w.sim.stats();
    assert_eq!(
        s.creates, 22,
        "one leader created the target, no duplicates"
    );
    assert_eq!(s.duplicate_executor_ids, 0);
}

/// A simulator for the recipes: their token, pods that start in 100 ms.
fn recipe_world() -> World {
    SimWorld::new()
        .token("recipe-token")
        .startup(std::time::Duration::from_millis(100))
        .start()
}

/// [`run_recipe`]'s process, started with `POD_NAME` and left running.
fn spawn_recipe(args: &[String], w: &World, extra: &[&str], pod: &str) -> std::process::Child {
    recipe(args, w, extra)
        .env("POD_NAME", pod)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The recipe's podalloc arguments as a command, connecting through the environment (as the
/// in-cluster service account would), with the template path pointing at the
/// executor-template ConfigMap's content.
fn recipe(args: &[String], w: &World, extra: &[&str]) -> Command {
    let tpl = w.path("executor.yaml");
    let d = docs("executor-template.yaml");
    std::fs::write(&tpl, d[0]["data"]["executor.yaml"].as_str().unwrap()).unwrap();
    let args: Vec<String> = args[1..]
        .iter()
        .map(|a| match a.as_str() {
            "/etc/podalloc/executor.yaml" => tpl.display().to_string(),
            // Replicas share this host: any free port instead of the pod's own.
            ":8080" | ":8081" => "127.0.0.1:0".to_string(),
            _ => a.clone(),
        })
        .collect();
    let mut c = podalloc();
    c.args(&args)
        .args(extra)
        .env("PODALLOC_SERVER", w.sim.url())
        .env("PODALLOC_TOKEN", &w.token)
        .env("PODALLOC_CERTIFICATE_AUTHORITY", &w.ca)
        .env("PODALLOC_NAMESPACE", "batch");
    c
}

#[test]
fn executor_template_configmap_holds_a_valid_template() {
    let d = docs("executor-template.yaml");
    let text = d[0]["data"]["executor.yaml"].as_str().unwrap();
    let v = podalloc::commands::parse_template_text(text).unwrap();
    podalloc::podspec::PodTemplate::from_value(v, None).unwrap();
}

#[test]
fn admin_host_config_file_keys_are_flags() {
    use clap::CommandFactory;
    let p = root().join("deploy/host/spark-etl.yaml");
    podalloc::config_file::load(&podalloc::cli::Cli::command(), &p).unwrap();
}

/// Runs [`recipe`] with a state file.
fn run_recipe(args: &[String], w: &World, extra: &[&str]) -> std::process::Output {
    recipe(args, w, extra)
        .env("PODALLOC_STATE_FILE", w.state_file())
        .output()
        .unwrap()
}

#[test]
fn one_cronjob_job_converges_the_app_and_the_next_changes_nothing() {
    let w = recipe_world();
    let d = docs("cronjob.yaml");
    let spec = &kind(&d, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    let args = podalloc_args(spec);
    let deadline = kind(&d, "CronJob")["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"]
        .as_u64()
        .unwrap();
    // One job converges the app within its deadline (several ticks, a batch each)...
    let t = std::time::Instant::now();
    let out = run_recipe(&args, &w, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(t.elapsed().as_secs() < deadline, "took {:?}", t.elapsed());
    let s = w.sim.stats();
    assert_eq!(s.live_pods, 20, "the CronJob's target in one job");
    assert!(s.creates >= 20);
    // ...and the next minute's job finds it converged and changes nothing.
    let out = run_recipe(&args, &w, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again = w.sim.stats();
    assert_eq!((again.creates, again.deletes), (s.creates, s.deletes));
    assert_eq!(again.duplicate_executor_ids, 0);
    assert!(
        !w.state_file().exists(),
        "state is in the ConfigMap, not a file"
    );
}

#[test]
fn dockerfile_builds_without_the_simulator_from_the_whole_workspace() {
    let docker = std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    let build = docker
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("a cargo build step");
    assert!(
        build.contains("--locked") && build.contains("--no-default-features"),
        "the image's binary has no simulator: {build}"
    );
    // Cargo reads every workspace member's manifest, so each must be in the build context.
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find(|l| l.starts_with("members"))
        .expect("a [workspace] members list");
    for member in members.split('"').skip(1).step_by(2).filter(|m| *m != ".") {
        let top = member.split('/').next().unwrap();
        assert!(
            docker
                .lines()
                .any(|l| l.starts_with(&format!("COPY {top}"))),
            "deploy/Dockerfile does not copy workspace member {member}"
        );
    }
}

/// Both Deployments serve `/metrics` and the probes, and their liveness and readiness
/// probes ask the port the podalloc arguments serve them on.
#[test]
fn the_deployments_probe_the_addresses_podalloc_serves() {
    for file in ["deployment.yaml", "apps-deployment.yaml"] {
        let d = docs(file);
        let spec = &kind(&d, "Deployment")["spec"]["template"]["spec"];
        let args = podalloc_args(spec);
        let after = |flag: &str| {
            let i = args
                .iter()
                .position(|a| a == flag)
                .unwrap_or_else(|| panic!("{file}: no {flag}"));
            args[i + 1].trim_start_matches(':').parse::<u64>().unwrap()
        };
        let c = &spec["containers"][0];
        let port = |name: &str| {
            (c["ports"].as_array().unwrap().iter())
                .find(|p| p["name"] == name)
                .and_then(|p| p["containerPort"].as_u64())
                .unwrap_or_else(|| panic!("{file}: no port {name}"))
        };
        assert_eq!(
            after("--health-probe-bind-address"),
            port("probes"),
            "{file}"
        );
        assert_eq!(after("--metrics-bind-address"), port("metrics"), "{file}");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{file}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{file}");
        assert_eq!(c["livenessProbe"]["httpGet"]["port"], "probes", "{file}");
    }
}

/// The README's "Trying podalloc by hand" says to install the ExecutorSet CRD, as the admin,
/// since `scripts/controlplane.sh start` does not (a new user's trial met 404s).
#[test]
fn trying_by_hand_installs_the_crd_as_the_admin() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme.find("**Trying podalloc by hand").unwrap();
    let section = &readme[start..start + readme[start..].find("\n## ").unwrap()];
    assert!(
        section.contains("kubectl --kubeconfig /tmp/cp/admin.kubeconfig apply -f deploy/crd.yaml"),
        "{section}"
    );
}
