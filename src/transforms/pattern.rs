//! Key and value patterns shared by `filter_fields` and `filter_messages`, in
//! upstream's config shape. Regexes are compiled once, when the transform is
//! built.

use std::collections::HashSet;

use regex::Regex;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::transforms::FieldError;

/// `{ key_pattern = {...}, value_pattern = {...} }`; a part left out matches
/// anything.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatternConfig {
    #[serde(default)]
    pub key_pattern: Option<KeyPatternConfig>,
    #[serde(default)]
    pub value_pattern: Option<ValuePatternConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyPatternConfig {
    Exact(String),
    StartsWith(String),
    EndsWith(String),
    Contains(String),
    Regex(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValuePatternConfig {
    /// The value equals this JSON value.
    Equals(Value),
    /// A string value contains this text.
    Contains(String),
    /// A string value matches this regex (anywhere in the string).
    Regex(String),
    GreaterThan(f64),
    LessThan(f64),
    /// `[low, high]`, both inclusive.
    Between(f64, f64),
    IsNull,
    IsNotNull,
    IsString,
    IsNumber,
    IsBoolean,
    IsObject,
    IsArray,
}

/// A compiled key and value pattern.
#[derive(Debug, Clone)]
pub struct FieldPattern {
    key: Option<KeyPattern>,
    value: Option<ValuePattern>,
}

#[derive(Debug, Clone)]
enum KeyPattern {
    Exact(String),
    StartsWith(String),
    EndsWith(String),
    Contains(String),
    Regex(Regex),
}

#[derive(Debug, Clone)]
enum ValuePattern {
    Equals(Value),
    Contains(String),
    Regex(Regex),
    GreaterThan(f64),
    LessThan(f64),
    Between(f64, f64),
    IsNull,
    IsNotNull,
    IsString,
    IsNumber,
    IsBoolean,
    IsObject,
    IsArray,
}

/// Compiles `patterns[..]`; `field` is the list's name in the table, for errors.
pub fn compile_all(
    field: &str,
    configs: Vec<PatternConfig>,
) -> Result<Vec<FieldPattern>, FieldError> {
    configs
        .into_iter()
        .enumerate()
        .map(|(index, config)| FieldPattern::compile(&format!("{field}[{index}]"), config))
        .collect()
}

impl FieldPattern {
    fn compile(path: &str, config: PatternConfig) -> Result<Self, FieldError> {
        let key = config
            .key_pattern
            .map(|key| KeyPattern::compile(&format!("{path}.key_pattern"), key))
            .transpose()?;
        let value = config
            .value_pattern
            .map(|value| ValuePattern::compile(&format!("{path}.value_pattern"), value))
            .transpose()?;
        Ok(Self { key, value })
    }

    /// Whether neither a key nor a value pattern was given (matches any field).
    pub fn is_empty(&self) -> bool {
        self.key.is_none() && self.value.is_none()
    }

    /// Whether one field matches both parts.
    pub fn matches(&self, key: &str, value: &Value) -> bool {
        self.key.as_ref().is_none_or(|pattern| pattern.matches(key))
            && self
                .value
                .as_ref()
                .is_none_or(|pattern| pattern.matches(value))
    }

    /// Whether any top-level field of `map` matches. An exact key pattern is a
    /// single lookup instead of a scan.
    pub fn matches_any_field(&self, map: &Map<String, Value>) -> bool {
        match &self.key {
            Some(KeyPattern::Exact(key)) => map.get(key).is_some_and(|value| {
                self.value
                    .as_ref()
                    .is_none_or(|pattern| pattern.matches(value))
            }),
            _ => map.iter().any(|(key, value)| self.matches(key, value)),
        }
    }
}

impl KeyPattern {
    fn compile(path: &str, config: KeyPatternConfig) -> Result<Self, FieldError> {
        Ok(match config {
            KeyPatternConfig::Exact(text) => KeyPattern::Exact(text),
            KeyPatternConfig::StartsWith(text) => KeyPattern::StartsWith(text),
            KeyPatternConfig::EndsWith(text) => KeyPattern::EndsWith(text),
            KeyPatternConfig::Contains(text) => KeyPattern::Contains(text),
            KeyPatternConfig::Regex(pattern) => {
                KeyPattern::Regex(compile_regex(&format!("{path}.regex"), &pattern)?)
            }
        })
    }

    fn matches(&self, key: &str) -> bool {
        match self {
            KeyPattern::Exact(text) => key == text,
            KeyPattern::StartsWith(text) => key.starts_with(text.as_str()),
            KeyPattern::EndsWith(text) => key.ends_with(text.as_str()),
            KeyPattern::Contains(text) => key.contains(text.as_str()),
            KeyPattern::Regex(regex) => regex.is_match(key),
        }
    }
}

impl ValuePattern {
    fn compile(path: &str, config: ValuePatternConfig) -> Result<Self, FieldError> {
        Ok(match config {
            ValuePatternConfig::Equals(value) => ValuePattern::Equals(value),
            ValuePatternConfig::Contains(text) => ValuePattern::Contains(text),
            ValuePatternConfig::Regex(pattern) => {
                ValuePattern::Regex(compile_regex(&format!("{path}.regex"), &pattern)?)
            }
            ValuePatternConfig::GreaterThan(bound) => ValuePattern::GreaterThan(bound),
            ValuePatternConfig::LessThan(bound) => ValuePattern::LessThan(bound),
            ValuePatternConfig::Between(low, high) => {
                // Upstream accepts a reversed range, which then never matches.
                if low > high {
                    return Err(FieldError::new(
                        format!("{path}.between"),
                        format!("expected [low, high] with low <= high, found [{low}, {high}]"),
                    ));
                }
                ValuePattern::Between(low, high)
            }
            ValuePatternConfig::IsNull => ValuePattern::IsNull,
            ValuePatternConfig::IsNotNull => ValuePattern::IsNotNull,
            ValuePatternConfig::IsString => ValuePattern::IsString,
            ValuePatternConfig::IsNumber => ValuePattern::IsNumber,
            ValuePatternConfig::IsBoolean => ValuePattern::IsBoolean,
            ValuePatternConfig::IsObject => ValuePattern::IsObject,
            ValuePatternConfig::IsArray => ValuePattern::IsArray,
        })
    }

    fn matches(&self, value: &Value) -> bool {
        match self {
            ValuePattern::Equals(expected) => value == expected,
            ValuePattern::Contains(text) => value
                .as_str()
                .is_some_and(|found| found.contains(text.as_str())),
            ValuePattern::Regex(regex) => value.as_str().is_some_and(|found| regex.is_match(found)),
            ValuePattern::GreaterThan(bound) => {
                value.as_f64().is_some_and(|number| number > *bound)
            }
            ValuePattern::LessThan(bound) => value.as_f64().is_some_and(|number| number < *bound),
            ValuePattern::Between(low, high) => value
                .as_f64()
                .is_some_and(|number| (*low..=*high).contains(&number)),
            ValuePattern::IsNull => value.is_null(),
            ValuePattern::IsNotNull => !value.is_null(),
            ValuePattern::IsString => value.is_string(),
            ValuePattern::IsNumber => value.is_number(),
            ValuePattern::IsBoolean => value.is_boolean(),
            ValuePattern::IsObject => value.is_object(),
            ValuePattern::IsArray => value.is_array(),
        }
    }
}

fn compile_regex(path: &str, pattern: &str) -> Result<Regex, FieldError> {
    Regex::new(pattern).map_err(|error| FieldError::new(path, format!("invalid regex: {error}")))
}

/// A set of keys to look up per field: a short list is scanned (cheaper than
/// hashing every key of the message), a long one is hashed.
#[derive(Debug, Clone)]
pub enum KeySet {
    Few(Vec<String>),
    Many(HashSet<String>),
}

const SCAN_LIMIT: usize = 8;

impl KeySet {
    pub fn new(keys: Vec<String>) -> Self {
        let mut unique = HashSet::with_capacity(keys.len());
        let keys: Vec<String> = keys
            .into_iter()
            .filter(|key| unique.insert(key.clone()))
            .collect();
        if keys.len() <= SCAN_LIMIT {
            KeySet::Few(keys)
        } else {
            KeySet::Many(unique)
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            KeySet::Few(keys) => keys.is_empty(),
            KeySet::Many(keys) => keys.is_empty(),
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        match self {
            KeySet::Few(keys) => keys.iter().any(|known| known == key),
            KeySet::Many(keys) => keys.contains(key),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pattern(config: Value) -> FieldPattern {
        let config: PatternConfig = serde_json::from_value(config).unwrap();
        FieldPattern::compile("patterns[0]", config).unwrap()
    }

    #[test]
    fn given_key_patterns_when_matched_should_follow_upstream_rules() {
        let cases = [
            (json!({"exact": "id"}), "id", true),
            (json!({"exact": "id"}), "ids", false),
            (json!({"starts_with": "meta_"}), "meta_x", true),
            (json!({"ends_with": "_at"}), "created_at", true),
            (json!({"contains": "date"}), "updated_date_x", true),
            (json!({"regex": "^v[0-9]+$"}), "v12", true),
            (json!({"regex": "^v[0-9]+$"}), "v12a", false),
        ];
        for (key_pattern, key, expected) in cases {
            let compiled = pattern(json!({ "key_pattern": key_pattern }));
            assert_eq!(
                compiled.matches(key, &Value::Null),
                expected,
                "{key_pattern} on {key}"
            );
        }
    }

    #[test]
    fn given_value_patterns_when_matched_should_follow_upstream_rules() {
        let cases = [
            (json!({"equals": {"a": 1}}), json!({"a": 1}), true),
            (json!({"equals": 1}), json!(2), false),
            (json!({"contains": "err"}), json!("an error"), true),
            (json!({"contains": "1"}), json!(1), false),
            (json!({"regex": "^\\d{3}$"}), json!("123"), true),
            (json!({"greater_than": 10}), json!(10.5), true),
            (json!({"greater_than": 10}), json!(10), false),
            (json!({"less_than": 0}), json!(-1), true),
            (json!({"between": [1, 10]}), json!(10), true),
            (json!({"between": [1, 10]}), json!("5"), false),
            (json!("is_null"), json!(null), true),
            (json!("is_not_null"), json!(0), true),
            (json!("is_string"), json!("x"), true),
            (json!("is_number"), json!(1.5), true),
            (json!("is_boolean"), json!(false), true),
            (json!("is_object"), json!({}), true),
            (json!("is_array"), json!([]), true),
            (json!("is_array"), json!({}), false),
        ];
        for (value_pattern, value, expected) in cases {
            let compiled = pattern(json!({ "value_pattern": value_pattern }));
            assert_eq!(
                compiled.matches("any", &value),
                expected,
                "{value_pattern} on {value}"
            );
        }
    }

    #[test]
    fn given_key_and_value_parts_when_matched_should_need_both() {
        let compiled = pattern(json!({
            "key_pattern": {"contains": "date"},
            "value_pattern": "is_string",
        }));
        assert!(compiled.matches("created_date", &json!("2024-01-01")));
        assert!(!compiled.matches("created_date", &json!(null)));
        assert!(!compiled.matches("name", &json!("2024-01-01")));
    }

    #[test]
    fn given_bad_regex_or_reversed_range_when_compiled_should_name_the_field() {
        let config = vec![
            serde_json::from_value(json!({"key_pattern": {"exact": "a"}})).unwrap(),
            serde_json::from_value(json!({"value_pattern": {"regex": "("}})).unwrap(),
        ];
        let error = compile_all("patterns", config).unwrap_err();
        assert_eq!(error.field, "patterns[1].value_pattern.regex");
        let config =
            vec![serde_json::from_value(json!({"value_pattern": {"between": [5, 1]}})).unwrap()];
        let error = compile_all("patterns", config).unwrap_err();
        assert_eq!(error.field, "patterns[0].value_pattern.between");
    }

    #[test]
    fn given_many_or_few_keys_when_looked_up_should_agree() {
        let few = KeySet::new(vec!["a".into(), "b".into(), "a".into()]);
        let many = KeySet::new((0..20).map(|index| format!("k{index}")).collect());
        assert!(matches!(few, KeySet::Few(_)) && matches!(many, KeySet::Many(_)));
        assert!(few.contains("b") && !few.contains("c"));
        assert!(many.contains("k19") && !many.contains("k20"));
    }
}
