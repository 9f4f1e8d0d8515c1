//! The change feed behind watches: a bounded ring of the most recent changes of one kind,
//! each with its resourceVersion, appended under the store's lock, and a Condvar its
//! watchers wait on (`watch.rs` streams it). Generic over the stored object; it imports
//! nothing else of the simulator, so the store can own one without depending on the HTTP
//! side of a watch.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// How many changes the ring keeps. The real watch cache starts at 100 and grows up to
/// 100 Ki entries to hold at least 75 s of history; a fixed 8 Ki is plenty for the
/// simulator's rates and keeps memory bounded (entries share the stored pods).
pub(crate) const HISTORY: usize = 8 * 1024;
/// One change of an object: the resourceVersion it was stored at, the new state (`None`
/// for a delete) and the state before it (`None` for a create).
#[derive(Debug)]
pub(crate) struct Change<T> {
    /// The resourceVersion of the change (the object's, or the delete's).
    pub rv: u64,
    /// The object after the change; `None` for a delete.
    pub obj: Option<Arc<T>>,
    /// The object before the change; `None` for a create.
    pub prev: Option<Arc<T>>,
}

/// The ring behind a [`Feed`].
struct Ring<T> {
    changes: VecDeque<Arc<Change<T>>>,
    cap: usize,
    /// Every change with a resourceVersion above this is in the ring (the cacher's
    /// `oldest - 1`): a watch from below it is too old.
    since: u64,
    stopped: bool,
    /// Watchers waiting now: a push with none skips the wake-up (a system call).
    waiters: usize,
}

/// A bounded ring of the most recent changes of one kind, and a Condvar its watchers wait
/// on (no polling). Generic over the stored object; the pods' is the one served.
pub(crate) struct Feed<T> {
    ring: Mutex<Ring<T>>,
    cv: Condvar,
}

/// What a watcher waiting on a [`Feed`] gets.
pub(crate) enum Wait<T> {
    /// Changes after the resourceVersion asked for, oldest first (never empty).
    Changes(Vec<Arc<Change<T>>>),
    /// The deadline passed with nothing new.
    Timeout,
    /// The server is shutting down.
    Stopped,
    /// Changes after the resourceVersion asked for are gone from the ring; the value is the
    /// oldest resourceVersion a watch can still start from.
    TooOld(u64),
}

impl<T> Feed<T> {
    /// An empty feed holding up to `cap` changes, whose history starts after `start_rv`.
    pub(crate) fn new(cap: usize, start_rv: u64) -> Self {
        Feed {
            ring: Mutex::new(Ring {
                changes: VecDeque::with_capacity(cap.min(1024)),
                cap: cap.max(1),
                since: start_rv,
                stopped: false,
                waiters: 0,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ring<T>> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a change (resourceVersions must grow), drops the oldest when full, and wakes
    /// every watcher.
    pub(crate) fn push(&self, change: Change<T>) {
        let mut r = self.lock();
        if r.changes.len() >= r.cap {
            if let Some(old) = r.changes.pop_front() {
                r.since = old.rv;
            }
        }
        r.changes.push_back(Arc::new(change));
        let waiting = r.waiters > 0;
        drop(r);
        if waiting {
            self.cv.notify_all();
        }
    }

    /// Ends every watch (server shutdown); later waits return `Stopped` at once.
    pub(crate) fn stop(&self) {
        self.lock().stopped = true;
        self.cv.notify_all();
    }

    /// The oldest resourceVersion a watch can start from.
    #[cfg(test)]
    pub(crate) fn oldest(&self) -> u64 {
        self.lock().since
    }

    /// Waits until there are changes after `rv`, `until` passes, or the feed stops.
    pub(crate) fn wait_after(&self, rv: u64, until: Instant) -> Wait<T> {
        let mut r = self.lock();
        loop {
            if r.stopped {
                return Wait::Stopped;
            }
            if rv < r.since {
                return Wait::TooOld(r.since);
            }
            let first = r.changes.partition_point(|c| c.rv <= rv);
            if first < r.changes.len() {
                return Wait::Changes(r.changes.range(first..).cloned().collect());
            }
            let now = Instant::now();
            if now >= until {
                return Wait::Timeout;
            }
            r.waiters += 1;
            r = self
                .cv
                .wait_timeout(r, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            r.waiters -= 1;
        }
    }
}

/// Where a watch starts: the current objects (for a start from the current state) and the
/// resourceVersion they are at, taken under the store's lock with the feed it appends to.
pub(crate) struct Start<T> {
    /// The feed the store appends to.
    pub feed: Arc<Feed<T>>,
    /// The resourceVersion of `current`.
    pub rv: u64,
    /// The objects at `rv` (of the request's namespace), in key order.
    pub current: Vec<Arc<T>>,
}

impl<T> Start<T> {
    /// A watch's start: `current` is the state at `rv`, and `feed` holds every change after
    /// it (both taken under the store's lock).
    pub(crate) fn new(feed: &Arc<Feed<T>>, rv: u64, current: Vec<Arc<T>>) -> Self {
        Start {
            feed: Arc::clone(feed),
            rv,
            current,
        }
    }
}
