//! Connection configuration: command-line flags, kubeconfig files, the in-cluster service
//! account, resolved into one [`ClusterConfig`].
//!
//! The rules follow kubectl / client-go `clientcmd` (see `shared/notes/k8s-api.md` §5 and
//! k/website "Organizing Cluster Access Using kubeconfig Files"), with one deliberate
//! difference: `--server` without `--kubeconfig`/`--context` uses the flags alone and reads no
//! kubeconfig, so a default kubeconfig's credentials are never sent to a server named on the
//! command line (kubectl would send them).
//!
//! Order of sources:
//! 1. `--server` (with `--token`/`--token-file`/`--certificate-authority`/client cert flags);
//! 2. a kubeconfig: `--kubeconfig FILE` alone, else the `$KUBECONFIG` list (merged, the
//!    first file to set a key wins), else `~/.kube/config` if it exists;
//! 3. in-cluster: `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` and the service account
//!    files `token`, `ca.crt`, `namespace`.
//!
//! A kubeconfig user's credential is a `token` (beats `tokenFile`), a `tokenFile` (re-read by
//! the client), a client certificate and key (files or `*-data`), or an `exec` credential
//! plugin ([`Credential::Exec`], run by the client; see `exec.rs`). Relative paths, and an
//! exec `command` with a `/`, resolve against the directory of the kubeconfig file that
//! defines the entry.
//!
//! Flags override the chosen source field by field (`--token` replaces the user's credential,
//! `-n` the context's namespace, `--server` the cluster's server and its `tls-server-name`,
//! `--certificate-authority`/`--insecure-skip-tls-verify` the cluster's trust settings;
//! `--token`, `--token-file`, or `--client-certificate` with `--client-key` also keep an exec
//! plugin from running).

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use super::error::KubeError;
use super::exec::{ExecApiVersion, ExecConfig, InteractiveMode, EXEC_CLUSTER_EXTENSION};

/// Where the in-cluster service account files live (client-go `rest.InClusterConfig`).
pub const IN_CLUSTER_SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The error when no source gives a cluster.
pub const NO_CLUSTER_MESSAGE: &str =
    "no cluster configured: pass --server, --kubeconfig, set KUBECONFIG, or run in a pod";

/// Connection flags as the CLI gives them (kubectl's names).
///
/// `Debug` is written by hand and shows `token` as `<redacted>`.
#[derive(Clone, Default)]
pub struct ConnectionFlags {
    /// `--kubeconfig FILE`: use this one file, ignore `$KUBECONFIG` and `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// `--context NAME`: the kubeconfig context to use instead of `current-context`.
    pub context: Option<String>,
    /// `-n/--namespace NS`: overrides the context's namespace.
    pub namespace: Option<String>,
    /// `--server URL`: the API server. A value without a scheme gets `https://`.
    pub server: Option<String>,
    /// `--token TOKEN`: bearer token; overrides the kubeconfig user's credential.
    pub token: Option<String>,
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

impl fmt::Debug for ConnectionFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionFlags")
            .field("kubeconfig", &self.kubeconfig)
            .field("context", &self.context)
            .field("namespace", &self.namespace)
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("token_file", &self.token_file)
            .field("certificate_authority", &self.certificate_authority)
            .field("client_certificate", &self.client_certificate)
            .field("client_key", &self.client_key)
            .field("insecure_skip_tls_verify", &self.insecure_skip_tls_verify)
            .field("allow_insecure_http", &self.allow_insecure_http)
            .finish()
    }
}

/// A value that must not be logged: `Debug` prints `<redacted>`, and there is no `Display`.
/// Read it with [`Secret::expose`] only where it is sent.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    /// Wraps a secret value.
    pub fn new(value: T) -> Self {
        Secret(value)
    }
    /// The secret value itself.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

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

/// PEM bytes plus a description of where they came from (a file name, or a kubeconfig
/// `*-data` field), used in error messages. `Debug` shows the source and the length only.
#[derive(Clone)]
pub struct PemData {
    /// e.g. `/etc/ca.pem` or `certificate-authority-data of cluster "c" in kubeconfig /k`.
    pub source: String,
    /// The PEM text.
    pub pem: Vec<u8>,
}

impl fmt::Debug for PemData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemData")
            .field("source", &self.source)
            .field("bytes", &self.pem.len())
            .finish()
    }
}

/// A PEM private key plus where it came from. `Debug` redacts the key.
#[derive(Clone, Debug)]
pub struct KeyData {
    /// Where the key came from (file or kubeconfig field), safe to print.
    pub source: String,
    /// The PEM text; redacted in `Debug`.
    pub pem: Secret<Vec<u8>>,
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
    pub fn authority_for(&self, host: &str) -> String {
        if host.contains(':') {
            format!("[{host}]:{}", self.port)
        } else {
            format!("{host}:{}", self.port)
        }
    }

    /// The base URL with `host` in place of the server's host.
    pub fn base_with_host(&self, host: &str) -> String {
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

// ---------------------------------------------------------------------------------------
// kubeconfig file format (client-go clientcmd/api/v1/types.go). Unknown fields are ignored.

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawKubeconfig {
    clusters: Option<Vec<RawNamedCluster>>,
    users: Option<Vec<RawNamedUser>>,
    contexts: Option<Vec<RawNamedContext>>,
    #[serde(rename = "current-context")]
    current_context: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawNamedCluster {
    name: Option<String>,
    cluster: Option<RawCluster>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default, rename_all = "kebab-case")]
struct RawCluster {
    server: Option<String>,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: Option<bool>,
    tls_server_name: Option<String>,
    proxy_url: Option<String>,
    disable_compression: Option<bool>,
    extensions: Option<Vec<RawNamedExtension>>,
}

/// A cluster's `extensions[]` entry; only `client.authentication.k8s.io/exec` is used (passed
/// to exec plugins as `spec.cluster.config`).
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct RawNamedExtension {
    name: Option<String>,
    extension: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawNamedUser {
    name: Option<String>,
    user: Option<RawUser>,
}

/// A kubeconfig user. Not `Debug`: it holds secrets.
#[derive(Deserialize, Default, Clone)]
#[serde(default, rename_all = "kebab-case")]
struct RawUser {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
    client_key: Option<String>,
    client_key_data: Option<String>,
    exec: Option<RawExec>,
    auth_provider: Option<RawAuthProvider>,
    username: Option<String>,
    password: Option<String>,
    #[serde(rename = "as")]
    impersonate: Option<String>,
    #[serde(rename = "as-uid")]
    impersonate_uid: Option<String>,
    #[serde(rename = "as-groups")]
    impersonate_groups: Option<Vec<String>>,
}

/// An `exec` credential plugin (client-go `ExecConfig`). Not `Debug`: `env` may hold secrets.
#[derive(Deserialize, Default, Clone)]
#[serde(default, rename_all = "camelCase")]
struct RawExec {
    command: Option<String>,
    args: Option<Vec<String>>,
    env: Option<Vec<RawExecEnv>>,
    api_version: Option<String>,
    interactive_mode: Option<String>,
    provide_cluster_info: Option<bool>,
    install_hint: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct RawExecEnv {
    name: Option<String>,
    value: Option<String>,
}

/// Turns a kubeconfig `exec` section into an [`ExecConfig`], checking what client-go's
/// validation checks (command, apiVersion, env names, interactiveMode) and refusing
/// `interactiveMode: Always` (podalloc has no terminal to give the plugin).
fn exec_config(
    raw: &RawExec,
    ufile: &Path,
    uowner: &str,
    cluster: &RawCluster,
) -> Result<ExecConfig, KubeError> {
    let command = non_empty(&raw.command).ok_or_else(|| {
        KubeError::Config(format!(
            "{uowner}: exec.command is not set; name the credential plugin to run"
        ))
    })?;
    let api_version = ExecApiVersion::parse(raw.api_version.as_deref(), uowner)?;
    let dir = ufile.parent().unwrap_or(Path::new("."));
    let mut exec = ExecConfig::new(command, dir, api_version, uowner);
    exec.args = raw.args.clone().unwrap_or_default();
    for (i, e) in raw.env.iter().flatten().enumerate() {
        let name = non_empty(&e.name)
            .ok_or_else(|| KubeError::Config(format!("{uowner}: exec.env[{i}] has no name")))?;
        if name.contains('=') {
            return Err(KubeError::Config(format!(
                "{uowner}: exec.env[{i}] name {name:?} contains '='"
            )));
        }
        exec.env.push((
            name.to_string(),
            Secret::new(e.value.clone().unwrap_or_default()),
        ));
    }
    exec.interactive_mode = InteractiveMode::parse(raw.interactive_mode.as_deref(), uowner)?;
    exec.provide_cluster_info = raw.provide_cluster_info.unwrap_or(false);
    exec.install_hint = non_empty(&raw.install_hint).map(str::to_string);
    exec.cluster_config = cluster
        .extensions
        .iter()
        .flatten()
        .find(|e| e.name.as_deref() == Some(EXEC_CLUSTER_EXTENSION))
        .and_then(|e| e.extension.clone());
    exec.check()?;
    Ok(exec)
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct RawAuthProvider {
    name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawNamedContext {
    name: Option<String>,
    context: Option<RawContext>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct RawContext {
    cluster: Option<String>,
    user: Option<String>,
    namespace: Option<String>,
}

/// One entry of a merged kubeconfig, with the file it came from (relative paths in it
/// resolve against that file's directory).
struct Entry<T> {
    value: T,
    file: PathBuf,
}

/// kubeconfig files merged with kubectl's rule: the first file to set a value or map key
/// wins; later files never change it.
#[derive(Default)]
struct MergedKubeconfig {
    files: Vec<PathBuf>,
    current_context: Option<String>,
    clusters: BTreeMap<String, Entry<RawCluster>>,
    users: BTreeMap<String, Entry<RawUser>>,
    contexts: BTreeMap<String, Entry<RawContext>>,
}

impl MergedKubeconfig {
    fn files_display(&self) -> String {
        self.files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    fn merge(&mut self, file: &Path, raw: RawKubeconfig) {
        self.files.push(file.to_path_buf());
        if self.current_context.is_none() {
            self.current_context = raw.current_context.filter(|c| !c.is_empty());
        }
        for c in raw.clusters.unwrap_or_default() {
            if let Some(name) = c.name {
                self.clusters.entry(name).or_insert(Entry {
                    value: c.cluster.unwrap_or_default(),
                    file: file.to_path_buf(),
                });
            }
        }
        for u in raw.users.unwrap_or_default() {
            if let Some(name) = u.name {
                self.users.entry(name).or_insert(Entry {
                    value: u.user.unwrap_or_default(),
                    file: file.to_path_buf(),
                });
            }
        }
        for c in raw.contexts.unwrap_or_default() {
            if let Some(name) = c.name {
                self.contexts.entry(name).or_insert(Entry {
                    value: c.context.unwrap_or_default(),
                    file: file.to_path_buf(),
                });
            }
        }
    }
}

fn names<T>(map: &BTreeMap<String, T>) -> String {
    if map.is_empty() {
        "none".to_string()
    } else {
        map.keys()
            .map(|k| format!("{k:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Parses one kubeconfig file's text. Errors name the file and the position, but never
/// quote the file's content (it may hold tokens).
fn parse_kubeconfig(text: &str, file: &Path) -> Result<RawKubeconfig, KubeError> {
    if text.trim().is_empty() {
        return Ok(RawKubeconfig::default());
    }
    let mut opts = serde_saphyr::Options::default();
    opts.with_snippet = false;
    serde_saphyr::from_str_with_options::<RawKubeconfig>(text, opts).map_err(|e| {
        let at = e
            .location()
            .map(|l| format!(" at line {} column {}", l.line(), l.column()))
            .unwrap_or_default();
        let why = redact_quoted(&e.without_snippet().to_string());
        KubeError::Config(format!(
            "cannot parse kubeconfig {}{at}: {why}",
            file.display()
        ))
    })
}

/// Replaces quoted parts of a parser message (which may echo file content) with `…`.
fn redact_quoted(msg: &str) -> String {
    let first_line = msg.lines().next().unwrap_or("");
    let mut out = String::new();
    let mut quote: Option<char> = None;
    for ch in first_line.chars() {
        match quote {
            Some(q) if ch == q => {
                out.push('…');
                out.push(ch);
                quote = None;
            }
            Some(_) => {}
            None => {
                out.push(ch);
                if ch == '"' || ch == '`' {
                    quote = Some(ch);
                }
            }
        }
    }
    if quote.is_some() {
        out.push('…');
    }
    out
}

fn load_file(path: &Path) -> Result<RawKubeconfig, KubeError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        KubeError::Config(format!("cannot read kubeconfig {}: {e}", path.display()))
    })?;
    parse_kubeconfig(&text, path)
}

/// Finds and merges the kubeconfig files. `Ok(None)`: there is none to read.
fn load_kubeconfig(
    flags: &ConnectionFlags,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<MergedKubeconfig>, KubeError> {
    let mut merged = MergedKubeconfig::default();
    if let Some(path) = &flags.kubeconfig {
        // --kubeconfig: exactly this file, which must exist.
        let raw = load_file(path)?;
        merged.merge(path, raw);
        return Ok(Some(merged));
    }
    if let Some(list) = env("KUBECONFIG").filter(|v| !v.is_empty()) {
        let mut seen: Vec<PathBuf> = Vec::new();
        for path in std::env::split_paths(&list) {
            if path.as_os_str().is_empty() || seen.contains(&path) {
                continue;
            }
            seen.push(path.clone());
            if !path.exists() {
                log::debug!("KUBECONFIG lists {}, which does not exist", path.display());
                continue;
            }
            let raw = load_file(&path)?;
            merged.merge(&path, raw);
        }
        if merged.files.is_empty() {
            log::debug!("none of the KUBECONFIG files exists: {list}");
            return Ok(None);
        }
        return Ok(Some(merged));
    }
    if let Some(home) = env("HOME").filter(|h| !h.is_empty()) {
        let path = Path::new(&home).join(".kube").join("config");
        if path.is_file() {
            let raw = load_file(&path)?;
            merged.merge(&path, raw);
            return Ok(Some(merged));
        }
    }
    Ok(None)
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

fn read_pem_file(path: &Path, what: &str) -> Result<Vec<u8>, KubeError> {
    std::fs::read(path)
        .map_err(|e| KubeError::Config(format!("cannot read {what} {}: {e}", path.display())))
}

fn decode_data(data: &str, field: &str, owner: &str) -> Result<Vec<u8>, KubeError> {
    let compact: String = data.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|_| {
            KubeError::Config(format!(
                "{field} of {owner} is not valid base64 (it must hold base64 of the PEM text)"
            ))
        })
}

fn resolve_rel(file: &Path, p: &str) -> PathBuf {
    let path = Path::new(p);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        file.parent().unwrap_or(Path::new(".")).join(path)
    }
}

fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The kubeconfig's part of the configuration. Fields that `flags` override are not read
/// (so a broken field the flags replace is no error, as with kubectl).
fn from_kubeconfig(kc: &MergedKubeconfig, flags: &ConnectionFlags) -> Result<Partial, KubeError> {
    let files = kc.files_display();
    let ctx_name = match flags.context.as_deref().or(kc.current_context.as_deref()) {
        Some(c) => c.to_string(),
        None => {
            return Err(KubeError::Config(format!(
                "kubeconfig {files} sets no current-context; pass --context NAME \
                 (contexts: {})",
                names(&kc.contexts)
            )))
        }
    };
    let ctx = kc.contexts.get(&ctx_name).ok_or_else(|| {
        KubeError::Config(format!(
            "context {ctx_name:?} not found in kubeconfig {files}; contexts: {}",
            names(&kc.contexts)
        ))
    })?;
    let cluster_name = non_empty(&ctx.value.cluster).ok_or_else(|| {
        KubeError::Config(format!(
            "context {ctx_name:?} in kubeconfig {} names no cluster; set contexts[].context.cluster",
            ctx.file.display()
        ))
    })?;
    let cluster = kc.clusters.get(cluster_name).ok_or_else(|| {
        KubeError::Config(format!(
            "cluster {cluster_name:?} (used by context {ctx_name:?}) not found in kubeconfig \
             {files}; clusters: {}",
            names(&kc.clusters)
        ))
    })?;
    let cfile = &cluster.file;
    let c = &cluster.value;
    let cowner = format!("cluster {cluster_name:?} in kubeconfig {}", cfile.display());

    let mut p = Partial {
        source: format!("kubeconfig {files} (context {ctx_name})"),
        server: non_empty(&c.server).map(str::to_string),
        server_origin: cowner.clone(),
        namespace: non_empty(&ctx.value.namespace).map(str::to_string),
        insecure: c.insecure_skip_tls_verify.unwrap_or(false),
        tls_server_name: non_empty(&c.tls_server_name).map(str::to_string),
        proxy_url: non_empty(&c.proxy_url).map(str::to_string),
        disable_compression: c.disable_compression.unwrap_or(false),
        ..Partial::default()
    };
    let ca_overridden = flags.certificate_authority.is_some() || flags.insecure_skip_tls_verify;
    if ca_overridden {
        // Replaced below by the flags.
    } else if let Some(data) = non_empty(&c.certificate_authority_data) {
        if non_empty(&c.certificate_authority).is_some() {
            log::debug!("{cowner}: certificate-authority-data overrides certificate-authority");
        }
        p.ca = Some(PemData {
            source: format!("certificate-authority-data of {cowner}"),
            pem: decode_data(data, "certificate-authority-data", &cowner)?,
        });
    } else if let Some(path) = non_empty(&c.certificate_authority) {
        let path = resolve_rel(cfile, path);
        p.ca = Some(PemData {
            source: path.display().to_string(),
            pem: read_pem_file(&path, &format!("certificate-authority of {cowner}"))?,
        });
    }
    if p.insecure && p.ca.is_some() {
        return Err(KubeError::Config(format!(
            "{cowner} sets both insecure-skip-tls-verify and a certificate authority; \
             remove one of them"
        )));
    }

    let Some(user_name) = non_empty(&ctx.value.user) else {
        return Ok(p);
    };
    let user = kc.users.get(user_name).ok_or_else(|| {
        KubeError::Config(format!(
            "user {user_name:?} (used by context {ctx_name:?}) not found in kubeconfig {files}; \
             users: {}",
            names(&kc.users)
        ))
    })?;
    let ufile = &user.file;
    let u = &user.value;
    let uowner = format!("user {user_name:?} in kubeconfig {}", ufile.display());

    let token_overridden = flags.token.is_some() || flags.token_file.is_some();
    if token_overridden {
        // Replaced below by the flags.
    } else if let Some(token) = non_empty(&u.token) {
        p.credential = Credential::Token {
            token: Secret::new(token.to_string()),
            source: format!("token of {uowner}"),
        };
    } else if let Some(path) = non_empty(&u.token_file) {
        p.credential = Credential::TokenFile {
            path: resolve_rel(ufile, path),
            source: format!("tokenFile of {uowner}"),
        };
    }
    if flags.client_certificate.is_some() {
        // Replaced below by the flag.
    } else if let Some(data) = non_empty(&u.client_certificate_data) {
        p.client_cert = Some(PemData {
            source: format!("client-certificate-data of {uowner}"),
            pem: decode_data(data, "client-certificate-data", &uowner)?,
        });
    } else if let Some(path) = non_empty(&u.client_certificate) {
        let path = resolve_rel(ufile, path);
        p.client_cert = Some(PemData {
            source: path.display().to_string(),
            pem: read_pem_file(&path, &format!("client-certificate of {uowner}"))?,
        });
    }
    if flags.client_key.is_some() {
        // Replaced below by the flag.
    } else if let Some(data) = non_empty(&u.client_key_data) {
        p.client_key = Some(KeyData {
            source: format!("client-key-data of {uowner}"),
            pem: Secret::new(decode_data(data, "client-key-data", &uowner)?),
        });
    } else if let Some(path) = non_empty(&u.client_key) {
        let path = resolve_rel(ufile, path);
        p.client_key = Some(KeyData {
            source: path.display().to_string(),
            pem: Secret::new(read_pem_file(&path, &format!("client-key of {uowner}"))?),
        });
    }

    if non_empty(&u.impersonate).is_some()
        || non_empty(&u.impersonate_uid).is_some()
        || u.impersonate_groups.as_ref().is_some_and(|g| !g.is_empty())
    {
        return Err(KubeError::Config(format!(
            "{uowner} uses impersonation (as / as-uid / as-groups), which podalloc does not \
             support; use a context whose user is the identity itself"
        )));
    }
    let has_own_credential = !matches!(p.credential, Credential::None) || p.client_cert.is_some();
    let flags_replace_credential =
        token_overridden || (flags.client_certificate.is_some() && flags.client_key.is_some());
    if let Some(exec) = &u.exec {
        if u.auth_provider.is_some() {
            return Err(KubeError::Config(format!(
                "{uowner} sets both exec and auth-provider; keep only one (as kubectl requires)"
            )));
        }
        if flags_replace_credential {
            log::debug!("{uowner}: the exec plugin is not run, the flags give the credential");
        } else if !matches!(p.credential, Credential::None) {
            // client-go: a token already in the request wins over the exec plugin.
            log::debug!("{uowner}: token/tokenFile is used, the exec plugin is not run");
        } else {
            p.credential = Credential::Exec(Box::new(exec_config(exec, ufile, &uowner, c)?));
        }
    } else if let Some(ap) = &u.auth_provider {
        p.unsupported_auth = Some(format!(
            "{uowner} uses auth-provider {:?}, which is not supported (client-go removed \
             in-tree auth providers); pass --token or --token-file, or use a user with a \
             token or client certificate",
            ap.name.as_deref().unwrap_or("?")
        ));
    } else if !has_own_credential
        && (non_empty(&u.username).is_some() || non_empty(&u.password).is_some())
    {
        p.unsupported_auth = Some(format!(
            "{uowner} uses username/password (basic auth), which is not supported; pass \
             --token or --token-file, or use a user with a token or client certificate"
        ));
    }
    Ok(p)
}

fn in_cluster(env: &dyn Fn(&str) -> Option<String>, sa_dir: &Path) -> Option<Partial> {
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
    let flags_only =
        flags.server.is_some() && flags.kubeconfig.is_none() && flags.context.is_none();
    let mut p = if flags_only {
        Partial {
            source: "flags".to_string(),
            ..Partial::default()
        }
    } else if let Some(kc) = load_kubeconfig(flags, env)? {
        let has_context = flags.context.is_some() || kc.current_context.is_some();
        match (has_context, in_cluster(env, sa_dir)) {
            // A kubeconfig without current-context counts as empty (clientcmd), so fall
            // back to in-cluster when possible.
            (false, Some(ic)) if flags.kubeconfig.is_none() => {
                log::debug!(
                    "kubeconfig {} sets no current-context; using the in-cluster config",
                    kc.files_display()
                );
                ic
            }
            _ => from_kubeconfig(&kc, flags)?,
        }
    } else if let Some(ctx) = &flags.context {
        return Err(KubeError::Config(format!(
            "--context {ctx} given, but no kubeconfig was found (looked at --kubeconfig, \
             KUBECONFIG and ~/.kube/config)"
        )));
    } else if let Some(ic) = in_cluster(env, sa_dir) {
        ic
    } else {
        return Err(KubeError::Config(NO_CLUSTER_MESSAGE.to_string()));
    };

    // Flags override field by field (clientcmd's overrides).
    if let Some(server) = &flags.server {
        p.server = Some(server.clone());
        p.server_origin = "--server flag".to_string();
        // kubectl: an overridden server clears the kubeconfig's tls-server-name.
        p.tls_server_name = None;
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
    let token_flag = flags
        .token
        .as_deref()
        .map(str::trim)
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
    let flags_give_credential = token_flag.is_some()
        || flags.token_file.is_some()
        || (flags.client_certificate.is_some() && flags.client_key.is_some());
    if let Some(msg) = p.unsupported_auth.take() {
        if !flags_give_credential {
            return Err(KubeError::Config(msg));
        }
    }

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
mod tests {
    use super::*;
    use crate::kube::testutil::fixture;
    use std::collections::HashMap;

    struct Env(HashMap<String, String>);
    impl Env {
        fn new(pairs: &[(&str, &str)]) -> Env {
            Env(pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect())
        }
        fn get(&self, k: &str) -> Option<String> {
            self.0.get(k).cloned()
        }
    }

    fn resolve_env(
        flags: &ConnectionFlags,
        env: &Env,
        sa: &Path,
    ) -> Result<ClusterConfig, KubeError> {
        resolve_with(flags, &|k| env.get(k), sa)
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, text).unwrap();
        p
    }

    fn err(r: Result<ClusterConfig, KubeError>) -> String {
        match r {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    const SIMPLE: &str = "
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
    fn server_flag_alone_reads_no_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let kc = write(dir.path(), "config", SIMPLE);
        let env = Env::new(&[("KUBECONFIG", kc.to_str().unwrap())]);
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
    fn kubeconfig_basics_and_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        let kc = write(dir.path(), "kube/config", SIMPLE);
        write(dir.path(), "kube/certs/ca.pem", "PEM");
        let env = Env::new(&[("KUBECONFIG", kc.to_str().unwrap())]);
        let c = resolve_env(&ConnectionFlags::default(), &env, dir.path()).unwrap();
        assert_eq!(c.server, "https://dev.example:6443");
        assert_eq!(c.namespace, "team-a");
        assert_eq!(
            c.source,
            format!("kubeconfig {} (context dev)", kc.display())
        );
        let ca = c.tls.ca.as_ref().unwrap();
        assert_eq!(ca.pem, b"PEM");
        assert_eq!(
            ca.source,
            dir.path().join("kube/certs/ca.pem").display().to_string()
        );
        match &c.credential {
            Credential::Token { token, source } => {
                assert_eq!(token.expose(), "sekrit-token");
                assert!(source.contains("user \"dev-user\""), "{source}");
            }
            other => panic!("{other:?}"),
        }
        // Debug never shows the token.
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("sekrit"), "{dbg}");
        assert!(dbg.contains("<redacted>"));

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
    fn missing_names_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let kc = write(dir.path(), "config", SIMPLE);
        write(dir.path(), "certs/ca.pem", "PEM");
        let env = Env::new(&[("KUBECONFIG", kc.to_str().unwrap())]);
        let flags = ConnectionFlags {
            context: Some("prod".into()),
            ..Default::default()
        };
        let e = err(resolve_env(&flags, &env, dir.path()));
        assert!(
            e.contains("context \"prod\" not found") && e.contains("\"dev\", \"other\""),
            "{e}"
        );
        let flags = ConnectionFlags {
            context: Some("other".into()),
            ..Default::default()
        };
        let e = err(resolve_env(&flags, &env, dir.path()));
        assert!(
            e.contains("user \"nobody\"") && e.contains("users: \"dev-user\""),
            "{e}"
        );
        let kc2 = write(
            dir.path(),
            "config2",
            "contexts: [{name: x, context: {cluster: gone, user: u}}]\ncurrent-context: x\n",
        );
        let e = err(resolve_env(
            &ConnectionFlags::default(),
            &Env::new(&[("KUBECONFIG", kc2.to_str().unwrap())]),
            dir.path(),
        ));
        assert!(
            e.contains("cluster \"gone\"") && e.contains("clusters: none"),
            "{e}"
        );
    }

    #[test]
    fn kubeconfig_list_first_file_wins() {
        let dir = tempfile::tempdir().unwrap();
        let a = write(
            dir.path(),
            "a",
            "
clusters:
- name: shared
  cluster: {server: https://from-a:1}
users:
- name: u
  user: {token: token-a}
",
        );
        let b = write(
            dir.path(),
            "b",
            "
current-context: ctx
clusters:
- name: shared
  cluster: {server: https://from-b:2, insecure-skip-tls-verify: true}
- name: only-b
  cluster: {server: https://only-b:3}
users:
- name: u
  user: {token: token-b, client-certificate: x.pem}
contexts:
- name: ctx
  context: {cluster: shared, user: u}
",
        );
        let c = write(dir.path(), "c", "current-context: ignored\n");
        let list = format!(
            "{}::{}:{}:{}:{}",
            a.display(),
            dir.path().join("missing").display(),
            b.display(),
            a.display(),
            c.display()
        );
        let env = Env::new(&[("KUBECONFIG", &list), ("HOME", "/nonexistent")]);
        let cfg = resolve_env(&ConnectionFlags::default(), &env, dir.path()).unwrap();
        assert_eq!(cfg.server, "https://from-a:1");
        assert!(
            !cfg.tls.insecure_skip_tls_verify,
            "cluster entry from a is taken whole"
        );
        assert!(
            cfg.tls.client_cert.is_none(),
            "user entry from a is taken whole"
        );
        assert!(
            matches!(&cfg.credential, Credential::Token { token, .. } if token.expose() == "token-a")
        );
        assert_eq!(
            cfg.source,
            format!(
                "kubeconfig {}:{}:{} (context ctx)",
                a.display(),
                b.display(),
                c.display()
            )
        );

        // --kubeconfig reads only that file.
        let flags = ConnectionFlags {
            kubeconfig: Some(b.clone()),
            ..Default::default()
        };
        let e = err(resolve_env(&flags, &env, dir.path()));
        assert!(e.contains("client-certificate"), "{e}");
        let flags = ConnectionFlags {
            kubeconfig: Some(dir.path().join("nope")),
            ..Default::default()
        };
        assert!(err(resolve_env(&flags, &env, dir.path())).contains("cannot read kubeconfig"));
    }

    #[test]
    fn home_kube_config_and_empty_kubeconfig_var() {
        let home = tempfile::tempdir().unwrap();
        write(
            home.path(),
            ".kube/config",
            "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\nclusters: [{name: k, cluster: {server: 'https://home:1'}}]\n",
        );
        let env = Env::new(&[("HOME", home.path().to_str().unwrap()), ("KUBECONFIG", "")]);
        let c = resolve_env(&ConnectionFlags::default(), &env, home.path()).unwrap();
        assert_eq!(c.server, "https://home:1");
        assert!(matches!(c.credential, Credential::None));
        // KUBECONFIG naming only missing files: ~/.kube/config is not used.
        let env = Env::new(&[
            ("HOME", home.path().to_str().unwrap()),
            ("KUBECONFIG", "/nonexistent/a:/nonexistent/b"),
        ]);
        assert_eq!(
            err(resolve_env(&ConnectionFlags::default(), &env, home.path())),
            NO_CLUSTER_MESSAGE
        );
        // --context without any kubeconfig.
        let flags = ConnectionFlags {
            context: Some("c".into()),
            ..Default::default()
        };
        assert!(err(resolve_env(&flags, &env, home.path())).contains("--context c given"));
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

    #[test]
    fn exec_and_other_unsupported_users() {
        let dir = tempfile::tempdir().unwrap();
        let kc = write(
            dir.path(),
            "config",
            "
current-context: eks
clusters: [{name: c, cluster: {server: 'https://eks.example'}}]
contexts:
- {name: eks, context: {cluster: c, user: aws}}
- {name: basic, context: {cluster: c, user: basic}}
- {name: imp, context: {cluster: c, user: imp}}
- {name: gcp, context: {cluster: c, user: gcp}}
users:
- name: aws
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: aws
      args: [eks, get-token, --cluster-name, x]
      env: [{name: AWS_PROFILE, value: prod}]
- {name: basic, user: {username: admin, password: hunter2}}
- {name: imp, user: {token: t, as: root}}
- {name: gcp, user: {auth-provider: {name: gcp, config: {access-token: zzz}}}}
",
        );
        let env = Env::new(&[("KUBECONFIG", kc.to_str().unwrap())]);
        let c = resolve_env(&ConnectionFlags::default(), &env, dir.path()).unwrap();
        match &c.credential {
            Credential::Exec(e) => {
                assert_eq!(e.command, "aws");
                assert_eq!(e.program, PathBuf::from("aws"));
                assert_eq!(e.args, ["eks", "get-token", "--cluster-name", "x"]);
                assert_eq!(e.env.len(), 1);
                assert_eq!(
                    (e.env[0].0.as_str(), e.env[0].1.expose().as_str()),
                    ("AWS_PROFILE", "prod")
                );
                assert_eq!(e.api_version, ExecApiVersion::V1Beta1);
                assert_eq!(e.interactive_mode, InteractiveMode::IfAvailable);
                assert!(e.user.starts_with("user \"aws\" in kubeconfig "));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            !format!("{c:?}").contains("prod"),
            "env values are redacted"
        );
        let flags = ConnectionFlags {
            token: Some("from-flag".into()),
            ..Default::default()
        };
        let c = resolve_env(&flags, &env, dir.path()).unwrap();
        assert!(
            matches!(&c.credential, Credential::Token { source, .. } if source == "--token flag")
        );
        for (ctx, needle) in [
            ("basic", "basic auth"),
            ("imp", "impersonation"),
            ("gcp", "auth-provider \"gcp\""),
        ] {
            let flags = ConnectionFlags {
                context: Some(ctx.into()),
                ..Default::default()
            };
            let e = err(resolve_env(&flags, &env, dir.path()));
            assert!(e.contains(needle), "{ctx}: {e}");
            assert!(!e.contains("hunter2") && !e.contains("zzz"), "{e}");
        }
    }

    #[test]
    fn exec_users() {
        let dir = tempfile::tempdir().unwrap();
        let users = "
- name: full
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ./bin/get-token
      args: [--tenant, t1]
      env: [{name: A, value: '1'}, {name: B}]
      interactiveMode: Never
      provideClusterInfo: true
      installHint: |
        Install get-token
        from example.com
- {name: alpha, user: {exec: {apiVersion: client.authentication.k8s.io/v1alpha1, command: p}}}
- {name: always, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: p, interactiveMode: Always}}}
- {name: nocmd, user: {exec: {apiVersion: client.authentication.k8s.io/v1}}}
- {name: noapi, user: {exec: {command: p}}}
- {name: badmode, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: p, interactiveMode: Sometimes}}}
- {name: noname, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: p, env: [{value: x}]}}}
- {name: tokenwins, user: {token: static, exec: {apiVersion: client.authentication.k8s.io/v1, command: p}}}
- {name: both, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: p}, auth-provider: {name: oidc}}}
";
        let mut contexts = String::new();
        for name in [
            "full",
            "alpha",
            "always",
            "nocmd",
            "noapi",
            "badmode",
            "noname",
            "tokenwins",
            "both",
        ] {
            contexts.push_str(&format!(
                "- {{name: {name}, context: {{cluster: c, user: {name}}}}}\n"
            ));
        }
        let kc = write(
            dir.path(),
            "kube/config",
            &format!(
                "current-context: full
clusters:
- name: c
  cluster:
    server: https://k.example
    extensions:
    - name: client.authentication.k8s.io/exec
      extension: {{audience: spark, nested: {{n: 1}}}}
    - name: other
      extension: {{x: y}}
contexts:
{contexts}users:{users}"
            ),
        );
        let env = Env::new(&[("KUBECONFIG", kc.to_str().unwrap())]);
        let with_context = |ctx: &str| ConnectionFlags {
            context: Some(ctx.into()),
            ..Default::default()
        };
        let c = resolve_env(&ConnectionFlags::default(), &env, dir.path()).unwrap();
        let Credential::Exec(e) = &c.credential else {
            panic!("{:?}", c.credential)
        };
        assert_eq!(e.program, dir.path().join("kube/./bin/get-token"));
        assert_eq!(e.api_version, ExecApiVersion::V1);
        assert_eq!(e.interactive_mode, InteractiveMode::Never);
        assert!(e.provide_cluster_info);
        assert_eq!(
            e.cluster_config,
            Some(serde_json::json!({"audience": "spark", "nested": {"n": 1}}))
        );
        assert_eq!(
            e.env
                .iter()
                .map(|(k, v)| format!("{k}={}", v.expose()))
                .collect::<Vec<_>>(),
            ["A=1", "B="]
        );
        assert_eq!(
            e.install_hint.as_deref(),
            Some("Install get-token\nfrom example.com")
        );
        assert_eq!(
            c.credential.describe(),
            format!(
                "exec plugin \"./bin/get-token\" (user \"full\" in kubeconfig {})",
                kc.display()
            )
        );

        for (ctx, needle) in [
            ("alpha", "v1alpha1 was removed"),
            ("always", "interactiveMode: Always"),
            ("nocmd", "exec.command is not set"),
            ("noapi", "exec.apiVersion is not set"),
            ("badmode", "\"Sometimes\" is not valid"),
            ("noname", "exec.env[0] has no name"),
            ("both", "both exec and auth-provider"),
        ] {
            let e = err(resolve_env(&with_context(ctx), &env, dir.path()));
            assert!(
                e.contains(&format!("user \"{ctx}\"")) && e.contains(needle),
                "{ctx}: {e}"
            );
        }
        // A static token beats the plugin (client-go).
        let c = resolve_env(&with_context("tokenwins"), &env, dir.path()).unwrap();
        assert!(
            matches!(&c.credential, Credential::Token { token, .. } if token.expose() == "static")
        );
        // Flags replace the plugin, and a broken exec section is then no error.
        let flags = ConnectionFlags {
            token_file: Some(kc.clone()),
            ..with_context("always")
        };
        let c = resolve_env(&flags, &env, dir.path()).unwrap();
        assert!(matches!(&c.credential, Credential::TokenFile { .. }));
        let flags = ConnectionFlags {
            client_certificate: Some(kc.clone()),
            client_key: Some(kc.clone()),
            ..with_context("full")
        };
        let c = resolve_env(&flags, &env, dir.path()).unwrap();
        assert!(matches!(&c.credential, Credential::None));
        assert!(c.tls.client_cert.is_some());
    }

    #[test]
    fn certificate_authority_data_with_newlines_and_bad_base64() {
        let dir = tempfile::tempdir().unwrap();
        let kc = write(
            dir.path(),
            "config",
            "current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters:
- name: k
  cluster:
    server: https://h
    certificate-authority-data: |
      UEVN
      Q0E=
    disable-compression: true
    tls-server-name: api.internal
    proxy-url: http://user:pw@proxy:3128
users:
- name: u
  user: {client-key-data: '!!notbase64', client-certificate-data: UEVN}
",
        );
        let env = Env::new(&[("KUBECONFIG", kc.to_str().unwrap())]);
        let e = err(resolve_env(&ConnectionFlags::default(), &env, dir.path()));
        assert!(
            e.contains("client-key-data") && e.contains("not valid base64"),
            "{e}"
        );
        assert!(!e.contains("notbase64"), "{e}");
        let flags = ConnectionFlags {
            client_key: Some(kc.clone()),
            ..Default::default()
        };
        let c = resolve_env(&flags, &env, dir.path()).unwrap();
        assert_eq!(c.tls.ca.as_ref().unwrap().pem, b"PEMCA");
        assert!(c.disable_compression);
        assert_eq!(c.tls.tls_server_name.as_deref(), Some("api.internal"));
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("pw@") && dbg.contains("<redacted>@proxy:3128"),
            "{dbg}"
        );
        // --server clears tls-server-name (kubectl).
        let flags = ConnectionFlags {
            client_key: Some(kc.clone()),
            server: Some("https://elsewhere".into()),
            kubeconfig: Some(kc.clone()),
            ..Default::default()
        };
        let c = resolve_env(&flags, &env, dir.path()).unwrap();
        assert_eq!(c.tls.tls_server_name, None);
    }

    #[test]
    fn parse_errors_do_not_quote_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let kc = write(
            dir.path(),
            "config",
            "current-context: c\nclusters:\n- name: k\n  cluster:\n    insecure-skip-tls-verify: \"supersecret\"\n",
        );
        let env = Env::new(&[("KUBECONFIG", kc.to_str().unwrap())]);
        let e = err(resolve_env(&ConnectionFlags::default(), &env, dir.path()));
        assert!(
            e.contains("cannot parse kubeconfig") && e.contains("line 5"),
            "{e}"
        );
        assert!(!e.contains("supersecret"), "{e}");
        let kc = write(
            dir.path(),
            "config",
            "users: [ {name: x, user: {token: 'abc'\n",
        );
        let e = err(resolve_env(&ConnectionFlags::default(), &env, dir.path()));
        assert!(
            e.contains("cannot parse kubeconfig") && !e.contains("abc"),
            "{e}"
        );
        let _ = kc;
    }

    #[test]
    fn java_client_fixtures_parse() {
        let sa = tempfile::tempdir().unwrap();
        let x509 = fixture("java-client_kubeconfig-https-x509.yaml");
        let flags = ConnectionFlags {
            kubeconfig: Some(x509.clone()),
            ..Default::default()
        };
        let c = resolve_env(&flags, &Env::new(&[]), sa.path()).unwrap();
        assert_eq!(c.server, "https://localhost:443");
        assert_eq!(
            c.source,
            format!("kubeconfig {} (context foo-context)", x509.display())
        );
        assert!(
            String::from_utf8_lossy(&c.tls.client_cert.as_ref().unwrap().pem)
                .contains("BEGIN CERTIFICATE")
        );
        assert!(
            String::from_utf8_lossy(c.tls.client_key.as_ref().unwrap().pem.expose())
                .contains("BEGIN RSA PRIVATE KEY")
        );
        assert!(c.tls.ca.is_none());
        assert!(!format!("{c:?}").contains("PRIVATE KEY"));

        let tsn = fixture("java-client_kubeconfig-tls-server-name.yaml");
        let flags = ConnectionFlags {
            kubeconfig: Some(tsn),
            ..Default::default()
        };
        let c = resolve_env(&flags, &Env::new(&[]), sa.path()).unwrap();
        assert_eq!(c.server, "https://192.168.1.1:6443");
        assert_eq!(
            c.tls.tls_server_name.as_deref(),
            Some("my-cluster.example.com")
        );
        assert!(
            String::from_utf8_lossy(&c.tls.ca.as_ref().unwrap().pem).contains("BEGIN CERTIFICATE")
        );
        assert!(
            matches!(&c.credential, Credential::Token { token, .. } if token.expose() == "test-token")
        );
        assert_eq!(c.namespace, "default");
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
        assert_eq!(
            redact_quoted("invalid type: string \"abc\", expected `bool`"),
            "invalid type: string \"…\", expected `…`"
        );
        let f = ConnectionFlags {
            token: Some("tok123".into()),
            ..Default::default()
        };
        assert!(!format!("{f:?}").contains("tok123"));
    }
}
