//! Authentication end to end: the real binary with kubeconfigs whose user is an exec
//! credential plugin (a shell script standing in for `aws eks get-token`,
//! `gke-gcloud-auth-plugin` or `kubelogin`), against the simulated API server over HTTPS.
//!
//! The plugin script counts its runs in a file next to it, saves the `KUBERNETES_EXEC_INFO`
//! it was given, answers with the apiVersion it was asked for, and takes its behaviour from
//! the kubeconfig's `exec.env`: `TTL` (seconds until `expirationTimestamp`), `WRONG_FIRST`
//! (how many runs hand out a token the server rejects) and `SLOW` (seconds every run after
//! the first takes).

use crate::util::{args, stderr, stdout, write, SimWorld, World};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const APP: &str = "a";
const NAMESPACE: &str = "spark-jobs";

fn world() -> PluginWorld {
    PluginWorld(
        SimWorld::new()
            .app(APP)
            .image("i")
            .ca_file("kube/ca.crt")
            .token("sim-token-from-the-plugin-4711")
            .pod_ms(50, 200)
            .start(),
    )
}

/// [`world`] with `kube/plugin.sh`, the exec plugin of [`token_plugin`] printing the
/// world's token.
fn plugin_world() -> PluginWorld {
    let w = world();
    w.script("plugin.sh", &token_plugin(&w.token));
    w
}

/// A plugin that prints a token (the right one unless `WRONG_FIRST` says otherwise).
fn token_plugin(good: &str) -> String {
    format!(
        r#"d=$(dirname "$0")
echo run >> "$d/runs"
n=$(wc -l < "$d/runs" | tr -d ' ')
printf '%s' "$KUBERNETES_EXEC_INFO" > "$d/exec-info.json"
api=$(printf '%s' "$KUBERNETES_EXEC_INFO" | sed 's/.*"apiVersion":"\([^"]*\)".*/\1/')
tok="{good}"
if [ "$n" -le "${{WRONG_FIRST:-0}}" ]; then tok="rejected-token-$n"; fi
if [ "$n" -ge 2 ] && [ -n "$SLOW" ]; then sleep "$SLOW"; fi
exp=""
if [ -n "$TTL" ]; then
  t=$(( $(date +%s) + TTL ))
  ts=$(date -u -d "@$t" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || date -u -r "$t" +%Y-%m-%dT%H:%M:%SZ)
  exp=",\"expirationTimestamp\":\"$ts\""
fi
printf '{{"apiVersion":"%s","kind":"ExecCredential","status":{{"token":"%s"%s}}}}\n' "$api" "$tok" "$exp""#
    )
}

/// A simulator with a kubeconfig directory (`kube/`) that holds its CA and the plugin.
struct PluginWorld(World);

impl std::ops::Deref for PluginWorld {
    type Target = World;
    fn deref(&self) -> &World {
        &self.0
    }
}

impl PluginWorld {
    fn kube(&self) -> PathBuf {
        self.dir.path().join("kube")
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path(rel);
        write(&p, text);
        p
    }

    /// Writes an executable script under the kubeconfig directory.
    fn script(&self, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let p = self.write(&format!("kube/{name}"), &format!("#!/bin/sh\n{body}\n"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// A kubeconfig at `kube/config` whose one user runs `./plugin.sh` (relative to the
    /// kubeconfig) with `env`. The CA is the relative path `ca.crt`.
    fn kubeconfig(&self, env: &[(&str, &str)], extra_exec: &str) -> PathBuf {
        let env: Vec<String> = env
            .iter()
            .map(|(k, v)| format!("{{name: {k}, value: '{v}'}}"))
            .collect();
        self.write(
            "kube/config",
            &format!(
                "apiVersion: v1
kind: Config
current-context: sim
clusters:
- name: sim
  cluster:
    server: {server}
    certificate-authority: ca.crt
contexts:
- name: sim
  context: {{cluster: sim, user: plugin-user, namespace: {NAMESPACE}}}
users:
- name: plugin-user
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ./plugin.sh
      args: [get-token, --cluster, sim]
      env: [{env}]
      interactiveMode: Never
{extra_exec}",
                server = self.sim.url(),
                env = env.join(", "),
            ),
        )
    }

    fn runs(&self) -> usize {
        std::fs::read_to_string(self.kube().join("runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// `podalloc` with a clean environment (no KUBECONFIG, no in-cluster variables, HOME
    /// without a kubeconfig) and debug logging, so that leaks would show.
    fn podalloc(&self, args: &[&str]) -> Command {
        let mut c = self.bare();
        c.args(args)
            .env("HOME", self.dir.path())
            .env("RUST_LOG", "debug")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBERNETES_SERVICE_PORT");
        c
    }

    fn run_with(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        let mut all = vec!["--kubeconfig", kubeconfig.to_str().unwrap()];
        all.extend_from_slice(args);
        self.podalloc(&all).output().unwrap()
    }

    /// How many of our executor pods are in `ns`, asked of the simulator directly.
    fn pod_count(&self, ns: &str) -> usize {
        self.pods(ns).len()
    }

    /// Asserts that no token of the plugin's shows anywhere in the output.
    fn assert_no_token(&self, out: &Output) {
        let all = format!("{}{}", stdout(out), stderr(out));
        assert!(!all.contains(&self.token), "the token leaked:\n{all}");
        assert!(!all.contains("rejected-token-"), "a token leaked:\n{all}");
    }
}

fn assert_ok(out: &Output) {
    assert!(out.status.success(), "podalloc failed:\n{}", stderr(out));
}

/// The `podalloc: error: …` line.
fn error_line(out: &Output) -> String {
    let err = stderr(out);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("podalloc: error:"))
        .collect();
    assert_eq!(lines.len(), 1, "one error line expected:\n{err}");
    lines[0].to_string()
}

#[test]
fn exec_plugin_token_creates_pods() {
    let w = plugin_world();
    let kc = w.kubeconfig(&[], "      provideClusterInfo: true\n");
    let out = w.run_with(&kc, &["reconcile", "--target", "2"]);
    assert_ok(&out);
    w.assert_no_token(&out);
    assert_eq!(w.pod_count(NAMESPACE), 2, "pods in the context's namespace");
    assert_eq!(w.runs(), 1, "one run serves the whole tick");

    // What the plugin was given: v1, not interactive, the cluster (provideClusterInfo).
    let info: Value =
        serde_json::from_slice(&std::fs::read(w.kube().join("exec-info.json")).unwrap()).unwrap();
    assert_eq!(info["apiVersion"], "client.authentication.k8s.io/v1");
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["spec"]["interactive"], false);
    assert_eq!(info["spec"]["cluster"]["server"], w.sim.url());
    let ca_b64 = info["spec"]["cluster"]["certificate-authority-data"]
        .as_str()
        .unwrap();
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(ca_b64)
        .unwrap();
    assert_eq!(String::from_utf8(ca).unwrap(), w.sim.ca_pem().unwrap());

    // --token replaces the kubeconfig user's credential: the plugin is not run.
    let out = w.run_with(&kc, &["--token", &w.token, "reconcile", "--target", "2"]);
    assert_ok(&out);
    assert!(
        !stderr(&out).contains("running exec plugin"),
        "{}",
        stderr(&out)
    );
    assert_eq!(w.runs(), 1);
    assert_eq!(w.pod_count(NAMESPACE), 2);
}

#[test]
fn exec_plugin_is_rerun_after_its_token_expires() {
    let w = plugin_world();

    // Valid for an hour: two ticks, one run.
    let kc = w.kubeconfig(&[("TTL", "3600")], "");
    let out = w.run_with(&kc, &args("run --target 2 --interval 1s --timeout 1500ms"));
    assert_ok(&out);
    assert!(stderr(&out).contains("tick 2:"), "{}", stderr(&out));
    assert_eq!(w.runs(), 1);

    // Valid for about 3 s: the second tick, 4 s later, runs the plugin again.
    std::fs::remove_file(w.kube().join("runs")).unwrap();
    let kc = w.kubeconfig(&[("TTL", "3")], "");
    let out = w.run_with(
        &kc,
        &args("run --target 2 --interval 4s --idle-interval 4s --timeout 5s"),
    );
    assert_ok(&out);
    w.assert_no_token(&out);
    let log = stderr(&out);
    assert!(log.contains("tick 2:") && !log.contains("tick 3:"), "{log}");
    assert_eq!(w.runs(), 2, "{log}");
    assert!(
        !log.contains("-> 401 ") && !log.contains("401 Unauthorized"),
        "renewed before the server refused it: {log}"
    );
    assert_eq!(w.pod_count(NAMESPACE), 2);
}

/// A slow plugin renewing a short-lived token under a leader: the renewal runs beside the
/// loop's requests, one run serves the Lease's client and the loop's, and the Lease is never
/// late. (Before, the Lease client ran the plugin of its own, inside a renewal, and lost
/// the Lease.)
#[test]
fn a_slow_plugin_renews_beside_a_leader_without_costing_its_lease() {
    let w = plugin_world();
    // Valid for 4 s (renewed after 2 s), 1.5 s a run; a 3 s Lease renewed every 500 ms.
    let kc = w.kubeconfig(&[("TTL", "4"), ("SLOW", "1.5")], "");
    let started = std::time::Instant::now();
    let out = w.run_with(
        &kc,
        &crate::util::with_fast_leader_elect(&args(
            "run --target 2 --interval 500ms --timeout 12s",
        )),
    );
    assert_ok(&out);
    w.assert_no_token(&out);
    let log = stderr(&out);
    assert!(log.contains("became the leader"), "{log}");
    assert!(!log.contains("stopped acting"), "the Lease was lost: {log}");
    // The status as the client logs it, never a bare "401": a timestamp's milliseconds
    // (`23:47:29.401Z`) matched that once.
    assert!(
        !log.contains("-> 401 ") && !log.contains("401 Unauthorized"),
        "a credential expired in use: {log}"
    );
    // One run to start, then one renewal about every 3.5 s (2 s valid + 1.5 s running):
    // three or four in 12 s; a run per client would be twice that.
    let secs = started.elapsed().as_secs_f64();
    let runs = w.runs();
    assert!((3..=5).contains(&runs), "{runs} runs in {secs:.1} s: {log}");
    assert!(
        log.contains("renewing its credential meanwhile"),
        "renewed in the background: {log}"
    );
    assert_eq!(w.pod_count(NAMESPACE), 2);
}

/// A signal while `run` waits for its first credential from a plugin that hangs ends the
/// process at once (exit 0, the starting line), and the plugin dies with it: the loop's
/// hook runs from the client's construction, and its exit kills the plugin's process group.
#[test]
fn a_signal_during_the_first_plugin_run_ends_run_and_the_plugin() {
    let w = world();
    let pidfile = w.kube().join("pid");
    w.script(
        "plugin.sh",
        r#"d=$(dirname "$0")
echo $$ > "$d/pid"
exec sleep 60"#,
    );
    let kc = w.kubeconfig(&[], "");
    let mut all = vec!["--kubeconfig", kc.to_str().unwrap()];
    all.extend(args("run --target 2"));
    let child = (w.podalloc(&all))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !pidfile.exists() {
        assert!(t.elapsed().as_secs() < 10, "the plugin never ran");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    let sent = std::time::Instant::now();
    let rc = send_signal(child.id(), "TERM");
    assert!(rc, "kill failed");
    let out = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    let log = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{log}");
    assert!(took.as_millis() < 1500, "{took:?}: {log}");
    assert!(log.contains("SIGTERM received while starting"), "{log}");
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    // Gone, or a zombie its new parent has not reaped yet. SIGKILL is delivered after
    // kill(2) returns, so the plugin is given a second to die (it sleeps 60 s otherwise).
    let alive = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()));
        stat.is_ok_and(|st| {
            st.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
    };
    let t = std::time::Instant::now();
    while alive() && t.elapsed().as_millis() < 1000 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!alive(), "the plugin {} outlived podalloc", pid.trim());
}

/// `kill -SIG PID` through the kill command (no libc call here).
fn send_signal(pid: u32, sig: &str) -> bool {
    std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn forced_401_reruns_the_plugin_exactly_once() {
    let w = plugin_world();

    // The first token is rejected, the second one works.
    let kc = w.kubeconfig(&[("WRONG_FIRST", "1")], "");
    let out = w.run_with(&kc, &["reconcile", "--target", "2"]);
    assert_ok(&out);
    w.assert_no_token(&out);
    assert_eq!(w.runs(), 2);
    assert!(
        stderr(&out).contains("401 Unauthorized; re-running the exec plugin \"./plugin.sh\""),
        "{}",
        stderr(&out)
    );
    assert_eq!(w.pod_count(NAMESPACE), 2);

    // Always rejected: exit 1 after one re-run, naming the user and the plugin.
    std::fs::remove_file(w.kube().join("runs")).unwrap();
    let kc = w.kubeconfig(&[("WRONG_FIRST", "100")], "");
    let out = w.run_with(&kc, &["reconcile", "--target", "3"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    w.assert_no_token(&out);
    assert_eq!(w.runs(), 2);
    let line = error_line(&out);
    assert!(
        line.contains(&format!(
            "exec plugin \"./plugin.sh\" (user \"plugin-user\" in kubeconfig {})",
            kc.display()
        )) && line.contains("was rejected (401 Unauthorized"),
        "{line}"
    );
    assert_eq!(w.pod_count(NAMESPACE), 2);
}

#[test]
fn failing_plugin_is_a_clear_one_line_error() {
    let w = world();
    w.script(
        "plugin.sh",
        &format!(
            r#"echo '{{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{{"token":"{}"}}}}'
echo "error: the SSO session has expired; run aws sso login" >&2
echo "second stderr line" >&2
exit 1"#,
            w.token
        ),
    );
    let kc = w.kubeconfig(&[], "");
    let out = w.run_with(&kc, &["reconcile", "--target", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    w.assert_no_token(&out);
    let line = error_line(&out);
    assert_eq!(
        line,
        format!(
            "podalloc: error: exec plugin \"./plugin.sh\" (user \"plugin-user\" in kubeconfig \
             {}) failed with exit code 1: error: the SSO session has expired; run aws sso login \
             [app=a ns={NAMESPACE}]",
            kc.display()
        )
    );
    assert!(!stderr(&out).contains("second stderr line"));
    assert_eq!(w.pod_count(NAMESPACE), 0);

    // A plugin that is not installed: exit 2 with the kubeconfig's installHint.
    let kc = w.write(
        "kube/config-missing",
        &format!(
            "current-context: sim
clusters: [{{name: sim, cluster: {{server: '{}', certificate-authority: ca.crt}}}}]
contexts: [{{name: sim, context: {{cluster: sim, user: u}}}}]
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: podalloc-test-plugin-that-is-not-installed
      installHint: |
        Install the plugin with
        'brew install podalloc-test-plugin'
",
            w.sim.url()
        ),
    );
    let out = w.run_with(&kc, &["reconcile", "--target", "2"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let line = error_line(&out);
    assert!(
        line.contains("podalloc-test-plugin-that-is-not-installed\" (user \"u\"")
            && line.contains("not found")
            && line.ends_with(
                "Install the plugin with 'brew install podalloc-test-plugin' [app=a ns=default]"
            ),
        "{line}"
    );
}

#[test]
fn kubeconfig_list_merges_first_file_wins() {
    let w = plugin_world();
    // First file: the current context, and the user as an exec plugin.
    let first = w.write(
        "kube/first",
        "current-context: merged
contexts:
- name: merged
  context: {cluster: sim, user: shared-user, namespace: ns-first}
users:
- name: shared-user
  user:
    exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: ./plugin.sh}
",
    );
    // Second file, elsewhere: the cluster (with a CA path relative to *its* directory), and
    // entries that clash with the first file's and must lose.
    w.write("other/ca-copy.crt", w.sim.ca_pem().unwrap());
    let second = w.write(
        "other/second",
        &format!(
            "current-context: loser
clusters:
- name: sim
  cluster: {{server: '{}', certificate-authority: ca-copy.crt}}
contexts:
- name: merged
  context: {{cluster: sim, user: static-user, namespace: ns-second}}
- name: loser
  context: {{cluster: nowhere, user: static-user}}
users:
- name: shared-user
  user: {{token: second-file-token}}
- name: static-user
  user: {{token: second-file-token}}
",
            w.sim.url()
        ),
    );
    // One tick toward 2 executors with KUBECONFIG set to the list `list`.
    let tick_with = |list: &str| {
        (w.podalloc(&["reconcile", "--target", "2"]))
            .env("KUBECONFIG", list)
            .output()
            .unwrap()
    };
    let list = format!("{}:{}", first.display(), second.display());
    let out = tick_with(&list);
    assert_ok(&out);
    w.assert_no_token(&out);
    assert_eq!(w.runs(), 1, "the first file's user (the plugin) is used");
    assert_eq!(w.pod_count("ns-first"), 2);
    assert_eq!(w.pod_count("ns-second"), 0);
    let log = stderr(&out);
    assert!(
        log.contains(&format!("kubeconfig {list} (context merged)")),
        "{log}"
    );

    // The other order: the second file's context and users win, and it has no cluster
    // "nowhere".
    let list = format!("{}:{}", second.display(), first.display());
    let out = tick_with(&list);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        error_line(&out).contains("cluster \"nowhere\" (used by context \"loser\") not found"),
        "{}",
        stderr(&out)
    );
    assert_eq!(w.runs(), 1);
}
