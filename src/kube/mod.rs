//! The kube client: connection configuration and blocking HTTPS calls to the Kubernetes
//! API (pods, ConfigMaps, Leases, Events), over `ureq` 3.5 + `rustls` (ring).
//!
//! - `config/` ([`resolve`]) turns the CLI's [`ConnectionFlags`] (kubectl's names, in
//!   `overrides.rs`), kubeconfig files (`kubeconfig.rs`) or the in-cluster service account
//!   (`incluster.rs`) into a [`ClusterConfig`];
//! - `api.rs`: [`Api`], one resource API for every kind (kube-rs's `Api<K>`, blocking):
//!   [`KubeClient::api`] / [`KubeClient::api_in`] pair a [`Resource`] ([`PODS`],
//!   [`CONFIG_MAPS`], [`LEASES`], [`EVENTS`]) with a namespace, and it gets, creates,
//!   replaces, patches, deletes and lists (paginated, into a [`PageSink`]);
//! - `client.rs`: [`KubeClient`], the transport under it: TLS, authentication, retries of
//!   transient failures per [`RetryPolicy`], deadlines, the leader's write fence;
//! - `exec.rs` runs kubeconfig exec credential plugins ([`ExecConfig`], the
//!   `client.authentication.k8s.io` v1 / v1beta1 `ExecCredential`) for EKS, GKE and AKS
//!   style kubeconfigs, caching their credential until it expires or the server answers 401;
//! - `resolver.rs`: the agent's name resolution: an IP address as it is, a name looked up
//!   when a connection is made, on a helper thread joined before the lookup returns, the
//!   hook run while it waits;
//! - `secret.rs`: [`Secret`], [`PemData`] and [`KeyData`], which both `config/` and `exec.rs`
//!   produce (so neither imports the other);
//! - `error.rs`: every failure is one [`KubeError`], with the server's `Status` parsed into
//!   [`ApiStatus`] and transport failures typed by [`TransportKind`].
//!
//! This module depends on no other podalloc module and is synchronous. Tokens, client keys,
//! exec plugins' stdout and the `Authorization` header never appear in logs, errors or
//! `Debug` output.
//!
//! ```ignore
//! # use podalloc::kube::{resolve, ConnectionFlags, KubeClient, KubeError, ListParams, PODS};
//! let cfg = resolve(&ConnectionFlags::default())?;
//! let client = KubeClient::new(cfg)?;
//! let lp = ListParams { label_selector: "spark-app-selector=app-1,spark-role=executor", ..Default::default() };
//! let (pods, _stats) = client.api(&PODS).list_items(&lp)?;
//! # Ok::<(), KubeError>(())
//! ```

mod api;
mod client;
mod config;
mod error;
mod exec;
mod files;
mod resolver;
mod resource;
mod secret;
mod sliced;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;

pub use api::{
    Api, Created, Evicted, ListParams, Patch, PostParams, Preconditions, Resource, CONFIG_MAPS,
    EVENTS, EXECUTOR_SETS, LEASES, PODS,
};
pub use client::{
    encode_component, warning_text, Between, ClientOptions, ClientStats, Deleted, FieldValidation,
    KubeClient, ListStats, PageSink, RetryPolicy, Timeouts, DEFAULT_LIST_BODY_LIMIT,
    DEFAULT_STREAMED_LIST_BODY_LIMIT, MAX_LIST_RESTARTS, UNTRUSTED_CERT_MESSAGE, USER_AGENT,
};
pub use config::{
    resolve, resolve_with, ClusterConfig, ConnectionFlags, Credential, ProxyUrl, TlsSettings,
    IN_CLUSTER_SA_DIR, NO_CLUSTER_MESSAGE,
};
pub use error::{ApiStatus, KubeError, StatusCause, TransportKind, MAX_TEXT_MESSAGE_CHARS};
pub use exec::{
    exec_info, parse_exec_credential, run_plugin, ExecApiVersion, ExecClusterInfo, ExecConfig,
    ExecCredential, InteractiveMode, DEFAULT_EXEC_TIMEOUT, EXEC_API_V1, EXEC_API_V1BETA1,
    EXEC_CLUSTER_EXTENSION, EXEC_EXPIRY_LEEWAY, EXEC_INFO_ENV,
};
pub use files::{read_regular_file, read_regular_text, MAX_INPUT_FILE_BYTES};
pub use secret::{KeyData, PemData, Redactions, Secret};
