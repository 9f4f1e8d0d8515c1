//! `podalloc scale`, `add` and `remove`: change the app, whether or not a loop owns it.
//!
//! - No owner: the command acts itself, as a one-shot tick with the change (`--wait`: the run
//!   loop until converged).
//! - An owner (a `run` or `apps` loop holding the file lock or a live-looking ConfigMap
//!   holder record, or the holder of a live leader-election Lease): the change is handed to
//!   it as a steering request queued in the store it reads ([`crate::store::queue`]), which it
//!   applies at its next tick, in order, exactly once. The command says who will apply it and,
//!   for a ConfigMap holder (whose record is not renewed), waits at most the holder's answer
//!   deadline for the loop to take it, saying whether it did; `--wait` waits until the owner
//!   has applied it and the app has converged.
//!
//! Either way a request that names an executor id above every id this app ever had, or a
//! target out of range, is refused at once (exit 2) and never queued.

use super::env::{connect, finish, now_ms, Env};
use crate::cli::{AddArgs, Cli, RemoveArgs, RunArgs, ScaleArgs};
use crate::engine::alloc::{self, Request, SteerOp};
use crate::error::{Error, Result};
use crate::store::file::{store_error, StateStore, StoreError};
use log::info;
use std::time::{Duration, Instant};

/// `--log-every` of the loop behind `--wait`.
const DEFAULT_LOG_EVERY: Duration = Duration::from_secs(300);

/// How often `--wait` looks again at a handed-over request and the app.
const WAIT_POLL: Duration = Duration::from_millis(200);

/// How many ticks a one-shot command with no owner makes at most to apply its request.
const MAX_ONE_SHOT_TICKS: u32 = 8;

/// The run loop behind `--wait` with no owner: it applies the queued request first.
fn wait_args(timeout: Option<Duration>) -> RunArgs {
    RunArgs {
        target: None,
        force_target: false,
        profile_target: Vec::new(),
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
    steer_waiting(cli, ("scale", a.profile), &op, (a.wait, a.timeout))
}

/// `add N`: raises the target by N (Spark's addExecutors); with `--wait`, then waits until
/// converged on the new target, as `scale --wait`.
pub(super) fn add(cli: &Cli, a: &AddArgs) -> Result<()> {
    let op = SteerOp::Add { count: a.count };
    steer_waiting(cli, ("add", a.profile), &op, (a.wait, a.timeout))
}

/// `scale` and `add`: [`steer`] with a template (the target may rise), waiting for
/// convergence (within the timeout, if any) when `--wait` is given.
fn steer_waiting(
    cli: &Cli,
    command: (&str, u32),
    op: &SteerOp,
    (wait, timeout): (bool, Option<Duration>),
) -> Result<()> {
    steer(cli, command, op, wait.then_some(timeout), true)
}

/// `remove ID…`: deletes these executors and lowers the target by as many (Spark's
/// deleteExecutors). Needs no template: it never creates replacements.
pub(super) fn remove(cli: &Cli, a: &RemoveArgs) -> Result<()> {
    let op = SteerOp::Remove {
        ids: a.ids.clone(),
        evict: cli.app.evict,
    };
    steer(cli, ("remove", a.profile), &op, None, false)
}

/// Checks `op` (exit 2, nothing queued, for an unknown executor id or one of another
/// resource profile than `profile`), queues it in the store as a steering request of
/// `profile`, then: with an owner, says who will apply it and, with `wait`
/// (`Some(--timeout)`), waits until it is applied and the app has converged; with no owner,
/// applies it itself (ticks until its request is applied; `--wait`: until converged). Queued
/// either way, so requests are applied in the order they were made, exactly once.
fn steer(
    cli: &Cli,
    (command, profile): (&str, u32),
    op: &SteerOp,
    wait: Option<Option<Duration>>,
    need_template: bool,
) -> Result<()> {
    let env = connect(cli, false)?;
    refuse_unreachable(&env)?;
    check(&env, op, profile)?;
    let req = crate::store::queue::request(op.clone(), command, profile);
    if let Some(name) = env.executor_set() {
        return steer_executor_set(
            &env,
            name,
            &req,
            wait.map(|t| t.map(|t| Instant::now() + t)),
        );
    }
    // A command that has no template and finds no owner would have to tick itself and
    // cannot: it stops before queueing anything, so that retrying it with a template
    // applies the request once (it used to exit 2 and leave the request queued, and the
    // retry applied both).
    if let (true, Err(e)) = (need_template, cli.app.app(cli.conn.simulate, true)) {
        refuse_unowned_without_template(&env, command, op, e)?;
    }
    // Queued before the owner is looked for, so a tick that follows sees it.
    env.submit(&req)?;
    let queued = |mut e: Error| {
        e.message = format!(
            "{} (request {} stays queued: the next tick applies it)",
            e.message, req.id
        );
        e
    };
    // Only a command that ticks itself needs a template (its tick may create pods): one
    // handed to a running loop, or written into an ExecutorSet's spec, does not.
    let tick_template = || match need_template {
        true => cli
            .app
            .app(cli.conn.simulate, true)
            .map(|_| ())
            .map_err(|mut e| {
                e.message = format!(
                    "{}: no loop owns the app, so this command applies its request itself \
                 (request {} stays queued: a loop, or this command with a template, applies it)",
                    e.message, req.id
                );
                e
            }),
        false => Ok(()),
    };
    // The ConfigMap store reads its holder record at the first load: claim does it now.
    let owner = match env
        .open_store(command, None)
        .and_then(|mut s| s.claim().map(|()| s))
    {
        Ok(mut store) => match env.lease_leader() {
            Some(leader) => Some(leader),
            None if awaits_seed(&env, op)? => {
                return await_seed(&env, op, &req.id, wait);
            }
            None if wait.is_none() => {
                tick_template()?;
                return apply_now(&env, store.as_mut(), &req.id);
            }
            None => None,
        },
        Err(e) => Some(owner_of(e).map_err(queued)?),
    };
    let Some(owner) = owner else {
        tick_template()?;
        return super::run::run_loop_in(env, cli, &wait_args(wait.flatten()), true, None);
    };
    log_handed(op, &owner, &req.id);
    match wait {
        None => confirm_taken(&env, &req.id, &owner),
        Some(timeout) => wait_applied(&env, &req.id, timeout.map(|t| Instant::now() + t)),
    }
}

/// For a command without a template (`missing`: why the flags give none): exit 2, nothing
/// queued, when no loop owns the app (no live holder of its store, no Lease leader) and no
/// seed is awaited, since this command would then tick itself and a tick may create pods.
/// With an owner: `Ok` (the request is handed over, no template needed).
fn refuse_unowned_without_template(
    env: &Env,
    command: &str,
    op: &SteerOp,
    mut missing: Error,
) -> Result<()> {
    let unowned = env
        .open_store(command, None)
        .and_then(|mut s| s.claim())
        .is_ok();
    if !unowned || env.lease_leader().is_some() || awaits_seed(env, op)? {
        return Ok(());
    }
    missing.message = format!(
        "{}: no loop owns the app, so this command would apply `{op}` itself, and its tick \
         may create pods; nothing was queued. Give the template, or start `podalloc run` \
         and steer it",
        missing.message
    );
    Err(missing)
}

/// A request handed to the loop whose holder record is on the state ConfigMap (the record
/// is not renewed, so it says nothing of whether that loop still lives): waits, at most the
/// holder's answer deadline (3 × its interval + 2 s + its tick budget), until the loop has taken request `id`
/// (gone from the queue). Taken: says so. Not taken: the holder did not answer; the request
/// stays queued for the next owner, and the message says what to do (exit 3). Nothing to
/// wait for on the other stores (the file lock's holder is a live process; a Lease holder
/// renews it).
fn confirm_taken(env: &Env, id: &str, owner: &str) -> Result<()> {
    use crate::cli::StateStoreKind;
    let StateStoreKind::ConfigMap(name) = &env.store_kind else {
        return Ok(());
    };
    let holder =
        crate::store::configmap::holder(&env.client, name, &env.app.app_id).map_err(store_error)?;
    let Some(holder) = holder else {
        return Ok(());
    };
    let t0 = Instant::now();
    let deadline = t0 + crate::store::liveness::deadline_of(&holder);
    while env.queued()?.iter().any(|r| r.id == id) {
        if Instant::now() >= deadline {
            return Err(Error::locked(format!(
                "the loop that owns the app, {owner}, did not take request {id} within {} ms: \
                 it may be dead. The request stays queued in ConfigMap {name} for the next \
                 owner: start `podalloc run` (it asks that holder whether it lives and takes \
                 over when it does not answer), or run `podalloc reconcile` (the same), which \
                 applies it",
                (deadline - t0).as_millis()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    info!(
        "request {id} taken by the loop in {} ms",
        t0.elapsed().as_millis()
    );
    Ok(())
}

/// The ExecutorSet home (`docs/executorset.md`): writes request `req` into the spec of the
/// ExecutorSet of its resource profile (`name`, the home, for profile 0:
/// [`crate::store::executorset::profile_home`], [`crate::store::executorset::submit`]) and
/// leaves it to its controller,
/// which follows spec within about one `--interval`; with `deadline` (`--wait`), waits until
/// its status has observed the write and reached the target. Errors: the store's; exit 5 at
/// the deadline.
fn steer_executor_set(
    env: &Env,
    name: &str,
    req: &crate::engine::alloc::Steering,
    deadline: Option<Option<Instant>>,
) -> Result<()> {
    use crate::store::executorset::{followed, profile_home, submit};
    let app = &env.app.app_id;
    let home = name;
    let name = &profile_home(&env.client, name, app, req.profile).map_err(store_error)?;
    let lowering = match &req.op {
        SteerOp::Remove { ids, .. } => Some(removal_lowering(env, ids, req.profile)?),
        _ => None,
    };
    let generation =
        submit(&env.client, name, app, req, lowering.as_deref()).map_err(store_error)?;
    // Who follows it: a loop holding the ExecutorSet, the Lease's leader, or nobody yet (it
    // said "its controller follows it" with no loop running). The holder record is on the
    // home (profile 0's object), whatever the profile written.
    let follower = match crate::store::executorset::holder(&env.client, home, app) {
        Ok(Some(h)) => format!("its controller, {h}, follows it"),
        _ if env.found.leader.is_some() => "its controller (the Lease's leader) follows it".into(),
        _ => "no loop holds it now: the next `podalloc run` or `reconcile` on it follows it".into(),
    };
    info!(
        "`{}` written to the spec of ExecutorSet {name} (generation {generation}, request {}): {follower}",
        req.op, req.id
    );
    let Some(deadline) = deadline else {
        return Ok(());
    };
    while !followed(&env.client, name, app, generation).map_err(store_error)? {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Error::timeout(format!(
                "--timeout passed before the controller of ExecutorSet {name} reached its \
                 target (`kubectl get es {name}` shows it)"
            )));
        }
        std::thread::sleep(WAIT_POLL);
    }
    info!("ExecutorSet {name}: generation {generation} followed, target reached");
    Ok(())
}

/// The executors of `ids` whose removal lowers the target of resource profile `profile`, by
/// the step's rule 6 ([`crate::store::executorset::removal_lowers`]: each once, not one gone,
/// ended, or already being deleted or evicted), on a fresh list and the home's state.
/// Errors: the list's, the state's.
fn removal_lowering(env: &Env, ids: &[u64], profile: u32) -> Result<Vec<u64>> {
    let state = env.read_state()?;
    let snap = crate::controller::tick::list_snapshot(&env.client, &env.app)
        .map_err(|e| env.explain(e))?;
    let settings = &env.app.settings;
    crate::store::executorset::removal_lowers(&snap, &state, settings, (ids, profile), now_ms())
        .map_err(|e| Error::usage(e.to_string()))
}

/// Says who will apply request `id` (`op`): the loop that owns the app (`run`, `apps`), or,
/// when the holder is a one-shot command (a `reconcile` from cron, another `scale`), the
/// next tick of whichever podalloc acts on the app next (R9: never "the loop" when there is
/// none).
fn log_handed(op: &SteerOp, owner: &str, id: &str) {
    let one_shot = ["reconcile", "scale", "add", "remove"]
        .iter()
        .any(|c| owner.contains(&format!("`podalloc {c}")));
    match !one_shot {
        true => info!(
            "`{op}` handed to the loop that owns the app, {owner}, as request {id}: it \
             applies it at its next tick (`podalloc status` lists it until then)"
        ),
        false => info!(
            "`{op}` queued as request {id}: the app is {owner}, a one-shot command that may \
             end before it reads the request; the request stays queued and the next tick on \
             the app (a reconcile, a run, the next command) applies it, once (`podalloc \
             status` lists it until then)"
        ),
    }
}

/// Refuses (exit 2) a request that would go where the app's controller never reads it: a
/// live leader holds the app's Lease, its home is not in the namespace (it recorded `file`
/// in the Lease, or, a Lease without that record, the namespace holds no home of the app):
/// it keeps its state in a file of its own host; no `--state-store` was given, and no
/// process here holds the state file this command would write.
fn refuse_unreachable(env: &Env) -> Result<()> {
    use crate::cli::StateStoreKind;
    let file = matches!(env.store_kind, StateStoreKind::File);
    let local = match &env.found.leader_home {
        Some(home) => *home == StateStoreKind::File,
        None => env.found.homes.is_empty(),
    };
    let (Some(leader), true, false, true) = (&env.found.leader, file, env.store_given, local)
    else {
        return Ok(());
    };
    if crate::store::file::lock_holder(&env.state_path).is_some() {
        return Ok(());
    }
    Err(Error::usage(format!(
        "app {} is owned by {leader}, whose home is not in namespace {} (its lease records \
         the state file, or no ExecutorSet or state ConfigMap is labelled \
         spark-app-selector={} and in use): it keeps its state in a file of its own host, \
         which never reads {}: nothing queued. Run the command where the leader runs, or give \
         the leader an in-cluster home (--state-store configmap:NAME)",
        env.app.app_id,
        env.client.namespace(),
        env.app.app_id,
        env.state_path.display()
    )))
}

/// Whether `op` waits in the queue for a seed: an `add` or a `remove` for an in-cluster
/// home that has no target yet (its controller has not acted: its `--target` seeds the
/// target first, then applies the request on it). Errors: the state read's.
fn awaits_seed(env: &Env, op: &SteerOp) -> Result<bool> {
    let relative = matches!(op, SteerOp::Add { .. } | SteerOp::Remove { .. });
    let in_cluster = !matches!(env.store_kind, crate::cli::StateStoreKind::File);
    Ok(relative && in_cluster && env.read_state()?.target.is_none())
}

/// Leaves request `id` (`op`) queued for the controller's first tick, saying so; with
/// `wait`, waits until it is applied and the app has converged.
fn await_seed(env: &Env, op: &SteerOp, id: &str, wait: Option<Option<Duration>>) -> Result<()> {
    info!(
        "`{op}` queued as request {id} in {}, which has no target yet: the controller applies \
         it after its --target seeds the target (`scale N` sets one now)",
        env.state_location()
    );
    match wait {
        None => Ok(()),
        Some(timeout) => wait_applied(env, id, timeout.map(|t| Instant::now() + t)),
    }
}

/// With no owner: ticks under the lock until request `id` is applied (one tick, unless
/// older queued requests need one of their own first). Errors: the tick's.
fn apply_now(env: &Env, store: &mut dyn StateStore, id: &str) -> Result<()> {
    let mut memory = crate::controller::tick::Memory::default();
    for _ in 0..MAX_ONE_SHOT_TICKS {
        let report = env.tick(store, &Request::default(), &mut memory, None);
        let report = report.map_err(|mut e| {
            e.message = format!(
                "{} (request {id} stays queued: the next tick applies it)",
                e.message
            );
            e
        })?;
        let applied = report.applied.iter().any(|r| r.id == id);
        if applied || report.error.is_some() || report.pending_requests == 0 {
            // Inside a refusal's back-off nothing was created. The request is applied (the
            // target changed), so this is no failure to retry (exit 4 made wrappers that
            // retry raise the target again each time): a warning says it, exit 0.
            if let Some(e) = super::reconcile::refused_back_off(&report.plan) {
                log::warn!("request {id} applied, but nothing created: {}", e.message);
            }
            return finish(report);
        }
    }
    Err(Error::runtime(format!(
        "request {id} is still queued after {MAX_ONE_SHOT_TICKS} ticks; the next tick applies it"
    )))
}

/// Who owns the app, from the error of opening its store for a one-shot command: the holder
/// of the file lock, or of a live-looking ConfigMap holder record. Errors: any other store error.
fn owner_of(e: StoreError) -> Result<String> {
    match e {
        StoreError::Locked(_, Some(h)) => Ok(h.to_string()),
        StoreError::Locked(_, None) => Ok("the holder of the state's lock".to_string()),
        StoreError::Owned(msg) => Ok(msg
            .split_once(": ")
            .and_then(|(_, rest)| rest.split([';', '(']).next())
            .map(str::trim)
            .unwrap_or(&msg)
            .to_string()),
        e => Err(store_error(e)),
    }
}

/// Refuses at once (exit 2) a removal naming an executor id above every id this app ever
/// had (the state's counter and the cluster's highest id): such an executor never existed.
/// Removing one that is already gone is a no-op, as Spark's `killExecutors` of a dead one.
fn check(env: &Env, op: &SteerOp, profile: u32) -> Result<()> {
    if let SteerOp::Add { count } = op {
        // R3: a sum above the largest target is refused here; one queued anyway (another
        // add landed first) stops at the largest target in the step.
        let state = env.read_state()?;
        let current = match profile {
            0 => state.target,
            p => state.profile_targets.get(&p).copied(),
        };
        if alloc::TargetChange::Add(*count).overflows(current) {
            return Err(Error::usage(format!(
                "add {count}: the target {} + {count} would be above the largest target {} \
                 (--target's limit): nothing changed, nothing queued",
                current.unwrap_or(0),
                crate::engine::alloc::MAX_TARGET
            )));
        }
        return Ok(());
    }
    let SteerOp::Remove { ids, .. } = op else {
        return Ok(());
    };
    let state = env.read_state()?;
    let snap = crate::controller::tick::list_snapshot(&env.client, &env.app)
        .map_err(|e| env.explain(e))?;
    let other: Vec<String> = (ids.iter())
        .filter_map(|id| snap.executors.get(id))
        .filter(|p| p.profile != profile)
        .map(|p| format!("{} (profile {})", p.id, p.profile))
        .collect();
    if !other.is_empty() {
        return Err(Error::usage(format!(
            "executor {} of app {} is not of resource profile {profile}: remove each with \
             --profile P of its own profile; nothing removed, nothing queued",
            other.join(", "),
            env.app.app_id
        )));
    }
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
        if live.is_empty() {
            "none".to_string()
        } else {
            live.join(" ")
        }
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
        let snap = crate::controller::tick::list_snapshot(&env.client, &env.app)
            .map_err(|e| env.explain(e))?;
        let plan = alloc::step(
            &snap,
            &state,
            &env.app.settings,
            &Request::default(),
            now_ms(),
        );
        if let Some(p) = plan.ok().filter(|p| p.summary.converged) {
            info!(
                "converged: running {} of target {}",
                p.summary.counts.running, p.summary.target
            );
            return Ok(());
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return late("before the app converged (the request was applied)");
        }
        std::thread::sleep(WAIT_POLL.max(Duration::from_millis(500)));
    }
}
