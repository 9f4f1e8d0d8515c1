//! `podalloc run` (and `scale --wait`): the runner ([`crate::controller::runner`]) with one
//! app: tick until stopped, converged or timed out: every `--interval` while something is in
//! flight, every `--idle-interval` at rest, sooner when the plan's own deadline or a steering
//! request queued in the file store comes first. The error policy, the signals and
//! `--timeout` are the runner's; this file connects the app, seeds `--target` and shows
//! `scale --wait`'s progress line.

use super::env::{connect_with, Env};
use crate::cli::{Cli, LogFormat, RunArgs};
use crate::controller::runner::{self, Control, Feed, Options, Outcome, Shutdown, Slot};
use crate::controller::tick::TickReport;
use crate::engine::alloc::{Request, TargetChange};
use crate::error::{Error, Result};
use crate::store::file::store_error;
use std::collections::BTreeMap;
use std::time::Instant;

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
            s.counts.running,
            s.target,
            s.counts.pending,
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
    // Bad leader-election flags are refused before any request.
    if a.leader.leader_elect {
        super::elect::timing(&a.leader)?;
        super::elect::lease_name(a.leader.leader_elect_resource_name.as_deref(), "app")?;
    }
    // The signal handlers before the first request: finding the app's home (its store,
    // its Lease) may take as long as the retries last against a server that is down, and a
    // signal meanwhile ends the process at once, exit 0 (`Phase::Starting`), its requests'
    // waits running the hook as a tick's do.
    let shutdown = Shutdown::install(cli.process.log.clone())?;
    let env = connect_with(cli, true, Some(&shutdown.0))?;
    run_loop_in(env, cli, a, progress, Some(shutdown))
}

/// [`run_loop`] in an environment already connected (`scale --wait` with no owner: the
/// loop applies the request the command queued, then ticks until converged); `shutdown`:
/// the handlers when installed before connecting, else installed here.
pub(super) fn run_loop_in(
    env: Env,
    cli: &Cli,
    a: &RunArgs,
    progress: bool,
    shutdown: Option<Shutdown>,
) -> Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    // JSON logs stay pure JSON: the log lines carry the same numbers.
    let on = progress && cli.ops.log_format == LogFormat::Text;
    if on && tty {
        // The live line replaces the per-tick log lines; warnings still show.
        log::set_max_level(log::LevelFilter::Warn.min(log::max_level()));
    }
    let progress = Progress {
        on,
        tty,
        started: Instant::now(),
    };
    let res = run_ticks(env, cli, a, &progress, shutdown);
    progress.done();
    res
}

/// `run`'s feed: the one app, ticked with its own list ([`Env::tick`]: the metrics file, the
/// tick budget, `--timeout`), its ending the command's error.
struct RunFeed<'e> {
    env: &'e Env,
    cli: &'e Cli,
    progress: &'e Progress,
    /// Waiting as a standby: another loop's fresh holder record is on the app's store.
    standby: bool,
    /// Without `--leader-elect`, whether this loop acts and how often that changed, once it
    /// has waited as a standby (`podalloc_is_leader` on `/metrics`); `None` before.
    leadership: Option<(bool, u64)>,
}

impl RunFeed<'_> {
    /// Publishes whether this loop acts after a tick's `outcome`: while another loop owns
    /// the store, the standby's metrics (`podalloc_is_leader 0`) on `/metrics` and in
    /// `--metrics-file`; once it takes over, `podalloc_is_leader 1`.
    fn publish(&mut self, outcome: &Outcome) {
        let standby = matches!(outcome, Outcome::Standby(_));
        if standby == self.standby {
            if standby {
                self.standby_metrics();
            }
            return;
        }
        self.standby = standby;
        let transitions = self.leadership.map_or(0, |(_, t)| t + 1);
        self.leadership = Some((!standby, transitions));
        if standby {
            self.standby_metrics();
        }
    }

    fn standby_metrics(&self) {
        let (app, ns) = (&self.env.app.app_id, self.env.client.namespace());
        let leader = self.leadership.unwrap_or((false, 0));
        let text = crate::controller::metrics::render_standby(app, ns, leader);
        if let Some(probe) = &self.env.services.probe {
            probe.set_app_metrics(ns, app, text.clone());
        }
        if let Some(path) = &self.cli.ops.metrics_file {
            if let Err(e) = crate::controller::metrics::write_atomic(path, &text) {
                log::warn!("cannot write the metrics file {}: {e}", path.display());
            }
        }
    }
}

impl<'e> Feed<'e> for RunFeed<'e> {
    fn may_act(&mut self, shared: &Control) -> Result<bool> {
        shared.with_leader(|le| super::elect::may_act(le, self.cli, self.env))
    }

    fn round(
        &mut self,
        slots: &mut [Slot<'e>],
        due: &[usize],
        shared: &Control,
    ) -> Vec<(usize, Outcome)> {
        let env = self.env;
        let leader = shared
            .with_leader(|le| le.map(|le| le.leadership()))
            .or(self.leadership);
        let out: Vec<(usize, Outcome)> = (due.iter())
            .filter_map(|&i| {
                let outcome = slots[i].tick(shared, &env.services, |_, store, memory, request| {
                    env.tick(store, request, memory, leader)
                });
                outcome.map(|o| (i, o))
            })
            .collect();
        if let Some((_, o)) = out.last() {
            self.publish(o);
        }
        out
    }

    fn ticked(&mut self, report: &TickReport) {
        self.progress.show(report);
    }

    fn finish(&mut self, _slot: &mut Slot<'e>, e: Error) -> Option<Error> {
        Some(e)
    }
}

fn run_ticks(
    mut env: Env,
    cli: &Cli,
    a: &RunArgs,
    progress: &Progress,
    shutdown: Option<Shutdown>,
) -> Result<()> {
    let o = Options {
        interval: a.interval.unwrap_or(cli.app.batch_delay),
        idle_interval: a.idle_interval,
        timeout: a.timeout,
        until_converged: a.until_converged,
        once: false,
        started: Instant::now(),
    };
    env.run_deadline = a.timeout.map(|t| o.started + t);
    let endpoints = super::env::endpoints(cli, o.interval.max(a.idle_interval))?;
    let _endpoints = endpoints.map(|(e, probe)| {
        env.services.probe = Some(probe);
        e
    });
    let env = env;
    if !a.leader.leader_elect {
        env.refuse_under_leader("run")?;
    }
    // The loop owns the app for its whole life: the file lock is held until it ends; on a
    // ConfigMap or an ExecutorSet its holder record is written once, when it claims the
    // home, and a process that finds it asks the loop whether it lives (ping/pong,
    // crate::store::liveness). Under --leader-elect the Lease says which replica acts, so
    // no holder record is written.
    let command = if progress.on { "scale --wait" } else { "run" };
    // The loop reads its home every --interval at rest, so it answers a ping within about
    // one interval: its record's answer deadline is 3 × interval + 2 s + the tick budget (it answers
    // between ticks).
    let holding = (!a.leader.leader_elect).then_some(o.interval);
    let shutdown = match shutdown {
        Some(s) => s,
        None => Shutdown::install(env.services.log.clone())?,
    };
    shutdown.0.set_deadline(env.run_deadline);
    // Between its requests and while they wait, the loop answers the endpoints, reads its
    // signals and renews its Lease (the Lease client is derived: it shares the hook).
    shutdown.0.set_probe(env.services.probe.as_ref());
    shutdown.0.serve_between_requests(&env.client);
    env.services.set_waiter(shutdown.0.waiter());
    let holding = holding.map(|h| (h, shutdown.0.as_ref()));
    refuse_forced_target(&env, a)?;
    let store = env.open_store(command, holding).map_err(store_error)?;
    // The runner's fence first: the election's own is then not installed, this one asks it.
    shutdown.0.fence(&env.client);
    shutdown.0.set_leader(super::elect::start(&env, &a.leader)?);
    let ns = env.client.namespace().to_string();
    let mut slot = Slot::new(env.app.clone(), &ns, store, &shutdown.0, a.log_every);
    // --target seeds the store's target (or, with --force-target, sets it) on the first
    // tick; later ticks follow the store: steering requests, the target annotation.
    let change = match a.force_target {
        true => TargetChange::Set,
        false => TargetChange::Seed,
    };
    let profiles: BTreeMap<u32, TargetChange> = (a.profile_target.iter())
        .map(|&(p, n)| (p, change(n)))
        .collect();
    slot.first = (a.target.is_some() || !profiles.is_empty()).then(|| Request {
        target: a.target.map_or(TargetChange::Keep, change),
        profiles,
        ..Request::default()
    });
    let mut feed = RunFeed {
        env: &env,
        cli,
        progress,
        standby: false,
        leadership: None,
    };
    let res = runner::run(&o, vec![slot], &mut feed, &shutdown, &env.services);
    // --leader-elect: the Lease released after the last tick (the fence keeps the Arc).
    shutdown.0.set_leader(None);
    res
}

/// `run --force-target N` on an ExecutorSet that sets another target: exit 2 now, before
/// the loop claims the home or waits as a standby (the first tick refused it, so a standby
/// exited 2 at the very takeover it waited for, leaving its new holder record behind).
fn refuse_forced_target(env: &Env, a: &RunArgs) -> Result<()> {
    let (true, Some(m), crate::cli::StateStoreKind::ExecutorSet(name)) =
        (a.force_target, a.target, &env.store_kind)
    else {
        return Ok(());
    };
    match crate::store::executorset::target_set(&env.client, name, &env.app.app_id)
        .map_err(store_error)?
    {
        Some(n) if n != u64::from(m) => Err(Error::usage(format!(
            "--target {m} conflicts with the target of ExecutorSet {name}, {n} (its \
             spec.replicas, clamped): change that target with `podalloc scale {m}` (or \
             `kubectl scale executorset {name} --replicas {m}`), or leave --force-target out"
        ))),
        _ => Ok(()),
    }
}
