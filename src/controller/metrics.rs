//! `--metrics-file`: Prometheus text exposition format, written atomically after every tick
//! (node_exporter's textfile-collector convention: write a temp file in the same directory,
//! then rename, so the collector never reads half a file). The path must be a regular file or
//! not exist: a symbolic link, FIFO, socket, device or directory there is refused
//! ([`check_path`]), as for the state file — the rename would replace a link, never write
//! through it, but a link there says the file is meant to be somewhere else.

use crate::controller::tick::TickReport;
use crate::engine::alloc::AllocatorState;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

/// Renders the metrics after a tick for `app` in `namespace`. Gauges: target, running,
/// pending, unacknowledged, failed (from `report`; absent when the tick failed before it
/// saw the cluster), whether the tick succeeded, tick duration (s), last successful tick
/// (Unix s). Counters (totals kept in the state): executors created/deleted, API errors by
/// code. With `leader` (`run --leader-elect`: whether this process leads and how many
/// times that changed), the leader-election series too, with the app's labels; `apps`
/// passes none, its one Lease being every app's ([`render_leadership`]).
pub(crate) fn render(
    app: &str,
    namespace: &str,
    report: Option<&TickReport>,
    state: &AllocatorState,
    tick_duration: Duration,
    leader: Option<(bool, u64)>,
) -> String {
    let mut e = Exposition::new(app, namespace);
    let c = &state.counters;
    cluster_gauges(&mut e, report, state);
    let ok = report.is_some_and(|r| r.error.is_none());
    leader_metrics(&mut e, leader);
    e.metric(
        "podalloc_tick_success",
        "gauge",
        "1 if the last tick finished without error, else 0.",
        u8::from(ok),
    );
    e.metric(
        "podalloc_executors_created_total",
        "counter",
        "Executor pods created.",
        c.created,
    );
    e.metric(
        "podalloc_executors_deleted_total",
        "counter",
        "Executor pods deleted.",
        c.deleted,
    );
    backoff_metrics(&mut e, state);
    e.metric(
        "podalloc_tick_duration_seconds",
        "gauge",
        "Duration of the last tick.",
        format!("{:.6}", tick_duration.as_secs_f64()),
    );
    e.metric(
        "podalloc_last_successful_tick_timestamp_seconds",
        "gauge",
        "When the last tick without error ended (Unix time).",
        c.last_success_ms
            .map_or("0".into(), |ms| format!("{:.3}", ms as f64 / 1000.0)),
    );
    let _ = writeln!(
        e.out,
        "# HELP podalloc_api_errors_total API error responses by HTTP code.\n# TYPE podalloc_api_errors_total counter"
    );
    for (code, n) in &c.api_errors {
        let _ = writeln!(
            e.out,
            "podalloc_api_errors_total{{{},code=\"{}\"}} {n}",
            e.labels,
            escape(code)
        );
    }
    e.out
}

/// The process's API requests since it started, by verb, resource and code
/// ([`ClientStats::requests_by`]: the tick's client and the Lease and Events clients derived
/// from it), as `podalloc_api_requests_total{verb,resource,code}`: one family, no app
/// labels (one client serves every app of the process). Empty before the first request.
pub(crate) fn render_requests(stats: &crate::kube::ClientStats) -> String {
    let mut out = String::from(
        "# HELP podalloc_api_requests_total API requests sent (retries included) by verb, resource and HTTP code (<error>: no HTTP answer).\n# TYPE podalloc_api_requests_total counter\n",
    );
    for ((verb, resource, code), n) in &stats.requests_by {
        let _ = writeln!(
            out,
            "podalloc_api_requests_total{{verb=\"{verb}\",resource=\"{resource}\",code=\"{}\"}} {n}",
            escape(code)
        );
    }
    out
}

/// The creation back-off of the saved state: its end (Unix s, 0 without one) and the
/// refusals in a row that made it, labelled with its cause (`quota`, `refused`,
/// `rejected`), so an alert can ask for `podalloc_create_backoff_refusals > 3`.
fn backoff_metrics(e: &mut Exposition, state: &AllocatorState) {
    let b = state.create_backoff.as_ref();
    e.metric(
        "podalloc_create_backoff_until_timestamp_seconds",
        "gauge",
        "No executor is created before this time (Unix s; 0: no back-off): refused creates or kubelet rejections back off 10s doubling to 6m.",
        b.map_or("0".into(), |b| format!("{:.3}", b.until_ms as f64 / 1000.0)),
    );
    let _ = writeln!(
        e.out,
        "# HELP podalloc_create_backoff_refusals Refusals in a row behind the creation back-off (label cause; 0: none).\n\
         # TYPE podalloc_create_backoff_refusals gauge\n\
         podalloc_create_backoff_refusals{{{},cause=\"{}\"}} {}",
        e.labels,
        b.map_or("none", |b| b.cause.as_str()),
        b.map_or(0, |b| b.refusals)
    );
}

/// The text being written, and the labels every sample carries (none: the process's own
/// series).
struct Exposition {
    labels: String,
    out: String,
}

impl Exposition {
    /// An empty text whose samples carry no labels: the process's own series.
    fn process() -> Exposition {
        Exposition {
            labels: String::new(),
            out: String::new(),
        }
    }

    /// An empty text whose samples carry `app` and `namespace` as labels.
    fn new(app: &str, namespace: &str) -> Exposition {
        Exposition {
            labels: format!(
                "app=\"{}\",namespace=\"{}\"",
                escape(app),
                escape(namespace)
            ),
            out: String::new(),
        }
    }

    /// One metric with one sample: its HELP and TYPE lines, then `name{labels} value`
    /// (`name value` without labels).
    fn metric(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        let labels = match self.labels.as_str() {
            "" => String::new(),
            l => format!("{{{l}}}"),
        };
        let _ = writeln!(
            self.out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{labels} {value}"
        );
    }
}

/// The gauges of what the tick saw: the target (the state's when the tick failed early), and
/// the executors by state when the tick got that far.
fn cluster_gauges(e: &mut Exposition, report: Option<&TickReport>, state: &AllocatorState) {
    let target = report.map(|r| r.plan.summary.target).or(state.target);
    if let Some(t) = target {
        e.metric("podalloc_target", "gauge", "Total expected executors.", t);
    }
    let Some(r) = report else {
        return;
    };
    let s = &r.plan.summary.counts;
    e.metric("podalloc_running", "gauge", "Running executors.", s.running);
    e.metric("podalloc_pending", "gauge", "Pending executors.", s.pending);
    e.metric(
        "podalloc_unacknowledged",
        "gauge",
        "Executors created but not yet seen in a snapshot.",
        r.unacknowledged,
    );
    e.metric(
        "podalloc_failed",
        "gauge",
        "Failed executors in the last snapshot.",
        s.failed,
    );
    // Why nothing is created while the target is not reached: one series, labelled with
    // the plan's reason (waiting, max-pending, backoff, crash-loop, driver-pending,
    // ids-exhausted), 1 while blocked, 0 otherwise.
    let reason = r.plan.blocked.as_ref().map(|b| {
        let v = serde_json::to_value(b).unwrap_or_default();
        v["reason"].as_str().unwrap_or("unknown").to_string()
    });
    let _ = writeln!(
        e.out,
        "# HELP podalloc_creation_blocked 1 while the target is not reached and no executor can be created (label reason).\n\
         # TYPE podalloc_creation_blocked gauge\n\
         podalloc_creation_blocked{{{},reason=\"{}\"}} {}",
        e.labels,
        reason.as_deref().unwrap_or("none"),
        u8::from(reason.is_some())
    );
}

/// Label value escaping of the exposition format: backslash, double quote, newline.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Refuses a `--metrics-file` path that exists and is not a regular file (a symbolic link,
/// FIFO, socket, device or directory), without following a link.
///
/// Errors: one line naming the path and what is there.
pub(crate) fn check_path(path: &Path) -> Result<(), String> {
    let what = match crate::store::file::irregular_at(path) {
        Ok(None) if path.is_dir() => Some("a directory"),
        Ok(what) => what,
        Err(e) => return Err(format!("metrics file {}: {e}", path.display())),
    };
    match what {
        Some(what) => Err(format!(
            "metrics file {} is {what}, not a regular file; podalloc does not follow or \
             replace it: remove it or choose another --metrics-file",
            path.display()
        )),
        None => Ok(()),
    }
}

/// Writes `text` to `path` atomically (temp file in the same directory, fsync, rename),
/// mode 0644 so a collector running as another user can read it. The path is checked with
/// [`check_path`] first.
///
/// Errors: the I/O error, naming nothing (the caller names the file), or [`check_path`]'s.
pub(crate) fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    check_path(path).map_err(std::io::Error::other)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".podalloc-metrics-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The leader-election series (`podalloc_is_leader`, `podalloc_leader_transitions_total`)
/// of `leader`: whether this process leads, and how many times that changed (became leader
/// or stopped leading) since it started, as the election reports them
/// (`LeaderElection::leadership`); nothing without an election.
fn leader_metrics(e: &mut Exposition, leader: Option<(bool, u64)>) {
    let Some((leading, transitions)) = leader else {
        return;
    };
    e.metric(
        IS_LEADER,
        "gauge",
        "1 while this process holds the leader lease and acts (--leader-elect), else 0.",
        u8::from(leading).to_string(),
    );
    e.metric(
        LEADER_TRANSITIONS,
        "counter",
        "Times this process became the leader or stopped leading.",
        transitions.to_string(),
    );
}

/// The leadership gauge's name.
const IS_LEADER: &str = "podalloc_is_leader";

/// The leadership transitions counter's name.
const LEADER_TRANSITIONS: &str = "podalloc_leader_transitions_total";

/// The metrics of a process that does not lead (`run --leader-elect` on standby, which
/// does not tick): the leader-election metrics of `leader` only, for `app` in `namespace`.
pub(crate) fn render_standby(app: &str, namespace: &str, leader: (bool, u64)) -> String {
    let mut e = Exposition::new(app, namespace);
    leader_metrics(&mut e, Some(leader));
    e.out
}

/// The leader-election metrics of a process whose one Lease is every app's (`apps`, with
/// `--leader-elect` or its claim), without app labels, as the process's API requests are
/// ([`render_requests`]): `podalloc_is_leader 0` on a standby, which knows no app (it
/// neither ticks nor discovers), and `1` beside its apps' own series once it leads.
pub(crate) fn render_leadership(leader: (bool, u64)) -> String {
    let mut e = Exposition::process();
    leader_metrics(&mut e, Some(leader));
    e.out
}

/// `text` (as [`render`], [`render_standby`] or [`render_leadership`] make it) with the
/// values of its leader-election samples (`podalloc_is_leader`,
/// `podalloc_leader_transitions_total`, whatever their labels) replaced by `leader`'s, and
/// every other line as it is. `/metrics` answers through it with the election's leadership
/// at that moment, so a scrape never shows the leadership of the last tick, which may be an
/// idle interval old.
pub(crate) fn with_leadership(text: &str, (leading, transitions): (bool, u64)) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let sample = |name: &str| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        };
        let value = match line.rsplit_once(' ') {
            Some((series, _)) if sample(IS_LEADER) => Some((series, u64::from(leading))),
            Some((series, _)) if sample(LEADER_TRANSITIONS) => Some((series, transitions)),
            _ => None,
        };
        match value {
            Some((series, v)) => {
                let _ = writeln!(out, "{series} {v}");
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leadership_of_the_scrape_replaces_the_rendered_one_and_nothing_else() {
        let mut state = AllocatorState::new();
        state.target = Some(2);
        let app = |leader| render("etl", "ns", None, &state, Duration::ZERO, Some(leader));
        let (then, now) = ((true, 1), (false, 2));
        assert_eq!(with_leadership(&app(then), now), app(now));
        assert_eq!(
            with_leadership(&render_leadership(then), now),
            render_leadership(now)
        );
        assert!(render_leadership(now).ends_with("\npodalloc_leader_transitions_total 2\n"));
        let unrelated = "podalloc_is_leader_other{app=\"a\"} 1\n";
        assert_eq!(with_leadership(unrelated, now), unrelated);
    }

    /// The unlabeled sample lines of `name` in `text`, and how many labeled ones it has.
    fn samples<'t>(text: &'t str, name: &str) -> (Vec<&'t str>, usize) {
        let bare = text.lines().filter(|l| l.starts_with(&format!("{name} ")));
        let labeled = text.lines().filter(|l| l.starts_with(&format!("{name}{{")));
        (bare.collect(), labeled.count())
    }

    /// `apps` (issue 30: trial findings): its apps' texts carry no leadership series, so
    /// `/metrics` and `--metrics-file` show the process's unlabeled pair alone, never one per
    /// app beside it (a `sum(podalloc_is_leader)` counted N+1 leaders, and the file kept the
    /// apps' `1` after the process's said `0`); `run`'s keep the app's labels.
    #[test]
    fn apps_texts_carry_the_process_s_leadership_alone() {
        let state = AllocatorState::new();
        let app = |name| render(name, "batch", None, &state, Duration::ZERO, None);
        let (a, b) = (app("app-drv1"), app("app-drv2"));
        let process = render_leadership((false, 3));
        let texts = [a.as_str(), b.as_str(), process.as_str()];
        let merged = crate::controller::serve::merge_families(texts.into_iter());
        for text in [merged.clone(), with_leadership(&merged, (true, 4))] {
            let (lines, labeled) = samples(&text, IS_LEADER);
            assert_eq!((lines.len(), labeled), (1, 0), "{text}");
            let (lines, labeled) = samples(&text, LEADER_TRANSITIONS);
            assert_eq!((lines.len(), labeled), (1, 0), "{text}");
        }
        assert!(samples(&merged, IS_LEADER).0 == ["podalloc_is_leader 0"]);
        let run = render("etl", "ns", None, &state, Duration::ZERO, Some((true, 1)));
        assert!(run.contains("\npodalloc_is_leader{app=\"etl\",namespace=\"ns\"} 1\n"));
    }

    #[test]
    fn a_tick_that_failed_before_listing_renders_the_state_totals() {
        let mut state = AllocatorState::new();
        state.target = Some(4);
        state.counters.created = 3;
        state.counters.deleted = 1;
        state.counters.last_success_ms = Some(1_700_000_000_500);
        state.counters.api_errors.insert("503".into(), 2);
        let text = render(
            "a\"b",
            "ns",
            None,
            &state,
            Duration::from_millis(1500),
            None,
        );
        let l = r#"app="a\"b",namespace="ns""#;
        let expected = format!(
            "# HELP podalloc_target Total expected executors.\n# TYPE podalloc_target gauge\n\
             podalloc_target{{{l}}} 4\n\
             # HELP podalloc_tick_success 1 if the last tick finished without error, else 0.\n\
             # TYPE podalloc_tick_success gauge\npodalloc_tick_success{{{l}}} 0\n\
             # HELP podalloc_executors_created_total Executor pods created.\n\
             # TYPE podalloc_executors_created_total counter\n\
             podalloc_executors_created_total{{{l}}} 3\n\
             # HELP podalloc_executors_deleted_total Executor pods deleted.\n\
             # TYPE podalloc_executors_deleted_total counter\n\
             podalloc_executors_deleted_total{{{l}}} 1\n\
             # HELP podalloc_create_backoff_until_timestamp_seconds No executor is created \
             before this time (Unix s; 0: no back-off): refused creates or kubelet rejections \
             back off 10s doubling to 6m.\n\
             # TYPE podalloc_create_backoff_until_timestamp_seconds gauge\n\
             podalloc_create_backoff_until_timestamp_seconds{{{l}}} 0\n\
             # HELP podalloc_create_backoff_refusals Refusals in a row behind the creation \
             back-off (label cause; 0: none).\n\
             # TYPE podalloc_create_backoff_refusals gauge\n\
             podalloc_create_backoff_refusals{{{l},cause=\"none\"}} 0\n\
             # HELP podalloc_tick_duration_seconds Duration of the last tick.\n\
             # TYPE podalloc_tick_duration_seconds gauge\n\
             podalloc_tick_duration_seconds{{{l}}} 1.500000\n\
             # HELP podalloc_last_successful_tick_timestamp_seconds When the last tick without \
             error ended (Unix time).\n\
             # TYPE podalloc_last_successful_tick_timestamp_seconds gauge\n\
             podalloc_last_successful_tick_timestamp_seconds{{{l}}} 1700000000.500\n\
             # HELP podalloc_api_errors_total API error responses by HTTP code.\n\
             # TYPE podalloc_api_errors_total counter\n\
             podalloc_api_errors_total{{{l},code=\"503\"}} 2\n"
        );
        assert_eq!(text, expected);
    }
}
