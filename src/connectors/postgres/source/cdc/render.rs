//! Renders pgoutput's text values as the polling mode renders rows, with
//! `row_to_json`'s rules: numbers, booleans, JSON columns, timestamps and
//! arrays come out exactly as a polled row's do.
//!
//! Most columns are written here ([`local`]): integers, `numeric` and floats
//! (a JSON number when the text is one, else a string: `NaN`), booleans,
//! text-like types and `uuid` (strings), `json` and `jsonb` (as sent), and
//! `date`, `timestamp` and `timestamptz` in their ISO text (the replication
//! connection asks for `DateStyle = ISO` and `TimeZone = UTC`, the SQL
//! connections' settings) turned into `row_to_json`'s form. A tuple with a
//! value of any other type, or a text this module does not recognise (a BC
//! date, another time zone), is rendered by PostgreSQL ([`render`]): it parses
//! the values back into the table's row type (`json_populate_record`) and
//! writes the row with `row_to_json`.

use sqlx::postgres::PgPool;
use tracing::warn;

use super::pgoutput::{Relation, Value, push_json_string};
use crate::connectors::postgres::source::quote::quote_identifier;
use crate::connectors::postgres::{describe, is_transient};

const BOOL: u32 = 16;
const NAME: u32 = 19;
const INT8: u32 = 20;
const INT2: u32 = 21;
const INT4: u32 = 23;
const TEXT: u32 = 25;
const OID: u32 = 26;
const JSON: u32 = 114;
const FLOAT4: u32 = 700;
const FLOAT8: u32 = 701;
const BPCHAR: u32 = 1042;
const VARCHAR: u32 = 1043;
const DATE: u32 = 1082;
const TIMESTAMP: u32 = 1114;
const TIMESTAMPTZ: u32 = 1184;
const NUMERIC: u32 = 1700;
const UUID: u32 = 2950;
const JSONB: u32 = 3802;

/// Writes the tuple as `row_to_json` writes a row, with only the columns
/// PostgreSQL sent (not unchanged TOASTed ones; only the key columns of a
/// key-only old tuple), into `out`. False, with `out` as it was, when a value
/// needs PostgreSQL to render it.
pub fn local(relation: &Relation, values: &[Value], key_only: bool, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    out.push(b'{');
    let mut first = true;
    for (column, value) in relation.columns.iter().zip(values) {
        if (key_only && !column.key) || matches!(value, Value::Unchanged) {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        out.extend_from_slice(column.json_key.as_bytes());
        let written = match value {
            Value::Text(bytes) => {
                std::str::from_utf8(bytes).is_ok_and(|text| write_value(column.type_oid, text, out))
            }
            Value::Null | Value::Unchanged => {
                out.extend_from_slice(b"null");
                true
            }
        };
        if !written {
            out.truncate(start);
            return false;
        }
    }
    out.push(b'}');
    true
}

/// One value's JSON as `row_to_json` writes it, or false for a type or text
/// left to PostgreSQL.
fn write_value(type_oid: u32, text: &str, out: &mut Vec<u8>) -> bool {
    match type_oid {
        INT2 | INT4 | INT8 | OID | NUMERIC | FLOAT4 | FLOAT8 => {
            if is_json_number(text.as_bytes()) {
                out.extend_from_slice(text.as_bytes());
            } else {
                // NaN, Infinity: strings, as row_to_json writes them.
                push_json_string(out, text);
            }
        }
        BOOL => match text {
            "t" => out.extend_from_slice(b"true"),
            "f" => out.extend_from_slice(b"false"),
            _ => return false,
        },
        TEXT | VARCHAR | BPCHAR | NAME | UUID => push_json_string(out, text),
        JSON | JSONB => out.extend_from_slice(text.as_bytes()),
        DATE if is_infinity(text) || is_iso_date(text.as_bytes()) => push_json_string(out, text),
        TIMESTAMP | TIMESTAMPTZ if is_infinity(text) => push_json_string(out, text),
        TIMESTAMP | TIMESTAMPTZ => {
            let Some(xsd) = xsd_timestamp(text, type_oid == TIMESTAMPTZ) else {
                return false;
            };
            out.push(b'"');
            out.extend_from_slice(xsd.0.as_bytes());
            out.push(b'T');
            out.extend_from_slice(xsd.1.as_bytes());
            if type_oid == TIMESTAMPTZ {
                out.extend_from_slice(b"+00:00");
            }
            out.push(b'"');
        }
        _ => return false,
    }
    true
}

fn is_infinity(text: &str) -> bool {
    text == "infinity" || text == "-infinity"
}

/// `YYYY-MM-DD` (four or more year digits, AD): ISO's date text, which is
/// also `row_to_json`'s.
fn is_iso_date(text: &[u8]) -> bool {
    let Some(dash) = text.iter().position(|&byte| byte == b'-') else {
        return false;
    };
    let (year, rest) = text.split_at(dash);
    year.len() >= 4
        && year.iter().all(u8::is_ascii_digit)
        && rest.len() == 6
        && rest[3] == b'-'
        && [1, 2, 4, 5].into_iter().all(|at| rest[at].is_ascii_digit())
}

/// ISO's `DATE HH:MM:SS[.ffffff]` (with `+00` for `timestamptz`, the UTC
/// offset) split into date and time, for `row_to_json`'s `DATETHH:MM:SS`
/// form; None for anything else (BC, another offset).
fn xsd_timestamp(text: &str, with_zone: bool) -> Option<(&str, &str)> {
    let (date, time) = text.split_once(' ')?;
    let time = if with_zone {
        time.strip_suffix("+00")?
    } else {
        time
    };
    let bytes = time.as_bytes();
    let clock = bytes.get(..8)?;
    let fraction = &bytes[8..];
    let clock_ok = clock[2] == b':'
        && clock[5] == b':'
        && [0, 1, 3, 4, 6, 7]
            .into_iter()
            .all(|at| clock[at].is_ascii_digit());
    let fraction_ok = fraction.is_empty()
        || (fraction[0] == b'.'
            && fraction.len() > 1
            && fraction[1..].iter().all(u8::is_ascii_digit));
    (is_iso_date(date.as_bytes()) && clock_ok && fraction_ok).then_some((date, time))
}

/// JSON's number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
fn is_json_number(text: &[u8]) -> bool {
    let mut at = 0;
    let digits = |at: &mut usize| {
        let start = *at;
        while text.get(*at).is_some_and(u8::is_ascii_digit) {
            *at += 1;
        }
        *at - start
    };
    if text.first() == Some(&b'-') {
        at += 1;
    }
    match text.get(at) {
        Some(b'0') => at += 1,
        Some(b'1'..=b'9') => {
            digits(&mut at);
        }
        _ => return false,
    }
    if text.get(at) == Some(&b'.') {
        at += 1;
        if digits(&mut at) == 0 {
            return false;
        }
    }
    if matches!(text.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(text.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        if digits(&mut at) == 0 {
            return false;
        }
    }
    at == text.len()
}

/// One tuple for PostgreSQL to render: only the columns PostgreSQL sent (not
/// unchanged TOASTed ones; only the key columns of a key-only old tuple).
pub struct Tuple {
    doc: String,
}

impl Tuple {
    pub fn new(relation: &Relation, values: &[Value], key_only: bool) -> Self {
        let mut doc = Vec::from(b"{".as_slice());
        for (column, value) in relation.columns.iter().zip(values) {
            if key_only && !column.key {
                continue;
            }
            if doc.len() > 1 && !matches!(value, Value::Unchanged) {
                doc.push(b',');
            }
            match value {
                Value::Unchanged => continue,
                Value::Null => {
                    doc.extend_from_slice(column.json_key.as_bytes());
                    doc.extend_from_slice(b"null");
                }
                Value::Text(bytes) => {
                    doc.extend_from_slice(column.json_key.as_bytes());
                    let text = String::from_utf8_lossy(bytes);
                    if [JSON, JSONB].contains(&column.type_oid) {
                        // JSON already, and goes in as JSON.
                        doc.extend_from_slice(text.as_bytes());
                    } else {
                        push_json_string(&mut doc, &text);
                    }
                }
            }
        }
        doc.push(b'}');
        Self {
            doc: String::from_utf8_lossy(&doc).into_owned(),
        }
    }
}

/// The tuples of `relation` as JSON objects, in order, rendered by
/// PostgreSQL. A relation PostgreSQL can no longer parse them into (dropped,
/// altered since) gets its values as JSON strings instead, with a warning:
/// the change is not lost.
pub async fn render(
    pool: &PgPool,
    relation: &Relation,
    tuples: &[Tuple],
) -> Result<Vec<String>, sqlx::Error> {
    if tuples.is_empty() {
        return Ok(Vec::new());
    }
    let table = format!(
        "{}.{}",
        quote_identifier(&relation.namespace).unwrap_or_default(),
        quote_identifier(&relation.name).unwrap_or_default()
    );
    let sql = format!(
        "SELECT coalesce((SELECT json_object_agg(e.key, e.value) \
           FROM json_each(row_to_json(json_populate_record(NULL::{table}, d.doc))) AS e \
           WHERE e.key IN (SELECT json_object_keys(d.doc))), '{{}}'::json)::text \
         FROM json_array_elements($1::json) WITH ORDINALITY AS d(doc, n) ORDER BY d.n"
    );
    let mut array = String::with_capacity(
        tuples
            .iter()
            .map(|tuple| tuple.doc.len() + 1)
            .sum::<usize>()
            + 2,
    );
    array.push('[');
    for (index, tuple) in tuples.iter().enumerate() {
        if index > 0 {
            array.push(',');
        }
        array.push_str(&tuple.doc);
    }
    array.push(']');
    match sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(&array)
        .fetch_all(pool)
        .await
    {
        Ok(rendered) => Ok(rendered),
        Err(error) if is_transient(&error) && !is_missing_table(&error) => Err(error),
        Err(error) => {
            warn!(table = %table, error = %describe(&error), "cannot render changed rows with the table's current types; producing their values as text");
            Ok(tuples.iter().map(|tuple| tuple.doc.clone()).collect())
        }
    }
}

fn is_missing_table(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(database) if database.code().as_deref() == Some("42P01"))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::connectors::postgres::source::cdc::pgoutput::RelationColumn;

    fn relation(columns: &[(&str, u32, bool)]) -> Relation {
        Relation {
            id: 1,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: b'd',
            columns: columns
                .iter()
                .map(|&(name, type_oid, key)| RelationColumn {
                    name: name.into(),
                    json_key: format!("\"{name}\":"),
                    key,
                    type_oid,
                })
                .collect(),
        }
    }

    fn text(value: &str) -> Value {
        Value::Text(Bytes::copy_from_slice(value.as_bytes()))
    }

    fn rendered(relation: &Relation, values: &[Value], key_only: bool) -> Option<String> {
        let mut out = b"prefix".to_vec();
        if !local(relation, values, key_only, &mut out) {
            assert_eq!(out, b"prefix", "a refused tuple leaves the buffer alone");
            return None;
        }
        Some(String::from_utf8(out[6..].to_vec()).unwrap())
    }

    #[test]
    fn given_common_types_when_rendered_locally_should_write_what_row_to_json_writes() {
        // The texts pgoutput sends (ISO, UTC) and row_to_json's output for
        // the same row, as PostgreSQL 15 printed them.
        let relation = relation(&[
            ("id", INT8, true),
            ("kind", TEXT, false),
            ("amount", NUMERIC, false),
            ("created_at", TIMESTAMPTZ, false),
            ("body", TEXT, false),
            ("f", FLOAT8, false),
            ("r", FLOAT4, false),
            ("b", BOOL, false),
            ("d", DATE, false),
            ("ts", TIMESTAMP, false),
            ("j", JSON, false),
            ("jb", JSONB, false),
            ("u", UUID, false),
            ("c", BPCHAR, false),
            ("big", TEXT, false),
            ("none", INT4, false),
        ]);
        let values = [
            text("1"),
            text("o\"r\\"),
            text("1.25"),
            text("2026-12-06 02:51:42.872445+00"),
            text("a\nb\u{1}é"),
            text("NaN"),
            text("1.5000001e+10"),
            text("t"),
            text("2024-01-02"),
            text("2024-01-02 03:04:05.5"),
            text("{\"a\" : 1}"),
            text("{\"a\": 1}"),
            text("ae8faaf6-7877-4895-ae4e-f2b230d55023"),
            text("ab "),
            Value::Unchanged,
            Value::Null,
        ];
        assert_eq!(
            rendered(&relation, &values, false).unwrap(),
            r#"{"id":1,"kind":"o\"r\\","amount":1.25,"created_at":"2026-12-06T02:51:42.872445+00:00","body":"a\nb\u0001é","f":"NaN","r":1.5000001e+10,"b":true,"d":"2024-01-02","ts":"2024-01-02T03:04:05.5","j":{"a" : 1},"jb":{"a": 1},"u":"ae8faaf6-7877-4895-ae4e-f2b230d55023","c":"ab ","none":null}"#
        );
        assert_eq!(
            rendered(&relation, &values, true).unwrap(),
            r#"{"id":1}"#,
            "a key-only tuple: the key columns"
        );
        let infinite = [text("2"), Value::Null, text("-Infinity"), text("infinity")];
        assert_eq!(
            rendered(&relation, &infinite, false).unwrap(),
            r#"{"id":2,"kind":null,"amount":"-Infinity","created_at":"infinity"}"#
        );
    }

    #[test]
    fn given_values_left_to_postgresql_when_rendered_locally_should_refuse_the_tuple() {
        let relation = relation(&[
            ("id", INT8, true),
            ("at", TIMESTAMPTZ, false),
            ("d", DATE, false),
            ("tags", 1007, false),
        ]);
        for values in [
            vec![text("1"), text("2024-01-02 03:04:05+05:30")],
            vec![text("1"), text("0044-03-15 12:00:00+00 BC")],
            vec![text("1"), Value::Null, text("0044-03-15 BC")],
            vec![text("1"), Value::Null, text("01/02/2024")],
            vec![text("1"), Value::Null, Value::Null, text("{1,2}")],
            vec![Value::Text(Bytes::from_static(b"\xff"))],
        ] {
            assert_eq!(rendered(&relation, &values, false), None, "{values:?}");
        }
    }

    #[test]
    fn given_number_texts_when_checked_should_follow_json_grammar() {
        for good in [
            "0",
            "-1",
            "1.25",
            "1e+100",
            "1.5E-3",
            "123456789012345678901234567890",
        ] {
            assert!(is_json_number(good.as_bytes()), "{good}");
        }
        for bad in [
            "", "-", "NaN", "Infinity", "01", "1.", ".5", "1e", "+1", "1 ",
        ] {
            assert!(!is_json_number(bad.as_bytes()), "{bad}");
        }
    }
}
