//! The error type of the command line and its exit codes.
//!
//! Every failure that reaches `main` is one [`Error`]: a one-line message that names the thing
//! that went wrong and the fix, and an [`ExitCode`] documented in `--help` and the README.

use std::fmt;

/// Process exit codes, documented in `--help` and in the README's exit-code table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitCode {
    /// 0: the tick (or command) finished.
    Ok = 0,
    /// 1: runtime error: the API server or the local file system failed; the next tick may succeed.
    Runtime = 1,
    /// 2: usage, configuration or bad input (flags, kubeconfig, template, state file, PodList).
    Usage = 2,
    /// 3: another podalloc run holds the state lock, or a `run` loop owns the app; this run
    /// did nothing.
    Locked = 3,
    /// 4: the API server refused permanently (403 Forbidden by RBAC, 422 Invalid) or TLS
    /// failed (untrusted certificate, wrong host name): fix the service account's
    /// permissions, the pod template, the CA or the server name; retrying will not help.
    Refused = 4,
    /// 5: `run --timeout` (or `scale --wait --timeout`) expired before the target was reached.
    Timeout = 5,
    /// 6: the crash-loop guard (`--max-failures`) stopped creation: too many executors
    /// failed within the window.
    CrashLoop = 6,
    /// 7: the driver pod (`--driver-pod`) has finished (Succeeded or Failed) or is being
    /// deleted: the app's executors were deleted and none is created; `run` stops.
    DriverEnded = 7,
}

/// A failure with its exit code. `Display` is the one-line message printed on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The exit code the process ends with.
    pub code: ExitCode,
    /// One line: what failed, naming the input, and what to do.
    pub message: String,
}

impl Error {
    /// A usage/configuration/bad-input error (exit 2).
    pub fn usage(message: impl Into<String>) -> Error {
        Error {
            code: ExitCode::Usage,
            message: message.into(),
        }
    }
    /// A runtime error (exit 1).
    pub fn runtime(message: impl Into<String>) -> Error {
        Error {
            code: ExitCode::Runtime,
            message: message.into(),
        }
    }
    /// Another run holds the lock (exit 3).
    pub fn locked(message: impl Into<String>) -> Error {
        Error {
            code: ExitCode::Locked,
            message: message.into(),
        }
    }
    /// A permanent refusal by the API server (exit 4).
    pub fn refused(message: impl Into<String>) -> Error {
        Error {
            code: ExitCode::Refused,
            message: message.into(),
        }
    }
    /// The crash-loop guard tripped (exit 6).
    pub fn crash_loop(message: impl Into<String>) -> Error {
        Error {
            code: ExitCode::CrashLoop,
            message: message.into(),
        }
    }
    /// The driver pod has finished or is going away (exit 7).
    pub fn driver_ended(message: impl Into<String>) -> Error {
        Error {
            code: ExitCode::DriverEnded,
            message: message.into(),
        }
    }
    /// A timeout before convergence (exit 5).
    pub fn timeout(message: impl Into<String>) -> Error {
        Error {
            code: ExitCode::Timeout,
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One line whatever the source said: control characters (newlines, NUL, terminal
        // escapes from a server's body) become spaces, and the line is kept to 2,000 chars.
        let mut line: String = self
            .message
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if let Some((i, _)) = line.char_indices().nth(2000) {
            line.truncate(i);
            line.push('…');
        }
        f.write_str(line.trim())
    }
}

impl std::error::Error for Error {}

/// Shorthand for results whose error is an [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_one_bounded_line_without_control_characters() {
        let e = Error::runtime("a\nb\r\u{1b}[31mred\u{0}z");
        assert_eq!(e.to_string(), "a b  [31mred z");
        let long = Error::runtime("x".repeat(5000));
        assert_eq!(long.to_string().chars().count(), 2001);
    }
}
