//! Small helpers with no better home: a seedable RNG, uuid-shaped ids, time formatting,
//! percent-decoding and a stable string hash.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// An `InvalidInput` I/O error with `msg`.
pub(crate) fn invalid_input(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, msg)
}

/// SplitMix64: a tiny, fast, seedable generator (Steele, Lea, Flood 2014). Good enough for
/// ids and simulated failures; not for anything that needs to be unpredictable.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    #[cfg(test)]
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// Seeded from the wall clock, the process id and a stack address: distinct per run.
    pub(crate) fn from_entropy() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let local = 0u8;
        let addr = &local as *const u8 as u64;
        SplitMix64(nanos ^ (u64::from(std::process::id()) << 32) ^ addr.rotate_left(17))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }
}

/// The SplitMix64 output function: a good 64-bit mixer.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A deterministic draw in [0, 1) for the `n`th event under `seed`.
pub(crate) fn unit_draw(seed: u64, n: u64) -> f64 {
    let x = mix64(seed ^ mix64(n.wrapping_add(0x5851_F42D_4C95_7F2D)));
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// A random version-4 UUID string, `xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx`.
pub(crate) fn uuid_v4(rng: &mut SplitMix64) -> String {
    let hi = rng.next_u64();
    let lo = rng.next_u64();
    let hi = (hi & 0xFFFF_FFFF_FFFF_0FFF) | 0x0000_0000_0000_4000;
    let lo = (lo & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

/// The alphabet of the apiserver's name generator (no vowels, no confusable characters).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// `n` random characters from the apiserver's generateName alphabet.
pub(crate) fn random_suffix(rng: &mut SplitMix64, n: usize) -> String {
    (0..n)
        .map(|_| NAME_ALPHABET[(rng.next_u64() % NAME_ALPHABET.len() as u64) as usize] as char)
        .collect()
}

/// FNV-1a, 64-bit: a stable hash for fake image and container ids.
pub(crate) fn fnv64(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
    h
}

/// 64 hex digits derived from `parts` (looks like a sha256 digest; it is not one).
pub(crate) fn hex64(parts: &[&str]) -> String {
    let mut h = fnv64(parts);
    let mut out = String::with_capacity(64);
    for _ in 0..4 {
        h = mix64(h);
        out.push_str(&format!("{h:016x}"));
    }
    out
}

/// Maps the monotonic clock to wall-clock time, so that every timestamp the simulator
/// writes follows from an `Instant` (tests can pass made-up instants).
#[derive(Clone, Copy, Debug)]
pub(crate) struct WallClock {
    base_instant: Instant,
    base_system: SystemTime,
}

impl WallClock {
    pub(crate) fn new() -> Self {
        WallClock {
            base_instant: Instant::now(),
            base_system: SystemTime::now(),
        }
    }

    /// The instant the clock was made (the server's start).
    pub(crate) fn start(&self) -> Instant {
        self.base_instant
    }

    /// The wall-clock time of `at`.
    pub(crate) fn system(&self, at: Instant) -> SystemTime {
        if at >= self.base_instant {
            self.base_system + (at - self.base_instant)
        } else {
            self.base_system - (self.base_instant - at)
        }
    }

    /// `at` as RFC 3339 with whole seconds, the way metav1.Time is serialised.
    pub(crate) fn rfc3339(&self, at: Instant) -> String {
        rfc3339(self.system(at))
    }
}

/// RFC 3339 in UTC with whole seconds, e.g. `2026-06-15T04:14:53Z`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// An IMF-fixdate for the HTTP `Date` header, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
pub(crate) fn http_date(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    const WD: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MON: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        WD[(days.rem_euclid(7)) as usize],
        d,
        MON[(m - 1) as usize],
        y,
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm: (year, month 1-12, day 1-31).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Percent-decodes `s`; with `plus_is_space`, `+` becomes a space (query strings).
/// Returns `None` for a malformed escape or a result that is not UTF-8.
pub(crate) fn percent_decode(s: &str, plus_is_space: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hi = (hex[0] as char).to_digit(16)?;
                let lo = (hex[1] as char).to_digit(16)?;
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Parses a query string the way Go's `url.Values` does for a server: `&`-separated
/// pairs, `+` as space, malformed pairs (bad escapes, `;`) silently dropped. A leading
/// `?&` is harmless.
pub(crate) fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty() && !p.contains(';'))
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((percent_decode(k, true)?, percent_decode(v, true)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_shaped_like_a_v4_uuid() {
        let mut rng = SplitMix64::new(7);
        let u = uuid_v4(&mut rng);
        assert_eq!(u.len(), 36);
        let parts: Vec<&str> = u.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert!(matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'));
    }

    #[test]
    fn dates_format_like_go() {
        let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(rfc3339(t), "1994-11-06T08:49:37Z");
    }

    #[test]
    fn query_decoding_handles_plus_percent_and_junk() {
        let q = parse_query("&labelSelector=a+in+%28x%2Cy%29,%21b&limit=5&bad=%zz&x");
        assert_eq!(
            q,
            vec![
                ("labelSelector".to_string(), "a in (x,y),!b".to_string()),
                ("limit".to_string(), "5".to_string()),
                ("x".to_string(), String::new()),
            ]
        );
    }

    #[test]
    fn unit_draw_is_deterministic_and_in_range() {
        for n in 0..1000 {
            let a = unit_draw(42, n);
            assert_eq!(a, unit_draw(42, n));
            assert!((0.0..1.0).contains(&a));
        }
        let mean: f64 = (0..10_000).map(|n| unit_draw(1, n)).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }
}
