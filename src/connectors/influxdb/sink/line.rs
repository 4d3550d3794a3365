//! InfluxDB line protocol: escaping of measurements, tag keys and values and
//! string fields, and reading what a refusal says: the lines it names (v1's
//! quoted lines, v2's `line N`, v3's `line_number`), whether the server
//! wrote the other points (a partial write) and how many it dropped.

use std::fmt::Write;

/// Appends a measurement: `,` and space escaped.
pub fn measurement(out: &mut String, name: &str) {
    escape(out, name, &[',', ' ']);
}

/// Appends a tag key or value: `,`, `=` and space escaped. `Err` for what
/// line protocol cannot carry in a tag (an empty value, a line break, a
/// trailing backslash, which would escape the separator after it).
pub fn tag(out: &mut String, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("an empty tag value".into());
    }
    if value.contains(['\n', '\r']) {
        return Err(format!("the tag value {value:?} holds a line break"));
    }
    if value.ends_with('\\') {
        return Err(format!("the tag value {value:?} ends with a backslash"));
    }
    escape(out, value, &[',', '=', ' ']);
    Ok(())
}

/// Appends a string field value in quotes: `"` and `\` escaped.
pub fn string_field(out: &mut String, value: &str) {
    out.push('"');
    escape(out, value, &['"', '\\']);
    out.push('"');
}

/// Appends an unsigned integer field value: `u` suffix, as upstream writes
/// them, or, for InfluxDB 1.x which has no unsigned integers, a signed one
/// (`i`; values above 2^63 wrap, keeping one field type).
pub fn unsigned_field(out: &mut String, value: u64, signed: bool) {
    if signed {
        let _ = write!(out, "{}i", value as i64);
    } else {
        let _ = write!(out, "{value}u");
    }
}

fn escape(out: &mut String, value: &str, special: &[char]) {
    for character in value.chars() {
        if special.contains(&character) {
            out.push('\\');
        }
        out.push(character);
    }
}

/// Why a measurement name cannot be used, if it cannot.
pub fn check_measurement(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("expected a non-empty measurement name".into());
    }
    if name.contains(['\n', '\r']) {
        return Err("a measurement name cannot hold a line break".into());
    }
    if name.starts_with('#') {
        return Err("a measurement name starting with # reads as a comment line".into());
    }
    if name.ends_with('\\') {
        return Err("a measurement name cannot end with a backslash".into());
    }
    Ok(())
}

/// What a 4xx answer says: the 1-based physical lines of the request it
/// refused and (v1) the refused lines' text, empty when it names none;
/// whether it is a partial write (1.x `partial write: ...`, 3.x `partial
/// write of line protocol occurred`: the points it does not name are
/// stored); and 1.x's count of points dropped (`dropped=N`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Refused {
    pub lines: Vec<usize>,
    pub texts: Vec<String>,
    pub partial: bool,
    pub dropped: Option<usize>,
}

/// Reads a refusal body of any version.
pub fn refused(body: &str) -> Refused {
    let mut refused = Refused::default();
    let Ok(json) = serde_json::from_str::<serde_json::Value>(body) else {
        return refused;
    };
    // v3: {"error": "...", "data": [{"line_number": N, "original_line": "..."}]}
    if let Some(items) = json["data"].as_array() {
        for item in items {
            if let Some(line) = item["line_number"].as_u64() {
                refused.lines.push(line as usize);
            }
        }
    }
    // v2: {"code": "invalid", "line": N, "message": "... line N: ... line M: ..."}
    if let Some(line) = json["line"].as_u64() {
        refused.lines.push(line as usize);
    }
    let message = json["message"]
        .as_str()
        .or_else(|| json["error"].as_str())
        .unwrap_or("");
    for (position, _) in message.match_indices("line ") {
        let digits: String = message[position + 5..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if message[position + 5 + digits.len()..].starts_with(':')
            && let Ok(line) = digits.parse::<usize>()
        {
            refused.lines.push(line);
        }
    }
    // v1: "partial write: unable to parse 'LINE': reason\nunable to parse 'LINE2': ..."
    let mut rest = message;
    while let Some(start) = rest.find("unable to parse '") {
        rest = &rest[start + "unable to parse '".len()..];
        let Some(end) = rest.find("': ") else {
            break;
        };
        refused.texts.push(rest[..end].to_owned());
        rest = &rest[end..];
    }
    refused.partial = message.starts_with("partial write");
    refused.dropped = message
        .rsplit_once("dropped=")
        .and_then(|(_, count)| count.trim().parse().ok());
    refused.lines.sort_unstable();
    refused.lines.dedup();
    refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_the_escaping_table_when_written_should_escape_each_part_as_line_protocol_says() {
        let mut out = String::new();
        measurement(&mut out, "my measure,x=1");
        assert_eq!(out, r"my\ measure\,x=1");
        let mut out = String::new();
        tag(&mut out, "a b,c=d").unwrap();
        assert_eq!(out, r"a\ b\,c\=d");
        let mut out = String::new();
        string_field(&mut out, r#"say "hi" \ bye"#);
        assert_eq!(out, r#""say \"hi\" \\ bye""#);
        let mut out = String::new();
        string_field(&mut out, "two\nlines, = ok");
        assert_eq!(out, "\"two\nlines, = ok\"");
    }

    #[test]
    fn given_tag_values_line_protocol_cannot_carry_when_written_should_refuse_them() {
        for value in ["", "a\nb", "ends\\"] {
            assert!(tag(&mut String::new(), value).is_err(), "{value:?}");
        }
        assert!(check_measurement("#comment").is_err());
        assert!(check_measurement("ok").is_ok());
    }

    #[test]
    fn given_refusals_of_each_version_when_read_should_name_their_lines() {
        let v1 = r#"{"error":"partial write: unable to parse 'bad one': invalid field format\nunable to parse 'm,t=a f=1 9999': time outside range dropped=0"}"#;
        let v1 = refused(v1);
        assert_eq!(
            v1.texts,
            vec!["bad one".to_owned(), "m,t=a f=1 9999".to_owned()]
        );
        assert!(v1.partial, "1.x wrote the lines it parsed");
        let v2 = r#"{"code":"invalid","line":2,"message":"failed to parse line protocol: errors encountered on line(s):\nline 2: expected field\nline 5: invalid number"}"#;
        let v2 = refused(v2);
        assert_eq!(v2.lines, vec![2, 5]);
        assert!(!v2.partial, "2.x refuses the whole request");
        let v3 = r#"{"error":"partial write of line protocol occurred","data":[{"original_line":"x","line_number":3,"error_message":"bad"}]}"#;
        let v3 = refused(v3);
        assert_eq!(v3.lines, vec![3]);
        assert!(v3.partial);
        assert_eq!(
            refused(r#"{"error":"field type conflict"}"#),
            Refused::default()
        );
        assert_eq!(refused("not json"), Refused::default());
    }

    #[test]
    fn given_a_1x_partial_write_naming_no_line_when_read_should_count_the_dropped_points() {
        let conflict = r#"{"error":"partial write: field type conflict: input field \"payload_json\" on measurement \"iggy_messages\" is type string, already exists as type integer dropped=4"}"#;
        assert_eq!(
            refused(conflict),
            Refused {
                lines: Vec::new(),
                texts: Vec::new(),
                partial: true,
                dropped: Some(4),
            }
        );
    }
}
