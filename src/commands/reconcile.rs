//! `podalloc reconcile`: one tick (for cron), or with `--dry-run` the plan of the next tick
//! printed and nothing changed.

use super::env::{connect, finish, now_ms, Env};
use crate::cli::{Cli, DryRunOutput, ReconcileArgs};
use crate::controller::tick as reconcile;
use crate::engine::alloc::{self, Request};
use crate::engine::podspec::pod_name;
use crate::error::{Error, Result};
use crate::store::file::store_error;

/// One tick with `--target` as the new target (if given).
pub(super) fn reconcile(cli: &Cli, a: &ReconcileArgs) -> Result<()> {
    if a.dry_run {
        return dry_run(cli, a);
    }
    let env = connect(cli, true)?;
    env.refuse_under_leader("reconcile")?;
    let mut store = env.open_store("reconcile", None).map_err(store_error)?;
    let change = request(a);
    let mut memory = crate::controller::tick::Memory::default();
    let report = env.tick(store.as_mut(), &change, &mut memory, None)?;
    let still_refused = refused_back_off(&report.plan);
    finish(report)?;
    still_refused.map_or(Ok(()), Err)
}

/// A one-shot tick that created nothing because creation backs off from a refusal the
/// API server would repeat (the pod template, an admission policy, a quota that can never
/// admit it: cause `refused`) exits 4, as the tick that met the refusal did: cron's exit
/// status must not say "fine" while the template is still wrong. A full quota or a kubelet
/// rejection may clear on its own: exit 0 as before. `scale`, `add` and `remove` that tick
/// themselves say it in a warning and exit 0: their request is applied, and a retry would
/// apply it again.
pub(super) fn refused_back_off(plan: &alloc::Plan) -> Option<Error> {
    let alloc::Blocked::Backoff {
        remaining_ms,
        message,
    } = plan.blocked.as_ref()?
    else {
        return None;
    };
    let b = plan.state.create_backoff.as_ref()?;
    (b.cause == alloc::BackoffCause::Refused && plan.create.is_empty()).then(|| {
        Error::refused(format!(
            "creation backs off for {} more after the API server refused the executor pod \
             ({} time(s)): {message}; fix it (`status` shows the back-off); a changed template \
             is tried at once",
            humantime::format_duration(std::time::Duration::from_millis(*remaining_ms)),
            b.refusals
        ))
    })
}

/// The step's request of `--target` and `--profile-target`.
fn request(a: &ReconcileArgs) -> Request {
    Request {
        profiles: (a.profile_target.iter())
            .map(|&(p, n)| (p, alloc::TargetChange::Set(n)))
            .collect(),
        ..Request::target(a.target)
    }
}

/// `--dry-run`: lists, runs the step on the saved state (unlocked), prints the plan JSON
/// (or the next executor pod, or only the summary; the summary also goes to stderr).
fn dry_run(cli: &Cli, a: &ReconcileArgs) -> Result<()> {
    let env = connect(cli, false)?;
    let state = env.read_state()?;
    let snapshot = reconcile::list_snapshot(&env.client, &env.app).map_err(|e| env.explain(e))?;
    let request = request(a);
    let plan = alloc::step(&snapshot, &state, &env.app.settings, &request, now_ms())
        .map_err(|e| Error::usage(e.to_string()))?;
    let summary = summary(&plan);
    match a.dry_output {
        DryRunOutput::Plan => {
            eprintln!("{summary}");
            super::print_out(&serde_json::to_string_pretty(&plan).expect("plan serializes"))
        }
        DryRunOutput::Summary => super::print_out(&summary),
        DryRunOutput::Pod => {
            eprintln!("{summary}");
            let pod = next_pod(&env, &plan)?;
            super::print_out(&serde_json::to_string_pretty(&pod).expect("pod serializes"))
        }
    }
}

/// The pod the plan's first create would send; without a create, the one for the next
/// executor id (so a template can be checked at any time). Reads the driver pod for the
/// ownerReference when `--driver-pod` is given.
///
/// Errors (exit 2): no `--template` or `--image`.
fn next_pod(env: &Env, plan: &alloc::Plan) -> Result<serde_json::Value> {
    let Some(template) = env.app.template.as_ref() else {
        return Err(Error::usage(
            "--output pod needs the executor pod template: --template FILE or --image IMAGE",
        ));
    };
    let (id, name) = match plan.create.first() {
        Some(c) => (c.executor_id, c.pod_name.clone()),
        None => {
            let id = plan.state.last_executor_id + 1;
            (id, pod_name(&env.app.settings.name_prefix, id))
        }
    };
    let owner = match &env.app.driver_pod {
        Some(d) => Some(reconcile::read_driver(&env.client, d)?.0),
        None => None,
    };
    Ok(template.build(&env.app.app_id, id, &name, owner.as_ref()))
}

/// One line for a human: the counts, then what would be created and deleted, and why not
/// more.
fn summary(plan: &alloc::Plan) -> String {
    let s = &plan.summary;
    let mut out = format!(
        "dry run: target {} (running {}, pending {}, unacknowledged {})",
        s.target, s.counts.running, s.counts.pending, s.counts.unacknowledged
    );
    let names = |v: Vec<String>| match v.len() {
        0..=5 => v.join(", "),
        n => format!("{}, … ({n} in all)", v[..5].join(", ")),
    };
    if !plan.create.is_empty() {
        let v = plan.create.iter().map(|c| c.pod_name.clone()).collect();
        out.push_str(&format!(
            "; would create {}: {}",
            plan.create.len(),
            names(v)
        ));
    }
    if !plan.delete.is_empty() {
        let v = (plan.delete.iter())
            .map(|d| format!("{} ({})", d.pod_name, d.reason))
            .collect();
        out.push_str(&format!(
            "; would delete {}: {}",
            plan.delete.len(),
            names(v)
        ));
    }
    if plan.create.is_empty() && plan.delete.is_empty() {
        out.push_str("; nothing to do");
    }
    if let Some(b) = &plan.blocked {
        out.push_str(&format!("; blocked: {b}"));
    }
    if let Some(h) = &plan.halt {
        out.push_str(&format!("; halted: {h}"));
    }
    out
}
