//! Durations as users write them on the command line: `90s`, `1h30m`,
//! `2d`, `250ms`, or bare seconds. Parsed with `humantime`, plus bare
//! seconds and a ceiling, so a typo is a usage error and never a panic.

use std::time::Duration;

/// A duration on the command line: `90s`, `1h30m`, `2d`, `250ms`, or bare
/// seconds (`1.5`). Printed the same way (`--help` shows the defaults so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CliDuration(pub Duration);

impl From<Duration> for CliDuration {
    fn from(d: Duration) -> Self {
        CliDuration(d)
    }
}

impl std::str::FromStr for CliDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_duration(s).map(CliDuration)
    }
}

impl std::fmt::Display for CliDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_zero() {
            return f.write_str("0s");
        }
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// The longest duration any flag takes: a hundred years. Anything longer is
/// a typo, and is refused as a usage error rather than overflowing.
pub const MAX_CLI_DURATION: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

/// Parses a duration as users write them: `90s`, `1h30m`, `2d`, `250ms`,
/// `1.5` (bare seconds). Negative, non-finite and absurdly long values
/// (over [`MAX_CLI_DURATION`]) are errors, never panics.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let too_long = || format!("{s:?} is longer than the most any flag takes (100 years)");
    let d = if s
        .bytes()
        .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-' || b == b'+')
        && !s.is_empty()
    {
        let secs: f64 = s
            .parse()
            .map_err(|_| format!("{s:?} is not a duration (e.g. 250ms, 90s, 1h30m, 2d)"))?;
        if !secs.is_finite() || secs < 0.0 {
            return Err(format!("{s:?} must be a non-negative duration"));
        }
        Duration::try_from_secs_f64(secs).map_err(|_| too_long())?
    } else {
        humantime::parse_duration(s).map_err(|e| match e {
            humantime::DurationError::NumberOverflow => too_long(),
            e => format!("{s:?} is not a duration (e.g. 250ms, 90s, 1h30m, 2d): {e}"),
        })?
    };
    if d > MAX_CLI_DURATION {
        return Err(too_long());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = |s: &str| parse_duration(s).unwrap();
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok("15s"), Duration::from_secs(15));
        assert_eq!(ok("90s"), Duration::from_secs(90));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("2d"), Duration::from_secs(2 * 86400));
        assert_eq!(ok("1.5"), Duration::from_millis(1500));
        assert_eq!(ok("0"), Duration::ZERO);
        for bad in ["-1s", "-1", "x", "", "5 parsecs", "nan", "inf"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
        // Huge values are errors, not panics.
        for huge in [
            "99999999999999999999999h",
            "1e300",
            "200y",
            "99999999999999999999",
        ] {
            let e = parse_duration(huge).unwrap_err();
            assert!(
                e.contains("100 years") || e.contains("not a duration"),
                "{huge}: {e}"
            );
        }
    }

    #[test]
    fn printed_durations_parse_back() {
        for d in [
            Duration::ZERO,
            Duration::from_millis(250),
            Duration::from_secs(5400),
        ] {
            let printed = CliDuration(d).to_string();
            assert_eq!(parse_duration(&printed).unwrap(), d, "{printed}");
        }
    }
}
