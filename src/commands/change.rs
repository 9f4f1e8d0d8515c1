//! `podalloc scale`, `add` and `remove`: change the target, then run one tick (`scale --wait`:
//! the run loop until converged).

use super::env::{connect, finish};
use crate::alloc::{Request, TargetChange};
use crate::cli::{AddArgs, Cli, RemoveArgs, RunArgs, ScaleArgs};
use crate::error::Result;
use crate::state::store_error;

/// `--log-every` of the loop behind `--wait`.
const DEFAULT_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// `scale N`: sets the target; with `--wait`, ticks until converged.
pub(super) fn scale(cli: &Cli, a: &ScaleArgs) -> Result<()> {
    if a.wait {
        let args = RunArgs {
            target: Some(a.target),
            interval: None,
            until_converged: true,
            timeout: a.timeout,
            leader: Default::default(),
            log_every: DEFAULT_LOG_EVERY,
        };
        return super::run::run_loop(cli, &args, true);
    }
    let change = Request::set(a.target);
    one_tick(cli, "scale", &change, true)
}

/// `add N`: raises the target by N (Spark's addExecutors); with `--wait`, then ticks until
/// converged on the new target, as `scale --wait`.
pub(super) fn add(cli: &Cli, a: &AddArgs) -> Result<()> {
    let change = Request {
        target: TargetChange::Add(a.count),
        remove: vec![],
    };
    if !a.wait {
        return one_tick(cli, "add", &change, true);
    }
    let args = RunArgs {
        target: None,
        interval: None,
        until_converged: true,
        timeout: a.timeout,
        leader: Default::default(),
        log_every: DEFAULT_LOG_EVERY,
    };
    super::run::run_loop_from(cli, &args, true, Some(change))
}

/// `remove ID…`: deletes these executors and lowers the target by as many (Spark's
/// deleteExecutors). Needs no template: it never creates replacements.
pub(super) fn remove(cli: &Cli, a: &RemoveArgs) -> Result<()> {
    let change = Request {
        target: TargetChange::Keep,
        remove: a.ids.clone(),
    };
    one_tick(cli, "remove", &change, false)
}

/// Connects, locks the state and runs one tick with `change`. `need_template`: the tick may
/// create pods.
fn one_tick(cli: &Cli, command: &str, change: &Request, need_template: bool) -> Result<()> {
    let env = connect(cli, need_template)?;
    let mut store = env.open_store(command, None).map_err(store_error)?;
    finish(env.tick(store.as_mut(), change)?)
}
