//! Reading an input file (a kubeconfig, a token or PEM file; outside this module: an apps
//! file, a pod template, a config file) so that a wrong path can neither hang the process nor
//! exhaust its memory: only regular files are read (a FIFO, `/dev/zero`, a socket or a
//! directory is refused with one line, without waiting for a writer), and at most a bound.

use std::io::{self, Read};
use std::path::Path;

/// The most bytes an input file may hold: 4 MiB (a pod template or a kubeconfig with
/// embedded certificates is kilobytes; the API server's largest object is 1.5 MiB).
pub const MAX_INPUT_FILE_BYTES: u64 = 4 << 20;

/// Reads `path` (symbolic links followed) when it is a regular file of at most `max` bytes.
/// The file is opened without blocking (`O_NONBLOCK`), so a FIFO swapped in after the check
/// does not wait for a writer, and checked again once open.
///
/// Errors: the open or read error; `InvalidInput` "is not a regular file (…)" naming what it
/// is; `InvalidData` "is larger than N bytes".
pub fn read_regular_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let kind = |t: std::fs::FileType| match () {
        _ if t.is_file() => None,
        _ if t.is_dir() => Some("a directory"),
        _ if t.is_fifo() => Some("a FIFO"),
        _ if t.is_socket() => Some("a socket"),
        _ if t.is_char_device() || t.is_block_device() => Some("a device"),
        _ => Some("not a file"),
    };
    let refuse = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("is not a regular file ({what}): refused"),
        )
    };
    if let Some(what) = kind(std::fs::metadata(path)?.file_type()) {
        return Err(refuse(what));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if let Some(what) = kind(file.metadata()?.file_type()) {
        return Err(refuse(what));
    }
    let mut out = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("is larger than {max} bytes: refused"),
        ));
    }
    Ok(out)
}

/// [`read_regular_file`] as UTF-8 text. Errors as it, and `InvalidData` for bytes that are
/// not UTF-8.
pub fn read_regular_text(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read_regular_file(path, max)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bounded_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, "12345").unwrap();
        assert_eq!(read_regular_text(&f, 5).unwrap(), "12345");
        let e = read_regular_file(&f, 4).unwrap_err();
        assert!(e.to_string().contains("larger than 4 bytes"), "{e}");
        let e = read_regular_file(Path::new("/dev/zero"), 10).unwrap_err();
        assert!(e.to_string().contains("(a device)"), "{e}");
        let e = read_regular_file(dir.path(), 10).unwrap_err();
        assert!(e.to_string().contains("(a directory)"), "{e}");
        let fifo = dir.path().join("fifo");
        let mode = rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR;
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, mode, 0).unwrap();
        let e = read_regular_file(&fifo, 10).unwrap_err();
        assert!(e.to_string().contains("(a FIFO)"), "{e}");
    }
}
