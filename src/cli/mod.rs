//! Command-line definitions (clap derive). `main.rs` parses these with [`command`] (help
//! that fits each command) and calls [`crate::commands`].
//!
//! The flags are lowered in one place, the way ripgrep turns its low-level arguments into
//! validated ones: [`AppArgs::app`] (app id, pod template, allocation settings) and
//! [`ConnArgs::connection_flags`] (what the kube client resolves).

pub(crate) mod apps_file;
pub mod config_file;
pub(crate) mod template;

use crate::controller::tick::App;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

const EXIT_CODES: &str = "\
EXIT CODES:
  0  done (the tick finished; `run --until-converged` reached the target)
  1  runtime error: the API server or the file system failed; the next tick may succeed
  2  usage, configuration or bad input (flags, kubeconfig, template, state file, PodList)
  3  another podalloc run holds the state lock or owns the app; this run did nothing
  4  the API server refused permanently (403 Forbidden, 422 Invalid) or TLS failed: fix RBAC,
     the template, the CA or the server name
  5  --timeout expired before the target was reached, or during a tick that did not finish
  6  the crash-loop guard (--max-failures) stopped creation
  7  the driver pod (--driver-pod) has finished or is being deleted: executors deleted
  130  `run`, `apps`: a second SIGINT/SIGTERM aborted at once (the state stays consistent)

LIMITS:
  --target, `scale N`, `add N`, --max-pending, --max-failures  0 to 1000000 executors
    (--max-pending also `unlimited`); --batch-size, --max-batch  1 to 10000 pods per tick;
  durations at most 10 years; executor ids 1 to 9223372036854775807 (Spark's positive longs).

ENVIRONMENT:
  Every flag also reads PODALLOC_<FLAG> (e.g. PODALLOC_APP_ID, PODALLOC_BATCH_SIZE).
  RUST_LOG / --log-level set the log level (default info). KUBECONFIG as kubectl.

EXAMPLES:
  # Try it with no cluster: the built-in simulated API server over HTTPS
  podalloc --simulate --app-id demo --image busybox run --target 10 --until-converged

  # One tick from cron against the current kubectl context
  podalloc --app-id spark-etl --template executor.yaml reconcile --target 40

  # What would the next tick do? (prints the plan JSON, changes nothing)
  podalloc --app-id spark-etl --image spark:3.5 reconcile --dry-run";

/// What the command shares with the logger `main` installed: which app the lines are about,
/// and the tokens to scrub from them. Made by `main` before the command runs and passed in
/// [`Cli::process`], so nothing of it is process-wide state; a library user that installs
/// no logger keeps the default, which nothing reads.
#[derive(Clone, Debug, Default)]
pub struct Process {
    /// The app and namespace of the lines logged now (set by the command and the runner).
    pub log: crate::controller::context::LogContext,
    /// The bearer tokens sent, scrubbed from every line ([`crate::kube::Redactions`]).
    pub redactions: crate::kube::Redactions,
}

/// podalloc keeps an application's executor pods on Kubernetes at a target count.
///
/// Each tick lists the app's executor pods by label selector, runs the allocation step of
/// Spark's ExecutorPodsAllocator (batches of --batch-size, nothing more while earlier requests
/// are unacknowledged or pending, creation timeout, excess pending pods deleted first on
/// scale-down), makes the create and delete calls and saves its state. Synchronous, one tick
/// at a time: run it from cron, as a loop (`run`), or as a Kubernetes CronJob.
#[derive(Parser, Debug)]
#[command(name = "podalloc", version, after_long_help = EXIT_CODES, after_help = "All flags, exit codes, environment and examples: podalloc --help")]
pub struct Cli {
    /// Not a flag: the handles `main` shares with the logger ([`Process`]).
    #[arg(skip)]
    pub process: Process,
    /// Connection flags.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Application flags.
    #[command(flatten)]
    pub app: AppArgs,
    /// Config file, logging and metrics flags.
    #[command(flatten)]
    pub ops: OpsArgs,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The config file, logging and metrics flags (global), under their own help heading.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Config file, logging and metrics")]
pub struct OpsArgs {
    /// YAML file of flag values (long names as keys: `app-id: etl`); flags and environment
    /// variables win over it.
    #[arg(long, global = true, env = "PODALLOC_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// `run` and `apps`: serve Prometheus metrics at http://ADDR/metrics (e.g. `:8080`,
    /// `0.0.0.0:8080`; the textfile's metric names, one series per app), as
    /// controller-runtime's `--metrics-bind-address`. Off unless given.
    #[arg(
        long,
        global = true,
        env = "PODALLOC_METRICS_BIND_ADDRESS",
        value_name = "ADDR"
    )]
    pub metrics_bind_address: Option<String>,
    /// `run` and `apps`: serve the liveness probe at http://ADDR/healthz (fails while the
    /// loop has not finished a pass within its stuck limit) and readiness at /readyz (once
    /// the state is loaded), as controller-runtime's `--health-probe-bind-address`. Off
    /// unless given.
    #[arg(
        long,
        global = true,
        env = "PODALLOC_HEALTH_PROBE_BIND_ADDRESS",
        value_name = "ADDR"
    )]
    pub health_probe_bind_address: Option<String>,
    /// Write Prometheus metrics here after every tick (textfile-collector format, atomic).
    #[arg(
        long,
        global = true,
        env = "PODALLOC_METRICS_FILE",
        value_name = "FILE"
    )]
    pub metrics_file: Option<PathBuf>,
    /// Log format: `text` for people, `json` (one object per line: ts, level, module, msg)
    /// for log shippers.
    #[arg(long, global = true, env = "PODALLOC_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// More of podalloc's own log: -v debug, -vv trace, -vvv also the HTTP and TLS
    /// libraries' debug lines (which no other level shows).
    #[arg(short = 'v', long = "verbose", global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Log level: off, error, warn, info, debug or trace (a bare level is podalloc's own;
    /// the HTTP and TLS libraries stay at info at most, see -vvv), or MODULE=LEVEL pairs,
    /// comma-separated (RUST_LOG, when set, wins).
    #[arg(
        long,
        global = true,
        env = "PODALLOC_LOG_LEVEL",
        default_value = "info",
        value_name = "LEVEL",
        value_parser = parse_log_level
    )]
    pub log_level: String,
}

/// Global flags, by argument id, that `-h` lists for every command that connects to a cluster.
const CONNECTED: &[&str] = &[
    "config",
    "app_id",
    "namespace",
    "kubeconfig",
    "context",
    "simulate",
    "state_store",
];

/// [`CONNECTED`] plus what a command that may create pods needs.
const CREATING: &[&str] = &[
    "config",
    "app_id",
    "namespace",
    "kubeconfig",
    "context",
    "simulate",
    "state_store",
    "template",
    "image",
    "batch_size",
    "policy",
];

/// What `apps` needs: every app's defaults (the app id comes from the apps file or the
/// drivers).
const APPS: &[&str] = &[
    "config",
    "namespace",
    "kubeconfig",
    "context",
    "simulate",
    "template",
    "image",
    "batch_size",
    "policy",
];

/// The endpoints of a long-running loop (`run`, `apps`; a Deployment's probes and scrape
/// need them, the "Highly available" recipe included).
const ENDPOINTS: &[&str] = &["metrics_bind_address", "health_probe_bind_address"];

/// Whether `-h` lists the global flag `id` (an argument id) for `command` (`None`: the top
/// level). The rest are rarely used there, or not used at all (`sim`, `man` and
/// `completions` take no global flag but the logging ones; `plan` takes the app id and the
/// allocation flags).
fn short_help_shows(command: Option<&str>, id: &str) -> bool {
    let (flags, looping): (&[&str], bool) = match command {
        None | Some("reconcile" | "scale" | "add") => (CREATING, false),
        Some("run") => (CREATING, true),
        Some("status" | "remove") => (CONNECTED, false),
        Some("apps") => (APPS, true),
        Some("plan") => (&["config", "app_id", "policy"], false),
        Some(_) => (&[], false),
    };
    flags.contains(&id) || (looping && ENDPOINTS.contains(&id))
}

/// The command line, with help that fits each command: `podalloc CMD -h` lists CMD's own
/// flags and the few global flags that matter to it (`short_help_shows`); `--help` still
/// lists every flag. Parsing is the same as [`Cli`]'s derived parser: every global flag is
/// accepted before or after any command.
///
/// How: a global flag defined in a subcommand stops clap from copying the parent's definition
/// there, so each subcommand gets its own copy with `hide_short_help` set as the table says
/// (the workaround the clap maintainers give for hiding globals per subcommand,
/// clap-rs/clap#5355).
pub fn command() -> clap::Command {
    let top = Cli::command().mut_args(|a| {
        let hide = a.is_global_set() && !short_help_shows(None, a.get_id().as_str());
        a.hide_short_help(hide)
    });
    let globals: Vec<clap::Arg> = top
        .get_arguments()
        .filter(|a| a.is_global_set())
        .cloned()
        .collect();
    top.mut_subcommands(|sub| {
        let name = sub.get_name().to_string();
        globals.iter().fold(sub, |sub, a| {
            // A flag of the command's own with the same id (`sim --token`) shadows the global
            // one there, as clap's own propagation does.
            if sub.get_arguments().any(|own| own.get_id() == a.get_id()) {
                return sub;
            }
            let hide = !short_help_shows(Some(&name), a.get_id().as_str());
            sub.arg(a.clone().hide_short_help(hide))
        })
    })
}

/// Parses `args` (the program name first) with [`command`].
///
/// Errors: clap's, help and version requests included (as [`Parser::try_parse_from`]).
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut cmd = command();
    let mut matches = cmd.try_get_matches_from_mut(args)?;
    Cli::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))
}

/// Reads the input file `path` as text, bounded as every input file is (a regular file of
/// at most [`crate::kube::MAX_INPUT_FILE_BYTES`], UTF-8: [`crate::kube::read_regular_text`]).
///
/// Errors (exit 2): `cannot read WHAT PATH: why` (`what`: `the pod template`, `the apps
/// file`, …).
pub(crate) fn read_input_file(path: &std::path::Path, what: &str) -> crate::error::Result<String> {
    crate::kube::read_regular_text(path, crate::kube::MAX_INPUT_FILE_BYTES).map_err(|e| {
        crate::error::Error::usage(format!("cannot read {what} {}: {e}", path.display()))
    })
}

/// The executor image `--simulate` uses when neither `--template` nor `--image` is given.
const SIMULATE_IMAGE: &str = "registry.example/spark-executor:3.5.0";

/// Connection flags (kubectl's names). None given: $KUBECONFIG / ~/.kube/config, else the
/// in-cluster service account.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Connection (kubectl's flags)")]
pub struct ConnArgs {
    /// Path to a kubeconfig file (only this file; no $KUBECONFIG merging).
    #[arg(long, global = true, env = "PODALLOC_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: current-context).
    #[arg(long, global = true, env = "PODALLOC_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace of the executor pods (default: the context's, in-cluster's, or "default").
    #[arg(
        short = 'n',
        long,
        global = true,
        env = "PODALLOC_NAMESPACE",
        value_name = "NS"
    )]
    pub namespace: Option<String>,
    /// API server URL, e.g. https://10.0.0.1:6443 (overrides the kubeconfig's server only:
    /// its credential and CA are kept, as with kubectl).
    #[arg(long, global = true, env = "PODALLOC_SERVER", value_name = "URL")]
    pub server: Option<String>,
    /// Server name to check the API server's certificate against (and send as SNI) instead
    /// of the URL's host.
    #[arg(
        long,
        global = true,
        env = "PODALLOC_TLS_SERVER_NAME",
        value_name = "NAME"
    )]
    pub tls_server_name: Option<String>,
    /// Bearer token (prefer --token-file: arguments are visible in `ps`).
    #[arg(
        long,
        global = true,
        env = "PODALLOC_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// File holding the bearer token; re-read every minute and after a 401.
    #[arg(long, global = true, env = "PODALLOC_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA(s) that sign the API server's certificate.
    #[arg(
        long,
        global = true,
        env = "PODALLOC_CERTIFICATE_AUTHORITY",
        value_name = "FILE"
    )]
    pub certificate_authority: Option<PathBuf>,
    /// PEM client certificate for mutual TLS.
    #[arg(
        long,
        global = true,
        env = "PODALLOC_CLIENT_CERTIFICATE",
        value_name = "FILE"
    )]
    pub client_certificate: Option<PathBuf>,
    /// PEM private key of the client certificate.
    #[arg(long, global = true, env = "PODALLOC_CLIENT_KEY", value_name = "FILE")]
    pub client_key: Option<PathBuf>,
    /// Do not verify the API server's certificate (insecure; warns every tick).
    #[arg(long, global = true, env = "PODALLOC_INSECURE_SKIP_TLS_VERIFY", value_parser = clap::builder::BoolishValueParser::new())]
    pub insecure_skip_tls_verify: bool,
    /// Allow plain http:// to a host that is not loopback.
    #[arg(long, global = true, env = "PODALLOC_ALLOW_INSECURE_HTTP", value_parser = clap::builder::BoolishValueParser::new())]
    pub allow_insecure_http: bool,
    /// Start the built-in simulated API server (HTTPS on loopback) and use it instead of a
    /// cluster: for trying podalloc out. Its state file lives in a temporary directory unless
    /// --state-file is given.
    #[arg(long, global = true, env = "PODALLOC_SIMULATE", value_parser = clap::builder::BoolishValueParser::new())]
    pub simulate: bool,
    /// Longest one API call may take: every attempt, its whole response body and the sleeps
    /// between retries (a server that answers late or trickles its body fails the call then).
    #[arg(long, global = true, env = "PODALLOC_REQUEST_TIMEOUT", value_name = "DURATION", default_value = "30s", value_parser = parse_timeout)]
    pub request_timeout: Duration,
    /// Longest TCP connect plus TLS handshake of one attempt.
    #[arg(long, global = true, env = "PODALLOC_CONNECT_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = parse_timeout)]
    pub connect_timeout: Duration,
    /// Largest list page, in bytes after gzip decoding; a larger page fails the list (use a
    /// smaller --page-size). Default: 4 GiB where a page is decoded while it arrives
    /// (reconcile, run: memory stays flat whatever the page's size, and the cap bounds how
    /// long a gzip bomb is read), 64 MiB where a page is held whole (apps)
    #[arg(long, global = true, env = "PODALLOC_MAX_PAGE_BYTES", value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1024..))]
    pub max_page_bytes: Option<u64>,
}

impl ConnArgs {
    /// The client's timeouts and list page cap from `--request-timeout`,
    /// `--connect-timeout` and `--max-page-bytes` (the rest at their defaults).
    pub fn client_options(&self) -> crate::kube::ClientOptions {
        let d = crate::kube::ClientOptions::default();
        crate::kube::ClientOptions {
            timeouts: crate::kube::Timeouts {
                connect: self.connect_timeout,
                per_read: d.timeouts.per_read.min(self.request_timeout),
                global: self.request_timeout,
            },
            list_body_limit: (self.max_page_bytes).unwrap_or(crate::kube::DEFAULT_LIST_BODY_LIMIT),
            streamed_list_body_limit: (self.max_page_bytes)
                .unwrap_or(crate::kube::DEFAULT_STREAMED_LIST_BODY_LIMIT),
            ..d
        }
    }

    /// The connection flags as the kube client resolves them (`--simulate` aside: the
    /// simulator supplies its own).
    pub fn connection_flags(&self) -> crate::kube::ConnectionFlags {
        crate::kube::ConnectionFlags {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            namespace: self.namespace.clone(),
            server: self.server.clone(),
            tls_server_name: self.tls_server_name.clone(),
            flags_only: false,
            token: self.token.clone().map(Into::into),
            token_file: self.token_file.clone(),
            certificate_authority: self.certificate_authority.clone(),
            client_certificate: self.client_certificate.clone(),
            client_key: self.client_key.clone(),
            insecure_skip_tls_verify: self.insecure_skip_tls_verify,
            allow_insecure_http: self.allow_insecure_http,
        }
    }
}

/// The levels `--log-level` accepts.
pub const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a `--log-level` value: comma-separated directives, each a level ([`LOG_LEVELS`],
/// any case) or `MODULE=LEVEL`. Errors: naming the bad part and the allowed values (clap
/// turns it into a usage error, exit 2). Unlike env_logger, a bare word that is not a
/// level is refused: env_logger would read `verbose` as a module name and log nothing else.
pub fn parse_log_level(s: &str) -> std::result::Result<String, String> {
    let level_ok = |l: &str| LOG_LEVELS.iter().any(|k| k.eq_ignore_ascii_case(l.trim()));
    for part in s.split(',') {
        let level = match part.split_once('=') {
            Some((module, level)) if !module.trim().is_empty() => level,
            Some(_) => part,
            None => part,
        };
        if !level_ok(level) {
            return Err(format!(
                "unknown log level {:?}; allowed: {} (or MODULE=LEVEL, comma-separated)",
                level.trim(),
                LOG_LEVELS.join(", ")
            ));
        }
    }
    Ok(s.to_string())
}

/// The application and how to allocate for it.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Application and allocation")]
pub struct AppArgs {
    /// The application id: the `spark-app-selector` label value of its executor pods.
    #[arg(long, global = true, env = "PODALLOC_APP_ID", value_name = "ID")]
    pub app_id: Option<String>,
    /// State file (default: `$XDG_STATE_HOME/podalloc/<cluster>/<namespace>/<app id>.json`,
    /// `<cluster>` the API server's host_port, so each kubeconfig context has its own).
    #[arg(long, global = true, env = "PODALLOC_STATE_FILE", value_name = "FILE")]
    pub state_file: Option<PathBuf>,
    /// Where the state lives: `file` (--state-file), `configmap:NAME` (a ConfigMap in the
    /// app's namespace, with optimistic concurrency: for CronJobs and several admin hosts) or
    /// `executorset:NAME` (an ExecutorSet in the app's namespace: `kubectl scale`, HPA and
    /// KEDA set its target; created when missing, seeded by --target). Not given: the app's
    /// home found in its namespace (an ExecutorSet or a state ConfigMap labelled
    /// `spark-app-selector=<app id>`), else the state file.
    #[arg(long, global = true, env = "PODALLOC_STATE_STORE", value_name = "STORE", value_parser = parse_state_store)]
    pub state_store: Option<StateStoreKind>,
    /// Executor pod template, JSON or YAML (a Pod; Spark's executor template files work).
    #[arg(long, global = true, env = "PODALLOC_TEMPLATE", value_name = "FILE")]
    pub template: Option<PathBuf>,
    /// Container image: a minimal executor pod, or the first container's image in --template.
    #[arg(long, global = true, env = "PODALLOC_IMAGE", value_name = "IMAGE")]
    pub image: Option<String>,
    /// The executor pod template of resource profile P (repeatable; Spark 3.1+'s stage-level
    /// scheduling): executors of profile P are built from it, labelled
    /// `spark-exec-resourceprofile-id=P`. Profiles without one use --template/--image.
    #[arg(long, global = true, value_name = "P=FILE", value_parser = parse_profile_template)]
    pub profile_template: Vec<(u32, PathBuf)>,
    /// The executor container: when it terminates the executor is over (exit 0: succeeded,
    /// else failed), whatever its sidecars do. Default: the template's first container (the
    /// single container of --image pods); `plan`: each pod's first container.
    #[arg(
        long,
        global = true,
        env = "PODALLOC_EXECUTOR_CONTAINER",
        value_name = "NAME"
    )]
    pub executor_container: Option<String>,
    /// Driver pod that owns the executors (ownerReference; they are garbage-collected with it).
    #[arg(long, global = true, env = "PODALLOC_DRIVER_POD", value_name = "NAME")]
    pub driver_pod: Option<String>,
    /// Post no Kubernetes Events (by default each tick posts SuccessfulCreate, FailedCreate,
    /// SuccessfulDelete, ExecutorFailed, AllocationBlocked and CrashLoopHalt events on the
    /// driver pod, else on the executor pod concerned; needs RBAC events create, get and patch:
    /// get reads an Event a previous process posted, to count on from it).
    #[arg(long, global = true, env = "PODALLOC_NO_EVENTS", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_events: bool,
    /// Executor pods created per tick at most (Spark: spark.kubernetes.allocation.batch.size),
    /// or `auto`: adaptive batches, doubling while creates succeed and pods get scheduled,
    /// halving on throttling or unschedulable pods, at most --max-batch; or `slow-start`: as
    /// auto across ticks, and within a tick groups of 1, 2, 4, … created back to back while
    /// every create succeeds (as the ReplicaSet controller does).
    #[arg(long, global = true, env = "PODALLOC_BATCH_SIZE", value_name = "N|auto|slow-start", default_value = "5", value_parser = parse_batch_size)]
    pub batch_size: BatchSize,
    /// With --batch-size auto: the largest batch.
    #[arg(long, global = true, env = "PODALLOC_MAX_BATCH", value_name = "N", default_value_t = 100, value_parser = parse_batch_size_n)]
    pub max_batch: u32,
    /// Spark's maxPendingPods: pending pods no longer block new batches; at most N pending
    /// or unacknowledged at once (1 to 1000000, or `unlimited`; unlimited under
    /// `--policy spark-3.x`).
    #[arg(long, global = true, env = "PODALLOC_MAX_PENDING", value_name = "N|unlimited", value_parser = parse_max_pending)]
    pub max_pending: Option<u32>,
    /// Which Spark allocator to behave as: `spark-3.0` (the default) or `spark-3.x` (Spark
    /// 3.1+: no pending-pod limit, creation timeout max(5 × batch delay, 600s), and new
    /// requests and pending pods protected from excess deletion for an executor idle timeout
    /// of 60s). Flags given explicitly win over the policy's defaults (see --help).
    #[arg(
        long,
        global = true,
        env = "PODALLOC_POLICY",
        value_name = "POLICY",
        value_enum,
        default_value = "spark-3.0"
    )]
    pub policy: Policy,
    /// Spark 3.1+'s excess rule (spark.dynamicAllocation.executorIdleTimeout): unacknowledged
    /// requests and pending pods are deleted as excess only once older than this, oldest
    /// first [default: 60s under --policy spark-3.x, off under spark-3.0].
    #[arg(long, global = true, env = "PODALLOC_EXECUTOR_IDLE_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub executor_idle_timeout: Option<Duration>,
    /// Failure limit (Spark 3.5's spark.executor.maxNumFailures): more than N executor
    /// failures within --failure-window stop all creation (exit 6, naming the dominant
    /// reason). On by default: twice the target, at least 3; 0 turns it off.
    #[arg(long, global = true, env = "PODALLOC_MAX_FAILURES", value_name = "N", value_parser = parse_target)]
    pub max_failures: Option<u32>,
    /// The crash-loop guard's window.
    #[arg(long, global = true, env = "PODALLOC_FAILURE_WINDOW", value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub failure_window: Duration,
    /// A pod waiting on a permanent start-up error (ErrImagePull, ImagePullBackOff,
    /// ErrImageNeverPull, CreateContainerConfigError, CreateContainerError, CrashLoopBackOff,
    /// … the full list is in docs/semantics.md) longer than this is a failure: deleted once
    /// and counted by the guard (unschedulable alone is not).
    #[arg(long, global = true, env = "PODALLOC_STARTUP_GRACE", value_name = "DURATION", value_parser = parse_duration)]
    pub startup_grace: Option<Duration>,
    /// Also delete running executors above the target (off, as Spark): lowest
    /// pod-deletion-cost first, then most restarts, then newest.
    #[arg(long, global = true, env = "PODALLOC_SCALE_DOWN_RUNNING", value_parser = clap::builder::BoolishValueParser::new())]
    pub scale_down_running: bool,
    /// Remove running executors (`remove`, and --scale-down-running) through the Eviction
    /// API (POST pods/NAME/eviction) instead of a plain delete, so PodDisruptionBudgets
    /// apply; a budget's 429 is "not now": asked again next tick, never a failure. Needs
    /// `create` on `pods/eviction` (deploy/rbac.yaml).
    #[arg(long, global = true, env = "PODALLOC_EVICT", value_parser = clap::builder::BoolishValueParser::new())]
    pub evict: bool,
    /// Time between ticks of `run` (Spark: spark.kubernetes.allocation.batch.delay), e.g. 1s.
    #[arg(long, global = true, env = "PODALLOC_BATCH_DELAY", value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub batch_delay: Duration,
    /// How long a created pod may stay unseen before it is deleted and replaced
    /// [default: max(5 × batch delay, 60s)].
    #[arg(long, global = true, env = "PODALLOC_CREATION_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub creation_timeout: Option<Duration>,
    /// Pods being deleted keep counting toward the target as a ResourceQuota charges them
    /// (off, as Spark): until deletionTimestamp + deletionGracePeriodSeconds has passed (a
    /// pod on a lost node stops counting then), never once Failed or Succeeded.
    #[arg(long, global = true, env = "PODALLOC_COUNT_TERMINATING", value_parser = clap::builder::BoolishValueParser::new())]
    pub count_terminating: bool,
    /// How long a pod may stay in phase Unknown (its node stopped reporting) before it is
    /// lost: deleted and replaced; until then it counts toward the target, as ReplicaSet
    /// counts it.
    #[arg(long, global = true, env = "PODALLOC_UNKNOWN_TIMEOUT", value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub unknown_timeout: Duration,
    /// Keep Failed/Succeeded executor pods (for debugging) instead of deleting them; they
    /// are still replaced.
    #[arg(long, global = true, env = "PODALLOC_KEEP_TERMINATED", value_parser = clap::builder::BoolishValueParser::new())]
    pub keep_terminated: bool,
    /// Pods per page when listing (the API's `limit`; 0 = no pagination).
    #[arg(
        long,
        global = true,
        env = "PODALLOC_PAGE_SIZE",
        value_name = "N",
        default_value_t = 500
    )]
    pub page_size: u32,
}

impl AppArgs {
    /// The validated app id (`--simulate` defaults it to `podalloc-demo`).
    ///
    /// Errors (exit 2): missing, or not a valid label value.
    pub fn app_id(&self, simulate: bool) -> crate::error::Result<String> {
        use crate::error::Error;
        let id = match (&self.app_id, simulate) {
            (Some(id), _) => id.clone(),
            (None, true) => "podalloc-demo".to_string(),
            (None, false) => {
                return Err(Error::usage(
                    "no application id: pass --app-id ID (the spark-app-selector label of its executor pods)",
                ))
            }
        };
        crate::engine::podspec::validate_label_value("--app-id", &id).map_err(Error::usage)?;
        Ok(id)
    }

    /// The flags lowered into the validated application a connected command works on: the
    /// app id ([`AppArgs::app_id`]), the pod template read from `--template` and/or `--image`
    /// (`--simulate` with neither: a stock Spark executor image), the allocation settings
    /// ([`AppArgs::settings`]), the driver pod and the list page size.
    ///
    /// Errors (exit 2): a bad app id, an unreadable or invalid template, or none when
    /// `need_template` (commands that may create pods), an `--executor-container` the
    /// template does not have, a `--driver-pod` that is not a pod name.
    pub fn app(&self, simulate: bool, need_template: bool) -> crate::error::Result<App> {
        let app_id = self.app_id(simulate)?;
        let image = match (&self.image, &self.template, simulate) {
            (None, None, true) => Some(SIMULATE_IMAGE),
            (i, _, _) => i.as_deref(),
        };
        let template = crate::cli::template::load_template(self.template.as_deref(), image)?;
        if need_template && template.is_none() {
            return Err(crate::error::Error::usage(
                "no executor pod template: pass --template FILE (JSON or YAML) or --image IMAGE",
            ));
        }
        let mut settings = self.settings(&app_id);
        settings.template_fingerprint = template.as_ref().map(|t| t.fingerprint());
        if let (Some(t), Some(name)) = (&template, &settings.executor_container) {
            t.check_executor_container(name)
                .map_err(crate::error::Error::usage)?;
        }
        if settings.executor_container.is_none() {
            let first = template.as_ref().map(|t| t.first_container().to_string());
            settings.executor_container = first;
        }
        if let Some(d) = &self.driver_pod {
            crate::engine::podspec::validate_dns1123_subdomain("--driver-pod", d)
                .map_err(crate::error::Error::usage)?;
        }
        Ok(App {
            settings,
            app_id,
            template,
            profile_templates: self.profile_templates()?,
            own_profile_templates: false,
            driver_pod: self.driver_pod.clone(),
            page_size: self.page_size,
        })
    }

    /// The templates of `--profile-template P=FILE`, by profile (errors: an unreadable or
    /// invalid template, exit 2).
    pub fn profile_templates(
        &self,
    ) -> crate::error::Result<std::collections::BTreeMap<u32, crate::engine::podspec::PodTemplate>>
    {
        let mut all = std::collections::BTreeMap::new();
        for (p, path) in &self.profile_template {
            if let Some(t) = crate::cli::template::load_template(Some(path), None)? {
                all.insert(*p, t);
            }
        }
        Ok(all)
    }

    /// The allocation settings these flags give for `app_id`.
    pub fn settings(&self, app_id: &str) -> crate::engine::alloc::Settings {
        let spark3x = self.policy == Policy::Spark3x;
        crate::engine::alloc::Settings {
            batch_size: match self.batch_size {
                BatchSize::Fixed(n) => n,
                BatchSize::Auto => crate::engine::alloc::DEFAULT_BATCH_SIZE.min(self.max_batch),
                BatchSize::SlowStart => self.max_batch,
            },
            policies: crate::engine::alloc::Policies {
                max_pending: self.max_pending.or(spark3x.then_some(u32::MAX)),
                adaptive_max_batch: (!matches!(self.batch_size, BatchSize::Fixed(_)))
                    .then_some(self.max_batch),
                slow_start: self.batch_size == BatchSize::SlowStart,
                max_failures: match self.max_failures {
                    None => crate::engine::alloc::FailureLimit::TwiceTarget,
                    Some(0) => crate::engine::alloc::FailureLimit::Off,
                    Some(n) => crate::engine::alloc::FailureLimit::Max(n),
                },
                failure_window_ms: self.failure_window.as_millis() as u64,
                startup_grace_ms: self.startup_grace.map(|d| d.as_millis() as u64),
                scale_down_running: self.scale_down_running,
                evict: self.evict,
                count_terminating: self.count_terminating,
                unknown_timeout_ms: Some(self.unknown_timeout.as_millis() as u64),
                executor_idle_timeout_ms: (self.executor_idle_timeout)
                    .map(|d| d.as_millis() as u64)
                    .or(spark3x.then_some(crate::engine::alloc::DEFAULT_EXECUTOR_IDLE_TIMEOUT_MS)),
            },
            batch_delay_ms: self.batch_delay.as_millis() as u64,
            creation_timeout_ms: self.creation_timeout.map(|d| d.as_millis() as u64),
            creation_timeout_floor_ms: match self.policy {
                Policy::Spark30 => crate::engine::alloc::MIN_CREATION_TIMEOUT_MS,
                Policy::Spark3x => crate::engine::alloc::SPARK3X_CREATION_TIMEOUT_MS,
            },
            delete_terminated: !self.keep_terminated,
            name_prefix: crate::engine::podspec::name_prefix(app_id),
            executor_container: self.executor_container.clone(),
            template_fingerprint: None,
        }
    }
}

/// What to do.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// One tick: list, plan, create/delete, save. For cron.
    Reconcile(ReconcileArgs),
    /// Tick every --interval until stopped (SIGINT/SIGTERM finish the tick, save, exit 0; a
    /// second aborts at once, exit 130).
    Run(RunArgs),
    /// Keep many apps at their targets in one process, as `run` keeps one: from an apps
    /// file, or every driver pod a label selector finds (one executor list per namespace for
    /// the apps due; `scale`, `add` and `remove` of its apps are handed to it).
    Apps(AppsArgs),
    /// Show the counts: target, running, pending, unacknowledged, failed. Changes nothing.
    Status(StatusArgs),
    /// Set the target to N executors: one tick, or handed to the loop that owns the app.
    Scale(ScaleArgs),
    /// Raise the target by N executors (Spark's addExecutors): one tick, or handed to the
    /// loop that owns the app.
    Add(AddArgs),
    /// Delete these executors whatever their state and lower the target by as many (Spark's
    /// deleteExecutors): one tick, or handed to the loop that owns the app.
    Remove(RemoveArgs),
    /// Run the allocation step once, offline, on a recorded PodList; print the plan JSON.
    Plan(PlanArgs),
    /// Serve the built-in simulated Kubernetes API server (pods API + a simulated kubelet).
    Sim(SimArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions(CompletionsArgs),
    /// Print the man page (roff) on stdout: `podalloc man > podalloc.1`.
    Man,
}

/// `completions`.
#[derive(Args, Debug, Clone)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `reconcile`.
#[derive(Args, Debug, Clone, Default)]
pub struct ReconcileArgs {
    /// Set the target (total expected executors); without it the state's target holds.
    #[arg(long, env = "PODALLOC_TARGET", value_name = "N", allow_negative_numbers = true, value_parser = parse_target)]
    pub target: Option<u32>,
    /// Set the target of resource profile P to N (repeatable; Spark 3.1+'s stage-level
    /// scheduling): `--target N` is profile 0's; other profiles keep the state's.
    #[arg(long, value_name = "P=N", value_parser = parse_profile_target)]
    pub profile_target: Vec<(u32, u32)>,
    /// Print the plan JSON and change nothing (no API writes, no state save); a one-line
    /// summary goes to standard error.
    #[arg(long, env = "PODALLOC_DRY_RUN", value_parser = clap::builder::BoolishValueParser::new())]
    pub dry_run: bool,
    /// With --dry-run, what goes to standard output: `plan` (the plan JSON), `pod` (the
    /// executor pod the next create would send, as JSON: check a template with `kubectl
    /// create --dry-run=server -f -`) or `summary` (the summary line only).
    #[arg(long = "output", value_enum, default_value_t = DryRunOutput::Plan, requires = "dry_run", value_name = "WHAT")]
    pub dry_output: DryRunOutput,
}

/// What `reconcile --dry-run` prints on standard output.
#[derive(ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DryRunOutput {
    /// The plan JSON (the `plan` contract).
    #[default]
    Plan,
    /// The rendered executor pod JSON of the next create.
    Pod,
    /// The one-line human summary.
    Summary,
}

/// `run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The target (total expected executors) when the store has none yet: a seed. The
    /// target a running loop follows lives in the store (the state file; with a ConfigMap
    /// store its `podalloc.io/executors` annotation; with an ExecutorSet store its
    /// `spec.replicas`), changed by `scale`, `add`, `remove`, `kubectl annotate` or `kubectl
    /// scale executorset` while the loop runs, so a restart or a rollout never changes it.
    #[arg(long, env = "PODALLOC_TARGET", value_name = "N", allow_negative_numbers = true, value_parser = parse_target)]
    pub target: Option<u32>,
    /// Set the store's target to --target even when it has one (overrides a target set by
    /// `scale`, `add` or an annotation).
    #[arg(long, env = "PODALLOC_FORCE_TARGET", requires = "target", value_parser = clap::builder::BoolishValueParser::new())]
    pub force_target: bool,
    /// The target of resource profile P when the store has none yet, a seed as --target
    /// is profile 0's (repeatable; Spark 3.1+'s stage-level scheduling). Executors of
    /// profile P carry label `spark-exec-resourceprofile-id=P` and are built from
    /// `--profile-template P=FILE`; with `--state-store executorset:NAME`, profile P gets an
    /// ExecutorSet of its own (`NAME-rpP`), scalable on its own (`docs/executorset.md`).
    #[arg(long, value_name = "P=N", value_parser = parse_profile_target)]
    pub profile_target: Vec<(u32, u32)>,
    /// Time between ticks while something is in flight (creates not yet seen, pending pods,
    /// a batch to make, a back-off, queued requests) [default: --batch-delay].
    #[arg(long, env = "PODALLOC_INTERVAL", value_name = "DURATION", value_parser = parse_duration)]
    pub interval: Option<Duration>,
    /// Time between ticks at rest (converged, nothing queued), as Spark's
    /// `spark.kubernetes.executor.apiPollingInterval`. A steering request (file store), a
    /// changed ExecutorSet spec (read every --interval), a signal or a deadline of the plan
    /// wakes the loop sooner.
    #[arg(long, env = "PODALLOC_IDLE_INTERVAL", value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub idle_interval: Duration,
    /// Exit 0 once running = target with nothing pending or unacknowledged.
    #[arg(long, env = "PODALLOC_UNTIL_CONVERGED", value_parser = clap::builder::BoolishValueParser::new())]
    pub until_converged: bool,
    /// Give up after this long (exit 5 if not converged).
    #[arg(long, env = "PODALLOC_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Leader election (`--leader-elect` and its durations).
    #[command(flatten)]
    pub leader: LeaderElectArgs,
    /// Log a tick's summary line when something changed, else only this often (a
    /// heartbeat); unchanged ticks log at debug level.
    #[arg(long, env = "PODALLOC_LOG_EVERY", value_name = "DURATION", value_parser = parse_duration, default_value = "5m")]
    pub log_every: Duration,
}

/// `run --leader-elect`: several replicas, one acting at a time, over a
/// `coordination.k8s.io/v1` Lease (client-go's leader election; see `crate::controller::leader`).
#[derive(Args, Debug, Clone, Default)]
pub struct LeaderElectArgs {
    /// Act only while holding the Lease (highly available: run two replicas): the app's, or
    /// for `apps` one Lease for all its apps. Needs leases get/create/update in the
    /// namespace.
    #[arg(long, env = "PODALLOC_LEADER_ELECT", value_parser = clap::builder::BoolishValueParser::new())]
    pub leader_elect: bool,
    /// The Lease's name (default: `podalloc-<app id>`; for `apps`: `podalloc-apps`).
    #[arg(long, env = "PODALLOC_LEADER_ELECT_RESOURCE_NAME", value_name = "NAME")]
    pub leader_elect_resource_name: Option<String>,
    /// How long standbys wait after the Lease last changed before taking it over [default: 15s].
    #[arg(long, env = "PODALLOC_LEADER_ELECT_LEASE_DURATION", value_name = "DURATION", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Option<Duration>,
    /// How long the leader keeps acting without a successful renewal [default: 10s].
    #[arg(long, env = "PODALLOC_LEADER_ELECT_RENEW_DEADLINE", value_name = "DURATION", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Option<Duration>,
    /// Time between attempts to acquire or renew [default: 2s].
    #[arg(long, env = "PODALLOC_LEADER_ELECT_RETRY_PERIOD", value_name = "DURATION", value_parser = parse_duration)]
    pub leader_elect_retry_period: Option<Duration>,
}

/// Log formats.
#[derive(ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// `[time LEVEL target] message`.
    #[default]
    Text,
    /// `{"ts":…,"level":…,"module":…,"msg":…}` per line (errors add `exit_code`).
    Json,
}

/// Output formats.
#[derive(ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Output {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object on stdout.
    Json,
}

/// `status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// Output format.
    #[arg(long, short = 'o', env = "PODALLOC_OUTPUT", value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// The leader-election Lease whose holder to show (default: `podalloc-<app id>`).
    #[arg(long, env = "PODALLOC_LEADER_ELECT_RESOURCE_NAME", value_name = "NAME")]
    pub leader_elect_resource_name: Option<String>,
}

/// `scale`.
#[derive(Args, Debug, Clone)]
pub struct ScaleArgs {
    /// The new target.
    #[arg(value_name = "N", allow_negative_numbers = true, value_parser = parse_target)]
    pub target: u32,
    /// Wait until converged: with no loop owning the app, keep ticking (every --batch-delay),
    /// a live progress line on a terminal; with one, until it has applied the request and
    /// the app has converged.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long (exit 5).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "wait")]
    pub timeout: Option<Duration>,
    /// The resource profile whose target changes (Spark 3.1+'s stage-level scheduling;
    /// default 0). With an ExecutorSet home: the ExecutorSet of that profile
    /// (`docs/executorset.md`).
    #[arg(long, value_name = "P", default_value_t = 0, value_parser = parse_profile)]
    pub profile: u32,
}

/// `add`.
#[derive(Args, Debug, Clone)]
pub struct AddArgs {
    /// How many executors to add to the target.
    #[arg(value_name = "N", allow_negative_numbers = true, value_parser = parse_target)]
    pub count: u32,
    /// Wait until converged, as `scale --wait`.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long (exit 5).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "wait")]
    pub timeout: Option<Duration>,
    /// The resource profile whose target changes (Spark 3.1+'s stage-level scheduling;
    /// default 0). With an ExecutorSet home: the ExecutorSet of that profile
    /// (`docs/executorset.md`).
    #[arg(long, value_name = "P", default_value_t = 0, value_parser = parse_profile)]
    pub profile: u32,
}

/// `remove`.
#[derive(Args, Debug, Clone)]
pub struct RemoveArgs {
    /// Executor ids to delete.
    #[arg(value_name = "ID", required = true, value_parser = parse_id)]
    pub ids: Vec<u64>,
    /// The resource profile of these executors (default 0). With an ExecutorSet home: the
    /// ExecutorSet of that profile gets the request and its `spec.replicas` is lowered (each
    /// executor lowers its own profile's target otherwise).
    #[arg(long, value_name = "P", default_value_t = 0, value_parser = parse_profile)]
    pub profile: u32,
}

/// `plan` (the contract in tests/conformance/README.md).
#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    /// PodList JSON as the API returns it (`-` reads standard input).
    #[arg(long, value_name = "FILE")]
    pub pods: PathBuf,
    /// The clock: milliseconds since the Unix epoch.
    #[arg(long, value_name = "MS")]
    pub now: u64,
    /// The `state` object printed by the previous step (absent: a fresh start).
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// Set the target; without it the state's target holds.
    #[arg(long, value_name = "N", allow_negative_numbers = true, value_parser = parse_target)]
    pub target: Option<u32>,
    /// Executor id to remove (repeatable): deleted whatever its state, target lowered.
    #[arg(long, value_name = "ID", value_parser = parse_id)]
    pub remove: Vec<u64>,
    /// Set the target of resource profile P to N (repeatable; Spark 3.1+'s stage-level
    /// scheduling, SPARK-33288): `--target N` is profile 0's; profiles without one here keep
    /// the state's. Executors of profile P carry label `spark-exec-resourceprofile-id=P`.
    #[arg(long, value_name = "P=N", value_parser = parse_profile_target)]
    pub profile_target: Vec<(u32, u32)>,
    /// The driver pod's phase, as a tick with --driver-pod would read it: Pending (no
    /// executors yet), Running, Succeeded or Failed (every executor deleted), or Deleting.
    #[arg(long, value_name = "PHASE", value_parser = ["Pending", "Running", "Succeeded", "Failed", "Deleting"])]
    pub driver_phase: Option<String>,
}

/// `sim`: the simulator's own flags (the `podalloc-sim` crate).
#[cfg(feature = "sim")]
pub use crate::sim::SimArgs;

/// `sim` in a binary built without the simulator (`--no-default-features`): any arguments
/// are taken, and the command fails with a usage error saying so.
#[cfg(not(feature = "sim"))]
#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// Ignored: this binary has no simulator.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    pub args: Vec<String>,
}

/// Where the state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateStoreKind {
    /// A local file with a lock (`--state-file`).
    File,
    /// A ConfigMap of this name in the app's namespace.
    ConfigMap(String),
    /// An ExecutorSet of this name in the app's namespace (`docs/executorset.md`).
    ExecutorSet(String),
}

/// Parses `file`, `configmap:NAME` or `executorset:NAME` (NAME a DNS-1123 subdomain).
pub fn parse_state_store(s: &str) -> Result<StateStoreKind, String> {
    let s = s.trim();
    if s == "file" {
        return Ok(StateStoreKind::File);
    }
    let (kind, name, make): (&str, &str, fn(String) -> StateStoreKind) =
        match (s.strip_prefix("configmap:"), s.strip_prefix("executorset:")) {
            (Some(name), _) => ("ConfigMap", name, StateStoreKind::ConfigMap),
            (_, Some(name)) => ("ExecutorSet", name, StateStoreKind::ExecutorSet),
            _ => {
                return Err(format!(
                    "{s:?}: use `file`, `configmap:NAME` or `executorset:NAME`"
                ))
            }
        };
    let valid = !name.is_empty()
        && name.len() <= 253
        && (name.bytes())
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    match valid {
        true => Ok(make(name.to_string())),
        false => Err(format!(
            "{name:?} is not a valid {kind} name (lower-case letters, digits, '-' and '.')"
        )),
    }
}

/// Longest duration any flag takes: 10 years.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Parses a humantime duration (`1s`, `250ms`, `2m`), at most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration ({e}); use e.g. 1s, 250ms, 2m"))?;
    if d > MAX_DURATION {
        return Err(format!("{s:?} is longer than 10 years"));
    }
    Ok(d)
}

/// Parses a timeout: a duration from 1 ms to 1 day.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() || d > Duration::from_secs(24 * 3600) {
        return Err(format!("{s:?}: a timeout must be from 1ms to 1d"));
    }
    Ok(d)
}

pub use crate::engine::counts::{
    parse_batch_size, parse_batch_size_n, parse_max_pending, parse_target, BatchSize, MAX_BATCH,
    MAX_TARGET,
};

/// A resource profile id (Spark's `ResourceProfile.id`: 0 is the default profile, ids are
/// non-negative `Int`s).
pub fn parse_profile(s: &str) -> Result<u32, String> {
    let p: u32 = (s.trim().parse().ok())
        .filter(|&p| p <= i32::MAX as u32)
        .ok_or_else(|| format!("{s:?} is not a resource profile id (0..={})", i32::MAX))?;
    Ok(p)
}

/// `P=FILE`: resource profile P's pod template.
pub fn parse_profile_template(s: &str) -> Result<(u32, PathBuf), String> {
    let (p, f) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: write PROFILE=FILE, e.g. 1=gpu-executor.yaml"))?;
    Ok((parse_profile(p)?, PathBuf::from(f)))
}

/// `P=N`: resource profile P's target N.
pub fn parse_profile_target(s: &str) -> Result<(u32, u32), String> {
    let (p, n) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: write PROFILE=TARGET, e.g. 1=4"))?;
    Ok((parse_profile(p)?, parse_target(n)?))
}

/// The allocation policy (`--policy`): which Spark version's allocator to behave as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// Spark 3.0's `ExecutorPodsAllocator` (the default).
    #[value(name = "spark-3.0")]
    Spark30,
    /// Spark 3.1 to 3.5: unlimited pending pods, 600 s creation timeout, idle-timeout
    /// protection from excess deletion (SPARK-33099, SPARK-34334, SPARK-33231, SPARK-36052).
    #[value(name = "spark-3.x")]
    Spark3x,
}

/// Parses an executor id: a whole number ≥ 1.
pub fn parse_id(s: &str) -> Result<u64, String> {
    crate::engine::snapshot::parse_executor_id(s.trim())
        .ok_or_else(|| format!("{s:?} is not an executor id (a whole number ≥ 1)"))
}

/// `apps`: which apps, and how long to run.
#[derive(clap::Args, Debug, Clone)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["file", "discover"]))]
pub struct AppsArgs {
    /// YAML file listing the apps (`apps:` then `- app-id: …` entries with namespace,
    /// template or image, target, batch-size, driver-pod, state-file, state-store). The
    /// global flags are every app's defaults.
    #[arg(long, env = "PODALLOC_APPS_FILE", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Manage every app whose driver pod matches this label selector (e.g.
    /// `spark-role=driver`) and carries the annotation podalloc.io/executors=N (the target;
    /// optional podalloc.io/batch-size and podalloc.io/executor-template, a ConfigMap name
    /// with the template under `template.yaml`). The app id is the driver's
    /// spark-app-selector label; executors are owned by their driver. An app that already
    /// has a home in the namespace (ExecutorSet, state ConfigMap) keeps its state there.
    #[arg(long, env = "PODALLOC_DISCOVER", value_name = "SELECTOR")]
    pub discover: Option<String>,
    /// Directory of the apps' state files: DIR/<namespace>/<app id>.json [default: as
    /// --state-file's default].
    #[arg(long, env = "PODALLOC_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Keep each app's state in the ConfigMap PREFIX-<app id> of its namespace instead of
    /// a file (what replicas under --leader-elect share), unless its apps-file entry says.
    #[arg(long, env = "PODALLOC_STATE_CONFIGMAPS", value_name = "PREFIX", conflicts_with = "state_dir", value_parser = parse_prefix)]
    pub state_configmaps: Option<String>,
    /// Time between an app's ticks while something is in flight (creates not yet seen,
    /// pending pods, a batch to make, a back-off, queued requests), and between lists of the
    /// driver pods with --discover [default: --batch-delay].
    #[arg(long, env = "PODALLOC_INTERVAL", value_name = "DURATION", value_parser = parse_duration)]
    pub interval: Option<std::time::Duration>,
    /// Time between an app's ticks at rest (converged, nothing queued), as `run`'s. A
    /// steering request (file store), a signal, a deadline of the app's plan, or (with
    /// --discover) a change of its driver's annotations or phase wakes it sooner.
    #[arg(long, env = "PODALLOC_IDLE_INTERVAL", value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub idle_interval: std::time::Duration,
    /// Exit once every app still managed has converged (exit 0, or the first failed app's
    /// exit code).
    #[arg(long, env = "PODALLOC_UNTIL_CONVERGED", value_parser = clap::builder::BoolishValueParser::new())]
    pub until_converged: bool,
    /// One pass over the apps, then exit (for cron).
    #[arg(long, conflicts_with = "until_converged")]
    pub once: bool,
    /// Give up after this long (exit 5 with --until-converged if not converged).
    #[arg(long, env = "PODALLOC_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Leader election, as `run --leader-elect`: one Lease (default `podalloc-apps`) for
    /// every app of the process; only its holder ticks.
    #[command(flatten)]
    pub leader: LeaderElectArgs,
    /// Log an app's tick summary line when something changed, else only this often (a
    /// heartbeat); unchanged ticks log at debug level.
    #[arg(long, env = "PODALLOC_LOG_EVERY", value_name = "DURATION", value_parser = parse_duration, default_value = "5m")]
    pub log_every: std::time::Duration,
}

/// `--state-configmaps PREFIX`: a DNS-1123 subdomain of at most 200 characters (the app id
/// is added). Errors: a message naming the rule.
fn parse_prefix(s: &str) -> Result<String, String> {
    if s.len() <= 200 && crate::engine::podspec::validate_dns1123_subdomain("", s).is_ok() {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a valid ConfigMap name prefix (lower-case letters, digits, '-' and \
             '.', at most 200, alphanumeric at both ends)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The help text `args` prints (`-h` or `--help` among them).
    fn help(args: &[&str]) -> String {
        let e = command()
            .try_get_matches_from(std::iter::once("podalloc").chain(args.iter().copied()))
            .expect_err("help was asked for");
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{args:?}");
        e.render().to_string()
    }

    /// Checks that the help text `text` (of `what`) lists each of `flags`.
    fn assert_lists(what: &str, text: &str, flags: &[&str]) {
        for flag in flags {
            assert!(text.contains(flag), "{what} lacks {flag}:\n{text}");
        }
    }

    #[test]
    fn short_help_shows_the_commands_own_flags_and_the_globals_that_matter() {
        let reconcile = help(&["reconcile", "-h"]);
        let own = [
            "--target",
            "--dry-run",
            "--app-id",
            "--kubeconfig",
            "--template",
        ];
        assert_lists("reconcile -h", &reconcile, &own);
        for flag in ["--token ", "--max-pending", "--log-format", "--client-key"] {
            assert!(!reconcile.contains(flag), "reconcile -h shows {flag}");
        }
        let sim = help(&["sim", "-h"]);
        assert!(sim.contains("--fault") && sim.contains("--token"), "{sim}");
        for offline in [
            &["sim", "-h"][..],
            &["man", "-h"],
            &["completions", "-h"],
            &["plan", "-h"],
        ] {
            let text = help(offline);
            for flag in [
                "--batch-size",
                "--kubeconfig",
                "--namespace",
                "--template",
                "--simulate",
            ] {
                // The whole flag: `sim`'s own `--namespaces` is not `--namespace`.
                let shown = text.match_indices(flag).any(|(i, _)| {
                    !text[i + flag.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
                });
                assert!(!shown, "{offline:?} shows {flag}:\n{text}");
            }
        }
        assert!(help(&["plan", "-h"]).contains("--app-id"));
        assert!(help(&["man", "-h"]).lines().count() < 15);
        // The loops' endpoints (issue 30: trial findings: only `--help` showed them, while
        // the HA recipe relies on them), and only theirs.
        let endpoints = ["--metrics-bind-address", "--health-probe-bind-address"];
        for cmd in ["run", "apps"] {
            assert_lists(&format!("{cmd} -h"), &help(&[cmd, "-h"]), &endpoints);
        }
        for flag in endpoints {
            assert!(!reconcile.contains(flag), "reconcile -h shows {flag}");
        }
    }

    #[test]
    fn long_help_still_lists_every_flag() {
        for args in [
            &["--help"][..],
            &["reconcile", "--help"],
            &["sim", "--help"],
        ] {
            let text = help(args);
            let flags = [
                "--batch-size",
                "--token-file",
                "--max-pending",
                "--log-format",
            ];
            assert_lists(&format!("{args:?}"), &text, &flags);
        }
    }

    #[test]
    fn hidden_globals_parse_before_and_after_the_command() {
        for args in [
            &[
                "podalloc",
                "--max-pending",
                "3",
                "--token",
                "t",
                "reconcile",
            ][..],
            &[
                "podalloc",
                "reconcile",
                "--max-pending",
                "3",
                "--token",
                "t",
            ],
        ] {
            let cli = parse_from(args).unwrap();
            assert_eq!(cli.app.max_pending, Some(3));
            assert_eq!(cli.conn.token.as_deref(), Some("t"));
            let derived = Cli::try_parse_from(args).unwrap();
            assert_eq!(format!("{cli:?}"), format!("{derived:?}"));
        }
        // `sim --token` is the simulator's own flag: parsed as the derived parser does.
        let args = ["podalloc", "--token", "a", "sim", "--token", "b"];
        let (ours, derived) = (
            parse_from(args).unwrap(),
            Cli::try_parse_from(args).unwrap(),
        );
        assert_eq!(ours.conn.token, derived.conn.token);
        assert!(matches!(ours.command, Command::Sim(ref s) if s.token.as_deref() == Some("b")));
        let cli = parse_from(["podalloc", "sim", "--batch-size", "7"]).unwrap();
        assert_eq!(cli.app.batch_size, BatchSize::Fixed(7));
    }

    #[test]
    fn command_passes_clap_debug_asserts() {
        command().debug_assert();
    }
}
