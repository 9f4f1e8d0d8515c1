//! The shell's wall clock: the one place podalloc reads the time of day. The engine never
//! reads a clock; the tick reads this once and hands the value down.

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall clock, ms since the Unix epoch (0 if the system clock is set before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
