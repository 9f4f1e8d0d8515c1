//! The runner: one loop over 1..N apps, until stopped, converged or timed out. `run` is the
//! runner with one app; `apps` is the same runner with the apps of an apps file or of
//! discovery.
//!
//! Each app is a [`Slot`]: its store, held for the runner's whole life (the file lock; the
//! ConfigMap's or ExecutorSet's holder record, written by its first claim, the pings it finds
//! answered by its claims and its intent reads), and its own next tick:
//! every `--interval` while something is in flight, every `--idle-interval` at rest, never past
//! its plan's own deadline ([`TickReport::requeue_after_ms`]), at once when a steering request
//! is queued in its file store. A round ticks the apps that are due through the [`Feed`]
//! (`run`: its own list; `apps`: one list per namespace, split by app).
//!
//! After a failed tick, [`after_error`] decides whether the app retries at its next tick or
//! ends ([`Feed::finish`]: `run` stops with the error, `apps` drops that app), as
//! kube-runtime's controller asks its `error_policy`. SIGINT and SIGTERM ([`Shutdown`]) are
//! checked between ticks: the tick in progress finishes and saves, then the runner gives up
//! its holder records and exits 0. A tick that has written nothing yet and is still running
//! [`FRESH_GRACE`] after the signal (a list stalled by the API server) ends the process at
//! once, exit 0, its holder records and its Lease released. A second signal aborts at once (exit [`ABORT_EXIT`]), and a tick still running a
//! second after `--timeout` is aborted with exit 5, whatever the API server does. The
//! handlers are installed before the command's first request: a signal while it is still
//! starting (connecting, finding the app's home and its Lease, which retries against a
//! server that is down) ends the process at once, exit 0, nothing claimed or saved.

use crate::controller::context::LogContext;
use crate::controller::leader::LeaderElection;
use crate::controller::serve::Probe;
use crate::controller::services::Services;
use crate::controller::tick::{App, Memory, TickReport};
use crate::engine::alloc::Request;
use crate::error::{Error, ExitCode, Result};
use crate::store::file::{store_error, StateStore, StoreError};
use crate::sync::lock;
use log::{debug, info, warn};
use signal_hook::consts::{SIGINT, SIGTERM};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// How often a `--leader-elect` standby asks whether it leads now.
pub(crate) const STANDBY_POLL: Duration = Duration::from_millis(100);

/// The exit code after a second SIGINT/SIGTERM: 128 + SIGINT, as a shell reports a process
/// killed by Ctrl-C.
pub(crate) const ABORT_EXIT: i32 = 130;

/// How long a tick may run past `--timeout` before [`Control::poll`] aborts the process.
const DEADLINE_GRACE: Duration = Duration::from_secs(1);

/// How often the wait between ticks looks at a signal, the deadline and the request queues.
const WAIT_POLL: Duration = Duration::from_millis(50);

/// How long after a signal a tick that has written nothing is left to finish before
/// [`Control::poll`] stops the process at once: a tick whose list answers in time ends the loop the
/// ordinary way (its line logged, its holder records given up by the loop).
const FRESH_GRACE: Duration = Duration::from_millis(200);

/// What the loop does after a failed tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Log it and try again at the app's next tick.
    Retry,
    /// End the app ([`Feed::finish`]) with this error.
    Stop,
}

/// The loop's error policy: a runtime failure (exit 1: the API server or the file system; the
/// next tick may succeed) and a state held by another run (exit 3) are retried; usage errors,
/// permanent refusals, an ended driver (exit 7) and the crash-loop guard end the app, since
/// another tick would fail the same way.
pub(crate) fn after_error(e: &Error) -> Flow {
    match e.code {
        ExitCode::Runtime | ExitCode::Locked => Flow::Retry,
        _ => Flow::Stop,
    }
}

/// Where the runner is in a round, for [`Control::poll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before the runner's first round: the command connects, finds the app's home and
    /// opens its store. Nothing is claimed or saved yet and no Lease attempt is made, so a
    /// signal ends the process at once ([`Control::started`] ends this phase).
    Starting,
    /// Between rounds: the loop itself sees a signal within [`WAIT_POLL`].
    Idle,
    /// In a tick that has written nothing yet (listing, reading the state): a signal may
    /// end the process at once.
    Fresh,
    /// The tick in progress has saved the state or sent a write: it must finish.
    Writing,
}

/// What the loop, its hook between requests ([`Control::between`]) and the write fences
/// share: the signals, the phase of the tick in progress, the leader election (or `apps`'
/// claim), the endpoints and `--timeout`. One thread uses it (the loop, and the hook it runs
/// inside its requests); the locks are for the one helper a gzip list read may run
/// (`kube/client.rs` `read_ahead`), whose reads run the hook too.
pub(crate) struct Control {
    signal: AtomicBool,
    /// When the first signal came.
    signal_at: Mutex<Option<Instant>>,
    phase: Mutex<Phase>,
    leader: Mutex<Option<LeaderElection>>,
    /// What a stop at once gives up besides the Lease ([`Control::on_stop`]).
    on_stop: Mutex<Vec<StopHook>>,
    /// SIGINT and SIGTERM as they come, one byte each, read without blocking.
    signals: Deliveries,
    /// `--timeout`'s deadline ([`Control::set_deadline`]: known once the command has
    /// started).
    deadline: Mutex<Option<Instant>>,
    /// The endpoints, answered while the loop waits.
    probe: OnceLock<Probe>,
    /// Set while [`Control::poll`]'s own work runs: a poll re-entered from a request it
    /// makes (a Lease renewal, a release) only reads the signals and the deadline.
    polling: AtomicBool,
    /// The logs' app and namespace: the lines about signals are the process's.
    log: LogContext,
    /// Run before the process exits without unwinding ([`Control::exit`]): what kills a
    /// running exec credential plugin.
    on_exit: Mutex<Vec<ExitHook>>,
}

/// Something a process exit skipping `Drop` must still do ([`Control::on_exit`]).
pub(crate) type ExitHook = Box<dyn Fn() + Send + Sync>;

/// A release made when the process stops at once (a ConfigMap holder record).
pub(crate) type StopHook = Box<dyn FnOnce() + Send>;

impl Control {
    /// A signal has arrived.
    pub(crate) fn requested(&self) -> bool {
        self.signal.load(Ordering::Relaxed)
    }

    /// Runs `f` on the election, if any (`None`: no `--leader-elect` and no claim).
    pub(crate) fn with_leader<T>(&self, f: impl FnOnce(Option<&LeaderElection>) -> T) -> T {
        f(lock(&self.leader).as_ref())
    }

    /// Installs the election (call before any tick; the fences ask it from then on), and
    /// has the endpoints' `/metrics` follow it ([`Control::follow_leadership`]). The one it
    /// replaces is stopped (its Lease released) outside the lock.
    pub(crate) fn set_leader(&self, le: Option<LeaderElection>) {
        let old = std::mem::replace(&mut *lock(&self.leader), le);
        drop(old);
        self.follow_leadership();
    }

    /// Has `/metrics` answer with the installed election's leadership of the moment
    /// ([`Probe::follow_leadership`]), once both the endpoints and the election are there.
    /// With none installed (the election ended with the loop) `/metrics` keeps asking the
    /// last one, which says not leading once its Lease is released.
    fn follow_leadership(&self) {
        let live = lock(&self.leader).as_ref().map(LeaderElection::live);
        if let (Some(p), Some(live)) = (self.probe.get(), live) {
            p.follow_leadership(live);
        }
    }

    /// Adds `hook` to what runs before the process exits at once ([`Control::exit`]).
    pub(crate) fn on_exit(&self, hook: ExitHook) {
        lock(&self.on_exit).push(hook);
    }

    /// Ends the process now with `code` (no unwinding, so no `Drop`): first runs the
    /// [`Control::on_exit`] hooks, so that no exec plugin outlives the process.
    fn exit(&self, code: i32) -> ! {
        for hook in lock(&self.on_exit).iter() {
            hook();
        }
        std::process::exit(code)
    }

    /// Adds `hook` to what a stop at once releases.
    pub(crate) fn on_stop(&self, hook: StopHook) {
        lock(&self.on_stop).push(hook);
    }

    /// The endpoints the loop answers while it waits (once; a second call is ignored); their
    /// `/metrics` follows the election once both are there.
    pub(crate) fn set_probe(&self, probe: Option<&Probe>) {
        if let Some(p) = probe {
            let _ = self.probe.set(p.clone());
            self.follow_leadership();
        }
    }

    /// Makes [`Control::between`] the hook of `client` (and of the clients derived from it
    /// or sharing its connection): between its requests, in its back-offs and while a
    /// request waits, the loop sees its signals, renews its Lease and answers its
    /// endpoints; a request of a tick is cut once this process no longer leads.
    pub(crate) fn serve_between_requests(self: &Arc<Self>, client: &crate::kube::KubeClient) {
        client.set_between_requests(self.waiter());
    }

    /// [`Control::between`] as a hook (holding no count on `self`: the Lease client that
    /// keeps it is owned by `self`).
    pub(crate) fn waiter(self: &Arc<Self>) -> crate::kube::Between {
        let me = Arc::downgrade(self);
        Arc::new(move |d| me.upgrade().is_none_or(|c| c.between(d)))
    }

    fn set_phase(&self, p: Phase) {
        *lock(&self.phase) = p;
    }

    /// `--timeout`'s deadline, from now on.
    pub(crate) fn set_deadline(&self, deadline: Option<Instant>) {
        *lock(&self.deadline) = deadline;
    }

    /// The command has started (its home found, its store opened): a signal that came
    /// meanwhile still ends the process at once, then signals are answered as the loop's
    /// and the Lease attempts begin. Called by [`run`] before its first round.
    fn started(&self) {
        for name in self.signals.pending() {
            on_signal(self, name);
        }
        self.set_phase(Phase::Idle);
    }

    /// What the process finishes after a first signal, for its line: the tick in progress,
    /// the Lease call in progress (a renewal or an acquisition between ticks, whose requests
    /// run [`Control::poll`] again), or nothing (the loop stops at its next look, within
    /// [`WAIT_POLL`]).
    fn finishing(&self) -> &'static str {
        match *lock(&self.phase) {
            Phase::Fresh | Phase::Writing => {
                "finishing the current tick, SIGINT or SIGTERM again to abort"
            }
            _ if self.polling.load(Ordering::SeqCst) => {
                "finishing the Lease call in progress, SIGINT or SIGTERM again to abort"
            }
            _ => "no tick or Lease call in progress: stopping now",
        }
    }

    /// A write is about to be made: from now on the tick in progress must finish.
    fn writing(&self) {
        let mut p = lock(&self.phase);
        if *p == Phase::Fresh {
            *p = Phase::Writing;
        }
    }

    /// The write fence of every client the runner ticks with: marks the tick as writing,
    /// then asks the election (as [`LeaderElection::fence`] would: no write once not
    /// leading). Install it before the election starts (a client keeps its first fence).
    pub(crate) fn fence(self: &Arc<Self>, client: &crate::kube::KubeClient) {
        let s = Arc::clone(self);
        client.set_write_fence(Arc::new(move || {
            s.writing();
            s.with_leader(|le| le.is_none_or(LeaderElection::is_leader))
        }));
    }

    /// Waits `d` (zero: not at all), polling ([`Control::poll`]) at least every
    /// [`WAIT_POLL`] and answering the endpoints meanwhile. Returns false when a tick is in
    /// progress under an election this process no longer leads: the request that asked is
    /// cut ([`crate::kube::KubeClient::set_between_requests`]).
    pub(crate) fn between(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        loop {
            self.poll();
            let left = end.saturating_duration_since(Instant::now());
            match self.probe.get() {
                Some(p) => p.nap(left.min(WAIT_POLL)),
                None => std::thread::sleep(left.min(WAIT_POLL)),
            }
            if end <= Instant::now() {
                break;
            }
        }
        let ticking = matches!(*lock(&self.phase), Phase::Fresh | Phase::Writing);
        !ticking
            || self
                .leader
                .try_lock()
                .map_or(true, |le| le.as_ref().is_none_or(LeaderElection::is_leader))
    }

    /// Reads the signals (the first is
    /// acknowledged, a second aborts at once: exit [`ABORT_EXIT`]), aborts a tick still
    /// running [`DEADLINE_GRACE`] after `--timeout` (exit 5), stops at once a tick that has
    /// written nothing [`FRESH_GRACE`] after the first signal (exit 0, its holder records
    /// and Lease released), and renews or acquires the Lease when due
    /// ([`LeaderElection::tick`]). Called by the loop's wait and by the hook of every request
    /// (between two, and every slice of a wait for an answer).
    pub(crate) fn poll(&self) {
        for name in self.signals.pending() {
            on_signal(self, name);
        }
        if lock(&self.deadline).is_some_and(|d| Instant::now() >= d + DEADLINE_GRACE) {
            self.log.process_lines(|| {
                warn!(
                    "--timeout passed and the tick in progress has not ended within {}s: \
                     aborting (exit 5); the state was saved before the API call in progress",
                    DEADLINE_GRACE.as_secs()
                )
            });
            self.exit(ExitCode::Timeout as i32);
        }
        if self.polling.swap(true, Ordering::SeqCst) {
            return;
        }
        let since = *lock(&self.signal_at);
        if since.is_some_and(|at| at.elapsed() >= FRESH_GRACE) {
            self.stop_if_fresh();
        }
        // No Lease attempt while starting: a stop at once then leaves no Lease behind.
        let starting = *lock(&self.phase) == Phase::Starting;
        if let (false, Ok(le)) = (starting, self.leader.try_lock()) {
            le.as_ref().inspect(|le| le.tick());
        }
        self.polling.store(false, Ordering::SeqCst);
    }

    /// After a signal: when the tick in progress has written nothing, ends the process now
    /// (exit 0), the holder records and the Lease released.
    fn stop_if_fresh(&self) {
        if *lock(&self.phase) != Phase::Fresh {
            return;
        }
        // Held by this thread's caller (a fence's question): the next poll stops.
        let Ok(mut leader) = self.leader.try_lock() else {
            return;
        };
        self.log.process_lines(|| {
            info!(
                "signal received: stopping now (exit 0): the tick in progress has written \
                 nothing (its API call is still waiting); the state is as the last tick saved it"
            )
        });
        let hooks: Vec<StopHook> = lock(&self.on_stop).drain(..).collect();
        hooks.into_iter().for_each(|release| release());
        drop(leader.take());
        self.exit(0);
    }
}

/// SIGINT/SIGTERM as a flag the loop checks between ticks, read by [`Control::poll`].
///
/// The first signal is acknowledged in the log (the command's app and namespace, as every
/// line about the process); the process ends itself (without waiting for
/// the request in progress, cut by the hook of its waits) when the tick in progress has
/// still written nothing [`FRESH_GRACE`] after it (exit 0), on a second signal (exit
/// [`ABORT_EXIT`]) or when a tick is still running [`DEADLINE_GRACE`] after `--timeout`
/// (exit 5). Exiting at any point leaves the state consistent by construction: a tick saves
/// the state (write-ahead, an atomic rename) before every API call, so the next run reads
/// either the state before the call or after it and, from the pods it lists, settles
/// whether an unacknowledged create happened; the file lock is released by the kernel when
/// the process ends. A wait the hook does not run in (a TCP connect) is
/// bounded by its own timeout (`--connect-timeout`), after which the signal is seen.
pub(crate) struct Shutdown(pub(crate) Arc<Control>);

impl Shutdown {
    /// Installs the handlers (no thread: the signals are read by [`Control::poll`]); `log`:
    /// the logs' context, for the lines about signals. Install them before the command's
    /// first request: until the runner's first round ([`Phase::Starting`]) a signal ends
    /// the process at once, exit 0, its requests' waits running the hook of
    /// [`Control::serve_between_requests`]. Errors (exit 1): the handlers cannot be
    /// installed.
    pub(crate) fn install(log: LogContext) -> Result<Shutdown> {
        let signals = Deliveries::install()
            .map_err(|e| Error::runtime(format!("cannot install the signal handler: {e}")))?;
        Ok(Shutdown(Arc::new(Control {
            signal: AtomicBool::new(false),
            signal_at: Mutex::new(None),
            phase: Mutex::new(Phase::Starting),
            leader: Mutex::new(None),
            on_stop: Mutex::new(Vec::new()),
            signals,
            deadline: Mutex::new(None),
            probe: OnceLock::new(),
            polling: AtomicBool::new(false),
            log,
            on_exit: Mutex::new(Vec::new()),
        })))
    }
}

/// SIGINT and SIGTERM as they are delivered: signal-hook's handler writes one byte per
/// delivery into a socket of its own for each signal, read without blocking by
/// [`Control::poll`]. Not signal-hook's `Signals`, which reports a signal once however many
/// times it came between two reads: a second Ctrl-C within the same 50 ms slice as the
/// first was lost, and the process went on finishing its tick.
struct Deliveries {
    /// The read ends, SIGINT's then SIGTERM's, with their names.
    reads: [(UnixStream, &'static str); 2],
    /// The handlers, removed when the runner ends.
    ids: [signal_hook::SigId; 2],
}

impl Deliveries {
    fn install() -> std::io::Result<Deliveries> {
        let one = |sig: i32, name: &'static str| {
            let (read, write) = UnixStream::pair()?;
            read.set_nonblocking(true)?;
            let id = signal_hook::low_level::pipe::register(sig, write)?;
            Ok::<_, std::io::Error>(((read, name), id))
        };
        let (int, int_id) = one(SIGINT, "SIGINT")?;
        let (term, term_id) = match one(SIGTERM, "SIGTERM") {
            Ok(t) => t,
            Err(e) => {
                signal_hook::low_level::unregister(int_id);
                return Err(e);
            }
        };
        Ok(Deliveries {
            reads: [int, term],
            ids: [int_id, term_id],
        })
    }

    /// The signals delivered since the last call, one name per delivery.
    fn pending(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut buf = [0u8; 64];
        for (read, name) in &self.reads {
            while let Ok(n @ 1..) = (&*read).read(&mut buf) {
                out.extend(std::iter::repeat_n(*name, n));
            }
        }
        out
    }
}

impl Drop for Deliveries {
    fn drop(&mut self) {
        self.ids.iter().for_each(|&id| {
            signal_hook::low_level::unregister(id);
        });
    }
}

/// The answer to signal `name`: the first is acknowledged, saying what the process
/// finishes ([`Control::finishing`]), or, while the command is starting, ends the process
/// (exit 0); the second aborts. Logged with the command's app
/// and namespace ([`LogContext::process_lines`]); the stop and the abort exit right after
/// their line.
fn on_signal(shared: &Control, name: &str) {
    if *lock(&shared.phase) == Phase::Starting {
        shared.log.process_lines(|| {
            info!(
                "{name} received while starting (before the first tick: connecting, finding \
                 the app's home): stopping now (exit 0); nothing was claimed or saved"
            )
        });
        shared.exit(0);
    }
    if shared.signal.swap(true, Ordering::SeqCst) {
        shared.log.process_lines(|| {
            warn!(
                "second signal ({name}): aborting now (exit {ABORT_EXIT}); the state was saved \
                 before the API call in progress"
            )
        });
        shared.exit(ABORT_EXIT);
    }
    *lock(&shared.signal_at) = Some(Instant::now());
    let what = shared.finishing();
    shared
        .log
        .process_lines(|| info!("{name} received: {what}"));
}

/// What one tick of an app found.
#[derive(Debug, Clone, Copy)]
struct TickDone {
    /// The app has converged.
    converged: bool,
    /// Something is in flight: not converged, a failed call, or requests still queued.
    busy: bool,
    /// When the plan wants the next tick at the latest ([`TickReport::requeue_after_ms`]).
    requeue: Option<Duration>,
}

/// One app of the runner: what it ticks with, and when it ticks next.
pub(crate) struct Slot<'c> {
    /// The app (settings, template, driver pod).
    pub(crate) app: App,
    /// Its namespace.
    pub(crate) ns: String,
    /// Its store, held for the runner's life, behind the phase watch.
    store: Watched<'c>,
    /// The request of the next tick until a tick has saved it (`run --target`, an apps-file
    /// target, a changed driver annotation); then the store's own target and queue rule.
    pub(crate) first: Option<Request>,
    /// `apps --discover`: the driver's uid.
    pub(crate) driver_uid: Option<String>,
    /// `apps --discover`: the driver is gone; the app ticks until the step has ended it.
    pub(crate) ending: bool,
    /// The prefix of the runner's own log lines about this app (`""` for `run`, `"app ID: "`
    /// for `apps`).
    pub(crate) label: String,
    next: Instant,
    /// When its home's intent was last read ([`StateStore::intent_changed`]) or ticked.
    intent_read: Instant,
    mark: Option<SystemTime>,
    done: Option<TickDone>,
    ticks: u64,
    /// Ticks in a row that failed before acting ([`failed_tick_backoff`]).
    failed_in_row: u32,
    log: TickLog,
    /// Waiting as a standby since its last tick (another loop owns its store).
    standby: bool,
    /// What its ticks remember between them ([`Memory`]).
    memory: Memory,
}

impl<'c> Slot<'c> {
    /// A slot for `app` in `ns` with its opened `store`, due at once; `every` is the
    /// summary line's heartbeat (`--log-every`).
    pub(crate) fn new(
        app: App,
        ns: &str,
        store: Box<dyn StateStore + 'c>,
        shared: &Arc<Control>,
        every: Duration,
    ) -> Slot<'c> {
        Slot {
            app,
            ns: ns.to_string(),
            store: Watched {
                inner: store,
                shared: Arc::clone(shared),
            },
            first: None,
            driver_uid: None,
            ending: false,
            label: String::new(),
            next: Instant::now(),
            intent_read: Instant::now(),
            mark: None,
            done: None,
            ticks: 0,
            standby: false,
            memory: Memory::default(),
            failed_in_row: 0,
            log: TickLog {
                last: None,
                at: Instant::now(),
                every,
            },
        }
    }

    /// Whether its last tick found it converged.
    pub(crate) fn converged(&self) -> bool {
        self.done.is_some_and(|d| d.converged)
    }

    /// Makes it due at once (a changed annotation).
    pub(crate) fn wake(&mut self) {
        self.next = Instant::now();
        self.done = None;
    }

    /// Its store (to release it or read it).
    pub(crate) fn store(&mut self) -> &mut dyn StateStore {
        self.store.inner.as_mut()
    }

    /// Whether it is due at `now`: its time has come, or a request was queued since its last
    /// tick read the queue.
    fn due(&self, now: Instant) -> bool {
        now >= self.next || self.store.inner.queue_marker() != self.mark
    }

    /// One tick of the app through `f` (the feed's: `(app, store, memory, request) →
    /// report`), its store claimed first, its lines logged as the app's. `None`: a signal
    /// came first, nothing was done.
    pub(crate) fn tick(
        &mut self,
        shared: &Control,
        services: &Services,
        f: impl FnOnce(&App, &mut dyn StateStore, &mut Memory, &Request) -> Result<TickReport>,
    ) -> Option<Outcome> {
        if shared.requested() {
            return None;
        }
        services.log.set_app(Some((&self.app.app_id, &self.ns)));
        // Read before the tick lists the queue: a request queued from then on wakes it.
        self.mark = self.store.inner.queue_marker();
        self.intent_read = Instant::now();
        let res = match self.store.inner.claim() {
            Ok(()) => {
                shared.set_phase(Phase::Fresh);
                let keep = Request::default();
                let request = self.first.as_ref().unwrap_or(&keep);
                match f(&self.app, &mut self.store, &mut self.memory, request) {
                    Ok(report) => Outcome::Done(Box::new(report)),
                    Err(e) => Outcome::Failed(e),
                }
            }
            // Someone else owns the store now (another loop's holder record, answering its
            // pings): wait as a standby until the record is given up or a ping goes
            // unanswered.
            Err(StoreError::Owned(msg)) => Outcome::Standby(msg),
            Err(e) => Outcome::Failed(store_error(e)),
        };
        // The next app's tick (or the next round) has written nothing yet.
        shared.set_phase(Phase::Fresh);
        services.log.set_app(None);
        Some(res)
    }
}

/// What became of one app's tick.
pub(crate) enum Outcome {
    /// It ran (its report may carry an error made after the state was saved).
    Done(Box<TickReport>),
    /// It failed before saving: [`after_error`] decides.
    Failed(Error),
    /// Another loop owns the app's store (a holder record whose loop answers): nothing was done; the
    /// app waits as a standby and tries again at its next tick.
    Standby(String),
}

/// An app's store behind the phase watch: a save marks the tick in progress as writing.
struct Watched<'c> {
    inner: Box<dyn StateStore + 'c>,
    shared: Arc<Control>,
}

impl StateStore for Watched<'_> {
    fn save(
        &mut self,
        state: &crate::engine::alloc::AllocatorState,
    ) -> std::result::Result<(), StoreError> {
        self.shared.writing();
        self.inner.save(state)
    }
    fn consumed(&mut self, ids: &[String]) -> Vec<String> {
        self.shared.writing();
        self.inner.consumed(ids)
    }
    fn publish(&mut self) -> std::result::Result<(), StoreError> {
        self.shared.writing();
        self.inner.publish()
    }
    crate::store::file::forward_to_inner!(inner: describe, load, claim, release, requests,
        queue_marker, home_target, home_template, home_profiles, observe, intent_changed);
}

/// What feeds the runner: the apps, how a round ticks them, what an ended app means.
pub(crate) trait Feed<'c> {
    /// Whether this process may tick now: the leader gate (`--leader-elect`: only the
    /// holder of the Lease ticks; a standby looks again within [`STANDBY_POLL`]). Errors end
    /// the runner (`apps`' claim held by another live process: exit 3).
    fn may_act(&mut self, shared: &Control) -> Result<bool>;
    /// Brings the apps up to date before a round (`apps --discover`: new drivers become
    /// slots, changed annotations wake theirs, a gone driver's slot is marked ending).
    fn refresh(&mut self, _slots: &mut Vec<Slot<'c>>, _shared: &Arc<Control>) {}
    /// How often [`Feed::refresh`] needs a round even when no app is due (`None`: never).
    fn refresh_every(&self) -> Option<Duration> {
        None
    }
    /// Ticks the due slots (`due`: indices into `slots`, ascending) with [`Slot::tick`],
    /// returning each one's outcome (a slot left out did nothing: a signal came first).
    fn round(
        &mut self,
        slots: &mut [Slot<'c>],
        due: &[usize],
        shared: &Control,
    ) -> Vec<(usize, Outcome)>;
    /// After each tick that ran (`scale --wait`'s progress line).
    fn ticked(&mut self, _report: &TickReport) {}
    /// An app ends with `e` (its store still held; the runner releases it after): `Some`
    /// ends the runner with that error (`run`), `None` goes on without the app (`apps`).
    fn finish(&mut self, slot: &mut Slot<'c>, e: Error) -> Option<Error>;
    /// Whether every app has converged (`--until-converged`).
    fn all_converged(&self, slots: &[Slot<'c>]) -> bool {
        slots.iter().all(Slot::converged)
    }
    /// The runner's result once it stops without an error of its own (`apps`: the first
    /// failed app's error).
    fn outcome(&self) -> Result<()> {
        Ok(())
    }
}

/// The runner's timing and end conditions (from `run`'s or `apps`' flags).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options {
    /// `--interval`: between ticks while something is in flight, and after a failed tick.
    pub(crate) interval: Duration,
    /// `--idle-interval`: between ticks at rest.
    pub(crate) idle_interval: Duration,
    /// `--timeout`.
    pub(crate) timeout: Option<Duration>,
    /// `--until-converged`: stop (exit 0) once every app has converged; exit 5 at the
    /// deadline otherwise.
    pub(crate) until_converged: bool,
    /// `apps --once`: one round, then stop.
    pub(crate) once: bool,
    /// When the runner started (`--timeout` counts from it).
    pub(crate) started: Instant,
}

impl Options {
    fn deadline(&self) -> Option<Instant> {
        self.timeout.map(|t| self.started + t)
    }
}

/// Why the wait between rounds ended.
enum Wake {
    /// Time for the next round.
    Tick,
    /// SIGINT or SIGTERM.
    Signal,
    /// `--timeout` expired.
    Deadline,
}

/// Runs the loop over `slots` fed by `feed` until stopped, converged or timed out; every
/// app's store is released (its holder record given up) when it ends. Errors: the feed's
/// (an ended app under `run`, `apps`' claim), exit 5 for `--timeout` with
/// `--until-converged` or a tick cut by it.
pub(crate) fn run<'c>(
    o: &Options,
    mut slots: Vec<Slot<'c>>,
    feed: &mut dyn Feed<'c>,
    shutdown: &Shutdown,
    services: &Services,
) -> Result<()> {
    let shared = &shutdown.0;
    shared.started();
    let probe = services.probe.as_ref();
    let mut rounds = 0u64;
    let mut refreshed: Option<Instant> = None;
    let res = loop {
        // The election's attempt when due, before the loop asks whether it leads.
        shared.poll();
        let acting = match feed.may_act(shared) {
            Ok(a) => a,
            Err(e) => break Err(e),
        };
        if acting {
            // Nothing is written yet: the refresh and the round start with their lists.
            shared.set_phase(Phase::Fresh);
            let refresh = feed.refresh_every();
            let at = Instant::now();
            if refresh.is_some_and(|every| refreshed.is_none_or(|r| at >= r + every)) {
                feed.refresh(&mut slots, shared);
                refreshed = Some(at);
            }
            poll_intents(o, &mut slots, services);
            // After the refresh: the apps it found are due at once.
            let now = Instant::now();
            let due: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].due(now)).collect();
            if !due.is_empty() || o.once {
                rounds += 1;
                let outcomes = feed.round(&mut slots, &due, shared);
                if outcomes
                    .iter()
                    .any(|(_, out)| matches!(out, Outcome::Done(_)))
                {
                    probe.inspect(|p| p.pass_finished(Ok(())));
                }
                if let Err(e) = settle(o, (&mut slots, services), feed, outcomes) {
                    break Err(e);
                }
            }
            shared.set_phase(Phase::Idle);
            if o.once || (o.until_converged && feed.all_converged(&slots)) {
                if o.until_converged {
                    info!("{}", converged_line(&slots, rounds, o.started));
                }
                break feed.outcome();
            }
        }
        if !acting {
            // A standby has read the Lease: it is up and ready to take over.
            probe.inspect(|p| p.pass_finished(Ok(())));
        }
        probe.inspect(|p| p.alive());
        let next = next_wake(o, &slots, acting, refresh_at(feed, refreshed));
        match wait(next, o.deadline(), (shared, probe), &slots) {
            Wake::Tick => {}
            Wake::Signal => {
                let held = acting && slots.iter().any(|s| !s.standby && s.ticks > 0);
                let what = match held {
                    true => "; state saved",
                    false => ": a standby, it held nothing",
                };
                info!("signal received: stopping after {rounds} round(s) of ticks{what}");
                break Ok(());
            }
            Wake::Deadline if o.until_converged => break Err(not_converged(o, &slots, rounds)),
            Wake::Deadline => break feed.outcome(),
        }
    };
    probe.inspect(|p| p.stopping());
    for s in &mut slots {
        release(s);
    }
    res
}

/// Reads the intent of each app not yet due whose last read or tick is `--interval` old
/// (its home's cheap read, [`StateStore::intent_changed`]): a change makes it due at once, so
/// a `kubectl scale` reaches a loop at rest within about one interval while its pods are
/// still listed only every `--idle-interval`. A failed read is logged at debug level and made
/// again one interval later.
fn poll_intents(o: &Options, slots: &mut [Slot<'_>], services: &Services) {
    let now = Instant::now();
    for s in slots.iter_mut() {
        if now >= s.next || now < s.intent_read + o.interval.max(MIN_TICK_INTERVAL) {
            continue;
        }
        s.intent_read = now;
        services.log.set_app(Some((&s.app.app_id, &s.ns)));
        match s.store.inner.intent_changed() {
            Ok(true) => {
                debug!("{}its intent changed: ticking now", s.label);
                s.wake();
            }
            Ok(false) => {}
            Err(e) => debug!("{}intent not read: {e}", s.label),
        }
        services.log.set_app(None);
    }
}

/// When the feed next needs a refresh round.
fn refresh_at(feed: &dyn Feed<'_>, refreshed: Option<Instant>) -> Option<Instant> {
    let every = feed.refresh_every()?;
    Some(refreshed.map_or_else(Instant::now, |r| r + every))
}

/// The line logged when `--until-converged` is met.
fn converged_line(slots: &[Slot<'_>], rounds: u64, started: Instant) -> String {
    let secs = started.elapsed().as_secs_f64();
    match slots {
        [one] => format!("converged after {} tick(s) in {secs:.1}s", one.ticks),
        _ => format!(
            "{} app(s) converged after {rounds} round(s) in {secs:.1}s",
            slots.len()
        ),
    }
}

/// The error of `--until-converged` at the deadline (exit 5), naming the apps not converged.
fn not_converged(o: &Options, slots: &[Slot<'_>], rounds: u64) -> Error {
    let left: Vec<&str> = (slots.iter())
        .filter(|s| !s.converged())
        .map(|s| s.app.app_id.as_str())
        .collect();
    let ticks = match slots {
        [one] => format!("{} ticks", one.ticks),
        _ => format!("{rounds} rounds; not converged: {}", left.join(", ")),
    };
    Error::timeout(format!(
        "not converged after {} ({ticks}); raise --timeout or check `podalloc status`",
        humantime::format_duration(o.timeout.unwrap_or_default())
    ))
}

/// Gives up an app's ownership (the ConfigMap store's holder record, so that a loop started
/// right after is not refused).
fn release(s: &mut Slot<'_>) {
    if s.standby {
        // Another loop owns the store: there is nothing of ours to give up.
        return;
    }
    if let Err(e) = s.store().release() {
        warn!("{}could not give up the app's holder record: {e}", s.label);
    }
}

/// Applies a round's outcomes: logs, the next tick of each app, the error policy; an app
/// that ends leaves `slots`. Errors: the feed's error for an ended app; exit 5 for a tick
/// that failed at the deadline.
fn settle<'c>(
    o: &Options,
    (slots, services): (&mut Vec<Slot<'c>>, &Services),
    feed: &mut dyn Feed<'c>,
    outcomes: Vec<(usize, Outcome)>,
) -> Result<()> {
    let mut ended = Vec::new();
    for (i, outcome) in outcomes {
        let s = &mut slots[i];
        // The tick line and the warnings below are about this app (JSON: `app`, `namespace`).
        services.log.set_app(Some((&s.app.app_id, &s.ns)));
        let failed = match outcome {
            Outcome::Done(report) => {
                s.ticks += 1;
                s.failed_in_row = failed_in_row_after(&report, s.failed_in_row);
                s.first = None;
                if std::mem::take(&mut s.standby) {
                    info!("{}the app's store is free: taking over", s.label);
                }
                s.log.log(s.ticks, &report);
                feed.ticked(&report);
                s.done = Some(TickDone {
                    busy: !report.converged() || report.pending_requests > 0,
                    // Requests still queued (one step takes a seed alone) are part of
                    // the target: not converged until they are applied.
                    converged: report.converged() && report.pending_requests == 0,
                    requeue: report.requeue_after_ms.map(Duration::from_millis),
                });
                // A refused create backs creation off: the loop goes on at the back-off's pace.
                let backing_off = report.backing_off;
                report.error.map(|mut e| {
                    if backing_off && e.code == ExitCode::Refused {
                        e.code = ExitCode::Runtime;
                    }
                    e
                })
            }
            Outcome::Failed(e) => {
                s.ticks += 1;
                s.failed_in_row = s.failed_in_row.saturating_add(1);
                s.done = None;
                if o.deadline().is_some_and(|d| Instant::now() >= d) {
                    return Err(Error::timeout(format!(
                        "--timeout of {} passed during {}tick {}, which did not finish",
                        humantime::format_duration(o.timeout.unwrap_or_default()),
                        s.label,
                        s.ticks
                    )));
                }
                Some(e)
            }
            Outcome::Standby(why) => {
                s.done = None;
                if !std::mem::replace(&mut s.standby, true) {
                    let why = why.split("; this command").next().unwrap_or(&why);
                    info!("{}waiting as a standby: {why}", s.label);
                }
                None
            }
        };
        let wait = next_tick(s.done.as_ref(), o.interval, o.idle_interval)
            .max(failed_tick_backoff(s.failed_in_row));
        s.next = Instant::now() + wait;
        match failed {
            Some(e) if after_error(&e) == Flow::Stop => ended.push((i, e)),
            Some(e) if e.code == ExitCode::Locked => warn!("{}tick {}: {e}", s.label, s.ticks),
            Some(e) if s.failed_in_row > 1 => warn!(
                "{}tick {}: {e}; {} failed ticks in a row, next try in {}",
                s.label,
                s.ticks,
                s.failed_in_row,
                humantime::format_duration(wait)
            ),
            Some(e) => warn!("{}tick {}: {e}; retrying next tick", s.label, s.ticks),
            None => {}
        }
        services.log.set_app(None);
    }
    // Highest index first, so the others keep theirs.
    for (i, e) in ended.into_iter().rev() {
        let mut s = slots.remove(i);
        services.log.set_app(Some((&s.app.app_id, &s.ns)));
        let stop = feed.finish(&mut s, e);
        release(&mut s);
        services.log.set_app(None);
        if let Some(e) = stop {
            return Err(e);
        }
    }
    Ok(())
}

/// Failed ticks in a row after a tick that ran to its end: a tick that acted, or had no
/// error, is a success (0); one whose calls all failed (a webhook answering 500 to every
/// create) adds one, so it backs off as a tick that failed before acting does
/// ([`failed_tick_backoff`]), not every `--interval`.
fn failed_in_row_after(report: &TickReport, before: u32) -> u32 {
    let achieved = report.created > 0 || report.deleted > 0 || report.backing_off;
    match (&report.error, achieved) {
        (Some(_), false) => before.saturating_add(1),
        _ => 0,
    }
}

/// The Job controller's back-off for failing syncs (`DefaultJobApiBackOff` 1 s, doubling,
/// `MaxJobApiBackOff` 60 s).
pub(crate) const FAILED_TICK_BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The cap of [`failed_tick_backoff`].
pub(crate) const FAILED_TICK_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// The least wait after `failed` ticks in a row failed before acting (an expired token, an
/// API server that is down) or failed in every call they made (creates answered 500): none
/// after a success, then 1 s, 2 s, 4 s … at most 60 s, as
/// the Job controller backs off a failing sync, so a loop does not repeat a failing list
/// every `--interval`.
pub(crate) fn failed_tick_backoff(failed: u32) -> Duration {
    match failed {
        0 => Duration::ZERO,
        n => FAILED_TICK_BACKOFF_MIN
            .saturating_mul(1u32 << (n - 1).min(16))
            .min(FAILED_TICK_BACKOFF_MAX),
    }
}

/// How long an app waits before its next tick: after a failed tick, the fast interval; else
/// what the plan says ([`crate::engine::alloc::next_tick_ms`]: the fast interval while something is
/// in flight, the idle interval at rest, never past the plan's own deadline).
fn next_tick(done: Option<&TickDone>, fast: Duration, idle: Duration) -> Duration {
    let ms = |d: Duration| d.as_millis() as u64;
    let wait = match done {
        None => fast,
        Some(d) => Duration::from_millis(crate::engine::alloc::next_tick_ms(
            d.requeue.map(ms),
            d.busy,
            ms(fast),
            ms(idle),
        )),
    };
    wait.max(MIN_TICK_INTERVAL)
}

/// The floor of the time between two ticks of one app, whatever `--interval`,
/// `--idle-interval`, `--batch-delay` or a plan's deadline say: `--interval 0s
/// --idle-interval 0s` once sent 5,000 requests in 3 s; with the floor an app lists at most
/// 20 times a second.
pub(crate) const MIN_TICK_INTERVAL: Duration = Duration::from_millis(50);

/// When the next round starts: a standby looks again soon; else the earliest app's next
/// tick, or the feed's next refresh; with neither, one interval from now.
fn next_wake(o: &Options, slots: &[Slot<'_>], acting: bool, refresh: Option<Instant>) -> Instant {
    let now = Instant::now();
    if !acting {
        return now + o.interval.min(STANDBY_POLL).max(MIN_TICK_INTERVAL);
    }
    let every = o.interval.max(MIN_TICK_INTERVAL);
    let reads = slots.iter().map(|s| s.intent_read + every);
    let earliest = slots
        .iter()
        .map(|s| s.next)
        .chain(reads)
        .chain(refresh)
        .min();
    earliest.unwrap_or(now + every)
}

/// Waits until `next`, answering the endpoints meanwhile (`probe`: [`Probe::wait`], a
/// `poll(2)` on their sockets), waking at least every [`WAIT_POLL`] to poll
/// ([`Control::poll`]: the signals, the Lease), then to check for a signal, the deadline
/// and a steering request queued for one of `slots` (the file store's queue
/// directory changed, a `stat`), in that order, and once before waiting at all.
fn wait(
    next: Instant,
    deadline: Option<Instant>,
    (shared, probe): (&Control, Option<&Probe>),
    slots: &[Slot<'_>],
) -> Wake {
    loop {
        shared.poll();
        if shared.requested() {
            return Wake::Signal;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Wake::Deadline;
        }
        let queued = || slots.iter().any(|s| s.store.inner.queue_marker() != s.mark);
        if now >= next || queued() {
            return Wake::Tick;
        }
        let nap = (next - now).min(WAIT_POLL);
        match probe {
            Some(p) => p.wait(nap),
            None => std::thread::sleep(nap),
        }
    }
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
            running = s.counts.running,
            pending = s.counts.pending,
            unacknowledged = report.unacknowledged,
            created = report.created,
            deleted = report.deleted,
            failed = s.counts.failed;
            "tick {ticks}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_and_locked_errors_are_retried_the_rest_stop_the_app() {
        assert_eq!(after_error(&Error::runtime("api 503")), Flow::Retry);
        assert_eq!(after_error(&Error::locked("held")), Flow::Retry);
        for e in [
            Error::usage("bad flag"),
            Error::refused("403"),
            Error::crash_loop("guard"),
            Error::timeout("late"),
            Error::driver_ended("gone"),
        ] {
            assert_eq!(after_error(&e), Flow::Stop, "{e}");
        }
    }

    #[test]
    fn no_interval_ticks_faster_than_the_floor() {
        assert_eq!(
            next_tick(None, Duration::ZERO, Duration::ZERO),
            MIN_TICK_INTERVAL
        );
        let now = TickDone {
            busy: true,
            converged: false,
            requeue: Some(Duration::from_millis(1)),
        };
        assert_eq!(
            next_tick(Some(&now), Duration::ZERO, Duration::ZERO),
            MIN_TICK_INTERVAL
        );
    }

    #[test]
    fn failing_ticks_back_off_from_one_second_to_a_minute() {
        let s = |n| failed_tick_backoff(n).as_secs();
        assert_eq!(
            (0..9).map(s).collect::<Vec<_>>(),
            [0, 1, 2, 4, 8, 16, 32, 60, 60]
        );
        assert_eq!(s(u32::MAX), 60);
    }

    #[test]
    fn an_app_ticks_fast_in_flight_idle_at_rest_and_never_past_its_plan() {
        let (fast, idle) = (Duration::from_millis(100), Duration::from_secs(30));
        assert_eq!(next_tick(None, fast, idle), fast);
        let at_rest = TickDone {
            converged: true,
            busy: false,
            requeue: None,
        };
        assert_eq!(next_tick(Some(&at_rest), fast, idle), idle);
        let soon = TickDone {
            requeue: Some(Duration::from_secs(2)),
            ..at_rest
        };
        assert_eq!(next_tick(Some(&soon), fast, idle), Duration::from_secs(2));
        let busy = TickDone {
            converged: false,
            busy: true,
            requeue: None,
        };
        assert_eq!(next_tick(Some(&busy), fast, idle), fast);
    }
}
