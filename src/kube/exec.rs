//! Exec credential plugins (`users[].user.exec` in a kubeconfig): what EKS (`aws eks
//! get-token`), GKE (`gke-gcloud-auth-plugin`) and AKS (`kubelogin`) users have.
//!
//! The rules follow client-go's exec authenticator (`k8s.io/client-go/plugin/pkg/client/auth/
//! exec/exec.go`) and the `client.authentication.k8s.io` API (Kubernetes docs,
//! "Authenticating", section "client-go credential plugins"):
//!
//! - the plugin runs with the inherited environment plus the kubeconfig's `env` entries and
//!   `KUBERNETES_EXEC_INFO` (an `ExecCredential` JSON whose `spec.interactive` is always
//!   `false` here, and whose `spec.cluster` is present when `provideClusterInfo: true`);
//! - stdin is `/dev/null`: podalloc never hands a terminal to a plugin (it runs from cron and
//!   in pods), so `interactiveMode: Always` is refused when the configuration is resolved;
//! - stdout must be one `ExecCredential` of the **same apiVersion** with `status.token`, or
//!   `status.clientCertificateData` + `status.clientKeyData` (plain PEM, not base64), or both,
//!   and optionally `status.expirationTimestamp` (RFC 3339);
//! - the credential is cached until shortly before `expirationTimestamp` (see
//!   [`ExecCredential::refresh_time`]), or, without one, until the server answers 401; after a
//!   401 the plugin is run once more and the request retried once.
//!
//! The plugin's stdout is never logged or quoted in errors (it carries the credential); a
//! failure is described by the exit code and the first line of stderr only. A plugin that
//! does not finish within the client's `exec_timeout` (60 s by default) is killed.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::Deserialize;

use super::error::{truncate_chars, KubeError};
use super::secret::{KeyData, PemData, Secret};

/// `apiVersion` of the v1 `ExecCredential` (Kubernetes ≥ 1.22).
pub const EXEC_API_V1: &str = "client.authentication.k8s.io/v1";
/// `apiVersion` of the v1beta1 `ExecCredential` (still what many kubeconfigs name).
pub const EXEC_API_V1BETA1: &str = "client.authentication.k8s.io/v1beta1";
/// The environment variable that carries the `ExecCredential` input to the plugin.
pub const EXEC_INFO_ENV: &str = "KUBERNETES_EXEC_INFO";
/// The name of the cluster extension whose `extension` is passed to the plugin as
/// `spec.cluster.config` (client-go's `clusterExtensionKey`).
pub const EXEC_CLUSTER_EXTENSION: &str = "client.authentication.k8s.io/exec";
/// How long before `expirationTimestamp` a cached credential is renewed, at most (it is never
/// renewed before half of its lifetime has passed; see [`ExecCredential::refresh_time`]).
pub const EXEC_EXPIRY_LEEWAY: Duration = Duration::from_secs(10);
/// Default time a plugin may take before it is killed (`ClientOptions::exec_timeout`).
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// Most bytes of the plugin's stdout that are read; a larger output is an error.
const MAX_STDOUT: usize = 1024 * 1024;
/// Longest bearer token accepted, in bytes: the `Authorization` header must fit the HTTP
/// client's 128 KiB output buffer with the rest of the request head, and API servers cap
/// header sizes too (Go's `net/http` default is 1 MiB for all headers together).
pub(super) const MAX_TOKEN_BYTES: usize = 64 * 1024;
/// Most bytes of the plugin's stderr that are kept.
const MAX_STDERR: usize = 64 * 1024;
/// Longest stderr line quoted in an error, in characters.
const MAX_STDERR_LINE: usize = 300;

/// The `ExecCredential` API version a plugin speaks. `v1alpha1` was removed in Kubernetes
/// 1.24 and is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecApiVersion {
    /// `client.authentication.k8s.io/v1`.
    V1,
    /// `client.authentication.k8s.io/v1beta1`.
    V1Beta1,
}

impl ExecApiVersion {
    /// The `apiVersion` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecApiVersion::V1 => EXEC_API_V1,
            ExecApiVersion::V1Beta1 => EXEC_API_V1BETA1,
        }
    }

    /// Parses a kubeconfig's `exec.apiVersion`. `owner` names the user for the message.
    ///
    /// Errors: [`KubeError::Config`] for a missing value, `v1alpha1` (removed upstream) or
    /// any other version.
    pub fn parse(value: Option<&str>, owner: &str) -> Result<ExecApiVersion, KubeError> {
        match value.map(str::trim) {
            Some(EXEC_API_V1) => Ok(ExecApiVersion::V1),
            Some(EXEC_API_V1BETA1) => Ok(ExecApiVersion::V1Beta1),
            None | Some("") => Err(KubeError::Config(format!(
                "{owner}: exec.apiVersion is not set; set it to {EXEC_API_V1} or \
                 {EXEC_API_V1BETA1} (whichever the plugin supports)"
            ))),
            Some("client.authentication.k8s.io/v1alpha1") => Err(KubeError::Config(format!(
                "{owner}: exec.apiVersion client.authentication.k8s.io/v1alpha1 was removed in \
                 Kubernetes 1.24 and is not supported; set it to {EXEC_API_V1BETA1} or \
                 {EXEC_API_V1} (and update the plugin if it needs to)"
            ))),
            Some(other) => Err(KubeError::Config(format!(
                "{owner}: exec.apiVersion {other:?} is not supported; use {EXEC_API_V1} or \
                 {EXEC_API_V1BETA1}"
            ))),
        }
    }
}

/// The kubeconfig's `exec.interactiveMode`. podalloc never has a terminal to give a plugin,
/// so `Always` is refused when the configuration is resolved and the other two both mean
/// "run with stdin closed, `spec.interactive: false`".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InteractiveMode {
    /// `Never`: the plugin must not ask anything.
    Never,
    /// `IfAvailable` (client-go's default for v1beta1; podalloc also uses it when a v1
    /// config leaves the field out, where kubectl would refuse the kubeconfig).
    #[default]
    IfAvailable,
    /// `Always`: the plugin needs a terminal; refused.
    Always,
}

impl InteractiveMode {
    /// Parses `exec.interactiveMode` (`None` or empty → `IfAvailable`).
    ///
    /// Errors: [`KubeError::Config`] for an unknown value.
    pub fn parse(value: Option<&str>, owner: &str) -> Result<InteractiveMode, KubeError> {
        match value.map(str::trim).unwrap_or("") {
            "" | "IfAvailable" => Ok(InteractiveMode::IfAvailable),
            "Never" => Ok(InteractiveMode::Never),
            "Always" => Ok(InteractiveMode::Always),
            other => Err(KubeError::Config(format!(
                "{owner}: exec.interactiveMode {other:?} is not valid; use Never, IfAvailable \
                 or Always"
            ))),
        }
    }
}

/// An exec credential plugin as a kubeconfig user configures it (`users[].user.exec`).
///
/// `Debug` shows the command, the arguments and the names of the `env` entries, never their
/// values (they may hold secrets).
#[derive(Clone)]
pub struct ExecConfig {
    /// `exec.command` as written, for messages.
    pub command: String,
    /// What is run: `command` joined to the kubeconfig's directory when it is a relative
    /// path with a `/` (client-go's rule), else `command` itself (looked up in `PATH`).
    pub program: PathBuf,
    /// `exec.args`.
    pub args: Vec<String>,
    /// `exec.env`: name/value pairs added to the inherited environment.
    pub env: Vec<(String, Secret<String>)>,
    /// `exec.apiVersion`; the plugin must answer with the same version.
    pub api_version: ExecApiVersion,
    /// `exec.interactiveMode`.
    pub interactive_mode: InteractiveMode,
    /// `exec.provideClusterInfo`: pass `spec.cluster` in `KUBERNETES_EXEC_INFO`.
    pub provide_cluster_info: bool,
    /// The `extension` of the cluster's `client.authentication.k8s.io/exec` extension,
    /// passed as `spec.cluster.config` when `provide_cluster_info`.
    pub cluster_config: Option<serde_json::Value>,
    /// `exec.installHint`, shown when the command cannot be found.
    pub install_hint: Option<String>,
    /// The kubeconfig user this comes from, e.g. `user "aws" in kubeconfig /home/a/.kube/config`.
    pub user: String,
}

impl fmt::Debug for ExecConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecConfig")
            .field("command", &self.command)
            .field("program", &self.program)
            .field("args", &self.args)
            .field(
                "env",
                &self.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            )
            .field("api_version", &self.api_version.as_str())
            .field("interactive_mode", &self.interactive_mode)
            .field("provide_cluster_info", &self.provide_cluster_info)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl ExecConfig {
    /// A plugin running `command` with no arguments, speaking `api_version`, for `user`.
    /// `kubeconfig_dir` is where a relative `command` with a `/` is resolved.
    pub fn new(
        command: &str,
        kubeconfig_dir: &Path,
        api_version: ExecApiVersion,
        user: &str,
    ) -> ExecConfig {
        ExecConfig {
            command: command.to_string(),
            program: resolve_command(command, kubeconfig_dir),
            args: Vec::new(),
            env: Vec::new(),
            api_version,
            interactive_mode: InteractiveMode::IfAvailable,
            provide_cluster_info: false,
            cluster_config: None,
            install_hint: None,
            user: user.to_string(),
        }
    }

    /// The plugin for messages: `exec plugin "aws" (user "aws" in kubeconfig /k)`.
    pub fn describe(&self) -> String {
        format!("exec plugin {:?} ({})", self.command, self.user)
    }

    /// Refuses what cannot work without a terminal.
    ///
    /// Errors: [`KubeError::Config`] for `interactiveMode: Always`.
    pub fn check(&self) -> Result<(), KubeError> {
        if self.interactive_mode == InteractiveMode::Always {
            return Err(KubeError::Config(format!(
                "{} has interactiveMode: Always, but podalloc never gives a plugin a terminal \
                 (it runs unattended, e.g. from cron or in a pod); set interactiveMode to Never \
                 or IfAvailable and make the plugin work without prompting (e.g. log in \
                 beforehand), or pass --token / --token-file",
                self.describe()
            )));
        }
        Ok(())
    }
}

/// client-go's rule for `exec.command`: a relative path with a separator is relative to the
/// kubeconfig's directory; a bare name is looked up in `PATH` when run.
pub(crate) fn resolve_command(command: &str, kubeconfig_dir: &Path) -> PathBuf {
    let p = Path::new(command);
    if command.contains('/') && p.is_relative() {
        kubeconfig_dir.join(p)
    } else {
        p.to_path_buf()
    }
}

/// The connection facts passed as `spec.cluster` when `provideClusterInfo: true`
/// (client-go's `clientauthentication.Cluster`).
#[derive(Clone, Debug, Default)]
pub struct ExecClusterInfo {
    /// `server`: the API server URL.
    pub server: String,
    /// `tls-server-name`.
    pub tls_server_name: Option<String>,
    /// `insecure-skip-tls-verify`.
    pub insecure_skip_tls_verify: bool,
    /// The CA bundle PEM, sent base64-encoded as `certificate-authority-data`.
    pub certificate_authority: Option<Vec<u8>>,
    /// `proxy-url`.
    pub proxy_url: Option<String>,
    /// `disable-compression`.
    pub disable_compression: bool,
    /// `config`: the cluster's `client.authentication.k8s.io/exec` extension.
    pub config: Option<serde_json::Value>,
}

impl ExecClusterInfo {
    /// The JSON object of `spec.cluster` (optional fields left out when unset, as the Go
    /// `omitempty` tags do).
    pub fn to_json(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("server".into(), self.server.clone().into());
        if let Some(n) = &self.tls_server_name {
            m.insert("tls-server-name".into(), n.clone().into());
        }
        if self.insecure_skip_tls_verify {
            m.insert("insecure-skip-tls-verify".into(), true.into());
        }
        if let Some(ca) = &self.certificate_authority {
            m.insert(
                "certificate-authority-data".into(),
                base64::engine::general_purpose::STANDARD.encode(ca).into(),
            );
        }
        if let Some(p) = &self.proxy_url {
            m.insert("proxy-url".into(), p.clone().into());
        }
        if self.disable_compression {
            m.insert("disable-compression".into(), true.into());
        }
        if let Some(c) = &self.config {
            m.insert("config".into(), c.clone());
        }
        serde_json::Value::Object(m)
    }
}

/// The value of `KUBERNETES_EXEC_INFO`:
/// `{"apiVersion":…,"kind":"ExecCredential","spec":{"interactive":false,"cluster":{…}}}`,
/// `cluster` only when given.
pub fn exec_info(api_version: ExecApiVersion, cluster: Option<&ExecClusterInfo>) -> String {
    let mut spec = serde_json::json!({ "interactive": false });
    if let Some(c) = cluster {
        spec["cluster"] = c.to_json();
    }
    serde_json::json!({
        "apiVersion": api_version.as_str(),
        "kind": "ExecCredential",
        "spec": spec,
    })
    .to_string()
}

/// What a plugin returned. `Debug` redacts the token and the key.
#[derive(Clone, Debug)]
pub struct ExecCredential {
    /// `status.token`, trimmed: the bearer token.
    pub token: Option<Secret<String>>,
    /// `status.clientCertificateData`: PEM client certificate (chain).
    pub client_certificate: Option<PemData>,
    /// `status.clientKeyData`: PEM private key of the certificate.
    pub client_key: Option<KeyData>,
    /// `status.expirationTimestamp`; `None`: valid until the server answers 401.
    pub expiration: Option<SystemTime>,
}

impl ExecCredential {
    /// When a credential fetched at `fetched_at` should be renewed: [`EXEC_EXPIRY_LEEWAY`]
    /// (10 s) before `expiration`, but never earlier than halfway between `fetched_at` and
    /// `expiration`, so that short-lived credentials are still reused. (client-go uses a
    /// credential up to the instant of expiry; renewing a little early keeps a request
    /// from carrying a token that expires in flight.) `None` without an expiration.
    pub fn refresh_time(&self, fetched_at: SystemTime) -> Option<SystemTime> {
        let exp = self.expiration?;
        let lifetime = exp.duration_since(fetched_at).unwrap_or(Duration::ZERO);
        Some(exp - EXEC_EXPIRY_LEEWAY.min(lifetime / 2))
    }
}

#[derive(Deserialize)]
struct RawOutput {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    status: Option<RawStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawStatus {
    token: Option<String>,
    client_certificate_data: Option<String>,
    client_key_data: Option<String>,
    expiration_timestamp: Option<String>,
}

fn header_safe(token: &str) -> bool {
    token.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// Parses a plugin's stdout. `expected` is the configured apiVersion, which the output must
/// repeat; `plugin` names the plugin in messages (see [`ExecConfig::describe`]).
///
/// Errors: [`KubeError::Auth`] for output that is not JSON, not an `ExecCredential`, of
/// another apiVersion, without `status`, with neither a token nor a certificate/key pair,
/// with only one of certificate and key, with a token that cannot be a header value, or with
/// an `expirationTimestamp` that is not RFC 3339. Messages never quote the output.
pub fn parse_exec_credential(
    stdout: &[u8],
    expected: ExecApiVersion,
    plugin: &str,
) -> Result<ExecCredential, KubeError> {
    let bad = |why: String| printed(plugin, why);
    let raw: RawOutput = serde_json::from_slice(stdout).map_err(|e| {
        // serde's message can quote values (the token): give only the position.
        let what = match e.classify() {
            serde_json::error::Category::Data => "an ExecCredential with a field of the wrong type",
            _ => "output that is not JSON",
        };
        bad(format!(
            "{what} (line {} column {}); expected an ExecCredential object on stdout",
            e.line(),
            e.column()
        ))
    })?;
    check_type_meta(&raw, expected, plugin)?;
    let status = raw
        .status
        .ok_or_else(|| bad("an ExecCredential without status".to_string()))?;
    let token = status
        .token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty());
    if token.is_some_and(|t| !header_safe(t)) {
        return Err(bad(
            "a token with characters not allowed in a bearer token".to_string()
        ));
    }
    if let Some(t) = token.filter(|t| t.len() > MAX_TOKEN_BYTES) {
        return Err(bad(format!(
            "a token of {} bytes; at most {MAX_TOKEN_BYTES} bytes fit in the Authorization \
             header",
            t.len()
        )));
    }
    let (cert, key) = client_pair(&status, plugin)?;
    if token.is_none() && cert.is_none() {
        return Err(bad(
            "an ExecCredential with neither status.token nor status.clientCertificateData and \
             status.clientKeyData"
                .to_string(),
        ));
    }
    let expiration = match status.expiration_timestamp.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(ts) => Some(parse_rfc3339(ts).ok_or_else(|| {
            bad(format!(
                "status.expirationTimestamp {ts:?}, which is not an RFC 3339 time"
            ))
        })?),
    };
    Ok(ExecCredential {
        token: token.map(|t| Secret::new(t.to_string())),
        client_certificate: cert,
        client_key: key,
        expiration,
    })
}

/// The error for a plugin's unusable output: `PLUGIN printed WHY`.
fn printed(plugin: &str, why: String) -> KubeError {
    KubeError::Auth(format!("{plugin} printed {why}"))
}

/// Checks that the output is an `ExecCredential` of the configured apiVersion.
fn check_type_meta(
    raw: &RawOutput,
    expected: ExecApiVersion,
    plugin: &str,
) -> Result<(), KubeError> {
    match raw.api_version.as_deref() {
        Some(v) if v == expected.as_str() => {}
        Some(v) => {
            return Err(printed(
                plugin,
                format!(
                    "an ExecCredential of apiVersion {v:?}, but the kubeconfig says {}; set \
                     exec.apiVersion to the version the plugin speaks",
                    expected.as_str()
                ),
            ))
        }
        None => {
            return Err(printed(
                plugin,
                format!(
                    "an object without apiVersion; expected an ExecCredential of {}",
                    expected.as_str()
                ),
            ))
        }
    }
    if raw.kind.as_deref() != Some("ExecCredential") {
        return Err(printed(
            plugin,
            format!(
                "an object of kind {:?}, not ExecCredential",
                raw.kind.as_deref().unwrap_or("")
            ),
        ));
    }
    Ok(())
}

/// The client certificate and key of a plugin's `status`: both or neither.
fn client_pair(
    status: &RawStatus,
    plugin: &str,
) -> Result<(Option<PemData>, Option<KeyData>), KubeError> {
    let nonempty = |v: &Option<String>| v.clone().filter(|s| !s.trim().is_empty());
    let half = |has: &str, lacks: &str| {
        printed(
            plugin,
            format!("{has} without {lacks}; a plugin must return both or neither"),
        )
    };
    match (
        nonempty(&status.client_certificate_data),
        nonempty(&status.client_key_data),
    ) {
        (Some(c), Some(k)) => Ok((
            Some(PemData {
                source: format!("clientCertificateData from {plugin}"),
                pem: c.into_bytes(),
            }),
            Some(KeyData {
                source: format!("clientKeyData from {plugin}"),
                pem: Secret::new(k.into_bytes()),
            }),
        )),
        (None, None) => Ok((None, None)),
        (Some(_), None) => Err(half("clientCertificateData", "clientKeyData")),
        (None, Some(_)) => Err(half("clientKeyData", "clientCertificateData")),
    }
}

/// Parses an RFC 3339 date-time (`2024-05-01T12:00:00Z`, `…T12:00:00.123456+02:00`), as Go's
/// `time.RFC3339` accepts. `None` when it is not one.
pub(crate) fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = b.get(from..from + len)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let sep = |i: usize, c: u8| b.get(i) == Some(&c);
    if !(sep(4, b'-') && sep(7, b'-') && (sep(10, b'T') || sep(10, b't')) && sep(13, b':'))
        || !sep(16, b':')
    {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos: u32 = 0;
    if sep(i, b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
        let digits = &s[start..i.min(start + 9)];
        nanos = format!("{digits:0<9}").parse().ok()?;
    }
    let offset_secs = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && sep(i + 3, b':') => {
            let (oh, om) = (num(i + 1, 2)?, num(i + 4, 2)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'-' {
                -o
            } else {
                o
            }
        }
        _ => return None,
    };
    // Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    // A leap second (:60) counts as :59, as Go does not represent it either.
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_secs;
    if secs >= 0 {
        Some(UNIX_EPOCH + Duration::new(secs as u64, nanos))
    } else {
        (UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())).checked_add(Duration::new(0, nanos))
    }
}

/// One output pipe of a plugin, read on the caller's thread as it fills: the first `cap`
/// bytes are kept, the rest read and dropped (so a full pipe never blocks the plugin).
struct Drain {
    /// `None` once it reached end of file (or failed to read).
    pipe: Option<std::fs::File>,
    cap: usize,
    kept: Vec<u8>,
    /// Whether more than `cap` bytes came.
    over: bool,
}

impl Drain {
    fn new(pipe: Option<impl Into<std::os::fd::OwnedFd>>, cap: usize) -> Drain {
        Drain {
            pipe: pipe.map(|p| std::fs::File::from(p.into())),
            cap,
            kept: Vec::new(),
            over: false,
        }
    }

    /// A pipe already closed (what [`RunningPlugin`] leaves behind once it took the output).
    fn closed() -> Drain {
        Drain {
            pipe: None,
            cap: 0,
            kept: Vec::new(),
            over: false,
        }
    }

    /// One read, after a poll said the pipe is readable (so it does not block): keeps what
    /// fits under the cap; closes the pipe at end of file or on an error.
    fn read_once(&mut self) {
        let Some(pipe) = &mut self.pipe else {
            return;
        };
        let mut buf = [0u8; 8192];
        match pipe.read(&mut buf) {
            Ok(0) => self.pipe = None,
            Ok(n) => {
                let room = self.cap.saturating_sub(self.kept.len());
                self.kept.extend_from_slice(&buf[..n.min(room)]);
                self.over |= n > room;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => self.pipe = None,
        }
    }
}

/// Waits up to `wait` for output on the pipes still open and reads once from each that has
/// some (poll(2)); with none open, sleeps `wait`. Interrupted by a signal: reads nothing.
/// Returns whether a pipe was ready.
fn drain(pipes: &mut [Drain], wait: Duration) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let ready: Vec<bool> = {
        let mut fds: Vec<PollFd<'_>> = (pipes.iter())
            .filter_map(|d| d.pipe.as_ref())
            .map(|f| PollFd::new(f, PollFlags::IN))
            .collect();
        if fds.is_empty() {
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            return false;
        }
        let ts = Timespec {
            tv_sec: wait.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: wait.subsec_nanos().into(),
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(_) => fds.iter().map(|f| !f.revents().is_empty()).collect(),
            Err(_) => return false,
        }
    };
    let open = pipes.iter_mut().filter(|d| d.pipe.is_some());
    let mut any = false;
    for (d, ready) in open.zip(ready) {
        if ready {
            d.read_once();
            any = true;
        }
    }
    any
}

/// [`drain`], then reads on without waiting while output is ready (at most [`MAX_STDOUT`]
/// and [`MAX_STDERR`]'s worth of 8 KiB reads), so that a plugin polled only now and then
/// ([`RunningPlugin::poll`] between requests) is not held up by a full pipe for long.
fn drain_ready(pipes: &mut [Drain], wait: Duration) {
    const MOST_READS: usize = (MAX_STDOUT + MAX_STDERR) / 8192 + 2;
    if drain(pipes, wait) {
        for _ in 0..MOST_READS {
            if !drain(pipes, Duration::ZERO) {
                break;
            }
        }
    }
}

/// The first non-empty line of a plugin's stderr, cut to a length fit for one message, with
/// token-like values redacted ([`redact_tokens`]).
fn first_stderr_line(stderr: &[u8]) -> Option<String> {
    String::from_utf8_lossy(stderr)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| truncate_chars(&redact_tokens(l), MAX_STDERR_LINE))
}

/// Replaces what may be a credential in a line a plugin wrote with `[redacted]`: the value
/// after a word naming a secret (`token`, `password`, `secret`, `authorization`, `key`,
/// followed by `=` or `:`, quotes allowed; `Bearer` followed by a space), and any run of 20 or more
/// token characters (letters, digits, `-_.+/=`) that mixes letters and digits (JWTs,
/// access keys, base64). Words and paths a person reads stay.
pub(crate) fn redact_tokens(line: &str) -> String {
    const NAMES: &[&str] = &[
        "token",
        "password",
        "passwd",
        "secret",
        "bearer",
        "authorization",
        "key",
    ];
    let is_tok = |c: char| c.is_ascii_alphanumeric() || "-_.+/=".contains(c);
    let mut out = String::with_capacity(line.len());
    let mut redact_next = false;
    let mut rest = line;
    while !rest.is_empty() {
        let start = rest.find(is_tok).unwrap_or(rest.len());
        let (sep, tail) = rest.split_at(start);
        out.push_str(sep);
        if tail.is_empty() {
            break;
        }
        let end = tail.find(|c: char| !is_tok(c)).unwrap_or(tail.len());
        let (word, after) = tail.split_at(end);
        // `token=abc`: split at the first '=' so the name is seen as a name.
        let (name, value) = match word.split_once('=') {
            Some((n, v)) if !n.is_empty() => (n, Some(v)),
            _ => (word, None),
        };
        let names_secret = |w: &str| {
            let w = w.to_ascii_lowercase();
            NAMES.iter().any(|n| w.ends_with(n))
        };
        let looks_like_token = |w: &str| {
            w.len() >= 20
                && w.chars().any(|c| c.is_ascii_alphabetic())
                && w.chars().any(|c| c.is_ascii_digit())
        };
        if redact_next && ["bearer", "basic"].contains(&word.to_ascii_lowercase().as_str()) {
            // `Authorization: Bearer X`: the scheme stays, X goes.
            out.push_str(word);
        } else if redact_next {
            out.push_str("[redacted]");
            redact_next = false;
        } else if let Some(v) = value.filter(|_| names_secret(name)) {
            out.push_str(name);
            out.push('=');
            out.push_str(if v.is_empty() { "" } else { "[redacted]" });
            redact_next = v.is_empty();
        } else if looks_like_token(word) {
            out.push_str("[redacted]");
        } else {
            out.push_str(word);
            let assigned = after
                .trim_start_matches(['"', '\'', ' '])
                .starts_with([':', '=']);
            let bearer = word.eq_ignore_ascii_case("bearer") && after.starts_with(' ');
            redact_next = names_secret(word) && (assigned || bearer);
        }
        rest = after;
    }
    out
}

/// Runs the plugin once and parses what it printed.
///
/// `cluster`: `spec.cluster` for `KUBERNETES_EXEC_INFO` (pass it when
/// `provide_cluster_info`). `timeout`: how long the plugin may run before it is killed.
///
/// Errors: [`KubeError::Config`] when the command does not exist (with the kubeconfig's
/// `installHint`), is not executable, or `interactiveMode` is `Always`;
/// [`KubeError::Auth`] when it times out, exits with a non-zero code (the message has the
/// code and the first line of stderr, never stdout), or prints no usable credential (see
/// [`parse_exec_credential`]).
pub fn run_plugin(
    exec: &ExecConfig,
    cluster: Option<&ExecClusterInfo>,
    timeout: Duration,
) -> Result<ExecCredential, KubeError> {
    RunningPlugin::start(exec, cluster, timeout, Arc::default())?.wait(&mut || {})
}

/// How often the wait for a plugin runs its caller's `meanwhile` ([`RunningPlugin::wait`]).
const MEANWHILE_EVERY: Duration = Duration::from_millis(50);

/// A plugin that has been started and has not yet been seen to finish: waited for
/// ([`RunningPlugin::wait`]) when the caller has no credential to go on with, or polled
/// without blocking ([`RunningPlugin::poll`]) when it renews one that is still valid, so that
/// a slow plugin (`aws eks get-token` can take seconds) never holds up the loop, its Lease
/// or its endpoints. Dropped before it finished, it kills the plugin's process group.
pub(crate) struct RunningPlugin {
    child: Child,
    pid: u32,
    /// [`ExecConfig::describe`], for messages.
    plugin: String,
    api_version: ExecApiVersion,
    /// stdout (at most [`MAX_STDOUT`] bytes kept) and stderr (at most [`MAX_STDERR`]).
    pipes: [Drain; 2],
    /// Its exit status, once it has exited (its pipes may still be open).
    status: Option<ExitStatus>,
    started: Instant,
    /// When it is killed, and the timeout that deadline comes from (for the message).
    deadline: Instant,
    timeout: Duration,
    /// Whether it has finished (a result was returned): nothing is left to kill.
    finished: bool,
    /// Holds its process id while it runs (for a process that exits without unwinding:
    /// [`kill_process_group`]).
    slot: Arc<Mutex<Option<u32>>>,
}

impl RunningPlugin {
    /// Starts the plugin (see [`run_plugin`] for `cluster` and `timeout`). It runs until a
    /// [`RunningPlugin::poll`] or [`RunningPlugin::wait`] sees it finish, at most `timeout`
    /// counted from now (a poll after that kills it).
    ///
    /// `slot` holds its process id until it has finished or is dropped.
    ///
    /// Errors: [`KubeError::Config`] as [`run_plugin`]'s, when it cannot be started.
    pub(crate) fn start(
        exec: &ExecConfig,
        cluster: Option<&ExecClusterInfo>,
        timeout: Duration,
        slot: Arc<Mutex<Option<u32>>>,
    ) -> Result<RunningPlugin, KubeError> {
        exec.check()?;
        let plugin = exec.describe();
        let info = exec_info(
            exec.api_version,
            cluster.filter(|_| exec.provide_cluster_info),
        );
        let started = Instant::now();
        let mut child = spawn_plugin(exec, &plugin, info)?;
        log::debug!("running {plugin}");
        *crate::sync::lock(&slot) = Some(child.id());
        Ok(RunningPlugin {
            slot,
            pipes: [
                Drain::new(child.stdout.take(), MAX_STDOUT),
                Drain::new(child.stderr.take(), MAX_STDERR),
            ],
            pid: child.id(),
            child,
            plugin,
            api_version: exec.api_version,
            status: None,
            started,
            deadline: started + timeout,
            timeout,
            finished: false,
        })
    }

    /// Waits for the plugin to finish, running `meanwhile` every [`MEANWHILE_EVERY`] (the
    /// client's hook between requests: the loop answers its endpoints, sees its signals and
    /// renews its Lease while a slow plugin runs). Errors as [`run_plugin`].
    pub(crate) fn wait(mut self, meanwhile: &mut dyn FnMut()) -> Result<ExecCredential, KubeError> {
        let mut last = Instant::now();
        loop {
            if let Some(done) = self.poll(Duration::from_millis(5)) {
                return done;
            }
            if last.elapsed() >= MEANWHILE_EVERY {
                meanwhile();
                last = Instant::now();
            }
        }
    }

    /// [`RunningPlugin::wait`], giving up at `until`: `None` then, the plugin still running
    /// (for a later poll or wait).
    pub(crate) fn wait_until(
        &mut self,
        until: Instant,
        meanwhile: &mut dyn FnMut(),
    ) -> Option<Result<ExecCredential, KubeError>> {
        let mut last = Instant::now();
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if let Some(done) = self.poll(left.min(Duration::from_millis(5))) {
                return Some(done);
            }
            if left.is_zero() {
                return None;
            }
            if last.elapsed() >= MEANWHILE_EVERY {
                meanwhile();
                last = Instant::now();
            }
        }
    }

    /// The plugin, for messages ([`ExecConfig::describe`]).
    pub(crate) fn plugin(&self) -> &str {
        &self.plugin
    }

    /// Reads what the plugin has written (waiting at most `wait` for output) and sees
    /// whether it has finished: `None` while it runs, its credential or its error once it
    /// has (errors as [`run_plugin`]). A plugin past its deadline is killed here.
    pub(crate) fn poll(&mut self, wait: Duration) -> Option<Result<ExecCredential, KubeError>> {
        if self.finished {
            return Some(Err(KubeError::Auth(format!(
                "{}: its result was already taken",
                self.plugin
            ))));
        }
        let out = self.step(wait)?;
        self.finished = true;
        *crate::sync::lock(&self.slot) = None;
        Some(out.and_then(|out| self.credential(out)))
    }

    /// One step of [`RunningPlugin::poll`]: the plugin's output once it has exited and its
    /// stdout has closed (stderr: read until it closes or the deadline, what came is kept).
    ///
    /// Errors: [`KubeError::Auth`] when the plugin or the stdout it holds open outlive the
    /// deadline, or it cannot be waited for.
    fn step(&mut self, wait: Duration) -> Option<Result<PluginOutput, KubeError>> {
        let now = Instant::now();
        if self.status.is_none() {
            match self.child.try_wait() {
                Ok(Some(status)) => self.status = Some(status),
                Ok(None) if now >= self.deadline => {
                    self.kill();
                    return Some(Err(KubeError::Auth(format!(
                        "{} did not finish within {}; it was killed (does it wait for \
                         input, e.g. a login prompt?)",
                        self.plugin,
                        humantime::format_duration(self.timeout)
                    ))));
                }
                Ok(None) => {
                    drain_ready(&mut self.pipes, wait);
                    return None;
                }
                Err(e) => {
                    self.kill();
                    return Some(Err(KubeError::Auth(format!(
                        "{}: cannot wait for it: {e}",
                        self.plugin
                    ))));
                }
            }
        }
        // The pipes close when the plugin exits, unless a process it started keeps them
        // open: stdout must close by the deadline; stderr is read until then.
        let open = |pipes: &[Drain]| pipes.iter().any(|d| d.pipe.is_some());
        let remaining = self.deadline.saturating_duration_since(now);
        if open(&self.pipes) && !remaining.is_zero() {
            drain_ready(&mut self.pipes, wait.min(remaining));
            if open(&self.pipes) && Instant::now() < self.deadline {
                return None;
            }
        }
        if self.pipes[0].pipe.is_some() {
            self.kill();
            return Some(Err(KubeError::Auth(format!(
                "{} exited, but a process it started kept its output open for {}; its \
                 process group was killed (a plugin must not leave a process holding stdout)",
                self.plugin,
                humantime::format_duration(self.timeout)
            ))));
        }
        let [out, err] = std::mem::replace(&mut self.pipes, [Drain::closed(), Drain::closed()]);
        Some(Ok(PluginOutput {
            status: self.status?,
            stdout: out.kept,
            stdout_over: out.over,
            stderr: err.kept,
        }))
    }

    /// Kills the plugin's process group and reaps it.
    fn kill(&mut self) {
        kill_group(&mut self.child, self.pid);
        let _ = self.child.wait();
    }

    /// The credential a finished plugin printed.
    ///
    /// Errors: [`KubeError::Auth`] for a non-zero exit (with its code and the first line of
    /// stderr), too much output, or no usable credential ([`parse_exec_credential`]).
    fn credential(&self, out: PluginOutput) -> Result<ExecCredential, KubeError> {
        let plugin = &self.plugin;
        if !out.status.success() {
            let how = match out.status.code() {
                Some(code) => format!("exit code {code}"),
                None => "a signal".to_string(),
            };
            let said = first_stderr_line(&out.stderr)
                .map(|l| format!(": {l}"))
                .unwrap_or_else(|| " (nothing on stderr)".to_string());
            return Err(KubeError::Auth(format!("{plugin} failed with {how}{said}")));
        }
        if let Some(line) = first_stderr_line(&out.stderr) {
            log::debug!("{plugin} wrote to stderr: {line}");
        }
        if out.stdout_over {
            return Err(KubeError::Auth(format!(
                "{plugin} printed more than {MAX_STDOUT} bytes; expected one ExecCredential"
            )));
        }
        let cred = parse_exec_credential(&out.stdout, self.api_version, plugin)?;
        log::debug!(
            "{plugin} returned a {} in {} ms{}",
            match (&cred.token, &cred.client_certificate) {
                (Some(_), Some(_)) => "token and client certificate",
                (Some(_), None) => "token",
                _ => "client certificate",
            },
            self.started.elapsed().as_millis(),
            match cred.expiration {
                Some(t) => format!(", expiring {}", humantime::format_rfc3339_seconds(t)),
                None => ", without expiry".to_string(),
            }
        );
        Ok(cred)
    }
}

impl Drop for RunningPlugin {
    fn drop(&mut self) {
        if !self.finished {
            self.kill();
            *crate::sync::lock(&self.slot) = None;
        }
    }
}

/// Starts the plugin with its arguments, the kubeconfig's `env`, `KUBERNETES_EXEC_INFO` set
/// to `info`, stdin from `/dev/null` and piped stdout and stderr.
fn spawn_plugin(exec: &ExecConfig, plugin: &str, info: String) -> Result<Child, KubeError> {
    let mut cmd = Command::new(&exec.program);
    // Its own process group, so that a timeout kills what it started too.
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.args(&exec.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in &exec.env {
        cmd.env(name, value.expose());
    }
    cmd.env(EXEC_INFO_ENV, info);
    let mut attempts = 0;
    loop {
        match cmd.spawn() {
            Ok(c) => return Ok(c),
            // A plugin file that another thread or process has just written may still be
            // open for writing somewhere ("text file busy"): try again shortly.
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempts < 5 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(20 * attempts));
            }
            Err(e) => return Err(spawn_error(exec, plugin, &e)),
        }
    }
}

/// What a finished plugin left: its exit status and its output.
struct PluginOutput {
    status: ExitStatus,
    /// At most [`MAX_STDOUT`] bytes.
    stdout: Vec<u8>,
    /// Whether stdout had more than [`MAX_STDOUT`] bytes.
    stdout_over: bool,
    /// At most [`MAX_STDERR`] bytes.
    stderr: Vec<u8>,
}

/// Kills the plugin's process group (the plugin is its leader, see [`spawn_plugin`]), so
/// that processes it started die with it; elsewhere only the plugin itself.
fn kill_group(child: &mut Child, pid: u32) {
    kill_process_group(pid);
    let _ = child.kill();
}

/// Sends SIGKILL to the process group led by plugin `pid` (see [`spawn_plugin`]); nothing
/// elsewhere than on Unix.
pub(crate) fn kill_process_group(pid: u32) {
    #[cfg(unix)]
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// The error for a plugin that could not be started: not found (with the kubeconfig's
/// `installHint`, or where to look), not executable, or another I/O failure.
fn spawn_error(exec: &ExecConfig, plugin: &str, e: &std::io::Error) -> KubeError {
    use std::io::ErrorKind as K;
    let program = exec.program.display();
    match e.kind() {
        K::NotFound => {
            let hint = match exec.install_hint.as_deref().map(str::trim) {
                Some(h) if !h.is_empty() => {
                    // One line: installHints are often several (GKE's is).
                    let h: Vec<&str> = h.split_whitespace().collect();
                    format!("; {}", h.join(" "))
                }
                _ if exec.command.contains('/') => {
                    "; check users[].user.exec.command (a relative path is relative to the \
                     kubeconfig's directory)"
                        .to_string()
                }
                _ => "; install it or put its directory on PATH".to_string(),
            };
            let what = if exec.command.contains('/') {
                format!("{program} does not exist")
            } else {
                format!("{program} is not on PATH")
            };
            KubeError::Config(format!("{plugin} not found: {what}{hint}"))
        }
        K::PermissionDenied => KubeError::Config(format!(
            "{plugin} cannot be run: {program} is not executable ({e})"
        )),
        _ => KubeError::Config(format!("{plugin} cannot be run ({program}): {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "exec plugin \"p\" (user \"u\")";

    fn parse(json: &str, v: ExecApiVersion) -> Result<ExecCredential, KubeError> {
        parse_exec_credential(json.as_bytes(), v, P)
    }

    fn err(json: &str, v: ExecApiVersion) -> String {
        match parse(json, v) {
            Ok(c) => panic!("expected an error, got {c:?}"),
            Err(e) => {
                assert!(matches!(e, KubeError::Auth(_)), "{e:?}");
                e.to_string()
            }
        }
    }

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    #[test]
    fn v1_token_with_expiry() {
        let c = parse(
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","spec":{"interactive":false},"status":{"token":" k8s-aws-v1.abc \n","expirationTimestamp":"2030-01-02T03:04:05Z"}}"#,
            ExecApiVersion::V1,
        )
        .unwrap();
        assert_eq!(c.token.as_ref().unwrap().expose(), "k8s-aws-v1.abc");
        assert!(c.client_certificate.is_none() && c.client_key.is_none());
        assert_eq!(c.expiration, Some(at("2030-01-02T03:04:05Z")));
        assert!(!format!("{c:?}").contains("k8s-aws"));
    }

    #[test]
    fn v1beta1_token_without_expiry_and_unknown_fields() {
        let c = parse(
            r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1beta1","status":{"token":"ya29.x","authProxyHeaders":{"a":["b"]}},"extra":1}"#,
            ExecApiVersion::V1Beta1,
        )
        .unwrap();
        assert_eq!(c.token.unwrap().expose(), "ya29.x");
        assert_eq!(c.expiration, None);
    }

    #[test]
    fn client_certificate_is_plain_pem() {
        let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let key = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";
        let out = serde_json::json!({
            "apiVersion": EXEC_API_V1, "kind": "ExecCredential",
            "status": {"clientCertificateData": cert, "clientKeyData": key,
                       "expirationTimestamp": "2030-01-01T00:00:00.5+01:00"}
        });
        let c = parse(&out.to_string(), ExecApiVersion::V1).unwrap();
        assert!(c.token.is_none());
        assert_eq!(c.client_certificate.as_ref().unwrap().pem, cert.as_bytes());
        assert_eq!(c.client_key.as_ref().unwrap().pem.expose(), key.as_bytes());
        assert_eq!(
            c.expiration,
            Some(at("2029-12-31T23:00:00Z") + Duration::from_millis(500))
        );
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("PRIVATE KEY"), "{dbg}");
        // Token and certificate together are fine.
        let mut both = out.clone();
        both["status"]["token"] = "t".into();
        let c = parse(&both.to_string(), ExecApiVersion::V1).unwrap();
        assert!(c.token.is_some() && c.client_certificate.is_some());
        // One without the other is not.
        let mut half = out.clone();
        half["status"]["clientKeyData"] = "".into();
        let e = err(&half.to_string(), ExecApiVersion::V1);
        assert!(
            e.contains("clientCertificateData without clientKeyData"),
            "{e}"
        );
        let mut half = out;
        half["status"]
            .as_object_mut()
            .unwrap()
            .remove("clientCertificateData");
        let e = err(&half.to_string(), ExecApiVersion::V1);
        assert!(e.contains("clientKeyData without"), "{e}");
        assert!(!e.contains("MIIE"));
    }

    #[test]
    fn bad_output_is_a_clear_error_that_never_quotes_it() {
        let v1 = ExecApiVersion::V1;
        let e = err("", v1);
        assert!(e.starts_with(P) && e.contains("not JSON"), "{e}");
        let e = err("token: sekrit-1\n", v1);
        assert!(e.contains("not JSON") && !e.contains("sekrit"), "{e}");
        let e = err(
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":"sekrit-2"}"#,
            v1,
        );
        assert!(
            e.contains("field of the wrong type") && !e.contains("sekrit"),
            "{e}"
        );
        let e = err(
            r#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"sekrit-3"}}"#,
            v1,
        );
        assert!(
            e.contains("apiVersion \"client.authentication.k8s.io/v1beta1\"")
                && e.contains("kubeconfig says client.authentication.k8s.io/v1")
                && !e.contains("sekrit"),
            "{e}"
        );
        let e = err(r#"{"kind":"ExecCredential","status":{"token":"x"}}"#, v1);
        assert!(e.contains("without apiVersion"), "{e}");
        let e = err(
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"Status","status":{"token":"x"}}"#,
            v1,
        );
        assert!(e.contains("kind \"Status\""), "{e}");
        let e = err(
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"}"#,
            v1,
        );
        assert!(e.contains("without status"), "{e}");
        let e = err(
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"  ","expirationTimestamp":"2030-01-01T00:00:00Z"}}"#,
            v1,
        );
        assert!(e.contains("neither status.token"), "{e}");
        let e = err(
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"a b"}}"#,
            v1,
        );
        assert!(e.contains("not allowed in a bearer token"), "{e}");
        let e = err(
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"x","expirationTimestamp":"tomorrow"}}"#,
            v1,
        );
        assert!(
            e.contains("\"tomorrow\", which is not an RFC 3339 time"),
            "{e}"
        );
    }

    #[test]
    fn rfc3339() {
        let cases = [
            ("1970-01-01T00:00:00Z", 0i64, 0u32),
            ("2024-02-29T12:34:56Z", 1_709_210_096, 0),
            ("2024-02-29t12:34:56z", 1_709_210_096, 0),
            ("2024-02-29T14:34:56+02:00", 1_709_210_096, 0),
            ("2024-02-29T10:04:56-02:30", 1_709_210_096, 0),
            ("2024-02-29T12:34:56.25Z", 1_709_210_096, 250_000_000),
            (
                "2024-02-29T12:34:56.123456789123Z",
                1_709_210_096,
                123_456_789,
            ),
            ("2000-03-01T00:00:00Z", 951_868_800, 0),
            ("1969-12-31T23:59:59Z", -1, 0),
        ];
        for (s, secs, nanos) in cases {
            let t = parse_rfc3339(s).unwrap_or_else(|| panic!("{s}"));
            let want = if secs >= 0 {
                UNIX_EPOCH + Duration::new(secs as u64, nanos)
            } else {
                UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::new(0, nanos)
            };
            assert_eq!(t, want, "{s}");
        }
        for bad in [
            "",
            "2024-02-30T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-01-01 00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+0200",
            "2024-01-01T00:00:00Zjunk",
            "2024-1-01T00:00:00Z",
            "+024-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        // humantime's output round-trips.
        let now = SystemTime::now();
        let s = humantime::format_rfc3339_nanos(now).to_string();
        assert_eq!(parse_rfc3339(&s), Some(now));
    }

    #[test]
    fn refresh_time_is_early_but_not_too_early() {
        let t0 = at("2030-01-01T00:00:00Z");
        let cred = |exp: Option<SystemTime>| ExecCredential {
            token: Some(Secret::new("t".into())),
            client_certificate: None,
            client_key: None,
            expiration: exp,
        };
        assert_eq!(cred(None).refresh_time(t0), None);
        let hour = cred(Some(t0 + Duration::from_secs(3600)));
        assert_eq!(hour.refresh_time(t0), Some(t0 + Duration::from_secs(3590)));
        let short = cred(Some(t0 + Duration::from_secs(4)));
        assert_eq!(short.refresh_time(t0), Some(t0 + Duration::from_secs(2)));
        let past = cred(Some(t0 - Duration::from_secs(4)));
        assert_eq!(past.refresh_time(t0), Some(t0 - Duration::from_secs(4)));
    }

    #[test]
    fn api_version_and_interactive_mode() {
        assert_eq!(
            ExecApiVersion::parse(Some(EXEC_API_V1), "u").unwrap(),
            ExecApiVersion::V1
        );
        assert_eq!(
            ExecApiVersion::parse(Some(" client.authentication.k8s.io/v1beta1 "), "u").unwrap(),
            ExecApiVersion::V1Beta1
        );
        let e = ExecApiVersion::parse(Some("client.authentication.k8s.io/v1alpha1"), "user x")
            .unwrap_err();
        assert!(
            matches!(&e, KubeError::Config(m) if m.starts_with("user x: ") && m.contains("removed in Kubernetes 1.24")),
            "{e}"
        );
        assert!(ExecApiVersion::parse(None, "u")
            .unwrap_err()
            .to_string()
            .contains("not set"));
        assert!(ExecApiVersion::parse(Some("v1"), "u")
            .unwrap_err()
            .to_string()
            .contains("not supported"));
        assert_eq!(
            InteractiveMode::parse(None, "u").unwrap(),
            InteractiveMode::IfAvailable
        );
        assert_eq!(
            InteractiveMode::parse(Some("Never"), "u").unwrap(),
            InteractiveMode::Never
        );
        assert_eq!(
            InteractiveMode::parse(Some("Always"), "u").unwrap(),
            InteractiveMode::Always
        );
        assert!(InteractiveMode::parse(Some("never"), "u").is_err());
    }

    #[test]
    fn exec_info_and_cluster() {
        let v: serde_json::Value =
            serde_json::from_str(&exec_info(ExecApiVersion::V1Beta1, None)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"apiVersion": EXEC_API_V1BETA1, "kind": "ExecCredential",
                               "spec": {"interactive": false}})
        );
        let cluster = ExecClusterInfo {
            server: "https://k:6443".into(),
            tls_server_name: Some("api.internal".into()),
            certificate_authority: Some(b"PEMCA".to_vec()),
            config: Some(serde_json::json!({"region": "eu"})),
            ..Default::default()
        };
        let v: serde_json::Value =
            serde_json::from_str(&exec_info(ExecApiVersion::V1, Some(&cluster))).unwrap();
        assert_eq!(
            v["spec"]["cluster"],
            serde_json::json!({"server": "https://k:6443", "tls-server-name": "api.internal",
                               "certificate-authority-data": "UEVNQ0E=",
                               "config": {"region": "eu"}})
        );
    }

    #[test]
    fn command_resolution() {
        let dir = Path::new("/home/a/.kube");
        assert_eq!(resolve_command("aws", dir), PathBuf::from("aws"));
        assert_eq!(
            resolve_command("./bin/p", dir),
            PathBuf::from("/home/a/.kube/./bin/p")
        );
        assert_eq!(
            resolve_command("bin/p", dir),
            PathBuf::from("/home/a/.kube/bin/p")
        );
        assert_eq!(
            resolve_command("/usr/bin/p", dir),
            PathBuf::from("/usr/bin/p")
        );
        let mut e = ExecConfig::new("p", dir, ExecApiVersion::V1, "user \"u\"");
        e.env
            .push(("AWS_SECRET".into(), Secret::new("hush".into())));
        let dbg = format!("{e:?}");
        assert!(dbg.contains("AWS_SECRET") && !dbg.contains("hush"), "{dbg}");
    }

    // ---- running real plugins (shell scripts) --------------------------------------------

    #[cfg(unix)]
    /// The error message of running `program` in `dir` as a v1 plugin of user "u", which
    /// must fail.
    fn plugin_error(dir: &Path, program: &str) -> String {
        let e = ExecConfig::new(program, dir, ExecApiVersion::V1, "user \"u\"");
        run_plugin(&e, None, DEFAULT_EXEC_TIMEOUT)
            .unwrap_err()
            .to_string()
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[cfg(unix)]
    #[test]
    fn runs_the_plugin_with_env_and_exec_info() {
        let dir = tempfile::tempdir().unwrap();
        script(
            dir.path(),
            "bin/plugin",
            r#"d=$(dirname "$0")
printf '%s' "$KUBERNETES_EXEC_INFO" > "$d/info.json"
printf '%s|%s|%s' "$PLUGIN_MODE" "$1" "$2" > "$d/env.txt"
if read line; then echo "stdin was not empty" >&2; exit 9; fi
echo '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"tok-from-plugin"}}'"#,
        );
        let mut e = ExecConfig::new("./bin/plugin", dir.path(), ExecApiVersion::V1, "user \"u\"");
        e.args = vec!["get-token".into(), "--cluster=x".into()];
        e.env = vec![("PLUGIN_MODE".into(), Secret::new("prod".into()))];
        e.provide_cluster_info = true;
        let cluster = ExecClusterInfo {
            server: "https://k".into(),
            insecure_skip_tls_verify: true,
            ..Default::default()
        };
        let c = run_plugin(&e, Some(&cluster), DEFAULT_EXEC_TIMEOUT).unwrap();
        assert_eq!(c.token.unwrap().expose(), "tok-from-plugin");
        let info: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("bin/info.json")).unwrap())
                .unwrap();
        assert_eq!(
            info,
            serde_json::json!({"apiVersion": EXEC_API_V1, "kind": "ExecCredential",
                "spec": {"interactive": false,
                         "cluster": {"server": "https://k", "insecure-skip-tls-verify": true}}})
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("bin/env.txt")).unwrap(),
            "prod|get-token|--cluster=x"
        );
        // Without provideClusterInfo, no cluster even when one is at hand.
        e.provide_cluster_info = false;
        run_plugin(&e, Some(&cluster), DEFAULT_EXEC_TIMEOUT).unwrap();
        let info: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("bin/info.json")).unwrap())
                .unwrap();
        assert!(info["spec"].get("cluster").is_none(), "{info}");
    }

    #[test]
    fn token_like_values_are_redacted_from_stderr_lines() {
        for (line, want) in [
            (
                "error: token=eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ1In0.c2lnbmF0dXJl rejected",
                "error: token=[redacted] rejected",
            ),
            (
                "got \"token\": \"abc\" from cache",
                "got \"token\": \"[redacted]\" from cache",
            ),
            (
                "Authorization: Bearer s3cr3t",
                "Authorization: Bearer [redacted]",
            ),
            ("password: hunter2", "password: [redacted]"),
            (
                "using key AKIAIOSFODNN7EXAMPLE1 for /home/u/.aws",
                "using key [redacted] for /home/u/.aws",
            ),
            (
                "error: SSO session expired; run aws sso login",
                "error: SSO session expired; run aws sso login",
            ),
            ("token expired", "token expired"),
        ] {
            assert_eq!(redact_tokens(line), want, "{line}");
        }
    }

    /// A plugin that is not installed (with its install hint), missing or not executable, and
    /// `interactiveMode: Always`: configuration errors, before anything runs.
    #[cfg(unix)]
    #[test]
    fn a_plugin_not_found_or_not_executable_is_a_config_error() {
        let dir = tempfile::tempdir().unwrap();

        let mut e = ExecConfig::new(
            "podalloc-test-no-such-plugin",
            dir.path(),
            ExecApiVersion::V1Beta1,
            "user \"u\"",
        );
        let msg = run_plugin(&e, None, DEFAULT_EXEC_TIMEOUT)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("not found") && msg.contains("not on PATH") && msg.contains("install"),
            "{msg}"
        );
        e.install_hint = Some("Install it with:\n   brew install thing\n".into());
        let err = run_plugin(&e, None, DEFAULT_EXEC_TIMEOUT).unwrap_err();
        assert!(matches!(err, KubeError::Config(_)));
        assert!(
            err.to_string()
                .ends_with("; Install it with: brew install thing"),
            "{err}"
        );
        let msg = plugin_error(dir.path(), "./missing");
        assert!(msg.contains("does not exist"), "{msg}");

        // Not executable.
        std::fs::write(dir.path().join("plain"), "#!/bin/sh\n").unwrap();
        let msg = plugin_error(dir.path(), "./plain");
        assert!(msg.contains("not executable"), "{msg}");

        // interactiveMode: Always is refused before anything runs.
        let mut e = ExecConfig::new("./fail", dir.path(), ExecApiVersion::V1, "user \"u\"");
        e.interactive_mode = InteractiveMode::Always;
        let err = run_plugin(&e, None, DEFAULT_EXEC_TIMEOUT).unwrap_err();
        assert!(
            matches!(&err, KubeError::Config(m) if m.contains("interactiveMode: Always") && m.contains("terminal")),
            "{err}"
        );
    }

    /// A failing plugin: its exit code and first stderr line (tokens redacted), never its
    /// stdout; a token too long for a header and garbage on stdout are refused.
    #[cfg(unix)]
    #[test]
    fn a_failing_plugin_says_its_exit_code_and_first_stderr_line_never_a_token() {
        let dir = tempfile::tempdir().unwrap();
        // Non-zero exit: code and first stderr line, never stdout.
        script(
            dir.path(),
            "fail",
            "echo '{\"status\":{\"token\":\"leaked-token\"}}'\necho >&2\necho '  error: SSO session expired  ' >&2\necho 'second line' >&2\nexit 3",
        );
        let e = ExecConfig::new("./fail", dir.path(), ExecApiVersion::V1, "user \"u\"");
        let err = run_plugin(&e, None, DEFAULT_EXEC_TIMEOUT).unwrap_err();
        assert!(matches!(err, KubeError::Auth(_)));
        assert_eq!(
            err.to_string(),
            "exec plugin \"./fail\" (user \"u\") failed with exit code 3: error: SSO session expired"
        );
        script(dir.path(), "quiet", "exit 1");
        assert!(plugin_error(dir.path(), "./quiet")
            .ends_with("failed with exit code 1 (nothing on stderr)"));

        // Its stderr never carries its token into our message.
        script(
            dir.path(),
            "leaky",
            "echo 'refresh failed, token=abcdef0123456789abcdef0123 is stale' >&2\nexit 2",
        );
        let msg = plugin_error(dir.path(), "./leaky");
        assert!(
            msg.ends_with("exit code 2: refresh failed, token=[redacted] is stale"),
            "{msg}"
        );

        // A token too long for a header is refused with its size, not a transport error.
        let big = "a".repeat(900 * 1024);
        script(
            dir.path(),
            "huge",
            &format!(
                "printf '%s' '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{big}\"}}}}'"
            ),
        );
        let msg = plugin_error(dir.path(), "./huge");
        assert!(
            msg.ends_with("printed a token of 921600 bytes; at most 65536 bytes fit in the Authorization header"),
            "{}",
            &msg[..msg.len().min(300)]
        );

        // Garbage on stdout with exit 0.
        script(dir.path(), "garbage", "echo 'password=hunter2'");
        let msg = plugin_error(dir.path(), "./garbage");
        assert!(
            msg.contains("not JSON") && !msg.contains("hunter2"),
            "{msg}"
        );
    }

    /// A plugin that hangs, or leaves a child holding its stdout, is killed with its process
    /// group at the timeout.
    #[cfg(unix)]
    #[test]
    fn a_plugin_past_its_timeout_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        // `cmd` run with a timeout of `ms` fails within 5 s, saying `what`.
        let fails_within_5s = |cmd: &str, ms: u64, what: &str| {
            let e = ExecConfig::new(cmd, dir.path(), ExecApiVersion::V1, "user \"u\"");
            let t = Instant::now();
            let msg = run_plugin(&e, None, Duration::from_millis(ms))
                .unwrap_err()
                .to_string();
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            assert!(msg.contains(what), "{msg}");
        };

        // A plugin whose child keeps stdout open: the child dies with the process group.
        let pidfile = dir.path().join("child.pid");
        script(
            dir.path(),
            "lingers",
            &format!(
                "sleep 30 &\necho $! > {}\necho '{{}}'\nexit 0",
                pidfile.display()
            ),
        );
        fails_within_5s("./lingers", 500, "kept its output open");
        let child: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // Gone, or a zombie waiting for whoever inherited it to reap it.
        let alive = std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|st| {
            st.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        });
        assert!(!alive, "the plugin's child {child} is still running");

        // A plugin that hangs is killed after the timeout.
        script(dir.path(), "hang", "exec sleep 30");
        fails_within_5s("./hang", 300, "did not finish within 300ms");
    }

    /// A plugin renewing a credential in the background: polling it never waits longer
    /// than asked, it is taken once it has finished, and dropping it kills it.
    #[cfg(unix)]
    #[test]
    fn a_running_plugin_is_polled_without_waiting_and_killed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let ok = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"t"}}"#;
        script(dir.path(), "slow", &format!("sleep 0.3\necho '{ok}'"));
        let e = ExecConfig::new("./slow", dir.path(), ExecApiVersion::V1, "user \"u\"");
        // Timed from before the start: the plugin's 300 ms begin after it, so a slow
        // spawn on a loaded machine cannot make the plugin look faster than it is.
        let t = Instant::now();
        let mut run = RunningPlugin::start(&e, None, DEFAULT_EXEC_TIMEOUT, Arc::default()).unwrap();
        let polled = Instant::now();
        assert!(run.poll(Duration::ZERO).is_none());
        assert!(
            polled.elapsed() < Duration::from_millis(100),
            "{:?}",
            polled.elapsed()
        );
        let cred = loop {
            if let Some(done) = run.poll(Duration::from_millis(20)) {
                break done.unwrap();
            }
            assert!(t.elapsed() < Duration::from_secs(5), "never finished");
        };
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert_eq!(cred.token.unwrap().expose(), "t");

        let pidfile = dir.path().join("pid");
        script(
            dir.path(),
            "hang",
            &format!("echo $$ > {}\nexec sleep 30", pidfile.display()),
        );
        let e = ExecConfig::new("./hang", dir.path(), ExecApiVersion::V1, "user \"u\"");
        let mut run = RunningPlugin::start(&e, None, DEFAULT_EXEC_TIMEOUT, Arc::default()).unwrap();
        let t = Instant::now();
        while !pidfile.exists() {
            assert!(run.poll(Duration::from_millis(10)).is_none());
            assert!(t.elapsed() < Duration::from_secs(5), "never started");
        }
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        drop(run);
        assert!(
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_err(),
            "the dropped plugin {pid} is still there"
        );
    }
}
