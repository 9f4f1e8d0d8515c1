//! `podalloc status`: the counts of the app's executors and whether they have converged.
//! Read-only: no lock, no save, no API writes.

use super::env::connect;
use crate::cli::{Cli, Output, StatusArgs};
use crate::error::Result;
use crate::reconcile;
use crate::snapshot::ExecutorState;

/// Counts shown by `status`.
#[derive(serde::Serialize, Debug, Default)]
pub struct StatusCounts {
    /// The app id.
    pub app_id: String,
    /// The namespace.
    pub namespace: String,
    /// The state file.
    pub state_file: String,
    /// The target (total expected executors), if one was ever set.
    pub target: Option<u32>,
    /// Running executors.
    pub running: u32,
    /// Pending executors.
    pub pending: u32,
    /// Created, not yet seen.
    pub unacknowledged: u32,
    /// Failed executors (not yet deleted).
    pub failed: u32,
    /// Succeeded executors (not yet deleted).
    pub succeeded: u32,
    /// Executors being deleted.
    pub deleting: u32,
    /// Executors in an unknown phase.
    pub unknown: u32,
    /// The highest executor id handed out or seen.
    pub last_executor_id: u64,
    /// running = target, nothing pending or unacknowledged.
    pub converged: bool,
    /// Totals across ticks: executors created/deleted, API errors by code, last success.
    pub counters: crate::alloc::Counters,
    /// The quota back-off in force, if any.
    pub create_backoff: Option<crate::alloc::Backoff>,
    /// The leader-election Lease, when one exists (`run --leader-elect`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderInfo>,
}

/// The leader-election Lease as `status` shows it.
#[derive(serde::Serialize, Debug, Default)]
pub struct LeaderInfo {
    /// The Lease name.
    pub lease: String,
    /// `spec.holderIdentity`; empty when released.
    pub holder: String,
    /// `spec.renewTime` (RFC 3339, microseconds).
    pub renew_time: String,
    /// `spec.leaseTransitions`.
    pub transitions: u64,
}

/// Reads the app's Lease (`--leader-elect-resource-name`, else `podalloc-<app id>`);
/// `None` when there is none or it cannot be read (logged at debug: RBAC may not grant
/// leases to a read-only user).
fn leader_info(env: &super::env::Env, name: Option<&str>) -> Result<Option<LeaderInfo>> {
    let name = super::elect::lease_name(name, &env.app.app_id)?;
    match env.client.get_lease(&name) {
        Ok(Some(v)) => {
            let r = crate::leader::Observed::from_lease(&v).record;
            Ok(Some(LeaderInfo {
                lease: name,
                holder: r.holder_identity,
                renew_time: r.renew_time,
                transitions: r.lease_transitions,
            }))
        }
        Ok(None) => Ok(None),
        Err(e) => {
            log::debug!("no leader shown: {e}");
            Ok(None)
        }
    }
}

/// Lists the app's pods, reads the state (unlocked) and prints the counts. Changes nothing.
pub(super) fn status(cli: &Cli, a: &StatusArgs) -> Result<()> {
    let env = connect(cli, false)?;
    let state = env.read_state()?;
    let snap = reconcile::list_snapshot(&env.client, &env.app)?;
    let count = |s| snap.count(s) as u32;
    let unack = state
        .unacknowledged
        .iter()
        .filter(|u| !snap.executors.contains_key(&u.executor_id))
        .count() as u32;
    let mut c = StatusCounts {
        app_id: env.app.app_id.clone(),
        namespace: env.client.namespace().to_string(),
        state_file: env.state_location(),
        target: state.target,
        running: count(ExecutorState::Running),
        pending: count(ExecutorState::Pending),
        unacknowledged: unack,
        failed: count(ExecutorState::Failed),
        succeeded: count(ExecutorState::Succeeded),
        deleting: count(ExecutorState::Deleted),
        unknown: count(ExecutorState::Unknown),
        last_executor_id: state.last_executor_id.max(snap.max_id()),
        converged: false,
        counters: state.counters.clone(),
        create_backoff: state.create_backoff.clone(),
        leader: leader_info(&env, a.leader_elect_resource_name.as_deref())?,
    };
    c.converged = state.target == Some(c.running) && c.pending == 0 && c.unacknowledged == 0;
    match a.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&c).expect("serializes")),
        Output::Text => {
            let target = c.target.map_or("unset".to_string(), |t| t.to_string());
            println!(
                "app {} in namespace {} (state {})",
                c.app_id, c.namespace, c.state_file
            );
            println!(
                "target={target} running={} pending={} unacknowledged={} failed={} succeeded={} deleting={} unknown={}",
                c.running, c.pending, c.unacknowledged, c.failed, c.succeeded, c.deleting, c.unknown
            );
            if let Some(l) = &c.leader {
                let holder = if l.holder.is_empty() {
                    "none (released)"
                } else {
                    &l.holder
                };
                println!(
                    "leader: {holder} (lease {}, renewed {}, {} transitions)",
                    l.lease, l.renew_time, l.transitions
                );
            }
            println!(
                "{}",
                if c.converged {
                    "converged"
                } else {
                    "not converged"
                }
            );
        }
    }
    Ok(())
}
