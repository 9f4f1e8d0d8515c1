//! Which app this thread's log lines are about: the runner sets it around each app's tick
//! and its results, the logger reads it (`app=`/`ns=` in text, `app`/`namespace` in JSON),
//! and the tick keys its per-app memories by it. A leaf: it imports nothing of podalloc.

thread_local! {
    /// The app the runner is ticking on this thread.
    static APP_CONTEXT: std::cell::RefCell<Option<(String, String)>> =
        const { std::cell::RefCell::new(None) };
}

/// The `(app id, namespace)` the runner is ticking on this thread, for the log lines of its
/// tick (`None` between ticks and on other threads).
pub(crate) fn app_log_context() -> Option<(String, String)> {
    APP_CONTEXT.with(|c| c.borrow().clone())
}

/// Sets (`Some((app id, namespace))`) or clears [`app_log_context`].
pub(crate) fn set_app_log_context(app: Option<(&str, &str)>) {
    let app = app.map(|(a, n)| (a.to_string(), n.to_string()));
    APP_CONTEXT.with(|c| *c.borrow_mut() = app);
}
