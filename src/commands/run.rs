//! `podalloc run` (and `scale --wait`): tick until stopped, converged or timed out: every
//! `--interval` while something is in flight, every `--idle-interval` at rest, sooner when
//! the plan's own deadline or a steering request queued in the file store comes first.
//!
//! After a failed tick, [`after_error`] decides whether the loop retries at the next tick or
//! stops with the error, as kube-runtime's controller asks its `error_policy`. SIGINT and
//! SIGTERM ([`Shutdown`]) are checked between ticks: the tick in progress finishes and saves,
//! then the command exits 0. A second signal aborts at once (exit [`ABORT_EXIT`]), and a
//! tick still running a second after `--timeout` is aborted with exit 5, whatever the API
//! server does.

use super::env::{connect, Env};
use crate::alloc::{Request, TargetChange};
use crate::cli::{Cli, LogFormat, RunArgs};
use crate::error::{Error, ExitCode, Result};
use crate::reconcile::TickReport;
use crate::state::{store_error, StateStore, StoreError};
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
pub(super) const ABORT_EXIT: i32 = 130;

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
    run_loop_in(connect(cli, true)?, cli, a, progress)
}

/// [`run_loop`] in an environment already connected (`scale --wait` with no owner: the
/// loop applies the request the command queued, then ticks until converged).
pub(super) fn run_loop_in(env: Env, cli: &Cli, a: &RunArgs, progress: bool) -> Result<()> {
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
    let res = run_ticks(env, cli, a, &progress);
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

fn run_ticks(mut env: Env, cli: &Cli, a: &RunArgs, progress: &Progress) -> Result<()> {
    let interval = a.interval.unwrap_or(cli.app.batch_delay);
    let started = Instant::now();
    let deadline = a.timeout.map(|t| started + t);
    env.run_deadline = deadline;
    let env = env;
    // The loop owns the app for its whole life: the file lock is held until it ends, the
    // ConfigMap's holder record is renewed by a write every half of its staleness. Under
    // --leader-elect the Lease says which replica acts, so no holder record is written.
    let command = if progress.on { "scale --wait" } else { "run" };
    // The holder record's heartbeat follows the slowest tick (the idle interval).
    let holding = (!a.leader.leader_elect).then_some(interval.max(a.idle_interval));
    let mut store = env.open_store(command, holding).map_err(store_error)?;
    let shutdown = Shutdown::install(deadline)?;
    // --target seeds the store's target (or, with --force-target, sets it) on the first
    // tick; later ticks follow the store: steering requests, the target annotation.
    let change = Request::target(None);
    let mut first = a.target.map(|n| Request {
        target: match a.force_target {
            true => TargetChange::Set(n),
            false => TargetChange::Seed(n),
        },
        remove: Vec::new(),
    });
    // --leader-elect: released when this function returns (dropped), after the last tick.
    let leader = super::elect::start(&env, &a.leader)?;
    let mut ticks = 0u64;
    let mut log = TickLog {
        last: None,
        at: Instant::now(),
        every: a.log_every,
    };
    loop {
        // Read before the tick lists the queue: a request queued from then on wakes the wait.
        let mark = store.queue_marker();
        // Leader election hook: a standby skips the tick and looks again soon.
        let acting = super::elect::may_act(leader.as_ref(), cli, &env);
        let mut done = None;
        if acting {
            ticks += 1;
            // `first` until a tick has saved it (a tick that failed before saving retries it).
            let request = first.as_ref().unwrap_or(&change);
            done = tick_once(&env, store.as_mut(), request, ticks, progress, &mut log)?;
            if done.is_some() {
                first = None;
            } else if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::timeout(format!(
                    "--timeout of {} passed during tick {ticks}, which did not finish",
                    humantime::format_duration(a.timeout.unwrap_or_default())
                )));
            }
        }
        if done.as_ref().is_some_and(|d| d.converged) && a.until_converged {
            info!(
                "converged after {ticks} tick(s) in {:.1}s",
                started.elapsed().as_secs_f64()
            );
            return stop(store.as_mut(), Ok(()));
        }
        let next = next_tick(acting, done.as_ref(), interval, a.idle_interval);
        let woken = || store.queue_marker() != mark;
        match wait(Instant::now() + next, deadline, &shutdown, &woken) {
            Wake::Tick => {}
            Wake::Signal => {
                info!("signal received: stopping after {ticks} tick(s); state saved");
                return stop(store.as_mut(), Ok(()));
            }
            Wake::Deadline if a.until_converged => {
                let e = Error::timeout(format!(
                    "not converged after {} ({ticks} ticks); raise --timeout or check `podalloc status`",
                    humantime::format_duration(a.timeout.unwrap_or_default())
                ));
                return stop(store.as_mut(), Err(e));
            }
            Wake::Deadline => return stop(store.as_mut(), Ok(())),
        }
    }
}

/// How long the loop waits before its next tick: a standby looks again soon; after a failed
/// tick, the fast interval; else what the plan says ([`crate::alloc::next_tick_ms`]: the fast
/// interval while something is in flight, the idle interval at rest, never past the plan's
/// own deadline).
fn next_tick(acting: bool, done: Option<&TickDone>, fast: Duration, idle: Duration) -> Duration {
    let ms = |d: Duration| d.as_millis() as u64;
    match (acting, done) {
        (false, _) => fast.min(STANDBY_POLL),
        (true, None) => fast,
        (true, Some(d)) => Duration::from_millis(crate::alloc::next_tick_ms(
            d.requeue.map(ms),
            d.busy,
            ms(fast),
            ms(idle),
        )),
    }
}

/// Ends the loop cleanly with `res`, giving up its ownership of the app first (the
/// ConfigMap store's holder record, so that a loop started right after is not refused).
fn stop(store: &mut dyn StateStore, res: Result<()>) -> Result<()> {
    if let Err(e) = store.release() {
        warn!("could not give up the app's holder record: {e}");
    }
    res
}

/// What one tick of the loop found.
struct TickDone {
    /// The app has converged.
    converged: bool,
    /// Something is in flight: not converged, a failed call, or requests still queued.
    busy: bool,
    /// When the plan wants the next tick at the latest ([`TickReport::requeue_after_ms`]).
    requeue: Option<Duration>,
}

/// One tick of the loop, or `None` when it failed before saving with an error
/// [`after_error`] retries (not converged either). A store that someone else now owns
/// ([`StateStore::claim`]: a fresh holder record of another loop) ends the loop with exit 3.
fn tick_once(
    env: &Env,
    store: &mut dyn StateStore,
    change: &Request,
    ticks: u64,
    progress: &Progress,
    log: &mut TickLog,
) -> Result<Option<TickDone>> {
    match store.claim() {
        Ok(()) => {}
        Err(e @ StoreError::Owned(_)) => return Err(store_error(e)),
        Err(e) => return handle_error(store_error(e), ticks).map(|()| None),
    }
    let report = match env.tick(store, change) {
        Ok(report) => report,
        Err(e) => return handle_error(e, ticks).map(|()| None),
    };
    log.log(ticks, &report);
    progress.show(&report);
    let done = TickDone {
        busy: !report.converged() || report.pending_requests > 0,
        converged: report.converged(),
        requeue: report.requeue_after_ms.map(Duration::from_millis),
    };
    if let Some(e) = report.error {
        handle_error(e, ticks)?;
    }
    Ok(Some(done))
}

/// Which tick summary lines are logged at info level: a tick whose line differs from the
/// last one logged, that created or deleted pods or failed, and one every `every` (a
/// heartbeat); the others at debug level. The line's counts are also key-values of the
/// record (JSON logs: fields).
struct TickLog {
    /// The last line logged at info level.
    last: Option<String>,
    /// When it was logged.
    at: Instant,
    /// The heartbeat (`--log-every`).
    every: Duration,
}

impl TickLog {
    fn log(&mut self, ticks: u64, report: &TickReport) {
        let line = report.line();
        let changed = self.last.as_deref() != Some(line.as_str())
            || report.created > 0
            || report.deleted > 0
            || report.error.is_some();
        let level = if changed || self.at.elapsed() >= self.every {
            self.last = Some(line.clone());
            self.at = Instant::now();
            log::Level::Info
        } else {
            log::Level::Debug
        };
        let s = &report.plan.summary;
        log::log!(
            level,
            tick = ticks,
            target = s.target,
            running = s.running,
            pending = s.pending,
            unacknowledged = report.unacknowledged,
            created = report.created,
            deleted = report.deleted,
            failed = s.failed;
            "tick {ticks}"
        );
    }
}

/// Sleeps until `next`, waking every 50 ms to check for a signal, the deadline and `woken`
/// (a steering request queued: the file store's queue directory changed, a `stat`), in that
/// order, and once before sleeping at all.
fn wait(
    next: Instant,
    deadline: Option<Instant>,
    shutdown: &Shutdown,
    woken: &dyn Fn() -> bool,
) -> Wake {
    loop {
        if shutdown.requested() {
            return Wake::Signal;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Wake::Deadline;
        }
        if now >= next || woken() {
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
