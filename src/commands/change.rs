//! `podalloc scale`, `add` and `remove`: change the app, whether or not a loop owns it.
//!
//! - No owner: the command acts itself, as a one-shot tick with the change (`--wait`: the run
//!   loop until converged).
//! - An owner (a `run` or `apps` loop holding the file lock or a fresh ConfigMap holder
//!   record, or the holder of a live leader-election Lease): the change is handed to it as a
//!   steering request queued in the store it reads ([`crate::steer`]), which it applies at
//!   its next tick, in order, exactly once. The command says who will apply it; `--wait`
//!   waits until the owner has applied it and the app has converged.
//!
//! Either way a request that names an executor id above every id this app ever had, or a
//! target out of range, is refused at once (exit 2) and never queued.

use super::env::{connect, finish, now_ms, Env};
use crate::alloc::{self, Request, SteerOp, TargetChange};
use crate::cli::{AddArgs, Cli, RemoveArgs, RunArgs, ScaleArgs};
use crate::error::{Error, Result};
use crate::state::{store_error, StoreError};
use log::info;
use std::time::{Duration, Instant};

/// `--log-every` of the loop behind `--wait`.
const DEFAULT_LOG_EVERY: Duration = Duration::from_secs(300);

/// How often `--wait` looks again at a handed-over request and the app.
const WAIT_POLL: Duration = Duration::from_millis(200);

/// The run loop behind `--wait` with no owner.
fn wait_args(target: Option<u32>, timeout: Option<Duration>) -> RunArgs {
    RunArgs {
        target,
        force_target: target.is_some(),
        interval: None,
        idle_interval: Duration::from_secs(30),
        until_converged: true,
        timeout,
        leader: Default::default(),
        log_every: DEFAULT_LOG_EVERY,
    }
}

/// `scale N`: sets the target; with `--wait`, then waits until converged.
pub(super) fn scale(cli: &Cli, a: &ScaleArgs) -> Result<()> {
    let op = SteerOp::Scale { target: a.target };
    let env = connect(cli, true)?;
    if let Some(done) = hand_over(&env, "scale", &op, a.wait.then_some(a.timeout))? {
        return done;
    }
    if a.wait {
        drop(env);
        return super::run::run_loop(cli, &wait_args(Some(a.target), a.timeout), true);
    }
    one_tick(&env, "scale", &Request::set(a.target))
}

/// `add N`: raises the target by N (Spark's addExecutors); with `--wait`, then waits until
/// converged on the new target, as `scale --wait`.
pub(super) fn add(cli: &Cli, a: &AddArgs) -> Result<()> {
    let op = SteerOp::Add { count: a.count };
    let env = connect(cli, true)?;
    if let Some(done) = hand_over(&env, "add", &op, a.wait.then_some(a.timeout))? {
        return done;
    }
    let change = Request {
        target: TargetChange::Add(a.count),
        remove: vec![],
    };
    if !a.wait {
        return one_tick(&env, "add", &change);
    }
    drop(env);
    super::run::run_loop_from(cli, &wait_args(None, a.timeout), true, Some(change))
}

/// `remove ID…`: deletes these executors and lowers the target by as many (Spark's
/// deleteExecutors). Needs no template: it never creates replacements.
pub(super) fn remove(cli: &Cli, a: &RemoveArgs) -> Result<()> {
    let op = SteerOp::Remove { ids: a.ids.clone() };
    let env = connect(cli, false)?;
    if let Some(done) = hand_over(&env, "remove", &op, None)? {
        return done;
    }
    let change = Request {
        target: TargetChange::Keep,
        remove: a.ids.clone(),
    };
    one_tick(&env, "remove", &change)
}

/// Locks the state and runs one tick with `change`.
fn one_tick(env: &Env, command: &str, change: &Request) -> Result<()> {
    let mut store = env.open_store(command, None).map_err(store_error)?;
    finish(env.tick(store.as_mut(), change)?)
}

/// Checks `op`, then, when a loop owns the app, hands it over: queues it in the store and,
/// with `wait` (`Some(--timeout)`), waits until it is applied and the app has converged.
/// Returns `None` when no one owns the app (the caller acts itself), else the command's
/// result. Errors: exit 2 for an unknown executor id (nothing queued), the store's.
fn hand_over(
    env: &Env,
    command: &str,
    op: &SteerOp,
    wait: Option<Option<Duration>>,
) -> Result<Option<Result<()>>> {
    check(env, op)?;
    let Some(owner) = owner(env, command)? else {
        return Ok(None);
    };
    let req = crate::steer::request(op.clone(), command);
    env.submit(&req)?;
    info!(
        "`{op}` handed to the loop that owns the app, {owner}, as request {}: it applies it \
         at its next tick (`podalloc status` lists it until then)",
        req.id
    );
    let Some(timeout) = wait else {
        return Ok(Some(Ok(())));
    };
    let deadline = timeout.map(|t| Instant::now() + t);
    Ok(Some(wait_applied(env, &req.id, deadline)))
}

/// Who owns the app, if anyone: the holder of the file lock, a fresh ConfigMap holder
/// record, or the holder of a live leader-election Lease. Errors: the store's other errors.
fn owner(env: &Env, command: &str) -> Result<Option<String>> {
    match env.open_store(command, None) {
        Ok(_) => Ok(env.lease_leader()),
        Err(StoreError::Locked(_, holder)) => Ok(Some(match holder {
            Some(h) => h.to_string(),
            None => "the holder of the state's lock".to_string(),
        })),
        Err(StoreError::Owned(msg)) => Ok(Some(msg
            .split_once(": ")
            .and_then(|(_, rest)| rest.split(" (renewed").next())
            .unwrap_or(&msg)
            .to_string())),
        Err(e) => Err(store_error(e)),
    }
}

/// Refuses at once (exit 2) a removal naming an executor id above every id this app ever
/// had (the state's counter and the cluster's highest id): such an executor never existed.
/// Removing one that is already gone is a no-op, as Spark's `killExecutors` of a dead one.
fn check(env: &Env, op: &SteerOp) -> Result<()> {
    let SteerOp::Remove { ids } = op else {
        return Ok(());
    };
    let state = env.read_state()?;
    let snap = crate::reconcile::list_snapshot(&env.client, &env.app).map_err(|e| env.explain(e))?;
    let last = state.last_executor_id.max(snap.max_id());
    let unknown: Vec<String> = (ids.iter())
        .filter(|&&id| id > last)
        .map(u64::to_string)
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let live: Vec<String> = snap.executors.keys().map(u64::to_string).collect();
    Err(Error::usage(format!(
        "no executor {} in app {} (the highest id it ever had is {last}; executors now: {}): \
         nothing removed, nothing queued",
        unknown.join(", "),
        env.app.app_id,
        if live.is_empty() { "none".to_string() } else { live.join(" ") }
    )))
}

/// Waits until request `id` has left the store's queue (the owner applied it), then until
/// the app has converged (the step's own definition, on a fresh list and the saved state).
/// Errors: exit 5 at `deadline`; the store's and the API's.
fn wait_applied(env: &Env, id: &str, deadline: Option<Instant>) -> Result<()> {
    let late = |what: &str| {
        Err(Error::timeout(format!(
            "--timeout passed {what}; `podalloc status` shows the app"
        )))
    };
    while env.queued()?.iter().any(|r| r.id == id) {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return late("before the owner applied the request (it stays queued)");
        }
        std::thread::sleep(WAIT_POLL);
    }
    info!("request {id} applied by the owner; waiting until the app has converged");
    loop {
        let state = env.read_state()?;
        let snap =
            crate::reconcile::list_snapshot(&env.client, &env.app).map_err(|e| env.explain(e))?;
        let plan = alloc::step(&snap, &state, &env.app.settings, &Request::default(), now_ms());
        if let Some(p) = plan.ok().filter(|p| p.summary.converged) {
            info!(
                "converged: running {} of target {}",
                p.summary.running, p.summary.target
            );
            return Ok(());
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return late("before the app converged (the request was applied)");
        }
        std::thread::sleep(WAIT_POLL.max(Duration::from_millis(500)));
    }
}
