//! A network partition between one client and the real API server: a TCP proxy on loopback
//! that forwards the client's connections (TLS passes through untouched; the server's
//! certificate names 127.0.0.1) until [`Partition::cut`]. During a cut no byte goes either
//! way: what the client sends is dropped (a request not yet wholly forwarded never reaches
//! the server, as the simulator's `cut_off` has it), its calls hang, and new connections are
//! accepted but never forwarded. When the cut ends every connection that saw traffic during
//! it is closed (the client sees a reset, not the simulator's 504), and connections made
//! after it are forwarded again.
//!
//! [`Partition::lose_next_answer`] loses one answer: the next request of at least a given
//! size (a write: a GET is a few hundred bytes) is forwarded whole, and when the server's
//! answer comes back the connection is closed instead of passing it on, as a connection
//! lost after the server carried out the request (the simulator's `lost-response` fault).
//! [`Partition::lose_next_answer_then_hold`] then holds the route a while, so the client's
//! retry reaches the server late (the simulator's `lost-response` then `delay:MS`), after
//! another client's request.
//!
//! [`Partition::slow_answers`] makes large answers slow: what the server sends until it
//! pauses (an answer), when it is at least a given size (a pod list: a Lease's answer is
//! under a kilobyte), is passed on only after a delay, on its own connection, while the
//! client's other connections (its Lease client's) go on.
//!
//! [`Partition::hold_from_next_write`] is the other kind of partition, which TCP makes of a
//! short outage, from the client's next large write on: the bytes are kept, not lost, and delivered when it ends, in order, even those of a client
//! that has given up and closed its connection meanwhile (its FIN comes after its data). A
//! request sent during the hold reaches the server late, and is carried out then.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A proxy to one upstream `host:port`; it stops when dropped.
pub struct Partition {
    /// `https://127.0.0.1:PORT` of the proxy.
    pub url: String,
    cut_until: Arc<Mutex<Cut>>,
    /// Armed by [`Partition::lose_next_answer`]: the size from which a request (bytes read
    /// from the client at once) has its answer lost; disarmed by that request.
    lose: Arc<Mutex<Option<usize>>>,
    /// Armed by [`Partition::lose_next_answer_then_hold`]: how long the route is held once
    /// the answer is lost; disarmed then.
    then_hold: Arc<Mutex<Option<Duration>>>,
    /// Armed by [`Partition::hold_from_next_write`]: (min bytes, hold).
    hold_next: Arc<Mutex<Option<(usize, Duration)>>>,
    /// Set by [`Partition::slow_answers`]: (min bytes, delay).
    slow: Arc<Mutex<Option<(usize, Duration)>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

/// Until when the route is cut, and whether bytes are held (else dropped).
#[derive(Default)]
struct Cut {
    until: Option<Instant>,
    hold: bool,
}

impl Partition {
    /// A proxy to the server at `url` (`https://127.0.0.1:PORT`).
    pub fn start(url: &str) -> Partition {
        let upstream = url.trim_start_matches("https://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut_until: Arc<Mutex<Cut>> = Arc::default();
        let lose: Arc<Mutex<Option<usize>>> = Arc::default();
        let stop: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let then_hold: Arc<Mutex<Option<Duration>>> = Arc::default();
        let (cut, halt, armed) = (cut_until.clone(), stop.clone(), lose.clone());
        let hold_after = then_hold.clone();
        let slow: Arc<Mutex<Option<(usize, Duration)>>> = Arc::default();
        let hold_next: Arc<Mutex<Option<(usize, Duration)>>> = Arc::default();
        let (slowed, hold_armed) = (slow.clone(), hold_next.clone());
        std::thread::spawn(move || {
            while !halt.load(std::sync::atomic::Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (cut, upstream) = (cut.clone(), upstream.clone());
                        let (armed, hold) = (armed.clone(), hold_after.clone());
                        let (slowed, hold_armed) = (slowed.clone(), hold_armed.clone());
                        std::thread::spawn(move || {
                            let armed = (&*armed, &hold, &slowed, &*hold_armed);
                            serve(client, &upstream, &cut, armed)
                        });
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(_) => return,
                }
            }
        });
        Partition {
            url: format!("https://127.0.0.1:{port}"),
            cut_until,
            lose,
            then_hold,
            hold_next,
            slow,
            stop,
        }
    }

    /// As [`Partition::lose_next_answer`], then holds the route for `d` from the moment the
    /// answer is lost (as [`Partition::hold_from_next_write`] holds it): the client's retry
    /// is carried out after `d`.
    pub fn lose_next_answer_then_hold(&self, min_bytes: usize, d: Duration) {
        *self.then_hold.lock().unwrap() = Some(d);
        self.lose_next_answer(min_bytes);
    }

    /// Loses the answer to the client's next request of at least `min_bytes` (see the
    /// module doc): the server carries it out, the client sees its connection closed.
    pub fn lose_next_answer(&self, min_bytes: usize) {
        *self.lose.lock().unwrap() = Some(min_bytes);
    }

    /// Cuts the client off for `d` from now: what either side sends meanwhile is lost.
    pub fn cut(&self, d: Duration) {
        *self.cut_until.lock().unwrap() = Cut {
            until: Some(Instant::now() + d),
            hold: false,
        };
    }

    /// Holds everything either side sends for `d` from the client's next request of at
    /// least `min_bytes` (a write: a GET or a Lease's update is a few hundred), that request
    /// held first, then delivers it: a write sent while its writer still leads is carried
    /// out late.
    pub fn hold_from_next_write(&self, min_bytes: usize, d: Duration) {
        *self.hold_next.lock().unwrap() = Some((min_bytes, d));
    }

    /// From now on, passes every answer (what the server sends until it pauses for 20 ms)
    /// of at least `min_bytes` on `delay` after it came, a smaller one at the pause (the
    /// connection's later bytes wait behind it).
    pub fn slow_answers(&self, min_bytes: usize, delay: Duration) {
        *self.slow.lock().unwrap() = Some((min_bytes, delay));
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// `Some(hold)` while the route is cut.
fn cut_now(cut: &Mutex<Cut>) -> Option<bool> {
    let c = cut.lock().unwrap();
    c.until
        .is_some_and(|t| Instant::now() < t)
        .then_some(c.hold)
}

/// Reads and drops what `s` sends until the cut is over; then closes it.
fn swallow(s: &TcpStream, cut: &Mutex<Cut>) {
    let mut buf = [0u8; 16 * 1024];
    let mut s = s;
    while cut_now(cut).is_some() {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = s.shutdown(Shutdown::Both);
}

/// What [`serve`] is armed with: the armed size of a lost answer and the hold that follows
/// it, the slow answers, the hold from the next write.
type Losing<'a> = (
    &'a Mutex<Option<usize>>,
    &'a Arc<Mutex<Option<Duration>>>,
    &'a Arc<Mutex<Option<(usize, Duration)>>>,
    &'a Mutex<Option<(usize, Duration)>>,
);

fn serve(
    client: TcpStream,
    upstream: &str,
    cut: &Arc<Mutex<Cut>>,
    (lose, hold, slow, hold_next): Losing<'_>,
) {
    let tick = Some(Duration::from_millis(20));
    client.set_nonblocking(false).unwrap();
    client.set_read_timeout(tick).unwrap();
    // A connection made during a hold waits for its end, then is forwarded.
    while cut_now(cut) == Some(true) {
        std::thread::sleep(Duration::from_millis(5));
    }
    if cut_now(cut).is_some() {
        return swallow(&client, cut);
    }
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    server.set_read_timeout(tick).unwrap();
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let cut2 = cut.clone();
    // Set once this connection forwarded the request whose answer is to be lost.
    let losing: Arc<std::sync::atomic::AtomicBool> = Arc::default();
    let (lost, hold, slow) = (losing.clone(), hold.clone(), slow.clone());
    let back = std::thread::spawn(move || pump(&s2, &c2, &cut2, Lose::Answer(&lost, &hold, &slow)));
    pump(
        &client,
        &server,
        cut,
        Lose::Request(lose, &losing, hold_next),
    );
    let _ = back.join();
}

/// What a [`pump`] does about a lost answer ([`Partition::lose_next_answer`]).
#[derive(Clone, Copy)]
enum Lose<'a> {
    /// Client to server: a chunk of at least the armed size, forwarded, disarms it and
    /// marks the connection; the third, [`Partition::hold_from_next_write`]'s arm.
    Request(
        &'a Mutex<Option<usize>>,
        &'a std::sync::atomic::AtomicBool,
        &'a Mutex<Option<(usize, Duration)>>,
    ),
    /// Server to client: once the connection is marked, what the server sends is dropped
    /// and the connection closed, then the route held for the armed time, if any; the
    /// third, [`Partition::slow_answers`].
    Answer(
        &'a std::sync::atomic::AtomicBool,
        &'a Mutex<Option<Duration>>,
        &'a Mutex<Option<(usize, Duration)>>,
    ),
}

impl Lose<'_> {
    /// After forwarding `n` bytes from the client: marks the connection when armed for them.
    fn forwarded(self, n: usize) {
        if let Lose::Request(armed, mark, _) = self {
            let mut a = armed.lock().unwrap();
            if a.is_some_and(|min| n >= min) {
                *a = None;
                mark.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// Whether bytes from the server are to be dropped, the connection closed.
    fn drops(self) -> bool {
        matches!(self, Lose::Answer(m, _, _) if m.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// After an answer was dropped: holds the route when armed to.
    fn dropped(self, cut: &Mutex<Cut>) {
        if let Lose::Answer(_, hold, _) = self {
            if let Some(d) = hold.lock().unwrap().take() {
                *cut.lock().unwrap() = Cut {
                    until: Some(Instant::now() + d),
                    hold: true,
                };
            }
        }
    }

    /// Before passing on `n` bytes from the client: starts the armed hold when they are
    /// enough ([`Partition::hold_from_next_write`]).
    fn start_hold(self, n: usize, cut: &Mutex<Cut>) {
        if let Lose::Request(_, _, arm) = self {
            let mut a = arm.lock().unwrap();
            if let Some((_, d)) = a.filter(|(min, _)| n >= *min) {
                *a = None;
                *cut.lock().unwrap() = Cut {
                    until: Some(Instant::now() + d),
                    hold: true,
                };
            }
        }
    }

    /// Whether answers are slow ([`Partition::slow_answers`]): (min bytes, delay).
    fn slow(self) -> Option<(usize, Duration)> {
        match self {
            Lose::Answer(_, _, slow) => *slow.lock().unwrap(),
            Lose::Request(..) => None,
        }
    }
}

/// Copies `from` to `to` until either closes; a chunk read during a cut is dropped, and the
/// connection is closed once that cut is over; during a hold it is kept (with the close, if
/// `from` closes) and delivered when the hold ends; `lose` loses an answer.
fn pump(from: &TcpStream, to: &TcpStream, cut: &Mutex<Cut>, lose: Lose<'_>) {
    let mut buf = [0u8; 16 * 1024];
    let (mut from, mut to) = (from, to);
    let mut held: Vec<u8> = Vec::new();
    let mut closed = false;
    // An answer read while answers are slow, passed on at the server's next pause.
    let mut answer: Vec<u8> = Vec::new();
    loop {
        let state = cut_now(cut);
        if state.is_none() && (!held.is_empty() || closed) {
            if to.write_all(&held).is_err() || closed {
                break;
            }
            held.clear();
        }
        if closed {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) if cut_now(cut) == Some(true) => closed = true,
            Ok(0) => {
                let _ = to.write_all(&held);
                break;
            }
            Ok(n) => match (lose.start_hold(n, cut), cut_now(cut)).1 {
                Some(true) => held.extend_from_slice(&buf[..n]),
                Some(false) => {
                    swallow(from, cut);
                    break;
                }
                None if !held.is_empty() => held.extend_from_slice(&buf[..n]),
                None if lose.drops() => {
                    lose.dropped(cut);
                    break;
                }
                None if lose.slow().is_some() => answer.extend_from_slice(&buf[..n]),
                None => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    lose.forwarded(n);
                }
            },
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                // A pause of the server (one read timeout, 20 ms): the answer so far is
                // whole; a large one is passed on late.
                if let (false, Some((min, d))) = (answer.is_empty(), lose.slow()) {
                    if answer.len() >= min {
                        std::thread::sleep(d);
                    }
                    if to.write_all(&std::mem::take(&mut answer)).is_err() {
                        break;
                    }
                }
            }
            Err(_) => break,
        }
    }
    let _ = to.write_all(&answer);
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
