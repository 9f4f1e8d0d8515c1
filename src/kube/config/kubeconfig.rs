//! The kubeconfig source: the file format (client-go `clientcmd/api/v1/types.go`, unknown
//! fields ignored), finding and merging the files (`--kubeconfig`, else the `$KUBECONFIG`
//! list, else `~/.kube/config`; the first file to set a key wins, as with kubectl), and
//! reading the chosen context's cluster and user.
//!
//! Relative paths, and an exec `command` with a `/`, resolve against the directory of the
//! file that defines the entry. Parse errors name the file and position but never quote the
//! file (it may hold tokens).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use super::overrides::ConnectionFlags;
use super::{read_pem_file, Credential, Partial};
use crate::kube::error::KubeError;
use crate::kube::exec::{ExecApiVersion, ExecConfig, InteractiveMode, EXEC_CLUSTER_EXTENSION};
use crate::kube::secret::{KeyData, PemData, Secret};

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
pub(super) struct MergedKubeconfig {
    files: Vec<PathBuf>,
    /// The first non-empty `current-context` of the files.
    pub(super) current_context: Option<String>,
    clusters: BTreeMap<String, Entry<RawCluster>>,
    users: BTreeMap<String, Entry<RawUser>>,
    contexts: BTreeMap<String, Entry<RawContext>>,
}

impl MergedKubeconfig {
    /// The merged files' paths joined with `:`, for messages.
    pub(super) fn files_display(&self) -> String {
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
    let max = crate::kube::MAX_INPUT_FILE_BYTES;
    let text = crate::kube::read_regular_text(path, max).map_err(|e| {
        KubeError::Config(format!("cannot read kubeconfig {}: {e}", path.display()))
    })?;
    parse_kubeconfig(&text, path)
}

/// Finds and merges the kubeconfig files. `Ok(None)`: there is none to read.
pub(super) fn load_kubeconfig(
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

/// The chosen context with its cluster, looked up in a merged kubeconfig.
struct Chosen<'a> {
    ctx_name: String,
    ctx: &'a Entry<RawContext>,
    cluster: &'a Entry<RawCluster>,
    /// `cluster "NAME" in kubeconfig FILE`, for messages.
    cowner: String,
}

/// Finds the context (`--context`, else `current-context`) and its cluster.
///
/// Errors: [`KubeError::Config`] when there is no context to use, or the context or its
/// cluster is missing; the message lists the names that exist.
fn choose_context<'a>(
    kc: &'a MergedKubeconfig,
    flags: &ConnectionFlags,
) -> Result<Chosen<'a>, KubeError> {
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
    let cowner = format!(
        "cluster {cluster_name:?} in kubeconfig {}",
        cluster.file.display()
    );
    Ok(Chosen {
        ctx_name,
        ctx,
        cluster,
        cowner,
    })
}

/// The kubeconfig's part of the configuration. Fields that `flags` override are not read
/// (so a broken field the flags replace is no error, as with kubectl).
///
/// Errors: [`KubeError::Config`] naming the context, cluster or user and the field at fault
/// (missing names, bad base64, unreadable files, impersonation, a broken `exec` section).
pub(super) fn from_kubeconfig(
    kc: &MergedKubeconfig,
    flags: &ConnectionFlags,
) -> Result<Partial, KubeError> {
    let chosen = choose_context(kc, flags)?;
    let c = &chosen.cluster.value;
    let mut p = Partial {
        source: format!(
            "kubeconfig {} (context {})",
            kc.files_display(),
            chosen.ctx_name
        ),
        server: non_empty(&c.server).map(str::to_string),
        server_origin: chosen.cowner.clone(),
        namespace: non_empty(&chosen.ctx.value.namespace).map(str::to_string),
        insecure: c.insecure_skip_tls_verify.unwrap_or(false),
        tls_server_name: non_empty(&c.tls_server_name).map(str::to_string),
        proxy_url: non_empty(&c.proxy_url).map(str::to_string),
        disable_compression: c.disable_compression.unwrap_or(false),
        ..Partial::default()
    };
    cluster_trust(&mut p, &chosen, flags)?;

    let Some(user_name) = non_empty(&chosen.ctx.value.user) else {
        return Ok(p);
    };
    let user = kc.users.get(user_name).ok_or_else(|| {
        KubeError::Config(format!(
            "user {user_name:?} (used by context {:?}) not found in kubeconfig {}; \
             users: {}",
            chosen.ctx_name,
            kc.files_display(),
            names(&kc.users)
        ))
    })?;
    let uowner = format!("user {user_name:?} in kubeconfig {}", user.file.display());
    user_credential(&mut p, user, &uowner, flags)?;
    user_auth(&mut p, user, &uowner, c, flags)?;
    Ok(p)
}

/// The cluster's CA (`certificate-authority-data` beats `certificate-authority`), unless
/// the flags set the trust. A cluster with both a CA and `insecure-skip-tls-verify` is an
/// error.
fn cluster_trust(
    p: &mut Partial,
    chosen: &Chosen,
    flags: &ConnectionFlags,
) -> Result<(), KubeError> {
    let cfile = &chosen.cluster.file;
    let c = &chosen.cluster.value;
    let cowner = &chosen.cowner;
    let ca_overridden = flags.certificate_authority.is_some() || flags.insecure_skip_tls_verify;
    if ca_overridden {
        // Replaced later by the flags.
    } else {
        let (data, path) = (&c.certificate_authority_data, &c.certificate_authority);
        p.ca = pem_setting(data, path, "certificate-authority", cfile, cowner)?;
    }
    if p.insecure && p.ca.is_some() {
        return Err(KubeError::Config(format!(
            "{cowner} sets both insecure-skip-tls-verify and a certificate authority; \
             remove one of them"
        )));
    }
    Ok(())
}

/// A PEM setting of `owner` in a kubeconfig: `NAME-data` (base64, `data`), which beats
/// `NAME` (`path`, a file relative to the kubeconfig `file`); `None` when neither is set.
/// Errors: bad base64, an unreadable file.
fn pem_setting(
    data: &Option<String>,
    path: &Option<String>,
    name: &str,
    file: &Path,
    owner: &str,
) -> Result<Option<PemData>, KubeError> {
    if let Some(data) = non_empty(data) {
        if non_empty(path).is_some() {
            log::debug!("{owner}: {name}-data overrides {name}");
        }
        let field = format!("{name}-data");
        return Ok(Some(PemData {
            pem: decode_data(data, &field, owner)?,
            source: format!("{field} of {owner}"),
        }));
    }
    let Some(path) = non_empty(path) else {
        return Ok(None);
    };
    let path = resolve_rel(file, path);
    Ok(Some(PemData {
        source: path.display().to_string(),
        pem: read_pem_file(&path, &format!("{name} of {owner}"))?,
    }))
}

/// The user's static credential: `token` (beats `tokenFile`), `tokenFile`, and the client
/// certificate and key (`*-data` beats the file), each unless a flag replaces it.
fn user_credential(
    p: &mut Partial,
    user: &Entry<RawUser>,
    uowner: &str,
    flags: &ConnectionFlags,
) -> Result<(), KubeError> {
    let ufile = &user.file;
    let u = &user.value;
    if flags.token.is_some() || flags.token_file.is_some() {
        // Replaced later by the flags.
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
        // Replaced later by the flag.
    } else {
        let (data, path) = (&u.client_certificate_data, &u.client_certificate);
        p.client_cert = pem_setting(data, path, "client-certificate", ufile, uowner)?;
    }
    if flags.client_key.is_some() {
        // Replaced later by the flag.
    } else {
        let key = pem_setting(
            &u.client_key_data,
            &u.client_key,
            "client-key",
            ufile,
            uowner,
        )?;
        p.client_key = key.map(|k| KeyData {
            source: k.source,
            pem: Secret::new(k.pem),
        });
    }
    Ok(())
}

/// The user's other auth settings: impersonation is refused; an `exec` plugin becomes
/// [`Credential::Exec`] unless a token or the flags give the credential; `auth-provider`
/// and basic auth are recorded as unsupported (an error later unless the flags replace the
/// credential).
fn user_auth(
    p: &mut Partial,
    user: &Entry<RawUser>,
    uowner: &str,
    cluster: &RawCluster,
    flags: &ConnectionFlags,
) -> Result<(), KubeError> {
    let u = &user.value;
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
    let token_overridden = flags.token.is_some() || flags.token_file.is_some();
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
            p.credential =
                Credential::Exec(Box::new(exec_config(exec, &user.file, uowner, cluster)?));
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::NO_CLUSTER_MESSAGE;
    use super::*;
    use crate::kube::testutil::fixture;

    #[test]
    fn kubeconfig_basics_and_relative_paths() {
        let (dir, kc, env) = simple_kubeconfig("kube");
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
    }

    #[test]
    fn missing_names_are_listed() {
        let (dir, _, env) = simple_kubeconfig("");
        let kc2 = write(
            dir.path(),
            "config2",
            "contexts: [{name: x, context: {cluster: gone, user: u}}]\ncurrent-context: x\n",
        );
        let env2 = Env::new(&[("KUBECONFIG", kc2.to_str().unwrap())]);
        let context = |name: &str| ConnectionFlags {
            context: Some(name.into()),
            ..Default::default()
        };
        // (flags, environment, what the error says)
        for (flags, env, says) in [
            (
                context("prod"),
                &env,
                ["context \"prod\" not found", "\"dev\", \"other\""],
            ),
            (
                context("other"),
                &env,
                ["user \"nobody\"", "users: \"dev-user\""],
            ),
            (
                ConnectionFlags::default(),
                &env2,
                ["cluster \"gone\"", "clusters: none"],
            ),
        ] {
            let e = err(resolve_env(&flags, env, dir.path()));
            assert!(says.iter().all(|s| e.contains(s)), "{e}");
        }
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
        let e = err(resolve_env(&ConnectionFlags::default(), &env, home.path()));
        assert!(
            e.starts_with("KUBECONFIG=/nonexistent/a:/nonexistent/b names no file that exists")
                && e.contains(NO_CLUSTER_MESSAGE),
            "{e}"
        );
        // --context without any kubeconfig.
        let flags = ConnectionFlags {
            context: Some("c".into()),
            ..Default::default()
        };
        assert!(err(resolve_env(&flags, &env, home.path())).contains("--context c given"));
    }

    #[test]
    fn exec_and_other_unsupported_users() {
        let (dir, _, env) = kubeconfig_file(
            "",
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

    /// A kubeconfig at DIR/kube/config with an exec user of each kind, and a context of the
    /// same name for each on a cluster with an exec extension, `full` current: (DIR, the
    /// kubeconfig's path, an environment whose `KUBECONFIG` names it).
    fn exec_users_kubeconfig() -> (tempfile::TempDir, PathBuf, Env) {
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
        kubeconfig_file(
            "kube",
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
        )
    }

    /// Flags that pick the context `ctx`.
    fn with_context(ctx: &str) -> ConnectionFlags {
        ConnectionFlags {
            context: Some(ctx.into()),
            ..Default::default()
        }
    }

    /// An exec user's program, API version, mode, cluster info, env and hint are all read.
    #[test]
    fn an_exec_user_is_read_whole() {
        let (dir, kc, env) = exec_users_kubeconfig();
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
    }

    /// A broken exec user is an error that names the user and what is wrong.
    #[test]
    fn a_broken_exec_user_is_an_error_naming_the_user() {
        let (dir, _kc, env) = exec_users_kubeconfig();
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
    }

    /// A static token beats an exec plugin, and flags replace it, a broken one included.
    #[test]
    fn a_static_token_or_credential_flags_win_over_an_exec_plugin() {
        let (dir, kc, env) = exec_users_kubeconfig();
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
        let (dir, kc, env) = kubeconfig_file(
            "",
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
        let (dir, _, env) = kubeconfig_file(
            "",
            "current-context: c\nclusters:\n- name: k\n  cluster:\n    insecure-skip-tls-verify: \"supersecret\"\n",
        );
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
    fn redact_quoted_hides_quoted_parts() {
        assert_eq!(
            redact_quoted("invalid type: string \"abc\", expected `bool`"),
            "invalid type: string \"…\", expected `…`"
        );
    }
}
