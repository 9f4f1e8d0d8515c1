//! A network partition between one client and the real API server: a TCP proxy on loopback
//! that forwards the client's connections (TLS passes through untouched; the server's
//! certificate names 127.0.0.1) until [`Partition::cut`]. During a cut no byte goes either
//! way: what the client sends is dropped (a request not yet wholly forwarded never reaches
//! the server, as the simulator's `cut_off` has it), its calls hang, and new connections are
//! accepted but never forwarded. When the cut ends every connection that saw traffic during
//! it is closed (the client sees a reset, not the simulator's 504), and connections made
//! after it are forwarded again.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A proxy to one upstream `host:port`; it stops when dropped.
pub struct Partition {
    /// `https://127.0.0.1:PORT` of the proxy.
    pub url: String,
    cut_until: Arc<Mutex<Option<Instant>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Partition {
    /// A proxy to the server at `url` (`https://127.0.0.1:PORT`).
    pub fn start(url: &str) -> Partition {
        let upstream = url.trim_start_matches("https://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut_until: Arc<Mutex<Option<Instant>>> = Arc::default();
        let stop: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let (cut, halt) = (cut_until.clone(), stop.clone());
        std::thread::spawn(move || {
            while !halt.load(std::sync::atomic::Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (cut, upstream) = (cut.clone(), upstream.clone());
                        std::thread::spawn(move || serve(client, &upstream, &cut));
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
            stop,
        }
    }

    /// Cuts the client off for `d` from now.
    pub fn cut(&self, d: Duration) {
        *self.cut_until.lock().unwrap() = Some(Instant::now() + d);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn cut_now(cut: &Mutex<Option<Instant>>) -> bool {
    cut.lock().unwrap().is_some_and(|t| Instant::now() < t)
}

/// Reads and drops what `s` sends until the cut is over; then closes it.
fn swallow(s: &TcpStream, cut: &Mutex<Option<Instant>>) {
    let mut buf = [0u8; 16 * 1024];
    let mut s = s;
    while cut_now(cut) {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = s.shutdown(Shutdown::Both);
}

fn serve(client: TcpStream, upstream: &str, cut: &Arc<Mutex<Option<Instant>>>) {
    let tick = Some(Duration::from_millis(20));
    client.set_nonblocking(false).unwrap();
    client.set_read_timeout(tick).unwrap();
    if cut_now(cut) {
        return swallow(&client, cut);
    }
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    server.set_read_timeout(tick).unwrap();
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let cut2 = cut.clone();
    let back = std::thread::spawn(move || pump(&s2, &c2, &cut2));
    pump(&client, &server, cut);
    let _ = back.join();
}

/// Copies `from` to `to` until either closes; a chunk read during a cut is dropped, and the
/// connection is closed once that cut is over.
fn pump(from: &TcpStream, to: &TcpStream, cut: &Mutex<Option<Instant>>) {
    let mut buf = [0u8; 16 * 1024];
    let (mut from, mut to) = (from, to);
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if cut_now(cut) {
                    swallow(from, cut);
                    break;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
