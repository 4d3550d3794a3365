//! Durations written the way upstream writes them: `"5ms"`, `"1s"`, `"1m 30s"`.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Parses a humantime duration, with an error that says what is expected.
pub fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|error| {
        format!("expected a duration such as \"5ms\" or \"10s\", found \"{text}\" ({error})")
    })
}

pub fn format(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// `#[serde(with = "crate::config::duration")]` for `Duration` fields.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse(&text).map_err(serde::de::Error::custom)
}

pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*duration))
}

/// How a duration field looks in a schema (`describe`): a string such as `"5ms"`.
#[derive(schemars::JsonSchema)]
#[schemars(
    title = "duration",
    description = "a duration such as \"5ms\", \"10s\" or \"1m 30s\""
)]
pub struct Text(#[allow(dead_code)] String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_upstream_duration_strings_when_parsed_should_give_durations() {
        assert_eq!(parse("5ms").unwrap(), Duration::from_millis(5));
        assert_eq!(parse("1m 30s").unwrap(), Duration::from_secs(90));
    }

    #[test]
    fn given_garbage_when_parsed_should_say_what_is_expected() {
        let error = parse("soon").unwrap_err();
        assert!(error.contains("expected a duration"), "{error}");
    }
}
