//! Failures that do not go away (issue 31): refused creates back off instead of repeating
//! every tick, quote the server, and burn no executor id; each refusal is named for what it
//! is. On both servers where the server is the subject (`both!`), on kube-apiserver alone
//! where only it has the feature (Pod Security admission).

use crate::both::{both, Env, Pods};
use crate::util::stderr;
use serde_json::json;

/// A template kube-apiserver cannot decode (`cpu: one` is no quantity): every create is a
/// 400 `BadRequest`.
const BAD_QUANTITY: &str = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: executor\n    image: img\n    resources:\n      requests:\n        cpu: one\n";

/// The pod creates podalloc sent (every code), from its own `--metrics-file`.
fn creates_sent(metrics: &str) -> u64 {
    let text = std::fs::read_to_string(metrics).unwrap();
    (text.lines())
        .filter(|l| l.starts_with("podalloc_api_requests_total{verb=\"create\",resource=\"pods\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// `run --interval 1s` for 20 s against a server that refuses every create: at most 15
/// creates reach it (issue 31's bound; the back-off makes it 2 or 3: at 0 s, 10 s and 30 s),
/// the log quotes its reason, and no executor id is used up.
fn twenty_seconds_of_refusals(e: &Env, flags: &[&str], quote: &str) -> String {
    let metrics = e.dir.path().join("metrics.prom");
    let metrics = metrics.to_str().unwrap();
    let mut args = flags.to_vec();
    args.extend([
        "--metrics-file",
        metrics,
        "run",
        "--target",
        "3",
        "--interval",
        "1s",
        "--timeout",
        "20s",
    ]);
    let started = std::time::Instant::now();
    let err = e.exits(&args, 0);
    assert!(started.elapsed().as_secs() >= 19, "{err}");
    let sent = creates_sent(metrics);
    assert!((1..=15).contains(&sent), "{sent} creates in 20 s: {err}");
    assert!(
        sent <= 3,
        "the back-off allows 2 or 3 creates in 20 s, not {sent}: {err}"
    );
    assert!(err.contains(quote), "the server's reason is quoted: {err}");
    assert!(
        err.contains("pod creation refused by the API server"),
        "one line says creates back off: {err}"
    );
    // An RBAC refusal reads "RBAC: user … may not VERB RESOURCE: grant …"; an admission
    // refusal's hint says "not by RBAC".
    assert!(
        !err.replace("not by RBAC:", "").contains("RBAC:") && !err.contains("grant"),
        "never called RBAC: {err}"
    );
    assert!(e.live().is_empty());
    let st = e.state();
    assert_eq!(
        st["last_executor_id"], 0,
        "refused creates burn no id: {st}"
    );
    assert_eq!(st["create_backoff"]["cause"], "refused", "{st}");
    let text = std::fs::read_to_string(metrics).unwrap();
    assert!(
        text.contains("podalloc_create_backoff_refusals{") && text.contains("cause=\"refused\""),
        "{text}"
    );
    err
}

both!(
    a_template_the_server_refuses_backs_off_and_burns_no_id,
    "refused",
    Pods::default(),
    |e| {
        let t = &e.template(BAD_QUANTITY);
        let quote = "quantities must match the regular expression";
        let err = twenty_seconds_of_refusals(e, &["--template", t], quote);
        assert!(err.contains("fix the pod template"), "{err}");
        // A one-shot command says it with exit 4, after the back-off has passed.
        let st = e.state();
        let wait = st["create_backoff"]["until_ms"].as_u64().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        std::thread::sleep(std::time::Duration::from_millis(
            wait.saturating_sub(now) + 100,
        ));
        let err = e.exits(&["--template", t, "reconcile"], 4);
        assert!(
            err.contains("fix the pod template") && err.contains(quote),
            "{err}"
        );
        let st = e.state();
        assert_eq!(st["last_executor_id"], 0, "{st}");
        assert_eq!(st["create_backoff"]["refusals"], 3, "{st}");
    }
);

/// Pod Security admission ("restricted") refuses the plain executor pod: named as Pod
/// Security, never as RBAC; creates back off. kube-apiserver only: the simulator has no
/// Pod Security admission (tests/real/README.md).
#[test]
fn pod_security_restricted_backs_off_and_is_named() {
    let Some(e) = Env::real("psa", "psa", &Pods::default()) else {
        return;
    };
    let label = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    let (code, body) = e.admin(
        "PATCH",
        &format!("/api/v1/namespaces/{}", e.ns),
        Some(&label),
    );
    assert_eq!(code, 200, "{body}");
    let err = twenty_seconds_of_refusals(&e, &[], "violates PodSecurity \"restricted:latest\"");
    assert!(
        err.contains("Pod Security \"restricted:latest\""),
        "names the policy: {err}"
    );
    let out = e.run(&["reconcile"]);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "backing off, not yet asking: {err}"
    );
}
