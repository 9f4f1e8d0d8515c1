//! Client-certificate authentication (mutual TLS) against the simulator: from flags and from a
//! kubeconfig's *-data fields; refused without a certificate; keys never printed.

use base64::Engine as _;
use podalloc::sim::{SimOptions, SimServer};
use std::process::Command;
use std::time::Duration;

fn sim(dir: &std::path::Path) -> SimServer {
    SimServer::start(SimOptions {
        ca_out: Some(dir.join("ca.crt")),
        token: Some("unused-token".into()),
        require_client_cert: true,
        startup_latency: Duration::from_millis(100),
        ..SimOptions::default()
    })
    .unwrap()
}

fn base(dir: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_podalloc"));
    c.args([
        "--app-id",
        "mtls-app",
        "--image",
        "img",
        "--batch-delay",
        "100ms",
        "--log-level",
        "trace",
    ])
    .arg("--state-file")
    .arg(dir.join("state.json"))
    .env_remove("KUBECONFIG");
    c
}

#[test]
fn client_certificate_flags_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim(dir.path());
    let (cert, key) = sim.generate_client_cert("podalloc");
    std::fs::write(dir.path().join("client.crt"), &cert).unwrap();
    std::fs::write(dir.path().join("client.key"), &key).unwrap();
    let out = base(dir.path())
        .args(["--server", &sim.url()])
        .arg("--certificate-authority")
        .arg(dir.path().join("ca.crt"))
        .arg("--client-certificate")
        .arg(dir.path().join("client.crt"))
        .arg("--client-key")
        .arg(dir.path().join("client.key"))
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
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(sim.stats().live_pods, 3);
    let key_body = key.lines().nth(1).unwrap();
    assert!(
        !err.contains(key_body) && !err.contains("PRIVATE KEY"),
        "the client key leaked"
    );
}

#[test]
fn kubeconfig_client_certificate_data_authenticates() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim(dir.path());
    let (cert, key) = sim.generate_client_cert("podalloc");
    let b64 = base64::engine::general_purpose::STANDARD;
    let kc = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "s", "cluster": {"server": sim.url(),
            "certificate-authority-data": b64.encode(sim.ca_pem().unwrap())}}],
        "users": [{"name": "u", "user": {"client-certificate-data": b64.encode(&cert),
            "client-key-data": b64.encode(&key)}}],
        "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u", "namespace": "team-a"}}],
    });
    let kc_path = dir.path().join("kubeconfig");
    std::fs::write(&kc_path, kc.to_string()).unwrap();
    let out = base(dir.path())
        .arg("--kubeconfig")
        .arg(&kc_path)
        .args(["reconcile", "--target", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sim.stats().creates, 2);
}

#[test]
fn no_client_certificate_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim(dir.path());
    let out = base(dir.path())
        .args(["--server", &sim.url(), "--token", "unused-token"])
        .arg("--certificate-authority")
        .arg(dir.path().join("ca.crt"))
        .args(["reconcile", "--target", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or("");
    assert!(last.to_lowercase().contains("certificate"), "{last}");
    assert_eq!(sim.stats().creates, 0);
}

#[test]
fn mismatched_client_key_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim(dir.path());
    let (cert, _) = sim.generate_client_cert("podalloc");
    let (_, other_key) = sim.generate_client_cert("someone-else");
    std::fs::write(dir.path().join("client.crt"), &cert).unwrap();
    std::fs::write(dir.path().join("client.key"), &other_key).unwrap();
    let out = base(dir.path())
        .args(["--server", &sim.url()])
        .arg("--certificate-authority")
        .arg(dir.path().join("ca.crt"))
        .arg("--client-certificate")
        .arg(dir.path().join("client.crt"))
        .arg("--client-key")
        .arg(dir.path().join("client.key"))
        .args(["reconcile", "--target", "1"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("does not match"), "{err}");
}
