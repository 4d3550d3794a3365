//! `RowBinary` / `RowBinaryWithDefaults` encoding of JSON objects, driven by
//! the table's columns as `system.columns` lists them. A type the encoder does
//! not know fails at open; a value that does not fit its column rejects that
//! one message, before anything is sent.

use serde_json::Value;

/// A column type the encoder can write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Type {
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Int8,
    Int16,
    Int32,
    Int64,
    Float32,
    Float64,
    Bool,
    String,
    FixedString(usize),
    /// Days since 1970-01-01, unsigned 16 bits.
    Date,
    /// Days since 1970-01-01, signed 32 bits.
    Date32,
    /// Seconds since the epoch, unsigned 32 bits.
    DateTime,
    /// Ticks of 10^-precision seconds since the epoch, signed 64 bits.
    DateTime64(u32),
    Uuid,
    Nullable(Box<Type>),
    Array(Box<Type>),
}

/// One column of the target table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub kind: Type,
    /// The column has a DEFAULT, MATERIALIZED or ALIAS expression.
    pub has_default: bool,
}

/// Parses a ClickHouse type name, `Err` naming what is not supported.
pub fn parse_type(name: &str) -> Result<Type, String> {
    let name = name.trim();
    if let Some(inner) = wrapped(name, "LowCardinality") {
        return parse_type(inner);
    }
    if let Some(inner) = wrapped(name, "Nullable") {
        return Ok(Type::Nullable(Box::new(parse_type(inner)?)));
    }
    if let Some(inner) = wrapped(name, "Array") {
        return Ok(Type::Array(Box::new(parse_type(inner)?)));
    }
    if let Some(size) = wrapped(name, "FixedString") {
        return size
            .trim()
            .parse()
            .map(Type::FixedString)
            .map_err(|_| format!("bad FixedString size in {name}"));
    }
    if let Some(arguments) = wrapped(name, "DateTime64") {
        let precision = arguments.split(',').next().unwrap_or("").trim();
        return match precision.parse::<u32>() {
            Ok(precision) if precision <= 9 => Ok(Type::DateTime64(precision)),
            _ => Err(format!("bad DateTime64 precision in {name}")),
        };
    }
    if wrapped(name, "DateTime").is_some() {
        return Ok(Type::DateTime);
    }
    Ok(match name {
        "UInt8" => Type::UInt8,
        "UInt16" => Type::UInt16,
        "UInt32" => Type::UInt32,
        "UInt64" => Type::UInt64,
        "Int8" => Type::Int8,
        "Int16" => Type::Int16,
        "Int32" => Type::Int32,
        "Int64" => Type::Int64,
        "Float32" => Type::Float32,
        "Float64" => Type::Float64,
        "Bool" => Type::Bool,
        "String" => Type::String,
        "Date" => Type::Date,
        "Date32" => Type::Date32,
        "DateTime" => Type::DateTime,
        "UUID" => Type::Uuid,
        other => return Err(format!("the type {other} is not supported by row_binary")),
    })
}

/// `inner` of `Outer(inner)`.
fn wrapped<'a>(name: &'a str, outer: &str) -> Option<&'a str> {
    name.strip_prefix(outer)?
        .strip_prefix('(')?
        .strip_suffix(')')
}

/// Appends one row for `object` to `out`. `with_defaults` writes the
/// RowBinaryWithDefaults marker byte before each column (1: the server fills
/// in the column's default).
pub fn encode_row(
    columns: &[Column],
    object: &serde_json::Map<String, Value>,
    with_defaults: bool,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    for column in columns {
        let value = object.get(&column.name);
        if with_defaults {
            if value.is_none() {
                out.push(1);
                continue;
            }
            out.push(0);
        }
        let value = match value {
            Some(value) => value,
            None if matches!(column.kind, Type::Nullable(_)) => &Value::Null,
            None if column.has_default => {
                return Err(format!(
                    "no `{}` field, and its column's DEFAULT cannot be applied in RowBinary on this server (it has no RowBinaryWithDefaults); send the field or use json_each_row",
                    column.name
                ));
            }
            // What JSONEachRow does with a missing field of a column without
            // a DEFAULT: the type's zero value.
            None => {
                zero(&column.kind, out);
                continue;
            }
        };
        encode(&column.kind, value, out)
            .map_err(|reason| format!("`{}`: {reason}", column.name))?;
    }
    Ok(())
}

fn encode(kind: &Type, value: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    match kind {
        Type::UInt8 => out.push(unsigned(value, u64::from(u8::MAX))? as u8),
        Type::UInt16 => out.extend((unsigned(value, u64::from(u16::MAX))? as u16).to_le_bytes()),
        Type::UInt32 => out.extend((unsigned(value, u64::from(u32::MAX))? as u32).to_le_bytes()),
        Type::UInt64 => out.extend(unsigned(value, u64::MAX)?.to_le_bytes()),
        Type::Int8 => {
            out.extend((signed(value, i64::from(i8::MIN), i64::from(i8::MAX))? as i8).to_le_bytes())
        }
        Type::Int16 => out.extend(
            (signed(value, i64::from(i16::MIN), i64::from(i16::MAX))? as i16).to_le_bytes(),
        ),
        Type::Int32 => out.extend(
            (signed(value, i64::from(i32::MIN), i64::from(i32::MAX))? as i32).to_le_bytes(),
        ),
        Type::Int64 => out.extend(signed(value, i64::MIN, i64::MAX)?.to_le_bytes()),
        Type::Float32 => out.extend((float(value)? as f32).to_le_bytes()),
        Type::Float64 => out.extend(float(value)?.to_le_bytes()),
        Type::Bool => match value {
            Value::Bool(flag) => out.push(u8::from(*flag)),
            other => return Err(format!("expected true or false, found {other}")),
        },
        Type::String => {
            let text = string(value)?;
            leb128(text.len() as u64, out);
            out.extend_from_slice(text.as_bytes());
        }
        Type::FixedString(size) => {
            let text = string(value)?;
            if text.len() > *size {
                return Err(format!(
                    "{} bytes do not fit FixedString({size})",
                    text.len()
                ));
            }
            out.extend_from_slice(text.as_bytes());
            out.resize(out.len() + size - text.len(), 0);
        }
        Type::Date => {
            let days = days(value)?;
            let days =
                u16::try_from(days).map_err(|_| format!("{value} is out of Date's range"))?;
            out.extend(days.to_le_bytes());
        }
        Type::Date32 => {
            let days = i32::try_from(days(value)?)
                .map_err(|_| format!("{value} is out of Date32's range"))?;
            out.extend(days.to_le_bytes());
        }
        Type::DateTime => {
            let seconds = u32::try_from(nanos(value, 1_000_000_000)? / 1_000_000_000)
                .map_err(|_| format!("{value} is out of DateTime's range"))?;
            out.extend(seconds.to_le_bytes());
        }
        Type::DateTime64(precision) => {
            let scale = 10i128.pow(*precision);
            let nanos = nanos(value, scale)?;
            let ticks = i64::try_from(nanos * scale / 1_000_000_000)
                .map_err(|_| format!("{value} is out of DateTime64's range"))?;
            out.extend(ticks.to_le_bytes());
        }
        Type::Uuid => {
            let uuid = uuid::Uuid::parse_str(string(value)?)
                .map_err(|error| format!("not a UUID: {error}"))?;
            let (high, low) = uuid.as_u64_pair();
            out.extend(high.to_le_bytes());
            out.extend(low.to_le_bytes());
        }
        Type::Nullable(inner) => {
            if value.is_null() {
                out.push(1);
            } else {
                out.push(0);
                encode(inner, value, out)?;
            }
        }
        Type::Array(inner) => {
            let Value::Array(items) = value else {
                return Err(format!("expected an array, found {value}"));
            };
            leb128(items.len() as u64, out);
            for item in items {
                encode(inner, item, out)?;
            }
        }
    }
    Ok(())
}

/// The type's default value, as JSONEachRow fills in a missing field.
fn zero(kind: &Type, out: &mut Vec<u8>) {
    let width = match kind {
        Type::UInt8 | Type::Int8 | Type::Bool | Type::String | Type::Array(_) => 1,
        Type::UInt16 | Type::Int16 | Type::Date => 2,
        Type::UInt32 | Type::Int32 | Type::Float32 | Type::Date32 | Type::DateTime => 4,
        Type::UInt64 | Type::Int64 | Type::Float64 | Type::DateTime64(_) => 8,
        Type::Uuid => 16,
        Type::FixedString(size) => *size,
        // Null.
        Type::Nullable(_) => {
            out.push(1);
            return;
        }
    };
    out.resize(out.len() + width, 0);
}

fn unsigned(value: &Value, max: u64) -> Result<u64, String> {
    let number = match value {
        Value::Number(number) => number.as_u64(),
        Value::String(text) => text.parse().ok(),
        Value::Bool(flag) => Some(u64::from(*flag)),
        _ => None,
    };
    number
        .filter(|number| *number <= max)
        .ok_or_else(|| format!("expected an integer from 0 to {max}, found {value}"))
}

fn signed(value: &Value, min: i64, max: i64) -> Result<i64, String> {
    let number = match value {
        Value::Number(number) => number.as_i64(),
        Value::String(text) => text.parse().ok(),
        _ => None,
    };
    number
        .filter(|number| (min..=max).contains(number))
        .ok_or_else(|| format!("expected an integer from {min} to {max}, found {value}"))
}

fn float(value: &Value) -> Result<f64, String> {
    match value {
        Value::Number(number) => number.as_f64(),
        Value::String(text) => text.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("expected a number, found {value}"))
}

fn string(value: &Value) -> Result<&str, String> {
    value
        .as_str()
        .ok_or_else(|| format!("expected a string, found {value}"))
}

/// Days since the epoch: a number of days or a `YYYY-MM-DD` date.
fn days(value: &Value) -> Result<i64, String> {
    if let Some(days) = value.as_i64() {
        return Ok(days);
    }
    let text = string(value)?;
    let time = humantime::parse_rfc3339_weak(&format!("{text} 00:00:00"))
        .map_err(|_| format!("expected a YYYY-MM-DD date, found {text:?}"))?;
    let seconds = seconds_since_epoch(time);
    Ok(seconds.div_euclid(86_400) as i64)
}

/// Nanoseconds since the epoch: a number of `1/scale` seconds or an RFC 3339
/// time (`2024-05-01T12:00:00.5Z`, also with a space and no zone, read as UTC).
fn nanos(value: &Value, scale: i128) -> Result<i128, String> {
    if let Some(ticks) = value.as_i64() {
        return Ok(i128::from(ticks) * 1_000_000_000 / scale);
    }
    let text = string(value)?;
    let time = humantime::parse_rfc3339_weak(text.trim_end_matches('Z'))
        .map_err(|_| format!("expected an RFC 3339 time, found {text:?}"))?;
    Ok(match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    })
}

fn seconds_since_epoch(time: std::time::SystemTime) -> i128 {
    match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(after) => i128::from(after.as_secs()),
        Err(before) => -i128::from(before.duration().as_secs()),
    }
}

fn leb128(mut value: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn column(name: &str, kind: &str) -> Column {
        Column {
            name: name.into(),
            kind: parse_type(kind).unwrap(),
            has_default: false,
        }
    }

    fn row(columns: &[Column], value: Value, with_defaults: bool) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        encode_row(columns, value.as_object().unwrap(), with_defaults, &mut out).map(|()| out)
    }

    #[test]
    fn given_type_names_when_parsed_should_unwrap_low_cardinality_and_refuse_unknown_ones() {
        assert_eq!(
            parse_type("LowCardinality(Nullable(String))").unwrap(),
            Type::Nullable(Box::new(Type::String))
        );
        assert_eq!(
            parse_type("DateTime64(3, 'UTC')").unwrap(),
            Type::DateTime64(3)
        );
        assert_eq!(
            parse_type("DateTime('Europe/Paris')").unwrap(),
            Type::DateTime
        );
        assert_eq!(
            parse_type("Array(FixedString(4))").unwrap(),
            Type::Array(Box::new(Type::FixedString(4)))
        );
        let error = parse_type("Decimal(18, 2)").unwrap_err();
        assert!(error.contains("Decimal(18, 2)"), "{error}");
        assert!(parse_type("Map(String, UInt8)").is_err());
    }

    #[test]
    fn given_values_when_encoded_should_write_clickhouse_row_binary() {
        let columns = [
            column("u8", "UInt8"),
            column("i16", "Int16"),
            column("s", "String"),
            column("f", "FixedString(3)"),
            column("d", "Date"),
            column("t", "DateTime"),
            column("t3", "DateTime64(3)"),
            column("n", "Nullable(UInt32)"),
            column("a", "Array(Int8)"),
            column("x", "Float64"),
            column("id", "UUID"),
        ];
        let bytes = row(
            &columns,
            json!({
                "u8": 200, "i16": -2, "s": "hé", "f": "ab", "d": "1970-01-03",
                "t": "1970-01-01T00:01:00Z", "t3": 1500, "n": null, "a": [1, -1],
                "x": 0.5, "id": "00112233-4455-6677-8899-aabbccddeeff"
            }),
            false,
        )
        .unwrap();
        let mut wanted = vec![200u8];
        wanted.extend((-2i16).to_le_bytes());
        wanted.extend([3, b'h', 0xc3, 0xa9]);
        wanted.extend([b'a', b'b', 0]);
        wanted.extend(2u16.to_le_bytes());
        wanted.extend(60u32.to_le_bytes());
        wanted.extend(1500i64.to_le_bytes());
        wanted.push(1);
        wanted.extend([2, 1, 0xff]);
        wanted.extend(0.5f64.to_le_bytes());
        wanted.extend(0x0011_2233_4455_6677u64.to_le_bytes());
        wanted.extend(0x8899_aabb_ccdd_eeffu64.to_le_bytes());
        assert_eq!(bytes, wanted);
    }

    #[test]
    fn given_long_strings_when_encoded_should_prefix_a_multi_byte_length() {
        let text = "x".repeat(300);
        let bytes = row(&[column("s", "String")], json!({"s": text}), false).unwrap();
        assert_eq!(&bytes[..2], &[0xac, 0x02]);
        assert_eq!(bytes.len(), 302);
    }

    #[test]
    fn given_a_value_out_of_range_when_encoded_should_name_the_column() {
        let error = row(&[column("small", "UInt8")], json!({"small": 256}), false).unwrap_err();
        assert!(
            error.contains("`small`") && error.contains("256"),
            "{error}"
        );
        let error = row(&[column("s", "String")], json!({"s": 5}), false).unwrap_err();
        assert!(error.contains("expected a string"), "{error}");
    }

    #[test]
    fn given_missing_fields_when_encoded_should_mark_defaults_or_fill_zero() {
        let columns = [column("a", "UInt16"), column("b", "Nullable(String)")];
        assert_eq!(row(&columns, json!({}), true).unwrap(), vec![1, 1]);
        assert_eq!(row(&columns, json!({}), false).unwrap(), vec![0, 0, 1]);
        assert_eq!(
            row(&columns, json!({"a": 1}), true).unwrap(),
            vec![0, 1, 0, 1]
        );
        let with_default = [Column {
            has_default: true,
            ..column("a", "UInt16")
        }];
        let error = row(&with_default, json!({}), false).unwrap_err();
        assert!(error.contains("DEFAULT"), "{error}");
    }
}
