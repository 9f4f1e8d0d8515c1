//! End-to-end tests: a real HTTPS client (ureq + rustls, trusting the generated CA)
//! against a running simulator.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};

use super::{SimOptions, SimServer};

const TOKEN: &str = "s3cret-token";

fn fast_opts() -> SimOptions {
    SimOptions {
        token: Some(TOKEN.to_string()),
        schedule_latency: Duration::from_millis(50),
        startup_latency: Duration::from_millis(100),
        stop_latency: Duration::from_millis(100),
        ..SimOptions::default()
    }
}

/// The body of a failure `Status` as kube-apiserver writes it: `code`, `reason`, `message`
/// and, when given, `details`.
fn failure(code: u16, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut v = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code});
    if let Some(d) = details {
        v["details"] = d;
    }
    v
}

/// The `metadata.resourceVersion` of object `v`, which must be a number in a string.
fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A server started on [`fast_opts`] changed by `tweak`, and a client with the test token.
fn started(tweak: impl FnOnce(&mut SimOptions)) -> (SimServer, Client) {
    let mut opts = fast_opts();
    tweak(&mut opts);
    let server = SimServer::start(opts).unwrap();
    let c = Client::new(&server, Some(TOKEN));
    (server, c)
}

/// `resp`'s body, to be read whole up to 1 GiB (a list of 50,000 pods is far over ureq's
/// 10 MiB default).
fn whole_body(resp: &mut ureq::http::Response<ureq::Body>) -> ureq::BodyWithConfig<'_> {
    resp.body_mut().with_config().limit(1 << 30)
}

struct Client {
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
}

struct Reply {
    status: u16,
    headers: ureq::http::HeaderMap,
    body: Value,
}

impl Client {
    fn new(server: &SimServer, token: Option<&str>) -> Client {
        Client::build(server, token, None, Duration::from_secs(60))
    }

    /// A client that may present a client certificate (PEM cert, PEM key) and gives up
    /// after `timeout`.
    fn build(
        server: &SimServer,
        token: Option<&str>,
        cert: Option<(&str, &str)>,
        timeout: Duration,
    ) -> Client {
        let mut cfg = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout));
        if let Some(pem) = server.ca_pem() {
            let ca = Certificate::from_pem(pem.as_bytes()).unwrap();
            let client_cert = cert.map(|(crt, key)| {
                ClientCert::new_with_certs(
                    &[Certificate::from_pem(crt.as_bytes()).unwrap()],
                    PrivateKey::from_pem(key.as_bytes()).unwrap(),
                )
            });
            cfg = cfg.tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::new_with_certs(&[ca]))
                    .client_cert(client_cert)
                    .build(),
            );
        }
        Client {
            agent: cfg.build().new_agent(),
            base: server.url(),
            token: token.map(str::to_string),
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<&str>) -> Reply {
        self.try_call(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// Like `call`, but a failure to get a whole response is an `Err`.
    fn try_call(&self, method: &str, path: &str, body: Option<&str>) -> Result<Reply, String> {
        let url = format!("{}{path}", self.base);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let result = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            ("DELETE", None) => {
                let mut r = self.agent.delete(&url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            (m, b) => {
                let mut r = match m {
                    "POST" => self.agent.post(&url),
                    "PUT" => self.agent.put(&url),
                    "PATCH" => self.agent.patch(&url),
                    _ => self.agent.delete(&url).force_send_body(),
                };
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                let ctype = match m {
                    "PATCH" => "application/merge-patch+json",
                    _ => "application/json",
                };
                r.content_type(ctype).send(b.unwrap_or(""))
            }
        };
        let mut resp = result.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = (whole_body(&mut resp).read_to_string())
            .map_err(|e| format!("reading the body: {e}"))?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    fn get(&self, path: &str) -> Reply {
        self.call("GET", path, None)
    }
}

fn pod(name: &str, labels: Value) -> String {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": labels},
           "spec": {"restartPolicy": "Never",
                    "containers": [{"name": "executor", "image": "spark:3.5.1"}]}})
    .to_string()
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const PODS: &str = "/api/v1/namespaces/spark/pods";

/// A pod create answers 201 with what kube-apiserver fills in, 409 for a taken name.
#[test]
fn pod_create_answers_as_kube_apiserver_does() {
    let (server, c) = started(|_| {});
    assert!(server.url().starts_with("https://127.0.0.1:"));

    let created = c.call(
        "POST",
        PODS,
        Some(&pod("exec-1", json!({"spark-app-selector": "app-1"}))),
    );
    assert_eq!(created.status, 201, "{}", created.body);
    let p = &created.body;
    assert_eq!(p["kind"], "Pod");
    assert_eq!(p["apiVersion"], "v1");
    assert_eq!(p["metadata"]["namespace"], "spark");
    assert_eq!(p["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert!(p["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse::<u64>()
        .is_ok());
    assert!(p["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    assert_eq!(p["status"]["phase"], "Pending");
    assert_eq!(p["status"]["qosClass"], "BestEffort");
    assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 30);

    let dup = c.call("POST", PODS, Some(&pod("exec-1", json!({}))));
    assert_eq!(dup.status, 409);
    assert_eq!(
        dup.body,
        failure(
            409,
            "AlreadyExists",
            "pods \"exec-1\" already exists",
            Some(json!({"name":"exec-1","kind":"pods"}))
        )
    );

    let generated = c.call("POST", PODS, Some(r#"{"metadata":{"generateName":"spark-exec-"},"spec":{"containers":[{"name":"a","image":"b"}]}}"#));
    assert_eq!(generated.status, 201);
    let gname = generated.body["metadata"]["name"].as_str().unwrap();
    assert!(
        gname.starts_with("spark-exec-") && gname.len() == "spark-exec-".len() + 5,
        "{gname}"
    );

    let stats = server.stats();
    assert_eq!(stats.creates, 2);
    assert_eq!(stats.create_conflicts, 1);
    assert_eq!(stats.max_live_pods_by_app.get("app-1"), Some(&1));
    server.stop();
}

/// Requests without the right token answer 401, while the /sim side door needs none.
#[test]
fn requests_without_the_right_token_answer_401() {
    let server = SimServer::start(fast_opts()).unwrap();
    for client in [
        Client::new(&server, None),
        Client::new(&server, Some("wrong")),
    ] {
        let r = client.get(PODS);
        assert_eq!(r.status, 401);
        assert_eq!(r.body, failure(401, "Unauthorized", "Unauthorized", None));
    }
    // No token needed for the side door.
    assert_eq!(Client::new(&server, None).get("/sim/stats").status, 200);
}

/// An invalid pod answers 422 with its causes, a body that is no pod of the namespace 400.
#[test]
fn invalid_pod_creates_answer_422_or_400_and_create_nothing() {
    let (server, c) = started(|_| {});
    let bad = c.call(
        "POST",
        PODS,
        Some(&pod("exec-2", json!({"spark-app-selector": "not valid!"}))),
    );
    assert_eq!(bad.status, 422);
    assert_eq!(bad.body["reason"], "Invalid");
    assert_eq!(bad.body["details"]["kind"], "Pod");
    assert_eq!(bad.body["details"]["name"], "exec-2");
    let cause = &bad.body["details"]["causes"][0];
    assert_eq!(cause["reason"], "FieldValueInvalid");
    assert_eq!(cause["field"], "metadata.labels");
    assert!(cause["message"]
        .as_str()
        .unwrap()
        .starts_with("Invalid value: \"not valid!\": a valid label must be"));
    assert!(bad.body["message"]
        .as_str()
        .unwrap()
        .starts_with("Pod \"exec-2\" is invalid: metadata.labels: Invalid value"));

    let no_containers = c.call("POST", PODS, Some(r#"{"metadata":{"name":"x"},"spec":{}}"#));
    assert_eq!(no_containers.status, 422);
    assert_eq!(
        no_containers.body["details"]["causes"][0]["field"],
        "spec.containers"
    );

    assert_eq!(c.call("POST", PODS, Some("{not json")).status, 400);
    assert_eq!(c.call("POST", PODS, Some("[]")).status, 400);
    let wrong_ns = c.call("POST", PODS, Some(r#"{"metadata":{"name":"x","namespace":"other"},"spec":{"containers":[{"name":"a","image":"b"}]}}"#));
    assert_eq!(wrong_ns.status, 400);
    assert_eq!(wrong_ns.body["reason"], "BadRequest");
    assert_eq!(
        wrong_ns.body["message"],
        "the namespace of the provided object does not match the namespace sent on the request"
    );
    assert_eq!(server.stats().creates, 0);
}

/// A pod get finds the pod; an unknown pod or resource answers 404, a wrong method 405.
#[test]
fn pod_get_and_unknown_paths_answer_404_wrong_methods_405() {
    let (_server, c, path) = pod_exec_1_behind_faults(&[]);
    let got = c.get(&path);
    assert_eq!(got.status, 200);
    assert_eq!(got.body["metadata"]["name"], "exec-1");
    let missing = c.get(&format!("{PODS}/nope"));
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.body,
        failure(
            404,
            "NotFound",
            "pods \"nope\" not found",
            Some(json!({"name":"nope","kind":"pods"}))
        )
    );
    let unknown = c.get("/api/v1/namespaces/spark/services");
    assert_eq!(
        (unknown.status, unknown.body["reason"].as_str()),
        (404, Some("NotFound"))
    );
    let wrong_method = c.call("PUT", PODS, Some("{}"));
    assert_eq!(
        (wrong_method.status, wrong_method.body["reason"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
}

#[test]
fn label_and_field_selectors() {
    let (_server, c) = started(|o| o.schedule_latency = Duration::from_secs(3600));
    let fixtures = [
        ("a-1", json!({"app": "a", "role": "executor", "tier": "x"})),
        ("a-2", json!({"app": "a", "role": "driver"})),
        ("b-1", json!({"app": "b", "role": "executor"})),
        ("n-1", json!({})),
    ];
    for (name, labels) in &fixtures {
        assert_eq!(
            c.call("POST", PODS, Some(&pod(name, labels.clone())))
                .status,
            201
        );
    }
    let sel = |s: &str| {
        let q: String = s
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => {
                    (b as char).to_string()
                }
                b' ' => "+".to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let r = c.get(&format!("{PODS}?labelSelector={q}"));
        assert_eq!(r.status, 200, "{s}: {}", r.body);
        assert_eq!(r.body["kind"], "PodList");
        assert!(r.body["items"][0].get("kind").is_none());
        names(&r.body)
    };
    assert_eq!(sel("app=a"), ["a-1", "a-2"]);
    assert_eq!(sel("app==b"), ["b-1"]);
    assert_eq!(sel("app!=a"), ["b-1", "n-1"]);
    assert_eq!(sel("role in (executor,driver)"), ["a-1", "a-2", "b-1"]);
    assert_eq!(sel("role notin (executor)"), ["a-2", "n-1"]);
    assert_eq!(sel("tier"), ["a-1"]);
    assert_eq!(sel("!tier"), ["a-2", "b-1", "n-1"]);
    assert_eq!(sel("app=a,role=executor"), ["a-1"]);
    assert_eq!(sel(""), ["a-1", "a-2", "b-1", "n-1"]);

    let bad = c.get(&format!("{PODS}?labelSelector=app+in+b"));
    assert_eq!(bad.status, 400);
    assert_eq!(bad.body["reason"], "BadRequest");
    assert_eq!(
        bad.body["message"],
        "unable to parse requirement: found 'b' expected: '('"
    );

    let pending = c.get(&format!("{PODS}?fieldSelector=status.phase%3DPending"));
    assert_eq!(names(&pending.body).len(), 4);
    let running = c.get(&format!("{PODS}?fieldSelector=status.phase%3DRunning"));
    assert!(names(&running.body).is_empty());
    let combo = c.get(&format!(
        "{PODS}?labelSelector=role%3Dexecutor&fieldSelector=metadata.name!%3Da-1,spec.nodeName%3D"
    ));
    assert_eq!(names(&combo.body), ["b-1"]);
    let unsupported = c.get(&format!("{PODS}?fieldSelector=foo%3Dbar"));
    assert_eq!(unsupported.status, 400);
    assert_eq!(
        unsupported.body["message"],
        "field label not supported: foo"
    );
    let all_ns = c.get("/api/v1/pods?labelSelector=app%3Db");
    assert_eq!(names(&all_ns.body), ["b-1"]);
}

#[test]
fn pagination_serves_a_consistent_snapshot() {
    let (_server, c) = started(|o| o.max_page = Some(4));
    for i in 0..23 {
        let labels = json!({"parity": if i % 2 == 0 { "even" } else { "odd" }});
        assert_eq!(
            c.call("POST", PODS, Some(&pod(&format!("p-{i:02}"), labels)))
                .status,
            201
        );
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut rv = None;
    let mut pages = 0;
    loop {
        let q = match &token {
            Some(t) => format!("{PODS}?limit=5&continue={t}"),
            None => format!("{PODS}?limit=5"),
        };
        let r = c.get(&q);
        assert_eq!(r.status, 200, "{}", r.body);
        let page = names(&r.body);
        assert!(page.len() <= 4, "max_page caps the page");
        if pages == 0 {
            // Changes after the first page do not show up in later pages.
            assert_eq!(
                c.call("POST", PODS, Some(&pod("p-99", json!({})))).status,
                201
            );
            assert_eq!(
                c.call("DELETE", &format!("{PODS}/p-20?gracePeriodSeconds=0"), None)
                    .status,
                200
            );
            assert_eq!(r.body["metadata"]["remainingItemCount"], 19);
        }
        let this_rv = r.body["metadata"]["resourceVersion"].clone();
        assert_eq!(*rv.get_or_insert(this_rv.clone()), this_rv);
        seen.extend(page);
        pages += 1;
        match r.body["metadata"].get("continue").and_then(Value::as_str) {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    let expect: Vec<String> = (0..23).map(|i| format!("p-{i:02}")).collect();
    assert_eq!(seen, expect);
    assert_eq!(pages, 6);

    // With a selector a page can come back short, yet every match arrives once.
    let mut odd = BTreeSet::new();
    let mut token: Option<String> = None;
    loop {
        let mut q = format!("{PODS}?labelSelector=parity%3Dodd&limit=3");
        if let Some(t) = &token {
            q.push_str(&format!("&continue={t}"));
        }
        let r = c.get(&q);
        assert!(r.body["metadata"].get("remainingItemCount").is_none());
        for n in names(&r.body) {
            assert!(odd.insert(n), "duplicate item");
        }
        match r.body["metadata"].get("continue").and_then(Value::as_str) {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    assert_eq!(odd.len(), 11);

    let bad = c.get(&format!("{PODS}?limit=2&continue=garbage!"));
    assert_eq!(bad.status, 400);
    assert!(bad.body["message"]
        .as_str()
        .unwrap()
        .starts_with("invalid continue token"));
}

#[test]
fn expired_continue_token_is_410_with_a_fresh_token() {
    let (_server, c) = started(|o| o.continue_ttl = Duration::from_millis(200));
    for i in 0..5 {
        c.call("POST", PODS, Some(&pod(&format!("p-{i}"), json!({}))));
    }
    let first = c.get(&format!("{PODS}?limit=2"));
    let token = first.body["metadata"]["continue"]
        .as_str()
        .unwrap()
        .to_string();
    std::thread::sleep(Duration::from_millis(400));
    let gone = c.get(&format!("{PODS}?limit=2&continue={token}"));
    assert_eq!(gone.status, 410);
    assert_eq!(gone.body["reason"], "Expired");
    assert!(gone.body["message"].as_str().unwrap().starts_with(
        "The provided continue parameter is too old to display a consistent list result."
    ));
    let fresh = gone.body["metadata"]["continue"].as_str().unwrap();
    let rest = c.get(&format!("{PODS}?limit=10&continue={fresh}"));
    assert_eq!(rest.status, 200);
    assert_eq!(names(&rest.body), ["p-2", "p-3", "p-4"]);
}

fn phase(c: &Client, name: &str) -> String {
    c.get(&format!("{PODS}/{name}")).body["status"]["phase"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[test]
fn pods_start_and_deletes_are_graceful_or_immediate() {
    // Latencies leave room for a loaded machine between a step and the check after it.
    let (server, c) = started(|o| {
        o.startup_latency = Duration::from_millis(400);
        o.stop_latency = Duration::from_millis(1000);
    });
    let t0 = Instant::now();
    c.call(
        "POST",
        PODS,
        Some(&pod("run-1", json!({"spark-app-selector": "app"}))),
    );
    assert_eq!(phase(&c, "run-1"), "Pending");
    wait_for("Running", || phase(&c, "run-1") == "Running");
    assert!(t0.elapsed() >= Duration::from_millis(450));
    let p = c.get(&format!("{PODS}/run-1")).body;
    assert!(p["spec"]["nodeName"]
        .as_str()
        .unwrap()
        .starts_with("sim-node-"));
    assert!(p["status"]["podIP"].is_string());
    assert!(p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].is_string());
    let running = c.get(&format!("{PODS}?fieldSelector=status.phase%3DRunning"));
    assert_eq!(names(&running.body), ["run-1"]);

    // Precondition mismatch: 409 Conflict, nothing deleted.
    let conflict = c.call(
        "DELETE",
        &format!("{PODS}/run-1"),
        Some(r#"{"preconditions":{"uid":"00000000-0000-4000-8000-000000000000"}}"#),
    );
    assert_eq!(conflict.status, 409);
    assert_eq!(conflict.body["reason"], "Conflict");
    assert!(conflict.body["message"]
        .as_str()
        .unwrap()
        .contains("the UID in the precondition (00000000-0000-4000-8000-000000000000) does not match the UID in record"));
    let stale_rv = c.call(
        "DELETE",
        &format!("{PODS}/run-1"),
        Some(r#"{"preconditions":{"resourceVersion":"1"}}"#),
    );
    assert_eq!(stale_rv.status, 409);

    // Graceful: the object stays, with deletionTimestamp, until the containers stop.
    let uid = p["metadata"]["uid"].as_str().unwrap();
    let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 20,
                      "preconditions": {"uid": uid}})
    .to_string();
    let del = c.call("DELETE", &format!("{PODS}/run-1"), Some(&body));
    assert_eq!(del.status, 200, "{}", del.body);
    assert_eq!(del.body["kind"], "Pod");
    assert_eq!(del.body["metadata"]["deletionGracePeriodSeconds"], 20);
    let ts = del.body["metadata"]["deletionTimestamp"].clone();
    assert!(ts.is_string());
    assert_eq!(server.stats().live_pods, 0);
    // A second delete with a longer grace period changes nothing.
    let again = c.call(
        "DELETE",
        &format!("{PODS}/run-1?gracePeriodSeconds=60"),
        None,
    );
    assert_eq!(again.body["metadata"]["deletionTimestamp"], ts);
    assert_eq!(again.body["metadata"]["deletionGracePeriodSeconds"], 20);
    assert_eq!(c.get(&format!("{PODS}/run-1")).status, 200);
    wait_for("terminal phase", || {
        phase(&c, "run-1") == "Failed" || c.get(&format!("{PODS}/run-1")).status == 404
    });
    wait_for("removal", || c.get(&format!("{PODS}/run-1")).status == 404);

    // Unscheduled: removed at once.
    c.call("POST", PODS, Some(&pod("quick", json!({}))));
    let del = c.call("DELETE", &format!("{PODS}/quick"), None);
    assert_eq!(del.status, 200);
    assert!(del.body["metadata"].get("deletionTimestamp").is_none());
    assert_eq!(c.get(&format!("{PODS}/quick")).status, 404);
    assert_eq!(c.call("DELETE", &format!("{PODS}/quick"), None).status, 404);

    // gracePeriodSeconds=0 on a running pod: removed at once.
    c.call("POST", PODS, Some(&pod("zero", json!({}))));
    wait_for("Running", || phase(&c, "zero") == "Running");
    assert_eq!(
        c.call("DELETE", &format!("{PODS}/zero?gracePeriodSeconds=0"), None)
            .status,
        200
    );
    assert_eq!(c.get(&format!("{PODS}/zero")).status, 404);

    let s = server.stats();
    // Every 200 counts, including the repeated delete of a terminating pod.
    assert_eq!(s.deletes, 4);
    assert_eq!(s.max_live_pods, 1);
    assert_eq!(s.live_pods, 0);
}

/// A pod with a finalizer, as kube-apiserver keeps it: deleted, it stays with
/// `deletionTimestamp` and `deletionGracePeriodSeconds: 0` (an unscheduled one at once, a
/// running one once the kubelet has stopped it, as Failed) until a patch removes the last
/// finalizer, which deletes it.
#[test]
fn a_finalizer_keeps_a_deleted_pod_until_a_patch_removes_it() {
    let (server, c) = started(|o| {
        o.startup_latency = Duration::from_millis(100);
        o.stop_latency = Duration::from_millis(200);
    });
    let held = |name: &str| {
        let mut p: Value = serde_json::from_str(&pod(name, json!({}))).unwrap();
        p["metadata"]["finalizers"] = json!(["podalloc.test/hold"]);
        p.to_string()
    };
    // Unscheduled (no node: the kubelet never sees it): kept at once.
    let (_s, quiet) = started(|o| o.nodes = 0);
    assert_eq!(quiet.call("POST", PODS, Some(&held("idle"))).status, 201);
    let del = quiet.call("DELETE", &format!("{PODS}/idle"), None);
    assert_eq!(del.status, 200, "{}", del.body);
    let kept = quiet.get(&format!("{PODS}/idle"));
    assert_eq!(kept.status, 200, "kept for its finalizer");
    assert!(kept.body["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(kept.body["metadata"]["deletionGracePeriodSeconds"], 0);

    // Running, deleted gracefully: the kubelet stops it, and the finalizer keeps it Failed.
    assert_eq!(c.call("POST", PODS, Some(&held("fin"))).status, 201);
    wait_for("Running", || phase(&c, "fin") == "Running");
    let del = c.call("DELETE", &format!("{PODS}/fin?gracePeriodSeconds=5"), None);
    assert_eq!(del.status, 200, "{}", del.body);
    assert_eq!(del.body["metadata"]["deletionGracePeriodSeconds"], 5);
    wait_for("stopped and held", || {
        let p = c.get(&format!("{PODS}/fin")).body;
        p["status"]["phase"] == "Failed" && p["metadata"]["deletionGracePeriodSeconds"] == 0
    });
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(c.get(&format!("{PODS}/fin")).status, 200, "still held");
    assert_eq!(server.stats().live_pods, 0);

    // Removing the last finalizer deletes it.
    let patch = json!({"metadata": {"finalizers": null}}).to_string();
    let out = c.call("PATCH", &format!("{PODS}/fin"), Some(&patch));
    assert_eq!(out.status, 200, "{}", out.body);
    assert_eq!(c.get(&format!("{PODS}/fin")).status, 404);

    // Grace 0 on a running pod with a finalizer: kept, and its containers stopped.
    assert_eq!(c.call("POST", PODS, Some(&held("now"))).status, 201);
    wait_for("Running", || phase(&c, "now") == "Running");
    let del = c.call("DELETE", &format!("{PODS}/now?gracePeriodSeconds=0"), None);
    assert_eq!(del.status, 200, "{}", del.body);
    wait_for("stopped and held", || phase(&c, "now") == "Failed");
    assert_eq!(c.get(&format!("{PODS}/now")).status, 200);
}

/// `GET …/pods?watch=true` is the verb `watch`, as kube-apiserver's RequestInfo says: a Role
/// without it is refused (403) while lists still work, and a fault rule names it.
#[test]
fn a_watch_is_its_own_verb() {
    let (_s, c) = started(|o| o.forbid = vec!["watch".into()]);
    assert_eq!(c.get(PODS).status, 200);
    let w = c.get(&format!("{PODS}?watch=true&timeoutSeconds=1"));
    assert_eq!(w.status, 403, "{}", w.body);
    assert!(
        w.body["message"]
            .as_str()
            .unwrap_or("")
            .contains("cannot watch"),
        "{}",
        w.body
    );
    let (_s, c) = started(|o| o.faults = faults(&["watch:503@always"]));
    assert_eq!(c.get(PODS).status, 200);
    assert_eq!(
        c.get(&format!("{PODS}?watch=1&timeoutSeconds=1")).status,
        503
    );
}

#[test]
fn sim_side_door_seeds_and_fails_pods() {
    let server = SimServer::start(SimOptions {
        tls: false,
        ..fast_opts()
    })
    .unwrap();
    assert!(server.url().starts_with("http://"));
    assert!(server.ca_pem().is_none());
    let c = Client::new(&server, Some(TOKEN));
    let driver = r#"{"metadata":{"name":"driver","labels":{"spark-role":"driver"}},
                     "spec":{"containers":[{"name":"d","image":"spark"}]},"status":{"phase":"Running"}}"#;
    let seeded = c.call("POST", "/sim/pods/spark", Some(driver));
    assert_eq!(seeded.status, 201, "{}", seeded.body);
    assert_eq!(seeded.body["status"]["phase"], "Running");
    let driver_uid = seeded.body["metadata"]["uid"].as_str().unwrap().to_string();

    let owned = json!({"metadata": {"name": "exec-1", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "driver", "uid": driver_uid, "controller": true}]},
        "spec": {"containers": [{"name": "e", "image": "spark"}]}})
    .to_string();
    assert_eq!(c.call("POST", PODS, Some(&owned)).status, 201);
    wait_for("Running", || phase(&c, "exec-1") == "Running");

    let failed = c.call(
        "POST",
        "/sim/pods/spark/exec-1/phase",
        Some(r#"{"phase":"Failed","exitCode":137,"reason":"OOMKilled"}"#),
    );
    assert_eq!(failed.status, 200);
    assert_eq!(failed.body["status"]["phase"], "Failed");
    let term = &failed.body["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (term["exitCode"].as_i64(), term["reason"].as_str()),
        (Some(137), Some("OOMKilled"))
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(phase(&c, "exec-1"), "Failed", "a forced phase sticks");
    assert_eq!(phase(&c, "driver"), "Running", "a seeded phase sticks");

    // Garbage collection: deleting the driver takes its executors with it.
    c.call(
        "POST",
        "/sim/pods/spark/exec-1/phase",
        Some(r#"{"phase":"Running"}"#),
    );
    assert_eq!(
        c.call(
            "DELETE",
            &format!("{PODS}/driver?gracePeriodSeconds=0"),
            None
        )
        .status,
        200
    );
    wait_for("garbage collection", || {
        c.get(&format!("{PODS}/exec-1")).status == 404
    });

    let stats = c.get("/sim/stats").body;
    assert_eq!(stats["creates"], 1);
    assert!(stats["requests"].as_u64().unwrap() > 0);
    assert_eq!(
        c.call(
            "POST",
            "/sim/pods/spark/nope/phase",
            Some(r#"{"phase":"Failed"}"#)
        )
        .status,
        404
    );
    assert_eq!(
        c.call(
            "POST",
            "/sim/pods/spark/driver/phase",
            Some(r#"{"phase":"Gone"}"#)
        )
        .status,
        400
    );
}

/// The shape of a seeded pod (keys of metadata and status, phase, container state), for
/// comparing pods seeded one way and the other.
fn seeded_shape(p: &Value) -> (Vec<String>, Vec<String>, Value, Value) {
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    (
        keys(&p["metadata"]),
        keys(&p["status"]),
        p["status"]["phase"].clone(),
        p["status"]["containerStatuses"][0]["state"]
            .as_object()
            .map(|o| json!(o.keys().collect::<Vec<_>>()))
            .unwrap_or_default(),
    )
}

#[test]
fn sim_side_door_seeds_a_pod_list_in_one_request() {
    let server = SimServer::start(fast_opts()).unwrap();
    let c = Client::new(&server, Some(TOKEN));
    let running = |name: &str| {
        json!({"metadata": {"name": name, "labels": {"spark-role": "executor"}},
               "spec": {"containers": [{"name": "e", "image": "spark"}]},
               "status": {"phase": "Running"}})
    };
    let single = c.call("POST", "/sim/pods/spark", Some(&running("one").to_string()));
    assert_eq!(single.status, 201, "{}", single.body);

    let mut items: Vec<Value> = (1..=300).map(|i| running(&format!("bulk-{i}"))).collect();
    items.push(json!({"metadata": {"name": "fresh"},
                      "spec": {"containers": [{"name": "e", "image": "spark"}]}}));
    let list = json!({"apiVersion": "v1", "kind": "PodList", "items": items}).to_string();
    let r = c.call("POST", "/sim/pods/spark", Some(&list));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["kind"], "PodList");
    let got = r.body["items"].as_array().unwrap();
    assert_eq!(got.len(), 301);
    // Server-set fields as for a pod created through the API: distinct uids, increasing
    // resourceVersions, a creationTimestamp; the list's resourceVersion is the last one.
    let uids: BTreeSet<&str> = got
        .iter()
        .map(|p| p["metadata"]["uid"].as_str().unwrap())
        .collect();
    assert_eq!(uids.len(), 301);
    let rvs: Vec<u64> = got.iter().map(rv_of).collect();
    assert!(rvs.windows(2).all(|w| w[0] < w[1]), "{rvs:?}");
    assert_eq!(
        r.body["metadata"]["resourceVersion"],
        json!(rvs[300].to_string())
    );
    assert!(got[0]["metadata"]["creationTimestamp"].is_string());
    // The kubelet model's status, the same shape as a pod seeded alone.
    assert_eq!(seeded_shape(&got[0]), seeded_shape(&single.body));
    assert_eq!(got[0]["status"]["phase"], "Running");
    assert!(got[0]["status"]["podIP"].is_string());
    assert_eq!(
        got[0]["status"]["containerStatuses"][0]["ready"],
        json!(true)
    );
    // A pod seeded without a phase is left to the scheduler and kubelet.
    assert_eq!(got[300]["status"]["phase"], "Pending");
    wait_for("the unpinned pod to start", || {
        phase(&c, "fresh") == "Running"
    });
    // The API lists what was seeded, as stored; seeding is not counted as API requests.
    let listed = c.get(&format!("{PODS}/bulk-7")).body;
    assert_eq!(listed["metadata"]["uid"], got[6]["metadata"]["uid"]);
    assert_eq!(listed["status"], got[6]["status"]);
    let stats = c.get("/sim/stats").body;
    assert_eq!(
        (stats["creates"].as_u64(), stats["live_pods"].as_u64()),
        (Some(0), Some(302))
    );

    // The first failing item stops the seeding and is named; the items before it stay.
    let clash = json!({"kind": "PodList", "items": [running("after-1"), running("bulk-2"),
                                                     running("after-3")]})
    .to_string();
    let r = c.call("POST", "/sim/pods/spark", Some(&clash));
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.body["reason"], "AlreadyExists");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .starts_with("items[1]: "),
        "{}",
        r.body
    );
    assert_eq!(c.get(&format!("{PODS}/after-1")).status, 200);
    assert_eq!(c.get(&format!("{PODS}/after-3")).status, 404);
    let bad = c.call(
        "POST",
        "/sim/pods/spark",
        Some(r#"{"kind":"PodList","items":{}}"#),
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    let invalid = json!({"kind": "PodList", "items": [{"metadata": {"name": "no-spec"}}]});
    let r = c.call("POST", "/sim/pods/spark", Some(&invalid.to_string()));
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body["message"]
        .as_str()
        .unwrap()
        .starts_with("items[0]: "));
}

#[test]
fn large_lists_are_gzipped_and_stop_wait_work() {
    let server = SimServer::start(SimOptions {
        schedule_latency: Duration::from_secs(3600),
        tls: false,
        ..fast_opts()
    })
    .unwrap();
    {
        let mut store = server.shared.store.lock().unwrap();
        let now = Instant::now();
        for i in 0..400 {
            let v: Value =
                serde_json::from_str(&pod(&format!("big-{i:04}"), json!({"k": "v"}))).unwrap();
            store
                .create("spark", v, super::store::CreateMode::Api, false, now)
                .unwrap();
        }
    }
    // ureq decodes gzip and drops the header, so look at the raw response first.
    use std::io::{Read, Write};
    let addr = server.url().trim_start_matches("http://").to_string();
    let raw = |accept: &str, path: &str| -> (String, Vec<u8>) {
        let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
        write!(tcp, "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n{accept}Connection: close\r\n\r\n").unwrap();
        let mut out = Vec::new();
        tcp.read_to_end(&mut out).unwrap();
        let i = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        (
            String::from_utf8_lossy(&out[..i]).into_owned(),
            out[i + 4..].to_vec(),
        )
    };
    let (head, _) = raw("Accept-Encoding: gzip\r\n", PODS);
    assert!(head.contains("Content-Encoding: gzip"), "{head}");
    assert!(head.contains("Vary: Accept-Encoding"));
    assert!(head.contains("Transfer-Encoding: chunked"));
    let (head, _) = raw("", PODS);
    assert!(!head.contains("gzip"), "{head}");
    let (head, body) = raw("Accept-Encoding: gzip\r\n", &format!("{PODS}/big-0001"));
    assert!(
        !head.contains("gzip") && head.contains("Content-Length"),
        "{head}"
    );
    assert!(
        body.starts_with(br#"{"kind":"Pod","apiVersion":"v1","metadata""#),
        "{}",
        String::from_utf8_lossy(&body)
    );

    let c = Client::new(&server, Some(TOKEN));
    let r = c.get(PODS);
    assert_eq!(r.status, 200);
    assert_eq!(names(&r.body).len(), 400);
    assert_eq!(r.headers.get("content-type").unwrap(), "application/json");

    let handle = server.stop_handle();
    assert!(!server.wait_timeout(Duration::from_millis(10)));
    let t = std::thread::spawn(move || handle.stop());
    server.wait();
    t.join().unwrap();
    server.stop();
}

#[test]
fn client_certificates_can_be_required() {
    let pki = super::tls::Pki::generate(&[]).unwrap();
    let cfg = pki
        .server_config(Some(&[pki.ca_der().clone()]), false)
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let serve = std::thread::spawn(move || {
        for _ in 0..2 {
            let (tcp, _) = listener.accept().unwrap();
            let conn = rustls::ServerConnection::new(cfg.clone()).unwrap();
            let mut s = rustls::StreamOwned::new(conn, tcp);
            let mut c = super::http::Conn::new(&mut s);
            if let Ok(Some(_)) = c.read_request() {
                let _ = super::http::write_response(
                    &mut c.stream,
                    super::http::Response::text(200, "ok"),
                    false,
                    false,
                );
            }
        }
    });
    let ca = Certificate::from_pem(pki.ca_pem.as_bytes()).unwrap();
    let (crt, key) = pki.issue_client_cert("podalloc").unwrap();
    let agent = |client: Option<ClientCert>| {
        ureq::Agent::config_builder()
            .tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::new_with_certs(std::slice::from_ref(&ca)))
                    .client_cert(client)
                    .build(),
            )
            .build()
            .new_agent()
    };
    let url = format!("https://127.0.0.1:{port}/healthz");
    assert!(agent(None).get(&url).call().is_err());
    let cert = ClientCert::new_with_certs(
        &[Certificate::from_pem(crt.as_bytes()).unwrap()],
        PrivateKey::from_pem(key.as_bytes()).unwrap(),
    );
    assert_eq!(agent(Some(cert)).get(&url).call().unwrap().status(), 200);
    serve.join().unwrap();
}

#[test]
fn ca_out_is_written_and_bad_input_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    let server = SimServer::start(SimOptions {
        ca_out: Some(ca.clone()),
        ..fast_opts()
    })
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(&ca).unwrap(),
        server.ca_pem().unwrap()
    );
    assert!(SimServer::start(SimOptions {
        failure_rate: 2.0,
        ..SimOptions::default()
    })
    .is_err());

    // Raw garbage over TLS: a 400 and the connection closes; the server keeps serving.
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(server.ca_pem().unwrap().as_bytes())
    {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let port: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
    let send = |raw: &[u8]| -> String {
        let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let conn = rustls::ClientConnection::new(
            std::sync::Arc::new(cfg.clone()),
            "127.0.0.1".try_into().unwrap(),
        )
        .unwrap();
        let mut s = rustls::StreamOwned::new(conn, tcp);
        s.write_all(raw).unwrap();
        s.flush().unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    assert!(send(b"\x00\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let r = send(
        format!("GET /api/v1/namespaces/a%zz/pods HTTP/1.1\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    );
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    let r = send(format!("POST {PODS} HTTP/1.1\r\n{auth}Content-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}").as_bytes());
    assert!(r.starts_with("HTTP/1.1 415"), "{r}");
    let r =
        send(format!("POST {PODS} HTTP/1.1\r\n{auth}Content-Length: 99999999\r\n\r\n").as_bytes());
    assert!(
        r.starts_with("HTTP/1.1 413") && r.contains("RequestEntityTooLarge"),
        "{r}"
    );
    let c = Client::new(&server, Some(TOKEN));
    assert_eq!(c.get(PODS).status, 200);
}

/// 50,000 pods of about 5 KB each, listed in one call. Run with
/// `cargo test --release -- --ignored big_list --nocapture`.
#[test]
#[ignore = "benchmark-sized; run explicitly in release mode"]
fn big_list_of_50k_pods() {
    let server = SimServer::start(SimOptions {
        schedule_latency: Duration::from_secs(3600),
        ..fast_opts()
    })
    .unwrap();
    let filler = "x".repeat(4300);
    let t = Instant::now();
    {
        let mut store = server.shared.store.lock().unwrap();
        let now = Instant::now();
        for i in 0..50_000 {
            let v = json!({"metadata": {"name": format!("exec-{i:05}"),
                                         "labels": {"spark-app-selector": "app-1", "spark-role": "executor"},
                                         "annotations": {"filler": filler}},
                           "spec": {"restartPolicy": "Never", "containers": [{"name": "e", "image": "spark:3.5"}]}});
            store
                .create("spark", v, super::store::CreateMode::Api, false, now)
                .unwrap();
        }
    }
    eprintln!("seeded 50k pods in {:?}", t.elapsed());
    let c = Client::new(&server, Some(TOKEN));
    for q in [
        "",
        "?labelSelector=spark-app-selector%3Dapp-1,spark-role%3Dexecutor",
    ] {
        for gzip in [true, false] {
            let t = Instant::now();
            let mut req = c
                .agent
                .get(format!("{}{PODS}{q}", c.base))
                .header("Authorization", format!("Bearer {TOKEN}"));
            if !gzip {
                req = req.header("Accept-Encoding", "identity");
            }
            let mut resp = req.call().unwrap();
            let body = whole_body(&mut resp).read_to_vec().unwrap();
            let took = t.elapsed();
            let list: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(list["items"].as_array().unwrap().len(), 50_000);
            eprintln!(
                "listed 50k pods ({} MB, gzip {gzip}, selector {}) in {took:?}",
                body.len() >> 20,
                !q.is_empty()
            );
        }
    }
    let t = Instant::now();
    let mut token: Option<String> = None;
    let mut n = 0;
    loop {
        let mut q = format!("{PODS}?limit=500");
        if let Some(tk) = &token {
            q.push_str(&format!("&continue={tk}"));
        }
        let r = c.get(&q);
        n += r.body["items"].as_array().unwrap().len();
        match r.body["metadata"].get("continue").and_then(Value::as_str) {
            Some(tk) => token = Some(tk.to_string()),
            None => break,
        }
    }
    assert_eq!(n, 50_000);
    eprintln!("paged through 50k pods (limit 500) in {:?}", t.elapsed());
}

fn faults(rules: &[&str]) -> Vec<super::FaultRule> {
    rules
        .iter()
        .map(|r| super::FaultRule::parse(r).unwrap())
        .collect()
}

fn header<'a>(r: &'a Reply, name: &str) -> Option<&'a str> {
    r.headers.get(name).and_then(|v| v.to_str().ok())
}

/// A server whose requests fail by the fault `rules`, a client, and the path of the pod
/// exec-1, created.
fn pod_exec_1_behind_faults(rules: &[&str]) -> (SimServer, Client, String) {
    let (server, c) = started(|o| o.faults = faults(rules));
    assert_eq!(
        c.call("POST", PODS, Some(&pod("exec-1", json!({})))).status,
        201
    );
    (server, c, format!("{PODS}/exec-1"))
}

/// With the faults of `rules` (all on gets) spent, a get of `path` has the real answer, and
/// each rule (its `VERB:FAULT`) was injected once, no other.
fn each_fault_injected_once(server: &SimServer, c: &Client, path: &str, rules: &[&str]) {
    assert_eq!(c.get(path).status, 200);
    let s = server.stats();
    for rule in rules {
        let k = rule.split_once('@').unwrap().0;
        assert_eq!(s.faults_injected.get(k), Some(&1), "{k}: {s:?}");
    }
    assert_eq!(s.faults_injected.len(), rules.len());
}

/// Injected 429s are kube-apiserver's: the flow-control text and the storage Status.
#[test]
fn injected_429s_have_the_real_shapes() {
    let rules = ["get:429-text@1", "get:429-status:3@2"];
    let (server, c, path) = pod_exec_1_behind_faults(&rules);

    let r = c.get(&path);
    assert_eq!(r.status, 429);
    assert_eq!(
        r.body,
        Value::String("Too many requests, please try again later.\n".into())
    );
    assert_eq!(header(&r, "retry-after"), Some("1"));
    assert_eq!(
        header(&r, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert!(header(&r, "x-kubernetes-pf-flowschema-uid").is_some());

    let r = c.get(&path);
    assert_eq!(r.status, 429);
    assert_eq!(header(&r, "retry-after"), Some("3"));
    assert_eq!(
        r.body,
        failure(
            429,
            "TooManyRequests",
            "storage is (re)initializing",
            Some(json!({"retryAfterSeconds":3}))
        )
    );

    // Third get: no rule, the real answer.
    each_fault_injected_once(&server, &c, &path, &rules);
}

/// Injected 500, 503 and 504 answers are kube-apiserver's, body and headers.
#[test]
fn injected_server_errors_have_the_real_shapes() {
    let rules = ["get:500@1", "get:503@2", "get:504@3"];
    let (server, c, path) = pod_exec_1_behind_faults(&rules);

    let r = c.get(&path);
    assert_eq!(r.status, 500);
    assert_eq!(
        r.body,
        failure(
            500,
            "InternalError",
            "Internal error occurred: etcdserver: leader changed",
            Some(json!({"causes":[{"message":"etcdserver: leader changed"}]}))
        )
    );

    let r = c.get(&path);
    assert_eq!(r.status, 503);
    assert_eq!(header(&r, "retry-after"), Some("1"));
    assert_eq!(r.body["reason"], "ServiceUnavailable");
    assert_eq!(r.body["message"], "apiserver is shutting down");

    let r = c.get(&path);
    assert_eq!(r.status, 504);
    assert_eq!(
        header(&r, "content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(
        r.body,
        json!({"metadata":{},"status":"Failure",
               "message":"Timeout: request did not complete within the allotted timeout",
               "reason":"Timeout","details":{},"code":504})
    );

    // Fourth get: no rule, the real answer.
    each_fault_injected_once(&server, &c, &path, &rules);
}

#[test]
fn writes_can_happen_although_the_client_sees_a_failure() {
    let server = SimServer::start(SimOptions {
        faults: faults(&[
            "create:504-after-write@1",
            "create:lost-response@2",
            "create:truncate@3",
            "create:reset@4",
            "create:500@5",
            "delete:lost-response@1",
        ]),
        // Never scheduled: the delete of p-6 is immediate however slow the machine is (a
        // scheduled pod would be deleted gracefully and still be there).
        schedule_latency: Duration::from_secs(3600),
        ..fast_opts()
    })
    .unwrap();
    let c = Client::new(&server, Some(TOKEN));
    let create = |name: &str| c.try_call("POST", PODS, Some(&pod(name, json!({}))));

    let r = create("p-1").unwrap();
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (504, Some("Timeout"))
    );
    assert!(create("p-2").is_err(), "lost response");
    let e = create("p-3").err().expect("truncated body");
    assert!(e.contains("reading the body"), "{e}");
    assert!(create("p-4").is_err(), "reset");
    assert_eq!(create("p-5").unwrap().status, 500);
    assert_eq!(create("p-6").unwrap().status, 201);

    for (name, exists) in [
        ("p-1", true),
        ("p-2", true),
        ("p-3", true),
        ("p-4", false),
        ("p-5", false),
        ("p-6", true),
    ] {
        let status = c.get(&format!("{PODS}/{name}")).status;
        assert_eq!(status == 200, exists, "{name}: {status}");
    }
    // A retried create of a pod that was in fact created: 409.
    assert_eq!(create("p-2").unwrap().status, 409);

    // Deleted, but the answer was lost.
    assert!(c.try_call("DELETE", &format!("{PODS}/p-6"), None).is_err());
    assert_eq!(c.get(&format!("{PODS}/p-6")).status, 404);

    let s = server.stats();
    assert_eq!(s.creates, 4);
    assert_eq!(s.deletes, 1);
    assert_eq!(s.faults_injected.get("create:lost-response"), Some(&1));
    assert_eq!(s.faults_injected.get("create:reset"), Some(&1));
    assert_eq!(s.faults_injected.get("delete:lost-response"), Some(&1));

    // The log shows what the client could not: the status of lost responses is null.
    let log: Vec<Value> = server
        .request_log()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let lost = log
        .iter()
        .find(|l| l["fault"] == "lost-response" && l["verb"] == "create")
        .unwrap();
    assert_eq!(lost["status"], Value::Null);
    assert_eq!(lost["method"], "POST");
    assert_eq!(lost["path"], PODS);
    let truncated = log.iter().find(|l| l["fault"] == "truncate").unwrap();
    assert_eq!(truncated["status"], 201);
}

#[test]
fn delays_latency_and_client_timeouts() {
    let server = SimServer::start(SimOptions {
        latency: Duration::from_millis(150),
        faults: faults(&["list:delay:1500@1"]),
        ..fast_opts()
    })
    .unwrap();
    let impatient = Client::build(&server, Some(TOKEN), None, Duration::from_millis(700));
    let t = Instant::now();
    assert!(impatient.try_call("GET", PODS, None).is_err(), "timed out");
    assert!(t.elapsed() < Duration::from_millis(1400));
    let c = Client::new(&server, Some(TOKEN));
    let t = Instant::now();
    assert_eq!(c.get(PODS).status, 200);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_millis(1400),
        "{took:?}"
    );
    // No latency outside /api.
    let t = Instant::now();
    assert_eq!(c.get("/healthz").status, 200);
    assert!(t.elapsed() < Duration::from_millis(150));
    assert_eq!(
        server.stats().faults_injected.get("list:delay:1500"),
        Some(&1)
    );
}

#[test]
fn list_pages_can_be_expired_by_a_fault() {
    let server = SimServer::start(fast_opts()).unwrap();
    let c = Client::new(&server, Some(TOKEN));
    for i in 0..5 {
        c.call("POST", PODS, Some(&pod(&format!("p-{i}"), json!({}))));
    }
    // Rules can change while the server runs; counting restarts with each new set.
    let set = c.call("POST", "/sim/faults", Some(r#"["list:410@always"]"#));
    assert_eq!(set.status, 200, "{}", set.body);
    assert_eq!(set.body["faults"], json!(["list:410@always"]));
    let first = c.get(&format!("{PODS}?limit=2"));
    assert_eq!(first.status, 200, "a first page has no token to expire");
    let token = first.body["metadata"]["continue"].as_str().unwrap();
    let gone = c.get(&format!("{PODS}?limit=2&continue={token}"));
    assert_eq!(gone.status, 410);
    assert_eq!(gone.body["reason"], "Expired");
    assert_eq!(gone.body["code"], 410);
    assert!(gone.body["message"].as_str().unwrap().starts_with(
        "The provided continue parameter is too old to display a consistent list result."
    ));
    let fresh = gone.body["metadata"]["continue"].as_str().unwrap();
    server.set_faults(Vec::new());
    assert!(server.faults().is_empty());
    let rest = c.get(&format!("{PODS}?limit=10&continue={fresh}"));
    assert_eq!(names(&rest.body), ["p-2", "p-3", "p-4"]);

    let bad = c.call("POST", "/sim/faults", Some(r#"["create:teapot"]"#));
    assert_eq!(bad.status, 400);
    assert!(bad.body["message"]
        .as_str()
        .unwrap()
        .starts_with("fault rule \"create:teapot\": unknown fault \"teapot\""));
    let listed = c.get("/sim/faults");
    assert_eq!(listed.body["faults"], json!([]));
    assert_eq!(listed.body["injected"]["list:410"], 1);
    assert!(server
        .try_set_faults(vec![super::FaultRule {
            verb: "get".into(),
            fault: super::Fault::Expired,
            when: super::When::Always,
        }])
        .is_err());
    // Pods serve no update (PUT), so no rule may name it.
    assert!(SimServer::start(SimOptions {
        faults: vec![super::FaultRule {
            verb: "update".into(),
            fault: super::Fault::Reset,
            when: super::When::Always,
        }],
        ..fast_opts()
    })
    .is_err());
}

#[test]
fn probabilistic_faults_follow_the_seed() {
    let run = |seed: u64| {
        let server = SimServer::start(SimOptions {
            tls: false,
            seed,
            faults: faults(&["get:503@p=0.3"]),
            ..fast_opts()
        })
        .unwrap();
        let c = Client::new(&server, Some(TOKEN));
        (0..60)
            .map(|_| c.get(&format!("{PODS}/none")).status)
            .collect::<Vec<u16>>()
    };
    let a = run(11);
    assert_eq!(a, run(11));
    let hits = a.iter().filter(|s| **s == 503).count();
    assert!((5..=35).contains(&hits), "{hits}");
    assert!(a.iter().all(|s| *s == 503 || *s == 404));
}

#[test]
fn pod_quota_is_enforced_like_the_admission_plugin() {
    let (server, c) = started(|o| o.pod_quota = Some(2));
    for n in ["q-1", "q-2"] {
        assert_eq!(c.call("POST", PODS, Some(&pod(n, json!({})))).status, 201);
    }
    let over = c.call("POST", PODS, Some(&pod("q-3", json!({}))));
    assert_eq!(over.status, 403);
    assert_eq!(
        over.body,
        failure(403, "Forbidden", "pods \"q-3\" is forbidden: exceeded quota: sim-quota, requested: pods=1, used: pods=2, limited: pods=2", Some(json!({"name":"q-3","kind":"pods"})))
    );
    // A generated name appears in the message; validation still comes first.
    let gen = c.call("POST", PODS, Some(r#"{"metadata":{"generateName":"exec-"},"spec":{"containers":[{"name":"a","image":"b"}]}}"#));
    assert_eq!(gen.status, 403);
    let gname = gen.body["details"]["name"].as_str().unwrap();
    assert!(gname.starts_with("exec-") && gname.len() == 10, "{gname}");
    assert_eq!(
        c.call("POST", PODS, Some(r#"{"metadata":{"name":"x"},"spec":{}}"#))
            .status,
        422
    );
    // Each namespace has its own quota.
    assert_eq!(
        c.call(
            "POST",
            "/api/v1/namespaces/other/pods",
            Some(&pod("q-1", json!({})))
        )
        .status,
        201
    );
    // A Failed pod no longer counts.
    c.call(
        "POST",
        "/sim/pods/spark/q-1/phase",
        Some(r#"{"phase":"Failed"}"#),
    );
    assert_eq!(
        c.call("POST", PODS, Some(&pod("q-3", json!({})))).status,
        201
    );
    assert_eq!(
        c.call("POST", PODS, Some(&pod("q-4", json!({})))).status,
        403
    );
    // Lifted at runtime.
    let lifted = c.call("POST", "/sim/quota", Some(r#"{"pods":null}"#));
    assert_eq!(lifted.body, json!({"pods": null}));
    assert_eq!(
        c.call("POST", PODS, Some(&pod("q-4", json!({})))).status,
        201
    );
    server.set_pod_quota(Some(1));
    assert_eq!(c.get("/sim/quota").body, json!({"pods": 1}));
    assert_eq!(
        c.call("POST", PODS, Some(&pod("q-5", json!({})))).status,
        403
    );
    assert_eq!(
        c.call("POST", "/sim/quota", Some(r#"{"pods":"ten"}"#))
            .status,
        400
    );
    assert_eq!(server.stats().quota_rejections, 4);
}

#[test]
fn forbidden_verbs_get_the_rbac_message() {
    let (server, c) =
        started(|o| o.forbid = vec!["create".into(), "get".into(), "cm-update".into()]);
    let r = c.call("POST", PODS, Some(&pod("x", json!({}))));
    assert_eq!(r.status, 403);
    assert_eq!(
        r.body,
        failure(403, "Forbidden", "pods is forbidden: User \"system:serviceaccount:default:podalloc\" cannot create resource \"pods\" in API group \"\" in the namespace \"spark\"", Some(json!({"kind":"pods"})))
    );
    let r = c.get(&format!("{PODS}/x"));
    assert_eq!(r.status, 403);
    assert_eq!(
        r.body["message"],
        "pods \"x\" is forbidden: User \"system:serviceaccount:default:podalloc\" cannot get resource \"pods\" in API group \"\" in the namespace \"spark\""
    );
    assert_eq!(r.body["details"], json!({"name": "x", "kind": "pods"}));
    assert_eq!(c.get(PODS).status, 200);
    // Authentication comes first.
    assert_eq!(
        Client::new(&server, None).get(&format!("{PODS}/x")).status,
        401
    );
    let cm = "/api/v1/namespaces/spark/configmaps";
    assert_eq!(
        c.call("POST", cm, Some(r#"{"metadata":{"name":"state"}}"#))
            .status,
        201
    );
    let r = c.call(
        "PUT",
        &format!("{cm}/state"),
        Some(r#"{"metadata":{"name":"state"}}"#),
    );
    assert_eq!(r.status, 403);
    assert_eq!(
        r.body["message"],
        "configmaps \"state\" is forbidden: User \"system:serviceaccount:default:podalloc\" cannot update resource \"configmaps\" in API group \"\" in the namespace \"spark\""
    );

    let cluster = SimServer::start(SimOptions {
        forbid: vec!["list".into()],
        ..fast_opts()
    })
    .unwrap();
    let r = Client::new(&cluster, Some(TOKEN)).get("/api/v1/pods");
    assert_eq!(
        r.body["message"],
        "pods is forbidden: User \"system:serviceaccount:default:podalloc\" cannot list resource \"pods\" in API group \"\" at the cluster scope"
    );
    assert!(SimServer::start(SimOptions {
        forbid: vec!["proxy".into()],
        ..fast_opts()
    })
    .is_err());
}

#[test]
fn executor_id_stats_catch_duplicates_and_reuse() {
    let server = SimServer::start(fast_opts()).unwrap();
    let c = Client::new(&server, Some(TOKEN));
    let exec = |name: &str, app: &str, id: &str| {
        c.call(
            "POST",
            PODS,
            Some(&pod(
                name,
                json!({"spark-app-selector": app, "spark-exec-id": id}),
            )),
        )
        .status
    };
    assert_eq!(exec("a-1", "app-a", "1"), 201);
    assert_eq!(exec("a-2", "app-a", "2"), 201);
    assert_eq!(exec("b-1", "app-b", "1"), 201, "same id, other app");
    assert_eq!(
        exec("a-2", "app-a", "3"),
        409,
        "failed creates do not count"
    );
    assert_eq!(
        c.call("DELETE", &format!("{PODS}/a-1?gracePeriodSeconds=0"), None)
            .status,
        200
    );
    assert_eq!(
        exec("a-1-again", "app-a", "1"),
        201,
        "reused after deletion"
    );
    assert_eq!(exec("a-dup", "app-a", "2"), 201, "duplicate of a live pod");
    // A seeded pod's id counts as used.
    let seeded = pod(
        "a-9",
        json!({"spark-app-selector": "app-a", "spark-exec-id": "9"}),
    );
    assert_eq!(c.call("POST", "/sim/pods/spark", Some(&seeded)).status, 201);
    assert_eq!(exec("a-9b", "app-a", "9"), 201);
    assert_eq!(exec("plain", "app-a", "x"), 201, "non-numeric id");
    let s = server.stats();
    assert_eq!(s.duplicate_executor_ids, 3);
    assert_eq!(
        s.executor_ids_created.get("app-a"),
        Some(&vec![1, 2, 1, 2, 9])
    );
    assert_eq!(s.executor_ids_created.get("app-b"), Some(&vec![1]));
    assert_eq!(s.creates_by_app.get("app-a"), Some(&6));
    assert_eq!(s.creates_by_app.get("app-b"), Some(&1));
    let json_stats = c.get("/sim/stats").body;
    assert_eq!(json_stats["duplicate_executor_ids"], 3);
    assert_eq!(json_stats["executor_ids_created"]["app-b"], json!([1]));
}

#[test]
fn request_log_keeps_the_last_requests_without_secrets() {
    let (server, c) = started(|o| o.faults = faults(&["get:500@1"]));
    c.get(&format!("{PODS}/nope"));
    c.get(&format!("{PODS}?limit=5&access_token=hunter2"));
    Client::new(&server, Some("wrong-token")).get(PODS);
    let raw = c.get("/sim/log");
    assert_eq!(header(&raw, "content-type"), Some("application/x-ndjson"));
    let text = server.request_log();
    assert!(!text.contains(TOKEN) && !text.contains("hunter2") && !text.contains("wrong-token"));
    assert!(!text.to_ascii_lowercase().contains("authorization"));
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "/sim requests are not logged: {text}");
    assert_eq!(lines[0]["status"], 500);
    assert_eq!(lines[0]["fault"], "500");
    assert_eq!(lines[0]["verb"], "get");
    assert_eq!(
        lines[1]["query"],
        json!({"limit": "5", "access_token": "REDACTED"})
    );
    assert_eq!(lines[1]["status"], 200);
    assert_eq!(lines[2]["status"], 401);
    assert_eq!(lines[2]["verb"], Value::Null);
    for _ in 0..1100 {
        c.get("/healthz");
    }
    let text = server.request_log();
    assert_eq!(text.lines().count(), 1000);
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["seq"], 1103);
}

#[test]
fn request_log_names_the_pod_a_create_asked_for() {
    let server = SimServer::start(fast_opts()).unwrap();
    let c = Client::new(&server, Some(TOKEN));
    let created = c.call("POST", PODS, Some(&pod("app-exec-7", json!({"a": "b"}))));
    assert_eq!(created.status, 201, "{}", created.body);
    let again = c.call("POST", PODS, Some(&pod("app-exec-7", json!({"a": "b"}))));
    assert_eq!(again.status, 409);
    c.get(PODS);
    let lines: Vec<Value> = server
        .request_log()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(
        (lines[0]["verb"].as_str(), lines[0]["name"].as_str()),
        (Some("create"), Some("app-exec-7"))
    );
    assert_eq!(
        lines[1]["name"], "app-exec-7",
        "a refused create is named too"
    );
    assert_eq!(lines[2].get("name"), None, "only creates carry a name");
}

#[test]
fn mutual_tls_with_generated_client_certificates() {
    let server = SimServer::start(SimOptions {
        require_client_cert: true,
        forbid: vec!["delete".into()],
        ..fast_opts()
    })
    .unwrap();
    let (crt, key) = server.generate_client_cert("system:node:spark-driver");
    assert!(crt.starts_with("-----BEGIN CERTIFICATE-----"));
    let with_cert = Client::build(&server, None, Some((&crt, &key)), Duration::from_secs(60));
    assert_eq!(
        with_cert
            .call("POST", PODS, Some(&pod("m-1", json!({}))))
            .status,
        201,
        "a client certificate needs no token"
    );
    let denied = with_cert.call("DELETE", &format!("{PODS}/m-1"), None);
    assert_eq!(
        denied.body["message"],
        "pods \"m-1\" is forbidden: User \"system:node:spark-driver\" cannot delete resource \"pods\" in API group \"\" in the namespace \"spark\""
    );
    // Without a certificate the handshake fails, token or not.
    assert!(Client::new(&server, Some(TOKEN))
        .try_call("GET", PODS, None)
        .is_err());
    // A certificate from another CA is refused.
    let other = super::tls::Pki::generate(&[]).unwrap();
    let (ocrt, okey) = other.issue_client_cert("mallory").unwrap();
    let foreign = Client::build(&server, None, Some((&ocrt, &okey)), Duration::from_secs(60));
    assert!(foreign.try_call("GET", PODS, None).is_err());

    // client_ca: certificates of that CA only; optional: token clients still welcome.
    let optional = SimServer::start(SimOptions {
        client_ca: Some(other.ca_pem.clone()),
        client_cert_optional: true,
        ..fast_opts()
    })
    .unwrap();
    let with_other = Client::build(
        &optional,
        None,
        Some((&ocrt, &okey)),
        Duration::from_secs(60),
    );
    assert_eq!(with_other.get(PODS).status, 200);
    assert_eq!(Client::new(&optional, Some(TOKEN)).get(PODS).status, 200);
    assert_eq!(Client::new(&optional, None).get(PODS).status, 401);
    let (own_crt, own_key) = optional.generate_client_cert("x");
    let own = Client::build(
        &optional,
        None,
        Some((&own_crt, &own_key)),
        Duration::from_secs(60),
    );
    assert!(
        own.try_call("GET", PODS, None).is_err(),
        "not signed by client_ca"
    );

    for bad in [
        SimOptions {
            tls: false,
            require_client_cert: true,
            ..fast_opts()
        },
        SimOptions {
            client_ca: Some("not a pem".into()),
            ..fast_opts()
        },
    ] {
        assert!(SimServer::start(bad).is_err());
    }
}

const CMS: &str = "/api/v1/namespaces/spark/configmaps";

/// The ConfigMap `state` (label app=a, data epoch=1), created by `c`: the 201's body.
fn create_state_cm(c: &Client) -> Value {
    let created = c.call(
        "POST",
        CMS,
        Some(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"state","labels":{"app":"a"}},"data":{"epoch":"1"}}"#),
    );
    assert_eq!(created.status, 201, "{}", created.body);
    created.body
}

/// A server and client with two ConfigMaps: `state` (app=a) and `other` (app=b).
fn state_and_other_cms() -> (SimServer, Client) {
    let (server, c) = started(|_| {});
    create_state_cm(&c);
    c.call(
        "POST",
        CMS,
        Some(r#"{"metadata":{"name":"other","labels":{"app":"b"}}}"#),
    );
    (server, c)
}

/// A ConfigMap create answers 201 with the pods' resourceVersion counter, then get and 409 work.
#[test]
fn configmap_create_and_get_answer_as_kube_apiserver_does() {
    let (_server, c) = started(|_| {});
    let cm = &create_state_cm(&c);
    assert_eq!(
        (cm["kind"].as_str(), cm["apiVersion"].as_str()),
        (Some("ConfigMap"), Some("v1"))
    );
    assert_eq!(cm["metadata"]["namespace"], "spark");
    assert_eq!(cm["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert!(cm["metadata"]["creationTimestamp"].is_string());
    assert_eq!(cm["data"], json!({"epoch": "1"}));
    let rv1 = rv_of(cm);

    // The resource version is the pods' counter.
    let p = c.call("POST", PODS, Some(&pod("p", json!({}))));
    let pod_rv = rv_of(&p.body);
    assert!(pod_rv > rv1);

    let dup = c.call("POST", CMS, Some(r#"{"metadata":{"name":"state"}}"#));
    assert_eq!(
        dup.body,
        failure(
            409,
            "AlreadyExists",
            "configmaps \"state\" already exists",
            Some(json!({"name":"state","kind":"configmaps"}))
        )
    );
    let got = c.get(&format!("{CMS}/state"));
    assert_eq!(got.status, 200);
    assert_eq!(&got.body, cm);
    let missing = c.get(&format!("{CMS}/nope"));
    assert_eq!(
        missing.body,
        failure(
            404,
            "NotFound",
            "configmaps \"nope\" not found",
            Some(json!({"name":"nope","kind":"configmaps"}))
        )
    );
}

/// A ConfigMap update with a resourceVersion is conditional (409 when stale), without one blind.
#[test]
fn configmap_update_is_conditional_on_the_resource_version() {
    let (_server, c) = started(|_| {});
    let cm = &create_state_cm(&c);
    let p = c.call("POST", PODS, Some(&pod("p", json!({}))));
    let pod_rv = rv_of(&p.body);

    // Conditional update with the current resourceVersion.
    let put = |name: &str, body: &str| c.call("PUT", &format!("{CMS}/{name}"), Some(body));
    let mut next = c.get(&format!("{CMS}/state")).body;
    next["data"]["epoch"] = json!("2");
    let upd = put("state", &next.to_string());
    assert_eq!(upd.status, 200, "{}", upd.body);
    let rv2 = rv_of(&upd.body);
    assert!(rv2 > pod_rv);
    assert_eq!(upd.body["metadata"]["uid"], cm["metadata"]["uid"]);
    assert_eq!(
        upd.body["metadata"]["creationTimestamp"],
        cm["metadata"]["creationTimestamp"]
    );
    // The same stale body again: 409 Conflict.
    let stale = put("state", &next.to_string());
    assert_eq!(
        stale.body,
        failure(409, "Conflict", "Operation cannot be fulfilled on configmaps \"state\": the object has been modified; please apply your changes to the latest version and try again", Some(json!({"name":"state","kind":"configmaps"})))
    );
    // Without a resourceVersion: unconditional.
    let blind = put(
        "state",
        r#"{"metadata":{"name":"state","labels":{"app":"a"}},"data":{"epoch":"3"}}"#,
    );
    assert_eq!(blind.status, 200);
    assert_eq!(blind.body["data"]["epoch"], "3");
    let rv3 = blind.body["metadata"]["resourceVersion"].clone();
    // Writing the same content again changes nothing, not even the resourceVersion.
    let same = put("state", &blind.body.to_string());
    assert_eq!(same.body["metadata"]["resourceVersion"], rv3);
}

/// A ConfigMap update of another name answers 400, of a missing one 404, of its uid 422.
#[test]
fn configmap_updates_of_the_name_a_missing_one_or_the_uid_are_refused() {
    let (_server, c) = started(|_| {});
    create_state_cm(&c);
    let put = |name: &str, body: &str| c.call("PUT", &format!("{CMS}/{name}"), Some(body));
    let r = put("state", r#"{"metadata":{"name":"other"}}"#);
    assert_eq!(
        (r.status, r.body["message"].as_str()),
        (
            400,
            Some("the name of the object (other) does not match the name on the URL (state)")
        )
    );
    let r = put("nope", r#"{"metadata":{"name":"nope"}}"#);
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (404, Some("NotFound"))
    );
    let r = put(
        "state",
        r#"{"metadata":{"name":"state","uid":"00000000-0000-4000-8000-000000000000"}}"#,
    );
    assert_eq!(r.status, 422);
    assert!(r.body["message"].as_str().unwrap().contains(
        "metadata.uid: Invalid value: \"00000000-0000-4000-8000-000000000000\": field is immutable"
    ));
}

/// A ConfigMap list is a ConfigMapList, filtered by label and metadata.name selectors.
#[test]
fn configmaps_list_with_label_and_field_selectors() {
    let (_server, c) = state_and_other_cms();
    let all = c.get(CMS);
    assert_eq!(all.body["kind"], "ConfigMapList");
    assert_eq!(names(&all.body), ["other", "state"]);
    assert!(all.body["metadata"]["resourceVersion"].is_string());
    assert_eq!(
        names(&c.get(&format!("{CMS}?labelSelector=app%3Da")).body),
        ["state"]
    );
    assert_eq!(
        names(
            &c.get(&format!("{CMS}?fieldSelector=metadata.name%3Dother"))
                .body
        ),
        ["other"]
    );
    assert_eq!(
        c.get(&format!("{CMS}?fieldSelector=status.phase%3DX"))
            .status,
        400
    );
}

/// A ConfigMap delete answers a Success Status, then 404; preconditions and faults apply.
#[test]
fn configmap_delete_answers_success_then_404() {
    let (server, c) = state_and_other_cms();
    // Delete: a Success Status with the uid, then 404.
    let uid = c.get(&format!("{CMS}/state")).body["metadata"]["uid"].clone();
    let del = c.call("DELETE", &format!("{CMS}/state"), None);
    assert_eq!(del.status, 200);
    assert_eq!(
        del.body,
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success",
               "details":{"name":"state","kind":"configmaps","uid":uid}})
    );
    assert_eq!(c.get(&format!("{CMS}/state")).status, 404);
    assert_eq!(c.call("DELETE", &format!("{CMS}/state"), None).status, 404);
    let pre = c.call(
        "DELETE",
        &format!("{CMS}/other"),
        Some(r#"{"preconditions":{"resourceVersion":"1"}}"#),
    );
    assert_eq!(
        (pre.status, pre.body["reason"].as_str()),
        (409, Some("Conflict"))
    );
    // Faults apply to configmap verbs too.
    server.set_faults(faults(&["cm-get:503@1"]));
    assert_eq!(c.get(&format!("{CMS}/other")).status, 503);
    assert_eq!(c.get(&format!("{CMS}/other")).status, 200);
}

/// A ConfigMap with a bad key, name, value type or namespace is refused; generateName works.
#[test]
fn configmap_creates_with_bad_keys_names_types_or_namespaces_are_refused() {
    let (_server, c) = started(|o| o.tls = false);
    let bad_key = c.call(
        "POST",
        CMS,
        Some(r#"{"metadata":{"name":"k"},"data":{"no/slash":"x"}}"#),
    );
    assert_eq!(bad_key.status, 422);
    assert_eq!(bad_key.body["reason"], "Invalid");
    assert_eq!(bad_key.body["details"]["kind"], "ConfigMap");
    assert_eq!(
        bad_key.body["details"]["causes"][0]["field"],
        "data[no/slash]"
    );
    assert!(bad_key.body["message"].as_str().unwrap().starts_with(
        "ConfigMap \"k\" is invalid: data[no/slash]: Invalid value: \"no/slash\": a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
    ));
    let wrong_type = c.call(
        "POST",
        CMS,
        Some(r#"{"metadata":{"name":"k"},"data":{"n":1}}"#),
    );
    assert_eq!(wrong_type.status, 400);
    let bad_name = c.call("POST", CMS, Some(r#"{"metadata":{"name":"Bad_Name"}}"#));
    assert_eq!(bad_name.status, 422);
    let nameless = c.call("POST", CMS, Some(r#"{"data":{}}"#));
    assert_eq!(
        nameless.body["message"],
        "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required"
    );
    let generated = c.call(
        "POST",
        CMS,
        Some(r#"{"metadata":{"generateName":"state-"}}"#),
    );
    assert_eq!(generated.status, 201);
    let s = c.call(
        "POST",
        "/api/v1/namespaces/Bad_NS/configmaps",
        Some(r#"{"metadata":{"name":"a"}}"#),
    );
    assert_eq!(
        (s.status, s.body["details"]["kind"].as_str()),
        (404, Some("namespaces"))
    );
}

/// A ConfigMap over 1 MiB of data answers 422, one of exactly 1 MiB 201, a 3 MiB body 413.
#[test]
fn configmap_data_is_limited_to_1_mib() {
    let (_server, c) = started(|o| o.tls = false);
    // Over 1 MiB of data: 422 from validation (the 3 MiB body limit would be 413).
    let big = json!({"metadata": {"name": "big"},
                     "data": {"a": "x".repeat(700 * 1024), "b": "y".repeat(400 * 1024)}})
    .to_string();
    let r = c.call("POST", CMS, Some(&big));
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["message"],
        "ConfigMap \"big\" is invalid: []: Too long: may not be more than 1048576 bytes"
    );
    assert_eq!(
        r.body["details"]["causes"],
        json!([{"reason": "FieldValueTooLong", "message": "Too long: may not be more than 1048576 bytes", "field": "[]"}])
    );
    let exact =
        json!({"metadata": {"name": "exact"}, "data": {"a": "x".repeat(1024 * 1024)}}).to_string();
    assert_eq!(c.call("POST", CMS, Some(&exact)).status, 201);
    let huge = json!({"metadata": {"name": "huge"}, "data": {"a": "x".repeat(3 * 1024 * 1024)}})
        .to_string();
    let r = c.try_call("POST", CMS, Some(&huge));
    if let Ok(r) = r {
        // The server answers before reading the body; the client may or may not see it.
        assert_eq!(r.status, 413);
        assert_eq!(r.body["reason"], "RequestEntityTooLarge");
    }
}

/// An immutable ConfigMap's data is frozen, to PUT and patch, while its metadata may change.
#[test]
fn immutable_configmap_data_is_frozen_but_its_metadata_may_be_patched() {
    let (_server, c) = started(|o| o.tls = false);
    // immutable: data and the flag are frozen.
    assert_eq!(
        c.call(
            "POST",
            CMS,
            Some(r#"{"metadata":{"name":"frozen"},"immutable":true,"data":{"a":"1"}}"#)
        )
        .status,
        201
    );
    let r = c.call(
        "PUT",
        &format!("{CMS}/frozen"),
        Some(r#"{"metadata":{"name":"frozen"},"immutable":true,"data":{"a":"2"}}"#),
    );
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["message"],
        "ConfigMap \"frozen\" is invalid: data: Forbidden: field is immutable when `immutable` is set"
    );
    // A patch (what `kubectl annotate` sends) may change the metadata of an immutable
    // ConfigMap, not its data.
    let r = c.call(
        "PATCH",
        &format!("{CMS}/frozen"),
        Some(r#"{"metadata":{"annotations":{"a":"b"}}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["metadata"]["annotations"]["a"], "b");
    let r = c.call(
        "PATCH",
        &format!("{CMS}/frozen"),
        Some(r#"{"data":{"a":"3"}}"#),
    );
    assert_eq!(r.status, 422, "{}", r.body);
}

#[test]
fn the_server_handle_can_be_shared_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<SimServer>();
    send_sync::<super::FaultRule>();
}

#[test]
fn served_kinds_names_each_resource_with_its_group_version() {
    let kinds = crate::served_kinds();
    for want in [
        "pods (v1)",
        "configmaps (v1)",
        "leases (coordination.k8s.io/v1)",
        "namespaces (v1)",
    ] {
        assert!(kinds.iter().any(|k| k == want), "{want} in {kinds:?}");
    }
    assert!(
        !kinds.iter().any(|k| k.starts_with("deployments")),
        "{kinds:?}"
    );
}
