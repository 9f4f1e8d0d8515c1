//! Which app a log line is about: a [`LogContext`] is made by `main` and shared by value
//! with the logger (which reads it: `app=`/`ns=` in text, `app`/`namespace` in JSON) and
//! with the command (which sets it: the command's app once connected, the runner's app
//! around each of its ticks). A leaf: it imports nothing of podalloc. No process-wide
//! state: a library user that installs no logger just never reads it.

use std::sync::{Arc, Mutex, MutexGuard};

/// The `(app id, namespace)` of the lines logged now; cheap to clone (one `Arc`), every
/// clone the same context.
#[derive(Clone, Debug, Default)]
pub struct LogContext(Arc<Mutex<Scope>>);

#[derive(Debug, Default)]
struct Scope {
    /// The command's app, once it has connected (the first one set stays).
    command: Option<(String, String)>,
    /// The app the runner is ticking now (`apps` ticks one app after another).
    app: Option<(String, String)>,
}

impl LogContext {
    fn lock(&self) -> MutexGuard<'_, Scope> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `(app id, namespace)` of a line logged now: the app being ticked, else the
    /// command's; `None` before the command has connected.
    pub fn current(&self) -> Option<(String, String)> {
        let s = self.lock();
        s.app.clone().or_else(|| s.command.clone())
    }

    /// Sets the command's app and namespace (the first call wins).
    pub fn set_command(&self, app_id: &str, namespace: &str) {
        let mut s = self.lock();
        if s.command.is_none() {
            s.command = Some((app_id.to_string(), namespace.to_string()));
        }
    }

    /// Runs `f`, whose lines are about the process rather than an app (a signal, the
    /// process ending), with the command's context even in the middle of an app's tick
    /// (`apps`: its `*` and namespace); the app being ticked is restored after.
    pub fn process_lines<R>(&self, f: impl FnOnce() -> R) -> R {
        let app = self.lock().app.take();
        let r = f();
        self.lock().app = app;
        r
    }

    /// Sets (`Some((app id, namespace))`) or clears the app being ticked.
    pub fn set_app(&self, app: Option<(&str, &str)>) {
        self.lock().app = app.map(|(a, n)| (a.to_string(), n.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::LogContext;

    #[test]
    fn the_ticked_app_wins_over_the_commands_and_clones_share_it() {
        let c = LogContext::default();
        assert_eq!(c.current(), None);
        let logger = c.clone();
        c.set_command("a", "ns");
        c.set_command("b", "ns");
        assert_eq!(logger.current(), Some(("a".into(), "ns".into())));
        c.set_app(Some(("x", "other")));
        assert_eq!(logger.current(), Some(("x".into(), "other".into())));
        c.set_app(None);
        assert_eq!(logger.current(), Some(("a".into(), "ns".into())));
        c.set_app(Some(("x", "other")));
        let seen = c.process_lines(|| logger.current());
        assert_eq!(seen, Some(("a".into(), "ns".into())));
        assert_eq!(logger.current(), Some(("x".into(), "other".into())));
    }
}
