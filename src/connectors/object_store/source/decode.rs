//! An object's bytes into records: decompression (gzip, zstd) and the
//! formats (JSON lines, JSON array, CSV with a header, Parquet, Avro
//! container files, text lines, bytes).

use std::io::Read;

use bytes::Bytes;

use super::config::{Compression, Format};
use crate::message::Payload;

/// Why an object cannot be decoded; its key goes with it to `on_error`.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("larger than max_object_bytes ({limit} bytes) after decompression")]
    TooLarge { limit: u64 },
    #[error("cannot decompress ({compression}): {error}")]
    Decompress {
        compression: &'static str,
        error: std::io::Error,
    },
    #[error("line {line}: not JSON: {error}")]
    JsonLine {
        line: usize,
        error: serde_json::Error,
    },
    #[error("not a JSON array: {0}")]
    JsonArray(serde_json::Error),
    #[error("CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("line {line}: not UTF-8")]
    Text { line: usize },
    #[error("Parquet: {0}")]
    Parquet(String),
    #[error("Avro: {0}")]
    Avro(String),
}

/// The records of one object, in order.
pub fn decode(
    key: &str,
    body: Bytes,
    format: Format,
    compression: Compression,
    limit: u64,
) -> Result<Vec<Payload>, DecodeError> {
    let body = decompress(key, body, compression, limit)?;
    match resolve(key, &body, format) {
        Format::Auto | Format::JsonLines => json_lines(&body),
        Format::JsonArray => serde_json::from_slice::<Vec<serde_json::Value>>(&body)
            .map(|values| values.into_iter().map(Payload::Json).collect())
            .map_err(DecodeError::JsonArray),
        Format::Csv => csv_rows(&body),
        Format::TextLines => text_lines(&body),
        Format::Bytes => Ok(vec![Payload::Raw(body)]),
        Format::Parquet => parquet_rows(body, limit),
        Format::Avro => avro_records(&body),
    }
}

const PARQUET_MAGIC: &[u8] = b"PAR1";
const AVRO_MAGIC: &[u8] = b"Obj\x01";

/// The format of a decompressed object: `format`, or with `auto` the one
/// its key's extension (below `.gz`/`.zst`) or its magic bytes name; JSON
/// lines when nothing does.
fn resolve(key: &str, body: &[u8], format: Format) -> Format {
    if format != Format::Auto {
        return format;
    }
    let name = key.rsplit('/').next().unwrap_or(key);
    let name = [".gz", ".gzip", ".zst", ".zstd"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name);
    let extension = name
        .rsplit_once('.')
        .map(|(_, extension)| extension.to_ascii_lowercase());
    match extension.as_deref() {
        Some("parquet" | "pq") => Format::Parquet,
        Some("avro") => Format::Avro,
        Some("csv") => Format::Csv,
        Some("txt" | "log") => Format::TextLines,
        Some("json") if body.trim_ascii_start().starts_with(b"[") => Format::JsonArray,
        _ if body.starts_with(PARQUET_MAGIC) => Format::Parquet,
        _ if body.starts_with(AVRO_MAGIC) => Format::Avro,
        _ => Format::JsonLines,
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The object's bytes, decompressed as `compression` says (`auto`: by the
/// key's extension, else by the magic bytes), at most `limit` of them.
fn decompress(
    key: &str,
    body: Bytes,
    compression: Compression,
    limit: u64,
) -> Result<Bytes, DecodeError> {
    let chosen = match compression {
        Compression::Auto if key.ends_with(".gz") || body.starts_with(&GZIP_MAGIC) => {
            Compression::Gzip
        }
        Compression::Auto if key.ends_with(".zst") || body.starts_with(&ZSTD_MAGIC) => {
            Compression::Zstd
        }
        Compression::Auto => Compression::None,
        other => other,
    };
    let (name, reader): (&'static str, Box<dyn Read + '_>) = match chosen {
        Compression::Gzip => (
            "gzip",
            Box::new(flate2::read::MultiGzDecoder::new(&body[..])),
        ),
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::with_buffer(&body[..]).map_err(|error| {
                DecodeError::Decompress {
                    compression: "zstd",
                    error,
                }
            })?;
            ("zstd", Box::new(decoder))
        }
        Compression::Auto | Compression::None => {
            return if body.len() as u64 > limit {
                Err(DecodeError::TooLarge { limit })
            } else {
                Ok(body)
            };
        }
    };
    let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(limit as usize));
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|error| DecodeError::Decompress {
            compression: name,
            error,
        })?;
    if out.len() as u64 > limit {
        return Err(DecodeError::TooLarge { limit });
    }
    Ok(Bytes::from(out))
}

/// One JSON document per non-blank line, kept as its text (a slice of the
/// body, nothing copied).
fn json_lines(body: &Bytes) -> Result<Vec<Payload>, DecodeError> {
    let mut records = Vec::new();
    let mut start = 0;
    for (number, line) in body.split(|byte| *byte == b'\n').enumerate() {
        let end = start + line.len();
        let trimmed = line.trim_ascii();
        if !trimmed.is_empty() {
            serde_json::from_slice::<serde::de::IgnoredAny>(trimmed).map_err(|error| {
                DecodeError::JsonLine {
                    line: number + 1,
                    error,
                }
            })?;
            let offset = trimmed.as_ptr() as usize - body.as_ptr() as usize;
            records.push(Payload::JsonBytes(
                body.slice(offset..offset + trimmed.len()),
            ));
        }
        start = end + 1;
    }
    Ok(records)
}

/// Each row of a Parquet file as a JSON object (arrow-json's encoding:
/// nulls written out, timestamps as RFC 3339 text, nested lists and
/// structs as JSON), at most `limit` bytes of JSON in all.
fn parquet_rows(body: Bytes, limit: u64) -> Result<Vec<Payload>, DecodeError> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let parquet = |error: &dyn std::fmt::Display| DecodeError::Parquet(error.to_string());
    let reader = ParquetRecordBatchReaderBuilder::try_new(body)
        .and_then(|builder| builder.build())
        .map_err(|error| parquet(&error))?;
    let mut writer = arrow_json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .build::<_, arrow_json::writer::LineDelimited>(Vec::new());
    for batch in reader {
        let batch = batch.map_err(|error| parquet(&error))?;
        writer.write(&batch).map_err(|error| parquet(&error))?;
        if writer.get_ref().len() as u64 > limit {
            return Err(DecodeError::TooLarge { limit });
        }
    }
    writer.finish().map_err(|error| parquet(&error))?;
    Ok(lines_of_json(Bytes::from(writer.into_inner())))
}

/// Every datum of an Avro object container file (its own schema, any of
/// its codecs: null, deflate, snappy, zstd) as JSON.
fn avro_records(body: &[u8]) -> Result<Vec<Payload>, DecodeError> {
    let avro = |error: &dyn std::fmt::Display| DecodeError::Avro(error.to_string());
    let reader = apache_avro::Reader::new(body).map_err(|error| avro(&error))?;
    reader
        .map(|datum| {
            let datum = datum.map_err(|error| avro(&error))?;
            serde_json::Value::try_from(datum)
                .map(Payload::Json)
                .map_err(|error| avro(&error))
        })
        .collect()
}

/// JSON lines known to be well formed (written here), as slices of `body`.
fn lines_of_json(body: Bytes) -> Vec<Payload> {
    let mut records = Vec::new();
    let mut start = 0;
    for line in body.split(|byte| *byte == b'\n') {
        if !line.is_empty() {
            records.push(Payload::JsonBytes(body.slice(start..start + line.len())));
        }
        start += line.len() + 1;
    }
    records
}

/// Each row after the header as a JSON object of strings.
fn csv_rows(body: &[u8]) -> Result<Vec<Payload>, DecodeError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(body);
    let headers = reader.headers()?.clone();
    let mut records = Vec::new();
    for row in reader.records() {
        let row = row?;
        let object: serde_json::Map<String, serde_json::Value> = headers
            .iter()
            .zip(row.iter())
            .map(|(name, value)| (name.to_owned(), serde_json::Value::from(value)))
            .collect();
        records.push(Payload::Json(serde_json::Value::Object(object)));
    }
    Ok(records)
}

/// One text record per line (`\n` or `\r\n`), blank lines included.
fn text_lines(body: &[u8]) -> Result<Vec<Payload>, DecodeError> {
    let body = body.strip_suffix(b"\n").unwrap_or(body);
    if body.is_empty() {
        return Ok(Vec::new());
    }
    body.split(|byte| *byte == b'\n')
        .enumerate()
        .map(|(number, line)| {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            std::str::from_utf8(line)
                .map(|text| Payload::Text(text.to_owned()))
                .map_err(|_| DecodeError::Text { line: number + 1 })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    const LIMIT: u64 = 1 << 20;

    fn texts(records: &[Payload]) -> Vec<String> {
        records
            .iter()
            .map(|record| String::from_utf8(record.to_bytes().to_vec()).unwrap())
            .collect()
    }

    fn gzip(data: &[u8]) -> Bytes {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        Bytes::from(encoder.finish().unwrap())
    }

    #[test]
    fn given_json_lines_with_blank_lines_when_decoded_should_keep_each_document_in_order() {
        let body = Bytes::from_static(b"{\"a\":1}\r\n\n  {\"a\":2}\n[3]");
        let records = decode("k.jsonl", body, Format::JsonLines, Compression::Auto, LIMIT).unwrap();
        assert_eq!(texts(&records), ["{\"a\":1}", "{\"a\":2}", "[3]"]);
    }

    #[test]
    fn given_a_broken_json_line_when_decoded_should_name_the_line() {
        let body = Bytes::from_static(b"{\"a\":1}\n{\"a\":\n");
        let error = decode("k", body, Format::JsonLines, Compression::None, LIMIT).unwrap_err();
        assert!(
            matches!(error, DecodeError::JsonLine { line: 2, .. }),
            "{error}"
        );
    }

    #[test]
    fn given_gzip_by_magic_and_zstd_by_extension_when_decoded_should_decompress() {
        let lines = b"{\"n\":1}\n{\"n\":2}\n";
        let gz = decode(
            "no-ext",
            gzip(lines),
            Format::JsonLines,
            Compression::Auto,
            LIMIT,
        );
        assert_eq!(texts(&gz.unwrap()), ["{\"n\":1}", "{\"n\":2}"]);
        let zst = Bytes::from(zstd::encode_all(&lines[..], 1).unwrap());
        let zst = decode("a.zst", zst, Format::JsonLines, Compression::Auto, LIMIT);
        assert_eq!(texts(&zst.unwrap()), ["{\"n\":1}", "{\"n\":2}"]);
    }

    #[test]
    fn given_a_body_over_the_limit_after_decompression_when_decoded_should_refuse_it() {
        let body = gzip(&vec![b' '; 4096]);
        let error = decode("a.gz", body, Format::Bytes, Compression::Auto, 1024).unwrap_err();
        assert!(
            matches!(error, DecodeError::TooLarge { limit: 1024 }),
            "{error}"
        );
    }

    #[test]
    fn given_csv_with_a_header_when_decoded_should_make_objects_of_strings() {
        let body = Bytes::from_static(b"id,name\n1,ada\n2,\"b, c\"\n");
        let records = decode("a.csv", body, Format::Csv, Compression::Auto, LIMIT).unwrap();
        assert_eq!(
            texts(&records),
            [
                "{\"id\":\"1\",\"name\":\"ada\"}",
                "{\"id\":\"2\",\"name\":\"b, c\"}"
            ]
        );
    }

    #[test]
    fn given_a_json_array_text_lines_and_bytes_when_decoded_should_split_as_asked() {
        let array = Bytes::from_static(b"[{\"a\":1},2]");
        let records = decode("a", array, Format::JsonArray, Compression::None, LIMIT).unwrap();
        assert_eq!(texts(&records), ["{\"a\":1}", "2"]);
        let text = Bytes::from_static(b"one\r\n\ntwo\n");
        let records = decode("a", text, Format::TextLines, Compression::None, LIMIT).unwrap();
        assert_eq!(texts(&records), ["one", "", "two"]);
        let raw = Bytes::from_static(b"\x00\x01");
        let records = decode("a", raw.clone(), Format::Bytes, Compression::None, LIMIT).unwrap();
        assert_eq!(records, [Payload::Raw(raw)]);
    }

    /// A Parquet file of `(seq, name)` rows, a null name at odd seqs.
    fn parquet(seqs: std::ops::Range<i64>) -> Bytes {
        use std::sync::Arc;

        use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
        let names: StringArray = seqs
            .clone()
            .map(|seq| (seq % 2 == 0).then(|| format!("n{seq}")))
            .collect();
        let batch = RecordBatch::try_from_iter([
            (
                "seq",
                Arc::new(Int64Array::from_iter_values(seqs)) as ArrayRef,
            ),
            ("name", Arc::new(names) as ArrayRef),
        ])
        .unwrap();
        let mut out = Vec::new();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        Bytes::from(out)
    }

    fn avro(seqs: std::ops::Range<i64>, codec: apache_avro::Codec) -> Bytes {
        use apache_avro::types::Record;
        let schema = apache_avro::Schema::parse_str(
            r#"{"type":"record","name":"row","fields":[{"name":"seq","type":"long"},{"name":"tags","type":{"type":"array","items":"string"}}]}"#,
        )
        .unwrap();
        let mut writer = apache_avro::Writer::with_codec(&schema, Vec::new(), codec).unwrap();
        for seq in seqs {
            let mut record = Record::new(&schema).unwrap();
            record.put("seq", seq);
            record.put(
                "tags",
                apache_avro::types::Value::Array(vec![format!("t{seq}").into()]),
            );
            writer.append_value(record).unwrap();
        }
        Bytes::from(writer.into_inner().unwrap())
    }

    #[test]
    fn given_parquet_when_decoded_should_make_one_json_object_per_row_with_nulls() {
        let records = decode(
            "a.parquet",
            parquet(0..3),
            Format::Parquet,
            Compression::Auto,
            LIMIT,
        );
        assert_eq!(
            texts(&records.unwrap()),
            [
                "{\"seq\":0,\"name\":\"n0\"}",
                "{\"seq\":1,\"name\":null}",
                "{\"seq\":2,\"name\":\"n2\"}"
            ]
        );
    }

    #[test]
    fn given_parquet_larger_than_the_limit_as_json_when_decoded_should_refuse_it() {
        let error = decode(
            "a.parquet",
            parquet(0..1000),
            Format::Parquet,
            Compression::None,
            1024,
        )
        .unwrap_err();
        assert!(
            matches!(error, DecodeError::TooLarge { limit: 1024 }),
            "{error}"
        );
    }

    #[test]
    fn given_avro_container_files_with_codecs_when_decoded_should_make_json_per_datum() {
        for codec in [
            apache_avro::Codec::Null,
            apache_avro::Codec::Deflate(Default::default()),
            apache_avro::Codec::Snappy,
        ] {
            let records = decode(
                "a.avro",
                avro(0..2, codec),
                Format::Avro,
                Compression::Auto,
                LIMIT,
            );
            assert_eq!(
                texts(&records.unwrap()),
                [
                    "{\"seq\":0,\"tags\":[\"t0\"]}",
                    "{\"seq\":1,\"tags\":[\"t1\"]}"
                ],
                "{codec:?}"
            );
        }
    }

    #[test]
    fn given_truncated_parquet_or_avro_when_decoded_should_fail_naming_the_format() {
        let parquet = parquet(0..10);
        let error = decode(
            "a",
            parquet.slice(..parquet.len() - 9),
            Format::Parquet,
            Compression::None,
            LIMIT,
        )
        .unwrap_err();
        assert!(matches!(error, DecodeError::Parquet(_)), "{error}");
        let avro = avro(0..10, apache_avro::Codec::Null);
        let error = decode(
            "a",
            avro.slice(..avro.len() - 20),
            Format::Avro,
            Compression::None,
            LIMIT,
        )
        .unwrap_err();
        assert!(matches!(error, DecodeError::Avro(_)), "{error}");
    }

    #[test]
    fn given_auto_when_decoded_should_pick_the_format_by_extension_then_magic_bytes() {
        let auto = |key: &str, body: Bytes| {
            texts(&decode(key, body, Format::Auto, Compression::Auto, LIMIT).unwrap())
        };
        let row0 = "{\"seq\":0,\"name\":\"n0\"}";
        assert_eq!(auto("in/a.parquet", parquet(0..1)), [row0]);
        assert_eq!(auto("in/a.parquet.gz", gzip(&parquet(0..1))), [row0]);
        assert_eq!(auto("in/no-extension", parquet(0..1)), [row0]);
        let avro0 = "{\"seq\":0,\"tags\":[\"t0\"]}";
        assert_eq!(
            auto("in/x.bin", avro(0..1, apache_avro::Codec::Null)),
            [avro0]
        );
        assert_eq!(auto("a.csv.gz", gzip(b"seq\n7\n")), ["{\"seq\":\"7\"}"]);
        assert_eq!(auto("a.json", Bytes::from_static(b" [1,2]")), ["1", "2"]);
        assert_eq!(auto("a.json", Bytes::from_static(b"{}\n{}")), ["{}", "{}"]);
        assert_eq!(auto("a.log", Bytes::from_static(b"x y\n")), ["x y"]);
        assert_eq!(auto("a", Bytes::from_static(b"{\"k\":1}\n")), ["{\"k\":1}"]);
    }

    #[test]
    fn given_corrupt_gzip_when_decoded_should_fail_not_panic() {
        let mut body = gzip(b"{\"a\":1}\n").to_vec();
        let middle = body.len() / 2;
        body[middle] ^= 0xff;
        let result = decode(
            "a.gz",
            Bytes::from(body),
            Format::JsonLines,
            Compression::Auto,
            LIMIT,
        );
        assert!(result.is_err());
    }
}
