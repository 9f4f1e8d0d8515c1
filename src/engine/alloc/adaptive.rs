//! Adaptive batches (`--batch-size auto`): the batch size grows and shrinks between ticks the
//! way TCP slow-start and Kubernetes' own controllers pace creation, kept apart from the other
//! rules as quinn keeps its congestion controller.
//!
//! - A batch whose pods were all seen, with none still unscheduled, doubles the next batch (up
//!   to the cap, `--max-batch`).
//! - A tick that met throttling (429, 5xx or a quota rejection, reported by the shell through
//!   [`super::record`]) or a snapshot with a newly Unschedulable pod halves it (at least 1).
//!   Newly: with an executor id above the highest one seen Unschedulable before
//!   ([`AdaptiveState::unschedulable_seen`]). A pod that waits Unschedulable for many ticks
//!   is one signal, as TCP halves its window once per loss event (RFC 5681, section 3.1), not
//!   once per round trip while the loss lasts; halving on every tick would bring the batch
//!   to 1 within a few ticks of any long wait for a node, whatever the other pods do. Pods
//!   already counted no longer hold back growth either; `--max-pending` still bounds how
//!   many wait.
//! - A step that makes no batch leaves the size as it was, unless it shrank.

use super::settings::Settings;
use super::state::{AdaptiveState, AllocatorState};
use crate::engine::snapshot::ExecutorPod;

/// This step's adaptive batch size.
pub(super) struct AdaptiveBatch {
    batch: u32,
    /// A pod above the last step's `unschedulable_seen` is Unschedulable.
    new_unschedulable: bool,
    /// `unschedulable_seen` after this step.
    unschedulable_seen: u64,
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
        let seen = last.map_or(0, |a| a.unschedulable_seen);
        let new_unschedulable = pending.iter().any(|p| p.unschedulable && p.id > seen);
        let counted = |p: &ExecutorPod| p.unschedulable && p.id <= seen;
        if last.is_some_and(|a| a.throttled) || new_unschedulable {
            batch = (batch / 2).max(1);
        } else if last.is_some() && all_seen && pending.iter().all(|p| p.scheduled || counted(p)) {
            batch = batch.saturating_mul(2).min(cap);
        }
        let highest = pending.iter().filter(|p| p.unschedulable).map(|p| p.id);
        Some(AdaptiveBatch {
            batch,
            new_unschedulable,
            unschedulable_seen: highest.fold(seen, u64::max),
        })
    }

    /// The batch size, pods (1 ..= cap).
    pub(super) fn size(&self) -> u32 {
        self.batch
    }

    /// The state to persist: the size only changes when a batch was `made`, or when it shrank.
    pub(super) fn after(self, made: bool, prev: &AllocatorState) -> AdaptiveState {
        let batch = match &prev.adaptive {
            Some(last) if !made && !last.throttled && !self.new_unschedulable => last.batch,
            _ => self.batch,
        };
        AdaptiveState {
            batch,
            throttled: false,
            unschedulable_seen: self.unschedulable_seen,
        }
    }
}
