//! The kubelet emulator (`podalloc_sim::emulator`) as a program: binds and runs the pods of
//! the given namespaces on a real kube-apiserver with the simulator's kubelet model, until
//! SIGTERM or Ctrl-C. For benchmarks on `scripts/controlplane.sh start` and for trying
//! podalloc against a real API server by hand.
//!
//! ```text
//! cargo run --release -p podalloc-sim --example kubelet -- \
//!     --server https://127.0.0.1:PORT --ca ca.crt --token-file admin.token \
//!     --namespace bench [--namespace other] [--startup-ms 300] [--schedule-ms 50]
//! ```
//!
//! The token must be an admin's: the emulator creates a Node, binds pods and writes their
//! status. Prints `emulating NAMESPACES on SERVER` once it follows the pods.
//!
//! The process kubelet (`podalloc_sim::process`): with `--classpath-file FILE` every Spark
//! executor pod of the namespaces runs as a local JVM (`--java`, default `java`), with its
//! working directory under `--work-dir` (default `./pods`) and its output in
//! `--log-dir/<pod>.log` (default `./logs`); other pods are left alone. SIGTERM or Ctrl-C
//! then stops the processes too (SIGTERM, SIGKILL after 5 s).

use podalloc_sim::emulator::{EmulatorOptions, KubeletEmulator};
use podalloc_sim::process::ProcessOptions;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static STOP: AtomicBool = AtomicBool::new(false);

/// Prints the process kubelet's lines (`podalloc_sim::process`, info and up) and every
/// warning, each with the wall-clock time in epoch milliseconds.
struct Log;

impl log::Log for Log {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
            || (m.level() <= log::Level::Info && m.target().starts_with("podalloc_sim::process"))
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            println!("{ms} {} {}", r.level(), r.args());
        }
    }

    fn flush(&self) {}
}

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn value(args: &[String], flag: &str) -> Vec<String> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].clone())
        .collect()
}

fn one(args: &[String], flag: &str) -> Option<String> {
    value(args, flag).pop()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: kubelet --server URL --ca FILE --token-file FILE --namespace NS... \
                 [--schedule-ms N] [--startup-ms N] [--stop-ms N] \
                 [--classpath-file FILE [--java JAVA] [--work-dir DIR] [--log-dir DIR]]";
    let (Some(server), Some(ca), Some(token)) = (
        one(&args, "--server"),
        one(&args, "--ca"),
        one(&args, "--token-file"),
    ) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let read = |p: &str| {
        std::fs::read_to_string(p).unwrap_or_else(|e| {
            eprintln!("kubelet: {p}: {e}");
            std::process::exit(2)
        })
    };
    let ms = |flag: &str, default: u64| {
        one(&args, flag)
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{flag}: a whole number of ms"))
            })
            .map_or(Duration::from_millis(default), Duration::from_millis)
    };
    let process = one(&args, "--classpath-file").map(|cp| {
        let dir = |flag: &str, default: &str| one(&args, flag).unwrap_or(default.into());
        let java = dir("--java", "java");
        let (work, logs) = (dir("--work-dir", "pods"), dir("--log-dir", "logs"));
        ProcessOptions::new(&java, Path::new(&cp), Path::new(&work), Path::new(&logs))
            .unwrap_or_else(|e| {
                eprintln!("kubelet: {e}");
                std::process::exit(2)
            })
    });
    let opts = EmulatorOptions {
        schedule_latency: ms("--schedule-ms", 50),
        startup_latency: ms("--startup-ms", 300),
        stop_latency: ms("--stop-ms", 100),
        process,
        ..EmulatorOptions::default()
    };
    let _ = log::set_logger(&Log).map(|()| log::set_max_level(log::LevelFilter::Info));
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    let emu =
        KubeletEmulator::start(&server, &read(&ca), read(&token).trim()).unwrap_or_else(|e| {
            eprintln!("kubelet: {e}");
            std::process::exit(1)
        });
    let namespaces = value(&args, "--namespace");
    for ns in &namespaces {
        if let Err(e) = emu.manage(ns, opts.clone()) {
            eprintln!("kubelet: listing the pods of namespace {ns}: {e}");
            std::process::exit(1)
        }
    }
    println!("emulating {} on {server}", namespaces.join(","));
    // SIGTERM and SIGINT stop the emulator (and the process kubelet's processes).
    let mut said = None;
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        let e = emu.watch_error();
        if e.is_some() && e != said {
            eprintln!("kubelet: watch: {}", e.as_deref().unwrap_or(""));
            said = e;
        }
    }
    // The processes, not the threads: the watch thread may sit in its 30 s request.
    emu.stop_processes();
    println!("stopped");
    std::process::exit(0);
}
