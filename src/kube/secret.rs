//! Values that must not reach logs, errors or `Debug` output: [`Secret`], and PEM material
//! with its source ([`PemData`], [`KeyData`]).
//!
//! Both the connection configuration (`config/`) and the exec credential plugins (`exec.rs`)
//! produce these; they live here so that neither has to import the other.

use std::fmt;

/// A value that must not be logged: `Debug` prints `<redacted>`, and there is no `Display`.
/// Read it with [`Secret::expose`] only where it is sent.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    /// Wraps a secret value.
    pub fn new(value: T) -> Self {
        Secret(value)
    }
    /// The secret value itself.
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl From<String> for Secret<String> {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

impl From<&str> for Secret<String> {
    fn from(value: &str) -> Self {
        Secret(value.to_string())
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// PEM bytes plus a description of where they came from (a file name, or a kubeconfig
/// `*-data` field), used in error messages. `Debug` shows the source and the length only.
#[derive(Clone)]
pub struct PemData {
    /// e.g. `/etc/ca.pem` or `certificate-authority-data of cluster "c" in kubeconfig /k`.
    pub source: String,
    /// The PEM text.
    pub pem: Vec<u8>,
}

impl fmt::Debug for PemData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemData")
            .field("source", &self.source)
            .field("bytes", &self.pem.len())
            .finish()
    }
}

/// A PEM private key plus where it came from. `Debug` redacts the key.
#[derive(Clone, Debug)]
pub struct KeyData {
    /// Where the key came from (file or kubeconfig field), safe to print.
    pub source: String,
    /// The PEM text; redacted in `Debug`.
    pub pem: Secret<Vec<u8>>,
}

/// Bearer tokens a client has sent, so that text quoted from a server (an error body that
/// echoes the `Authorization` header, a proxy's debug page) never shows one: the logger and
/// the final error line pass every message through [`Redactions::scrub`]. A value, not a
/// process-wide list: `main` makes one, gives a clone to the logger and one to the client
/// ([`crate::kube::ClientOptions::redactions`]); every clone is the same list.
#[derive(Clone, Default)]
pub struct Redactions(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Redactions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers `token` as a secret to scrub from output (tokens shorter than 8 characters
    /// are left: they would blank ordinary words). Cheap when already known.
    pub fn remember(&self, token: &str) {
        if token.len() < 8 {
            return;
        }
        let mut sent = self.lock();
        if !sent.iter().any(|t| t == token) {
            sent.push(token.to_string());
        }
    }

    /// `text` with every token [`Redactions::remember`] was given replaced by `[redacted]`.
    pub fn scrub<'t>(&self, text: &'t str) -> std::borrow::Cow<'t, str> {
        let sent = self.lock();
        let mut out = std::borrow::Cow::Borrowed(text);
        for t in sent.iter() {
            if out.contains(t.as_str()) {
                out = std::borrow::Cow::Owned(out.replace(t.as_str(), "[redacted]"));
            }
        }
        out
    }
}

/// Shows how many tokens are remembered, never one of them.
impl fmt::Debug for Redactions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactions({} tokens)", self.lock().len())
    }
}

/// Two handles are equal when they are the same list.
impl PartialEq for Redactions {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Redactions {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_secret() {
        let s = Secret::new("tok123".to_string());
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(s.expose(), "tok123");
        let key = KeyData {
            source: "/k.pem".into(),
            pem: Secret::new(b"PRIVATE KEY".to_vec()),
        };
        let dbg = format!("{key:?}");
        assert!(dbg.contains("/k.pem") && !dbg.contains("PRIVATE"), "{dbg}");
        let pem = PemData {
            source: "/ca.pem".into(),
            pem: b"CERT".to_vec(),
        };
        assert_eq!(
            format!("{pem:?}"),
            "PemData { source: \"/ca.pem\", bytes: 4 }"
        );
    }

    #[test]
    fn remembered_tokens_are_scrubbed_from_text() {
        let r = Redactions::default();
        r.remember("scrub-me-0123456789");
        r.remember("short");
        let scrub = |t| r.scrub(t);
        let quoted = "401: <html>Authorization=Bearer scrub-me-0123456789</html> short";
        assert_eq!(
            scrub(quoted),
            "401: <html>Authorization=Bearer [redacted]</html> short"
        );
        assert_eq!(scrub("nothing here"), "nothing here");
    }
}
