//! Durations in the configuration: written with a unit everywhere (`200ms`, `2s`, `1m`, `1h30m`,
//! humantime's forms), so `--debounce-after 10` is refused instead of read as 10 nanoseconds.
//! One exception, for the reference control plane's files (wire.md §4): a YAML *integer* is
//! nanoseconds (`after: 100000000`). A bare `0` means zero in any unit.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};

/// What a duration is written like, for error messages.
const FORM: &str = "write a duration with its unit, such as 200ms, 2s, 1m or 1h30m";

/// The clap parser of every duration setting: [`parse_duration`], with an error that starts
/// with where the value came from (`--debounce-after: ...`, or the variable when it came from
/// one), since clap's own message names only the flag even for a value the user set in the
/// environment.
#[derive(Debug, Clone, Copy)]
pub struct DurationArg;

impl clap::builder::TypedValueParser for DurationArg {
    type Value = Duration;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Duration, clap::Error> {
        let source = arg.map_or_else(|| "duration".to_owned(), |arg| source_of(arg, value));
        let parsed = match value.to_str() {
            Some(text) => parse_duration(text),
            None => Err(format!("{value:?} is not UTF-8; {FORM}")),
        };
        parsed.map_err(|reason| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("{source}: {reason}\n"),
            )
            .with_cmd(cmd)
        })
    }
}

/// `--flag`, or `VARIABLE (--flag)` when the variable holds the value (clap reads a variable
/// only when the flag is absent).
fn source_of(arg: &clap::Arg, value: &std::ffi::OsStr) -> String {
    let flag = arg
        .get_long()
        .map_or_else(|| arg.get_id().to_string(), |long| format!("--{long}"));
    match arg.get_env() {
        Some(var) if std::env::var_os(var).as_deref() == Some(value) => {
            format!("{} ({flag})", var.to_string_lossy())
        }
        _ => flag,
    }
}

/// A duration from a flag, an environment variable or a YAML string.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!("{text:?} has no unit; {FORM}"));
    }
    humantime::parse_duration(text)
        .map_err(|err| format!("invalid duration {text:?}: {err}; {FORM}"))
}

/// Human strings out.
pub fn serialize<S: Serializer>(value: &Duration, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(&humantime::format_duration(*value).to_string())
}

/// Human strings, or integer nanoseconds (the reference's files), in.
pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Duration, D::Error> {
    de.deserialize_any(DurationVisitor)
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a duration with its unit (100ms, 10s), or integer nanoseconds")
    }

    fn visit_u64<E: de::Error>(self, nanos: u64) -> Result<Duration, E> {
        Ok(Duration::from_nanos(nanos))
    }

    fn visit_i64<E: de::Error>(self, nanos: i64) -> Result<Duration, E> {
        u64::try_from(nanos)
            .map(Duration::from_nanos)
            .map_err(|_| E::custom(format!("negative duration {nanos}")))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        parse_duration(text).map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_carry_units() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(
            parse_duration("10"),
            Err("\"10\" has no unit; write a duration with its unit, such as 200ms, 2s, 1m or 1h30m".to_owned())
        );
        assert!(parse_duration("1.5").is_err());
        assert!(parse_duration("").is_err());
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("such as 200ms")
        );
        assert!(parse_duration("-5s").is_err());
    }
}
