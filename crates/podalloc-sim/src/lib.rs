//! A simulated Kubernetes API server, with a simulated scheduler and kubelet.
//!
//! It serves six kinds, listed once in a kind table (`resources.rs`) that routing, RBAC
//! messages, fault and `forbid` verb names, discovery, OpenAPI and field selectors all read:
//!
//! | kind | path | verbs |
//! |---|---|---|
//! | Pod | `/api/v1/[namespaces/{ns}/]pods[/{name}]` | list, get, create, patch, delete, deletecollection, watch |
//! | ConfigMap | `/api/v1/[namespaces/{ns}/]configmaps[/{name}]` | list, get, create, update, patch, delete |
//! | Lease | `/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]` | get, create, update, delete |
//! | Event | `/api/v1/[namespaces/{ns}/]events[/{name}]` | list, get, create, patch |
//! | Namespace | `/api/v1/namespaces[/{name}]` | list, get, create |
//! | ExecutorSet | `/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets[/{name}[/status\|/scale]]` | list, get, create, update, patch, delete; `status` and `scale`: get, update, patch |
//!
//! over HTTPS with a generated CA, or plain HTTP, and answers the way kube-apiserver does:
//! the same `Status` bodies, codes, validation messages, pod defaulting, graceful deletion
//! rules, resource versions and gzip threshold. Lists take label and field selectors (each
//! kind's selectable fields); pod lists also `limit`/`continue` pagination. ConfigMaps,
//! Leases and Events live in one registry (`registry.rs`, as the apiserver's generic
//! registry with a strategy per kind): one lock and one resourceVersion counter with the
//! pods (etcd's revision), uids and timestamps from the seeded RNG and the wall clock,
//! dry runs (`dryRun=All`) that store nothing and take no resourceVersion, the optimistic
//! lock (Leases and ExecutorSets allow no update without a resourceVersion), delete
//! preconditions, and merge, JSON and strategic merge patches (`objpatch.rs`; a custom
//! resource answers a strategic merge patch 415, as kube-apiserver does). The ExecutorSet
//! is the custom resource of `deploy/crd.yaml`, served as kube-apiserver serves that CRD
//! (`kinds/executorset.rs`: pruning, its schema's and CEL rules' 422s, the generation,
//! `/status`, `/scale` as an `autoscaling/v1` Scale, its printer columns). A create in a namespace that does not exist
//! ([`SimOptions::namespaces`]) is 404, as the NamespaceLifecycle admission plugin answers.
//! Pod creates honour `fieldValidation` (Strict: 400 `strict decoding error: unknown field
//! "…"`; Warn, the default: `Warning: 299` headers).
//!
//! Pods then live a simulated life: Pending → scheduled (node, host IP) → Running (or
//! Failed / crash-looping with `failure_rate`), and a deleted pod's containers stop, it
//! turns Failed and disappears. Pods may have several containers (sidecars), init
//! containers and native sidecars (`restartPolicy: Always` init containers), each with its
//! own status as the kubelet reports it; images listed in [`SimOptions::missing_images`]
//! fail to pull (ErrImagePull, then ImagePullBackOff, naming the image), a Secret volume or
//! a missing ConfigMap volume keeps a pod in ContainerCreating, and tests end one container
//! with [`SimServer::terminate_container`] or force a phase with
//! [`SimServer::set_pod_phase`].
//!
//! kubectl works against it: API discovery (`/api`, `/apis` with `coordination.k8s.io` and
//! `podalloc.io`, `/api/v1`, `/apis/GROUP[/VERSION]`, each resource with exactly the verbs
//! the router serves, subresources included), the OpenAPI v3 entries its
//! `--validate=strict` checks, and the `Table` format of `kubectl get` for pods, events,
//! namespaces and executorsets (`kubectl scale es`, `kubectl annotate`, `kubectl patch`
//! work too).
//!
//! For testing clients against a misbehaving cluster it can inject faults per verb
//! ([`FaultRule`]: 429s in both shapes, 500/503/504, dropped connections, lost or
//! truncated responses, slow answers, 410 on list pages), enforce a `pods` ResourceQuota,
//! deny verbs the way RBAC does, add latency to every API request, and require client
//! certificates (mutual TLS; [`SimServer::generate_client_cert`]).
//!
//! Side doors for tests, never authenticated: `GET /sim/stats` (the [`SimStats`] as
//! JSON), `POST /sim/pods/{ns}` (seed a pod; a `status.phase` in the body is kept and the
//! kubelet leaves the pod in that phase; a `PodList` body seeds every item in one request,
//! in order, stopping at the first that fails), `POST /sim/pods/{ns}/{name}/phase` with
//! `{"phase":"Failed","exitCode":137,"reason":"OOMKilled","message":"..."}`,
//! `GET|POST /sim/faults` (a JSON list of rule strings replaces the rules),
//! `GET|POST /sim/quota` (`{"pods": N}` or `{"pods": null}`), `POST /sim/cut`
//! (`{"user": NAME, "seconds": S}`: a partition between that user and the API, see
//! [`SimServer::cut_off`]) and `GET /sim/log` (the last 1000 requests as JSON lines, with
//! the authenticated user and a pod create's `metadata.name`, without headers).
//!
//! Plain std threads: one accepting, one per connection (HTTP/1.1 keep-alive), one for
//! the kubelet. Kubelet transitions are due at fixed offsets from the events that cause
//! them and are applied, in order, before every request is handled, so what a client
//! sees depends only on the clock. This crate uses nothing of podalloc.

mod api;
mod args;
mod containers;
mod discovery;
pub mod emulator;
mod faults;
mod feed;
mod http;
mod kinds;
mod objpatch;
mod options;
mod patch;
mod pod;
pub mod process;
mod protobuf;
mod registry;
mod reqlog;
mod request;
mod resources;
mod respond;
mod schema;
mod selector;
mod server;
mod shared;
mod sidedoor;
mod status;
mod store;
mod tls;
mod util;
mod validation;
mod watch;

#[cfg(test)]
mod container_tests;
#[cfg(test)]
mod tests;

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::{collect_stats, relock, Shared};
use util::invalid_input;

pub use args::SimArgs;
/// The resources the simulator serves, one entry each as `plural (group/version)`: what
/// `podalloc sim` prints at start, so that a `kubectl apply` of other kinds (Deployments,
/// RBAC, CronJobs: "no matches for kind") is not a surprise.
pub fn served_kinds() -> Vec<String> {
    resources::served_kinds()
}

/// The `openAPIV3Schema` the simulator validates ExecutorSets with: `deploy/crd.yaml`'s,
/// without descriptions (tests hold the two to each other).
pub fn executorset_schema() -> serde_json::Value {
    kinds::executorset::schema()
}

pub use faults::{Fault, FaultRule, When};
pub use options::{SimOptions, SimStats};

/// A running simulated API server. Dropping it (or [`SimServer::stop`]) closes the
/// listener and every connection and joins the server's threads.
pub struct SimServer {
    shared: Arc<Shared>,
    url: String,
    ca_pem: Option<String>,
    pki: Option<tls::Pki>,
}

/// A cloneable handle that stops a [`SimServer`] from another thread (for example a
/// signal handler's loop while the main thread sits in [`SimServer::wait`]).
#[derive(Clone)]
pub struct SimStopHandle {
    shared: Arc<Shared>,
}

impl SimStopHandle {
    /// Stops the server (idempotent); returns once its threads have exited.
    pub fn stop(&self) {
        self.shared.shutdown();
    }
}

impl SimServer {
    /// Binds `opts.listen`, generates the PKI (with `tls`), writes `ca_out` and starts
    /// the threads.
    ///
    /// # Errors
    ///
    /// The address cannot be bound, `ca_out` cannot be written, the TLS setup fails, a
    /// thread cannot be spawned, or (`InvalidInput`) `failure_rate` is outside `[0, 1]`,
    /// a fault rule or a `forbid` verb is invalid, `client_ca` holds no certificate, or
    /// client certificates are asked for without `tls`.
    pub fn start(opts: SimOptions) -> io::Result<SimServer> {
        let server::Started {
            shared,
            url,
            ca_pem,
            pki,
        } = server::start(&opts)?;
        Ok(SimServer {
            shared,
            url,
            ca_pem,
            pki,
        })
    }

    /// Base URL without a trailing slash: `https://127.0.0.1:PORT` (or `http://...`).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The CA certificate (PEM) that signed the server certificate; `None` without TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The counters now (pending kubelet transitions are applied first).
    pub fn stats(&self) -> SimStats {
        collect_stats(&self.shared, Instant::now())
    }

    /// Replaces the fault rules (as `POST /sim/faults` does); the per-verb request
    /// numbers that [`When::Nth`] counts start again from 1.
    ///
    /// # Panics
    ///
    /// When a rule does not pass [`FaultRule::validate`] (rules from
    /// [`FaultRule::parse`] always do); see [`SimServer::try_set_faults`].
    pub fn set_faults(&self, rules: Vec<FaultRule>) {
        if let Err(e) = self.try_set_faults(rules) {
            panic!("set_faults: {e}");
        }
    }

    /// [`SimServer::set_faults`] that reports an invalid rule instead of panicking.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when a rule does not pass [`FaultRule::validate`]; the rules in
    /// force are then left unchanged.
    pub fn try_set_faults(&self, rules: Vec<FaultRule>) -> io::Result<()> {
        for r in &rules {
            r.validate()
                .map_err(|e| invalid_input(format!("fault rule \"{r}\": {e}")))?;
        }
        relock(&self.shared.faults).replace(rules);
        Ok(())
    }

    /// The fault rules in force.
    pub fn faults(&self) -> Vec<FaultRule> {
        relock(&self.shared.faults).rules().to_vec()
    }

    /// Sets (or, with `None`, lifts) the `pods` quota of every namespace (as
    /// `POST /sim/quota` does).
    pub fn set_pod_quota(&self, pods: Option<u64>) {
        relock(&self.shared.store).set_pod_quota(pods);
    }

    /// The last (up to 1000) API requests as JSON lines, oldest first (what
    /// `GET /sim/log` serves): `seq`, `ms` since start, `method`, `path`, `query` (with
    /// secret-looking values redacted), `verb`, `user` (the authenticated user, see
    /// [`SimOptions::users`]), `status` (null when no response was sent) and `fault`.
    /// Headers are never logged.
    pub fn request_log(&self) -> String {
        relock(&self.shared.log).render()
    }

    /// Cuts `user` (a [`SimOptions::users`] name, the token user
    /// `system:serviceaccount:default:podalloc`, or a client certificate's common name) off
    /// from the API for `duration` from now, as a network partition between that client and
    /// the API server would: each of its API requests in that time hangs until the cut ends
    /// and is then answered 504 Timeout without being carried out (logged with the fault
    /// `504`). A new call replaces the user's cut; a zero duration ends it.
    pub fn cut_off(&self, user: &str, duration: Duration) {
        relock(&self.shared.cuts).insert(user.to_string(), Instant::now() + duration);
    }

    /// Issues a client certificate for `common_name` (the user it authenticates as),
    /// signed by the server's CA; returns (certificate PEM, private key PEM). Use with
    /// `require_client_cert`.
    ///
    /// # Panics
    ///
    /// Without `tls` (there is no CA), or if key generation fails.
    pub fn generate_client_cert(&self, common_name: &str) -> (String, String) {
        let pki = self
            .pki
            .as_ref()
            .expect("generate_client_cert needs a TLS simulator (SimOptions::tls)");
        pki.issue_client_cert(common_name)
            .unwrap_or_else(|e| panic!("cannot issue a client certificate: {e}"))
    }

    /// A handle that can stop the server from another thread.
    pub fn stop_handle(&self) -> SimStopHandle {
        SimStopHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stops the server: closes the listener and all connections, joins the threads.
    pub fn stop(self) {
        drop(self);
    }

    /// Forces pod `ns/name` into `phase` (`Pending`, `Running`, `Succeeded`, `Failed`,
    /// `Unknown`), as `POST /sim/pods/{ns}/{name}/phase` does: the containers' statuses follow
    /// (terminated with exit 0 `Completed` or 1 `Error` for the terminal phases) and the
    /// kubelet leaves the pod in that phase (it still carries out a deletion).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an unknown phase, `NotFound` when there is no such pod.
    pub fn set_pod_phase(&self, ns: &str, name: &str, phase: &str) -> io::Result<()> {
        let phase = pod::Phase::parse(phase)
            .ok_or_else(|| invalid_input(format!("unknown pod phase {phase:?}")))?;
        let o = store::PhaseOverride {
            phase,
            exit_code: None,
            reason: None,
            message: None,
            disruption: None,
            waiting: None,
        };
        relock(&self.shared.store)
            .set_phase(ns, name, &o, Instant::now())
            .map_err(|e| io::Error::new(io::ErrorKind::NotFound, format!("{e:?}")))?;
        self.shared.kubelet.notify_all();
        Ok(())
    }

    /// Ends one running container of pod `ns/name` with `exit_code` (reason `Completed` for
    /// 0, else `Error`, unless `reason` is given, e.g. `OOMKilled`), as the kubelet reports
    /// a container that exited: while another container of the pod runs (a sidecar), the
    /// pod stays Running and not Ready; once none does, the kubelet stops the native
    /// sidecars (exit 143) and the pod ends Succeeded, or Failed when a container exited
    /// non-zero (`restartPolicy: Never`). The kubelet leaves the pod alone from then on.
    ///
    /// # Errors
    ///
    /// `InvalidInput` naming the problem: no such pod, no such container, or the container
    /// is not running.
    pub fn terminate_container(
        &self,
        ns: &str,
        name: &str,
        container: &str,
        exit_code: i64,
        reason: Option<&str>,
    ) -> io::Result<()> {
        relock(&self.shared.store)
            .terminate_container(ns, name, container, exit_code, reason, Instant::now())
            .map_err(invalid_input)?;
        self.shared.kubelet.notify_all();
        Ok(())
    }

    /// Blocks until the server has been stopped through a [`SimStopHandle`].
    pub fn wait(&self) {
        self.shared.wait_stopped(None);
    }

    /// Like [`SimServer::wait`] for at most `timeout`; true when the server has stopped.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.shared.wait_stopped(Some(timeout))
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        self.shared.shutdown();
    }
}
