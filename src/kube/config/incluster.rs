//! The in-cluster source: the pod's service account, as client-go's `rest.InClusterConfig`
//! reads it. The server is `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the
//! credential is the projected `token` file (re-read by the client, as kubelet rotates it),
//! the CA is `ca.crt` and the namespace comes from the `namespace` file.

use std::path::Path;

use super::{Credential, Partial};
use crate::kube::secret::PemData;

/// Where the in-cluster service account files live (client-go `rest.InClusterConfig`).
pub const IN_CLUSTER_SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The in-cluster part of the configuration, or `None` when `KUBERNETES_SERVICE_HOST` or
/// `KUBERNETES_SERVICE_PORT` is unset or blank (not running in a pod). `sa_dir` is the
/// service account directory ([`IN_CLUSTER_SA_DIR`] outside tests). A missing `ca.crt` is
/// logged and the default roots are trusted; a missing token file is reported later, by
/// [`super::resolve_with`].
pub(super) fn in_cluster(env: &dyn Fn(&str) -> Option<String>, sa_dir: &Path) -> Option<Partial> {
    let host = env("KUBERNETES_SERVICE_HOST").filter(|h| !h.trim().is_empty())?;
    let port = env("KUBERNETES_SERVICE_PORT").filter(|p| !p.trim().is_empty())?;
    let host = host.trim();
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let mut p = Partial {
        server: Some(format!("https://{host}:{}", port.trim())),
        server_origin: "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT".to_string(),
        source: "in-cluster".to_string(),
        credential: Credential::TokenFile {
            path: sa_dir.join("token"),
            source: "in-cluster service account".to_string(),
        },
        ..Partial::default()
    };
    let ca_path = sa_dir.join("ca.crt");
    match std::fs::read(&ca_path) {
        Ok(pem) => {
            p.ca = Some(PemData {
                source: ca_path.display().to_string(),
                pem,
            })
        }
        Err(e) => log::warn!(
            "in-cluster CA {} cannot be read ({e}); trusting the default roots",
            ca_path.display()
        ),
    }
    if let Ok(ns) = std::fs::read_to_string(sa_dir.join("namespace")) {
        let ns = ns.trim();
        if !ns.is_empty() {
            p.namespace = Some(ns.to_string());
        }
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{ConnectionFlags, Credential};

    #[test]
    fn in_cluster_service_account() {
        let sa = tempfile::tempdir().unwrap();
        write(sa.path(), "token", "sa-token\n");
        write(sa.path(), "ca.crt", "-----BEGIN CERTIFICATE-----\n");
        write(sa.path(), "namespace", "spark-jobs\n");
        let env = Env::new(&[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
        ]);
        let c = resolve_env(&ConnectionFlags::default(), &env, sa.path()).unwrap();
        assert_eq!(c.server, "https://10.96.0.1:443");
        assert_eq!(c.namespace, "spark-jobs");
        assert_eq!(c.source, "in-cluster");
        assert!(
            matches!(&c.credential, Credential::TokenFile { path, .. } if path == &sa.path().join("token"))
        );
        assert_eq!(
            c.tls.ca.as_ref().unwrap().source,
            sa.path().join("ca.crt").display().to_string()
        );
        // -n beats the namespace file; --token beats the service account token.
        let flags = ConnectionFlags {
            namespace: Some("other".into()),
            token: Some("t".into()),
            ..Default::default()
        };
        let c = resolve_env(&flags, &env, sa.path()).unwrap();
        assert_eq!(c.namespace, "other");
        assert!(
            matches!(&c.credential, Credential::Token { source, .. } if source == "--token flag")
        );
        // IPv6 service host.
        let env6 = Env::new(&[
            ("KUBERNETES_SERVICE_HOST", "fd00::1"),
            ("KUBERNETES_SERVICE_PORT", "6443"),
        ]);
        let c = resolve_env(&ConnectionFlags::default(), &env6, sa.path()).unwrap();
        assert_eq!(c.server, "https://[fd00::1]:6443");
        // Missing token file: a clear error.
        std::fs::remove_file(sa.path().join("token")).unwrap();
        let e = err(resolve_env(&ConnectionFlags::default(), &env, sa.path()));
        assert!(
            e.contains("token file") && e.contains("in-cluster service account"),
            "{e}"
        );
    }

    #[test]
    fn no_current_context_falls_back_to_in_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let kc = write(dir.path(), "config", "clusters: []\n");
        write(dir.path(), "token", "t");
        let env = Env::new(&[
            ("KUBECONFIG", kc.to_str().unwrap()),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
        ]);
        let c = resolve_env(&ConnectionFlags::default(), &env, dir.path()).unwrap();
        assert_eq!(c.source, "in-cluster");
        assert_eq!(c.namespace, "default");
        let env = Env::new(&[("KUBECONFIG", kc.to_str().unwrap())]);
        let e = err(resolve_env(&ConnectionFlags::default(), &env, dir.path()));
        assert!(e.contains("sets no current-context"), "{e}");
    }
}
