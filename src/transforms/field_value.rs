//! The value a transform writes into a field: a static JSON value from the
//! config, or one computed per message (upstream's `FieldValue`).

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{Map, Value};

/// `value = { static = <json> }` or `value = { computed = "<kind>" }`
/// (`value.static = ...` in dotted TOML).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FieldValue {
    Static(Value),
    Computed(Computed),
}

/// Values computed for each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Computed {
    /// RFC 3339 in UTC with microseconds: `2026-01-02T03:04:05.123456Z`.
    DateTime,
    TimestampNanos,
    TimestampMicros,
    TimestampMillis,
    TimestampSeconds,
    UuidV4,
    UuidV7,
}

/// The current time, read at most once per message so every computed time
/// written into one message agrees.
#[derive(Debug, Default)]
pub struct Now(Option<SystemTime>);

impl Now {
    fn get(&mut self) -> SystemTime {
        *self.0.get_or_insert_with(SystemTime::now)
    }
}

impl FieldValue {
    /// The value to write into one message.
    pub fn produce(&self, now: &mut Now) -> Value {
        match self {
            FieldValue::Static(value) => value.clone(),
            FieldValue::Computed(kind) => kind.produce(now),
        }
    }
}

impl Computed {
    fn produce(self, now: &mut Now) -> Value {
        match self {
            Computed::DateTime => {
                Value::String(humantime::format_rfc3339_micros(now.get()).to_string())
            }
            Computed::TimestampNanos => Value::from(since_epoch(now, |elapsed| elapsed.as_nanos())),
            Computed::TimestampMicros => {
                Value::from(since_epoch(now, |elapsed| elapsed.as_micros()))
            }
            Computed::TimestampMillis => {
                Value::from(since_epoch(now, |elapsed| elapsed.as_millis()))
            }
            Computed::TimestampSeconds => {
                Value::from(since_epoch(now, |elapsed| u128::from(elapsed.as_secs())))
            }
            Computed::UuidV4 => Value::String(uuid::Uuid::new_v4().hyphenated().to_string()),
            Computed::UuidV7 => Value::String(uuid::Uuid::now_v7().hyphenated().to_string()),
        }
    }
}

/// Upstream writes timestamps as i64; a clock before the epoch gives 0.
fn since_epoch(now: &mut Now, unit: impl Fn(std::time::Duration) -> u128) -> i64 {
    now.get().duration_since(UNIX_EPOCH).map_or(0, |elapsed| {
        i64::try_from(unit(elapsed)).unwrap_or(i64::MAX)
    })
}

/// Writes `value` under `key`, replacing an existing value in place (it keeps
/// its position and the key is not allocated again).
pub fn set_field(map: &mut Map<String, Value>, key: &str, value: Value) {
    match map.get_mut(key) {
        Some(slot) => *slot = value,
        None => {
            map.insert(key.to_owned(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_computed_kinds_when_produced_should_have_upstream_shapes() {
        let mut now = Now::default();
        let date_time = Computed::DateTime.produce(&mut now);
        let text = date_time.as_str().unwrap();
        assert!(
            humantime::parse_rfc3339(text).is_ok() && text.ends_with('Z'),
            "{text}"
        );
        let seconds = Computed::TimestampSeconds
            .produce(&mut now)
            .as_i64()
            .unwrap();
        let millis = Computed::TimestampMillis
            .produce(&mut now)
            .as_i64()
            .unwrap();
        let micros = Computed::TimestampMicros
            .produce(&mut now)
            .as_i64()
            .unwrap();
        let nanos = Computed::TimestampNanos.produce(&mut now).as_i64().unwrap();
        // One instant per message: every unit describes the same time.
        assert_eq!(millis / 1000, seconds);
        assert_eq!(micros / 1000, millis);
        assert_eq!(nanos / 1000, micros);
        assert!(seconds > 1_700_000_000, "{seconds}");
        let v4 = Computed::UuidV4.produce(&mut now);
        let v4 = uuid::Uuid::parse_str(v4.as_str().unwrap()).unwrap();
        assert_eq!(v4.get_version_num(), 4);
        let v7 = Computed::UuidV7.produce(&mut now);
        let v7 = uuid::Uuid::parse_str(v7.as_str().unwrap()).unwrap();
        assert_eq!(v7.get_version_num(), 7);
    }

    #[test]
    fn given_existing_key_when_set_should_keep_its_position() {
        let mut map = Map::new();
        map.insert("a".into(), Value::from(1));
        map.insert("b".into(), Value::from(2));
        set_field(&mut map, "a", Value::from(3));
        set_field(&mut map, "c", Value::from(4));
        let keys: Vec<&str> = map.keys().map(String::as_str).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(map["a"], 3);
    }
}
