//! `podalloc run` (and `scale --wait`): tick every interval until stopped, converged or timed
//! out.
//!
//! After a failed tick, [`after_error`] decides whether the loop retries at the next tick or
//! stops with the error, as kube-runtime's controller asks its `error_policy`. SIGINT and
//! SIGTERM ([`Shutdown`]) are checked between ticks: the tick in progress finishes and saves,
//! then the command exits 0. A second signal aborts at once (exit [`ABORT_EXIT`]), and a
//! tick still running a second after `--timeout` is aborted with exit 5, whatever the API
//! server does.

use super::env::{connect, Env};
use crate::alloc::Request;
use crate::cli::{Cli, LogFormat, RunArgs};
use crate::error::{Error, ExitCode, Result};
use crate::reconcile::TickReport;
use crate::state::{store_error, StoreError};
use log::{info, warn};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a `--leader-elect` standby asks whether it leads now.
const STANDBY_POLL: Duration = Duration::from_millis(100);

/// What the loop does after a failed tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Log it and try again at the next tick.
    Retry,
    /// End the command with this error.
    Stop,
}

/// The loop's error policy: a runtime failure (exit 1: the API server or the file system; the
/// next tick may succeed) and a state held by another run (exit 3) are retried; usage errors,
/// permanent refusals and the crash-loop guard stop the loop, since another tick would fail
/// the same way.
fn after_error(e: &Error) -> Flow {
    match e.code {
        ExitCode::Runtime | ExitCode::Locked => Flow::Retry,
        _ => Flow::Stop,
    }
}

/// Applies [`after_error`] to a failed tick: logs a retried error, returns a stopping one.
fn handle_error(e: Error, ticks: u64) -> Result<()> {
    match after_error(&e) {
        Flow::Stop => Err(e),
        Flow::Retry if e.code == ExitCode::Locked => {
            warn!("tick {ticks}: {e}");
            Ok(())
        }
        Flow::Retry => {
            warn!("tick {ticks}: {e}; retrying next tick");
            Ok(())
        }
    }
}

/// The exit code after a second SIGINT/SIGTERM: 128 + SIGINT, as a shell reports a process
/// killed by Ctrl-C.
pub const ABORT_EXIT: i32 = 130;

/// How long a tick may run past `--timeout` before the watchdog aborts the process.
const DEADLINE_GRACE: Duration = Duration::from_secs(1);

/// SIGINT/SIGTERM as a flag the loop checks between ticks, and a watchdog thread.
///
/// The watchdog acknowledges the first signal on stderr at once, and ends the process
/// itself (without waiting for the main thread, which may be blocked in an API call) on a
/// second signal (exit [`ABORT_EXIT`]) or when a tick is still running [`DEADLINE_GRACE`]
/// after `--timeout` (exit 5). Exiting at any point leaves the state consistent by
/// construction: a tick saves the state (write-ahead, an atomic rename) before every API
/// call, so the next run reads either the state before the call or after it and, from the
/// pods it lists, settles whether an unacknowledged create happened; the file lock is
/// released by the kernel when the process ends.
struct Shutdown(Arc<AtomicBool>);

impl Shutdown {
    /// Installs the handlers and starts the watchdog. Errors (exit 1): the handlers cannot
    /// be installed.
    fn install(deadline: Option<Instant>) -> Result<Shutdown> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let flag = Arc::new(AtomicBool::new(false));
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
            .map_err(|e| Error::runtime(format!("cannot install the signal handler: {e}")))?;
        let seen = Arc::clone(&flag);
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || loop {
                for sig in signals.pending() {
                    let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
                    if seen.swap(true, Ordering::SeqCst) {
                        eprintln!(
                            "podalloc: second signal ({name}): aborting now (exit {ABORT_EXIT}); \
                             the state was saved before the API call in progress"
                        );
                        std::process::exit(ABORT_EXIT);
                    }
                    eprintln!(
                        "podalloc: {name} received: finishing the current tick, Ctrl-C again \
                         to abort"
                    );
                }
                if deadline.is_some_and(|d| Instant::now() >= d + DEADLINE_GRACE) {
                    eprintln!(
                        "podalloc: --timeout passed and the tick in progress has not ended \
                         within {}s: aborting (exit 5); the state was saved before the API \
                         call in progress",
                        DEADLINE_GRACE.as_secs()
                    );
                    std::process::exit(ExitCode::Timeout as i32);
                }
                std::thread::sleep(Duration::from_millis(50));
            })
            .map_err(|e| Error::runtime(format!("cannot start the watchdog thread: {e}")))?;
        Ok(Shutdown(flag))
    }

    /// A signal has arrived.
    fn requested(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The progress line `scale --wait` shows: on a terminal it rewrites itself in place.
struct Progress {
    on: bool,
    tty: bool,
    started: Instant,
}

impl Progress {
    fn show(&self, report: &TickReport) {
        if !self.on {
            return;
        }
        let s = &report.plan.summary;
        let line = format!(
            "running {}/{}  pending {}  unacknowledged {}  elapsed {:.0}s",
            s.running,
            s.target,
            s.pending,
            report.unacknowledged,
            self.started.elapsed().as_secs_f64()
        );
        if self.tty {
            eprint!("\r\x1b[2K{line}");
            let _ = std::io::Write::flush(&mut std::io::stderr());
        } else {
            eprintln!("{line}");
        }
    }

    fn done(&self) {
        if self.on && self.tty {
            eprintln!();
        }
    }
}

/// `run`, and `scale --wait` (`progress`: the live progress line).
pub(super) fn run_loop(cli: &Cli, a: &RunArgs, progress: bool) -> Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    // JSON logs stay pure JSON: the log lines carry the same numbers.
    let on = progress && cli.log_format == LogFormat::Text;
    if on && tty {
        // The live line replaces the per-tick log lines; warnings still show.
        log::set_max_level(log::LevelFilter::Warn.min(log::max_level()));
    }
    let progress = Progress {
        on,
        tty,
        started: Instant::now(),
    };
    let res = run_ticks(cli, a, &progress);
    progress.done();
    res
}

/// Why the wait between ticks ended.
enum Wake {
    /// Time for the next tick.
    Tick,
    /// SIGINT or SIGTERM.
    Signal,
    /// `--timeout` expired.
    Deadline,
}

fn run_ticks(cli: &Cli, a: &RunArgs, progress: &Progress) -> Result<()> {
    let mut env = connect(cli, true)?;
    let interval = a.interval.unwrap_or(cli.app.batch_delay);
    let started = Instant::now();
    let deadline = a.timeout.map(|t| started + t);
    env.run_deadline = deadline;
    let shutdown = Shutdown::install(deadline)?;
    let change = Request::target(a.target);
    // --leader-elect: released when this function returns (dropped), after the last tick.
    let leader = super::elect::start(&env, &a.leader)?;
    let mut ticks = 0u64;
    loop {
        // Leader election hook: a standby skips the tick and looks again soon.
        let acting = super::elect::may_act(leader.as_ref(), cli, &env);
        let mut requeue = None;
        if acting {
            ticks += 1;
            let (converged, due) = tick_once(&env, &change, ticks, progress)?;
            if converged == Some(true) && a.until_converged {
                info!(
                    "converged after {ticks} tick(s) in {:.1}s",
                    started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
            if converged.is_none() && deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::timeout(format!(
                    "--timeout of {} passed during tick {ticks}, which did not finish",
                    humantime::format_duration(a.timeout.unwrap_or_default())
                )));
            }
            requeue = due;
        }
        // The plan says when time alone changes something (a creation deadline, the end of a
        // back-off): come back then if that is sooner than the interval.
        let next = match acting {
            true => requeue.map_or(interval, |r| r.min(interval)),
            false => interval.min(STANDBY_POLL),
        };
        match wait(Instant::now() + next, deadline, &shutdown) {
            Wake::Tick => {}
            Wake::Signal => {
                info!("signal received: stopping after {ticks} tick(s); state saved");
                return Ok(());
            }
            Wake::Deadline if a.until_converged => {
                return Err(Error::timeout(format!(
                    "not converged after {} ({ticks} ticks); raise --timeout or check `podalloc status`",
                    humantime::format_duration(a.timeout.unwrap_or_default())
                )))
            }
            Wake::Deadline => return Ok(()),
        }
    }
}

/// One tick of the loop. Returns whether the app has converged (`None` for a tick skipped
/// because another run holds the state, or failed before its report with an error
/// [`after_error`] retries, such as a list that timed out), and when the plan wants the next
/// tick at the latest (`TickReport::requeue_after_ms`).
fn tick_once(
    env: &Env,
    change: &Request,
    ticks: u64,
    progress: &Progress,
) -> Result<(Option<bool>, Option<Duration>)> {
    let mut store = match env.open_store() {
        Err(StoreError::Locked(p)) => {
            warn!(
                "tick {ticks}: another podalloc run holds {}; skipped",
                p.display()
            );
            return Ok((None, None));
        }
        Err(e) => return Err(store_error(e)),
        Ok(store) => store,
    };
    let report = match env.tick(store.as_mut(), change) {
        Ok(report) => report,
        Err(e) => return handle_error(e, ticks).map(|()| (None, None)),
    };
    info!("tick {ticks}: {}", report.line());
    progress.show(&report);
    let converged = report.converged();
    let requeue = report.requeue_after_ms.map(Duration::from_millis);
    if let Some(e) = report.error {
        handle_error(e, ticks)?;
    }
    Ok((Some(converged), requeue))
}

/// Sleeps until `next`, waking every 50 ms to check for a signal and the deadline (in that
/// order, and once before sleeping at all).
fn wait(next: Instant, deadline: Option<Instant>, shutdown: &Shutdown) -> Wake {
    loop {
        if shutdown.requested() {
            return Wake::Signal;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Wake::Deadline;
        }
        if now >= next {
            return Wake::Tick;
        }
        std::thread::sleep((next - now).min(Duration::from_millis(50)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_and_locked_errors_are_retried_the_rest_stop_the_loop() {
        assert_eq!(after_error(&Error::runtime("api 503")), Flow::Retry);
        assert_eq!(after_error(&Error::locked("held")), Flow::Retry);
        for e in [
            Error::usage("bad flag"),
            Error::refused("403"),
            Error::crash_loop("guard"),
            Error::timeout("late"),
        ] {
            assert_eq!(after_error(&e), Flow::Stop, "{e}");
        }
    }
}
