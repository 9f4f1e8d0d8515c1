//! Crash and pause points of a tick, for the crash-safety and leader-election harnesses:
//! inert unless the test environment variables name them. [`Points`] reads them once, when
//! the process's services are made ([`crate::controller::services::Services`]), and counts
//! the visits itself: no process-wide state.

use std::cell::Cell;

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

/// The crash and pause points the environment names, and how often each was reached.
#[derive(Debug, Default)]
pub(crate) struct Points {
    /// `PODALLOC_CRASH_AT=POINT[:N]`: (point, N).
    crash: Option<(String, u32)>,
    /// `PODALLOC_PAUSE_AT=POINT:N:MS`: (point, N, ms).
    pause: Option<(String, u32, u64)>,
    crash_seen: Cell<u32>,
    pause_seen: Cell<u32>,
}

impl Points {
    /// The points `PODALLOC_CRASH_AT` and `PODALLOC_PAUSE_AT` name (read once, now).
    pub(crate) fn from_env() -> Points {
        Points::parse(
            std::env::var("PODALLOC_CRASH_AT").ok().as_deref(),
            std::env::var("PODALLOC_PAUSE_AT").ok().as_deref(),
        )
    }

    /// The points of `crash` (`POINT[:N]`) and `pause` (`POINT:N:MS`); malformed ones are
    /// inert.
    fn parse(crash: Option<&str>, pause: Option<&str>) -> Points {
        let crash = crash.map(|v| {
            let (p, n) = v.split_once(':').unwrap_or((v, "1"));
            (p.to_string(), n.parse().unwrap_or(1))
        });
        let pause = pause.and_then(|v| {
            let mut it = v.splitn(3, ':');
            let (p, n, ms) = (it.next()?, it.next()?, it.next()?);
            Some((p.to_string(), n.parse().ok()?, ms.parse().ok()?))
        });
        Points {
            crash,
            pause,
            ..Points::default()
        }
    }

    /// Reached crash point `point`: kills the process (SIGKILL) the N-th time.
    pub(crate) fn crash(&self, point: &str) {
        if let Some((p, n)) = &self.crash {
            if p == point && bump(&self.crash_seen) == *n {
                let _ = signal_hook::low_level::raise(signal_hook::consts::SIGKILL);
            }
        }
    }

    /// Reached pause point `point` (one of [`CRASH_POINTS`]): waits MS milliseconds the
    /// N-th time through `wait` (which must wait them all: the loop's single thread answers
    /// its endpoints meanwhile), as a tick stalled by a slow machine would (tests/leader.rs).
    pub(crate) fn pause(&self, point: &str, wait: impl FnOnce(std::time::Duration)) {
        if let Some((p, n, ms)) = &self.pause {
            if p == point && bump(&self.pause_seen) == *n {
                wait(std::time::Duration::from_millis(*ms));
            }
        }
    }
}

/// Counts one more visit; the new count.
fn bump(c: &Cell<u32>) -> u32 {
    let n = c.get().saturating_add(1);
    c.set(n);
    n
}

#[cfg(test)]
mod tests {
    use super::Points;

    #[test]
    fn points_parse_and_count_their_visits() {
        let p = Points::parse(Some("after-list:3"), Some("before-create:2:5"));
        assert_eq!(p.crash, Some(("after-list".into(), 3)));
        assert_eq!(p.pause, Some(("before-create".into(), 2, 5)));
        p.pause("before-create", |_| {});
        p.pause("before-create", |_| {});
        p.pause("after-list", |_| {});
        assert_eq!(p.pause_seen.get(), 2);
        let bad = Points::parse(Some("x"), Some("y:z"));
        assert_eq!(bad.crash, Some(("x".into(), 1)));
        assert_eq!(bad.pause, None);
    }
}
