//! Operator experience: one `run` loop owns its app (file lock held for the whole run, a
//! ConfigMap holder record, written once and asked whether it lives), a retried ConfigMap write is not a rival, the
//! state is bound to its cluster, and connection flags override the kubeconfig field by field.

use crate::util::{args, code, exits, stderr, SimWorld, World};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Kills and reaps a child started by the test, whatever happens to the test.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(mut c: Command) -> Reap {
    Reap(
        c.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Two loops on one app: the second exits 3 naming the first's host and pid (file store),
/// or waits as a standby naming them until its `--timeout` (ConfigMap store: `standby`); a
/// one-shot reconcile exits 3 naming them; the first keeps its target.
fn second_loop_is_refused(
    w: &World,
    store: &[&str],
    standby: bool,
    wait_until: impl Fn(&World) -> bool,
) {
    let with = |args: &[&str]| {
        let mut all = store.to_vec();
        all.extend_from_slice(args);
        w.cmd(&all)
    };
    let first = spawn(with(&["run", "--target", "10", "--interval", "200ms"]));
    w.wait_for("the first loop's first tick", |w| wait_until(w));
    let pid = format!("pid {}", first.0.id());
    let host = podalloc::state::hostname();
    for (args, want) in [
        (
            &args("run --target 4 --interval 200ms --timeout 5s")[..],
            if standby { 0 } else { 3 },
        ),
        (&["reconcile", "--target", "4"][..], 3),
    ] {
        let out = with(args).output().unwrap();
        let err = stderr(&out);
        assert_eq!(code(&out), want, "{args:?}: {err}");
        assert!(err.contains(&pid) && err.contains(&host), "{args:?}: {err}");
        assert!(err.contains("podalloc run"), "{err}");
        if want == 0 {
            assert!(err.contains("waiting as a standby"), "{err}");
            // A standby held nothing: it gives nothing up at its end, and warns of nothing.
            assert!(!err.contains("could not give up"), "{err}");
        }
    }
    w.wait_for("10 live executors", |w| w.live().len() == 10);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(w.live().len(), 10, "the first loop's target holds");
    drop(first);
}

#[test]
fn a_second_run_loop_on_the_same_state_file_exits_3_naming_the_first() {
    let w = SimWorld::new().app("own-file").start();
    let state = w.state_file();
    second_loop_is_refused(&w, &[], false, |_| state.exists());
}

#[test]
fn a_second_run_loop_on_the_same_configmap_waits_as_a_standby_naming_the_first() {
    let w = SimWorld::new().app("own-cm").no_state_file().start();
    second_loop_is_refused(
        &w,
        &["--state-store", "configmap:own-cm-state"],
        true,
        |w| {
            w.api(
                "GET",
                "/api/v1/namespaces/default/configmaps/own-cm-state",
                None,
            )
            .0 == 200
        },
    );
}

#[test]
fn a_configmap_write_applied_but_answered_504_is_not_a_rival() {
    let w = SimWorld::new()
        .app("cm-retry")
        .no_state_file()
        .faults(&["cm-update:504-after-write@1"])
        .start();
    let reconcile = args("--state-store configmap:cm-retry-state reconcile --target 3");
    let out = w.run(&reconcile);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("had already been applied"),
        "{}",
        stderr(&out)
    );
    let out = w.run(&reconcile);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(w.sim.stats().creates, 3);
}

#[test]
fn a_state_file_of_another_cluster_is_an_error_naming_both_servers() {
    let a = SimWorld::new().app("bound").start();
    let b = SimWorld::new().app("bound").start();
    a.ok(&["reconcile", "--target", "2"]);
    assert_eq!(
        a.state()["owner"]["server"],
        a.sim.url().trim_end_matches('/')
    );
    // The same state, now pointed at the second cluster.
    std::fs::copy(a.state_file(), b.state_file()).unwrap();
    for args in [&["reconcile", "--target", "2"][..], &["status"][..]] {
        let out = b.run(args);
        let err = stderr(&out);
        assert_eq!(code(&out), 2, "{args:?}: {err}");
        assert!(
            err.contains(a.sim.url().trim_end_matches('/'))
                && err.contains(b.sim.url().trim_end_matches('/')),
            "{err}"
        );
    }
    assert_eq!(
        b.sim.stats().creates,
        0,
        "nothing done on the second cluster"
    );
}

/// The default state path is keyed by cluster: pointing podalloc at another cluster (another
/// kubeconfig context, a restarted simulator) with the same app finds no state there and
/// starts clean, and the first cluster's state is still there and still its own.
#[test]
fn the_default_state_path_is_per_cluster_so_another_context_is_not_an_error() {
    let a = SimWorld::new().app("ctx").no_state_file().start();
    let b = SimWorld::new().app("ctx").no_state_file().start();
    let home = tempfile::tempdir().unwrap();
    let run = |w: &World, args: &[&str]| {
        let out = w
            .cmd(args)
            .env("XDG_STATE_HOME", home.path())
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
    };
    run(&a, &["reconcile", "--target", "2"]);
    for args in [&["status"][..], &["reconcile", "--target", "1"][..]] {
        run(&b, args);
    }
    run(&a, &["status"]);
    let files: Vec<_> = walk(home.path());
    assert_eq!(files.len(), 2, "one state per cluster: {files:?}");
    assert_eq!((a.sim.stats().creates, b.sim.stats().creates), (2, 1));
}

/// Every `.json` file below `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "json") {
            out.push(p);
        }
    }
    out
}

#[test]
fn an_old_state_file_without_its_cluster_keeps_working_and_gets_it_at_the_next_save() {
    let w = SimWorld::new().app("old-state").start();
    crate::util::write(
        &w.state_file(),
        r#"{"version": 1, "target": 2, "last_executor_id": 0}"#,
    );
    w.ok(&["reconcile"]);
    let st = w.state();
    assert_eq!(st["owner"]["namespace"], "default");
    assert_eq!(st["owner"]["app_id"], "old-state");
    assert_eq!(st["last_executor_id"], 2);
}

/// A kubeconfig for the simulator at `kube/config` (server `server`, its CA and token, an
/// optional `tls-server-name`), and `podalloc` with `KUBECONFIG` pointing to it.
fn with_kubeconfig(w: &World, server: &str, tls_server_name: Option<&str>) -> Command {
    let name = tls_server_name
        .map(|n| format!("    tls-server-name: {n}\n"))
        .unwrap_or_default();
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: sim\ncontexts:\n- name: sim\n  context: {{cluster: sim, user: sim}}\nclusters:\n- name: sim\n  cluster:\n    server: {server}\n    certificate-authority: {}\n{name}users:\n- name: sim\n  user:\n    token: {}\n",
        w.ca.display(),
        w.token
    );
    let kc = w.path("kube/config");
    crate::util::write(&kc, &text);
    let mut c = w.bare();
    c.env("KUBECONFIG", &kc).env("HOME", w.path("home"));
    c
}

#[test]
fn server_flag_keeps_the_kubeconfig_credential_and_ca() {
    let w = SimWorld::new().app("kc-server").start();
    let url = w.sim.url();
    let port = url.rsplit(':').next().unwrap().trim_end_matches('/');
    // The kubeconfig says 127.0.0.1; --server spells the same server `localhost`.
    let mut c = with_kubeconfig(&w, &url, None);
    let out = c
        .args(["--server", &format!("https://localhost:{port}")])
        .args(["reconcile", "--target", "1"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // The kubeconfig's tls-server-name named its own server: --server drops it, and
    // --tls-server-name replaces it. (The state is bound to the URL as spelled, so the
    // other spelling starts a new state file.)
    std::fs::remove_file(w.state_file()).unwrap();
    let mut c = with_kubeconfig(&w, &url, Some("not-the-simulator.example"));
    let out = c
        .args(["--server", &url, "--tls-server-name", "localhost"])
        .args(["reconcile", "--target", "2"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(w.state()["owner"]["server"], url.trim_end_matches('/'));
}

/// `podalloc args` with its standard output a pipe whose reading end is already closed.
fn with_closed_stdout(mut c: Command) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    c.stdout(writer).stderr(Stdio::piped()).output().unwrap()
}

#[test]
fn an_unknown_log_level_is_a_usage_error_naming_the_allowed_values() {
    let err = exits(
        crate::util::podalloc().args(["--log-level", "verbose", "--app-id", "x", "status"]),
        2,
    );
    assert!(err.contains("\"verbose\""), "{err}");
    assert!(
        err.contains("off, error, warn, info, debug, trace"),
        "{err}"
    );
    // A per-module level is still fine.
    let out = crate::util::podalloc()
        .args(["--log-level", "warn,podalloc=debug", "completions", "bash"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn a_closed_stdout_ends_every_printing_command_quietly() {
    let w = SimWorld::new().app("pipe").start();
    w.ok(&["reconcile", "--target", "1"]);
    let mut cmds = vec![];
    for args in [&["completions", "bash"][..], &["man"][..]] {
        let mut c = crate::util::podalloc();
        c.args(args);
        cmds.push(c);
    }
    cmds.push(w.cmd(&["status"]));
    cmds.push(w.cmd(&["status", "--output", "json"]));
    cmds.push(w.cmd(&["reconcile", "--dry-run"]));
    for c in cmds {
        let what = format!("{:?}", c.get_args().collect::<Vec<_>>());
        let out = with_closed_stdout(c);
        let err = stderr(&out);
        assert_eq!(code(&out), 0, "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
}

#[test]
fn usage_errors_keep_clap_s_whole_message_and_name_the_source_of_a_bad_value() {
    let err = exits(
        crate::util::podalloc().args(["--app-id", "x", "reconcile", "--targte", "3"]),
        2,
    );
    assert!(
        err.starts_with("podalloc: error: unexpected argument '--targte'"),
        "{err}"
    );
    assert!(err.contains("'--target'"), "did you mean: {err}");
    assert!(err.contains("Usage: podalloc reconcile"), "{err}");
    // A missing argument names it.
    let out = crate::util::podalloc().args(["scale"]).output().unwrap();
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("<N>") || stderr(&out).contains("<TARGET>"),
        "{}",
        stderr(&out)
    );
    // From the environment.
    let err = exits(
        crate::util::podalloc()
            .env("PODALLOC_BATCH_SIZE", "lots")
            .args(["--app-id", "x", "status"]),
        2,
    );
    assert!(
        err.contains("environment variable PODALLOC_BATCH_SIZE"),
        "{err}"
    );
    // From the config file.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("podalloc.yaml");
    std::fs::write(&cfg, "log-level: verbose\n").unwrap();
    let err = exits(
        crate::util::podalloc()
            .arg("--config")
            .arg(&cfg)
            .args(["--app-id", "x", "status"]),
        2,
    );
    assert!(
        err.contains(&format!("config file {}, key `log-level`", cfg.display())),
        "{err}"
    );
}

#[test]
fn status_says_why_not_converged_and_lists_the_ids() {
    let w = SimWorld::pending_for("why", Duration::from_secs(60)).start();
    w.ok(&["reconcile", "--target", "8"]);
    let out = w.ok(&["status", "--output", "json"]);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["converged"], false);
    assert_eq!(s["blocked"]["reason"], "waiting", "{s}");
    assert_eq!(
        s["executors"]["pending"],
        serde_json::json!([1, 2, 3, 4, 5])
    );
    assert!(!s["not_converged_because"].as_array().unwrap().is_empty());
    let out = w.ok(&["status"]);
    let text = crate::util::stdout(&out);
    assert!(text.contains("pending: 1 2 3 4 5"), "{text}");
    assert!(
        text.contains("not converged: creation is blocked: waiting"),
        "{text}"
    );
}

/// Converged with running executors above a lowered target: `status` says so, and what
/// deletes them (a fresh user's finding).
#[test]
fn status_says_when_running_executors_are_above_the_target() {
    let w = SimWorld::quick("above").start();
    w.converge(4);
    w.ok(&["reconcile", "--target", "2"]);
    let text = crate::util::stdout(&w.ok(&["status"]));
    assert!(
        text.contains(
            "converged (2 running above the target of 2: running executors are not deleted"
        ),
        "{text}"
    );
}

#[test]
fn connection_errors_name_the_server_and_the_settings_and_tls_failures_are_permanent() {
    let w = SimWorld::new().app("conn").start();
    // Nothing listens on port 1.
    let err = exits(
        w.bare()
            .args(["--server", "https://127.0.0.1:1", "--token", "t", "status"])
            .env("HOME", w.path("home")),
        1,
    );
    assert!(
        err.contains("API server https://127.0.0.1:1; connection settings from flags"),
        "{err}"
    );
    // The simulator's certificate checked against another CA: exit 4.
    let other = SimWorld::new().start();
    let err = exits(
        w.bare()
            .args(["--server", &w.sim.url(), "--token", &w.token])
            .arg("--certificate-authority")
            .arg(&other.ca)
            .args(["status"])
            .env("HOME", w.path("home")),
        4,
    );
    assert!(err.contains(w.sim.url().trim_end_matches('/')), "{err}");
}

#[test]
fn run_logs_a_tick_line_only_when_something_changed_and_every_line_names_the_app() {
    let w = SimWorld::new().app("quiet").start();
    let err = w.run_exits(&args("run --target 2 --interval 50ms --timeout 3s"), 0);
    let ticks = err.lines().filter(|l| l.contains("] tick ")).count();
    // Dozens of ticks; a handful of them changed anything (create, pending, running).
    assert!((2..=6).contains(&ticks), "{ticks} tick lines: {err}");
    for line in err
        .lines()
        .filter(|l| l.contains(" INFO ") || l.contains(" WARN "))
    {
        assert!(line.contains(" app=quiet ns=default]"), "{line}");
    }
    // A heartbeat brings the unchanged line back.
    let out = w.run(&args(
        "run --interval 50ms --idle-interval 50ms --log-every 200ms --timeout 1s",
    ));
    let err = stderr(&out);
    let ticks = err.lines().filter(|l| l.contains("] tick ")).count();
    assert!(ticks >= 3, "{ticks} tick lines: {err}");
}

#[test]
fn json_logs_carry_app_namespace_and_counts_as_fields() {
    let w = SimWorld::new().app("fields").start();
    let err = w.run_exits(
        &args("--log-format json run --target 2 --until-converged --timeout 30s"),
        0,
    );
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let ticks: Vec<_> = lines.iter().filter(|l| l["tick"].is_u64()).collect();
    assert!(!ticks.is_empty(), "{err}");
    for t in &ticks {
        assert_eq!(t["app"], "fields");
        assert_eq!(t["namespace"], "default");
        assert_eq!(t["target"], 2);
        assert!(t["running"].is_u64() && t["pending"].is_u64() && t["created"].is_u64());
        assert!(!t["msg"].as_str().unwrap().contains("running="), "{t}");
    }
    assert_eq!(ticks.last().unwrap()["running"], 2);
    // The final error line of a failing command carries them too: a target the 1 ms
    // deadline cannot reach (--force-target: the store already holds 2, which --target
    // would only seed; a plain run that converged before its deadline exits 0).
    let err = w.run_exits(
        &args("--log-format json run --target 3 --force-target --until-converged --timeout 1ms"),
        5,
    );
    let last: serde_json::Value = serde_json::from_str(err.lines().last().unwrap()).unwrap();
    assert_eq!(last["exit_code"], 5, "{last}");
    assert_eq!(
        (&last["app"], &last["namespace"]),
        (&"fields".into(), &"default".into())
    );
}

#[test]
fn repeated_warnings_during_an_outage_are_collapsed() {
    let w = SimWorld::new().app("outage").faults(&["list:503"]).start();
    let out = w.run(&args("run --target 2 --interval 50ms --timeout 4s"));
    let err = stderr(&out);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains(" WARN ")).collect();
    let requests = w.sim.stats();
    assert!(
        warnings.len() <= 6,
        "{} warning lines for {requests:?}: {err}",
        warnings.len()
    );
    assert!(warnings.iter().any(|l| l.contains("more time")), "{err}");
    // What is still held at exit is said as history, after the last tick's line.
    let last = err.lines().rfind(|l| l.contains(" WARN ")).unwrap();
    assert!(
        last.contains("held back before exit, ") && last.contains(" the last: "),
        "{err}"
    );
}

#[test]
fn add_wait_converges_on_the_raised_target() {
    let w = SimWorld::new()
        .app("add-wait")
        .batch_delay("100ms")
        .startup(Duration::from_millis(200))
        .start();
    w.ok(&["scale", "2"]);
    let out = w.run(&["add", "3", "--wait", "--timeout", "30s"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(w.live().len(), 5);
    assert_eq!(w.state()["target"], 5);
    let pods = w.pods("default");
    assert!(pods.iter().all(|p| p["status"]["phase"] == "Running"));
}

#[test]
fn the_image_pod_is_shaped_like_a_spark_executor() {
    let w = SimWorld::new().app("shape").start();
    w.ok(&["reconcile", "--target", "1"]);
    let pods = w.pods("default");
    let c = &pods[0]["spec"]["containers"][0];
    assert_eq!(c["name"], "spark-kubernetes-executor");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(c["resources"]["requests"]["cpu"], "100m");
    assert_eq!(c["resources"]["requests"]["memory"], "256Mi");
}

#[test]
fn a_rejected_token_reads_naturally() {
    let w = SimWorld::new().app("auth").start();
    let err = exits(
        &mut w.cmd_as("wrong-token-value", &["reconcile", "--target", "1"]),
        1,
    );
    assert!(
        err.contains(
            "the token from the --token flag was rejected by the API server (401 Unauthorized)"
        ),
        "{err}"
    );
    assert!(!err.contains("Unauthorized: Unauthorized"), "{err}");
}

#[test]
fn a_stale_configmap_holder_is_taken_over_and_a_fresh_one_is_respected() {
    let w = SimWorld::new().app("stale").no_state_file().start();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for (name, renewed_ms, want) in [
        ("stale-old", now_ms - 120_000, 0),
        ("stale-fresh", now_ms - 1_000, 3),
    ] {
        let holder = serde_json::json!({
            "command": "run", "host": "elsewhere", "pid": 4242,
            "since": "2026-01-01T00:00:00Z", "since_ms": 1, "renewed_ms": renewed_ms,
            "stale_after_s": 30,
        });
        let cm = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/managed-by": "podalloc"},
                "annotations": {"podalloc.io/holder": holder.to_string()},
            },
            "data": {},
        });
        let (status, body) = w.api("POST", "/api/v1/namespaces/default/configmaps", Some(&cm));
        assert_eq!(status, 201, "{body}");
        let store = format!("configmap:{name}");
        let out = w.run(&["--state-store", &store, "reconcile", "--target", "1"]);
        let err = stderr(&out);
        assert_eq!(code(&out), want, "{name}: {err}");
        if want == 3 {
            assert!(err.contains("host elsewhere, pid 4242"), "{err}");
        } else {
            assert!(err.contains("taking over from a stale owner"), "{err}");
        }
    }
}

/// A `run` loop on the ConfigMap store that stops cleanly gives up its holder record, so a
/// loop started right after is not refused (here with `--force-target`, a new target).
#[test]
fn a_cleanly_stopped_loop_releases_the_configmap_holder() {
    let w = SimWorld::new().app("handover").start();
    let first =
        "--state-store configmap:handover-state run --target 1 --until-converged --timeout 30s";
    w.run_exits(&args(first), 0);
    let second =
        "--state-store configmap:handover-state run --target 2 --force-target --until-converged --timeout 30s";
    w.run_exits(&args(second), 0);
    assert_eq!(w.live().len(), 2);
}

/// The blocked reason is logged when it changes, not every tick: a loop waiting ~2 s per
/// batch at 100 ms ticks says "waiting for … pending pods" once per batch.
#[test]
fn run_logs_the_blocked_reason_when_it_changes_not_every_tick() {
    let w = SimWorld::pending_for("quiet", Duration::from_millis(1500)).start();
    let out = w.run(&[
        "--batch-size",
        "2",
        "run",
        "--target",
        "4",
        "--interval",
        "100ms",
        "--until-converged",
        "--timeout",
        "30s",
    ]);
    let err = stderr(&out);
    assert_eq!(code(&out), 0, "{err}");
    let waits = err.matches("no executor created: waiting for").count();
    assert!((1..=3).contains(&waits), "{waits} blocked lines: {err}");
}

/// `apps --discover` whose selector matches no driver says so once, naming the selector and
/// the namespace, not once a pass.
#[test]
fn discovery_that_matches_nothing_says_so_once() {
    let w = SimWorld::new().start();
    let mut c = crate::util::podalloc();
    c.args(["--server", &w.sim.url(), "--token", &w.token])
        .arg("--certificate-authority")
        .arg(&w.ca)
        .args([
            "--image",
            "spark:3.5",
            "apps",
            "--discover",
            "spark-role=drvier",
        ])
        .args(["--interval", "100ms", "--timeout", "2s", "--state-dir"])
        .arg(w.path("states"));
    let out = c.output().unwrap();
    let err = stderr(&out);
    let said = err
        .matches("no driver pod in namespace default matches")
        .count();
    assert_eq!(said, 1, "{err}");
    assert!(err.contains("\"spark-role=drvier\""), "{err}");
}
