//! Counts read from text: the target (`--target`, `scale`, an apps file's `target:`, the
//! `podalloc.io/executors` annotation, a state ConfigMap's annotation) and the batch size
//! (`--batch-size`, `batch-size:`, `podalloc.io/batch-size`), each with its one parser, so
//! every way in takes the same values and says the same thing about the others. Pure.

pub use super::alloc::MAX_TARGET;

/// Largest batch size accepted (pods per tick).
pub const MAX_BATCH: u32 = 10_000;

/// Parses a target: a whole number ≥ 0 that fits in u32.
pub fn parse_target(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let n: i128 = t
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number of executors"))?;
    if n < 0 {
        return Err(format!(
            "{n} is negative; the target is a count of executors (0 or more)"
        ));
    }
    if n > MAX_TARGET as i128 {
        return Err(format!("{t} is too large: at most {MAX_TARGET}"));
    }
    Ok(n as u32)
}

/// `--batch-size`: a fixed size or adaptive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchSize {
    /// At most this many per tick.
    Fixed(u32),
    /// Adaptive, up to `--max-batch`.
    Auto,
    /// Slow-start within a tick: groups of 1, 2, 4, … back to back while every create
    /// succeeds, up to `--max-batch` a tick (adaptive across ticks).
    SlowStart,
}

/// Parses `--batch-size`: a whole number ≥ 1, or `auto`.
pub fn parse_batch_size(s: &str) -> Result<BatchSize, String> {
    if s.trim() == "auto" {
        return Ok(BatchSize::Auto);
    }
    if s.trim() == "slow-start" {
        return Ok(BatchSize::SlowStart);
    }
    parse_batch_size_n(s).map(BatchSize::Fixed)
}

/// Parses a count that must be 1 or more.
pub fn parse_batch_size_n(s: &str) -> Result<u32, String> {
    match parse_target(s)? {
        0 => Err("must be at least 1".into()),
        n if n > MAX_BATCH => Err(format!("{n} is too large: at most {MAX_BATCH}")),
        n => Ok(n),
    }
}

/// Parses `--max-pending`: a count from 1 to [`MAX_TARGET`], or `unlimited` (`u32::MAX`).
pub fn parse_max_pending(s: &str) -> Result<u32, String> {
    if s.trim() == "unlimited" {
        return Ok(u32::MAX);
    }
    match parse_target(s)? {
        0 => Err("must be at least 1 (or `unlimited`)".into()),
        n => Ok(n),
    }
}
