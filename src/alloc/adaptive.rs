//! Adaptive batches (`--batch-size auto`): the batch size grows and shrinks between ticks the
//! way TCP slow-start and Kubernetes' own controllers pace creation, kept apart from the other
//! rules as quinn keeps its congestion controller.
//!
//! - A batch whose pods were all seen, with none still unscheduled, doubles the next batch (up
//!   to the cap, `--max-batch`).
//! - A tick that met throttling (429, 5xx or a quota rejection, reported by the shell through
//!   [`super::record`]) or a snapshot with an Unschedulable pod halves it (at least 1).
//! - A step that makes no batch leaves the size as it was, unless it shrank.

use super::settings::Settings;
use super::state::{AdaptiveState, AllocatorState};
use crate::snapshot::ExecutorPod;

/// This step's adaptive batch size.
pub(super) struct AdaptiveBatch {
    batch: u32,
}

impl AdaptiveBatch {
    /// The batch size for this step, from the last step's (`prev`), or `None` when adaptive
    /// batches are off. `all_seen`: no request is unacknowledged.
    pub(super) fn before(
        prev: &AllocatorState,
        cfg: &Settings,
        pending: &[&ExecutorPod],
        all_seen: bool,
    ) -> Option<AdaptiveBatch> {
        let cap = cfg.policies.adaptive_max_batch?.max(1);
        let last = prev.adaptive.as_ref();
        let mut batch = last
            .map_or(cfg.batch_size.min(cap), |a| a.batch)
            .clamp(1, cap);
        if last.is_some_and(|a| a.throttled) || unschedulable(pending) {
            batch = (batch / 2).max(1);
        } else if last.is_some() && all_seen && pending.iter().all(|p| p.scheduled) {
            batch = batch.saturating_mul(2).min(cap);
        }
        Some(AdaptiveBatch { batch })
    }

    /// The batch size, pods (1 ..= cap).
    pub(super) fn size(&self) -> u32 {
        self.batch
    }

    /// The state to persist: the size only changes when a batch was `made`, or when it shrank.
    pub(super) fn after(
        self,
        made: bool,
        prev: &AllocatorState,
        pending: &[&ExecutorPod],
    ) -> AdaptiveState {
        let batch = match &prev.adaptive {
            Some(last) if !made && !last.throttled && !unschedulable(pending) => last.batch,
            _ => self.batch,
        };
        AdaptiveState {
            batch,
            throttled: false,
        }
    }
}

fn unschedulable(pending: &[&ExecutorPod]) -> bool {
    pending.iter().any(|p| p.unschedulable)
}
