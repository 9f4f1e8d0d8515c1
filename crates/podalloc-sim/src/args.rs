//! The command-line flags of `podalloc sim`, kept beside the server they configure.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::faults::FaultRule;
use crate::options::SimOptions;

/// The flags of `podalloc sim` (clap derive): where to listen, TLS and authentication,
/// the simulated kubelet's latencies and failures, and the faults, quota and RBAC denials
/// to inject. [`SimArgs::options`] turns them into [`SimOptions`].
#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// Address to listen on (loopback only unless you mean it).
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// Serve plain HTTP instead of HTTPS.
    #[arg(long)]
    pub http: bool,
    /// Write a kubeconfig for this server here (server, CA data, token).
    #[arg(long, value_name = "FILE")]
    pub write_kubeconfig: Option<PathBuf>,
    /// Write the generated CA certificate (PEM) here.
    #[arg(long, value_name = "FILE")]
    pub ca_out: Option<PathBuf>,
    /// Bearer token clients must send [default: a random one, written into --write-kubeconfig, else printed].
    #[arg(long, value_name = "TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Accept requests without a token.
    #[arg(long)]
    pub no_auth: bool,
    /// Time from creation to scheduled.
    #[arg(long, default_value = "200ms", value_parser = parse_duration, value_name = "DURATION")]
    pub schedule_latency: Duration,
    /// Time from scheduled to Running.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub startup_latency: Duration,
    /// Spread (0–1) of the start-up latency: each pod's is uniform in
    /// [latency × (1 − J), latency × (1 + J)], deterministic from --seed.
    #[arg(long, default_value_t = 0.0, value_name = "J", value_parser = parse_unit)]
    pub startup_jitter: f64,
    /// Share (0–1) of the pods reaching the scheduler before --unschedulable-until that
    /// stay Pending, PodScheduled=False/Unschedulable ("0/N nodes are available: N
    /// Insufficient cpu."), until then; deterministic from --seed.
    #[arg(long, default_value_t = 0.0, value_name = "P", value_parser = parse_unit)]
    pub unschedulable_fraction: f64,
    /// Time after the simulator's start when the unschedulable pods are scheduled (a node
    /// is added).
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub unschedulable_until: Duration,
    /// Probability (0–1) that a starting pod fails instead.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub failure_rate: f64,
    /// Seed for the simulated failures.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of simulated nodes (0: every pod stays Pending, Unschedulable).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub nodes: usize,
    /// Inject a fault (repeatable): VERB:FAULT[@WHEN], e.g. `create:lost-response@2,3`,
    /// `list:429-text@p=0.2`, `delete:500@always`. Verbs: list, get, create, patch, delete,
    /// deletecollection, watch (pods), and with a prefix cm-* (ConfigMaps: list, get, create, update,
    /// delete), lease-* (get, create, update, delete), ev-* (list, get, create, patch), ns-*
    /// (list, get, create). Faults: 429-text, 429-status,
    /// 500, 503, 504, 504-after-write, reset, delay:MS, lost-response, truncate, 410, garbage,
    /// html, no-kind, trickle[:MS], redirect.
    #[arg(long = "fault", value_name = "RULE", value_parser = parse_fault)]
    pub faults: Vec<FaultRule>,
    /// A ResourceQuota on the number of pods per namespace (403 "exceeded quota" beyond it).
    #[arg(long, value_name = "N")]
    pub pod_quota: Option<u64>,
    /// Verbs the simulated RBAC denies with 403 (repeatable), e.g. `create`.
    #[arg(long = "forbid", value_name = "VERB")]
    pub forbid: Vec<String>,
    /// Require TLS client certificates signed by the simulator's CA (mTLS).
    #[arg(long)]
    pub require_client_cert: bool,
    /// Delay added to every API response.
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub latency: Duration,
    /// The namespaces that exist (comma-separated): a create anywhere else is 404
    /// `namespaces "x" not found`, as on a real cluster. `kubectl create -f namespace.yaml` adds one.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "default,kube-system",
        value_name = "NS,..."
    )]
    pub namespaces: Vec<String>,
    /// An image the simulated registry does not have (repeatable): containers using it wait
    /// in ErrImagePull, then ImagePullBackOff.
    #[arg(long = "missing-image", value_name = "IMAGE")]
    pub missing_images: Vec<String>,
}

fn parse_fault(s: &str) -> Result<FaultRule, String> {
    FaultRule::parse(s).map_err(|e| e.to_string())
}

impl SimArgs {
    /// The server settings these flags ask for, with `token` as the bearer token (`None`:
    /// no authentication; the caller picks a random one when `--token` is absent).
    pub fn options(&self, token: Option<String>) -> SimOptions {
        SimOptions {
            listen: self.listen,
            tls: !self.http,
            ca_out: self.ca_out.clone(),
            token,
            schedule_latency: self.schedule_latency,
            startup_latency: self.startup_latency,
            failure_rate: self.failure_rate,
            seed: self.seed,
            nodes: self.nodes,
            faults: self.faults.clone(),
            pod_quota: self.pod_quota,
            forbid: self.forbid.clone(),
            require_client_cert: self.require_client_cert,
            latency: self.latency,
            namespaces: Some(self.namespaces.clone()),
            missing_images: self.missing_images.clone(),
            startup_jitter: self.startup_jitter,
            unschedulable_fraction: self.unschedulable_fraction,
            unschedulable_until: self.unschedulable_until,
            ..SimOptions::default()
        }
    }
}

/// Parses a number in [0, 1].
fn parse_unit(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("{s:?} is not a number between 0 and 1")),
    }
}

/// Longest duration a flag takes: 10 years (as podalloc's own duration flags).
const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Parses a humantime duration (`1s`, `250ms`, `2m`), at most 10 years.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration ({e}); use e.g. 1s, 250ms, 2m"))?;
    if d > MAX_DURATION {
        return Err(format!("{s:?} is longer than 10 years"));
    }
    Ok(d)
}
