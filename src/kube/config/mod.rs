//! Connection configuration: command-line flags, kubeconfig files, the in-cluster service
//! account, resolved into one [`ClusterConfig`] by [`resolve`].
//!
//! One file per source, as kube-client's `config/` is laid out: `overrides.rs` (the flags,
//! [`ConnectionFlags`]), `kubeconfig.rs` (file format, merge, load) and `incluster.rs` (the
//! service account). This file holds the resolved types and the resolution order.
//!
//! The rules follow kubectl / client-go `clientcmd` (Kubernetes docs, "Organizing Cluster
//! Access Using kubeconfig Files"): every flag overrides its own field and nothing else, so
//! `--server` with a kubeconfig keeps the kubeconfig's credential and CA (and sends that
//! credential to the server named on the command line, as kubectl does).
//!
//! Order of sources (the flags are then laid over the chosen one):
//! 1. a kubeconfig: `--kubeconfig FILE` alone, else the `$KUBECONFIG` list (merged, the
//!    first file to set a key wins), else `~/.kube/config` if it exists;
//! 2. in-cluster: `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` and the service account
//!    files `token`, `ca.crt`, `namespace`;
//! 3. the flags alone, when `--server` is given (or [`ConnectionFlags::flags_only`]).
//!
//! A kubeconfig user's credential is a `token` (beats `tokenFile`), a `tokenFile` (re-read by
//! the client), a client certificate and key (files or `*-data`), or an `exec` credential
//! plugin ([`Credential::Exec`], run by the client; see `exec.rs`). Relative paths, and an
//! exec `command` with a `/`, resolve against the directory of the kubeconfig file that
//! defines the entry.
//!
//! Flags override the chosen source field by field (`--token` replaces the user's credential,
//! `-n` the context's namespace, `--server` the cluster's server (and its `tls-server-name`,
//! unless `--tls-server-name` is given),
//! `--certificate-authority`/`--insecure-skip-tls-verify` the cluster's trust settings;
//! `--token`, `--token-file`, or `--client-certificate` with `--client-key` also keep an exec
//! plugin from running).

mod incluster;
mod kubeconfig;
mod overrides;

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub use incluster::IN_CLUSTER_SA_DIR;
pub use overrides::ConnectionFlags;

use super::error::KubeError;
use super::exec::ExecConfig;
use super::secret::{KeyData, PemData, Secret};

/// The error when no source gives a cluster.
#[cfg(feature = "sim")]
pub const NO_CLUSTER_MESSAGE: &str =
    "no cluster configured: pass --server, --kubeconfig, set KUBECONFIG, or run in a pod \
     (or --simulate for the built-in simulated cluster)";
/// The error when no source gives a cluster.
#[cfg(not(feature = "sim"))]
pub const NO_CLUSTER_MESSAGE: &str =
    "no cluster configured: pass --server, --kubeconfig, set KUBECONFIG, or run in a pod";

/// How requests prove who the client is, apart from a static TLS client certificate (which
/// lives in [`TlsSettings`]). One variant per kind of source.
#[derive(Clone, Debug, Default)]
pub enum Credential {
    /// No `Authorization` header (anonymous, or client certificate only).
    #[default]
    None,
    /// A fixed bearer token (trimmed). `source` says where it came from, e.g. `--token flag`.
    Token {
        /// The token; redacted in `Debug`.
        token: Secret<String>,
        /// Where it came from, for error messages.
        source: String,
    },
    /// A bearer token read from a file, re-read when older than the refresh period (60 s by
    /// default, client-go's `NewCachedFileTokenSource`) and after a 401.
    TokenFile {
        /// The token file.
        path: PathBuf,
        /// Where the path came from, e.g. `in-cluster service account`.
        source: String,
    },
    /// An exec credential plugin (kubeconfig `users[].user.exec`), run by the client when it
    /// is built, again when its credential nears `expirationTimestamp`, and once after a 401
    /// (client-go's exec authenticator; see [`ExecConfig`] and `exec.rs`). It may return a
    /// bearer token, a TLS client certificate, or both.
    Exec(Box<ExecConfig>),
}

impl Credential {
    /// A description of the credential for messages, e.g. `token file /x (--token-file flag)`.
    pub fn describe(&self) -> String {
        match self {
            Credential::None => "no bearer token".to_string(),
            Credential::Token { source, .. } => format!("token from {source}"),
            Credential::TokenFile { path, source } => {
                format!("token file {} ({source})", path.display())
            }
            Credential::Exec(exec) => exec.describe(),
        }
    }
}
/// How the server is trusted and how the client identifies itself at the TLS level.
#[derive(Clone, Debug, Default)]
pub struct TlsSettings {
    /// CA bundle the server certificate must chain to. `None`: the Mozilla roots
    /// (webpki-roots, as built into ureq).
    pub ca: Option<PemData>,
    /// Skip server certificate verification (kubeconfig `insecure-skip-tls-verify`).
    pub insecure_skip_tls_verify: bool,
    /// Name to verify the server certificate against and send as SNI, instead of the
    /// server URL's host (kubeconfig `tls-server-name`).
    pub tls_server_name: Option<String>,
    /// Client certificate (chain) for mutual TLS; needs `client_key`.
    pub client_cert: Option<PemData>,
    /// Private key of `client_cert`.
    pub client_key: Option<KeyData>,
}

/// A resolved connection: where the server is, who we are, how the server is trusted.
/// `Debug` never shows tokens or keys.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Server base URL with scheme, without trailing slash, e.g. `https://10.0.0.1:6443`.
    /// It may carry a path prefix (e.g. behind Rancher), which is kept.
    pub server: String,
    /// Namespace for all pod calls: flag > context namespace > in-cluster namespace file >
    /// `default`.
    pub namespace: String,
    /// Bearer credential.
    pub credential: Credential,
    /// Trust and client certificate.
    pub tls: TlsSettings,
    /// kubeconfig `disable-compression`: do not send `Accept-Encoding: gzip`.
    pub disable_compression: bool,
    /// kubeconfig `proxy-url`. `None`: the `HTTPS_PROXY`/`NO_PROXY` environment (never for
    /// loopback servers). `Debug` hides user info in the URL.
    pub proxy_url: Option<ProxyUrl>,
    /// Allow `http://` to a host that is not loopback.
    pub allow_insecure_http: bool,
    /// Where this came from: `flags`, `kubeconfig /path (context x)`, or `in-cluster`.
    pub source: String,
}

/// A proxy URL; `Debug` hides any `user:password@` part.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl(pub String);

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact_userinfo(&self.0))
    }
}

/// `scheme://user:pass@host` → `scheme://<redacted>@host`.
pub(crate) fn redact_userinfo(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => (&url[..i + 3], &url[i + 3..]),
        None => ("", url),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}<redacted>{}", &rest[at..]),
        None => url.to_string(),
    }
}

impl ClusterConfig {
    /// A configuration for `server` with no credential and default trust, e.g. for a local
    /// test or simulated API server at `http://127.0.0.1:PORT`. `source` is `flags`.
    pub fn for_server(server: &str, namespace: &str) -> ClusterConfig {
        ClusterConfig {
            server: server.trim_end_matches('/').to_string(),
            namespace: namespace.to_string(),
            credential: Credential::None,
            tls: TlsSettings::default(),
            disable_compression: false,
            proxy_url: None,
            allow_insecure_http: false,
            source: "flags".to_string(),
        }
    }
}

/// A server URL taken apart: `scheme://host[:port][/path]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServerUrl {
    pub https: bool,
    /// Host without IPv6 brackets.
    pub host: String,
    pub port: u16,
    /// Path prefix without trailing slash ("" for none).
    pub path: String,
}

impl ServerUrl {
    /// `host:port` with IPv6 brackets as needed.
    pub(super) fn authority_for(&self, host: &str) -> String {
        if host.contains(':') {
            format!("[{host}]:{}", self.port)
        } else {
            format!("{host}:{}", self.port)
        }
    }

    /// The base URL with `host` in place of the server's host.
    pub(super) fn base_with_host(&self, host: &str) -> String {
        format!(
            "{}://{}{}",
            if self.https { "https" } else { "http" },
            self.authority_for(host),
            self.path
        )
    }
}

/// Whether `host` (no brackets) is loopback: `localhost`, 127.0.0.0/8, `::1`.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => false,
    }
}

/// Normalizes a server string: trims, adds `https://` when there is no scheme, drops a
/// trailing `/`. The result's scheme is `http` or `https`.
pub(crate) fn normalize_server(raw: &str) -> String {
    let s = raw.trim();
    let s = if s.contains("://") {
        s.to_string()
    } else {
        format!("https://{s}")
    };
    s.trim_end_matches('/').to_string()
}

/// Parses a (normalized) server URL and applies the plain-HTTP rule: `http://` only for
/// loopback hosts unless `allow_insecure_http`.
pub(crate) fn parse_server(
    server: &str,
    allow_insecure_http: bool,
    origin: &str,
) -> Result<ServerUrl, KubeError> {
    let shown = redact_userinfo(server);
    let bad = |why: &str| {
        KubeError::Config(format!(
            "server {shown:?} ({origin}) is not a valid URL: {why}; expected https://HOST[:PORT]"
        ))
    };
    let uri: ureq::http::Uri = server.parse().map_err(|e| bad(&format!("{e}")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        Some(other) => return Err(bad(&format!("unsupported scheme {other:?}"))),
        None => return Err(bad("no scheme")),
    };
    let authority = uri.authority().ok_or_else(|| bad("no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("user info in the URL is not supported"));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if host.is_empty() {
        return Err(bad("no host"));
    }
    // A port that is there but not a valid u16 (e.g. 99999) is an error, not the default.
    let port = match authority.port() {
        Some(p) => p
            .as_str()
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| bad("the port is not 1-65535"))?,
        None if https => 443,
        None => 80,
    };
    if uri.query().is_some() {
        return Err(bad("a query string is not allowed"));
    }
    let path = uri.path().trim_end_matches('/').to_string();
    if !https && !allow_insecure_http && !is_loopback_host(&host) {
        return Err(KubeError::Config(format!(
            "server {shown} ({origin}) uses plain http:// to a host that is not loopback; \
             credentials and pods would travel unencrypted. Use https://, or pass \
             --allow-insecure-http if this is really intended"
        )));
    }
    Ok(ServerUrl {
        https,
        host,
        port,
        path,
    })
}

/// What one source gives before the flags are laid over it.
#[derive(Default)]
struct Partial {
    server: Option<String>,
    server_origin: String,
    namespace: Option<String>,
    credential: Credential,
    ca: Option<PemData>,
    insecure: bool,
    tls_server_name: Option<String>,
    proxy_url: Option<String>,
    disable_compression: bool,
    client_cert: Option<PemData>,
    client_key: Option<KeyData>,
    /// A user setting podalloc cannot honour; an error unless the flags replace the credential.
    unsupported_auth: Option<String>,
    source: String,
}

/// Reads a PEM file named by the configuration; `what` names the setting for the message.
fn read_pem_file(path: &Path, what: &str) -> Result<Vec<u8>, KubeError> {
    crate::kube::read_regular_file(path, crate::kube::MAX_INPUT_FILE_BYTES)
        .map_err(|e| KubeError::Config(format!("cannot read {what} {}: {e}", path.display())))
}

/// Resolves the connection from the flags, the process environment and the standard
/// in-cluster service account directory ([`IN_CLUSTER_SA_DIR`]). See [`resolve_with`].
pub fn resolve(flags: &ConnectionFlags) -> Result<ClusterConfig, KubeError> {
    resolve_with(
        flags,
        &|k| std::env::var(k).ok(),
        Path::new(IN_CLUSTER_SA_DIR),
    )
}

/// Resolves the connection as [`resolve`] does, with the environment lookup (`KUBECONFIG`,
/// `HOME`, `KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT`) and the in-cluster service
/// account directory injected, for tests.
///
/// Files named by the configuration (CA, client certificate and key) are read here; token
/// files are only checked to exist (the client reads them, and re-reads them).
///
/// An `exec` user becomes [`Credential::Exec`] (the plugin is not run here, but when the
/// client is built), unless `--token`, `--token-file` or `--client-certificate` with
/// `--client-key` replace the user's credential, or the user also has a `token`/`tokenFile`
/// (which wins, as in client-go).
///
/// Errors: [`KubeError::Config`] naming the file, field or flag at fault and the fix, e.g.
/// [`NO_CLUSTER_MESSAGE`] when nothing is configured, a missing context listing the contexts
/// that exist, an `exec` section without command, with apiVersion `v1alpha1` or
/// `interactiveMode: Always`, `http://` to a non-loopback host.
pub fn resolve_with(
    flags: &ConnectionFlags,
    env: &dyn Fn(&str) -> Option<String>,
    sa_dir: &Path,
) -> Result<ClusterConfig, KubeError> {
    let mut p = choose_source(flags, env, sa_dir)?;
    overrides::apply(&mut p, flags)?;
    finish(p, flags)
}

/// Picks the source the flags are laid over: the kubeconfig, else in-cluster, else the
/// flags alone when `--server` is given (always the flags alone with
/// [`ConnectionFlags::flags_only`]).
fn choose_source(
    flags: &ConnectionFlags,
    env: &dyn Fn(&str) -> Option<String>,
    sa_dir: &Path,
) -> Result<Partial, KubeError> {
    let flags_alone = || {
        Ok(Partial {
            source: "flags".to_string(),
            ..Partial::default()
        })
    };
    if flags.flags_only {
        return flags_alone();
    }
    if let Some(kc) = kubeconfig::load_kubeconfig(flags, env)? {
        let has_context = flags.context.is_some() || kc.current_context.is_some();
        match (has_context, incluster::in_cluster(env, sa_dir)) {
            // A kubeconfig without current-context counts as empty (clientcmd), so fall
            // back to in-cluster when possible.
            (false, Some(ic)) if flags.kubeconfig.is_none() => {
                log::debug!(
                    "kubeconfig {} sets no current-context; using the in-cluster config",
                    kc.files_display()
                );
                Ok(ic)
            }
            (false, _) if flags.server.is_some() => flags_alone(),
            _ => kubeconfig::from_kubeconfig(&kc, flags),
        }
    } else if let Some(ctx) = &flags.context {
        Err(KubeError::Config(format!(
            "--context {ctx} given, but no kubeconfig was found (looked at --kubeconfig, \
             KUBECONFIG and ~/.kube/config)"
        )))
    } else if let Some(ic) = incluster::in_cluster(env, sa_dir) {
        Ok(ic)
    } else if flags.server.is_some() {
        flags_alone()
    } else {
        Err(KubeError::Config(no_cluster_message(env)))
    }
}

/// [`NO_CLUSTER_MESSAGE`], naming the files when `$KUBECONFIG` is set but lists only files
/// that do not exist (client-go ignores missing files, and so does [`resolve_with`]; a user
/// who set it should still learn why it was not used).
fn no_cluster_message(env: &dyn Fn(&str) -> Option<String>) -> String {
    match env("KUBECONFIG").filter(|v| !v.is_empty()) {
        Some(list) => format!(
            "KUBECONFIG={list} names no file that exists; {NO_CLUSTER_MESSAGE} (fix the path, \
             or unset KUBECONFIG to use ~/.kube/config)"
        ),
        None => NO_CLUSTER_MESSAGE.to_string(),
    }
}

/// Checks what the source and the flags gave together (a server, a valid URL, a client
/// certificate only with its key, an existing token file) and builds the [`ClusterConfig`].
fn finish(p: Partial, flags: &ConnectionFlags) -> Result<ClusterConfig, KubeError> {
    let raw_server = p.server.clone().ok_or_else(|| {
        KubeError::Config(format!(
            "{} has no server; set clusters[].cluster.server in the kubeconfig or pass --server",
            p.server_origin
        ))
    })?;
    let server = normalize_server(&raw_server);
    parse_server(&server, flags.allow_insecure_http, &p.server_origin)?;

    match (&p.client_cert, &p.client_key) {
        (Some(c), None) => {
            return Err(KubeError::Config(format!(
                "client certificate {} is given without a client key; set client-key \
                 (or --client-key)",
                c.source
            )))
        }
        (None, Some(k)) => {
            return Err(KubeError::Config(format!(
                "client key {} is given without a client certificate; set client-certificate \
                 (or --client-certificate)",
                k.source
            )))
        }
        _ => {}
    }
    if let Credential::TokenFile { path, source } = &p.credential {
        if !path.is_file() {
            return Err(KubeError::Config(format!(
                "token file {} ({source}) does not exist or is not a file",
                path.display()
            )));
        }
    }

    Ok(ClusterConfig {
        server,
        namespace: p.namespace.unwrap_or_else(|| "default".to_string()),
        credential: p.credential,
        tls: TlsSettings {
            ca: p.ca,
            insecure_skip_tls_verify: p.insecure,
            tls_server_name: p.tls_server_name,
            client_cert: p.client_cert,
            client_key: p.client_key,
        },
        disable_compression: p.disable_compression,
        proxy_url: p.proxy_url.map(ProxyUrl),
        allow_insecure_http: flags.allow_insecure_http,
        source: p.source,
    })
}

#[cfg(test)]
mod test_support {
    //! Shared by the tests of every source: `resolve_with` over an injected environment, file
    //! writing, and a small kubeconfig.

    use std::collections::HashMap;
    use std::path::{Path, PathBuf};

    use super::{resolve_with, ClusterConfig, ConnectionFlags, KubeError};

    pub(super) struct Env(HashMap<String, String>);
    impl Env {
        pub(super) fn new(pairs: &[(&str, &str)]) -> Env {
            Env(pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect())
        }
        pub(super) fn get(&self, k: &str) -> Option<String> {
            self.0.get(k).cloned()
        }
    }

    pub(super) fn resolve_env(
        flags: &ConnectionFlags,
        env: &Env,
        sa: &Path,
    ) -> Result<ClusterConfig, KubeError> {
        resolve_with(flags, &|k| env.get(k), sa)
    }

    pub(super) fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A temporary directory DIR with [`SIMPLE`] written to `DIR/SUB/config` and its CA to
    /// `DIR/SUB/certs/ca.pem`, and an environment whose `KUBECONFIG` names the file: (DIR,
    /// the kubeconfig's path, the environment).
    pub(super) fn simple_kubeconfig(sub: &str) -> (tempfile::TempDir, PathBuf, Env) {
        let (dir, kc, env) = kubeconfig_file(sub, SIMPLE);
        write(&dir.path().join(sub), "certs/ca.pem", "PEM");
        (dir, kc, env)
    }

    /// A temporary directory DIR with the kubeconfig `text` written to `DIR/SUB/config`, and
    /// an environment whose `KUBECONFIG` names it: (DIR, the kubeconfig's path, the
    /// environment).
    pub(super) fn kubeconfig_file(sub: &str, text: &str) -> (tempfile::TempDir, PathBuf, Env) {
        let dir = tempfile::tempdir().unwrap();
        let kc = write(&dir.path().join(sub), "config", text);
        let env = Env::new(&[("KUBECONFIG", kc.to_str().unwrap())]);
        (dir, kc, env)
    }

    pub(super) fn err(r: Result<ClusterConfig, KubeError>) -> String {
        match r {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    pub(super) const SIMPLE: &str = "
apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: dev-cluster
  cluster:
    server: https://dev.example:6443
    certificate-authority: certs/ca.pem
    some-future-field: 7
users:
- name: dev-user
  user:
    token: '  sekrit-token  '
contexts:
- name: dev
  context: {cluster: dev-cluster, user: dev-user, namespace: team-a}
- name: other
  context: {cluster: dev-cluster, user: nobody}
preferences: {}
";
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn nothing_configured() {
        let sa = tempfile::tempdir().unwrap();
        let e = err(resolve_env(
            &ConnectionFlags::default(),
            &Env::new(&[("HOME", "/nonexistent-home")]),
            sa.path(),
        ));
        assert_eq!(e, NO_CLUSTER_MESSAGE);
    }

    #[test]
    fn server_flag_overrides_the_server_only() {
        let (dir, _, env) = simple_kubeconfig("");
        let flags = ConnectionFlags {
            server: Some("https://api.example:6443/".into()),
            ..Default::default()
        };
        let c = resolve_env(&flags, &env, dir.path()).unwrap();
        assert_eq!(c.server, "https://api.example:6443");
        assert!(c.source.starts_with("kubeconfig "), "{}", c.source);
        assert!(c.source.ends_with("server from --server"), "{}", c.source);
        // The context's namespace, the user's token and the cluster's CA are kept.
        assert_eq!(c.namespace, "team-a");
        assert!(
            matches!(&c.credential, Credential::Token { token, .. } if token.expose() == "sekrit-token")
        );
        assert_eq!(c.tls.ca.as_ref().unwrap().pem, b"PEM");
    }

    #[test]
    fn server_flag_without_a_kubeconfig_uses_the_flags_alone() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::new(&[("HOME", "/nonexistent-home")]);
        let flags = ConnectionFlags {
            server: Some("https://api.example:6443/".into()),
            ..Default::default()
        };
        let c = resolve_env(&flags, &env, dir.path()).unwrap();
        assert_eq!(c.server, "https://api.example:6443");
        assert_eq!(c.source, "flags");
        assert_eq!(c.namespace, "default");
        assert!(matches!(c.credential, Credential::None));
        assert!(c.tls.ca.is_none());
        // flags_only ignores a kubeconfig that is there.
        let kc = write(dir.path(), "config", SIMPLE);
        let env = Env::new(&[("KUBECONFIG", kc.to_str().unwrap())]);
        let flags = ConnectionFlags {
            flags_only: true,
            ..flags
        };
        assert_eq!(
            resolve_env(&flags, &env, dir.path()).unwrap().source,
            "flags"
        );
    }

    #[test]
    fn plain_http_only_for_loopback() {
        let sa = tempfile::tempdir().unwrap();
        let env = Env::new(&[]);
        for ok in [
            "http://127.0.0.1:8080",
            "http://127.3.4.5",
            "http://localhost:1",
            "http://LOCALHOST:1",
            "http://[::1]:8001",
        ] {
            let flags = ConnectionFlags {
                server: Some(ok.into()),
                ..Default::default()
            };
            resolve_env(&flags, &env, sa.path()).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let mut flags = ConnectionFlags {
            server: Some("http://10.0.0.5:8080".into()),
            ..Default::default()
        };
        let e = err(resolve_env(&flags, &env, sa.path()));
        assert!(
            e.contains("plain http://") && e.contains("--allow-insecure-http"),
            "{e}"
        );
        flags.allow_insecure_http = true;
        resolve_env(&flags, &env, sa.path()).unwrap();
        flags.server = Some("ftp://x".into());
        assert!(err(resolve_env(&flags, &env, sa.path())).contains("unsupported scheme"));
    }

    #[test]
    fn helpers() {
        assert_eq!(
            normalize_server(" localhost:443/ "),
            "https://localhost:443"
        );
        assert_eq!(normalize_server("http://a:1"), "http://a:1");
        let u = parse_server("https://[::1]:6443/k8s/c1", false, "t").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("::1", 6443, "/k8s/c1")
        );
        assert_eq!(u.base_with_host("h"), "https://h:6443/k8s/c1");
        assert_eq!(u.base_with_host("::1"), "https://[::1]:6443/k8s/c1");
        assert_eq!(parse_server("https://h", false, "t").unwrap().port, 443);
        assert!(parse_server("https://u:p@h", false, "t").is_err());
        for host in ["127.0.0.1", "::1", "127.255.0.9", "localhost"] {
            assert!(is_loopback_host(host), "{host}");
        }
        assert!(!is_loopback_host("10.0.0.1") && !is_loopback_host("localhost.evil"));
        assert_eq!(
            redact_userinfo("http://u:p@h:1/x@y"),
            "http://<redacted>@h:1/x@y"
        );
        assert_eq!(redact_userinfo("http://h:1"), "http://h:1");
    }
}
