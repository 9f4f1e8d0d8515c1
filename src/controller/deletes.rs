//! The plan's deletes, as calls: one `deletecollection` request for two or more pods, one
//! `delete` (or, for an excess pending pod, a read then a conditional delete) for a lone pod.
//!
//! Spark deletes its excess pending executors in one request, a DELETE of the pod
//! collection by the app's labels, `spark-exec-id in (…)` and `status.phase=Pending`
//! (`ExecutorPodsAllocator`, fabric8's filtered `delete()`), and kills executors the same
//! way (`KubernetesClusterSchedulerBackend.doKillExecutors`). podalloc does the same for a
//! tick that deletes two or more executors it listed: 100 executors scaled away cost one
//! request, not 100. A pod never listed (a timed-out create) is still deleted by name. The
//! selector names each pod by its app, role and id, and ids are never reused, so
//! it matches exactly the pods the plan named. The field selector keeps Spark's rule for
//! excess deletes (a pod that turned Running since the snapshot is not killed), checked by
//! the server at the moment of the delete.
//!
//! Where the Role grants no `deletecollection` (403) or the server does not serve it (405),
//! the process says so once and deletes pod by pod from then on.
//!
//! A delete the plan marks `evict` (`--evict`: a running executor removed or scaled down)
//! is an eviction of its own (`POST pods/NAME/eviction`), never in a collection, so the
//! PodDisruptionBudget that covers the pod applies; the budget's 429 is "not now", not an
//! error (the pod is asked for again next tick).

use super::app::App;
use super::services::Services;
use crate::engine::alloc;
use crate::engine::snapshot::{ExecutorState, For, Snapshot, LABEL_EXEC_ID};
use crate::kube::{Deleted, Evicted, KubeClient, KubeError, ListParams, Preconditions, PODS};
use log::{info, warn};

/// Ids per `deletecollection` request: keeps the URL's label selector under about 2 KB.
pub(crate) const MAX_PER_REQUEST: usize = 200;

/// What the deletes did: the ids deleted (or already gone), the first error.
#[derive(Debug, Default)]
pub(crate) struct DeletesDone {
    /// Executor ids deleted or found gone, in the plan's order.
    pub ids: Vec<u64>,
    /// The first error; the deletes it concerns did not happen.
    pub error: Option<KubeError>,
    /// Evictions a disruption budget refused for now (429): not deleted, not an error.
    pub not_now: Vec<u64>,
}

impl DeletesDone {
    /// `d` is gone (`verb`: `deleted` or `evicted`): counted and logged.
    fn gone(&mut self, d: &alloc::Delete, verb: &str) {
        self.ids.push(d.executor_id);
        info!(
            "{verb} executor {} ({}, {})",
            d.executor_id, d.pod_name, d.reason
        );
    }

    /// `d` could not go (`verb`: `delete` or `evict`): logged, the first error kept.
    fn failed(&mut self, d: &alloc::Delete, verb: &str, e: KubeError) {
        warn!(
            "could not {verb} executor {} ({}): {e}",
            d.executor_id, d.pod_name
        );
        self.error.get_or_insert(e);
    }
}

/// Makes the plan's deletes `plan`. The pods the snapshot showed go in two groups, the excess
/// pending pods (deleted only while `status.phase=Pending`) and the rest; a group of two or
/// more is one `deletecollection` per [`MAX_PER_REQUEST`] ids, a lone pod is deleted by name.
/// Pods the snapshot did not show (timed-out creates) are deleted by name.
pub(crate) fn delete_all(
    services: &Services,
    client: &KubeClient,
    app: &App,
    plan: &[alloc::Delete],
) -> DeletesDone {
    let mut done = DeletesDone::default();
    let (evictions, plan): (Vec<&alloc::Delete>, Vec<&alloc::Delete>) =
        plan.iter().partition(|d| d.evict);
    for d in evictions {
        evict_logged(services, client, d, &mut done);
    }
    // A pod the snapshot did not show (an unacknowledged create timed out) goes by name: it
    // may exist without the app's labels, which a selector would miss (docs/semantics.md D3).
    let (seen, unseen): (Vec<&alloc::Delete>, Vec<&alloc::Delete>) =
        plan.into_iter().partition(|d| d.uid.is_some());
    let (pending, other): (Vec<&alloc::Delete>, Vec<&alloc::Delete>) =
        seen.into_iter().partition(|d| d.if_pending);
    for (group, by_name) in [(unseen, true), (other, false), (pending, false)] {
        if by_name || group.len() < 2 || services.one_by_one(client) {
            group
                .iter()
                .for_each(|d| delete_logged(services, client, app, d, &mut done));
            continue;
        }
        for chunk in group.chunks(MAX_PER_REQUEST) {
            if let Err(e) = delete_chunk(services, client, app, chunk, &mut done) {
                warn!("could not delete {} executor pods: {e}", chunk.len());
                done.error.get_or_insert(e);
            }
        }
    }
    done
}

/// The label selector of executors `ids` of the app:
/// `spark-app-selector=APP,spark-role=executor,spark-exec-id in (1,2,3)`.
pub(crate) fn selector_of(app: &App, ids: impl Iterator<Item = u64>) -> String {
    let ids: Vec<String> = ids.map(|id| id.to_string()).collect();
    format!(
        "{},{LABEL_EXEC_ID} in ({})",
        app.label_selector(),
        ids.join(",")
    )
}

/// One `deletecollection` for `chunk` (all excess pending, or none). On 403 or 405 the
/// process turns to deleting one by one and does so for this chunk at once.
fn delete_chunk(
    services: &Services,
    client: &KubeClient,
    app: &App,
    chunk: &[&alloc::Delete],
    done: &mut DeletesDone,
) -> std::result::Result<(), KubeError> {
    let if_pending = chunk[0].if_pending;
    let selector = selector_of(app, chunk.iter().map(|d| d.executor_id));
    let lp = ListParams {
        label_selector: &selector,
        field_selector: if_pending.then_some("status.phase=Pending"),
        limit: None,
    };
    services.points.crash("before-delete");
    let matched = match client.api(&PODS).delete_collection(&lp) {
        Ok(names) => names,
        Err(KubeError::Api { ref status, .. }) if matches!(status.code, 403 | 405) => {
            if services.refuse_collections(client) {
                warn!(
                    "the API server refused deletecollection on pods ({}): deleting executor \
                     pods one by one from now on (grant the Role pods deletecollection, as \
                     deploy/rbac.yaml does, to delete many in one request)",
                    status.code
                );
            }
            chunk
                .iter()
                .for_each(|d| delete_logged(services, client, app, d, done));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    services.points.crash("after-delete");
    for d in chunk {
        // Not matched: a plain delete's pod was already gone (deleted, as a 404 is); an
        // excess pod was gone or no longer Pending, and the next tick's list tells which.
        if if_pending && !matched.contains(&d.pod_name) {
            info!(
                "executor {} ({}) is no longer pending: not deleted as excess",
                d.executor_id, d.pod_name
            );
            continue;
        }
        done.gone(d, "deleted");
    }
    Ok(())
}

/// One planned delete by name, logged, its outcome counted.
fn delete_logged(
    services: &Services,
    client: &KubeClient,
    app: &App,
    d: &alloc::Delete,
    done: &mut DeletesDone,
) {
    services.points.crash("before-delete");
    let res = delete_one(client, app, d);
    services.points.crash("after-delete");
    match res {
        Ok(Outcome::Deleted) => done.gone(d, "deleted"),
        Ok(Outcome::Foreign) => {
            // Read, found to be no longer this app's executor (its labels changed, or the
            // name now belongs to another pod): not deleted, and not the app's any more.
            done.ids.push(d.executor_id);
            info!(
                "executor {} ({}): the pod is no longer executor {} of app {}: not deleted, \
                 no longer counted",
                d.executor_id, d.pod_name, d.executor_id, app.app_id
            );
        }
        Ok(Outcome::Skipped) => {}
        Err(e) => done.failed(d, "delete", e),
    }
}

/// One planned eviction, logged, its outcome counted: evicted or gone → done; a
/// disruption budget's 429 → [`DeletesDone::not_now`] with one line quoting the server.
fn evict_logged(
    services: &Services,
    client: &KubeClient,
    d: &alloc::Delete,
    done: &mut DeletesDone,
) {
    services.points.crash("before-delete");
    let pre = d.uid.as_deref().map(|uid| Preconditions {
        uid,
        resource_version: "",
    });
    let res = client.api(&PODS).evict(&d.pod_name, pre);
    services.points.crash("after-delete");
    match res {
        Ok(Evicted::Evicted | Evicted::NotFound) => done.gone(d, "evicted"),
        Ok(Evicted::NotNow(why)) => {
            info!(
                "executor {} ({}, {}): not evicted now, its disruption budget says: {why}; \
                 asked again next tick",
                d.executor_id, d.pod_name, d.reason
            );
            done.not_now.push(d.executor_id);
        }
        Err(e) => done.failed(d, "evict", e),
    }
}

/// What one delete by name did.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Deleted, already being deleted, or already gone.
    Deleted,
    /// Read (an excess delete reads first) and found to be no longer this app's executor:
    /// not deleted.
    Foreign,
    /// Not deleted because it is no longer pending (excess deletes only) or changed since it
    /// was read.
    Skipped,
}

/// Deletes one pod.
fn delete_one(
    client: &KubeClient,
    app: &App,
    d: &alloc::Delete,
) -> std::result::Result<Outcome, KubeError> {
    if d.if_pending {
        // Spark restricts excess deletes to status.phase=Pending: read the pod now, classify
        // it as the snapshot does, and delete it only if still pending, with preconditions so
        // a change in between is a 409.
        let pod = match still_ours(client, app, d)? {
            Read::Gone => return Ok(Outcome::Deleted),
            Read::Foreign => return Ok(Outcome::Foreign),
            Read::Ours(pod) => pod,
        };
        match pod.state {
            ExecutorState::Pending => {}
            ExecutorState::Deleted => return Ok(Outcome::Deleted),
            now => {
                info!(
                    "executor {} ({}) is {now:?} now, not pending: not deleted as excess",
                    d.executor_id, d.pod_name
                );
                return Ok(Outcome::Skipped);
            }
        }
        let pre = Preconditions {
            uid: &pod.uid,
            resource_version: &pod.resource_version,
        };
        return match client.api(&PODS).delete(&d.pod_name, Some(pre)) {
            Ok(_) => Ok(Outcome::Deleted),
            Err(KubeError::Api { ref status, .. }) if status.code == 409 => {
                info!(
                    "executor {} ({}) changed since it was read: left for the next tick",
                    d.executor_id, d.pod_name
                );
                Ok(Outcome::Skipped)
            }
            Err(e) => Err(e),
        };
    }
    match client.api(&PODS).delete(&d.pod_name, None)? {
        Deleted::Deleted | Deleted::NotFound => Ok(Outcome::Deleted),
    }
}

/// Pod `d.pod_name` read again.
enum Read {
    /// Not found.
    Gone,
    /// It exists but is no longer executor `d.executor_id` of this app.
    Foreign,
    /// Executor `d.executor_id` of this app, classified with the snapshot's own rules.
    Ours(Box<crate::engine::snapshot::ExecutorPod>),
}

/// Reads pod `d.pod_name` again and classifies it with the snapshot's own rules.
fn still_ours(
    client: &KubeClient,
    app: &App,
    d: &alloc::Delete,
) -> std::result::Result<Read, KubeError> {
    let Some(pod) = client.api(&PODS).get(&d.pod_name)? else {
        return Ok(Read::Gone);
    };
    let bytes = serde_json::to_vec(&pod).unwrap_or_default();
    let mut one = Snapshot::default();
    let container = app.settings.executor_container.as_deref();
    one.read_pod(&bytes, For::app(&app.app_id).container(container))
        .map_err(|e| KubeError::Decode {
            what: format!("pod {}", d.pod_name),
            message: e.to_string(),
        })?;
    Ok(one
        .executors
        .remove(&d.executor_id)
        .map_or(Read::Foreign, |pod| Read::Ours(Box::new(pod))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::alloc::{Delete, DeleteReason};
    use crate::kube::testutil::{FakeServer, Reply};
    use crate::kube::{ClientOptions, ClusterConfig};

    fn app() -> App {
        App {
            app_id: "spark-1".into(),
            settings: alloc::Settings::new("spark-1"),
            template: None,
            profile_templates: Default::default(),
            own_profile_templates: false,
            driver_pod: None,
            page_size: 0,
        }
    }

    fn seen(id: u64, reason: DeleteReason) -> Delete {
        Delete {
            uid: Some(format!("uid-{id}")),
            ..Delete::unseen(id, format!("spark-1-exec-{id}"), reason)
        }
    }

    /// An excess pending pod read before its delete and found to be another app's (its
    /// labels changed) is not deleted, and is not reported as deleted (it was: "deleted
    /// executor 5" for a pod podalloc read, found foreign and left alone; issue 29).
    #[test]
    fn a_pod_read_and_found_foreign_is_not_deleted_nor_said_deleted() {
        let server = FakeServer::http(|_, _| {
            Reply::json(
                200,
                r#"{"kind":"Pod","metadata":{"name":"spark-1-exec-5","uid":"u5","resourceVersion":"7",
                    "labels":{"spark-app-selector":"other-app","spark-role":"executor","spark-exec-id":"5"}},
                    "status":{"phase":"Pending"}}"#,
            )
        });
        let mut cfg = ClusterConfig::for_server(&server.url(), "ns");
        cfg.allow_insecure_http = true;
        let client = KubeClient::with_options(cfg, ClientOptions::default()).unwrap();
        let d = seen(5, DeleteReason::Excess).if_still_pending();
        assert_eq!(delete_one(&client, &app(), &d).unwrap(), Outcome::Foreign);
        let methods: Vec<String> = server.recorded().iter().map(|r| r.method.clone()).collect();
        assert_eq!(methods, ["GET"], "read, and no delete sent");
    }

    #[test]
    fn the_selector_names_the_app_the_role_and_each_id() {
        assert_eq!(
            selector_of(&app(), [3, 10, 7].into_iter()),
            "spark-app-selector=spark-1,spark-role=executor,spark-exec-id in (3,10,7)"
        );
    }

    /// Two failed pods go in one collection delete, two excess pending ones in another with
    /// the Pending field selector (one of them no longer matched: not deleted), and a
    /// timed-out create, never listed, by name.
    #[test]
    fn listed_pods_go_in_collections_by_kind_and_an_unlisted_one_by_name() {
        let server = FakeServer::http(|req, _| match req.query("fieldSelector") {
            _ if req.path().ends_with("/pods/spark-1-exec-9") => Reply::json(
                200,
                r#"{"kind":"Pod","metadata":{"name":"spark-1-exec-9"}}"#,
            ),
            Some(_) => Reply::json(
                200,
                r#"{"kind":"PodList","items":[{"metadata":{"name":"spark-1-exec-5"}}]}"#,
            ),
            None => Reply::json(
                200,
                r#"{"kind":"PodList","items":[{"metadata":{"name":"spark-1-exec-1"}},{"metadata":{"name":"spark-1-exec-2"}}]}"#,
            ),
        });
        let mut cfg = ClusterConfig::for_server(&server.url(), "ns");
        cfg.allow_insecure_http = true;
        let client = KubeClient::with_options(cfg, ClientOptions::default()).unwrap();
        let plan = [
            seen(1, DeleteReason::Failed),
            seen(5, DeleteReason::Excess).if_still_pending(),
            Delete::unseen(9, "spark-1-exec-9".into(), DeleteReason::TimedOut),
            seen(2, DeleteReason::Failed),
            seen(6, DeleteReason::Excess).if_still_pending(),
        ];
        let done = delete_all(&Services::default(), &client, &app(), &plan);
        assert!(done.error.is_none(), "{:?}", done.error);
        assert_eq!(done.ids, [9, 1, 2, 5], "6 turned Running: not deleted");
        let sent: Vec<(String, Option<String>, Option<String>)> = (server.recorded().iter())
            .map(|r| {
                let q = |k| r.query(k);
                (
                    format!("{} {}", r.method, r.path()),
                    q("labelSelector"),
                    q("fieldSelector"),
                )
            })
            .collect();
        let coll = "DELETE /api/v1/namespaces/ns/pods".to_string();
        let sel = |ids: &str| {
            Some(format!(
                "{},spark-exec-id in ({ids})",
                app().label_selector()
            ))
        };
        assert_eq!(
            sent,
            [
                (
                    "DELETE /api/v1/namespaces/ns/pods/spark-1-exec-9".to_string(),
                    None,
                    None
                ),
                (coll.clone(), sel("1,2"), None),
                (coll, sel("5,6"), Some("status.phase=Pending".to_string())),
            ]
        );
    }
}
