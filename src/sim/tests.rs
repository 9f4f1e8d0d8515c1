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
        let mut cfg = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)));
        if let Some(pem) = server.ca_pem() {
            let ca = Certificate::from_pem(pem.as_bytes()).unwrap();
            cfg = cfg.tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::new_with_certs(&[ca]))
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
                    _ => self.agent.delete(&url).force_send_body(),
                };
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.content_type("application/json").send(b.unwrap_or(""))
            }
        };
        let mut resp = result.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()
            .unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Reply {
            status,
            headers,
            body,
        }
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

#[test]
fn https_create_conflict_auth_and_validation() {
    let server = SimServer::start(fast_opts()).unwrap();
    assert!(server.url().starts_with("https://127.0.0.1:"));
    let c = Client::new(&server, Some(TOKEN));

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
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
               "message":"pods \"exec-1\" already exists","reason":"AlreadyExists",
               "details":{"name":"exec-1","kind":"pods"},"code":409})
    );

    for client in [
        Client::new(&server, None),
        Client::new(&server, Some("wrong")),
    ] {
        let r = client.get(PODS);
        assert_eq!(r.status, 401);
        assert_eq!(
            r.body,
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                   "message":"Unauthorized","reason":"Unauthorized","code":401})
        );
    }
    // No token needed for the side door.
    assert_eq!(Client::new(&server, None).get("/sim/stats").status, 200);

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

    let generated = c.call("POST", PODS, Some(r#"{"metadata":{"generateName":"spark-exec-"},"spec":{"containers":[{"name":"a","image":"b"}]}}"#));
    assert_eq!(generated.status, 201);
    let gname = generated.body["metadata"]["name"].as_str().unwrap();
    assert!(
        gname.starts_with("spark-exec-") && gname.len() == "spark-exec-".len() + 5,
        "{gname}"
    );

    let got = c.get(&format!("{PODS}/exec-1"));
    assert_eq!(got.status, 200);
    assert_eq!(got.body["metadata"]["name"], "exec-1");
    let missing = c.get(&format!("{PODS}/nope"));
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.body,
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
               "message":"pods \"nope\" not found","reason":"NotFound",
               "details":{"name":"nope","kind":"pods"},"code":404})
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

    let stats = server.stats();
    assert_eq!(stats.creates, 2);
    assert_eq!(stats.create_conflicts, 1);
    assert_eq!(stats.max_live_pods_by_app.get("app-1"), Some(&1));
    server.stop();
}

#[test]
fn label_and_field_selectors() {
    let server = SimServer::start(SimOptions {
        schedule_latency: Duration::from_secs(3600),
        ..fast_opts()
    })
    .unwrap();
    let c = Client::new(&server, Some(TOKEN));
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
    let server = SimServer::start(SimOptions {
        max_page: Some(4),
        ..fast_opts()
    })
    .unwrap();
    let c = Client::new(&server, Some(TOKEN));
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
    let server = SimServer::start(SimOptions {
        continue_ttl: Duration::from_millis(200),
        ..fast_opts()
    })
    .unwrap();
    let c = Client::new(&server, Some(TOKEN));
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
    let server = SimServer::start(SimOptions {
        startup_latency: Duration::from_millis(400),
        stop_latency: Duration::from_millis(1000),
        ..fast_opts()
    })
    .unwrap();
    let c = Client::new(&server, Some(TOKEN));
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
    let cfg = pki.server_config(Some(&[pki.ca_der().clone()])).unwrap();
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
            let body = resp
                .body_mut()
                .with_config()
                .limit(1 << 30)
                .read_to_vec()
                .unwrap();
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
