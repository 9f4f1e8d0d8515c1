//! The commands: glue between the parsed command line, the kube client, the state store and
//! the tick, one file per command. Each returns `Ok(())` or an [`Error`](crate::error::Error)
//! carrying its exit code.
//!
//! - `env`: the shared set-up of the connected commands (connect, the state store, a tick).
//! - `home`: finding the app's home in its namespace before falling back to the state file.
//! - `apps`: many apps in one process, the runner fed by an apps file or by `--discover`
//!   (`discover`).
//! - `reconcile`, `run` (the runner with one app), `status`, `change` (`scale`, `add`,
//!   `remove`): connected.
//! - `plan`: the allocation step offline. `sim`: the simulated API server (`sim`,
//!   `--simulate`). `man`: the manual and completions.

mod apps;
mod change;
mod discover;
mod elect;
mod env;
mod home;
mod man;
mod plan;
mod reconcile;
mod run;
#[cfg(feature = "sim")]
mod sim;
#[cfg(not(feature = "sim"))]
#[path = "nosim.rs"]
mod sim;
mod status;

use crate::cli::{Cli, Command};
use crate::error::Result;

/// The pod template parser, at its former path (the tests call it here).
pub use crate::cli::template::parse_template_text;
pub use crate::controller::context::LogContext;
pub use env::now_ms;
pub use status::StatusCounts;

/// Runs the parsed command line (its [`Cli::process`] shared with the logger). A command's
/// last Events are posted before it returns (at most one event deadline).
pub fn run(cli: Cli) -> Result<()> {
    run_command(&cli)
}

fn run_command(cli: &Cli) -> Result<()> {
    match &cli.command {
        Command::Reconcile(a) => reconcile::reconcile(cli, a),
        Command::Run(a) => run::run_loop(cli, a, false),
        Command::Apps(a) => apps::apps(cli, a),
        Command::Status(a) => status::status(cli, a),
        Command::Scale(a) => change::scale(cli, a),
        Command::Add(a) => change::add(cli, a),
        Command::Remove(a) => change::remove(cli, a),
        Command::Plan(a) => plan::plan(&cli.app, a),
        Command::Sim(a) => sim::sim(a),
        Command::Completions(a) => man::completions(a),
        Command::Man => man::man(),
    }
}

/// Writes `text` and a newline to stdout. A closed stdout (`podalloc … | head -1`) ends the
/// output quietly: not an error, no panic. Errors (exit 1): any other write error.
pub(crate) fn print_out(text: &str) -> crate::error::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let res = out
        .write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match res {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(crate::error::Error::runtime(
            format!("writing to standard output: {e}"),
        )),
        _ => Ok(()),
    }
}
