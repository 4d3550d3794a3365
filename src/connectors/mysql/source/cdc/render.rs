//! Binlog row images as JSON objects, rendered the way the polling mode
//! renders the same row: each value is first written as the text the server's
//! text protocol would send (`2024-01-02 03:04:05.000000`, `12.50`, an ENUM's
//! label), then through the polling mode's [`write_value`] under the type name
//! the polling mode sees for the column.

use mysql_async::Value;
use mysql_async::binlog::row::BinlogRow;
use mysql_async::binlog::value::BinlogValue;

use super::super::record::write_value;

/// One column of a captured table, from `information_schema.columns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnInfo {
    pub name: String,
    /// How its values become text and JSON.
    pub kind: Kind,
    /// The type name the polling mode sees (sqlx's name for the column).
    pub type_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// An integer column of this many bits; `unsigned` values arrive as
    /// signed numbers of that width unless the binlog carries signedness.
    Integer {
        bits: u32,
        unsigned: bool,
    },
    Date,
    /// DATETIME and TIMESTAMP (read in UTC) with their fractional digits.
    DateTime {
        fraction: u32,
        timestamp: bool,
    },
    Time {
        fraction: u32,
    },
    Enum(Vec<String>),
    Set(Vec<String>),
    /// Everything whose binlog value is already the text (or bytes) the
    /// text protocol sends: strings, DECIMAL, YEAR, BIT, binary types, floats.
    Plain,
}

impl ColumnInfo {
    /// Describes a column from its `data_type` and `column_type`.
    pub fn new(name: &str, data_type: &str, column_type: &str) -> Self {
        let data_type = data_type.to_ascii_lowercase();
        let column_type_lower = column_type.to_ascii_lowercase();
        let unsigned = column_type_lower.contains("unsigned");
        let fraction = parenthesized(&column_type_lower)
            .and_then(|inside| inside.trim().parse().ok())
            .unwrap_or(0);
        let bits = match data_type.as_str() {
            "tinyint" => Some(8),
            "smallint" => Some(16),
            "mediumint" => Some(24),
            "int" | "integer" => Some(32),
            "bigint" => Some(64),
            _ => None,
        };
        let kind = match (data_type.as_str(), bits) {
            (_, Some(bits)) => Kind::Integer { bits, unsigned },
            ("date", _) => Kind::Date,
            ("datetime", _) => Kind::DateTime {
                fraction,
                timestamp: false,
            },
            ("timestamp", _) => Kind::DateTime {
                fraction,
                timestamp: true,
            },
            ("time", _) => Kind::Time { fraction },
            ("enum", _) => Kind::Enum(labels(column_type)),
            ("set", _) => Kind::Set(labels(column_type)),
            _ => Kind::Plain,
        };
        let type_name = match data_type.as_str() {
            "tinyint" if column_type_lower.starts_with("tinyint(1)") && !unsigned => {
                "BOOLEAN".to_owned()
            }
            "tinyint" | "smallint" | "mediumint" | "int" | "bigint" if unsigned => {
                format!("{} UNSIGNED", data_type.to_ascii_uppercase())
            }
            "integer" if unsigned => "INT UNSIGNED".to_owned(),
            "integer" => "INT".to_owned(),
            "numeric" => "DECIMAL".to_owned(),
            "real" => "DOUBLE".to_owned(),
            other => other.to_ascii_uppercase(),
        };
        Self {
            name: name.to_owned(),
            kind,
            type_name,
        }
    }
}

/// What is between the first `(` and its `)`.
fn parenthesized(text: &str) -> Option<&str> {
    let start = text.find('(')? + 1;
    let end = text[start..].find(')')? + start;
    Some(&text[start..end])
}

/// The labels of `enum('a','b')` or `set('a','b')`, quotes undone.
fn labels(column_type: &str) -> Vec<String> {
    let Some(start) = column_type.find('(') else {
        return Vec::new();
    };
    let inside = column_type[start + 1..]
        .strip_suffix(')')
        .unwrap_or(&column_type[start + 1..]);
    let mut labels = Vec::new();
    let mut chars = inside.chars().peekable();
    while let Some(char) = chars.next() {
        if char != '\'' {
            continue;
        }
        let mut label = String::new();
        while let Some(char) = chars.next() {
            match char {
                '\'' if chars.peek() == Some(&'\'') => {
                    chars.next();
                    label.push('\'');
                }
                '\'' => break,
                '\\' => {
                    if let Some(escaped) = chars.next() {
                        label.push(escaped);
                    }
                }
                other => label.push(other),
            }
        }
        labels.push(label);
    }
    labels
}

#[derive(Debug, thiserror::Error)]
#[error("column {column}: {reason}")]
pub struct RenderError {
    pub column: String,
    pub reason: String,
}

/// A row image as a JSON object (text), its columns named by `columns`.
pub fn render_row(row: &BinlogRow, columns: &[ColumnInfo]) -> Result<String, RenderError> {
    let mut out = Vec::with_capacity(64 + row.len() * 16);
    out.push(b'{');
    for (index, column) in columns.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        // Writing a str into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &column.name);
        out.push(b':');
        match row.as_ref(index) {
            None | Some(BinlogValue::Value(Value::NULL)) => out.extend_from_slice(b"null"),
            Some(value) => {
                let text = text_of(value, column)?;
                write_value(&mut out, &column.type_name, &text);
            }
        }
    }
    out.push(b'}');
    // Only JSON text and lossless UTF-8 conversions were written.
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// The bytes the text protocol would send for `value` of `column`.
fn text_of(value: &BinlogValue<'_>, column: &ColumnInfo) -> Result<Vec<u8>, RenderError> {
    let error = |reason: String| RenderError {
        column: column.name.clone(),
        reason,
    };
    let value = match value {
        BinlogValue::Value(value) => value,
        BinlogValue::Jsonb(jsonb) => {
            let json: serde_json::Value = jsonb
                .clone()
                .try_into()
                .map_err(|cause| error(format!("cannot read its JSON: {cause}")))?;
            return Ok(json.to_string().into_bytes());
        }
        BinlogValue::JsonDiff(_) => {
            return Err(error(
                "the binlog holds a partial JSON update; set binlog_row_value_options = '' on the server".into(),
            ));
        }
    };
    let text = match (&column.kind, value) {
        (
            Kind::Integer {
                bits,
                unsigned: true,
            },
            Value::Int(number),
        ) => {
            let mask = if *bits >= 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            ((*number as u64) & mask).to_string()
        }
        (
            Kind::Integer {
                bits,
                unsigned: false,
            },
            Value::Int(number),
        ) => {
            // Sign-extended from the column's width (the decoder leaves a
            // MEDIUMINT's sign bit as a magnitude bit).
            let shift = 64 - (*bits).min(64);
            ((*number << shift) >> shift).to_string()
        }
        (_, Value::Int(number)) => match &column.kind {
            Kind::Enum(labels) => label(labels, *number),
            Kind::DateTime {
                fraction,
                timestamp: true,
            } => datetime_of_unix(*number, 0, *fraction),
            _ => number.to_string(),
        },
        (_, Value::UInt(number)) => number.to_string(),
        (_, Value::Float(number)) => number.to_string(),
        (_, Value::Double(number)) => number.to_string(),
        (
            Kind::DateTime {
                fraction,
                timestamp: true,
            },
            Value::Bytes(bytes),
        ) => {
            // TIMESTAMP2: seconds since the epoch, `.micros` when non-zero.
            let text = String::from_utf8_lossy(bytes);
            let (seconds, micros) = text.split_once('.').unwrap_or((&text, "0"));
            let seconds = seconds
                .parse()
                .map_err(|_| error(format!("unexpected TIMESTAMP value {text:?}")))?;
            datetime_of_unix(seconds, micros.parse().unwrap_or(0), *fraction)
        }
        (Kind::Set(labels), Value::Bytes(bytes)) => {
            let mask = bytes
                .iter()
                .rev()
                .fold(0u64, |mask, byte| (mask << 8) | u64::from(*byte));
            labels
                .iter()
                .enumerate()
                .filter(|(index, _)| *index < 64 && mask & (1 << index) != 0)
                .map(|(_, label)| label.as_str())
                .collect::<Vec<_>>()
                .join(",")
        }
        (_, Value::Bytes(bytes)) => return Ok(bytes.clone()),
        (kind, Value::Date(year, month, day, hour, minute, second, micros)) => {
            let date = format!("{year:04}-{month:02}-{day:02}");
            match kind {
                Kind::Date => date,
                Kind::DateTime { fraction, .. } => {
                    format!(
                        "{date} {hour:02}:{minute:02}:{second:02}{}",
                        fraction_text(*micros, *fraction)
                    )
                }
                _ => format!("{date} {hour:02}:{minute:02}:{second:02}"),
            }
        }
        (kind, Value::Time(negative, days, hours, minutes, seconds, micros)) => {
            let fraction = match kind {
                Kind::Time { fraction } => *fraction,
                _ => 0,
            };
            format!(
                "{}{:02}:{minutes:02}:{seconds:02}{}",
                if *negative { "-" } else { "" },
                u64::from(*days) * 24 + u64::from(*hours),
                fraction_text(*micros, fraction)
            )
        }
        (_, Value::NULL) => return Ok(Vec::new()),
    };
    Ok(text.into_bytes())
}

fn label(labels: &[String], index: i64) -> String {
    // ENUM indexes start at 1; 0 is the empty string stored for an invalid value.
    usize::try_from(index)
        .ok()
        .and_then(|index| index.checked_sub(1))
        .and_then(|index| labels.get(index))
        .cloned()
        .unwrap_or_default()
}

/// `.ffffff` cut to the column's fractional digits (nothing for 0).
fn fraction_text(micros: u32, digits: u32) -> String {
    if digits == 0 {
        return String::new();
    }
    let digits = digits.min(6);
    format!(
        ".{:0width$}",
        micros / 10u32.pow(6 - digits),
        width = digits as usize
    )
}

/// A Unix time as the UTC `YYYY-MM-DD HH:MM:SS[.f]` the polling sessions
/// (which run in UTC) read a TIMESTAMP as.
fn datetime_of_unix(seconds: i64, micros: u32, fraction: u32) -> String {
    let days = seconds.div_euclid(86_400);
    let second_of_day = seconds.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}{}",
        second_of_day / 3600,
        second_of_day % 3600 / 60,
        second_of_day % 60,
        fraction_text(micros, fraction)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_column_types_when_described_should_use_the_polling_modes_type_names() {
        let cases = [
            ("tinyint", "tinyint(1)", "BOOLEAN"),
            ("int", "int(10) unsigned", "INT UNSIGNED"),
            ("bigint", "bigint(20)", "BIGINT"),
            ("decimal", "decimal(10,2)", "DECIMAL"),
            ("varbinary", "varbinary(16)", "VARBINARY"),
            ("datetime", "datetime(3)", "DATETIME"),
        ];
        for (data_type, column_type, expected) in cases {
            assert_eq!(
                ColumnInfo::new("c", data_type, column_type).type_name,
                expected,
                "{column_type}"
            );
        }
        assert_eq!(
            ColumnInfo::new("c", "enum", "enum('a','it''s','b\\\\c')").kind,
            Kind::Enum(vec!["a".into(), "it's".into(), "b\\c".into()])
        );
        assert_eq!(
            ColumnInfo::new("c", "datetime", "datetime(3)").kind,
            Kind::DateTime {
                fraction: 3,
                timestamp: false
            }
        );
    }

    #[test]
    fn given_binlog_values_when_rendered_should_be_the_text_the_server_sends() {
        let render = |data_type: &str, column_type: &str, value: Value| {
            let column = ColumnInfo::new("c", data_type, column_type);
            String::from_utf8(text_of(&BinlogValue::Value(value), &column).unwrap()).unwrap()
        };
        assert_eq!(
            render("bigint", "bigint unsigned", Value::Int(-1)),
            "18446744073709551615"
        );
        assert_eq!(
            render("tinyint", "tinyint(3) unsigned", Value::Int(-56)),
            "200"
        );
        assert_eq!(render("int", "int(11)", Value::Int(-5)), "-5");
        assert_eq!(
            render("mediumint", "mediumint(9)", Value::Int(8_388_608)),
            "-8388608"
        );
        assert_eq!(render("enum", "enum('new','paid')", Value::Int(2)), "paid");
        assert_eq!(
            render("set", "set('a','b','c')", Value::Bytes(vec![0b101])),
            "a,c"
        );
        assert_eq!(
            render(
                "datetime",
                "datetime(6)",
                Value::Date(2024, 1, 2, 3, 4, 5, 120)
            ),
            "2024-01-02 03:04:05.000120"
        );
        assert_eq!(
            render(
                "datetime",
                "datetime(2)",
                Value::Date(2024, 1, 2, 3, 4, 5, 120_000)
            ),
            "2024-01-02 03:04:05.12"
        );
        assert_eq!(
            render("date", "date", Value::Date(2024, 2, 29, 0, 0, 0, 0)),
            "2024-02-29"
        );
        assert_eq!(
            render("time", "time", Value::Time(true, 1, 2, 3, 4, 0)),
            "-26:03:04"
        );
        assert_eq!(
            render(
                "timestamp",
                "timestamp(3)",
                Value::Bytes(b"1704164645.500000".to_vec())
            ),
            "2024-01-02 03:04:05.500"
        );
        assert_eq!(
            render("timestamp", "timestamp", Value::Bytes(b"0".to_vec())),
            "1970-01-01 00:00:00"
        );
        assert_eq!(
            render(
                "timestamp",
                "timestamp",
                Value::Bytes(b"951782400".to_vec())
            ),
            "2000-02-29 00:00:00"
        );
    }
}
