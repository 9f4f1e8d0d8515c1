//! End-to-end tests of the client against fake API servers on 127.0.0.1 (plain HTTP and
//! rustls with rcgen certificates).

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::testutil::{fixture, FakeServer, Pki, Reply};
use super::*;

const TOKEN: &str = "s3cr3t-t0ken";

/// A [`PageSink`] made of two closures, for tests that watch the calls.
struct Sink<R, P> {
    restart: R,
    page: P,
}

impl<R, P, E> PageSink for Sink<R, P>
where
    R: FnMut(),
    P: FnMut(&[u8]) -> Result<Option<String>, E>,
    E: Into<KubeError>,
{
    type Error = E;

    fn restart(&mut self) {
        (self.restart)()
    }

    fn page(&mut self, body: &[u8]) -> Result<Option<String>, E> {
        (self.page)(body)
    }
}

/// Lists [`lp`]`(None, None)` through `client`, handing each page to `page` (restarts ignored).
fn list_pages<P, E>(client: &KubeClient, page: P) -> Result<ListStats, KubeError>
where
    P: FnMut(&[u8]) -> Result<Option<String>, E>,
    E: Into<KubeError>,
{
    let sink = &mut Sink {
        restart: || {},
        page,
    };
    client.api(&PODS).list(&lp(None, None), sink)
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_retries: 4,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        retry_budget: Duration::from_secs(30),
    }
}

fn fast_options() -> ClientOptions {
    ClientOptions {
        retry: fast_retries(),
        timeouts: Timeouts {
            connect: Duration::from_secs(5),
            per_read: Duration::from_secs(5),
            global: Duration::from_secs(10),
        },
        ..ClientOptions::default()
    }
}

fn http_client(server: &FakeServer) -> KubeClient {
    let mut cfg = ClusterConfig::for_server(&server.url(), "spark");
    cfg.credential = Credential::Token {
        token: Secret::new(TOKEN.to_string()),
        source: "--token flag".into(),
    };
    KubeClient::with_options(cfg, fast_options()).unwrap()
}

fn page(names: &[&str], cont: Option<&str>) -> String {
    let items: Vec<_> = names
        .iter()
        .map(|n| serde_json::json!({"metadata": {"name": n}}))
        .collect();
    let mut meta = serde_json::json!({"resourceVersion": "554"});
    if let Some(c) = cont {
        meta["continue"] = c.into();
    }
    serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items})
        .to_string()
}

fn names(items: &[serde_json::Value]) -> Vec<String> {
    items
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

const SELECTOR: &str = "spark-app-selector=app-1,spark-role=executor";

/// The error of creating pod `name` (a body of its name only) through `client`.
fn create_err(client: &KubeClient, name: &str) -> KubeError {
    let body = serde_json::json!({"metadata": {"name": name}});
    (client.api(&PODS))
        .create(&body, &PostParams::default())
        .unwrap_err()
}

/// `err` is the create of pod `p` refused by the write fence, unsent.
fn assert_fenced(err: &KubeError) {
    let text = err.to_string();
    assert!(
        text.contains("create pod p") && text.contains("no longer holds the leader lease"),
        "{text}"
    );
}

/// The list of [`SELECTOR`] with `field_selector` and `limit`.
fn lp(field_selector: Option<&'static str>, limit: Option<u32>) -> ListParams<'static> {
    ListParams {
        label_selector: SELECTOR,
        field_selector,
        limit,
    }
}

#[test]
fn list_paginates_and_encodes_selectors() {
    let server = FakeServer::http(|req, _| match req.query("continue").as_deref() {
        None => Reply::json(200, &page(&["a", "b"], Some("tok/1+=="))),
        Some("tok/1+==") => Reply::json(200, &page(&[], Some("tok2"))),
        Some("tok2") => Reply::json(200, &page(&["c"], Some(""))),
        Some(other) => panic!("unexpected continue {other}"),
    });
    let client = http_client(&server);
    let (items, stats) = client
        .api(&PODS)
        .list_items(&lp(Some("status.phase=Pending"), Some(2)))
        .unwrap();
    assert_eq!(names(&items), ["a", "b", "c"]);
    assert_eq!(stats.pages, 3);
    assert_eq!(stats.restarts, 0);
    let reqs = server.recorded();
    assert_eq!(reqs.len(), 3);
    let first = &reqs[0];
    assert_eq!(first.method, "GET");
    assert_eq!(first.path(), "/api/v1/namespaces/spark/pods");
    assert_eq!(
        first.target,
        "/api/v1/namespaces/spark/pods?labelSelector=spark-app-selector%3Dapp-1%2Cspark-role%3Dexecutor&fieldSelector=status.phase%3DPending&limit=2"
    );
    assert_eq!(first.query("labelSelector").unwrap(), SELECTOR);
    assert_eq!(reqs[1].query("continue").unwrap(), "tok/1+==");
    assert!(reqs[1].target.contains("continue=tok%2F1%2B%3D%3D"));
    assert_eq!(reqs[1].query("limit").unwrap(), "2");
    assert_eq!(first.header("accept"), Some("application/json"));
    assert_eq!(first.header("user-agent"), Some(USER_AGENT));
    assert_eq!(
        first.header("authorization"),
        Some(&*format!("Bearer {TOKEN}"))
    );
    assert_eq!(first.header("accept-encoding"), Some("gzip"));
    let s = client.stats();
    assert_eq!((s.requests, s.retries), (3, 0));
    assert!(s.bytes_received > 0);
}

#[test]
fn set_based_selectors_round_trip() {
    let sel = "env in (prod, qa),!canary,tier notin (web),x!=y";
    let enc = encode_component(sel);
    assert_eq!(
        enc,
        "env%20in%20%28prod%2C%20qa%29%2C%21canary%2Ctier%20notin%20%28web%29%2Cx%21%3Dy"
    );
    assert_eq!(super::testutil::percent_decode(&enc), sel);
    assert_eq!(encode_component("a-b_c.d~e"), "a-b_c.d~e");
    assert_eq!(encode_component("é"), "%C3%A9");
}

#[test]
fn list_restarts_after_410_expired() {
    let gone = r#"{"kind":"Status","apiVersion":"v1","metadata":{"continue":"fresh"},"status":"Failure","message":"The provided continue parameter is too old to display a consistent list result.","reason":"Expired","code":410}"#;
    let expired_once = Arc::new(AtomicUsize::new(0));
    let e2 = expired_once.clone();
    let server = FakeServer::http(move |req, _| match req.query("continue").as_deref() {
        None => Reply::json(200, &page(&["a"], Some("p2"))),
        Some("p2") if e2.fetch_add(1, Ordering::SeqCst) == 0 => Reply::json(410, gone),
        Some("p2") => Reply::json(200, &page(&["b"], None)),
        Some(other) => panic!("unexpected continue {other}"),
    });
    let client = http_client(&server);
    let (items, stats) = client.api(&PODS).list_items(&lp(None, Some(1))).unwrap();
    assert_eq!(
        names(&items),
        ["a", "b"],
        "items of the dropped pass are cleared"
    );
    assert_eq!(stats.restarts, 1);
    assert_eq!(stats.pages, 3);

    // Always expired: gives up after MAX_LIST_RESTARTS restarts with the 410.
    let server = FakeServer::http(move |req, _| match req.query("continue") {
        None => Reply::json(200, &page(&["a"], Some("p2"))),
        Some(_) => Reply::json(410, gone),
    });
    let client = http_client(&server);
    let mut restarts = 0;
    let err = client
        .api(&PODS)
        .list(
            &lp(None, Some(1)),
            &mut Sink {
                restart: || restarts += 1,
                page: |_page: &[u8]| -> Result<Option<String>, KubeError> { Ok(Some("p2".into())) },
            },
        )
        .unwrap_err();
    assert_eq!(restarts, MAX_LIST_RESTARTS);
    assert_eq!(err.status_code(), Some(410));
    assert_eq!(err.api_status().unwrap().reason, "Expired");
    assert_eq!(
        server.recorded().len(),
        2 * (MAX_LIST_RESTARTS as usize + 1)
    );
}

#[test]
fn list_on_page_error_and_repeated_token() {
    let server = FakeServer::http(|_, _| Reply::json(200, &page(&["a"], Some("same"))));
    let client = http_client(&server);
    let err = client.api(&PODS).list_items(&lp(None, None)).unwrap_err();
    assert!(matches!(err, KubeError::Decode { .. }), "{err}");
    assert!(err.to_string().contains("same continue token twice"));

    #[derive(Debug)]
    struct MyErr;
    impl From<MyErr> for KubeError {
        fn from(_: MyErr) -> Self {
            KubeError::Decode {
                what: "mine".into(),
                message: "bad".into(),
            }
        }
    }
    let err = list_pages(&client, |_| -> Result<Option<String>, MyErr> { Err(MyErr) }).unwrap_err();
    assert_eq!(err.to_string(), "cannot decode mine: bad");

    let server = FakeServer::http(|_, _| Reply::json(200, "{not json"));
    let client = http_client(&server);
    let err = client.api(&PODS).list_items(&lp(None, None)).unwrap_err();
    assert!(matches!(err, KubeError::Decode { .. }), "{err}");
}

#[test]
fn gzip_bodies_are_decoded_and_compression_can_be_disabled() {
    let body = std::fs::read(fixture("k8s-openapi_v1-36_pod-list.body.json"))
        .unwrap_or_else(|_| page(&["x"; 3000], None).into_bytes());
    let plain_len = body.len();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&body).unwrap();
    let gz = gz.finish().unwrap();
    let server = FakeServer::http(move |req, _| {
        if req.header("accept-encoding") == Some("gzip") {
            Reply::Respond {
                status: 200,
                headers: vec![
                    ("Content-Type".into(), "application/json".into()),
                    ("Content-Encoding".into(), "gzip".into()),
                ],
                body: gz.clone(),
            }
        } else {
            Reply::json(200, &page(&["plain"], None))
        }
    });
    let client = http_client(&server);
    let mut seen = 0usize;
    let stats = list_pages(&client, |b| {
        seen = b.len();
        serde_json::from_slice::<serde_json::Value>(b)
            .map(|_| None)
            .map_err(|e| KubeError::Decode {
                what: "page".into(),
                message: e.to_string(),
            })
    })
    .unwrap();
    assert_eq!(seen, plain_len);
    assert_eq!(stats.bytes, plain_len as u64);

    let mut cfg = ClusterConfig::for_server(&server.url(), "spark");
    cfg.disable_compression = true;
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    let (items, _) = client.api(&PODS).list_items(&lp(None, None)).unwrap();
    assert_eq!(names(&items), ["plain"]);
    let last = server.recorded().pop().unwrap();
    assert_eq!(last.header("accept-encoding"), None);
    assert_eq!(last.header("authorization"), None);
}

#[test]
fn list_body_limit_is_enforced() {
    let server = FakeServer::http(|_, _| Reply::json(200, &page(&["a", "b", "c"], None)));
    let mut cfg = ClusterConfig::for_server(&server.url(), "spark");
    cfg.credential = Credential::None;
    let opts = ClientOptions {
        list_body_limit: 10,
        ..fast_options()
    };
    let client = KubeClient::with_options(cfg, opts).unwrap();
    let err = client.api(&PODS).list_items(&lp(None, None)).unwrap_err();
    assert!(matches!(err, KubeError::Decode { .. }), "{err}");
    assert!(err.to_string().contains("cap of 10 bytes"), "{err}");
    assert!(err.to_string().contains("smaller --page-size"), "{err}");
    assert_eq!(server.recorded().len(), 1, "not retried");
}

/// A server that has pod app-exec-1, answers a POST of `dup` 409 AlreadyExists, another
/// POST 201, a DELETE of `gone` 404 and any other DELETE 200.
fn pod_crud_server() -> FakeServer {
    FakeServer::http(|req, _| match (req.method.as_str(), req.path()) {
        ("GET", "/api/v1/namespaces/spark/pods/app-exec-1") => Reply::json(
            200,
            r#"{"kind":"Pod","metadata":{"name":"app-exec-1","uid":"u1"}}"#,
        ),
        ("GET", _) => Reply::json(
            404,
            r#"{"kind":"Status","status":"Failure","message":"pods \"nope\" not found","reason":"NotFound","code":404}"#,
        ),
        ("POST", "/api/v1/namespaces/spark/pods") => {
            let pod: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
            if pod["metadata"]["name"] == "dup" {
                Reply::json(
                    409,
                    r#"{"kind":"Status","status":"Failure","message":"pods \"dup\" already exists","reason":"AlreadyExists","details":{"name":"dup","kind":"pods"},"code":409}"#,
                )
            } else {
                let mut created = pod.clone();
                created["metadata"]["uid"] = "new-uid".into();
                Reply::json(201, &created.to_string())
            }
        }
        ("DELETE", "/api/v1/namespaces/spark/pods/gone") => Reply::json(
            404,
            r#"{"kind":"Status","status":"Failure","message":"pods \"gone\" not found","reason":"NotFound","code":404}"#,
        ),
        ("DELETE", _) => Reply::json(
            200,
            r#"{"kind":"Pod","metadata":{"name":"x","deletionTimestamp":"2024-01-01T00:00:00Z"}}"#,
        ),
        _ => Reply::json(405, "{}"),
    })
}

/// A get answers the object or None on 404; a create posts JSON and names an AlreadyExists.
#[test]
fn get_answers_none_on_404_and_create_posts_json() {
    let server = pod_crud_server();
    let client = http_client(&server);
    let pod = client.api(&PODS).get("app-exec-1").unwrap().unwrap();
    assert_eq!(pod["metadata"]["uid"], "u1");
    assert_eq!(client.api(&PODS).get("nope").unwrap(), None);

    let created = client
        .api(&PODS)
        .create(
            &serde_json::json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"app-exec-2"}}),
            &PostParams::default(),
        )
        .unwrap()
        .object;
    assert_eq!(created["metadata"]["uid"], "new-uid");
    let post = server
        .recorded()
        .into_iter()
        .find(|r| r.method == "POST")
        .unwrap();
    assert_eq!(post.header("content-type"), Some("application/json"));

    let err = create_err(&client, "dup");
    assert!(err.is_already_exists());
    assert_eq!(
        err.to_string(),
        "create pod dup: 409 AlreadyExists: pods \"dup\" already exists"
    );
    assert_eq!(client.stats().errors_by_code.get(&404), Some(&1));
}

/// A delete answers NotFound or Deleted, sending DeleteOptions only with preconditions.
#[test]
fn delete_answers_not_found_or_deleted_and_sends_its_preconditions() {
    let server = pod_crud_server();
    let client = http_client(&server);
    assert_eq!(
        client.api(&PODS).delete("gone", None).unwrap(),
        Deleted::NotFound
    );
    assert_eq!(
        client
            .api(&PODS)
            .delete(
                "app-exec-1",
                Some(Preconditions {
                    uid: "uid-1",
                    resource_version: "77"
                })
            )
            .unwrap(),
        Deleted::Deleted
    );
    assert_eq!(
        client.api(&PODS).delete("app-exec-3", None).unwrap(),
        Deleted::Deleted
    );
    let deletes: Vec<_> = server
        .recorded()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert!(deletes[0].body.is_empty());
    let opts: serde_json::Value = serde_json::from_slice(&deletes[1].body).unwrap();
    assert_eq!(
        opts,
        serde_json::json!({"kind":"DeleteOptions","apiVersion":"v1","preconditions":{"uid":"uid-1","resourceVersion":"77"}})
    );
    assert_eq!(deletes[1].header("content-type"), Some("application/json"));
    assert!(deletes[2].body.is_empty());
    assert!(matches!(
        client.api(&PODS).delete("", None),
        Err(KubeError::Config(_))
    ));
    assert_eq!(client.stats().errors_by_code.get(&404), Some(&1));
}

#[test]
fn retries_5xx_and_counts_them() {
    let server = FakeServer::http(|_, i| match i {
        0 => Reply::json(
            503,
            r#"{"kind":"Status","status":"Failure","message":"unavailable","reason":"ServiceUnavailable","code":503}"#,
        ),
        1 => Reply::json(502, "<html>bad gateway</html>"),
        _ => Reply::json(200, r#"{"kind":"Pod","metadata":{"name":"p"}}"#),
    });
    let client = http_client(&server);
    assert!(client.api(&PODS).get("p").unwrap().is_some());
    let s = client.stats();
    assert_eq!((s.requests, s.retries), (3, 2));
    assert_eq!(s.errors_by_code.get(&503), Some(&1));
    assert_eq!(s.errors_by_code.get(&502), Some(&1));

    // Out of retries: the last error is returned, typed.
    let server = FakeServer::http(|_, _| {
        Reply::json(
            500,
            r#"{"message":"etcd is sad","reason":"InternalError","code":500}"#,
        )
    });
    let client = http_client(&server);
    let err = client.api(&PODS).get("p").unwrap_err();
    assert_eq!(err.to_string(), "get pod p: 500 InternalError: etcd is sad");
    assert!(err.is_retryable());
    assert_eq!(server.recorded().len(), 5, "1 try + 4 retries");
}

#[test]
fn create_is_retried_after_500_and_transport_errors() {
    let server = FakeServer::http(|req, i| match i {
        0 => Reply::json(500, "{}"),
        1 => Reply::Close,
        _ => Reply::json(201, std::str::from_utf8(&req.body).unwrap()),
    });
    let client = http_client(&server);
    let pod = serde_json::json!({"kind":"Pod","metadata":{"name":"app-exec-9"}});
    assert_eq!(
        client
            .api(&PODS)
            .create(&pod, &PostParams::default())
            .unwrap()
            .object,
        pod
    );
    let reqs = server.recorded();
    assert_eq!(reqs.len(), 3);
    assert!(
        reqs.iter().all(|r| r.body == reqs[0].body),
        "same body every time"
    );
    let s = client.stats();
    assert_eq!((s.retries, s.transport_errors), (2, 1));
}

#[test]
fn retry_after_is_a_floor_for_both_429_shapes() {
    let server = FakeServer::http(|_, i| match i {
        0 => Reply::Respond {
            status: 429,
            headers: vec![
                ("Content-Type".into(), "text/plain; charset=utf-8".into()),
                ("Retry-After".into(), "1".into()),
            ],
            body: b"Too many requests, please try again later.\n".to_vec(),
        },
        1 => Reply::json(
            429,
            r#"{"kind":"Status","status":"Failure","message":"slow down","reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}"#,
        ),
        _ => Reply::json(200, &page(&[], None)),
    });
    let client = http_client(&server);
    let started = Instant::now();
    client.api(&PODS).list_items(&lp(None, None)).unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let s = client.stats();
    assert_eq!(s.retries, 2);
    assert!(s.retry_sleep >= Duration::from_secs(2));
    assert_eq!(s.errors_by_code.get(&429), Some(&2));
}

#[test]
fn retry_budget_stops_retrying() {
    let server = FakeServer::http(|_, _| Reply::json(503, "{}").with_header("Retry-After", "1"));
    let mut client = http_client(&server);
    client.set_retry_policy(RetryPolicy {
        max_retries: 10,
        retry_budget: Duration::from_millis(1500),
        ..fast_retries()
    });
    let err = client.api(&PODS).get("p").unwrap_err();
    assert_eq!(err.status_code(), Some(503));
    assert_eq!(
        server.recorded().len(),
        2,
        "one retry fits the 1.5 s budget"
    );
    // The budget is per client: the next call does not retry at all.
    let _ = client.api(&PODS).get("p").unwrap_err();
    assert_eq!(server.recorded().len(), 3);

    client.set_retry_policy(RetryPolicy::none());
    assert_eq!(client.retry_policy().max_retries, 0);
}

#[test]
fn connection_refused_is_retried_then_reported() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg = ClusterConfig::for_server(&format!("http://127.0.0.1:{port}"), "spark");
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    let err = client.api(&PODS).list_items(&lp(None, None)).unwrap_err();
    match &err {
        KubeError::Transport {
            verb,
            kind,
            message,
        } => {
            assert_eq!(verb, "list pods");
            assert_eq!(*kind, TransportKind::Connect);
            assert!(message.contains("connection refused"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.is_retryable());
    let s = client.stats();
    assert_eq!((s.requests, s.retries, s.transport_errors), (5, 4, 5));
}

#[test]
fn read_timeout_is_a_retryable_transport_error() {
    let server = FakeServer::http(|_, _| {
        std::thread::sleep(Duration::from_millis(400));
        Reply::json(200, "{}")
    });
    let cfg = ClusterConfig::for_server(&server.url(), "spark");
    let opts = ClientOptions {
        retry: RetryPolicy::none(),
        timeouts: Timeouts {
            connect: Duration::from_secs(1),
            per_read: Duration::from_millis(100),
            global: Duration::from_secs(5),
        },
        ..ClientOptions::default()
    };
    let client = KubeClient::with_options(cfg, opts).unwrap();
    let err = client.api(&PODS).get("p").unwrap_err();
    assert!(
        matches!(&err, KubeError::Transport { kind: TransportKind::Timeout, message, .. } if message.contains("timed out")),
        "{err:?}"
    );
    assert!(err.is_retryable());
}

#[test]
fn static_token_401_is_an_auth_error_without_the_token() {
    let server = FakeServer::http(|_, _| {
        Reply::json(
            401,
            r#"{"kind":"Status","status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#,
        )
    });
    let client = http_client(&server);
    let err = client.api(&PODS).list_items(&lp(None, None)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, KubeError::Auth(_)));
    assert_eq!(err.status_code(), Some(401));
    assert!(
        msg.contains("--token flag") && msg.contains("401 Unauthorized"),
        "{msg}"
    );
    assert!(!msg.contains(TOKEN));
    assert!(!format!("{err:?}").contains(TOKEN));
    assert!(!format!("{client:?}").contains(TOKEN));
    assert_eq!(server.recorded().len(), 1, "a fixed token is not retried");

    // No credential at all.
    let cfg = ClusterConfig::for_server(&server.url(), "spark");
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    let msg = client.api(&PODS).get("x").unwrap_err().to_string();
    assert!(msg.contains("gives none"), "{msg}");
}

fn token_file_client(server: &FakeServer, path: &Path, refresh: Duration) -> KubeClient {
    let mut cfg = ClusterConfig::for_server(&server.url(), "spark");
    cfg.credential = Credential::TokenFile {
        path: path.to_path_buf(),
        source: "--token-file flag".into(),
    };
    let opts = ClientOptions {
        token_refresh: refresh,
        ..fast_options()
    };
    KubeClient::with_options(cfg, opts).unwrap()
}

#[test]
fn token_file_is_reread_after_401() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, "old-token\n").unwrap();
    let server = FakeServer::http(|req, _| {
        if req.header("authorization") == Some("Bearer new-token") {
            Reply::json(200, &page(&["a"], None))
        } else {
            Reply::json(
                401,
                r#"{"message":"Unauthorized","reason":"Unauthorized","code":401}"#,
            )
        }
    });
    let client = token_file_client(&server, &path, Duration::from_secs(3600));
    // Rotated after the client read it.
    std::fs::write(&path, "  new-token \n").unwrap();
    let (items, _) = client.api(&PODS).list_items(&lp(None, None)).unwrap();
    assert_eq!(names(&items), ["a"]);
    let auth: Vec<_> = server
        .recorded()
        .iter()
        .map(|r| r.header("authorization").unwrap().to_string())
        .collect();
    assert_eq!(auth, ["Bearer old-token", "Bearer new-token"]);
    assert_eq!(client.stats().retries, 1);

    // Still rejected after the re-read: Auth naming the file, and one retry only.
    std::fs::write(&path, "bad-token").unwrap();
    let before = server.recorded().len();
    let client = token_file_client(&server, &path, Duration::from_secs(3600));
    let err = client.api(&PODS).get("x").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, KubeError::Auth(_)));
    assert!(
        msg.contains(&format!(
            "token file {} (--token-file flag) was rejected",
            path.display()
        )) && msg.contains("refresh the token"),
        "{msg}"
    );
    assert!(!msg.contains("bad-token"));
    assert_eq!(server.recorded().len() - before, 2);
}

#[test]
fn token_file_is_reread_when_stale() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, "t1").unwrap();
    let server = FakeServer::http(|_, _| Reply::json(200, r#"{"kind":"Pod","metadata":{}}"#));
    let client = token_file_client(&server, &path, Duration::ZERO);
    client.api(&PODS).get("x").unwrap();
    std::fs::write(&path, "t2").unwrap();
    client.api(&PODS).get("x").unwrap();
    // A token file that disappears keeps the last good token.
    std::fs::remove_file(&path).unwrap();
    client.api(&PODS).get("x").unwrap();
    let auth: Vec<_> = server
        .recorded()
        .iter()
        .map(|r| r.header("authorization").unwrap().to_string())
        .collect();
    assert_eq!(auth, ["Bearer t1", "Bearer t2", "Bearer t2"]);

    // A missing or empty token file fails at construction.
    let mut cfg = ClusterConfig::for_server(&server.url(), "spark");
    cfg.credential = Credential::TokenFile {
        path: path.clone(),
        source: "in-cluster service account".into(),
    };
    let err = KubeClient::new(cfg.clone()).unwrap_err().to_string();
    assert!(
        err.contains("cannot read token file") && err.contains("in-cluster service account"),
        "{err}"
    );
    std::fs::write(&path, "\n").unwrap();
    assert!(KubeClient::new(cfg)
        .unwrap_err()
        .to_string()
        .contains("is empty"));
}

#[test]
fn quota_403_is_not_retried() {
    let server = FakeServer::http(|_, _| {
        Reply::json(
            403,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"a-exec-4\" is forbidden: exceeded quota: pod-quota, requested: pods=1, used: pods=10, limited: pods=10","reason":"Forbidden","details":{"name":"a-exec-4","kind":"pods"},"code":403}"#,
        )
    });
    let client = http_client(&server);
    let err = create_err(&client, "a-exec-4");
    assert!(err.is_quota());
    assert!(!err.is_retryable());
    assert!(err.to_string().starts_with(
        "create pod a-exec-4: 403 Forbidden: pods \"a-exec-4\" is forbidden: exceeded quota"
    ));
    assert_eq!(server.recorded().len(), 1);
}

#[test]
fn plain_http_to_remote_host_is_refused_by_the_client_too() {
    let cfg = ClusterConfig::for_server("http://10.1.2.3:8080", "x");
    let err = KubeClient::new(cfg).unwrap_err();
    assert!(matches!(err, KubeError::Config(_)));
    assert!(err.to_string().contains("plain http://"));
}

// ------------------------------------------------------------------------------------------
// TLS

struct TlsSetup {
    dir: tempfile::TempDir,
    pki: Pki,
}

impl TlsSetup {
    fn new() -> TlsSetup {
        TlsSetup {
            dir: tempfile::tempdir().unwrap(),
            pki: Pki::new("test-ca"),
        }
    }

    fn write(&self, name: &str, text: &str) -> std::path::PathBuf {
        let p = self.dir.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A server with a certificate of this CA for `names`, answering [`ok_handler`]; with
    /// `client_certs` it asks for client certificates and trusts those of this CA.
    fn serve(&self, names: &[&str], client_certs: bool) -> FakeServer {
        let client_ca = client_certs.then_some(&self.pki);
        FakeServer::https(
            Pki::server_config(&self.pki.server(names), client_ca),
            ok_handler(),
        )
    }

    /// Resolves a kubeconfig with one cluster/user/context.
    fn resolve(&self, cluster: &str, user: &str) -> Result<ClusterConfig, KubeError> {
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: t\ncontexts:\n- name: t\n  context: {{cluster: c, user: u, namespace: spark}}\nclusters:\n- name: c\n  cluster:\n{cluster}\nusers:\n- name: u\n  user:\n{user}\n"
        );
        let kc = self.write("kube/config", &text);
        let flags = ConnectionFlags {
            kubeconfig: Some(kc),
            ..Default::default()
        };
        resolve_with(&flags, &|_| None, &self.dir.path().join("no-sa"))
    }
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn ok_handler() -> impl Fn(&super::testutil::Recorded, usize) -> Reply + Send + Sync + 'static {
    |req, _| {
        if req.path().ends_with("/pods") {
            Reply::json(200, &page(&["tls-pod"], None))
        } else {
            Reply::json(200, r#"{"kind":"Pod","metadata":{"name":"tls-pod"}}"#)
        }
    }
}

#[test]
fn tls_ca_from_file_and_data_and_wrong_ca() {
    let t = TlsSetup::new();
    let server = t.serve(&["127.0.0.1"], false);
    let url = format!("https://{}", server.addr);
    t.write("kube/pki/ca.pem", &t.pki.ca_pem);

    // CA file relative to the kubeconfig's directory.
    let cfg = t
        .resolve(
            &format!("    server: {url}\n    certificate-authority: pki/ca.pem"),
            &format!("    token: {TOKEN}"),
        )
        .unwrap();
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    let (items, _) = client.api(&PODS).list_items(&lp(None, None)).unwrap();
    assert_eq!(names(&items), ["tls-pod"]);
    assert_eq!(
        server.recorded()[0].header("authorization"),
        Some(&*format!("Bearer {TOKEN}"))
    );

    // CA data, line-wrapped base64.
    let data = b64(&t.pki.ca_pem);
    let wrapped: Vec<String> = data
        .as_bytes()
        .chunks(64)
        .map(|c| format!("      {}", std::str::from_utf8(c).unwrap()))
        .collect();
    let cfg = t
        .resolve(
            &format!(
                "    server: {url}\n    certificate-authority-data: |\n{}",
                wrapped.join("\n")
            ),
            "    {}",
        )
        .unwrap();
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    client.api(&PODS).list_items(&lp(None, None)).unwrap();

    // Wrong CA: a clear, non-retried TLS error.
    let other = Pki::new("other-ca");
    let cfg = t
        .resolve(
            &format!(
                "    server: {url}\n    certificate-authority-data: {}",
                b64(&other.ca_pem)
            ),
            "    {}",
        )
        .unwrap();
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    let before = server.recorded().len();
    let err = client.api(&PODS).list_items(&lp(None, None)).unwrap_err();
    assert_eq!(
        err,
        KubeError::Transport {
            verb: "list pods".into(),
            kind: TransportKind::Tls,
            message: UNTRUSTED_CERT_MESSAGE.into()
        }
    );
    assert!(!err.is_retryable());
    assert_eq!(client.stats().requests, 1);
    assert_eq!(server.recorded().len(), before);

    // No CA configured: the Mozilla roots do not know the test CA either.
    let cfg = t.resolve(&format!("    server: {url}"), "    {}").unwrap();
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    let err = client.api(&PODS).get("x").unwrap_err();
    assert!(err.to_string().contains("certificate not trusted"), "{err}");
}

#[test]
fn tls_insecure_skip_verify() {
    let t = TlsSetup::new();
    let server = t.serve(&["somewhere.else"], false);
    let cfg = t
        .resolve(
            &format!(
                "    server: https://{}\n    insecure-skip-tls-verify: true",
                server.addr
            ),
            "    {}",
        )
        .unwrap();
    assert!(cfg.tls.insecure_skip_tls_verify);
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    client.api(&PODS).list_items(&lp(None, None)).unwrap();

    // The same via the flag, overriding a kubeconfig CA.
    t.write("kube/ca.pem", &Pki::new("x").ca_pem);
    let text = format!(
        "current-context: t\ncontexts: [{{name: t, context: {{cluster: c}}}}]\nclusters: [{{name: c, cluster: {{server: 'https://{}', certificate-authority: ca.pem}}}}]\n",
        server.addr
    );
    let kc = t.write("kube/config2", &text);
    let flags = ConnectionFlags {
        kubeconfig: Some(kc),
        insecure_skip_tls_verify: true,
        ..Default::default()
    };
    let cfg = resolve_with(&flags, &|_| None, t.dir.path()).unwrap();
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    client.api(&PODS).list_items(&lp(None, None)).unwrap();
}

#[test]
fn tls_server_name_is_verified_and_pinned() {
    let t = TlsSetup::new();
    let server = t.serve(&["my-cluster.example.com"], false);
    let ca = b64(&t.pki.ca_pem);
    let cfg = t
        .resolve(
            &format!(
                "    server: https://{}\n    certificate-authority-data: {ca}\n    tls-server-name: my-cluster.example.com",
                server.addr
            ),
            "    {}",
        )
        .unwrap();
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    assert_eq!(
        client.base_url(),
        format!("https://my-cluster.example.com:{}", server.addr.port())
    );
    let (items, _) = client.api(&PODS).list_items(&lp(None, None)).unwrap();
    assert_eq!(names(&items), ["tls-pod"]);
    assert_eq!(
        server.recorded()[0].header("host"),
        Some(&*format!("my-cluster.example.com:{}", server.addr.port()))
    );

    // Without tls-server-name the certificate does not match 127.0.0.1.
    let cfg = t
        .resolve(
            &format!(
                "    server: https://{}\n    certificate-authority-data: {ca}",
                server.addr
            ),
            "    {}",
        )
        .unwrap();
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    let err = client.api(&PODS).get("x").unwrap_err();
    assert!(
        err.to_string().contains("not valid for 127.0.0.1")
            && err.to_string().contains("tls-server-name"),
        "{err}"
    );
    assert!(!err.is_retryable());
}

#[test]
fn tls_client_certificates() {
    let t = TlsSetup::new();
    let server = t.serve(&["127.0.0.1"], true);
    let cluster = format!(
        "    server: https://{}\n    certificate-authority-data: {}",
        server.addr,
        b64(&t.pki.ca_pem)
    );
    let client_id = t.pki.client("spark-admin");
    t.write("kube/client.crt", &client_id.cert_pem);
    t.write("kube/client.key", &client_id.key_pem);
    // The config with our certificate and `key`, both inline.
    let inline = |key: &str| {
        let user = format!(
            "    client-certificate-data: {}\n    client-key-data: {}",
            b64(&client_id.cert_pem),
            b64(key)
        );
        t.resolve(&cluster, &user).unwrap()
    };

    // Files relative to the kubeconfig.
    let cfg = t
        .resolve(
            &cluster,
            "    client-certificate: client.crt\n    client-key: client.key",
        )
        .unwrap();
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    let (items, _) = client.api(&PODS).list_items(&lp(None, None)).unwrap();
    assert_eq!(names(&items), ["tls-pod"]);
    assert!(!format!("{client:?}").contains("PRIVATE KEY"));

    // Inline data.
    let cfg = inline(&client_id.key_pem);
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    client.api(&PODS).list_items(&lp(None, None)).unwrap();

    // No client certificate: the server refuses, with a message saying what to pass.
    let cfg = t.resolve(&cluster, "    {}").unwrap();
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    let err = client.api(&PODS).get("x").unwrap_err();
    assert!(
        matches!(&err, KubeError::Transport { kind: TransportKind::Tls, message, .. } if message.starts_with("TLS:") && message.contains("client certificate")),
        "{err:?}"
    );

    // A key of another certificate: an error at construction, not a panic in ureq.
    let other = t.pki.client("someone-else");
    let cfg = inline(&other.key_pem);
    let err = KubeClient::new(cfg).unwrap_err().to_string();
    assert!(
        err.starts_with("client certificate client-certificate-data of user \"u\"")
            && err.contains("does not match client key client-key-data of user \"u\""),
        "{err}"
    );
    assert!(!err.contains("PRIVATE"), "{err}");

    // Garbage instead of a key.
    let cfg = inline("not a key");
    let err = KubeClient::new(cfg).unwrap_err().to_string();
    assert!(err.contains("no usable private key"), "{err}");
}

#[test]
fn ca_without_certificates_is_an_error() {
    let t = TlsSetup::new();
    t.write("kube/empty.pem", "nothing here\n");
    let cfg = t
        .resolve(
            "    server: https://127.0.0.1:1\n    certificate-authority: empty.pem",
            "    {}",
        )
        .unwrap();
    let err = KubeClient::new(cfg).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "no certificate found in {}",
            t.dir.path().join("kube/empty.pem").display()
        )
    );
}

#[test]
fn java_client_fixtures_build_clients() {
    // x509: RSA PKCS#1 key and its certificate must pass the rustls pair check. No request
    // is sent (the fixture points at localhost:443).
    let fixture_client = |name: &str| {
        let flags = ConnectionFlags {
            kubeconfig: Some(fixture(name)),
            ..Default::default()
        };
        let cfg = resolve_with(&flags, &|_| None, Path::new("/nonexistent")).unwrap();
        KubeClient::new(cfg).unwrap()
    };
    let client = fixture_client("java-client_kubeconfig-https-x509.yaml");
    assert_eq!(client.server(), "https://localhost:443");

    // tls-server-name + EC CA + token. Never contacted (192.168.1.1 is not ours).
    let client = fixture_client("java-client_kubeconfig-tls-server-name.yaml");
    assert_eq!(client.base_url(), "https://my-cluster.example.com:6443");
    assert_eq!(client.namespace(), "default");
    assert!(!format!("{client:?}").contains("test-token"));
}

#[test]
fn client_is_send_and_sync() {
    fn is<T: Send + Sync>() {}
    is::<KubeClient>();
}

// ------------------------------------------------------------------------------------------
// Exec credential plugins (shell scripts standing in for aws / gke-gcloud-auth-plugin /
// kubelogin).

/// A plugin script in `dir` that counts its runs in `dir/runs`, saves `KUBERNETES_EXEC_INFO`
/// to `dir/info.json`, sleeps the seconds in `dir/sleep` if there is one and prints
/// `dir/outN.json` on its N-th run, else `dir/out.json`.
#[cfg(unix)]
struct Plugin {
    dir: std::path::PathBuf,
    /// The temporary directory `dir`, for a plugin of [`Plugin::temp`].
    _temp: Option<tempfile::TempDir>,
}

#[cfg(unix)]
impl Plugin {
    fn install(dir: &Path) -> Plugin {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join("plugin.sh");
        std::fs::write(
            &p,
            r#"#!/bin/sh
d=$(dirname "$0")
echo run >> "$d/runs"
printf '%s' "$KUBERNETES_EXEC_INFO" > "$d/info.json"
n=$(wc -l < "$d/runs" | tr -d ' ')
if [ -f "$d/sleep" ]; then sleep "$(cat "$d/sleep")"; fi
if [ -f "$d/out$n.json" ]; then cat "$d/out$n.json"; else cat "$d/out.json"; fi
"#,
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        Plugin {
            dir: dir.to_path_buf(),
            _temp: None,
        }
    }

    /// A plugin in a temporary directory of its own, removed with it.
    fn temp() -> Plugin {
        let temp = tempfile::tempdir().unwrap();
        let plugin = Plugin::install(temp.path());
        Plugin {
            _temp: Some(temp),
            ..plugin
        }
    }

    /// Whether every run takes a second (the plugin sleeps while a file says so).
    fn slow(&self, slow: bool) {
        let file = self.dir.join("sleep");
        match slow {
            true => std::fs::write(file, "1").unwrap(),
            false => std::fs::remove_file(file).unwrap(),
        }
    }

    /// Counts runs from zero again.
    fn forget_runs(&self) {
        match std::fs::remove_file(self.dir.join("runs")) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            done => done.unwrap(),
        }
    }

    /// What the plugin prints: on run `n`, or on every run without a file of its own.
    fn set(&self, n: Option<usize>, out: &str) {
        let name = n.map_or("out.json".to_string(), |n| format!("out{n}.json"));
        std::fs::write(self.dir.join(name), out).unwrap();
    }

    /// The plugin's next credential on every run: token `t`, expiring `secs` from now
    /// (negative: already expired).
    fn token_valid_for(&self, secs: i64) {
        let now = std::time::SystemTime::now();
        let at = match secs >= 0 {
            true => now + Duration::from_secs(secs as u64),
            false => now - Duration::from_secs(secs.unsigned_abs()),
        };
        self.set(None, &exec_output(Some("t"), None, Some(at)));
    }

    fn runs(&self) -> usize {
        std::fs::read_to_string(self.dir.join("runs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    fn info(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.dir.join("info.json")).unwrap()).unwrap()
    }

    fn config(&self) -> ExecConfig {
        ExecConfig::new(
            "./plugin.sh",
            &self.dir,
            ExecApiVersion::V1,
            "user \"u\" in kubeconfig /k",
        )
    }
}

#[cfg(unix)]
fn exec_output(
    token: Option<&str>,
    cert: Option<(&str, &str)>,
    expires: Option<std::time::SystemTime>,
) -> String {
    let mut status = serde_json::json!({});
    if let Some(t) = token {
        status["token"] = t.into();
    }
    if let Some((c, k)) = cert {
        status["clientCertificateData"] = c.into();
        status["clientKeyData"] = k.into();
    }
    if let Some(e) = expires {
        status["expirationTimestamp"] = humantime::format_rfc3339_millis(e).to_string().into();
    }
    serde_json::json!({"apiVersion": EXEC_API_V1, "kind": "ExecCredential", "status": status})
        .to_string()
}

#[cfg(unix)]
fn exec_client(server: &FakeServer, plugin: &Plugin) -> Result<KubeClient, KubeError> {
    exec_client_with(server, plugin, fast_options())
}

/// [`exec_client`] with `options`.
#[cfg(unix)]
fn exec_client_with(
    server: &FakeServer,
    plugin: &Plugin,
    options: ClientOptions,
) -> Result<KubeClient, KubeError> {
    let mut cfg = ClusterConfig::for_server(&server.url(), "spark");
    cfg.credential = Credential::Exec(Box::new(plugin.config()));
    KubeClient::with_options(cfg, options)
}

#[cfg(unix)]
fn bearer_only(good: &'static str) -> FakeServer {
    FakeServer::http(move |req, _| {
        if req.header("authorization") != Some(&*format!("Bearer {good}")) {
            Reply::json(
                401,
                r#"{"kind":"Status","message":"Unauthorized","reason":"Unauthorized","code":401}"#,
            )
        } else if req.path().ends_with("/pods") {
            Reply::json(200, &page(&["a"], None))
        } else {
            Reply::json(200, r#"{"kind":"Pod","metadata":{"name":"a"}}"#)
        }
    })
}

/// A server taking bearer token `t`, a plugin whose credential is valid for `secs`, a
/// client that ran it and a client derived from that one (the Lease's).
#[cfg(unix)]
fn exec_client_and_derived(secs: i64) -> (FakeServer, Plugin, KubeClient, KubeClient) {
    let server = bearer_only("t");
    let plugin = Plugin::temp();
    plugin.token_valid_for(secs);
    let client = exec_client(&server, &plugin).unwrap();
    let derived = client.derive(fast_options()).unwrap();
    (server, plugin, client, derived)
}

#[cfg(unix)]
#[test]
fn exec_token_is_cached_and_rerun_once_after_401() {
    let server = bearer_only("exec-good");
    let plugin = Plugin::temp();
    plugin.set(None, &exec_output(Some("exec-good"), None, None));

    // Run once when the client is built, then cached (no expiry) across calls.
    let client = exec_client(&server, &plugin).unwrap();
    assert_eq!(plugin.runs(), 1);
    for _ in 0..3 {
        client.api(&PODS).list_items(&lp(None, None)).unwrap();
    }
    assert_eq!(plugin.runs(), 1);
    assert_eq!(client.stats().exec_runs, 1);
    assert_eq!(
        plugin.info(),
        serde_json::json!({"apiVersion": EXEC_API_V1, "kind": "ExecCredential",
                           "spec": {"interactive": false}})
    );
    let dbg = format!("{client:?}");
    assert!(
        !dbg.contains("exec-good") && dbg.contains("exec plugin \\\"./plugin.sh\\\""),
        "{dbg}"
    );

    // A wrong token first: one 401, one re-run, then success.
    plugin.forget_runs();
    plugin.set(Some(1), &exec_output(Some("exec-stale"), None, None));
    let before = server.recorded().len();
    let client = exec_client(&server, &plugin).unwrap();
    let (items, _) = client.api(&PODS).list_items(&lp(None, None)).unwrap();
    assert_eq!(names(&items), ["a"]);
    assert_eq!(plugin.runs(), 2);
    let auth: Vec<_> = server.recorded()[before..]
        .iter()
        .map(|r| r.header("authorization").unwrap().to_string())
        .collect();
    assert_eq!(auth, ["Bearer exec-stale", "Bearer exec-good"]);
    assert_eq!((client.stats().retries, client.stats().exec_runs), (1, 2));

    // Always rejected: Auth naming the plugin and the user, after exactly one re-run.
    plugin.forget_runs();
    plugin.set(None, &exec_output(Some("exec-never"), None, None));
    let before = server.recorded().len();
    let client = exec_client(&server, &plugin).unwrap();
    let err = client.api(&PODS).get("x").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, KubeError::Auth(_)));
    assert!(
        msg.starts_with(
            "the credential from exec plugin \"./plugin.sh\" (user \"u\" in kubeconfig /k) was \
             rejected (401 Unauthorized), also after re-running the plugin"
        ),
        "{msg}"
    );
    assert!(!msg.contains("exec-never"));
    assert_eq!(plugin.runs(), 2);
    assert_eq!(server.recorded().len() - before, 2);
}

#[cfg(unix)]
#[test]
fn exec_credential_is_renewed_before_it_expires() {
    let server = bearer_only("t");
    let plugin = Plugin::temp();
    let valid_for = |secs: i64| plugin.token_valid_for(secs);
    // A new client, its first credential valid for `secs`, with runs counted from zero.
    let client_valid_for = |secs: i64| {
        plugin.forget_runs();
        valid_for(secs);
        exec_client(&server, &plugin).unwrap()
    };
    let started = |c: &KubeClient| c.stats().exec_runs;

    // Valid for an hour: one run for many calls.
    let client = client_valid_for(3600);
    client.api(&PODS).get("x").unwrap();
    client.api(&PODS).get("x").unwrap();
    assert_eq!(plugin.runs(), 1);

    // Valid for 2 s: reused at once, due for renewal after half its lifetime (1 s, less
    // than the 10 s leeway). The request that finds it due starts the plugin and goes with
    // the credential it has; a later one takes the new credential, which then serves
    // past the old one's expiry without another run.
    let client = client_valid_for(2);
    client.api(&PODS).get("x").unwrap();
    assert_eq!(started(&client), 1);
    std::thread::sleep(Duration::from_millis(1300));
    valid_for(3600);
    client.api(&PODS).get("x").unwrap();
    assert_eq!(started(&client), 2, "the renewal is started");
    std::thread::sleep(Duration::from_millis(400));
    client.api(&PODS).get("x").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    client.api(&PODS).get("x").unwrap();
    assert_eq!((plugin.runs(), started(&client)), (2, 2));

    // Renewal fails before the credential has expired: the old one serves until it expires,
    // then the plugin is waited for, and its failure is the error.
    let client = client_valid_for(2);
    plugin.set(None, "not a credential");
    std::thread::sleep(Duration::from_millis(1300));
    client.api(&PODS).get("x").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    client.api(&PODS).get("x").unwrap();
    assert_eq!(plugin.runs(), 2, "not tried again at once");
    std::thread::sleep(Duration::from_millis(600));
    let err = client.api(&PODS).get("x").unwrap_err();
    assert!(
        matches!(&err, KubeError::Auth(m) if m.contains("not JSON")),
        "{err}"
    );
    assert_eq!(plugin.runs(), 3);

    // Already expired when returned: run again for every call.
    let client = client_valid_for(-5);
    client.api(&PODS).get("x").unwrap();
    client.api(&PODS).get("x").unwrap();
    assert_eq!(plugin.runs(), 3);
    assert_eq!(server.recorded().len(), 10);
}

/// A slow renewal never holds a request up: the plugin runs in the background of the
/// requests made with the credential it renews, and a derived client (the Lease's) shares
/// that credential and that run, never a plugin run of its own.
#[cfg(unix)]
#[test]
fn a_slow_renewal_runs_beside_the_requests_and_is_shared_with_derived_clients() {
    let (_server, plugin, client, derived) = exec_client_and_derived(4);
    assert_eq!(
        plugin.runs(),
        1,
        "the derived client takes the credential held"
    );
    std::thread::sleep(Duration::from_millis(2300));
    plugin.token_valid_for(3600);
    plugin.slow(true);
    let t = Instant::now();
    derived.api(&PODS).get("x").unwrap();
    client.api(&PODS).get("x").unwrap();
    derived.api(&PODS).get("x").unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(800),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(
        derived.stats().exec_runs,
        1,
        "the derived client started it"
    );
    assert_eq!(client.stats().exec_runs, 1, "and the other did not");
    std::thread::sleep(Duration::from_millis(1500));
    plugin.slow(false);
    client.api(&PODS).get("x").unwrap();
    derived.api(&PODS).get("x").unwrap();
    assert_eq!(plugin.runs(), 2, "one renewal for both");
    // Past the first credential's expiry, the renewed one serves both.
    std::thread::sleep(Duration::from_millis(400));
    client.api(&PODS).get("x").unwrap();
    derived.api(&PODS).get("x").unwrap();
    assert_eq!(plugin.runs(), 2);
}

/// When a plugin must be waited for (the credential has expired), the hook between
/// requests runs every 50 ms (the loop answers its probes and renews its Lease), and a
/// request it makes meanwhile never runs a plugin of its own nor waits: it fails at once,
/// for the derived client sharing the credential as for the client itself.
#[cfg(unix)]
#[test]
fn a_plugin_waited_for_runs_the_hook_and_nested_requests_run_no_plugin() {
    use std::sync::{Mutex, OnceLock};
    let (_server, plugin, client, derived) = exec_client_and_derived(1);
    let derived = Arc::new(derived);
    let calls = Arc::new(AtomicUsize::new(0));
    let nested: Arc<Mutex<Vec<String>>> = Arc::default();
    let own: Arc<OnceLock<KubeClient>> = Arc::default();
    let (c, n, o, d) = (
        Arc::clone(&calls),
        Arc::clone(&nested),
        Arc::clone(&own),
        Arc::clone(&derived),
    );
    client.set_between_requests(Arc::new(move |_| {
        if c.fetch_add(1, Ordering::SeqCst) == 3 {
            let mut n = n.lock().unwrap();
            n.push(format!("{:?}", d.api(&PODS).get("x").map(|_| ())));
            let me = o.get().unwrap();
            n.push(format!("{:?}", me.api(&PODS).get("x").map(|_| ())));
        }
        true
    }));
    let _ = own.set(client.in_namespace("spark"));
    std::thread::sleep(Duration::from_millis(1100));
    plugin.token_valid_for(3600);
    plugin.slow(true);
    plugin.forget_runs();
    let t = Instant::now();
    client.api(&PODS).get("x").unwrap();
    assert!(t.elapsed() >= Duration::from_secs(1));
    assert_eq!(plugin.runs(), 1, "one run: none nested");
    assert!(calls.load(Ordering::SeqCst) >= 10, "{calls:?}");
    let nested = nested.lock().unwrap().clone();
    assert_eq!(nested.len(), 2, "{nested:?}");
    for line in &nested {
        assert!(
            line.contains("is running for another request, and its credential is being renewed"),
            "{nested:?}"
        );
    }
    plugin.slow(false);
    derived.api(&PODS).get("x").unwrap();
    assert_eq!(
        plugin.runs(),
        1,
        "the derived client has the renewed credential"
    );
}

/// A plugin waited for (no valid credential) is waited for at most the request's timeout
/// (a Lease client's is its renew deadline): then the request fails as a timeout, unsent,
/// the plugin goes on, and a later request takes its credential without another run.
#[cfg(unix)]
#[test]
fn a_plugin_waited_for_is_waited_at_most_the_request_timeout() {
    let (server, plugin, client, _) = exec_client_and_derived(1);
    let mut quick = fast_options();
    quick.timeouts.global = Duration::from_millis(300);
    let derived = client.derive(quick).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    plugin.token_valid_for(3600);
    plugin.slow(true);
    plugin.forget_runs();
    let sent = server.recorded().len();
    let t = Instant::now();
    let err = derived.api(&PODS).get("x").unwrap_err();
    let took = t.elapsed();
    assert!(err.is_timeout() && err.is_retryable(), "{err:?}");
    assert!(
        err.to_string()
            .contains("within this request's timeout of 300ms"),
        "{err}"
    );
    assert!(took < Duration::from_millis(800), "{took:?}");
    assert_eq!(server.recorded().len(), sent, "nothing sent");
    std::thread::sleep(Duration::from_millis(1200));
    plugin.slow(false);
    client.api(&PODS).get("x").unwrap();
    derived.api(&PODS).get("x").unwrap();
    assert_eq!(plugin.runs(), 1, "the run that went on served both");
}

/// The first credential, with none ever held (nothing led or sent yet), is waited for as
/// long as the plugin may run, past the request's timeout: a start fails only when the
/// plugin does.
#[cfg(unix)]
#[test]
fn the_first_credential_is_waited_for_past_the_request_timeout() {
    let server = bearer_only("t");
    let plugin = Plugin::temp();
    plugin.token_valid_for(3600);
    plugin.slow(true);
    let mut quick = fast_options();
    quick.timeouts.global = Duration::from_millis(300);
    let t = Instant::now();
    let client = exec_client_with(&server, &plugin, quick).unwrap();
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    client.api(&PODS).get("x").unwrap();
    assert_eq!(plugin.runs(), 1);
}

#[cfg(unix)]
#[test]
fn exec_failures_surface_at_construction_and_later() {
    let server = bearer_only("t");
    let plugin = Plugin::temp();
    plugin.set(None, "{\"not\": \"a credential\", \"token\": \"zzz\"}");
    let err = exec_client(&server, &plugin).unwrap_err();
    assert!(
        matches!(&err, KubeError::Auth(m) if m.contains("without apiVersion") && !m.contains("zzz")),
        "{err}"
    );

    // Good at first, failing when re-run after a 401: the plugin's failure is the error.
    plugin.forget_runs();
    plugin.set(Some(1), &exec_output(Some("wrong"), None, None));
    let client = exec_client(&server, &plugin).unwrap();
    let err = client.api(&PODS).get("x").unwrap_err();
    assert!(
        matches!(&err, KubeError::Auth(m) if m.contains("./plugin.sh") && m.contains("without apiVersion")),
        "{err}"
    );
    assert_eq!(
        server.recorded().len(),
        1,
        "no request without a credential"
    );
}

#[cfg(unix)]
#[test]
fn exec_client_certificate_with_mtls_and_rotation() {
    use std::time::SystemTime;
    let t = TlsSetup::new();
    let server = t.serve(&["127.0.0.1"], true);
    let plugin = Plugin::install(&t.dir.path().join("kube"));
    let good = t.pki.client("exec-user");
    let stranger = Pki::new("other-ca").client("exec-user");
    let cluster = format!(
        "    server: https://{}\n    certificate-authority-data: {}\n    tls-server-name: 127.0.0.1",
        server.addr,
        b64(&t.pki.ca_pem)
    );
    let user = "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: ./plugin.sh\n      interactiveMode: Never\n      provideClusterInfo: true";

    // A certificate the server does not trust, valid for 1.5 s; then a good one.
    plugin.set(
        Some(1),
        &exec_output(
            None,
            Some((&stranger.cert_pem, &stranger.key_pem)),
            Some(SystemTime::now() + Duration::from_millis(1500)),
        ),
    );
    plugin.set(
        None,
        &exec_output(None, Some((&good.cert_pem, &good.key_pem)), None),
    );
    let cfg = t.resolve(&cluster, user).unwrap();
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    let err = client.api(&PODS).get("x").unwrap_err();
    assert!(
        matches!(&err, KubeError::Transport { kind: TransportKind::Tls, message, .. } if message.starts_with("TLS:")),
        "{err:?}"
    );
    assert_eq!(plugin.runs(), 1);
    // spec.cluster carries the server, its CA (base64) and tls-server-name.
    assert_eq!(
        plugin.info()["spec"]["cluster"],
        serde_json::json!({"server": format!("https://{}", server.addr),
                           "tls-server-name": "127.0.0.1",
                           "certificate-authority-data": b64(&t.pki.ca_pem)})
    );
    std::thread::sleep(Duration::from_millis(1600));
    // Renewed once expired: the agent is rebuilt with the new certificate, and a client
    // derived from this one presents it too, without a run of its own.
    let (items, _) = client.api(&PODS).list_items(&lp(None, None)).unwrap();
    assert_eq!(names(&items), ["tls-pod"]);
    client.api(&PODS).get("y").unwrap();
    assert_eq!(plugin.runs(), 2);
    let derived = client.derive(fast_options()).unwrap();
    derived.api(&PODS).get("y").unwrap();
    assert_eq!(plugin.runs(), 2);
    assert_eq!(server.recorded()[0].header("authorization"), None);
    assert!(!format!("{client:?}").contains("PRIVATE KEY"));

    // A key that does not belong to the certificate: an Auth error, not a panic in ureq.
    plugin.forget_runs();
    std::fs::remove_file(t.dir.path().join("kube/out1.json")).unwrap();
    plugin.set(
        None,
        &exec_output(Some("t"), Some((&good.cert_pem, &stranger.key_pem)), None),
    );
    let cfg = t.resolve(&cluster, user).unwrap();
    let err = KubeClient::with_options(cfg, fast_options()).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, KubeError::Auth(_))
            && msg.contains("returned a client certificate that cannot be used")
            && msg.contains("does not match"),
        "{msg}"
    );
    assert!(!msg.contains("PRIVATE KEY"), "{msg}");
}

#[test]
fn a_retry_after_longer_than_the_budget_says_what_the_server_asked() {
    let server = FakeServer::http(|_, _| {
        Reply::json(
            429,
            r#"{"kind":"Status","message":"slow down","reason":"TooManyRequests","code":429}"#,
        )
        .with_header("Retry-After", "100000")
    });
    let client = http_client(&server);
    let started = Instant::now();
    let err = client.api(&PODS).get("p").unwrap_err();
    assert_eq!(err.status_code(), Some(429));
    assert!(started.elapsed() < Duration::from_secs(2), "no sleep");
    assert_eq!(server.recorded().len(), 1, "not retried");
    assert_eq!(client.stats().retry_sleep, Duration::ZERO);
}

#[test]
fn a_redirect_names_its_location_and_the_server_flag() {
    let server = FakeServer::http(|_, _| {
        Reply::json(307, "").with_header("Location", "https://login.example.com/sso")
    });
    let client = http_client(&server);
    let err = client.api(&PODS).list_items(&lp(None, None)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "list pods: 307 Redirect: the API server redirected to https://login.example.com/sso; \
         podalloc does not follow redirects: check --server"
    );
    assert_eq!(server.recorded().len(), 1, "not followed");
}

#[test]
fn a_2xx_body_without_the_expected_kind_is_an_error_naming_the_server() {
    for (body, says) in [
        ("{}", "a body without kind, not a Pod"),
        (
            r#"{"kind":"Status","status":"Success"}"#,
            "a Status, not a Pod",
        ),
        (
            "<html><body>Proxy login</body></html>",
            "a body that is not JSON",
        ),
    ] {
        let server = FakeServer::http(move |_, _| Reply::json(200, body));
        let client = http_client(&server);
        let err = client.api(&PODS).get("p").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, KubeError::Decode { .. }), "{msg}");
        assert!(msg.contains(&server.url()), "{msg}");
        assert!(msg.contains(says), "{msg}");
        assert!(
            msg.contains(&format!("{:?}", &body[..body.len().min(80)])),
            "{msg}"
        );
        let err = create_err(&client, "p");
        assert!(err.to_string().contains(says), "{err}");
        let err = client.api(&CONFIG_MAPS).get("c").unwrap_err();
        assert!(
            err.to_string().contains(&says.replace("Pod", "ConfigMap")),
            "{err}"
        );
    }
}

#[test]
fn a_call_ends_by_the_request_timeout_even_when_the_body_trickles() {
    // Headers at once, then one byte of body every 200 ms: no single read times out.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut tcp) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = std::io::Read::read(&mut tcp, &mut buf);
                let body = br#"{"kind":"Pod","metadata":{"name":"p"}}"#;
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let _ = tcp.write_all(head.as_bytes());
                for b in body {
                    if tcp.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
        }
    });
    let cfg = ClusterConfig::for_server(&format!("http://{addr}"), "spark");
    let opts = ClientOptions {
        timeouts: Timeouts {
            connect: Duration::from_secs(1),
            per_read: Duration::from_secs(5),
            global: Duration::from_millis(1500),
        },
        retry: fast_retries(),
        ..ClientOptions::default()
    };
    let client = KubeClient::with_options(cfg, opts).unwrap();
    let started = Instant::now();
    let err = client.api(&PODS).get("p").unwrap_err();
    let took = started.elapsed();
    assert!(err.is_timeout(), "{err}");
    assert!(
        err.to_string()
            .contains("within the request timeout of 1s 500ms (--request-timeout)"),
        "{err}"
    );
    assert!(took < Duration::from_millis(2500), "{took:?}");
    // An outer deadline (the tick budget) cuts a call shorter still, and a call after it
    // fails at once.
    client.set_deadline(
        Some(Instant::now() + Duration::from_millis(300)),
        "the tick budget",
    );
    let started = Instant::now();
    let err = client.api(&PODS).get("p").unwrap_err();
    assert!(err.to_string().contains("within the tick budget"), "{err}");
    assert!(started.elapsed() < Duration::from_millis(1000));
    let err = client.api(&PODS).get("p").unwrap_err();
    assert!(err.to_string().contains("within the tick budget"), "{err}");
}

#[test]
fn a_gzip_bomb_stops_at_the_page_cap() {
    // 96 MiB of blanks inside a PodList, about 100 KiB gzipped.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(br#"{"kind":"PodList","items":["#).unwrap();
    let blanks = vec![b' '; 1024 * 1024];
    for _ in 0..96 {
        gz.write_all(&blanks).unwrap();
    }
    gz.write_all(b"]}").unwrap();
    let gz = gz.finish().unwrap();
    assert!(gz.len() < 2 * 1024 * 1024, "{}", gz.len());
    let server = FakeServer::http(move |_, _| Reply::Respond {
        status: 200,
        headers: vec![
            ("Content-Type".into(), "application/json".into()),
            ("Content-Encoding".into(), "gzip".into()),
        ],
        body: gz.clone(),
    });
    let mut cfg = ClusterConfig::for_server(&server.url(), "spark");
    cfg.credential = Credential::None;
    // The default cap (64 MiB) applies.
    let client = KubeClient::with_options(
        cfg,
        ClientOptions {
            retry: fast_retries(),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    let err = client.api(&PODS).list_items(&lp(None, None)).unwrap_err();
    assert!(
        err.to_string()
            .contains("larger than the cap of 67108864 bytes (64 MiB) after gzip decoding"),
        "{err}"
    );
    assert!(client.stats().bytes_received < 128 * 1024 * 1024);
}

/// A sink that decodes while the body arrives (as podalloc's snapshot does), counting what
/// the client handed it.
#[derive(Default)]
struct StreamSink {
    snap: crate::engine::snapshot::Snapshot,
    read_errors: usize,
}

impl StreamSink {
    /// The executor ids read, in order.
    fn ids(&self) -> Vec<u64> {
        self.snap.executors.keys().copied().collect()
    }
}

impl PageSink for StreamSink {
    type Error = KubeError;

    fn bounded_memory(&self) -> bool {
        true
    }

    fn restart(&mut self) {
        self.snap = crate::engine::snapshot::Snapshot::default();
    }

    fn page(&mut self, _: &[u8]) -> Result<Option<String>, KubeError> {
        unreachable!("a streaming sink is handed readers")
    }

    fn page_reader(&mut self, body: &mut dyn std::io::Read) -> Result<Option<String>, KubeError> {
        let r = (self.snap).read_page(body, crate::engine::snapshot::For::app("app"));
        r.map_err(|e| {
            if matches!(e, crate::engine::snapshot::SnapshotError::Read(_)) {
                self.read_errors += 1;
            }
            KubeError::Decode {
                what: "sink".into(),
                message: e.to_string(),
            }
        })
    }
}

fn executor_page(ids: &[u32], cont: Option<&str>) -> String {
    let items: Vec<String> = ids
        .iter()
        .map(|i| {
            format!(
                r#"{{"metadata":{{"name":"app-exec-{i}","labels":{{"spark-app-selector":"app","spark-role":"executor","spark-exec-id":"{i}"}}}},"status":{{"phase":"Running"}}}}"#
            )
        })
        .collect();
    let meta = cont.map_or(String::new(), |c| format!(r#""continue":"{c}""#));
    format!(
        r#"{{"kind":"PodList","metadata":{{{meta}}},"items":[{}]}}"#,
        items.join(",")
    )
}

/// A page decoded while it arrives is capped at `streamed_list_body_limit`, not at the
/// cap of pages held whole: a server that ignores `limit` and sends every pod at once is
/// read, with memory flat.
#[test]
fn a_streaming_sink_gets_the_streamed_cap() {
    let ids: Vec<u32> = (1..=400).collect();
    let body = executor_page(&ids, None);
    let len = body.len() as u64;
    let server = FakeServer::http(move |_, _| Reply::json(200, &body));
    let mut cfg = ClusterConfig::for_server(&server.url(), "spark");
    cfg.credential = Credential::None;
    let options = |streamed| ClientOptions {
        list_body_limit: len / 2,
        streamed_list_body_limit: streamed,
        ..fast_options()
    };
    let client = KubeClient::with_options(cfg.clone(), options(len)).unwrap();
    let mut sink = StreamSink::default();
    client.api(&PODS).list(&lp(None, None), &mut sink).unwrap();
    assert_eq!(sink.snap.executors.len(), 400);
    // The held-whole cap still applies to other sinks.
    let err = client.api(&PODS).list_items(&lp(None, None)).unwrap_err();
    assert!(err.to_string().contains("larger than the cap"), "{err}");
    // And the streamed cap to this one, named in the error.
    let client = KubeClient::with_options(cfg, options(len - 1)).unwrap();
    let err = client
        .api(&PODS)
        .list(&lp(None, None), &mut sink)
        .unwrap_err();
    let cap = format!("cap of {} bytes", len - 1);
    assert!(err.to_string().contains(&cap), "{err}");
    assert_eq!(
        ClientOptions::default().streamed_list_body_limit,
        4 * 1024 * 1024 * 1024
    );
}

/// Pages go to the sink as readers (gzip decoded on the way), counted in the stats; a body
/// that cannot be read (bad gzip) is the client's error, and the page adds nothing.
#[test]
fn list_streams_pages_to_the_sink() {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(executor_page(&[3, 4], None).as_bytes())
        .unwrap();
    let gz = gz.finish().unwrap();
    let first = executor_page(&[1, 2], Some("t1"));
    let first_len = first.len() as u64;
    let (gz2, cut) = (gz.clone(), gz[..gz.len() / 2].to_vec());
    let broken = Arc::new(AtomicUsize::new(0));
    let b2 = Arc::clone(&broken);
    let server = FakeServer::http(move |req, _| match req.query("continue") {
        None => Reply::json(200, &first),
        Some(_) => Reply::Respond {
            status: 200,
            headers: vec![("Content-Encoding".into(), "gzip".into())],
            body: if b2.load(Ordering::SeqCst) > 0 {
                cut.clone()
            } else {
                gz2.clone()
            },
        },
    });
    let client = http_client(&server);
    // A list, two to a page, into a new sink.
    let stream = || {
        let mut sink = StreamSink::default();
        let listed = client.api(&PODS).list(&lp(None, Some(2)), &mut sink);
        (sink, listed)
    };
    let (sink, listed) = stream();
    let stats = listed.unwrap();
    assert_eq!(sink.ids(), [1, 2, 3, 4]);
    assert_eq!(stats.pages, 2);
    assert_eq!(
        stats.bytes,
        first_len + executor_page(&[3, 4], None).len() as u64
    );
    assert_eq!(client.stats().bytes_received, stats.bytes);

    broken.store(1, Ordering::SeqCst);
    let (sink, listed) = stream();
    let err = listed.unwrap_err();
    assert!(
        matches!(&err, KubeError::Decode { message, .. } if message.contains("gzip")),
        "{err}"
    );
    assert_eq!(sink.read_errors, 1);
    assert_eq!(sink.ids(), [1, 2]);
}

#[test]
fn a_lost_lease_fences_writes_but_not_reads_or_lease_calls() {
    let server = FakeServer::http(|req, _| match req.path() {
        p if p.contains("/leases/") => Reply::json(200, r#"{"kind":"Lease"}"#),
        _ => Reply::json(200, r#"{"kind":"Pod"}"#),
    });
    let client = http_client(&server);
    client.set_write_fence(Arc::new(|| false));
    assert_fenced(&create_err(&client, "p"));
    assert_eq!(
        client
            .api(&PODS)
            .delete("p", None)
            .unwrap_err()
            .status_code(),
        None,
        "refused before it was sent"
    );
    assert!(client.api(&PODS).get("p").unwrap().is_some());
    let lease = serde_json::json!({"kind": "Lease", "metadata": {"name": "l"}});
    assert!(client.api(&LEASES).replace("l", &lease).is_ok());
    let sent: Vec<_> = (server.recorded().iter())
        .map(|r| format!("{} {}", r.method, r.path()))
        .collect();
    assert_eq!(
        sent,
        [
            "GET /api/v1/namespaces/spark/pods/p",
            "PUT /apis/coordination.k8s.io/v1/namespaces/spark/leases/l"
        ]
    );
}

/// A write allowed when its call began is fenced again once its credential is there:
/// leadership lost while the plugin ran (the hook saw the Lease go) means it is never sent.
#[cfg(unix)]
#[test]
fn a_write_is_fenced_again_after_waiting_for_its_credential() {
    let (server, plugin, client, _) = exec_client_and_derived(1);
    // The hook's first call comes before the credential is asked for, later ones from the
    // wait for the plugin: this process leads until the wait has begun.
    let hooks = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&hooks);
    client.set_write_fence(Arc::new(move || seen.load(Ordering::SeqCst) < 2));
    let counter = Arc::clone(&hooks);
    client.set_between_requests(Arc::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        true
    }));
    std::thread::sleep(Duration::from_millis(1100));
    plugin.token_valid_for(3600);
    plugin.slow(true);
    let sent = server.recorded().len();
    assert_fenced(&create_err(&client, "p"));
    assert!(
        hooks.load(Ordering::SeqCst) >= 2,
        "the hook ran during the wait"
    );
    assert_eq!(server.recorded().len(), sent, "nothing sent");
}

/// A CONNECT proxy on 127.0.0.1 relaying to `to` whatever target is asked; the first line of
/// each CONNECT request goes to `lines`.
fn connect_proxy(to: std::net::SocketAddr, lines: Arc<std::sync::Mutex<Vec<String>>>) -> u16 {
    use std::io::{BufRead as _, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let lines = Arc::clone(&lines);
            std::thread::spawn(move || {
                let mut head = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                head.read_line(&mut line).unwrap();
                lines.lock().unwrap().push(line.trim_end().to_string());
                while head.read_line(&mut line).unwrap() > 0 && !line.ends_with("\r\n\r\n") {}
                let server = std::net::TcpStream::connect(to).unwrap();
                let mut down = conn.try_clone().unwrap();
                down.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .unwrap();
                let mut up = server.try_clone().unwrap();
                std::thread::spawn(move || std::io::copy(&mut head, &mut up));
                let _ = std::io::copy(&mut &server, &mut down);
            });
        }
    });
    port
}

/// A CONNECT proxy given by name is looked up when the connection is made
/// (`kube/resolver.rs` `Dialer`), and the server's name, which the proxy connects to, is not
/// looked up at all (`.invalid` has no address).
#[test]
fn a_connect_proxy_given_by_name_is_looked_up_and_the_servers_name_is_not() {
    let server = FakeServer::http(|_, _| Reply::json(200, &page(&["a"], None)));
    let lines = Arc::default();
    let proxy = connect_proxy(server.addr, Arc::clone(&lines));
    let target = format!("apiserver.invalid:{}", server.addr.port());
    let mut cfg = ClusterConfig::for_server(&format!("http://{target}"), "spark");
    cfg.allow_insecure_http = true;
    cfg.proxy_url = Some(ProxyUrl(format!("http://localhost:{proxy}")));
    let client = KubeClient::with_options(cfg, fast_options()).unwrap();
    for _ in 0..2 {
        let (items, _) = client.api(&PODS).list_items(&lp(None, None)).unwrap();
        assert_eq!(names(&items), ["a"]);
    }
    // Both lists on one connection: one CONNECT.
    assert_eq!(
        *lines.lock().unwrap(),
        [format!("CONNECT {target} HTTP/1.1")]
    );
}
