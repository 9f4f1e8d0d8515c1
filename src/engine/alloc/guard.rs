//! The crash-loop guard (`--max-failures` within `--failure-window`, Spark's
//! `spark.executor.maxNumFailures` idea): too many executor failures in a sliding
//! window stop all creation, so a broken image or a bad configuration does not churn pods
//! forever. Failures inside the window are always kept (so `status` shows them even when the
//! guard is off); the guard acts on them only when it is on.

use super::settings::Policies;
use super::state::{AllocatorState, FailureRecord};
use std::collections::BTreeMap;
use std::time::Duration;

/// The failures inside the window after this step, and whether creation halts.
pub(super) struct CrashLoopGuard {
    /// Failures inside the window, oldest first.
    pub(super) failures: Vec<FailureRecord>,
    /// Why creation halts (the dominant failure reason), when it does.
    pub(super) halt: Option<String>,
}

impl CrashLoopGuard {
    /// Keeps `prev`'s failures still inside the window, adds `newly_failed` (id, reason) not
    /// yet recorded, at `now_ms`, and halts when more than the failure limit for `target`
    /// remain.
    pub(super) fn observe(
        prev: &AllocatorState,
        pol: &Policies,
        target: u32,
        newly_failed: Vec<(u64, String)>,
        now_ms: u64,
    ) -> CrashLoopGuard {
        let mut failures: Vec<FailureRecord> = (prev.failures.iter())
            .filter(|f| now_ms.saturating_sub(f.at_ms) <= pol.failure_window_ms)
            .cloned()
            .collect();
        for (executor_id, reason) in newly_failed {
            if !prev.failures.iter().any(|f| f.executor_id == executor_id) {
                failures.push(FailureRecord {
                    executor_id,
                    at_ms: now_ms,
                    reason,
                });
            }
        }
        let halt = match pol.max_failures.limit(target) {
            Some(max) if failures.len() as u64 > max as u64 => {
                Some(halt_message(&failures, max, pol))
            }
            _ => None,
        };
        CrashLoopGuard { failures, halt }
    }
}

fn halt_message(failures: &[FailureRecord], max: u32, pol: &Policies) -> String {
    let mut by_reason: BTreeMap<&str, usize> = BTreeMap::new();
    for f in failures {
        *by_reason.entry(f.reason.as_str()).or_insert(0) += 1;
    }
    let (top, n) = by_reason
        .iter()
        .max_by_key(|(r, n)| (**n, std::cmp::Reverse(**r)))
        .map(|(r, n)| (r.to_string(), *n))
        .unwrap_or_default();
    format!(
        "crash loop: {} executors failed within {} (limit {max}); most often: {top} ({n}); \
         creation stopped — fix the cause, then wait out the window or raise --max-failures \
         (default twice the target, at least 3; 0 turns the limit off)",
        failures.len(),
        humantime::format_duration(Duration::from_millis(pol.failure_window_ms)),
    )
}
