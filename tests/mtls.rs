//! Client-certificate authentication (mutual TLS) against the simulator: from flags and from a
//! kubeconfig's *-data fields; refused without a certificate; keys never printed.

use crate::util::{stderr, SimWorld, World};
use base64::Engine as _;
use std::process::Command;
use std::time::Duration;

fn world() -> World {
    SimWorld::new()
        .app("mtls-app")
        .batch_delay("100ms")
        .token("unused-token")
        .startup(Duration::from_millis(100))
        .options(|o| o.require_client_cert = true)
        .start()
}

/// podalloc with trace logging (so that a leaked key would show) and no connection flags.
fn base(w: &World) -> Command {
    let mut c = w.bare();
    c.args(["--log-level", "trace"]);
    c
}

/// Writes a client certificate and key into the directory as `client.crt`/`client.key`.
fn write_client_cert(w: &World, cert: &str, key: &str) {
    std::fs::write(w.path("client.crt"), cert).unwrap();
    std::fs::write(w.path("client.key"), key).unwrap();
}

/// `base` with the server, its CA and the client certificate flags.
fn with_client_cert(w: &World) -> Command {
    let mut c = base(w);
    c.args(["--server", &w.sim.url()])
        .arg("--certificate-authority")
        .arg(&w.ca)
        .arg("--client-certificate")
        .arg(w.path("client.crt"))
        .arg("--client-key")
        .arg(w.path("client.key"));
    c
}

#[test]
fn client_certificate_flags_authenticate() {
    let w = world();
    let (cert, key) = w.sim.generate_client_cert("podalloc");
    write_client_cert(&w, &cert, &key);
    let out = with_client_cert(&w)
        .args([
            "run",
            "--target",
            "3",
            "--until-converged",
            "--timeout",
            "30s",
        ])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(w.sim.stats().live_pods, 3);
    let key_body = key.lines().nth(1).unwrap();
    assert!(
        !err.contains(key_body) && !err.contains("PRIVATE KEY"),
        "the client key leaked"
    );
}

#[test]
fn kubeconfig_client_certificate_data_authenticates() {
    let w = world();
    let (cert, key) = w.sim.generate_client_cert("podalloc");
    let b64 = base64::engine::general_purpose::STANDARD;
    let kc = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "s", "cluster": {"server": w.sim.url(),
            "certificate-authority-data": b64.encode(w.sim.ca_pem().unwrap())}}],
        "users": [{"name": "u", "user": {"client-certificate-data": b64.encode(&cert),
            "client-key-data": b64.encode(&key)}}],
        "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u", "namespace": "team-a"}}],
    });
    let kc_path = w.path("kubeconfig");
    std::fs::write(&kc_path, kc.to_string()).unwrap();
    let out = base(&w)
        .arg("--kubeconfig")
        .arg(&kc_path)
        .args(["reconcile", "--target", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(w.sim.stats().creates, 2);
}

#[test]
fn no_client_certificate_is_refused_clearly() {
    let w = world();
    let out = w
        .cmd(&["--log-level", "trace", "reconcile", "--target", "1"])
        .output()
        .unwrap();
    // A TLS failure is permanent: exit 4.
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = stderr(&out);
    let last = err.lines().last().unwrap_or("");
    assert!(last.to_lowercase().contains("certificate"), "{last}");
    assert_eq!(w.sim.stats().creates, 0);
}

#[test]
fn mismatched_client_key_is_an_error_not_a_panic() {
    let w = world();
    let (cert, _) = w.sim.generate_client_cert("podalloc");
    let (_, other_key) = w.sim.generate_client_cert("someone-else");
    write_client_cert(&w, &cert, &other_key);
    let out = with_client_cert(&w)
        .args(["reconcile", "--target", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("does not match"), "{err}");
}
