//! The kube client's name resolution, in place of ureq's resolver, which for a request with
//! a timeout ran getaddrinfo on a thread it never joined, waited for it without running the
//! loop's hook (behind a slow DNS server the thread outlived the request, and the loop
//! answered neither its probes nor its Lease meanwhile), and did so for every request, even
//! one that then took a pooled connection.
//!
//! - An IP address in the URL (`https://10.0.0.1:6443`, what in-cluster configuration and
//!   most kubeconfigs hold) is used as it is: no lookup, no thread.
//! - A name is looked up only when a connection is made ([`Dialer`], the TCP step of the
//!   agent's connector), as Go's dialer does: [`KubeResolver`], which ureq asks before every
//!   request, answers no address for it, and a request on a pooled connection looks
//!   nothing up. (When a SOCKS4 proxy needs the target's address, it is looked up there.)
//! - The lookup is getaddrinfo (std's `ToSocketAddrs`) on one helper thread of a
//!   `std::thread::scope`, so it is joined before the lookup returns, whatever happens;
//!   while it runs, the hook of [`super::KubeClient::set_between_requests`] runs every
//!   [`SLICE`], as while a request waits for the server (`sliced.rs`), so the loop answers
//!   its endpoints, sees its signals and renews its Lease. A lookup made by a request of the
//!   hook itself (a Lease renewal on a new connection) runs the hook too: the hook stands
//!   being re-entered, as it does for such a request's waits.
//! - getaddrinfo cannot be cut short: when the connection's deadline (the connect timeout
//!   or what is left of the request's) passes before the lookup ends, the request fails
//!   with a timeout naming the host lookup, but only once the lookup has ended; it is
//!   bounded by the system resolver's own timeouts and attempts (`/etc/resolv.conf`: 5 s ×
//!   2 attempts per server by default). Likewise a request cut by the hook (the term is
//!   over) fails when the lookup ends, having sent nothing.
//!
//! The addresses keep getaddrinfo's order, filtered by ureq's IPv4/IPv6 preference
//! (`Config::ip_family`) and capped at what ureq keeps (16), as ureq's resolver does.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::time::Duration as UreqDuration;
use ureq::unversioned::transport::{
    ConnectionDetails, Connector, NextTimeout, TcpConnector, Transport,
};

use super::sliced::{Hook, SLICE};

/// A name lookup: the addresses of `(host, port)` in the order the system gives them.
pub(super) type Lookup = Arc<dyn Fn(&str, u16) -> io::Result<Vec<SocketAddr>> + Send + Sync>;

/// The system's lookup: getaddrinfo, through std.
fn getaddrinfo(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    (host, port).to_socket_addrs().map(Iterator::collect)
}

/// The resolver of a client's agent (and of its [`Dialer`]): its connection's hook, and the
/// real address of the server when a `tls-server-name` is set (the URL then names the
/// certificate's host; ureq has no server-name override, so the URL names it and this
/// resolver pins where the server really is).
#[derive(Clone)]
pub(super) struct KubeResolver {
    pin: Option<(String, Uri)>,
    hook: Hook,
    lookup: Lookup,
}

impl fmt::Debug for KubeResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeResolver")
            .field("pin", &self.pin)
            .finish_non_exhaustive()
    }
}

impl KubeResolver {
    /// The resolver of a connection with `hook`, pinning `pin.0` to `pin.1`'s address.
    pub(super) fn new(pin: Option<(String, Uri)>, hook: &Hook) -> KubeResolver {
        KubeResolver::with_lookup(pin, hook, Arc::new(getaddrinfo))
    }

    /// The same with `lookup` in place of getaddrinfo (tests).
    pub(super) fn with_lookup(
        pin: Option<(String, Uri)>,
        hook: &Hook,
        lookup: Lookup,
    ) -> KubeResolver {
        KubeResolver {
            pin,
            hook: hook.clone(),
            lookup,
        }
    }

    /// Looks `host` up on a scoped helper thread (joined before this returns), running the
    /// hook every [`SLICE`] while it runs; fails when `timeout` passed before it ended, or
    /// when the hook cut the request meanwhile.
    fn look_up(
        &self,
        host: &str,
        port: u16,
        timeout: NextTimeout,
    ) -> Result<Vec<SocketAddr>, ureq::Error> {
        let started = Instant::now();
        let (tx, rx) = mpsc::sync_channel(1);
        let lookup = &self.lookup;
        let mut cut = false;
        let found = std::thread::scope(|s| {
            let helper = std::thread::Builder::new()
                .name("kube-lookup".to_string())
                .spawn_scoped(s, move || {
                    let _ = tx.send(lookup(host, port));
                })?;
            let found = loop {
                match rx.recv_timeout(SLICE) {
                    Ok(found) => break Some(found),
                    Err(RecvTimeoutError::Disconnected) => break None,
                    Err(RecvTimeoutError::Timeout) => cut |= !self.hook.run(Duration::ZERO),
                }
            };
            let ended = helper.join().is_ok();
            found
                .filter(|_| ended)
                .ok_or_else(|| io::Error::other(format!("host lookup of {host} failed")))
        })?;
        let took = started.elapsed();
        if cut {
            return Err(ureq::Error::Io(io::Error::other(
                "cut: this process no longer holds the leader lease",
            )));
        }
        if !timeout.after.is_not_happening() && took > *timeout.after {
            return Err(ureq::Error::Io(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "host lookup of {host} took {took:.1?}, longer than the {:.1?} left of the \
                     request's {} timeout (getaddrinfo cannot be cut short: it was waited for)",
                    *timeout.after, timeout.reason
                ),
            )));
        }
        Ok(found?)
    }
}

/// The host (brackets of an IPv6 address removed) and port of `uri`, the port defaulting
/// as ureq's resolver does.
fn host_port(uri: &Uri) -> Result<(&str, u16), ureq::Error> {
    let host = uri
        .host()
        .ok_or_else(|| ureq::Error::BadUri(format!("{uri} is missing host")))?;
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(port), _) => port,
        (None, Some("https")) => 443,
        (None, Some("http")) => 80,
        (None, Some("socks4" | "socks4a" | "socks5" | "socks5h")) => 1080,
        (None, scheme) => {
            return Err(ureq::Error::BadUri(format!(
                "unknown scheme: {}",
                scheme.unwrap_or("(none)")
            )))
        }
    };
    Ok((host.trim_start_matches('[').trim_end_matches(']'), port))
}

impl KubeResolver {
    /// `uri`, or the server's real URL when `uri` names the pinned `tls-server-name`.
    fn real<'u>(&'u self, uri: &'u Uri) -> &'u Uri {
        match &self.pin {
            Some((name, real)) if uri.host().is_some_and(|h| h.eq_ignore_ascii_case(name)) => real,
            _ => uri,
        }
    }

    /// The addresses of `uri`'s host: an IP address as it is, a name looked up now
    /// ([`KubeResolver::look_up`]), in order, of the wanted IP family.
    fn addresses(
        &self,
        uri: &Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let (host, port) = host_port(self.real(uri))?;
        let found = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => self.look_up(host, port, timeout)?,
        };
        let mut addrs = self.empty();
        for addr in config.ip_family().keep_wanted(found.into_iter()) {
            if addrs.try_push(addr).is_err() {
                break;
            }
        }
        if addrs.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(addrs)
    }
}

impl Resolver for KubeResolver {
    /// An IP address's; none for a name, which [`Dialer`] looks up when (and only when) a
    /// connection is made, unless a SOCKS4 proxy needs the target's address now.
    fn resolve(
        &self,
        uri: &Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let (host, _) = host_port(self.real(uri))?;
        let now = config.proxy().is_some_and(ureq::Proxy::resolve_target);
        if host.parse::<IpAddr>().is_err() && !now {
            return Ok(self.empty());
        }
        self.addresses(uri, config, timeout)
    }
}

/// The TCP step of the agent's connector: ureq's, given the addresses of a host that
/// [`KubeResolver::resolve`] left to be looked up when a connection is made.
pub(super) struct Dialer {
    resolver: KubeResolver,
    tcp: TcpConnector,
}

impl Dialer {
    pub(super) fn new(resolver: &KubeResolver) -> Dialer {
        Dialer {
            resolver: resolver.clone(),
            tcp: TcpConnector::default(),
        }
    }
}

impl fmt::Debug for Dialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dialer").finish_non_exhaustive()
    }
}

impl<In: Transport> Connector<In> for Dialer {
    type Out = <TcpConnector as Connector<In>>::Out;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        if chained.is_some() || !details.addrs.is_empty() {
            return self.tcp.connect(details, chained);
        }
        let started = Instant::now();
        let addrs = (self.resolver).addresses(details.uri, details.config, details.timeout)?;
        // The connect's budget is what the lookup left of it.
        let mut timeout = details.timeout;
        if !timeout.after.is_not_happening() {
            let left = timeout.after.saturating_sub(started.elapsed());
            timeout.after = UreqDuration::from(left);
        }
        let dial = ConnectionDetails {
            uri: details.uri,
            addrs,
            config: details.config,
            request_level: details.request_level,
            resolver: details.resolver,
            now: (details.current_time)(),
            timeout,
            current_time: Arc::clone(&details.current_time),
            run_connector: Arc::clone(&details.run_connector),
            register_shutdown: Arc::clone(&details.register_shutdown),
        };
        self.tcp.connect(&dial, None)
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    use ureq::config::{Config, IpFamily};
    use ureq::unversioned::transport::time::Duration as UreqDuration;

    use super::*;

    fn config(family: IpFamily) -> Config {
        ureq::Agent::config_builder().ip_family(family).build()
    }

    fn within(after: Option<Duration>) -> NextTimeout {
        NextTimeout {
            after: after.map_or(UreqDuration::NotHappening, UreqDuration::from),
            reason: ureq::Timeout::Global,
            ..NextTimeout::default()
        }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A hook counting its calls, answering `answer`.
    fn counting_hook(answer: bool) -> (Hook, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let hook = Hook::default();
        let c = Arc::clone(&calls);
        hook.set(Arc::new(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            answer
        }));
        (hook, calls)
    }

    /// A lookup counting its calls that answers `addrs`.
    fn counting_lookup(addrs: Vec<SocketAddr>) -> (Lookup, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        let lookup: Lookup = Arc::new(move |_, _| {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(addrs.clone())
        });
        (lookup, calls)
    }

    fn resolve(r: &KubeResolver, url: &str, cfg: &Config, t: NextTimeout) -> Vec<SocketAddr> {
        let uri: Uri = url.parse().unwrap();
        r.resolve(&uri, cfg, t).unwrap().to_vec()
    }

    /// What the [`Dialer`] connects to.
    fn addresses(r: &KubeResolver, url: &str, cfg: &Config, t: NextTimeout) -> Vec<SocketAddr> {
        let uri: Uri = url.parse().unwrap();
        r.addresses(&uri, cfg, t).unwrap().to_vec()
    }

    #[test]
    fn an_ip_address_is_used_as_it_is_without_a_lookup() {
        let (lookup, calls) = counting_lookup(vec![addr("192.0.2.9:1")]);
        let pin = Some((
            "kubernetes.default".to_string(),
            "https://10.1.2.3:6443/".parse().unwrap(),
        ));
        let r = KubeResolver::with_lookup(pin, &Hook::default(), lookup);
        let any = config(IpFamily::Any);
        let t = within(Some(Duration::from_secs(1)));
        assert_eq!(
            resolve(&r, "https://10.0.0.1:6443/x", &any, t),
            [addr("10.0.0.1:6443")]
        );
        assert_eq!(resolve(&r, "https://[::1]/", &any, t), [addr("[::1]:443")]);
        assert_eq!(
            resolve(&r, "http://127.0.0.1/", &any, t),
            [addr("127.0.0.1:80")]
        );
        assert_eq!(
            resolve(&r, "https://kubernetes.default/api", &any, t),
            [addr("10.1.2.3:6443")]
        );
        // No lookup, hence no thread: the helper is made only for a lookup.
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_name_keeps_the_lookups_order_and_the_ip_family_preference() {
        let found = vec![
            addr("[2001:db8::1]:6443"),
            addr("192.0.2.2:6443"),
            addr("192.0.2.1:6443"),
        ];
        let (lookup, calls) = counting_lookup(found.clone());
        let r = KubeResolver::with_lookup(None, &Hook::default(), lookup);
        let url = "https://api.example:6443/";
        let t = within(Some(Duration::from_secs(5)));
        assert_eq!(addresses(&r, url, &config(IpFamily::Any), t), found);
        assert_eq!(
            addresses(&r, url, &config(IpFamily::Ipv4Only), t),
            found[1..]
        );
        assert_eq!(
            addresses(&r, url, &config(IpFamily::Ipv6Only), within(None)),
            found[..1]
        );
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let none = KubeResolver::with_lookup(None, &Hook::default(), counting_lookup(vec![]).0);
        let uri: Uri = url.parse().unwrap();
        let e = none.addresses(&uri, &config(IpFamily::Any), t).unwrap_err();
        assert!(matches!(e, ureq::Error::HostNotFound), "{e}");
    }

    /// The lookup outlives the deadline: the lookup returns only once its thread has ended
    /// (gone from /proc/self/task), with a timeout naming it, the hook run every slice
    /// meanwhile.
    #[test]
    fn a_lookup_past_the_deadline_is_joined_and_runs_the_hook_meanwhile() {
        let (hook, hook_calls) = counting_hook(true);
        let ended = Arc::new(AtomicBool::new(false));
        let task: Arc<Mutex<Option<PathBuf>>> = Arc::default();
        let (e2, t2) = (Arc::clone(&ended), Arc::clone(&task));
        let lookup: Lookup = Arc::new(move |_, port| {
            let me = std::fs::read_link("/proc/thread-self").unwrap();
            *t2.lock().unwrap() = Some(PathBuf::from("/proc").join(me));
            std::thread::sleep(Duration::from_millis(500));
            e2.store(true, Ordering::SeqCst);
            Ok(vec![SocketAddr::new([192, 0, 2, 1].into(), port)])
        });
        let r = KubeResolver::with_lookup(None, &hook, lookup);
        let uri: Uri = "https://slow.example:6443/".parse().unwrap();
        let started = Instant::now();
        let t = within(Some(Duration::from_millis(100)));
        let e = r.addresses(&uri, &config(IpFamily::Any), t).unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(500));
        assert!(
            ended.load(Ordering::SeqCst),
            "returned before the lookup ended"
        );
        let task = task.lock().unwrap().clone().expect("the lookup ran");
        let gone = Instant::now() + Duration::from_secs(1);
        while task.exists() && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!task.exists(), "the lookup's thread {task:?} outlived it");
        let ureq::Error::Io(io) = &e else {
            panic!("not an I/O timeout: {e}")
        };
        assert_eq!(io.kind(), io::ErrorKind::TimedOut);
        let text = io.to_string();
        assert!(
            text.starts_with("host lookup of slow.example took "),
            "{text}"
        );
        assert!(text.contains("longer than the 100.0ms left of the request's global timeout"));
        // 500 ms of lookup in slices of 50 ms; a loaded machine may stretch them.
        assert!(hook_calls.load(Ordering::SeqCst) >= 4, "{hook_calls:?}");
    }

    #[test]
    fn a_lookup_cut_by_the_hook_fails_once_it_ends() {
        let (hook, hook_calls) = counting_hook(false);
        let lookup: Lookup = Arc::new(|_, port| {
            std::thread::sleep(Duration::from_millis(150));
            Ok(vec![SocketAddr::new([192, 0, 2, 1].into(), port)])
        });
        let uri: Uri = "https://slow.example/".parse().unwrap();
        let started = Instant::now();
        let e = KubeResolver::with_lookup(None, &hook, Arc::clone(&lookup))
            .addresses(&uri, &config(IpFamily::Any), within(None))
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert!(e
            .to_string()
            .contains("cut: this process no longer holds the leader lease"));
        assert!(hook_calls.load(Ordering::SeqCst) >= 1);
        // A derived connection's requests are never cut.
        let derived = KubeResolver::with_lookup(None, &hook.derived(), lookup);
        let ok = derived
            .addresses(&uri, &config(IpFamily::Any), within(None))
            .unwrap();
        assert_eq!(ok.to_vec(), [addr("192.0.2.1:443")]);
    }

    #[test]
    fn a_lookup_that_fails_or_panics_is_an_error() {
        let uri: Uri = "https://nowhere.example/".parse().unwrap();
        let t = within(Some(Duration::from_secs(5)));
        let fails: Lookup = Arc::new(|_, _| Err(io::Error::other("Name or service not known")));
        let e = KubeResolver::with_lookup(None, &Hook::default(), fails)
            .addresses(&uri, &config(IpFamily::Any), t)
            .unwrap_err();
        assert!(e.to_string().contains("Name or service not known"), "{e}");
        let panics: Lookup = Arc::new(|_, _| panic!("lookup panicked"));
        let e = KubeResolver::with_lookup(None, &Hook::default(), panics)
            .addresses(&uri, &config(IpFamily::Any), t)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("host lookup of nowhere.example failed"),
            "{e}"
        );
    }

    #[test]
    fn getaddrinfo_resolves_localhost() {
        let r = KubeResolver::new(None, &Hook::default());
        let found = addresses(
            &r,
            "https://localhost:6443/",
            &config(IpFamily::Ipv4Only),
            within(None),
        );
        assert_eq!(found, [addr("127.0.0.1:6443")]);
    }

    /// ureq asks the resolver before every request, pooled connection or not: a name is
    /// not looked up there, only by the [`Dialer`] when it connects.
    #[test]
    fn a_name_is_looked_up_only_when_a_connection_is_made() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let (lookup, calls) = counting_lookup(vec![at]);
        let (hook, _) = counting_hook(true);
        let r = KubeResolver::with_lookup(None, &hook, lookup);
        let uri: Uri = format!("http://api.example:{}/", at.port())
            .parse()
            .unwrap();
        let cfg = config(IpFamily::Any);
        let t = within(Some(Duration::from_secs(5)));
        assert!(r.resolve(&uri, &cfg, t).unwrap().is_empty());
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        let details = |addrs| ConnectionDetails {
            uri: &uri,
            addrs,
            config: &cfg,
            request_level: false,
            resolver: &r,
            now: ureq::unversioned::transport::time::Instant::now(),
            timeout: t,
            current_time: Arc::new(ureq::unversioned::transport::time::Instant::now),
            run_connector: Arc::new(|_| unreachable!("no proxy")),
            register_shutdown: Arc::new(|_| Ok(())),
        };
        let dialer = Dialer::new(&r);
        let conn = dialer.connect(&details(r.empty()), None::<()>).unwrap();
        assert!(conn.is_some());
        listener.accept().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Addresses already given (an IP address's) are used as they are.
        let mut given = r.empty();
        given.push(at);
        assert!(dialer
            .connect(&details(given), None::<()>)
            .unwrap()
            .is_some());
        listener.accept().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
