//! Finding an app's home: where its target, its requests and its state live. Before a
//! command falls back to the state file it looks in the app's namespace ([`look`]) for
//!
//! - an ExecutorSet labelled `spark-app-selector=<app id>` (a list by that label; a 404 for
//!   the kind means the CRD is not installed: skipped),
//! - a state ConfigMap of podalloc's labelled for the app (`spark-app-selector=<app id>`,
//!   `app.kubernetes.io/managed-by=podalloc`: every state ConfigMap carries both, whatever its
//!   name), with its holder record when a `run` loop owns it,
//! - the app's leader-election Lease `podalloc-<app id>` and its live holder,
//!
//! and [`choose`] picks the store from what it found and `--state-store`: the ExecutorSet
//! ([`crate::store::executorset`]), the ConfigMap or the state file. A read the RBAC
//! forbids (403) is skipped: the command then sees less, as before this search existed.

use crate::cli::StateStoreKind;
use crate::error::{Error, Result};
use crate::kube::{KubeClient, ListParams, CONFIG_MAPS, EXECUTOR_SETS, LEASES};
use std::fmt;
use std::time::{Duration, SystemTime};

/// One of an app's homes in its namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Home {
    /// An ExecutorSet of this name (`docs/executorset.md`).
    ExecutorSet(String),
    /// A state ConfigMap of this name (`--state-store configmap:NAME`).
    ConfigMap(String),
}

impl fmt::Display for Home {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Home::ExecutorSet(n) => write!(f, "ExecutorSet {n}"),
            Home::ConfigMap(n) => write!(f, "ConfigMap {n}"),
        }
    }
}

/// What the app's namespace holds for it.
#[derive(Clone, Debug, Default)]
pub(super) struct Found {
    /// The in-cluster homes, ExecutorSets first, each with the loop that owns it now (a
    /// fresh holder record of a ConfigMap), if any.
    pub(super) homes: Vec<(Home, Option<String>)>,
    /// The live holder of the app's Lease, as `the leader ID (lease NAME)`.
    pub(super) leader: Option<String>,
}

impl Found {
    /// The home a running controller uses, with who runs it: the one whose holder record is
    /// fresh, else, under a live Lease, the only in-cluster home.
    pub(super) fn running(&self) -> Option<(&Home, String)> {
        let held = self
            .homes
            .iter()
            .find_map(|(h, o)| o.clone().map(|o| (h, o)));
        held.or_else(|| match (&self.leader, self.homes.as_slice()) {
            (Some(l), [(h, _)]) => Some((h, l.clone())),
            _ => None,
        })
    }
}

/// The label selector of the app's homes.
fn selector(app_id: &str, managed: bool) -> String {
    match managed {
        true => format!(
            "spark-app-selector={app_id},{}=podalloc",
            crate::store::configmap::MANAGED_BY
        ),
        false => format!("spark-app-selector={app_id}"),
    }
}

/// Looks in the client's namespace for app `app_id`'s ExecutorSets, state ConfigMaps and
/// live Lease holder. A kind that is not served (404) or that the RBAC does not let us read
/// (403) counts as none (logged at debug). Errors (exit 1): any other API failure.
pub(super) fn look(client: &KubeClient, app_id: &str) -> Result<Found> {
    let mut found = Found::default();
    let skip = |what: &str, e: crate::kube::KubeError| match e.status_code() {
        Some(403 | 404) => {
            log::debug!("{what} not searched: {e}");
            Ok(Vec::new())
        }
        _ => Err(crate::controller::tick::kube_error(e)),
    };
    let es_sel = selector(app_id, false);
    let lp = ListParams {
        label_selector: &es_sel,
        ..ListParams::default()
    };
    let sets = match client.api(&EXECUTOR_SETS).list_items(&lp) {
        Ok((items, _)) => items,
        Err(e) => skip("executorsets", e)?,
    };
    // A resource profile's own ExecutorSet (`spec.resourceProfile` P > 0) belongs to the home
    // of profile 0 (the one that holds the state): it is not a home of its own.
    let profile = |es: &serde_json::Value| es["spec"]["resourceProfile"].as_u64().unwrap_or(0);
    for es in sets.iter().filter(|es| profile(es) == 0) {
        let name = es["metadata"]["name"].as_str().unwrap_or_default();
        found
            .homes
            .push((Home::ExecutorSet(name.to_string()), None));
    }
    let cm_sel = selector(app_id, true);
    let lp = ListParams {
        label_selector: &cm_sel,
        ..ListParams::default()
    };
    let cms = match client.api(&CONFIG_MAPS).list_items(&lp) {
        Ok((items, _)) => items,
        Err(e) => skip("configmaps", e)?,
    };
    for cm in &cms {
        let name = cm["metadata"]["name"].as_str().unwrap_or_default();
        let owner = crate::store::configmap::fresh_holder_of(cm)
            .map(|(h, age)| format!("{h} (renewed {age}s ago)"));
        found.homes.push((Home::ConfigMap(name.to_string()), owner));
    }
    found.leader = live_leader(client, app_id);
    Ok(found)
}

/// The holder of the app's leader-election Lease (`podalloc-<app id>`) when one holds it
/// and its `renewTime` + `leaseDurationSeconds` has not passed by our clock, as `the leader
/// ID (lease NAME)`; `None` otherwise, also when the Lease cannot be read (logged at debug:
/// RBAC may not grant leases).
pub(super) fn live_leader(client: &KubeClient, app_id: &str) -> Option<String> {
    let name = crate::controller::leader::default_lease_name(app_id);
    let lease = match client.api(&LEASES).get(&name) {
        Ok(l) => l?,
        Err(e) => {
            log::debug!("lease {name} not read: {e}");
            return None;
        }
    };
    let r = crate::controller::leader::Observed::from_lease(&lease).record;
    let renewed = humantime::parse_rfc3339_weak(&r.renew_time).ok()?;
    let until = renewed + Duration::from_secs(r.lease_duration_seconds);
    (!r.holder_identity.is_empty() && until > SystemTime::now())
        .then(|| format!("the leader {} (lease {name})", r.holder_identity))
}

/// The store `given` (`--state-store`) names, as a home (`None`: the state file).
fn home_of(given: &StateStoreKind) -> Option<Home> {
    match given {
        StateStoreKind::File => None,
        StateStoreKind::ConfigMap(n) => Some(Home::ConfigMap(n.clone())),
        StateStoreKind::ExecutorSet(n) => Some(Home::ExecutorSet(n.clone())),
    }
}

/// The store of a command from `--state-store` (`given`) and what the namespace holds
/// (`found`, app `app_id` in `ns`):
///
/// - given, and a running controller uses another home: exit 2 naming both (the command
///   would write where that controller never reads);
/// - given otherwise: that store;
/// - not given: the app's one in-cluster home; with several, the one a running controller
///   uses, else exit 2 naming them; with none, the state file.
///
/// Errors (exit 2): as above.
pub(super) fn choose(
    given: Option<&StateStoreKind>,
    found: &Found,
    app_id: &str,
    ns: &str,
) -> Result<StateStoreKind> {
    if let Some(g) = given {
        let mine = home_of(g);
        match found.running() {
            Some((h, who)) if mine.as_ref() != Some(h) => {
                let this = mine.map_or("the state file".to_string(), |m| m.to_string());
                return Err(Error::usage(format!(
                    "app {app_id}'s running controller, {who}, uses its {h} in namespace {ns}; \
                     this command was given {this} (--state-store), which that controller \
                     never reads: nothing done. Drop --state-store, or give the controller's"
                )));
            }
            _ => return Ok(g.clone()),
        }
    }
    let home = match (found.homes.as_slice(), found.running()) {
        ([], _) => return Ok(StateStoreKind::File),
        ([(h, _)], _) | (_, Some((h, _))) => h.clone(),
        (many, None) => {
            let names: Vec<String> = many.iter().map(|(h, _)| h.to_string()).collect();
            return Err(Error::usage(format!(
                "app {app_id} has {} homes in namespace {ns} ({}), and no running controller \
                 says which is in use: choose one with --state-store",
                names.len(),
                names.join(", ")
            )));
        }
    };
    log::debug!("app {app_id}'s home: its {home} in namespace {ns}");
    match home {
        Home::ConfigMap(n) => Ok(StateStoreKind::ConfigMap(n)),
        Home::ExecutorSet(n) => Ok(StateStoreKind::ExecutorSet(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(homes: &[(&str, bool)], leader: bool) -> Found {
        Found {
            homes: (homes.iter())
                .map(|(n, held)| {
                    let h = match n.strip_prefix("es:") {
                        Some(es) => Home::ExecutorSet(es.to_string()),
                        None => Home::ConfigMap(n.to_string()),
                    };
                    (h, held.then(|| "podalloc run on host h".to_string()))
                })
                .collect(),
            leader: leader.then(|| "the leader pod-a (lease podalloc-app)".to_string()),
        }
    }

    fn cm(n: &str) -> StateStoreKind {
        StateStoreKind::ConfigMap(n.to_string())
    }

    #[test]
    fn a_command_without_a_store_uses_the_home_it_finds() {
        let pick = |f: &Found| choose(None, f, "app", "ns");
        assert_eq!(pick(&found(&[], false)).unwrap(), StateStoreKind::File);
        assert_eq!(pick(&found(&[], true)).unwrap(), StateStoreKind::File);
        assert_eq!(pick(&found(&[("st", false)], false)).unwrap(), cm("st"));
        assert_eq!(pick(&found(&[("st", false)], true)).unwrap(), cm("st"));
        // Two homes: the one in use, else a usage error naming both.
        assert_eq!(
            pick(&found(&[("a", false), ("b", true)], false)).unwrap(),
            cm("b")
        );
        let e = pick(&found(&[("a", false), ("b", false)], true)).unwrap_err();
        assert_eq!(e.code, crate::error::ExitCode::Usage);
        assert!(
            e.message.contains("ConfigMap a, ConfigMap b"),
            "{}",
            e.message
        );
        let es = StateStoreKind::ExecutorSet("set".to_string());
        assert_eq!(pick(&found(&[("es:set", false)], false)).unwrap(), es);
        // An ExecutorSet under a live Lease is the leader's home: another store is refused.
        let f = found(&[("es:set", false)], true);
        let e = choose(Some(&cm("st")), &f, "app", "ns").unwrap_err();
        assert!(e.message.contains("ExecutorSet set"), "{}", e.message);
        assert_eq!(choose(Some(&es), &f, "app", "ns").unwrap(), es);
    }

    #[test]
    fn a_store_other_than_the_running_controllers_is_refused_naming_both() {
        let f = found(&[("st", false)], true);
        let e = choose(Some(&StateStoreKind::File), &f, "app", "ns").unwrap_err();
        assert_eq!(e.code, crate::error::ExitCode::Usage);
        assert!(e.message.contains("the leader pod-a"), "{}", e.message);
        assert!(e.message.contains("ConfigMap st"), "{}", e.message);
        assert!(e.message.contains("the state file"), "{}", e.message);
        let e = choose(Some(&cm("other")), &f, "app", "ns").unwrap_err();
        assert!(e.message.contains("ConfigMap other"), "{}", e.message);
        assert_eq!(choose(Some(&cm("st")), &f, "app", "ns").unwrap(), cm("st"));
        // No controller runs: the store given is the user's choice.
        let idle = found(&[("st", false)], false);
        let file = StateStoreKind::File;
        assert_eq!(choose(Some(&file), &idle, "app", "ns").unwrap(), file);
    }
}
