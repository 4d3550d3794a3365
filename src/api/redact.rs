//! Secrets never leave the API in clear text.
//!
//! Two nets, so a connector that forgets to declare a field is still covered:
//! the `secret_fields` its registry entry declares (dotted paths into
//! `plugin_config`), and a name heuristic applied at every depth (`password`,
//! `token`, `api_key`, `connection_string`, `Authorization` inside `headers`,
//! ...). On top, credentials embedded in any string (`scheme://user:pass@host`,
//! `password=...` in a key/value connection string) are masked.

use serde_json::Value;

pub const REDACTED: &str = "[REDACTED]";

/// Name fragments that mark a field as secret, matched against the lowercased
/// name with `-`, `.` and spaces turned into `_`.
const SECRET_FRAGMENTS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "api_key",
    "apikey",
    "access_key",
    "account_key",
    "private_key",
    "privatekey",
    "connection_string",
    "connectionstring",
    "conn_str",
    "authorization",
    "credential",
    "cookie",
    "bearer",
];

/// Whole names that are secret but too short to match as fragments.
const SECRET_NAMES: &[&str] = &["pwd", "pass", "auth", "dsn", "sas"];

/// Whether a field with this name holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let normalized: String = name
        .chars()
        .map(|character| match character {
            '-' | '.' | ' ' => '_',
            other => other.to_ascii_lowercase(),
        })
        .collect();
    SECRET_NAMES.contains(&normalized.as_str())
        || SECRET_FRAGMENTS
            .iter()
            .any(|fragment| normalized.contains(fragment))
}

/// Redacts a connector's `plugin_config`: its declared secret fields, then
/// every field whose name looks secret, then credentials inside strings.
pub fn plugin_config(value: &mut Value, secret_fields: &[&str]) {
    for path in secret_fields {
        let segments: Vec<&str> = path.split('.').collect();
        redact_path(value, &segments);
    }
    by_name(value);
}

/// Redacts any JSON document (transform configs, source state) by field name
/// and embedded credentials.
pub fn by_name(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (name, field) in map.iter_mut() {
                if is_secret_name(name) && holds_data(field) {
                    *field = Value::String(REDACTED.into());
                } else {
                    by_name(field);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(by_name),
        Value::String(text) => {
            if let Some(masked) = mask_text(text) {
                *text = masked;
            }
        }
        _ => {}
    }
}

/// Masks credentials inside free text (an error message, a URL): the password
/// of `scheme://user:password@host` and the value of `password=...`. Returns
/// `None` when there is nothing to mask.
pub fn mask_text(text: &str) -> Option<String> {
    let masked = mask_url_passwords(text);
    mask_key_values(masked.as_deref().unwrap_or(text)).or(masked)
}

/// A secret-named issue's message may quote the value (`found the string
/// "..."`); such messages are replaced.
pub fn issue_message(field: &str, message: &str) -> String {
    let secret = field
        .split(['.', '['])
        .any(|segment| !segment.is_empty() && is_secret_name(segment));
    if secret {
        "invalid value (not shown: the field holds a secret)".to_owned()
    } else {
        mask_text(message).unwrap_or_else(|| message.to_owned())
    }
}

fn holds_data(value: &Value) -> bool {
    !matches!(value, Value::Null | Value::Bool(_))
}

fn redact_path(value: &mut Value, segments: &[&str]) {
    let Some((first, rest)) = segments.split_first() else {
        return;
    };
    match value {
        // `*` stands for every key of a map (say, every header value).
        Value::Object(map) if *first == "*" => {
            for field in map.values_mut() {
                redact_field(field, rest);
            }
        }
        Value::Object(map) => {
            if let Some(field) = map.get_mut(*first) {
                redact_field(field, rest);
            }
        }
        // A path through a list applies to each of its items.
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| redact_path(item, segments)),
        _ => {}
    }
}

fn redact_field(field: &mut Value, rest: &[&str]) {
    if !rest.is_empty() {
        redact_path(field, rest);
    } else if !field.is_null() {
        *field = Value::String(REDACTED.into());
    }
}

fn mask_url_passwords(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    let mut changed = false;
    while let Some(scheme_end) = rest.find("://") {
        let authority_start = scheme_end + 3;
        let authority_len = rest[authority_start..]
            .find(|character: char| {
                character == '/'
                    || character == '?'
                    || character == '#'
                    || character.is_whitespace()
            })
            .unwrap_or(rest.len() - authority_start);
        let authority = &rest[authority_start..authority_start + authority_len];
        out.push_str(&rest[..authority_start]);
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.split_once(':') {
                    Some((user, password)) if !password.is_empty() => {
                        out.push_str(user);
                        out.push(':');
                        out.push_str(REDACTED);
                        changed = true;
                    }
                    _ => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &rest[authority_start + authority_len..];
    }
    out.push_str(rest);
    changed.then_some(out)
}

/// `password=...` style pairs (libpq key/value strings, ODBC strings).
fn mask_key_values(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut position = 0;
    let mut changed = false;
    while let Some(found) = lower[position..].find('=') {
        let equals = position + found;
        let name_start = lower[..equals]
            .rfind(|character: char| {
                character.is_whitespace()
                    || character == ';'
                    || character == '&'
                    || character == '?'
            })
            .map_or(0, |index| index + 1)
            .max(position);
        let name = &lower[name_start..equals];
        let value_end = lower[equals + 1..]
            .find(|character: char| {
                character.is_whitespace() || character == ';' || character == '&'
            })
            .map_or(text.len(), |index| equals + 1 + index);
        out.push_str(&text[position..=equals]);
        if !name.is_empty() && is_secret_name(name) && value_end > equals + 1 {
            out.push_str(REDACTED);
            changed = true;
        } else {
            out.push_str(&text[equals + 1..value_end]);
        }
        position = value_end;
    }
    out.push_str(&text[position..]);
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn given_declared_secret_paths_when_redacted_should_hide_them_even_with_innocent_names() {
        let mut config = json!({"target": "db", "login": {"value": "hunter2"}, "sinks": [{"dest": "x"}, {"dest": "y"}]});
        plugin_config(&mut config, &["login.value", "sinks.dest"]);
        assert_eq!(config["login"]["value"], REDACTED);
        assert_eq!(config["sinks"][0]["dest"], REDACTED);
        assert_eq!(config["sinks"][1]["dest"], REDACTED);
        assert_eq!(config["target"], "db");
    }

    #[test]
    fn given_undeclared_secret_names_at_any_depth_when_redacted_should_hide_them() {
        let mut config = json!({
            "connection_string": "postgres://u:p@h/db",
            "Password": "p",
            "apiKey": "k",
            "headers": {"Authorization": "Bearer t", "X-Api-Key": "k", "Accept": "application/json"},
            "nested": [{"client_secret": "s"}],
            "azure_storage_account_key": "a",
            "gcs_service_account_key": "g",
            "token_refresh": true,
            "max_connections": 10,
        });
        plugin_config(&mut config, &[]);
        for pointer in [
            "/connection_string",
            "/Password",
            "/apiKey",
            "/headers/Authorization",
            "/headers/X-Api-Key",
            "/nested/0/client_secret",
            "/azure_storage_account_key",
            "/gcs_service_account_key",
        ] {
            assert_eq!(config.pointer(pointer).unwrap(), REDACTED, "{pointer}");
        }
        assert_eq!(config["headers"]["Accept"], "application/json");
        assert_eq!(config["token_refresh"], true);
        assert_eq!(config["max_connections"], 10);
    }

    #[test]
    fn given_credentials_inside_strings_when_masked_should_keep_the_rest() {
        assert_eq!(
            mask_text("cannot connect to postgres://app:hunter2@db:5432/x").unwrap(),
            format!("cannot connect to postgres://app:{REDACTED}@db:5432/x")
        );
        assert_eq!(
            mask_text("host=db user=app password=hunter2 dbname=x").unwrap(),
            format!("host=db user=app password={REDACTED} dbname=x")
        );
        assert_eq!(
            mask_text("https://example.com/a?token=abc&page=2").unwrap(),
            format!("https://example.com/a?token={REDACTED}&page=2")
        );
        assert!(mask_text("http://user@host/path and a=b").is_none());
    }

    #[test]
    fn given_a_secret_field_issue_when_rendered_should_not_quote_the_value() {
        let message = issue_message(
            "plugin_config.password",
            "expected a number, found the string \"hunter2\"",
        );
        assert!(!message.contains("hunter2"), "{message}");
        let message = issue_message("streams[0].topic", "missing required field");
        assert_eq!(message, "missing required field");
    }
}
