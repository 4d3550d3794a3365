//! The query answers of each version as rows (column -> JSON value): v1's
//! JSON series, v2's annotated CSV, v3's JSON lines.

use csv::StringRecord;
use serde_json::{Map, Number, Value};

pub type Row = Map<String, Value>;

/// InfluxDB 1.x `/query` JSON: every series of the first statement, its tags
/// added to each row. An `error` of the statement is returned as `Err`.
pub fn v1(answer: &Value) -> Result<Vec<Row>, String> {
    let result = &answer["results"][0];
    if let Some(error) = result["error"].as_str().or(answer["error"].as_str()) {
        return Err(error.to_owned());
    }
    let mut rows = Vec::new();
    for series in result["series"].as_array().into_iter().flatten() {
        let columns: Vec<&str> = series["columns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|column| column.as_str().unwrap_or_default())
            .collect();
        for values in series["values"].as_array().into_iter().flatten() {
            let mut row: Row = columns
                .iter()
                .zip(values.as_array().into_iter().flatten())
                .map(|(column, value)| ((*column).to_owned(), value.clone()))
                .collect();
            if let Some(tags) = series["tags"].as_object() {
                for (tag, value) in tags {
                    row.entry(tag.clone()).or_insert_with(|| value.clone());
                }
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// InfluxDB 3 `/api/v3/query_sql` with `format = jsonl`: one object a line.
pub fn v3(text: &str) -> Result<Vec<Row>, String> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(index, line)| match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(row)) => Ok(row),
            Ok(other) => Err(format!(
                "line {} of the answer is not an object: {other}",
                index + 1
            )),
            Err(error) => Err(format!(
                "line {} of the answer is not JSON: {error}",
                index + 1
            )),
        })
        .collect()
}

/// Flux annotated CSV (`#datatype`, `#group`, `#default` annotations, a
/// header per table). Values are typed by `#datatype`; an error table
/// (`error`, `reference` columns) is `Err`. The `csv` crate skips the blank
/// lines between tables; each table starts with its annotations (the query
/// asks for them), which is where a new header is expected.
pub fn v2(text: &str) -> Result<Vec<Row>, String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        // Tables differ in width.
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut rows = Vec::new();
    let mut datatypes = StringRecord::new();
    let mut defaults = StringRecord::new();
    let mut header: Option<StringRecord> = None;
    for record in reader.records() {
        let record = record.map_err(|error| format!("the answer is not CSV: {error}"))?;
        match record.get(0).unwrap_or_default() {
            "#datatype" => {
                header = None;
                datatypes = record;
                continue;
            }
            "#default" => {
                header = None;
                defaults = record;
                continue;
            }
            annotation if annotation.starts_with('#') => {
                header = None;
                continue;
            }
            _ => {}
        }
        let Some(columns) = &header else {
            header = Some(record);
            continue;
        };
        let mut row = Row::new();
        for (index, (column, value)) in columns.iter().zip(&record).enumerate() {
            if column.is_empty() {
                continue;
            }
            let value = if value.is_empty() {
                defaults.get(index).unwrap_or_default()
            } else {
                value
            };
            let datatype = datatypes.get(index).unwrap_or_default();
            row.insert(column.to_owned(), typed(value, datatype));
        }
        if columns.iter().any(|column| column == "error") && row.contains_key("reference") {
            return Err(row["error"].as_str().unwrap_or_default().to_owned());
        }
        rows.push(row);
    }
    Ok(rows)
}

/// A CSV value as JSON by its Flux datatype (untyped: the most specific scalar).
fn typed(value: &str, datatype: &str) -> Value {
    if value.is_empty() {
        return Value::Null;
    }
    let parsed = match datatype {
        "long" => value.parse::<i64>().ok().map(Value::from),
        "unsignedLong" => value.parse::<u64>().ok().map(Value::from),
        "double" => value
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map(Value::Number),
        "boolean" => value.parse::<bool>().ok().map(Value::Bool),
        "" => value
            .parse::<bool>()
            .ok()
            .map(Value::Bool)
            .or_else(|| value.parse::<i64>().ok().map(Value::from))
            .or_else(|| {
                value
                    .parse::<f64>()
                    .ok()
                    .and_then(Number::from_f64)
                    .map(Value::Number)
            }),
        _ => None,
    };
    parsed.unwrap_or_else(|| Value::String(value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn given_annotated_csv_of_two_tables_when_parsed_should_type_values_by_datatype() {
        let text = "#datatype,string,long,dateTime:RFC3339,double,string,string,boolean\r\n\
                    #group,false,false,false,false,true,true,false\r\n\
                    #default,_result,,,,,,\r\n\
                    ,result,table,_time,_value,_field,host,ok\r\n\
                    ,,0,2024-03-01T00:00:00Z,1.5,v,\"a,\"\"b\"\"\",true\r\n\
                    \r\n\
                    #datatype,string,long,dateTime:RFC3339,long,string\r\n\
                    #group,false,false,false,false,true\r\n\
                    #default,_result,,,,\r\n\
                    ,result,table,_time,_value,_field\r\n\
                    ,,1,2024-03-01T00:00:01Z,7,n\r\n\r\n";
        let rows = v2(text).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0]["result"], json!("_result"));
        assert_eq!(rows[0]["_value"], json!(1.5));
        assert_eq!(rows[0]["host"], json!("a,\"b\""));
        assert_eq!(rows[0]["ok"], json!(true));
        assert_eq!(rows[1]["_value"], json!(7));
        assert_eq!(rows[1]["table"], json!(1));
    }

    #[test]
    fn given_an_error_table_when_parsed_should_return_its_message() {
        let text = "#datatype,string,string\n#group,true,true\n#default,,\n,error,reference\n,\"bad query: x\",897\n";
        assert_eq!(v2(text).unwrap_err(), "bad query: x");
    }

    #[test]
    fn given_v1_series_with_tags_when_parsed_should_add_the_tags_to_each_row() {
        let answer = json!({"results": [{"statement_id": 0, "series": [
            {"name": "cpu", "tags": {"host": "a"}, "columns": ["time", "v"], "values": [[1, 2.5], [2, 3]]}
        ]}]});
        let rows = v1(&answer).unwrap();
        assert_eq!(
            rows[1],
            json!({"time": 2, "v": 3, "host": "a"})
                .as_object()
                .unwrap()
                .clone()
        );
        let error = json!({"results": [{"statement_id": 0, "error": "database not found: x"}]});
        assert_eq!(v1(&error).unwrap_err(), "database not found: x");
    }

    #[test]
    fn given_json_lines_when_parsed_should_give_one_row_each() {
        let rows = v3("{\"time\":\"2024-03-01T00:00:00\",\"v\":1}\n\n{\"time\":\"2024-03-01T00:00:01\",\"v\":null}\n").unwrap();
        assert_eq!(rows.len(), 2);
        assert!(v3("[1]").is_err());
    }
}
