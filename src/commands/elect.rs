//! `run --leader-elect`: starting the election ([`start`]) and the run loop's hook
//! ([`may_act`]): before each tick the loop asks whether this process leads, and skips the
//! tick when it does not. The election itself is `crate::controller::leader`.

use super::env::Env;
use crate::cli::{Cli, LeaderElectArgs};
use crate::controller::leader::{self, LeaderElection, Timing};
use crate::error::{Error, Result};
use log::warn;

/// The Lease name: `--leader-elect-resource-name`, else `podalloc-<app id>`
/// ([`leader::default_lease_name`]). Errors (exit 2): not a valid name.
pub(super) fn lease_name(given: Option<&str>, app_id: &str) -> Result<String> {
    let name = given.map_or_else(|| leader::default_lease_name(app_id), str::to_string);
    // A Lease name is a DNS-1123 subdomain, as the API server validates it (`a..b` refused).
    if crate::engine::podspec::validate_dns1123_subdomain("", &name).is_err() {
        return Err(Error::usage(format!(
            "--leader-elect-resource-name {name:?} is not a valid Lease name (a DNS-1123 \
             subdomain: lower-case letters, digits, '-' and '.', at most 253, each dot-separated \
             part alphanumeric at both ends)"
        )));
    }
    Ok(name)
}

/// The election's durations from the flags (client-go's defaults for those not given),
/// validated as client-go does. Errors (exit 2): an invalid combination.
pub(super) fn timing(a: &LeaderElectArgs) -> Result<Timing> {
    let d = Timing::default();
    let t = Timing {
        lease_duration: a.leader_elect_lease_duration.unwrap_or(d.lease_duration),
        renew_deadline: a.leader_elect_renew_deadline.unwrap_or(d.renew_deadline),
        retry_period: a.leader_elect_retry_period.unwrap_or(d.retry_period),
    };
    t.validate().map_err(Error::usage)?;
    Ok(t)
}

/// Starts the election when `--leader-elect` is given (`None` otherwise). The identity is
/// [`leader::default_identity`] (`POD_NAME`, or host name and a random suffix); as holder
/// it records the home this `run` uses in the Lease ([`leader::HOME`],
/// [`super::home::mark`]), so that commands find it.
///
/// A Lease missing at the first read is created at once, as client-go does, when the
/// namespace held nothing of the app as the command started
/// ([`super::home::Found::nothing`]) and this `run`'s home is in the cluster: nobody can
/// have led it. Otherwise a missing Lease may be one deleted under a running leader
/// (`kubectl delete lease`), which acts until its next renewal fails, or until its renew
/// deadline when it is cut off: it is created only once it has been missing for a lease
/// duration ([`leader::Elector`]). Errors: exit 2 for bad flags, exit 1 when the election
/// cannot start.
pub(super) fn start(env: &Env, a: &LeaderElectArgs) -> Result<Option<LeaderElection>> {
    if !a.leader_elect {
        return Ok(None);
    }
    let home = super::home::mark(&env.store_kind);
    let in_cluster = !matches!(env.store_kind, crate::cli::StateStoreKind::File);
    let claim = in_cluster && env.found.nothing();
    start_elector(&env.client, a, &env.app.app_id, (claim, Some(home)), None).map(Some)
}

/// [`start`] on `client`'s namespace, the Lease named `podalloc-<id>` by default (`run`:
/// the app id; `apps`: `apps`, so one Lease covers every app of the process); `led`: what
/// says someone may have led there (named in the line logged while a missing Lease is
/// waited for); `None`: nobody can have, so a missing Lease is created at once, as
/// [`start`] does for an app of which the namespace holds nothing. Errors as [`start`].
pub(super) fn start_on(
    client: &crate::kube::KubeClient,
    a: &LeaderElectArgs,
    id: &str,
    led: Option<String>,
) -> Result<Option<LeaderElection>> {
    if !a.leader_elect {
        return Ok(None);
    }
    let claim = led.is_none();
    let le = start_elector(client, a, id, (claim, None), led);
    le.map(Some)
}

/// The claim of `apps` without `--leader-elect`: the same election on the same Lease in
/// claim mode ([`leader::Elector::claiming`]), so that a second process finds it held and
/// refuses instead of managing the same apps. Errors as [`start`].
pub(super) fn claim_on(
    client: &crate::kube::KubeClient,
    a: &LeaderElectArgs,
    id: &str,
) -> Result<LeaderElection> {
    start_elector(client, a, id, (true, None), None)
}

/// The election on Lease `podalloc-<id>` (or `--leader-elect-resource-name`); `claim`:
/// claim mode; `home`: the [`leader::HOME`] annotation written as holder; `why`: why a
/// missing Lease is waited for ([`leader::Elector::missing_because`]).
fn start_elector(
    client: &crate::kube::KubeClient,
    a: &LeaderElectArgs,
    id: &str,
    (claim, home): (bool, Option<String>),
    why: Option<String>,
) -> Result<LeaderElection> {
    let timing = timing(a)?;
    let name = lease_name(a.leader_elect_resource_name.as_deref(), id)?;
    let mut elector = leader::Elector::new(&leader::default_identity(), timing);
    if claim {
        elector = elector.claiming();
    }
    if let Some(home) = home {
        elector = elector.with_home(home);
    }
    if let Some(why) = why {
        elector = elector.missing_because(why);
    }
    LeaderElection::start(client, &name, elector).map_err(crate::controller::tick::kube_error)
}

/// Exit 4 once the RBAC refused a call on `le`'s Lease (403): a retry would meet the same
/// refusal, and without the Lease no replica may act (`run --leader-elect`, `apps` with or
/// without `--leader-elect`). One line naming the command `who`, the Lease, the refused
/// verb and the fix; `why`: what the Lease is for.
pub(super) fn refused(le: &LeaderElection, who: &str, why: &str) -> Result<()> {
    let Some(verb) = le.forbidden() else {
        return Ok(());
    };
    let (ns, name) = le.lease();
    Err(Error::refused(format!(
        "{who}: the RBAC refused {verb} on Lease {ns}/{name} (403 Forbidden): grant leases \
         get/create/update in API group coordination.k8s.io in namespace {ns}; {why}"
    )))
}

/// The run loop's hook: whether this process may tick now (always without
/// `--leader-elect`). A standby writes the leader-election metrics to `--metrics-file`, since
/// it runs no tick that would. Errors: exit 4 when the RBAC refuses the Lease ([`refused`]).
pub(super) fn may_act(le: Option<&LeaderElection>, cli: &Cli, env: &Env) -> Result<bool> {
    let Some(le) = le else {
        return Ok(true);
    };
    let leadership = le.leadership();
    if leadership.0 {
        return Ok(true);
    }
    refused(
        le,
        "run --leader-elect",
        "the election needs it to choose the one replica that acts",
    )?;
    let (app, ns) = (&env.app.app_id, env.client.namespace());
    let text = || crate::controller::metrics::render_standby(app, ns, leadership);
    if let Some(path) = &cli.ops.metrics_file {
        if let Err(e) = crate::controller::metrics::write_atomic(path, &text()) {
            warn!("cannot write the metrics file {}: {e}", path.display());
        }
    }
    // And on `--metrics-bind-address`: a standby's /metrics answered an empty body (issue
    // 28 item 5 promises `podalloc_is_leader 0` there; found by a new-user trial).
    if let Some(probe) = &env.services.probe {
        probe.set_app_metrics(ns, app, text());
    }
    Ok(false)
}
