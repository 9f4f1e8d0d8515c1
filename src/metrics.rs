//! `--metrics-file`: Prometheus text exposition format, written atomically after every tick
//! (node_exporter's textfile-collector convention: write a temp file in the same directory,
//! then rename, so the collector never reads half a file). The path must be a regular file or
//! not exist: a symbolic link, FIFO, socket, device or directory there is refused
//! ([`check_path`]), as for the state file — the rename would replace a link, never write
//! through it, but a link there says the file is meant to be somewhere else.

use crate::alloc::AllocatorState;
use crate::reconcile::TickReport;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

/// Renders the metrics after a tick for `app` in `namespace`. Gauges: target, running,
/// pending, unacknowledged, failed (from `report`; absent when the tick failed before it
/// saw the cluster), whether the tick succeeded, tick duration (s), last successful tick
/// (Unix s). Counters (totals kept in the state): executors created/deleted, API errors by
/// code.
pub fn render(
    app: &str,
    namespace: &str,
    report: Option<&TickReport>,
    state: &AllocatorState,
    tick_duration: Duration,
) -> String {
    let labels = format!(
        "app=\"{}\",namespace=\"{}\"",
        escape(app),
        escape(namespace)
    );
    let c = &state.counters;
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
        );
    };
    let target = report.map(|r| r.plan.summary.target).or(state.target);
    if let Some(t) = target {
        metric(
            "podalloc_target",
            "gauge",
            "Total expected executors.",
            t.to_string(),
        );
    }
    if let Some(r) = report {
        let s = &r.plan.summary;
        metric(
            "podalloc_running",
            "gauge",
            "Running executors.",
            s.running.to_string(),
        );
        metric(
            "podalloc_pending",
            "gauge",
            "Pending executors.",
            s.pending.to_string(),
        );
        metric(
            "podalloc_unacknowledged",
            "gauge",
            "Executors created but not yet seen in a snapshot.",
            r.unacknowledged.to_string(),
        );
        metric(
            "podalloc_failed",
            "gauge",
            "Failed executors in the last snapshot.",
            s.failed.to_string(),
        );
    }
    let ok = report.is_some_and(|r| r.error.is_none());
    metric(
        "podalloc_tick_success",
        "gauge",
        "1 if the last tick finished without error, else 0.",
        u8::from(ok).to_string(),
    );
    metric(
        "podalloc_executors_created_total",
        "counter",
        "Executor pods created.",
        c.created.to_string(),
    );
    metric(
        "podalloc_executors_deleted_total",
        "counter",
        "Executor pods deleted.",
        c.deleted.to_string(),
    );
    metric(
        "podalloc_tick_duration_seconds",
        "gauge",
        "Duration of the last tick.",
        format!("{:.6}", tick_duration.as_secs_f64()),
    );
    metric(
        "podalloc_last_successful_tick_timestamp_seconds",
        "gauge",
        "When the last tick without error ended (Unix time).",
        c.last_success_ms
            .map_or("0".into(), |ms| format!("{:.3}", ms as f64 / 1000.0)),
    );
    let _ = writeln!(
        out,
        "# HELP podalloc_api_errors_total API error responses by HTTP code.\n# TYPE podalloc_api_errors_total counter"
    );
    for (code, n) in &c.api_errors {
        let _ = writeln!(
            out,
            "podalloc_api_errors_total{{{labels},code=\"{}\"}} {n}",
            escape(code)
        );
    }
    out
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
pub fn check_path(path: &Path) -> Result<(), String> {
    let what = match crate::state::irregular_at(path) {
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
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
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
