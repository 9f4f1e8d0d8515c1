//! `--metrics-bind-address` and `--health-probe-bind-address`: the endpoints a platform
//! scrapes and probes, as controller-runtime serves them (its `metrics.bindAddress` and
//! `healthProbeBindAddress`). Both are opt-in; the `--metrics-file` textfile stays for cron.
//!
//! - `GET /metrics` (on the metrics address): Prometheus text format 0.0.4, the textfile's
//!   metric names, one series per app (`app`, `namespace` labels: target, executors by
//!   state, ticks, API errors by code, leadership), families merged across apps so each
//!   `# HELP`/`# TYPE` appears once; and the process's API requests by verb, resource and
//!   code (`podalloc_api_requests_total`, no app labels: one client serves every app).
//! - `GET /healthz` (liveness, on the probe address): 200 `ok` while the loop has finished a
//!   pass (a tick, or a standby's look at the Lease) within its stuck limit, else 500 naming
//!   how long it has been. A loop stuck past its watchdog is what a kubelet should restart.
//! - `GET /readyz` (readiness): 200 once a pass has reached the API server with the state
//!   loaded (or, for a standby, the Lease read), 503 before that and while shutting down.
//!
//! The servers run on threads of their own (`tiny_http`, blocking); the loop stays
//! synchronous and only updates a [`Probe`] (one mutex) after each pass.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the endpoints report, updated by the loop: cheap to clone (one `Arc`).
#[derive(Clone)]
pub(crate) struct Probe {
    inner: Arc<Mutex<Live>>,
}

struct Live {
    /// Per app (key `namespace/app`): the latest rendered exposition text of that app.
    metrics: BTreeMap<String, String>,
    /// When the loop last finished a pass (or started, before the first).
    last_pass: Instant,
    /// Liveness fails once no pass has finished for this long.
    stuck_after: Duration,
    /// Why the process is not ready (`None`: ready).
    not_ready: Option<String>,
}

fn lock(m: &Mutex<Live>) -> MutexGuard<'_, Live> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Probe {
    /// A probe for a loop whose passes may take up to `stuck_after` apart before liveness
    /// fails (the caller's watchdog limit plus its longest sleep); not ready yet.
    pub(crate) fn new(stuck_after: Duration) -> Probe {
        Probe {
            inner: Arc::new(Mutex::new(Live {
                metrics: BTreeMap::new(),
                last_pass: Instant::now(),
                stuck_after,
                not_ready: Some("no pass has reached the API server yet".into()),
            })),
        }
    }

    /// Replaces app `namespace/app`'s exposition text (as `metrics::render` makes it);
    /// both empty: the process's own series.
    pub(crate) fn set_app_metrics(&self, namespace: &str, app: &str, text: String) {
        let key = if namespace.is_empty() && app.is_empty() {
            String::new()
        } else {
            format!("{namespace}/{app}")
        };
        lock(&self.inner).metrics.insert(key, text);
    }

    /// The loop finished a pass; `ready`: it reached the API server with its state loaded
    /// (`Err` says why not, for `/readyz`).
    pub(crate) fn pass_finished(&self, ready: Result<(), String>) {
        let mut l = lock(&self.inner);
        l.last_pass = Instant::now();
        l.not_ready = ready.err();
    }

    /// The process's own series (`metrics::render_requests`), for `/metrics` beside the
    /// apps' (under the empty key, which sorts before every `namespace/app`: the process's
    /// families first).
    pub(crate) fn set_process_metrics(&self, text: String) {
        self.set_app_metrics("", "", text);
    }

    /// The loop is alive (a wait between ticks ended): liveness only, readiness unchanged.
    pub(crate) fn alive(&self) {
        lock(&self.inner).last_pass = Instant::now();
    }

    /// The process is shutting down: not ready from now on.
    pub(crate) fn stopping(&self) {
        lock(&self.inner).not_ready = Some("shutting down".into());
    }

    /// The answer to `GET path`: (HTTP status, body, content type).
    fn answer(&self, path: &str) -> (u16, String, &'static str) {
        const TEXT: &str = "text/plain; charset=utf-8";
        let l = lock(&self.inner);
        match path.split('?').next().unwrap_or("") {
            "/metrics" => {
                let body = merge_families(l.metrics.values().map(String::as_str));
                (200, body, "text/plain; version=0.0.4; charset=utf-8")
            }
            "/healthz" | "/livez" => {
                let age = l.last_pass.elapsed();
                if age <= l.stuck_after {
                    (200, "ok\n".into(), TEXT)
                } else {
                    let msg = format!(
                        "the loop has not finished a pass for {:.0}s (stuck after {}s)\n",
                        age.as_secs_f64(),
                        l.stuck_after.as_secs()
                    );
                    (500, msg, TEXT)
                }
            }
            "/readyz" => match &l.not_ready {
                None => (200, "ok\n".into(), TEXT),
                Some(why) => (503, format!("not ready: {why}\n"), TEXT),
            },
            _ => (
                404,
                "not found: try /metrics, /healthz or /readyz\n".into(),
                TEXT,
            ),
        }
    }
}

/// Prometheus text of several renderings merged by family: a family's `# HELP` and `# TYPE`
/// lines once, then every sample of it from every text, identical samples once (the leader
/// series every app's text carries). Families keep their first-seen order.
pub(crate) fn merge_families<'a>(texts: impl Iterator<Item = &'a str>) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut fams: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for text in texts {
        let mut current = String::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let meta = line
                .strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "));
            if let Some(rest) = meta {
                current = rest.split(' ').next().unwrap_or("").to_string();
            }
            let entry = fams.entry(current.clone()).or_insert_with(|| {
                order.push(current.clone());
                (Vec::new(), Vec::new())
            });
            let list = if meta.is_some() {
                &mut entry.0
            } else {
                &mut entry.1
            };
            if !list.iter().any(|l| l == line) {
                list.push(line.to_string());
            }
        }
    }
    let mut out = String::new();
    for name in &order {
        let (meta, samples) = &fams[name];
        for l in meta.iter().chain(samples) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Starts the endpoints the flags ask for (`metrics`: `--metrics-bind-address`, `probes`:
/// `--health-probe-bind-address`; a bare `:PORT` listens on every address), with a
/// liveness limit of `stuck_after`; `None` when neither is given. The [`Probe`] returned
/// feeds them from then on (the process's services keep it).
///
/// Errors: an address that cannot be bound, naming its flag.
pub(crate) fn serve(
    metrics: Option<&str>,
    probes: Option<&str>,
    stuck_after: Duration,
) -> Result<Option<(Endpoints, Probe)>, String> {
    if metrics.is_none() && probes.is_none() {
        return Ok(None);
    }
    let any = |a: &str| match a.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => a.to_string(),
    };
    let (m, p) = (metrics.map(any), probes.map(any));
    let probe = Probe::new(stuck_after);
    let e = start(m.as_deref(), p.as_deref(), &probe)?;
    for a in &e.bound {
        log::info!("serving http://{a} (/metrics, /healthz, /readyz as configured)");
    }
    Ok(Some((e, probe)))
}

/// The running endpoint servers; dropping them stops them.
pub(crate) struct Endpoints {
    servers: Vec<(Arc<tiny_http::Server>, Option<JoinHandle<()>>)>,
    /// The addresses bound (a port 0 in the flag becomes the port the system chose).
    pub(crate) bound: Vec<std::net::SocketAddr>,
}

/// Starts a server for each address given: `metrics` serves `/metrics`, `probes` serves
/// `/healthz` and `/readyz` (the same address for both serves all three).
///
/// Errors: an address that cannot be bound (in use, not local, malformed), naming the flag.
pub(crate) fn start(
    metrics: Option<&str>,
    probes: Option<&str>,
    probe: &Probe,
) -> Result<Endpoints, String> {
    let mut e = Endpoints {
        servers: Vec::new(),
        bound: Vec::new(),
    };
    // One address given twice is one server for all three paths (port 0, "any free port",
    // is two servers).
    let same = metrics.is_some_and(|m| !m.ends_with(":0")) && metrics == probes;
    let wanted = [
        (metrics, "--metrics-bind-address", Serves::Metrics),
        (
            probes.filter(|_| !same),
            "--health-probe-bind-address",
            Serves::Probes,
        ),
    ];
    for (addr, flag, mut serves) in wanted {
        let Some(addr) = addr else { continue };
        if same {
            serves = Serves::All;
        }
        let server = tiny_http::Server::http(addr)
            .map_err(|err| format!("{flag} {addr:?}: cannot listen there: {err}"))?;
        let server = Arc::new(server);
        if let Some(a) = server.server_addr().to_ip() {
            e.bound.push(a);
        }
        let (s, p) = (Arc::clone(&server), probe.clone());
        let handle = std::thread::Builder::new()
            .name(format!("podalloc {flag}"))
            .spawn(move || answer_requests(&s, &p, serves))
            .map_err(|err| format!("{flag}: cannot start its thread: {err}"))?;
        e.servers.push((server, Some(handle)));
    }
    Ok(e)
}

/// Which paths one server answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Serves {
    Metrics,
    Probes,
    All,
}

fn answer_requests(server: &tiny_http::Server, probe: &Probe, serves: Serves) {
    for req in server.incoming_requests() {
        let path = req.url().to_string();
        let allowed = match serves {
            Serves::All => true,
            Serves::Metrics => path.starts_with("/metrics"),
            Serves::Probes => !path.starts_with("/metrics"),
        };
        let (code, body, ctype) = match (req.method(), allowed) {
            (tiny_http::Method::Get | tiny_http::Method::Head, true) => probe.answer(&path),
            (_, true) => (405, "only GET\n".into(), "text/plain"),
            (_, false) => (404, "not served on this address\n".into(), "text/plain"),
        };
        let header = tiny_http::Header::from_bytes("Content-Type", ctype).expect("valid header");
        let resp = tiny_http::Response::from_string(body)
            .with_status_code(code)
            .with_header(header);
        if let Err(err) = req.respond(resp) {
            log::debug!("endpoint {path}: cannot answer: {err}");
        }
    }
}

impl Drop for Endpoints {
    fn drop(&mut self) {
        for (s, h) in &mut self.servers {
            s.unblock();
            if let Some(h) = h.take() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut r = agent.get(format!("http://{addr}{path}")).call().unwrap();
        let code = r.status().as_u16();
        (code, r.body_mut().read_to_string().unwrap())
    }

    #[test]
    fn families_merge_across_apps_with_one_help_and_type_each() {
        let a = "# HELP m x\n# TYPE m gauge\nm{app=\"a\"} 1\n# HELP l y\n# TYPE l gauge\nl 1\n";
        let b = "# HELP m x\n# TYPE m gauge\nm{app=\"b\"} 2\n# HELP l y\n# TYPE l gauge\nl 1\n";
        let got = merge_families([a, b].into_iter());
        assert_eq!(
            got,
            "# HELP m x\n# TYPE m gauge\nm{app=\"a\"} 1\nm{app=\"b\"} 2\n# HELP l y\n# TYPE l gauge\nl 1\n"
        );
    }

    #[test]
    fn probes_answer_ready_live_and_stuck() {
        let probe = Probe::new(Duration::from_millis(300));
        let e = start(Some("127.0.0.1:0"), Some("127.0.0.1:0"), &probe).unwrap();
        let (m, p) = (e.bound[0], e.bound[1]);
        assert_eq!(get(p, "/healthz"), (200, "ok\n".into()));
        let (code, body) = get(p, "/readyz");
        assert_eq!(code, 503, "{body}");
        probe.set_app_metrics(
            "ns",
            "a",
            "# HELP m x\n# TYPE m gauge\nm{app=\"a\"} 1\n".into(),
        );
        probe.pass_finished(Ok(()));
        assert_eq!(get(p, "/readyz"), (200, "ok\n".into()));
        assert!(get(m, "/metrics").1.contains("m{app=\"a\"} 1"));
        assert_eq!(
            get(m, "/healthz").0,
            404,
            "probes are not on the metrics address"
        );
        assert_eq!(
            get(p, "/metrics").0,
            404,
            "metrics are not on the probe address"
        );
        std::thread::sleep(Duration::from_millis(400));
        let (code, body) = get(p, "/healthz");
        assert_eq!(code, 500, "{body}");
        assert!(body.contains("has not finished a pass"), "{body}");
        probe.stopping();
        assert_eq!(get(p, "/readyz").0, 503);
    }

    #[test]
    fn one_address_for_both_serves_all_and_a_taken_one_names_the_flag() {
        let probe = Probe::new(Duration::from_secs(60));
        let e = start(Some("127.0.0.1:0"), None, &probe).unwrap();
        let addr = e.bound[0].to_string();
        let err = start(None, Some(&addr), &probe).err().unwrap();
        assert!(err.starts_with("--health-probe-bind-address"), "{err}");
        drop(e);
        let both = start(Some("127.0.0.1:0"), Some("127.0.0.1:0"), &probe).unwrap();
        assert_eq!(both.bound.len(), 2);
    }
}
