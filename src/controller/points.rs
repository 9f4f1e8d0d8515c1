//! Crash and pause points of a tick, for the crash-safety and leader-election harnesses:
//! inert unless the test environment variables name them.

/// Crash points of a tick, for the crash-safety harness (tests/crash.rs): with
/// `PODALLOC_CRASH_AT=POINT[:N]` in the environment the process kills itself with SIGKILL at
/// the N-th (default first) time it reaches POINT. Points: `after-list`, `before-write-ahead`,
/// `after-write-ahead`, `before-delete`, `after-delete`, `before-create`, `after-create`,
/// `before-final-save`, `after-final-save`. Unset (always, outside tests), this does nothing.
pub const CRASH_POINTS: &[&str] = &[
    "after-list",
    "before-write-ahead",
    "after-write-ahead",
    "before-delete",
    "after-delete",
    "before-create",
    "after-create",
    "before-final-save",
    "after-final-save",
];

pub(crate) fn crash_point(point: &str) {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    static SPEC: OnceLock<Option<(String, u32)>> = OnceLock::new();
    static SEEN: AtomicU32 = AtomicU32::new(0);
    let spec = SPEC.get_or_init(|| {
        let v = std::env::var("PODALLOC_CRASH_AT").ok()?;
        let (p, n) = v.split_once(':').unwrap_or((v.as_str(), "1"));
        Some((p.to_string(), n.parse().unwrap_or(1)))
    });
    if let Some((p, n)) = spec {
        if p == point && SEEN.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            let _ = signal_hook::low_level::raise(signal_hook::consts::SIGKILL);
        }
    }
}

/// Pause points, for the leader-election tests (tests/leader.rs): with
/// `PODALLOC_PAUSE_AT=POINT:N:MS` the process sleeps MS milliseconds the N-th time it reaches
/// POINT (one of [`CRASH_POINTS`]), as a tick stalled by a slow machine would. Unset (always,
/// outside tests), this does nothing.
pub(crate) fn pause_point(point: &str) {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    static SPEC: OnceLock<Option<(String, u32, u64)>> = OnceLock::new();
    static SEEN: AtomicU32 = AtomicU32::new(0);
    let spec = SPEC.get_or_init(|| {
        let v = std::env::var("PODALLOC_PAUSE_AT").ok()?;
        let mut it = v.splitn(3, ':');
        let (p, n, ms) = (it.next()?, it.next()?, it.next()?);
        Some((p.to_string(), n.parse().ok()?, ms.parse().ok()?))
    });
    if let Some((p, n, ms)) = spec {
        if p == point && SEEN.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            std::thread::sleep(std::time::Duration::from_millis(*ms));
        }
    }
}
