//! `podalloc reconcile`: one tick (for cron), or with `--dry-run` the plan of the next tick
//! printed and nothing changed.

use super::env::{connect, finish, now_ms};
use crate::alloc::{self, Request};
use crate::cli::{Cli, ReconcileArgs};
use crate::error::{Error, Result};
use crate::reconcile;
use crate::state::store_error;

/// One tick with `--target` as the new target (if given).
pub(super) fn reconcile(cli: &Cli, a: &ReconcileArgs) -> Result<()> {
    if a.dry_run {
        return dry_run(cli, a);
    }
    let env = connect(cli, true)?;
    let mut store = env.open_store("reconcile", None).map_err(store_error)?;
    let change = Request::target(a.target);
    finish(env.tick(store.as_mut(), &change)?)
}

/// `--dry-run`: lists, runs the step on the saved state (unlocked), prints the plan JSON.
fn dry_run(cli: &Cli, a: &ReconcileArgs) -> Result<()> {
    let env = connect(cli, false)?;
    let state = env.read_state()?;
    let snapshot = reconcile::list_snapshot(&env.client, &env.app).map_err(|e| env.explain(e))?;
    let request = Request::target(a.target);
    let plan = alloc::step(&snapshot, &state, &env.app.settings, &request, now_ms())
        .map_err(|e| Error::usage(e.to_string()))?;
    super::print_out(&serde_json::to_string_pretty(&plan).expect("plan serializes"))
}
