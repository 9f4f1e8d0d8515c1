//! The commands: glue between the parsed command line, the kube client, the state store and
//! the tick. Each returns `Ok(())` or an [`Error`] carrying its exit code.

mod plan;

use crate::alloc::{self, AllocatorState, Request};
use crate::cli::StateStoreKind;
use crate::cli::{
    AddArgs, Cli, Command, ConnArgs, Output, ReconcileArgs, RemoveArgs, RunArgs, ScaleArgs,
    SimArgs, StatusArgs,
};
use crate::cmstore::ConfigMapStore;
use crate::error::{Error, Result};
use crate::kube::{self, ConnectionFlags, KubeClient};
use crate::podspec::PodTemplate;
use crate::reconcile::{self, App, TargetChange, TickReport};
#[cfg(feature = "sim")]
use crate::sim::{SimOptions, SimServer};
use crate::snapshot::ExecutorState;
use crate::state::{self, LockedStore, StoreError};
use crate::state::{store_error, StateStore};
use log::{info, warn};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Runs the parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match &cli.command {
        Command::Plan(a) => plan::plan(&cli.app, a),
        Command::Sim(a) => sim(a),
        Command::Reconcile(a) => reconcile_cmd(&cli, a),
        Command::Run(a) => run_loop(&cli, a),
        Command::Status(a) => status(&cli, a),
        Command::Completions(a) => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(a.shell, &mut cmd, "podalloc", &mut std::io::stdout());
            Ok(())
        }
        Command::Man => match render_man(&mut std::io::stdout()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(Error::runtime(format!("writing the man page: {e}")))
            }
            _ => Ok(()),
        },
        Command::Scale(a) if a.wait => scale_wait(&cli, a),
        Command::Scale(a) => change(
            &cli,
            TargetChange {
                set: Some(a.target),
                ..Default::default()
            },
            a,
        ),
        Command::Add(a) => change(
            &cli,
            TargetChange {
                add: a.count,
                ..Default::default()
            },
            a,
        ),
        Command::Remove(a) => change(
            &cli,
            TargetChange {
                remove: a.ids.clone(),
                ..Default::default()
            },
            a,
        ),
    }
}

/// The man page: the main page, then each command's synopsis, description and options
/// (those not shared with the main page), so one page holds the whole manual.
fn render_man(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let cmd = <Cli as clap::CommandFactory>::command();
    let globals: std::collections::BTreeSet<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    clap_mangen::Man::new(cmd.clone()).render(out)?;
    for sub in cmd.get_subcommands() {
        let name = sub.get_name().to_string();
        let own: Vec<clap::Arg> = sub
            .get_arguments()
            .filter(|a| !a.get_long().is_some_and(|l| globals.contains(l)))
            .cloned()
            .collect();
        let title: &'static str = Box::leak(format!("podalloc {name}").into_boxed_str());
        let mut page = clap::Command::new(title)
            .about(sub.get_about().cloned().unwrap_or_default())
            .disable_help_flag(true);
        if let Some(long) = sub.get_long_about() {
            page = page.long_about(long.clone());
        }
        for a in own {
            page = page.arg(a);
        }
        writeln!(out, ".SH \"COMMAND: {}\"", name.to_uppercase())?;
        let man = clap_mangen::Man::new(page);
        let mut buf: Vec<u8> = Vec::new();
        man.render_synopsis_section(&mut buf)?;
        man.render_description_section(&mut buf)?;
        man.render_options_section(&mut buf)?;
        // Sub-headings under the command's heading.
        let text = String::from_utf8_lossy(&buf).replace(".SH ", ".SS ");
        out.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// Wall clock, ms since the Unix epoch (the only clock reading of a tick).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Reads `--template` (JSON or YAML) and/or `--image` into a validated template.
pub fn load_template(template: Option<&Path>, image: Option<&str>) -> Result<Option<PodTemplate>> {
    match (template, image) {
        (None, None) => Ok(None),
        (None, Some(image)) => PodTemplate::from_image(image)
            .map(Some)
            .map_err(|e| Error::usage(e.0)),
        (Some(path), image) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Error::usage(format!(
                    "cannot read the pod template {}: {e}",
                    path.display()
                ))
            })?;
            let value = parse_yaml_or_json(&text).map_err(|e| {
                Error::usage(format!(
                    "pod template {} is not valid JSON or YAML: {e}",
                    path.display()
                ))
            })?;
            PodTemplate::from_value(value, image)
                .map(Some)
                .map_err(|e| Error::usage(format!("pod template {}: {e}", path.display())))
        }
    }
}

/// Parses pod template text: JSON when it starts like JSON, else YAML read the way kubectl
/// reads it (YAML 1.1 octals such as `0644`). Errors: the parser's first line.
pub fn parse_template_text(text: &str) -> std::result::Result<serde_json::Value, String> {
    parse_yaml_or_json(text)
}

fn parse_yaml_or_json(text: &str) -> std::result::Result<serde_json::Value, String> {
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text).map_err(|e| e.to_string());
    }
    let mut opts = serde_saphyr::options::Options::default();
    opts.legacy_octal_numbers = true;
    let v: serde_json::Value =
        serde_saphyr::from_str_with_options(text, opts).map_err(|e| first_line(&e.to_string()))?;
    Ok(v)
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

// ---- connected commands ---------------------------------------------------------------------

/// A connected environment: client, app, state path, and the simulator when `--simulate`.
struct Env {
    client: KubeClient,
    store_kind: StateStoreKind,
    metrics_file: Option<PathBuf>,
    /// TLS verification is off (`--insecure-skip-tls-verify`): warned about every tick.
    insecure: bool,
    app: App,
    state_path: PathBuf,
    _sim: Option<SimGuard>,
}

struct SimGuard {
    #[cfg(feature = "sim")]
    _server: SimServer,
    _dir: tempfile::TempDir,
}

fn connect(cli: &Cli, need_template: bool) -> Result<Env> {
    let simulate = cli.conn.simulate;
    let app_id = cli.app.app_id(simulate)?;
    let image = match (&cli.app.image, &cli.app.template, simulate) {
        (None, None, true) => Some("registry.example/spark-executor:3.5.0".to_string()),
        (i, _, _) => i.clone(),
    };
    let template = load_template(cli.app.template.as_deref(), image.as_deref())?;
    if need_template && template.is_none() {
        return Err(Error::usage(
            "no executor pod template: pass --template FILE (JSON or YAML) or --image IMAGE",
        ));
    }
    let (flags, sim) = if simulate {
        start_simulator(&cli.conn)?
    } else {
        (flags(&cli.conn), None)
    };
    let cfg = kube::resolve(&flags).map_err(reconcile::kube_error)?;
    let namespace = cfg.namespace.clone();
    let ns_ok = !namespace.is_empty()
        && namespace.len() <= 63
        && namespace
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !namespace.starts_with('-')
        && !namespace.ends_with('-');
    if !ns_ok {
        return Err(Error::usage(format!(
            "namespace {:?} is not a valid namespace name (lower-case letters, digits and '-', \
             at most 63): check -n/--namespace or the kubeconfig context",
            namespace.chars().take(80).collect::<String>()
        )));
    }
    let insecure = cfg.tls.insecure_skip_tls_verify;
    log::debug!("cluster: {} (namespace {namespace})", cfg.source);
    let client = KubeClient::new(cfg).map_err(reconcile::kube_error)?;
    let state_path = match (&cli.app.state_file, &sim) {
        (Some(p), _) => p.clone(),
        (None, Some(s)) => s._dir.path().join("state.json"),
        (None, None) => state::default_path(&namespace, &app_id),
    };
    let app = App {
        settings: cli.app.settings(&app_id),
        app_id,
        template,
        driver_pod: cli.app.driver_pod.clone(),
        page_size: cli.app.page_size,
    };
    Ok(Env {
        client,
        store_kind: cli.app.state_store.clone(),
        metrics_file: cli.metrics_file.clone(),
        insecure,
        app,
        state_path,
        _sim: sim,
    })
}

fn flags(c: &ConnArgs) -> ConnectionFlags {
    ConnectionFlags {
        kubeconfig: c.kubeconfig.clone(),
        context: c.context.clone(),
        namespace: c.namespace.clone(),
        server: c.server.clone(),
        token: c.token.clone(),
        token_file: c.token_file.clone(),
        certificate_authority: c.certificate_authority.clone(),
        client_certificate: c.client_certificate.clone(),
        client_key: c.client_key.clone(),
        insecure_skip_tls_verify: c.insecure_skip_tls_verify,
        allow_insecure_http: c.allow_insecure_http,
    }
}

/// A random-enough token for a loopback simulator (std's per-process hash keys).
#[cfg(feature = "sim")]
fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut s = String::new();
    for i in 0..2u8 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(i);
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        s.push_str(&format!("{:016x}", h.finish()));
    }
    s
}

/// The usage error of `--simulate` and `podalloc sim` in a binary built without the
/// simulator (`cargo build --no-default-features`).
#[cfg(not(feature = "sim"))]
fn no_simulator(what: &str) -> Error {
    Error::usage(format!(
        "{what}: this podalloc was built without the simulator (cargo feature `sim`); \
         connect to a cluster instead, or build with the default features"
    ))
}

#[cfg(not(feature = "sim"))]
fn start_simulator(_: &ConnArgs) -> Result<(ConnectionFlags, Option<SimGuard>)> {
    Err(no_simulator("--simulate"))
}

#[cfg(feature = "sim")]
fn start_simulator(c: &ConnArgs) -> Result<(ConnectionFlags, Option<SimGuard>)> {
    let dir = tempfile::Builder::new()
        .prefix("podalloc-sim-")
        .tempdir()
        .map_err(|e| {
            Error::runtime(format!(
                "cannot make a temporary directory for the simulator: {e}"
            ))
        })?;
    let token = random_token();
    let ca = dir.path().join("ca.crt");
    let opts = SimOptions {
        ca_out: Some(ca.clone()),
        token: Some(token.clone()),
        ..SimOptions::default()
    };
    let server = SimServer::start(opts)
        .map_err(|e| Error::runtime(format!("cannot start the simulated API server: {e}")))?;
    info!(
        "simulated API server at {} (HTTPS, CA {})",
        server.url(),
        ca.display()
    );
    let flags = ConnectionFlags {
        server: Some(server.url()),
        token: Some(token),
        certificate_authority: Some(ca),
        namespace: c.namespace.clone().or(Some("default".into())),
        ..ConnectionFlags::default()
    };
    Ok((
        flags,
        Some(SimGuard {
            _server: server,
            _dir: dir,
        }),
    ))
}

impl Env {
    /// Opens the state store for one tick: the file store takes its lock (exit 3 when
    /// taken); the ConfigMap store checks for a concurrent writer at its first save.
    fn open_store(&self) -> std::result::Result<Box<dyn StateStore + '_>, StoreError> {
        Ok(match &self.store_kind {
            StateStoreKind::File => Box::new(LockedStore::lock(&self.state_path)?),
            StateStoreKind::ConfigMap(name) => {
                Box::new(ConfigMapStore::new(&self.client, name, &self.app.app_id))
            }
        })
    }

    /// Reads the state without locking (read-only commands).
    fn read_state(&self) -> Result<AllocatorState> {
        let st = match &self.store_kind {
            StateStoreKind::File => state::load(&self.state_path),
            StateStoreKind::ConfigMap(name) => {
                ConfigMapStore::new(&self.client, name, &self.app.app_id).load()
            }
        };
        Ok(st.map_err(store_error)?.unwrap_or_else(AllocatorState::new))
    }

    /// Where the state lives, for `status`.
    fn state_location(&self) -> String {
        match &self.store_kind {
            StateStoreKind::File => self.state_path.display().to_string(),
            StateStoreKind::ConfigMap(name) => format!("configmap:{name}"),
        }
    }
}

impl Env {
    /// Runs one tick, warning first when TLS verification is off, and writes the metrics
    /// file after it.
    fn tick(
        &self,
        store: &mut dyn crate::state::StateStore,
        change: &TargetChange,
    ) -> Result<TickReport> {
        if self.insecure {
            warn!(
                "TLS certificate verification is disabled (--insecure-skip-tls-verify): \
                 anyone on the path can impersonate the API server"
            );
        }
        let started = Instant::now();
        let res = reconcile::tick(&self.client, &self.app, store, change, now_ms());
        if let Some(path) = &self.metrics_file {
            // After every tick, failed ones too (their API errors are counted).
            let state = match &res {
                Ok(report) => Some(report.state.clone()),
                Err(_) => store.load().ok().flatten(),
            };
            if let Some(state) = state {
                let text = crate::metrics::render(
                    &self.app.app_id,
                    self.client.namespace(),
                    res.as_ref().ok(),
                    &state,
                    started.elapsed(),
                );
                if let Err(e) = crate::metrics::write_atomic(path, &text) {
                    warn!("cannot write the metrics file {}: {e}", path.display());
                }
            }
        }
        res
    }
}

fn finish(report: TickReport) -> Result<()> {
    info!("{}", report.line());
    match report.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn reconcile_cmd(cli: &Cli, a: &ReconcileArgs) -> Result<()> {
    if a.dry_run {
        return dry_run(cli, a);
    }
    let env = connect(cli, true)?;
    let mut store = env.open_store().map_err(store_error)?;
    let change = TargetChange {
        set: a.target,
        ..Default::default()
    };
    finish(env.tick(store.as_mut(), &change)?)
}

fn dry_run(cli: &Cli, a: &ReconcileArgs) -> Result<()> {
    let env = connect(cli, false)?;
    let state = env.read_state()?;
    let snapshot = reconcile::list_snapshot(&env.client, &env.app)?;
    let request = Request {
        target: a.target,
        remove: vec![],
    };
    let plan = alloc::step(&snapshot, &state, &env.app.settings, &request, now_ms())
        .map_err(|e| Error::usage(e.to_string()))?;
    println!(
        "{}",
        serde_json::to_string_pretty(&plan).expect("plan serializes")
    );
    Ok(())
}

trait NeedsTemplate {
    fn needs_template(&self) -> bool {
        true
    }
}
impl NeedsTemplate for ScaleArgs {}
impl NeedsTemplate for AddArgs {}
impl NeedsTemplate for RemoveArgs {
    fn needs_template(&self) -> bool {
        false
    }
}

fn change(cli: &Cli, change: TargetChange, a: &dyn NeedsTemplate) -> Result<()> {
    let env = connect(cli, a.needs_template())?;
    let mut store = env.open_store().map_err(store_error)?;
    finish(env.tick(store.as_mut(), &change)?)
}

/// `scale N --wait`: the run loop with a progress line.
fn scale_wait(cli: &Cli, a: &ScaleArgs) -> Result<()> {
    let args = RunArgs {
        target: Some(a.target),
        interval: None,
        until_converged: true,
        timeout: a.timeout,
    };
    run_loop_with(cli, &args, true)
}

fn run_loop(cli: &Cli, a: &RunArgs) -> Result<()> {
    run_loop_with(cli, a, false)
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

fn run_loop_with(cli: &Cli, a: &RunArgs, progress: bool) -> Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    // JSON logs stay pure JSON: the log lines carry the same numbers.
    let on = progress && cli.log_format == crate::cli::LogFormat::Text;
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

fn run_ticks(cli: &Cli, a: &RunArgs, progress: &Progress) -> Result<()> {
    let env = connect(cli, true)?;
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&term))
            .map_err(|e| Error::runtime(format!("cannot install the signal handler: {e}")))?;
    }
    let interval = a.interval.unwrap_or(cli.app.batch_delay);
    let started = Instant::now();
    let deadline = a.timeout.map(|t| started + t);
    let change = TargetChange {
        set: a.target,
        ..Default::default()
    };
    let mut ticks = 0u64;
    loop {
        ticks += 1;
        match env.open_store() {
            Err(StoreError::Locked(p)) => {
                warn!(
                    "tick {ticks}: another podalloc run holds {}; skipped",
                    p.display()
                )
            }
            Err(e) => return Err(store_error(e)),
            Ok(mut store) => match env.tick(store.as_mut(), &change) {
                Ok(report) => {
                    info!("tick {ticks}: {}", report.line());
                    progress.show(&report);
                    let converged = report.converged();
                    if let Some(e) = report.error {
                        if e.code != crate::error::ExitCode::Runtime {
                            return Err(e);
                        }
                        warn!("tick {ticks}: {e}; retrying next tick");
                    }
                    if converged && a.until_converged {
                        info!(
                            "converged after {ticks} tick(s) in {:.1}s",
                            started.elapsed().as_secs_f64()
                        );
                        return Ok(());
                    }
                }
                Err(e) if e.code == crate::error::ExitCode::Runtime => {
                    warn!("tick {ticks}: {e}; retrying next tick")
                }
                Err(e) if e.code == crate::error::ExitCode::Locked => {
                    warn!("tick {ticks}: {e}")
                }
                Err(e) => return Err(e),
            },
        }
        // Sleep until the next tick, waking for signals and the deadline.
        let next = Instant::now() + interval;
        loop {
            if term.load(Ordering::Relaxed) {
                info!("signal received: stopping after {ticks} tick(s); state saved");
                return Ok(());
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return if a.until_converged {
                    Err(Error::timeout(format!(
                        "not converged after {} ({ticks} ticks); raise --timeout or check `podalloc status`",
                        humantime::format_duration(a.timeout.unwrap_or_default())
                    )))
                } else {
                    Ok(())
                };
            }
            if now >= next {
                break;
            }
            std::thread::sleep((next - now).min(Duration::from_millis(50)));
        }
    }
}

// ---- status ---------------------------------------------------------------------------------

/// Counts shown by `status`.
#[derive(serde::Serialize, Debug, Default)]
pub struct StatusCounts {
    /// The app id.
    pub app_id: String,
    /// The namespace.
    pub namespace: String,
    /// The state file.
    pub state_file: String,
    /// The target (total expected executors), if one was ever set.
    pub target: Option<u32>,
    /// Running executors.
    pub running: u32,
    /// Pending executors.
    pub pending: u32,
    /// Created, not yet seen.
    pub unacknowledged: u32,
    /// Failed executors (not yet deleted).
    pub failed: u32,
    /// Succeeded executors (not yet deleted).
    pub succeeded: u32,
    /// Executors being deleted.
    pub deleting: u32,
    /// Executors in an unknown phase.
    pub unknown: u32,
    /// The highest executor id handed out or seen.
    pub last_executor_id: u64,
    /// running = target, nothing pending or unacknowledged.
    pub converged: bool,
    /// Totals across ticks: executors created/deleted, API errors by code, last success.
    pub counters: crate::alloc::Counters,
    /// The quota back-off in force, if any.
    pub create_backoff: Option<crate::alloc::Backoff>,
}

fn status(cli: &Cli, a: &StatusArgs) -> Result<()> {
    let env = connect(cli, false)?;
    let state = env.read_state()?;
    let snap = reconcile::list_snapshot(&env.client, &env.app)?;
    let count = |s| snap.count(s) as u32;
    let unack = state
        .unacknowledged
        .iter()
        .filter(|u| !snap.executors.contains_key(&u.executor_id))
        .count() as u32;
    let mut c = StatusCounts {
        app_id: env.app.app_id.clone(),
        namespace: env.client.namespace().to_string(),
        state_file: env.state_location(),
        target: state.target,
        running: count(ExecutorState::Running),
        pending: count(ExecutorState::Pending),
        unacknowledged: unack,
        failed: count(ExecutorState::Failed),
        succeeded: count(ExecutorState::Succeeded),
        deleting: count(ExecutorState::Deleted),
        unknown: count(ExecutorState::Unknown),
        last_executor_id: state.last_executor_id.max(snap.max_id()),
        converged: false,
        counters: state.counters.clone(),
        create_backoff: state.create_backoff.clone(),
    };
    c.converged = state.target == Some(c.running) && c.pending == 0 && c.unacknowledged == 0;
    match a.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&c).expect("serializes")),
        Output::Text => {
            let target = c.target.map_or("unset".to_string(), |t| t.to_string());
            println!(
                "app {} in namespace {} (state {})",
                c.app_id, c.namespace, c.state_file
            );
            println!(
                "target={target} running={} pending={} unacknowledged={} failed={} succeeded={} deleting={} unknown={}",
                c.running, c.pending, c.unacknowledged, c.failed, c.succeeded, c.deleting, c.unknown
            );
            println!(
                "{}",
                if c.converged {
                    "converged"
                } else {
                    "not converged"
                }
            );
        }
    }
    Ok(())
}

// ---- sim ------------------------------------------------------------------------------------

#[cfg(not(feature = "sim"))]
fn sim(_: &SimArgs) -> Result<()> {
    Err(no_simulator("podalloc sim"))
}

#[cfg(feature = "sim")]
fn sim(a: &SimArgs) -> Result<()> {
    let token = if a.no_auth {
        None
    } else {
        Some(a.token.clone().unwrap_or_else(random_token))
    };
    let server = SimServer::start(a.options(token.clone()))
        .map_err(|e| Error::runtime(format!("cannot start the simulated API server: {e}")))?;
    println!("serving {}", server.url());
    if let Some(p) = &a.ca_out {
        println!("CA certificate: {}", p.display());
    }
    if let Some(p) = &a.write_kubeconfig {
        let client_cert =
            (a.require_client_cert && !a.http).then(|| server.generate_client_cert("podalloc"));
        write_kubeconfig(
            p,
            &server.url(),
            server.ca_pem(),
            token.as_deref(),
            client_cert,
        )?;
        println!(
            "kubeconfig: {} (use --kubeconfig {} or KUBECONFIG)",
            p.display(),
            p.display()
        );
    } else if let Some(t) = &token {
        println!("token: {t}");
    }
    if a.write_kubeconfig.is_none() && a.ca_out.is_none() && !a.http {
        println!(
            "(HTTPS with a generated CA: pass --write-kubeconfig FILE or --ca-out FILE to connect)"
        );
    }
    server.wait();
    Ok(())
}

#[cfg(feature = "sim")]
fn write_kubeconfig(
    path: &Path,
    url: &str,
    ca_pem: Option<&str>,
    token: Option<&str>,
    client_cert: Option<(String, String)>,
) -> Result<()> {
    use base64::Engine as _;
    let mut cluster = serde_json::json!({"server": url});
    if let Some(ca) = ca_pem {
        cluster["certificate-authority-data"] = base64::engine::general_purpose::STANDARD
            .encode(ca.as_bytes())
            .into();
    }
    let mut user = serde_json::json!({});
    if let Some(t) = token {
        user["token"] = t.into();
    }
    if let Some((cert, key)) = client_cert {
        let b64 = base64::engine::general_purpose::STANDARD;
        user["client-certificate-data"] = b64.encode(cert.as_bytes()).into();
        user["client-key-data"] = b64.encode(key.as_bytes()).into();
    }
    let cfg = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "podalloc-sim", "cluster": cluster}],
        "users": [{"name": "podalloc-sim", "user": user}],
        "contexts": [{"name": "podalloc-sim", "context": {"cluster": "podalloc-sim", "user": "podalloc-sim", "namespace": "default"}}],
        "current-context": "podalloc-sim",
    });
    let mut f = tempfile::NamedTempFile::new_in(
        path.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new(".")),
    )
    .map_err(|e| Error::runtime(format!("cannot write {}: {e}", path.display())))?;
    std::io::Write::write_all(
        &mut f,
        serde_json::to_string_pretty(&cfg)
            .expect("serializes")
            .as_bytes(),
    )
    .map_err(|e| Error::runtime(format!("cannot write {}: {e}", path.display())))?;
    f.persist(path)
        .map_err(|e| Error::runtime(format!("cannot write {}: {}", path.display(), e.error)))?;
    Ok(())
}
