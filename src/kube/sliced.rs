//! The connection under every request: ureq's own connectors (an HTTP `CONNECT` proxy, TCP,
//! rustls), with the TCP transport's waits for the server cut into slices of at most
//! [`SLICE`], the caller's hook ([`super::KubeClient::set_between_requests`]) run between
//! two slices. So the one thread that waits for an answer still answers its endpoints, sees
//! its signals and renews its Lease while a list is slow, without a thread of its own: the
//! slices sit between TCP and TLS, so rustls sees one wait, as long as the request's own
//! timeouts allow (a slice that times out reads nothing, and is simply made again).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ureq::unversioned::transport::time::Duration as UreqDuration;
use ureq::unversioned::transport::{
    Buffers, ConnectProxyConnector, ConnectionDetails, Connector, NextTimeout, RustlsConnector,
    Transport,
};

use super::client::Between;
use super::resolver::{Dialer, KubeResolver};

/// The longest a wait for the server goes without running the hook (and the longest a
/// body read without waiting goes without it: a large list decoded as it arrives).
pub(super) const SLICE: Duration = Duration::from_millis(50);

/// The hook of one client's connection, set once (shared with its agent's connector, which
/// the client may rebuild, and with the clients derived from it).
#[derive(Clone)]
pub(super) struct Hook {
    hook: Arc<OnceLock<Between>>,
    /// Whether this connection's requests are cut when the hook answers false: not for a
    /// derived client's (the Lease calls, a release, Events), which must go on when the
    /// loop's term is over.
    cuts: bool,
    /// Set while an exec credential plugin of one of these clients runs (its wait runs the
    /// hook): a request the hook makes then must not run another ([`PluginRun`]).
    plugin: Arc<AtomicBool>,
}

impl Default for Hook {
    fn default() -> Hook {
        Hook {
            hook: Arc::default(),
            cuts: true,
            plugin: Arc::default(),
        }
    }
}

/// Marks an exec plugin of the clients sharing a [`Hook`] as running, until dropped.
pub(super) struct PluginRun(Arc<AtomicBool>);

impl Drop for PluginRun {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Hook {
    /// The same hook for a derived client, whose requests it never cuts.
    pub(super) fn derived(&self) -> Hook {
        Hook {
            hook: Arc::clone(&self.hook),
            cuts: false,
            plugin: Arc::clone(&self.plugin),
        }
    }

    /// Whether an exec plugin of these clients is running: the caller is inside the hook
    /// of its wait.
    pub(super) fn plugin_running(&self) -> bool {
        self.plugin.load(Ordering::SeqCst)
    }

    /// Marks an exec plugin as running until the guard is dropped.
    pub(super) fn plugin_run(&self) -> PluginRun {
        self.plugin.store(true, Ordering::SeqCst);
        PluginRun(Arc::clone(&self.plugin))
    }

    /// Installs `f` (once; a second call is ignored).
    pub(super) fn set(&self, f: Between) {
        let _ = self.hook.set(f);
    }

    /// Whether a hook is installed.
    pub(super) fn is_set(&self) -> bool {
        self.hook.get().is_some()
    }

    /// Runs the hook for `d` (no hook: sleeps `d`). Returns false when the request must be
    /// cut: the hook said so and this connection's requests are cut.
    pub(super) fn run(&self, d: Duration) -> bool {
        match self.hook.get() {
            Some(f) => f(d) || !self.cuts,
            None => {
                if !d.is_zero() {
                    std::thread::sleep(d);
                }
                true
            }
        }
    }
}

/// The connector of a client's agent: ureq's default chain (without SOCKS, which this build
/// of ureq does not have) with [`Slicer`] between TCP and TLS, and the TCP step a
/// [`Dialer`], which looks a name up when it connects (`resolver.rs`).
pub(super) fn connector(hook: &Hook, resolver: &KubeResolver) -> impl Connector<()> {
    ().chain(ConnectProxyConnector::default())
        .chain(Dialer::new(resolver))
        .chain(Slicer(hook.clone()))
        .chain(RustlsConnector::default())
}

/// Wraps the transport it is given in [`Sliced`].
pub(super) struct Slicer(Hook);

impl std::fmt::Debug for Slicer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slicer").finish_non_exhaustive()
    }
}

impl<In: Transport> Connector<In> for Slicer {
    type Out = Sliced<In>;

    fn connect(
        &self,
        _details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        Ok(chained.map(|inner| Sliced {
            inner,
            hook: self.0.clone(),
            last: Instant::now(),
        }))
    }
}

/// A transport whose waits for input are made in slices of [`SLICE`], the hook run between
/// them; everything else is the inner transport's.
pub(super) struct Sliced<T> {
    inner: T,
    hook: Hook,
    /// When the hook last ran for this connection.
    last: Instant,
}

impl<T> std::fmt::Debug for Sliced<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sliced").finish_non_exhaustive()
    }
}

impl<T: Transport> Sliced<T> {
    /// Runs the hook (a zero wait: it does its own work and returns) when it has not run
    /// for a slice.
    fn maybe_hook(&mut self) -> Result<(), ureq::Error> {
        if self.last.elapsed() >= SLICE {
            return self.run();
        }
        Ok(())
    }

    /// Runs the hook for no wait; an error when the request is to be cut (the caller's
    /// term is over: the client then fails the call).
    fn run(&mut self) -> Result<(), ureq::Error> {
        self.last = Instant::now();
        match self.hook.run(Duration::ZERO) {
            true => Ok(()),
            false => Err(ureq::Error::Io(std::io::Error::other(
                "cut: this process no longer holds the leader lease",
            ))),
        }
    }
}

impl<T: Transport> Transport for Sliced<T> {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.inner.transmit_output(amount, timeout)
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        if !self.hook.is_set() {
            return self.inner.await_input(timeout);
        }
        self.maybe_hook()?;
        // The wait as the TCP transport would make it: the remaining budget, capped by the
        // per-read timeout; `None`: no limit.
        let whole = timeout.for_read();
        let limit = (!whole.after.is_not_happening()).then(|| *whole.after);
        let started = Instant::now();
        loop {
            let left = limit.map(|l| l.saturating_sub(started.elapsed()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(ureq::Error::Timeout(whole.reason));
            }
            let slice = NextTimeout {
                after: UreqDuration::from(left.map_or(SLICE, |l| l.min(SLICE))),
                per_read: None,
                ..timeout
            };
            match self.inner.await_input(slice) {
                Err(ureq::Error::Timeout(_)) => self.run()?,
                other => return other,
            }
        }
    }

    fn is_open(&mut self) -> bool {
        self.inner.is_open()
    }

    fn is_tls(&self) -> bool {
        self.inner.is_tls()
    }
}
