//! The engine's purity, checked: no file in `src/engine/` names a way to do I/O, read a
//! clock, log, print, start a thread or a process, or read the environment, outside its
//! `#[cfg(test)]` part. (That it imports nothing of `crate::kube` is the layer test's,
//! `src/layers.rs`; the wire format it shares with the client is `crate::wire`.) Reading from a caller's `std::io::Read` (the streamed PodList) is
//! allowed: the caller owns the connection, the engine only parses bytes.

use std::path::Path;

/// Names that mean the code does I/O, reads a clock or logs.
const FORBIDDEN: &[&str] = &[
    "std::fs",
    "std::net",
    "std::thread",
    "std::process",
    "std::env",
    "std::time::SystemTime",
    "SystemTime::",
    "Instant::now",
    "std::io::stdin",
    "std::io::stdout",
    "std::io::stderr",
    "File::",
    "TcpStream",
    "log::",
    "println!",
    "eprintln!",
    "print!(",
    "eprint!(",
    "dbg!(",
    "ureq::",
    "rand::",
    // The client and the files it reads, however named.
    "kube::read_regular",
    "kube::MAX_INPUT",
    "KubeClient",
];

/// The non-test text of a source file: everything before its first `#[cfg(test)]` line.
fn non_test_part(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

fn visit(dir: &Path, found: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            visit(&path, found);
        } else if name.ends_with(".rs") && name != "purity.rs" && !name.ends_with("tests.rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in non_test_part(&text).lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                for f in FORBIDDEN.iter().filter(|f| code.contains(*f)) {
                    found.push(format!("{}:{}: {f}", path.display(), n + 1));
                }
            }
        }
    }
}

#[test]
fn the_engine_does_no_io_reads_no_clock_and_logs_nothing() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine");
    let mut found = Vec::new();
    visit(&dir, &mut found);
    assert!(
        found.is_empty(),
        "impure code in src/engine:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_finds_what_it_looks_for() {
    let text = "use std::fs;\nfn f() { log::info!(\"x\"); }\n#[cfg(test)]\nuse std::net;";
    let part = non_test_part(text);
    let hits: Vec<_> = FORBIDDEN.iter().filter(|f| part.contains(*f)).collect();
    assert_eq!(hits, [&"std::fs", &"log::"]);
}
