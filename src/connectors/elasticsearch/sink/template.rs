//! Index names from a template: `{field}` takes a document field (dotted for a
//! nested one), `%Y` `%m` `%d` `%H` the message timestamp in UTC, `%%` a `%`.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(Vec<String>),
    Date(char),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexTemplate {
    parts: Vec<Part>,
}

impl IndexTemplate {
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut chars = template.chars();
        while let Some(c) = chars.next() {
            match c {
                '{' => {
                    let mut name = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        name.push(c);
                    }
                    if !closed || name.is_empty() || name.contains('{') {
                        return Err(format!(
                            "\"{template}\": expected a field name between {{ and }}"
                        ));
                    }
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(Part::Field(name.split('.').map(str::to_owned).collect()));
                }
                '%' => match chars.next() {
                    Some('%') => text.push('%'),
                    Some(spec @ ('Y' | 'm' | 'd' | 'H')) => {
                        if !text.is_empty() {
                            parts.push(Part::Text(std::mem::take(&mut text)));
                        }
                        parts.push(Part::Date(spec));
                    }
                    other => {
                        return Err(format!(
                            "\"{template}\": %{} is not a date field; use %Y, %m, %d, %H or %%",
                            other.map(String::from).unwrap_or_default()
                        ));
                    }
                },
                '}' => return Err(format!("\"{template}\": a }} without its {{")),
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        if parts.is_empty() {
            return Err("expected an index name, found an empty string".into());
        }
        let literal: String = parts
            .iter()
            .filter_map(|part| match part {
                Part::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        if let Some(reason) = index_name_problem(&literal, matches!(parts[0], Part::Text(_))) {
            return Err(format!("\"{template}\": {reason}"));
        }
        Ok(Self { parts })
    }

    /// The index name when the template has no placeholder.
    pub fn fixed(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [Part::Text(text)] => Some(text),
            _ => None,
        }
    }

    /// The index of one document with this timestamp (microseconds).
    pub fn render(&self, document: &Value, timestamp_micros: u64) -> Result<String, String> {
        let mut name = String::new();
        let (year, month, day) = civil_date(timestamp_micros / 86_400_000_000);
        let hour = timestamp_micros / 3_600_000_000 % 24;
        for part in &self.parts {
            match part {
                Part::Text(text) => name.push_str(text),
                Part::Date('Y') => name.push_str(&format!("{year:04}")),
                Part::Date('m') => name.push_str(&format!("{month:02}")),
                Part::Date('d') => name.push_str(&format!("{day:02}")),
                Part::Date(_) => name.push_str(&format!("{hour:02}")),
                Part::Field(path) => {
                    let value = path
                        .iter()
                        .try_fold(document, |value, key| value.get(key))
                        .ok_or_else(|| {
                            format!(
                                "the index template needs the field `{}`, which the document lacks",
                                path.join(".")
                            )
                        })?;
                    match value {
                        Value::String(text) => name.push_str(text),
                        Value::Number(number) => name.push_str(&number.to_string()),
                        Value::Bool(flag) => name.push_str(if *flag { "true" } else { "false" }),
                        _ => {
                            return Err(format!(
                                "the index template field `{}` is not a string or a number",
                                path.join(".")
                            ));
                        }
                    }
                }
            }
        }
        if let Some(reason) = index_name_problem(&name, true) {
            return Err(format!("index name \"{name}\" from the template: {reason}"));
        }
        Ok(name)
    }
}

/// Elasticsearch's rules for index names; `whole` checks the start too.
pub fn index_name_problem(name: &str, whole: bool) -> Option<&'static str> {
    if whole && (name.is_empty() || name == "." || name == "..") {
        return Some("not a usable index name");
    }
    if whole && name.starts_with(['-', '_', '+']) {
        return Some("an index name must not start with -, _ or +");
    }
    if name.chars().any(char::is_uppercase) {
        return Some("an index name must be lowercase");
    }
    if name.chars().any(|c| {
        matches!(
            c,
            '\\' | '/' | '*' | '?' | '"' | '<' | '>' | '|' | ' ' | ',' | '#' | ':'
        )
    }) {
        return Some("an index name must not contain \\ / * ? \" < > | , # : or a space");
    }
    if name.len() > 255 {
        return Some("an index name is at most 255 bytes");
    }
    None
}

/// (year, month, day) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil_date(days: u64) -> (i64, u32, u32) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // 2024-02-29T13:45:00Z
    const LEAP_DAY: u64 = 1_709_214_300_000_000;

    #[test]
    fn given_a_date_template_when_rendered_should_use_the_message_time_in_utc() {
        let template = IndexTemplate::parse("logs-%Y.%m.%d-%H").unwrap();
        assert_eq!(
            template.render(&json!({}), LEAP_DAY).unwrap(),
            "logs-2024.02.29-13"
        );
        assert_eq!(
            template.render(&json!({}), 0).unwrap(),
            "logs-1970.01.01-00"
        );
        assert_eq!(
            template.render(&json!({}), 1_735_689_599_000_000).unwrap(),
            "logs-2024.12.31-23"
        );
        assert_eq!(template.fixed(), None);
    }

    #[test]
    fn given_a_field_template_when_rendered_should_take_the_document_field() {
        let template = IndexTemplate::parse("events-{service.name}-{n}").unwrap();
        let document = json!({"service": {"name": "billing"}, "n": 7});
        assert_eq!(
            template.render(&document, LEAP_DAY).unwrap(),
            "events-billing-7"
        );
        let error = template.render(&json!({"n": 1}), LEAP_DAY).unwrap_err();
        assert!(error.contains("service.name"), "{error}");
        let error = template
            .render(&json!({"service": {"name": "Billing"}, "n": 1}), 0)
            .unwrap_err();
        assert!(error.contains("lowercase"), "{error}");
    }

    #[test]
    fn given_bad_templates_when_parsed_should_say_why() {
        for bad in ["", "Logs", "_x", "a{", "a{b", "a{}", "a}", "a%q", "a b"] {
            assert!(IndexTemplate::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            IndexTemplate::parse("plain").unwrap().fixed(),
            Some("plain")
        );
        assert_eq!(
            IndexTemplate::parse("a%%b")
                .unwrap()
                .render(&json!({}), 0)
                .unwrap(),
            "a%b"
        );
    }
}
