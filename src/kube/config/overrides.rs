//! The command-line source: kubectl's connection flags ([`ConnectionFlags`]) and how they
//! override, field by field, what the kubeconfig or the in-cluster service account gave
//! (client-go `clientcmd`'s `ConfigOverrides`).

use std::path::PathBuf;

use super::{read_pem_file, Credential, Partial};
use crate::kube::error::KubeError;
use crate::kube::secret::{KeyData, PemData, Secret};

/// Connection flags as the CLI gives them (kubectl's names).
///
/// `Debug` shows `token` as `<redacted>` (a [`Secret`]).
#[derive(Clone, Debug, Default)]
pub struct ConnectionFlags {
    /// `--kubeconfig FILE`: use this one file, ignore `$KUBECONFIG` and `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// `--context NAME`: the kubeconfig context to use instead of `current-context`.
    pub context: Option<String>,
    /// `-n/--namespace NS`: overrides the context's namespace.
    pub namespace: Option<String>,
    /// `--server URL`: the API server. A value without a scheme gets `https://`. Overrides
    /// the kubeconfig cluster's (or in-cluster) server and nothing else: the credential and
    /// CA still come from there unless their own flags are given (as with kubectl).
    pub server: Option<String>,
    /// `--tls-server-name NAME`: the name the server certificate is checked against (and
    /// sent as SNI) instead of the server URL's host. With `--server`, the kubeconfig's
    /// `tls-server-name` is replaced by this flag (cleared when it is not given), as kubectl
    /// does, since it belonged to the kubeconfig's server.
    pub tls_server_name: Option<String>,
    /// Use the flags alone: no kubeconfig, no in-cluster account (the built-in simulator).
    pub flags_only: bool,
    /// `--token TOKEN`: bearer token; overrides the kubeconfig user's credential.
    pub token: Option<Secret<String>>,
    /// `--token-file FILE`: bearer token file, re-read every 60 s and after a 401.
    pub token_file: Option<PathBuf>,
    /// `--certificate-authority FILE`: PEM bundle that the server certificate must chain to.
    pub certificate_authority: Option<PathBuf>,
    /// `--client-certificate FILE`: PEM client certificate (chain) for mutual TLS.
    pub client_certificate: Option<PathBuf>,
    /// `--client-key FILE`: PEM private key of the client certificate.
    pub client_key: Option<PathBuf>,
    /// `--insecure-skip-tls-verify`: do not verify the server certificate (a warning is logged).
    pub insecure_skip_tls_verify: bool,
    /// Allow `http://` to a host that is not loopback (tokens then travel in clear text).
    pub allow_insecure_http: bool,
}

impl ConnectionFlags {
    /// Whether the flags alone give a credential: a non-blank `--token`, `--token-file`, or
    /// `--client-certificate` with `--client-key`. Such flags replace the kubeconfig user's
    /// credential, so an exec plugin is not run and an unsupported auth method is no error.
    pub(super) fn give_credential(&self) -> bool {
        (self.token.as_ref()).is_some_and(|t| !t.expose().trim().is_empty())
            || self.token_file.is_some()
            || (self.client_certificate.is_some() && self.client_key.is_some())
    }
}

/// Lays the flags over `p`, field by field (clientcmd's overrides), reading the files they
/// name (CA, client certificate and key).
///
/// Errors: [`KubeError::Config`] for an empty `--namespace` or `--token`, both
/// `--certificate-authority` and `--insecure-skip-tls-verify`, an unreadable file, or a
/// kubeconfig user with an unsupported auth method when the flags give no credential.
pub(super) fn apply(p: &mut Partial, flags: &ConnectionFlags) -> Result<(), KubeError> {
    apply_server_and_namespace(p, flags)?;
    apply_trust(p, flags)?;
    apply_credential(p, flags)?;
    if let Some(msg) = p.unsupported_auth.take() {
        if !flags.give_credential() {
            return Err(KubeError::Config(msg));
        }
    }
    Ok(())
}

/// `--server` and `-n/--namespace`.
fn apply_server_and_namespace(p: &mut Partial, flags: &ConnectionFlags) -> Result<(), KubeError> {
    if let Some(server) = &flags.server {
        p.server = Some(server.clone());
        p.server_origin = "--server flag".to_string();
        if p.source != "flags" {
            p.source = format!("{}, server from --server", p.source);
        }
    }
    // kubectl (clientcmd): `--tls-server-name` wins; `--server` without it clears the
    // kubeconfig's, which named the kubeconfig's server.
    if flags.server.is_some() || flags.tls_server_name.is_some() {
        p.tls_server_name = flags
            .tls_server_name
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string);
    }
    if let Some(ns) = &flags.namespace {
        let ns = ns.trim();
        if ns.is_empty() {
            return Err(KubeError::Config(
                "--namespace is empty; give a namespace name".to_string(),
            ));
        }
        p.namespace = Some(ns.to_string());
    }
    Ok(())
}

/// `--certificate-authority` and `--insecure-skip-tls-verify` (which exclude each other).
fn apply_trust(p: &mut Partial, flags: &ConnectionFlags) -> Result<(), KubeError> {
    if flags.certificate_authority.is_some() && flags.insecure_skip_tls_verify {
        return Err(KubeError::Config(
            "--certificate-authority and --insecure-skip-tls-verify cannot be used together"
                .to_string(),
        ));
    }
    if let Some(path) = &flags.certificate_authority {
        p.ca = Some(PemData {
            source: path.display().to_string(),
            pem: read_pem_file(path, "--certificate-authority file")?,
        });
        p.insecure = false;
    } else if flags.insecure_skip_tls_verify {
        p.insecure = true;
        p.ca = None;
    }
    Ok(())
}

/// `--token` (beats `--token-file`), `--token-file`, `--client-certificate`, `--client-key`.
fn apply_credential(p: &mut Partial, flags: &ConnectionFlags) -> Result<(), KubeError> {
    let token_flag = flags
        .token
        .as_ref()
        .map(|t| t.expose().trim())
        .filter(|t| !t.is_empty());
    if let Some(token) = token_flag {
        p.credential = Credential::Token {
            token: Secret::new(token.to_string()),
            source: "--token flag".to_string(),
        };
    } else if flags.token.is_some() {
        return Err(KubeError::Config(
            "--token is empty; give a token or leave the flag out".to_string(),
        ));
    } else if let Some(path) = &flags.token_file {
        p.credential = Credential::TokenFile {
            path: path.clone(),
            source: "--token-file flag".to_string(),
        };
    }
    if let Some(path) = &flags.client_certificate {
        p.client_cert = Some(PemData {
            source: path.display().to_string(),
            pem: read_pem_file(path, "--client-certificate file")?,
        });
    }
    if let Some(path) = &flags.client_key {
        p.client_key = Some(KeyData {
            source: path.display().to_string(),
            pem: Secret::new(read_pem_file(path, "--client-key file")?),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::Credential;
    use super::*;

    #[test]
    fn flags_override_the_kubeconfig_per_field() {
        let (dir, _, env) = simple_kubeconfig("kube");
        // Flags override per field.
        let cert_dir = tempfile::tempdir().unwrap();
        let flag_ca = write(cert_dir.path(), "flag-ca.pem", "FLAGCA");
        let flags = ConnectionFlags {
            namespace: Some("ns2".into()),
            server: Some("dev.example:7443".into()),
            certificate_authority: Some(flag_ca.clone()),
            token_file: Some(flag_ca.clone()),
            context: Some("dev".into()),
            ..Default::default()
        };
        let c = resolve_env(&flags, &env, dir.path()).unwrap();
        assert_eq!(c.server, "https://dev.example:7443");
        assert_eq!(c.namespace, "ns2");
        assert_eq!(c.tls.ca.as_ref().unwrap().pem, b"FLAGCA");
        assert!(
            matches!(&c.credential, Credential::TokenFile { source, .. } if source == "--token-file flag")
        );
        assert!(c.source.starts_with("kubeconfig "));

        // --insecure-skip-tls-verify clears the kubeconfig's CA.
        let flags = ConnectionFlags {
            insecure_skip_tls_verify: true,
            ..Default::default()
        };
        let c = resolve_env(&flags, &env, dir.path()).unwrap();
        assert!(c.tls.insecure_skip_tls_verify && c.tls.ca.is_none());
    }

    #[test]
    fn debug_hides_the_token() {
        let f = ConnectionFlags {
            token: Some("tok123".into()),
            ..Default::default()
        };
        assert!(!format!("{f:?}").contains("tok123"));
    }
}
