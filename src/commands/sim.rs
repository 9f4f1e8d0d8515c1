//! The simulated API server as the command line uses it: `podalloc sim` (serve it until
//! stopped) and `--simulate` (start one on loopback for a connected command). Kept together,
//! with the token and kubeconfig helpers, so that the simulator can be left out of a build
//! as one unit.

use crate::cli::{ConnArgs, SimArgs};
use crate::error::{Error, Result};
use crate::kube::ConnectionFlags;
use crate::sim::{SimOptions, SimServer};
use log::info;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A simulator started by `--simulate`, and the temporary directory holding its CA and the
/// state file; both go when the command ends.
pub(super) struct SimGuard {
    _server: SimServer,
    dir: tempfile::TempDir,
}

impl SimGuard {
    /// The state file used when `--state-file` is not given.
    pub(super) fn state_file(&self) -> PathBuf {
        self.dir.path().join("state.json")
    }
}

/// A random-enough token for a loopback simulator (std's per-process hash keys).
fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut s = String::new();
    for i in 0..2u8 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(i);
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        s.push_str(&format!("{:016x}", h.finish()));
    }
    s
}

/// `--simulate`: starts a simulator over HTTPS on loopback, with a generated CA and a random
/// token, and returns the connection flags that reach it (namespace `-n` or `default`).
///
/// Errors (exit 1): no temporary directory, or the server cannot start.
pub(super) fn start_simulator(c: &ConnArgs) -> Result<(ConnectionFlags, Option<SimGuard>)> {
    let dir = tempfile::Builder::new()
        .prefix("podalloc-sim-")
        .tempdir()
        .map_err(|e| {
            Error::runtime(format!(
                "cannot make a temporary directory for the simulator: {e}"
            ))
        })?;
    let token = random_token();
    let ca = dir.path().join("ca.crt");
    let opts = SimOptions {
        ca_out: Some(ca.clone()),
        token: Some(token.clone()),
        ..SimOptions::default()
    };
    let server = SimServer::start(opts)
        .map_err(|e| Error::runtime(format!("cannot start the simulated API server: {e}")))?;
    info!(
        "simulated API server at {} (HTTPS, CA {})",
        server.url(),
        ca.display()
    );
    let flags = ConnectionFlags {
        server: Some(server.url()),
        token: Some(token.into()),
        certificate_authority: Some(ca),
        namespace: c.namespace.clone().or(Some("default".into())),
        flags_only: true,
        ..ConnectionFlags::default()
    };
    Ok((
        flags,
        Some(SimGuard {
            _server: server,
            dir,
        }),
    ))
}

/// `podalloc sim`: serves the simulated API server until the process is stopped, printing
/// how to connect (URL, CA, token or kubeconfig).
pub(super) fn sim(a: &SimArgs) -> Result<()> {
    let token = if a.no_auth {
        None
    } else {
        Some(a.token.clone().unwrap_or_else(random_token))
    };
    let server = SimServer::start(a.options(token.clone()))
        .map_err(|e| Error::runtime(format!("cannot start the simulated API server: {e}")))?;
    println!("serving {}", server.url());
    println!(
        "serves only {}: other kinds (Deployments, CronJobs, ServiceAccounts, RBAC) are not \
         served, so `kubectl apply -f deploy/` needs a real cluster",
        crate::sim::served_kinds().join(", ")
    );
    if let Some(p) = &a.ca_out {
        println!("CA certificate: {}", p.display());
    }
    if let Some(p) = &a.write_kubeconfig {
        let client_cert =
            (a.require_client_cert && !a.http).then(|| server.generate_client_cert("podalloc"));
        write_kubeconfig(
            p,
            &server.url(),
            server.ca_pem(),
            token.as_deref(),
            client_cert,
        )?;
        println!(
            "kubeconfig: {} (use --kubeconfig {} or KUBECONFIG)",
            p.display(),
            p.display()
        );
    } else if let Some(t) = &token {
        println!("token: {t}");
    }
    if a.write_kubeconfig.is_none() && a.ca_out.is_none() && !a.http {
        println!(
            "(HTTPS with a generated CA: pass --write-kubeconfig FILE or --ca-out FILE to connect)"
        );
    }
    server.wait();
    Ok(())
}

/// Writes a kubeconfig for the simulator at `path` (atomically): the server, its CA, the
/// token and, with mTLS, a client certificate and key. Errors (exit 1): the write.
fn write_kubeconfig(
    path: &Path,
    url: &str,
    ca_pem: Option<&str>,
    token: Option<&str>,
    client_cert: Option<(String, String)>,
) -> Result<()> {
    use base64::Engine as _;
    let mut cluster = serde_json::json!({"server": url});
    if let Some(ca) = ca_pem {
        cluster["certificate-authority-data"] = base64::engine::general_purpose::STANDARD
            .encode(ca.as_bytes())
            .into();
    }
    let mut user = serde_json::json!({});
    if let Some(t) = token {
        user["token"] = t.into();
    }
    if let Some((cert, key)) = client_cert {
        let b64 = base64::engine::general_purpose::STANDARD;
        user["client-certificate-data"] = b64.encode(cert.as_bytes()).into();
        user["client-key-data"] = b64.encode(key.as_bytes()).into();
    }
    let cfg = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "podalloc-sim", "cluster": cluster}],
        "users": [{"name": "podalloc-sim", "user": user}],
        "contexts": [{"name": "podalloc-sim", "context": {"cluster": "podalloc-sim", "user": "podalloc-sim", "namespace": "default"}}],
        "current-context": "podalloc-sim",
    });
    let mut f = tempfile::NamedTempFile::new_in(
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new(".")),
    )
    .map_err(|e| Error::runtime(format!("cannot write {}: {e}", path.display())))?;
    std::io::Write::write_all(
        &mut f,
        serde_json::to_string_pretty(&cfg)
            .expect("serializes")
            .as_bytes(),
    )
    .map_err(|e| Error::runtime(format!("cannot write {}: {e}", path.display())))?;
    f.persist(path)
        .map_err(|e| Error::runtime(format!("cannot write {}: {}", path.display(), e.error)))?;
    Ok(())
}
