//! Finding an app's home: where its target, its requests and its state live. Before a
//! command falls back to the state file it looks in the app's namespace ([`look`]) for
//!
//! - an ExecutorSet labelled `spark-app-selector=<app id>` (a list by that label; a 404 for
//!   the kind means the CRD is not installed: skipped),
//! - a state ConfigMap of podalloc's labelled for the app (`spark-app-selector=<app id>`,
//!   `app.kubernetes.io/managed-by=podalloc`: every state ConfigMap carries both, whatever its
//!   name), with its holder record when a `run` loop owns it,
//! - the app's leader-election Lease `podalloc-<app id>`, its live holder and the home that
//!   holder recorded in it ([`crate::controller::leader::HOME`]),
//!
//! and [`choose`] picks the store from what it found and `--state-store`: the ExecutorSet
//! ([`crate::store::executorset`]), the ConfigMap or the state file. A live leader's
//! recorded home wins over every other home found (a leftover); a command given another
//! store exits 2 naming both. A read the RBAC forbids (403) is skipped: the command then
//! sees less, as before this search existed.
//!
//! Whether the Lease's holder is live is judged as the election judges it, never by
//! comparing the holder's `renewTime` with this host's clock alone ([`read_lease`]).

use crate::cli::StateStoreKind;
use crate::controller::leader::{self, Observed};
use crate::error::{Error, Result};
use crate::kube::{KubeClient, ListParams, CONFIG_MAPS, EXECUTOR_SETS, LEASES};
use std::fmt;
use std::time::{Duration, Instant, SystemTime};

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
    /// The home that live holder recorded in the Lease ([`leader::HOME`]); `None` also for
    /// a Lease written by an older podalloc (the homes found then decide, as before).
    pub(super) leader_home: Option<StateStoreKind>,
    /// The `resourceVersion` of a Lease judged stale ([`read_lease`]): read again with
    /// this version, it is not watched a second time.
    pub(super) stale_lease: Option<String>,
    /// Both searches answered (an ExecutorSet kind that is not served counts: none can
    /// exist); `false` when the RBAC hid one (403), or nothing was searched.
    pub(super) complete: bool,
    /// The kinds whose list the RBAC refused (403), e.g. `executorsets`.
    pub(super) forbidden: Vec<&'static str>,
}

impl Found {
    /// Whether the namespace holds nothing of the app: no home (ExecutorSet, state
    /// ConfigMap) and no live leader, every search answered. No `run` can have acted on
    /// it with an in-cluster home, since each creates its home before its first pod.
    pub(super) fn nothing(&self) -> bool {
        self.complete && self.homes.is_empty() && self.leader.is_none()
    }

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
    search(client, app_id, Watch::Yes)
}

/// Whether a Lease whose `renewTime` looks expired is watched to see whether its holder
/// still renews it ([`read_lease`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// Watched (a command, once).
    Yes,
    /// Taken as stopped at once: `apps --discover` looks for each new app's home inside
    /// its loop, where a watch would hold every other app's ticks for up to a lease
    /// duration. The safe side: a stale-looking leader's recorded home is then not
    /// followed, so an app with several homes is refused rather than given another one.
    No,
}

/// [`look`], the Lease read as `watch` says.
fn search(client: &KubeClient, app_id: &str, watch: Watch) -> Result<Found> {
    let mut found = Found::default();
    let mut forbidden = Vec::new();
    let mut skip = |what: &'static str, e: crate::kube::KubeError| match e.status_code() {
        Some(code @ (403 | 404)) => {
            if code == 403 {
                forbidden.push(what);
            }
            log::debug!("{what} not searched: {e}");
            Ok(Vec::new())
        }
        _ => Err(crate::controller::tick::kube_error(e)),
    };
    // The app's objects of one kind (`configmap`: its state ConfigMaps, else ExecutorSets).
    let mut list = |res, configmap: bool, what: &'static str| {
        let sel = selector(app_id, configmap);
        let lp = ListParams {
            label_selector: &sel,
            ..ListParams::default()
        };
        match client.api(res).list_items(&lp) {
            Ok((items, _)) => Ok(items),
            Err(e) => skip(what, e),
        }
    };
    let sets = list(&EXECUTOR_SETS, false, "executorsets")?;
    // A resource profile's own ExecutorSet (`spec.resourceProfile` P > 0) belongs to the home
    // of profile 0 (the one that holds the state): it is not a home of its own.
    let profile = |es: &serde_json::Value| es["spec"]["resourceProfile"].as_u64().unwrap_or(0);
    for es in sets.iter().filter(|es| profile(es) == 0) {
        let name = es["metadata"]["name"].as_str().unwrap_or_default();
        let owner = crate::store::executorset::holder_of(es).map(|h| h.to_string());
        found
            .homes
            .push((Home::ExecutorSet(name.to_string()), owner));
    }
    let cms = list(&CONFIG_MAPS, true, "configmaps")?;
    for cm in &cms {
        let name = cm["metadata"]["name"].as_str().unwrap_or_default();
        let owner = crate::store::configmap::holder_of(cm).map(|h| h.to_string());
        found.homes.push((Home::ConfigMap(name.to_string()), owner));
    }
    found.complete = forbidden.is_empty();
    found.forbidden = forbidden;
    let lease = read_lease_as(client, app_id, None, watch);
    (found.leader, found.leader_home) = (lease.leader, lease.home);
    found.stale_lease = lease.stale;
    Ok(found)
}

/// How often [`read_lease`] reads a Lease again while it watches whether it changes.
const WATCH_POLL: Duration = Duration::from_millis(250);

/// The longest [`read_lease`] watches a Lease (its `leaseDurationSeconds` may say more).
const WATCH_MAX: Duration = Duration::from_secs(60);

/// The app's Lease as a command judges it ([`read_lease`]).
#[derive(Clone, Debug, Default)]
pub(super) struct LeaseSeen {
    /// Its live holder, as `the leader ID (lease NAME)`.
    pub(super) leader: Option<String>,
    /// The home that holder recorded ([`leader::HOME`]), when it did.
    pub(super) home: Option<StateStoreKind>,
    /// The `resourceVersion` of a Lease judged stale.
    pub(super) stale: Option<String>,
}

/// Reads the app's leader-election Lease (`podalloc-<app id>`) and judges whether its
/// holder is live, as the election does: by the record changing, on this host's clock.
///
/// - no Lease, no holder (released, or emptied by hand), or the version `stale` (judged
///   before): no leader;
/// - a holder whose `renewTime` + `leaseDurationSeconds` is still ahead of this host's
///   clock: live at once (no wait; a holder whose clock runs ahead of ours is only taken
///   as live for longer, the safe side: commands hand over or refuse);
/// - a `renewTime` that looks expired (or does not parse): the holder may be live with a
///   clock behind ours, so the Lease is read every 250 ms for up to its lease duration
///   (at most 60 s): a change means live (a live leader renews every retry period, 2 s by
///   default, so this costs about that), no change for the whole duration means stale (a
///   killed leader nobody took over from: the one case that waits the full duration).
///
/// A Lease that cannot be read counts as none (logged at debug: RBAC may not grant
/// leases); a read that fails while watching keeps the holder live.
pub(super) fn read_lease(client: &KubeClient, app_id: &str, stale: Option<&str>) -> LeaseSeen {
    read_lease_as(client, app_id, stale, Watch::Yes)
}

/// [`read_lease`]; with [`Watch::No`] a Lease that looks expired is taken as stopped at once.
fn read_lease_as(
    client: &KubeClient,
    app_id: &str,
    stale: Option<&str>,
    watch: Watch,
) -> LeaseSeen {
    let name = leader::default_lease_name(app_id);
    let get = || match client.api(&LEASES).get(&name) {
        Ok(l) => Some(l.map(|v| Observed::from_lease(&v))),
        Err(e) => {
            log::debug!("lease {name} not read: {e}");
            None
        }
    };
    let Some(Some(seen)) = get() else {
        return LeaseSeen::default();
    };
    let held = !seen.record.holder_identity.is_empty();
    if !held || stale == Some(seen.resource_version.as_str()) || !looks_expired(&seen) {
        return live(&name, held.then_some(&seen));
    }
    if watch == Watch::No {
        log::debug!("lease {name}: its renewTime looks expired; taken as stopped, not watched");
        return LeaseSeen::default();
    }
    let lease_s = match seen.record.lease_duration_seconds {
        0 => leader::DEFAULT_LEASE_DURATION,
        s => Duration::from_secs(s),
    };
    let watch = lease_s.min(WATCH_MAX);
    let holder = &seen.record.holder_identity;
    log::info!(
        "lease {name} names {holder} but its renewTime {:?} looks over {} old by this host's \
         clock: watching it for up to {} to see whether {holder} still renews it",
        seen.record.renew_time,
        humantime::format_duration(lease_s),
        humantime::format_duration(watch)
    );
    let end = Instant::now() + watch;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        std::thread::sleep(WATCH_POLL.min(left));
        match get() {
            None => return live(&name, Some(&seen)),
            Some(None) => return LeaseSeen::default(),
            Some(Some(o)) if o.resource_version != seen.resource_version => {
                let held = !o.record.holder_identity.is_empty();
                return live(&name, held.then_some(&o));
            }
            Some(Some(_)) => {}
        }
    }
    log::info!(
        "lease {name}: {holder} did not renew it for {}: taken as stopped",
        humantime::format_duration(watch)
    );
    LeaseSeen {
        stale: Some(seen.resource_version),
        ..LeaseSeen::default()
    }
}

/// Whether `lease`'s `renewTime` + `leaseDurationSeconds` has passed by this host's clock
/// (or its `renewTime` does not parse).
fn looks_expired(lease: &Observed) -> bool {
    let r = &lease.record;
    let Ok(renewed) = humantime::parse_rfc3339_weak(&r.renew_time) else {
        return true;
    };
    let until = renewed.checked_add(Duration::from_secs(r.lease_duration_seconds));
    until.is_some_and(|u| u <= SystemTime::now())
}

/// `lease` of Lease `name` taken as held by a live leader (`None`: no leader).
fn live(name: &str, lease: Option<&Observed>) -> LeaseSeen {
    let Some(o) = lease else {
        return LeaseSeen::default();
    };
    let home = o.record.home.as_deref().and_then(|m| {
        let parsed = parse_mark(m);
        if parsed.is_none() {
            log::warn!(
                "lease {name}: {} {m:?} is not a home podalloc writes; ignored",
                leader::HOME
            );
        }
        parsed
    });
    LeaseSeen {
        leader: Some(format!(
            "the leader {} (lease {name})",
            o.record.holder_identity
        )),
        home,
        stale: None,
    }
}

/// The Lease's home annotation ([`leader::HOME`]) for store `kind`: `file`,
/// `configmap/NAME` or `executorset/NAME`.
pub(super) fn mark(kind: &StateStoreKind) -> String {
    match kind {
        StateStoreKind::File => "file".to_string(),
        StateStoreKind::ConfigMap(n) => format!("configmap/{n}"),
        StateStoreKind::ExecutorSet(n) => format!("executorset/{n}"),
    }
}

/// The store a home annotation names (`None`: not a value [`mark`] writes).
fn parse_mark(m: &str) -> Option<StateStoreKind> {
    let flag = m.replacen('/', ":", 1);
    (m == "file" || flag != m)
        .then(|| crate::cli::parse_state_store(&flag).ok())
        .flatten()
}

/// `kind` in a message: `the state file`, `ConfigMap NAME`, `ExecutorSet NAME`.
fn describe(kind: &StateStoreKind) -> String {
    home_of(kind).map_or("the state file".to_string(), |h| h.to_string())
}

/// The `--state-store` value naming `kind`.
fn flag(kind: &StateStoreKind) -> String {
    mark(kind).replacen('/', ":", 1)
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
    if let (Some(who), Some(home)) = (&found.leader, &found.leader_home) {
        return leaders_home(given, found, (who, home), app_id, ns);
    }
    if let Some(g) = given {
        let mine = home_of(g);
        match found.running() {
            Some((h, who)) if mine.as_ref() != Some(h) => {
                let this = mine.map_or("the state file".to_string(), |m| m.to_string());
                return Err(Error::usage(format!(
                    "app {app_id}'s running controller, {who}, uses its {h} in namespace {ns}; \
                     this command was given {this} (--state-store), which that controller \
                     never reads: nothing done. Drop --state-store, or give the controller's own \
                     (--state-store {})",
                    match h {
                        Home::ExecutorSet(n) => format!("executorset:{n}"),
                        Home::ConfigMap(n) => format!("configmap:{n}"),
                    }
                )));
            }
            _ => return Ok(g.clone()),
        }
    }
    let home = one_home(found, app_id, ns, Asker::Command)?;
    Ok(home.map_or(StateStoreKind::File, |h| match h {
        Home::ConfigMap(n) => StateStoreKind::ConfigMap(n),
        Home::ExecutorSet(n) => StateStoreKind::ExecutorSet(n),
    }))
}

/// Who looks for an app's home, which decides the fix its refusals name.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asker {
    /// A command of one app: `--state-store` names the home.
    Command,
    /// `apps --discover`: no flag names one app's home; the fix is in the namespace.
    Discovery,
}

/// The app's one in-cluster home found (`None`: none, every search answered), as
/// [`choose`] takes it without `--state-store`: the only one; with several, the one a
/// running controller uses. Errors: a search the RBAC refused with nothing found (exit 4:
/// the home may be hidden), several homes and none in use (exit 2), each naming the fix
/// for `asker`.
fn one_home(found: &Found, app_id: &str, ns: &str, asker: Asker) -> Result<Option<Home>> {
    let home = match (found.homes.as_slice(), found.running()) {
        // A search the RBAC refused may have hidden the app's home: acting on the state
        // file beside it is what homes exist to prevent (found by the attack on issue 28).
        ([], _) if !found.forbidden.is_empty() => {
            let fix = match asker {
                Asker::Command => {
                    "grant `list` on them (deploy/rbac.yaml), or pass --state-store (file, \
                     configmap:NAME, executorset:NAME) to name the home"
                }
                Asker::Discovery => {
                    "grant `list` on them (deploy/apps-deployment.yaml); not managed until then"
                }
            };
            return Err(Error::refused(format!(
                "app {app_id}: cannot look for its home in namespace {ns}: the RBAC does not \
                 let this user list {} (403), so an ExecutorSet or state ConfigMap there \
                 would go unseen: {fix}",
                found.forbidden.join(" and ")
            )));
        }
        ([], _) => return Ok(None),
        ([(h, _)], _) | (_, Some((h, _))) => h.clone(),
        (many, None) => {
            let names: Vec<String> = many.iter().map(|(h, _)| h.to_string()).collect();
            let fix = match asker {
                Asker::Command => "choose one with --state-store".to_string(),
                Asker::Discovery => {
                    let deletes: Vec<String> = (many.iter())
                        .map(|(h, _)| match h {
                            Home::ExecutorSet(n) => format!("executorset {n}"),
                            Home::ConfigMap(n) => format!("configmap {n}"),
                        })
                        .map(|o| format!("`kubectl -n {ns} delete {o}`"))
                        .collect();
                    format!(
                        "not managed until one of them is deleted ({})",
                        deletes.join(" or ")
                    )
                }
            };
            return Err(Error::usage(format!(
                "app {app_id} has {} homes in namespace {ns} ({}), and no running controller \
                 says which is in use: {fix}",
                names.len(),
                names.join(", ")
            )));
        }
    };
    log::debug!("app {app_id}'s home: its {home} in namespace {ns}");
    Ok(Some(home))
}

/// The home of app `app_id` that `apps --discover` found in the client's namespace, taken
/// as [`choose`] takes it without `--state-store` (a live leader's recorded home first; the
/// Lease is not watched, [`Watch::No`]); `None`: the namespace holds none, so the app's
/// store is discovery's own (`--state-configmaps`, `--state-dir`), created at its first
/// tick. Errors: the line that says why the app is not managed (two homes, none in use: both
/// named and the fix; a search the RBAC refused; the API's).
pub(super) fn discovered(
    client: &KubeClient,
    app_id: &str,
) -> std::result::Result<Option<Home>, String> {
    let ns = client.namespace();
    let found = search(client, app_id, Watch::No)
        .map_err(|e| format!("app {app_id}: cannot look for its home in namespace {ns}: {e}; retried at the next listing"))?;
    if let (Some(who), Some(home)) = (&found.leader, &found.leader_home) {
        let kind = leaders_home(None, &found, (who, home), app_id, ns).map_err(|e| e.message)?;
        return Ok(home_of(&kind));
    }
    one_home(&found, app_id, ns, Asker::Discovery).map_err(|e| e.message)
}

/// [`choose`] when a live leader, `who`, recorded its `home` in the Lease: a store given
/// that is not that home is refused (exit 2, naming both and how to target the leader's);
/// without one, the leader's home, with one line naming the other homes found (leftovers
/// the leader never reads, left alone).
fn leaders_home(
    given: Option<&StateStoreKind>,
    found: &Found,
    (who, home): (&str, &StateStoreKind),
    app_id: &str,
    ns: &str,
) -> Result<StateStoreKind> {
    let lhs = describe(home);
    let recorded = format!("recorded in its lease as {}={}", leader::HOME, mark(home));
    if let Some(g) = given.filter(|g| *g != home) {
        let target = match home {
            StateStoreKind::File => "run the command on the leader's host".to_string(),
            h => format!("give --state-store {}", flag(h)),
        };
        return Err(Error::usage(format!(
            "app {app_id}'s running controller, {who}, uses its {lhs} in namespace {ns} \
             ({recorded}); this command was given {} (--state-store), which that leader never \
             reads: nothing done. Drop --state-store, or {target}",
            describe(g)
        )));
    }
    let mine = home_of(home);
    let others: Vec<String> = (found.homes.iter())
        .filter(|(h, _)| Some(h) != mine.as_ref())
        .map(|(h, _)| h.to_string())
        .collect();
    if given.is_none() && !others.is_empty() {
        log::warn!(
            "app {app_id}: {} in namespace {ns} not in use: {who} uses its {lhs} ({recorded}); \
             left alone (delete it if it is a leftover)",
            others.join(", ")
        );
    }
    log::debug!("app {app_id}'s home: {who}'s {lhs} in namespace {ns}");
    Ok(home.clone())
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
            ..Found::default()
        }
    }

    /// [`found`] under a live leader that recorded `home` in its Lease.
    fn led(homes: &[(&str, bool)], home: StateStoreKind) -> Found {
        Found {
            leader_home: Some(home),
            ..found(homes, true)
        }
    }

    #[test]
    fn a_leader_s_recorded_home_wins_and_another_store_is_refused_naming_both() {
        let es = StateStoreKind::ExecutorSet("set".to_string());
        // A leftover state ConfigMap beside the leader's ExecutorSet.
        let f = led(&[("es:set", false), ("podalloc-app", false)], es.clone());
        assert_eq!(choose(None, &f, "app", "ns").unwrap(), es);
        assert_eq!(choose(Some(&es), &f, "app", "ns").unwrap(), es);
        let e = choose(Some(&cm("podalloc-app")), &f, "app", "ns").unwrap_err();
        assert_eq!(e.code, crate::error::ExitCode::Usage);
        for part in [
            "the leader pod-a",
            "ExecutorSet set",
            "podalloc.io/home=executorset/set",
            "ConfigMap podalloc-app",
            "give --state-store executorset:set",
        ] {
            assert!(e.message.contains(part), "{part}: {}", e.message);
        }
        // Even a fresh holder record elsewhere does not outvote the Lease.
        let f = led(&[("es:set", false), ("st", true)], es.clone());
        assert_eq!(choose(None, &f, "app", "ns").unwrap(), es);
        // A leader on its host's state file: the file, never a leftover ConfigMap.
        let f = led(&[("st", false)], StateStoreKind::File);
        assert_eq!(choose(None, &f, "app", "ns").unwrap(), StateStoreKind::File);
        let e = choose(Some(&cm("st")), &f, "app", "ns").unwrap_err();
        assert!(e.message.contains("the leader's host"), "{}", e.message);
    }

    #[test]
    fn nothing_of_the_app_only_when_every_search_answered_empty() {
        assert!(!Found::default().nothing(), "nothing searched");
        let searched = |f: Found| Found {
            complete: true,
            ..f
        };
        assert!(searched(found(&[], false)).nothing());
        assert!(!searched(found(&[], true)).nothing(), "a live leader");
        assert!(
            !searched(found(&[("st", false)], false)).nothing(),
            "a home"
        );
        assert!(!found(&[], false).nothing(), "a search the RBAC forbade");
    }

    #[test]
    fn home_marks_round_trip_and_others_are_ignored() {
        for k in [
            StateStoreKind::File,
            cm("podalloc-app"),
            StateStoreKind::ExecutorSet("etl".to_string()),
        ] {
            assert_eq!(parse_mark(&mark(&k)), Some(k));
        }
        assert_eq!(mark(&cm("x")), "configmap/x");
        for bad in [
            "",
            "files",
            "configmap:x",
            "configmap/",
            "pod/x",
            "executorset/X_",
        ] {
            assert_eq!(parse_mark(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_renew_time_is_only_a_hint_that_the_lease_may_be_stale() {
        let lease = |renew: &str, secs: u64| Observed {
            record: leader::LeaseRecord {
                holder_identity: "a".into(),
                lease_duration_seconds: secs,
                renew_time: renew.into(),
                ..Default::default()
            },
            ..Observed::default()
        };
        let now = humantime::format_rfc3339_micros(SystemTime::now()).to_string();
        assert!(!looks_expired(&lease(&now, 15)));
        assert!(!looks_expired(&lease("2999-01-01T00:00:00.000000Z", 15)));
        assert!(looks_expired(&lease("2001-01-01T00:00:00.000000Z", 15)));
        assert!(looks_expired(&lease("", 15)));
    }

    fn cm(n: &str) -> StateStoreKind {
        StateStoreKind::ConfigMap(n.to_string())
    }

    #[test]
    fn a_command_without_a_store_uses_the_home_it_finds() {
        let pick = |f: &Found| choose(None, f, "app", "ns");
        assert_eq!(pick(&found(&[], false)).unwrap(), StateStoreKind::File);
        // A search the RBAC refused: no silent fall back to the state file (exit 4 naming
        // the kind and the fix); a store given by flag is used.
        let hidden = Found {
            forbidden: vec!["executorsets"],
            ..found(&[], false)
        };
        let e = pick(&hidden).unwrap_err();
        assert_eq!(e.code, crate::error::ExitCode::Refused);
        assert!(e.to_string().contains("list executorsets (403)"), "{e}");
        let file = StateStoreKind::File;
        assert_eq!(choose(Some(&file), &hidden, "app", "ns").unwrap(), file);
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
    fn discovery_takes_the_one_home_and_names_the_kubectl_delete_of_each_of_two() {
        let pick = |f: &Found| one_home(f, "app", "ns", Asker::Discovery);
        assert_eq!(pick(&found(&[], false)).unwrap(), None);
        let es = Home::ExecutorSet("set".to_string());
        assert_eq!(pick(&found(&[("es:set", false)], false)).unwrap(), Some(es));
        let in_use = found(&[("es:set", false), ("st", true)], false);
        assert_eq!(pick(&in_use).unwrap(), Some(Home::ConfigMap("st".into())));
        let e = pick(&found(&[("es:set", false), ("st", false)], false)).unwrap_err();
        assert_eq!(e.code, crate::error::ExitCode::Usage);
        for part in [
            "app app has 2 homes in namespace ns (ExecutorSet set, ConfigMap st)",
            "not managed until one of them is deleted",
            "`kubectl -n ns delete executorset set` or `kubectl -n ns delete configmap st`",
        ] {
            assert!(e.message.contains(part), "{part}: {}", e.message);
        }
        assert!(!e.message.contains("--state-store"), "{}", e.message);
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
