//! Reads typed fields out of a TOML table, recording a [`ConfigIssue`] for each
//! bad field and carrying on, so one pass finds every problem of a file.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use toml::{Table, Value};

use crate::config::{ConfigIssue, duration};

/// The name closest to `key` by edit distance, when it is close enough to be
/// a typo (at most a third of its length, and at least one edit allowed).
pub fn nearest<'a>(key: &str, names: &[&'a str]) -> Option<&'a str> {
    let limit = (key.chars().count() / 3).max(1);
    names
        .iter()
        .map(|name| (strsim::levenshtein(key, name), *name))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

pub struct Reader<'a> {
    file: &'a Path,
    prefix: String,
    table: &'a Table,
    issues: &'a mut Vec<ConfigIssue>,
}

impl<'a> Reader<'a> {
    pub fn new(file: &'a Path, table: &'a Table, issues: &'a mut Vec<ConfigIssue>) -> Self {
        Self {
            file,
            prefix: String::new(),
            table,
            issues,
        }
    }

    /// A reader over a nested table, whose field names get `prefix` in issues.
    pub fn nested<'b>(&'b mut self, prefix: String, table: &'b Table) -> Reader<'b> {
        Reader {
            file: self.file,
            prefix,
            table,
            issues: self.issues,
        }
    }

    pub fn path(&self, field: &str) -> String {
        if self.prefix.is_empty() {
            field.to_owned()
        } else {
            format!("{}.{field}", self.prefix)
        }
    }

    pub fn error(&mut self, field: &str, message: impl Into<String>) {
        let path = self.path(field);
        self.issues
            .push(ConfigIssue::error(self.file, path, message));
    }

    pub fn warning(&mut self, field: &str, message: impl Into<String>) {
        let path = self.path(field);
        self.issues
            .push(ConfigIssue::warning(self.file, path, message));
    }

    pub fn get(&self, field: &str) -> Option<&'a Value> {
        self.table.get(field)
    }

    /// An error for every key this reader does not know (usually a typo
    /// that would otherwise be ignored: `enabeld = false` running the
    /// connector), with the nearest known name when one is close.
    pub fn refuse_unknown(&mut self, known: &[&str]) {
        let unknown: Vec<String> = self
            .table
            .keys()
            .filter(|key| !known.contains(&key.as_str()))
            .cloned()
            .collect();
        for key in unknown {
            let hint = match nearest(&key, known) {
                Some(name) => format!("; did you mean `{name}`?"),
                None => format!("; expected one of {}", known.join(", ")),
            };
            self.error(&key, format!("unknown key `{key}`{hint}"));
        }
    }

    pub fn required_string(&mut self, field: &str) -> Option<String> {
        match self.get(field) {
            None => {
                self.error(field, "missing required field, expected a string");
                None
            }
            Some(value) => self.string_value(field, value),
        }
    }

    pub fn optional_string(&mut self, field: &str) -> Option<String> {
        let value = self.get(field)?;
        self.string_value(field, value)
    }

    pub fn bool_or(&mut self, field: &str, default: bool) -> bool {
        match self.get(field) {
            None => default,
            Some(Value::Boolean(value)) => *value,
            Some(other) => {
                self.error(
                    field,
                    format!("expected true or false, found {}", describe(other)),
                );
                default
            }
        }
    }

    pub fn u64_or(&mut self, field: &str, default: u64) -> u64 {
        self.optional_u64(field).unwrap_or(default)
    }

    pub fn optional_u64(&mut self, field: &str) -> Option<u64> {
        match self.get(field)? {
            Value::Integer(value) if *value >= 0 => Some(*value as u64),
            other => {
                self.error(
                    field,
                    format!("expected a non-negative integer, found {}", describe(other)),
                );
                None
            }
        }
    }

    pub fn duration_or(&mut self, field: &str, default: Duration) -> Duration {
        match self.get(field) {
            None => default,
            Some(Value::String(text)) => match duration::parse(text) {
                Ok(parsed) => parsed,
                Err(message) => {
                    self.error(field, message);
                    default
                }
            },
            Some(other) => {
                self.error(
                    field,
                    format!(
                        "expected a duration string such as \"5ms\", found {}",
                        describe(other)
                    ),
                );
                default
            }
        }
    }

    /// A string field parsed with `FromStr`, whose error says what is expected.
    pub fn parsed_or<T: FromStr<Err = String>>(&mut self, field: &str, default: T) -> T {
        match self.optional_string(field) {
            None => default,
            Some(text) => match text.parse() {
                Ok(value) => value,
                Err(message) => {
                    self.error(field, message);
                    default
                }
            },
        }
    }

    pub fn required_parsed<T: FromStr<Err = String>>(&mut self, field: &str) -> Option<T> {
        let text = self.required_string(field)?;
        match text.parse() {
            Ok(value) => Some(value),
            Err(message) => {
                self.error(field, message);
                None
            }
        }
    }

    pub fn string_list(&mut self, field: &str) -> Option<Vec<String>> {
        match self.get(field)? {
            Value::Array(items) => {
                let mut strings = Vec::with_capacity(items.len());
                for (index, item) in items.iter().enumerate() {
                    match item {
                        Value::String(text) => strings.push(text.clone()),
                        other => self.error(
                            &format!("{field}[{index}]"),
                            format!("expected a string, found {}", describe(other)),
                        ),
                    }
                }
                Some(strings)
            }
            other => {
                self.error(
                    field,
                    format!("expected a list of strings, found {}", describe(other)),
                );
                None
            }
        }
    }

    pub fn optional_table(&mut self, field: &str) -> Option<&'a Table> {
        match self.get(field)? {
            Value::Table(table) => Some(table),
            other => {
                self.error(
                    field,
                    format!("expected a table, found {}", describe(other)),
                );
                None
            }
        }
    }

    fn string_value(&mut self, field: &str, value: &Value) -> Option<String> {
        match value {
            Value::String(text) => Some(text.clone()),
            other => {
                self.error(
                    field,
                    format!("expected a string, found {}", describe(other)),
                );
                None
            }
        }
    }
}

/// Names a TOML value's type for error messages.
pub fn describe(value: &Value) -> String {
    match value {
        Value::String(text) => format!("the string \"{text}\""),
        Value::Integer(number) => format!("the integer {number}"),
        Value::Float(number) => format!("the number {number}"),
        Value::Boolean(flag) => format!("the boolean {flag}"),
        Value::Datetime(_) => "a date-time".to_owned(),
        Value::Array(_) => "a list".to_owned(),
        Value::Table(_) => "a table".to_owned(),
    }
}
