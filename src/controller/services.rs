//! What the shell keeps for the whole process, as one value the command owns and passes
//! where it is used (the ReplicaSet controller's recorder and expectations are fields of its
//! struct, not globals): the crash and pause points, the Events poster, the endpoints' probe,
//! the namespaces whose server refused `deletecollection`, the directories whose stale
//! temporary files were swept, and the log context. Per app, the runner's slot keeps the
//! tick's memory ([`crate::controller::tick::Memory`]).

use super::context::LogContext;
use super::events::Poster;
use super::points::Points;
use super::serve::Probe;
use crate::store::file::SweptDirs;
use std::cell::RefCell;
use std::collections::BTreeSet;

/// The process's services (see the module doc). Made once per command, after the flags are
/// read; single-threaded: the loop that owns it is the only user.
pub struct Services {
    /// The crash and pause points of the test harnesses (read once from the environment).
    pub(crate) points: Points,
    /// Kubernetes Events (`--no-events`: off).
    pub(crate) events: Poster,
    /// What `/metrics`, `/healthz` and `/readyz` report, once the endpoints are on.
    pub(crate) probe: Option<Probe>,
    /// Which app the log lines are about.
    pub(crate) log: LogContext,
    /// The directories whose stale temporary state files this process has swept.
    pub(crate) swept: SweptDirs,
    /// The namespaces (`server|namespace`) whose server refused `deletecollection` (403,
    /// 405): their deletes go pod by pod. Per namespace: one namespace's Role says nothing
    /// of another's.
    one_by_one: RefCell<BTreeSet<String>>,
    /// The runner's wait ([`Services::set_waiter`]).
    waiter: std::cell::OnceCell<crate::kube::Between>,
}

impl Services {
    /// The services of a command: Events on unless `no_events`, the test points from the
    /// environment, `log` shared with the logger.
    pub(crate) fn new(no_events: bool, log: LogContext) -> Services {
        Services {
            points: Points::from_env(),
            events: Poster::new(!no_events),
            probe: None,
            log,
            swept: SweptDirs::default(),
            one_by_one: RefCell::new(BTreeSet::new()),
            waiter: std::cell::OnceCell::new(),
        }
    }

    /// Waits `d`: through the loop's hook when a runner installed one
    /// ([`Services::set_waiter`]: the signals, the Lease and the endpoints seen to
    /// meanwhile), else answering the endpoints when they are on ([`Probe::nap`]), else
    /// sleeping.
    pub(crate) fn nap(&self, d: std::time::Duration) {
        match (self.waiter.get(), &self.probe) {
            (Some(w), _) => {
                w(d);
            }
            (None, Some(p)) => p.nap(d),
            (None, None) => std::thread::sleep(d),
        }
    }

    /// Has [`Services::nap`] wait through `waiter` (the runner's
    /// `Control::between`); once, a second call is ignored.
    pub(crate) fn set_waiter(&self, waiter: crate::kube::Between) {
        let _ = self.waiter.set(waiter);
    }

    /// Whether the deletes of `client`'s namespace go pod by pod (its server refused
    /// `deletecollection`).
    pub(crate) fn one_by_one(&self, client: &crate::kube::KubeClient) -> bool {
        self.one_by_one.borrow().contains(&namespace_key(client))
    }

    /// Turns `client`'s namespace to pod-by-pod deletes; true the first time (to warn once).
    pub(crate) fn refuse_collections(&self, client: &crate::kube::KubeClient) -> bool {
        self.one_by_one.borrow_mut().insert(namespace_key(client))
    }
}

impl Default for Services {
    /// Services for a library caller or a test: Events on, no probe, a log context nothing
    /// reads.
    fn default() -> Services {
        Services::new(false, LogContext::default())
    }
}

/// The key of `client`'s namespace: its server and namespace.
fn namespace_key(client: &crate::kube::KubeClient) -> String {
    format!("{}|{}", client.server(), client.namespace())
}

#[cfg(test)]
mod tests {
    use super::Services;
    use crate::kube::{ClientOptions, ClusterConfig, KubeClient};

    #[test]
    fn one_namespaces_refused_collections_leave_the_others_alone() {
        let cfg = ClusterConfig::for_server("https://127.0.0.1:1", "a");
        let a = KubeClient::with_options(cfg, ClientOptions::default()).unwrap();
        let b = a.in_namespace("b");
        let s = Services::default();
        assert!(!s.one_by_one(&a) && !s.one_by_one(&b));
        assert!(s.refuse_collections(&a), "the first refusal warns");
        assert!(!s.refuse_collections(&a), "once");
        assert!(s.one_by_one(&a));
        assert!(
            !s.one_by_one(&b),
            "namespace b still deletes in collections"
        );
    }
}
