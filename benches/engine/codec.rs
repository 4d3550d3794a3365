//! JSON decode and encode per message: serde_json (what the engine uses) against
//! simd-json, on a `random` source record (`small`, one long string), a database
//! row (`row`, mixed column types) and a nested order (`large`, 5 KiB).
//! `cargo bench --bench engine -- '^json_'`. `schema_codecs` puts the Avro, Protocol
//! Buffers and FlatBuffers stream schemas (features `schema-avro`,
//! `schema-proto`, `schema-flatbuffer`; FlatBuffers needs `flatc` on the PATH
//! to compile its schema) next to JSON on the row:
//! `cargo bench --features full --bench engine -- schema_codecs`.
//!
//! The engine's `Payload::Json` holds a `serde_json::Value`; simd-json is
//! measured both producing that same type (what switching would cost us) and
//! producing its own `OwnedValue` (upstream's choice, for reference). simd-json
//! parses in place, so each of its runs first copies the shared message bytes
//! into a buffer it may overwrite: the engine would have to do the same.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use iggy_connect::codec::Schema;
use iggy_connect::message::Payload;
use serde_json::{Value, json};

fn small() -> Value {
    json!({
        "id": "0b4a3c52-6f7e-4a44-9d1c-1c2f3e4d5a6b",
        "title": "Hello",
        "name": "World",
        "text": "Lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua Ut enim ad minim veniam quis nostrud exercitation ullamco laboris",
    })
}

/// A database row as the Postgres source would emit it: mixed column types.
fn row() -> Value {
    json!({
        "id": 1_234_567,
        "uuid": "0b4a3c52-6f7e-4a44-9d1c-1c2f3e4d5a6b",
        "email": "jane.doe@example.com",
        "first_name": "Jane",
        "last_name": "Doe",
        "age": 37,
        "balance": 10_234.56,
        "active": true,
        "deleted_at": null,
        "created_at": "2026-01-02T03:04:05.123456Z",
        "updated_at": "2026-01-03T04:05:06.654321Z",
        "country": "PL",
        "city": "Kraków",
        "zip": "30-001",
        "score": 0.875,
        "visits": 4211,
        "plan": "premium",
        "tags": ["a", "b"],
        "bio": "Software engineer who likes streaming systems, distributed logs and long walks in the mountains. Writes Rust and a bit of Go.",
    })
}

fn large() -> Value {
    let items: Vec<Value> = (0..40)
        .map(|index| {
            json!({
                "sku": format!("SKU-{index:05}"),
                "quantity": index % 7 + 1,
                "price": 19.99 + f64::from(index),
                "tags": ["red", "large", "sale"],
                "in_stock": index % 3 != 0,
            })
        })
        .collect();
    json!({
        "order_id": 912_345_678_u64,
        "customer": {"id": 42, "name": "Jane Doe", "email": "jane@example.com",
                     "address": {"street": "1 Main St", "city": "Springfield", "zip": "12345"}},
        "created_at": "2026-01-02T03:04:05.123456Z",
        "items": items,
        "notes": null,
    })
}

fn decode(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("json_decode");
    for (name, value) in [("small", small()), ("row", row()), ("large", large())] {
        let bytes = Bytes::from(serde_json::to_vec(&value).unwrap());
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("serde_json", name),
            &bytes,
            |bench, bytes| {
                bench.iter(|| serde_json::from_slice::<Value>(black_box(bytes)).unwrap())
            },
        );
        group.bench_with_input(
            BenchmarkId::new("engine_schema_json", name),
            &bytes,
            |bench, bytes| bench.iter(|| Schema::Json.decode(black_box(bytes.clone())).unwrap()),
        );
        // What a sink that takes JSON as text gets: checked, not parsed.
        group.bench_with_input(
            BenchmarkId::new("engine_schema_json_kept_as_text", name),
            &bytes,
            |bench, bytes| {
                bench.iter(|| {
                    Schema::Json
                        .decode_keeping_json_text(black_box(bytes.clone()))
                        .unwrap()
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("simd_json_to_serde_value", name),
            &bytes,
            |bench, bytes| {
                bench.iter(|| {
                    let mut buffer = black_box(bytes).to_vec();
                    simd_json::serde::from_slice::<Value>(&mut buffer).unwrap()
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("simd_json_owned_value", name),
            &bytes,
            |bench, bytes| {
                bench.iter(|| {
                    let mut buffer = black_box(bytes).to_vec();
                    simd_json::to_owned_value(&mut buffer).unwrap()
                })
            },
        );
    }
    group.finish();
}

fn encode(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("json_encode");
    for (name, value) in [("small", small()), ("row", row()), ("large", large())] {
        let size = serde_json::to_vec(&value).unwrap().len();
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(
            BenchmarkId::new("serde_json", name),
            &value,
            |bench, value| bench.iter(|| serde_json::to_vec(black_box(value)).unwrap()),
        );
        group.bench_with_input(
            BenchmarkId::new("serde_json_to_bytes", name),
            &value,
            |bench, value| {
                bench.iter(|| Bytes::from(serde_json::to_vec(black_box(value)).unwrap()))
            },
        );
        group.bench_with_input(
            BenchmarkId::new("serde_json_presized_to_bytes", name),
            &value,
            |bench, value| {
                bench.iter(|| {
                    let mut buffer = Vec::with_capacity(512);
                    serde_json::to_writer(&mut buffer, black_box(value)).unwrap();
                    Bytes::from(buffer)
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("serde_json_presized_boxed_to_bytes", name),
            &value,
            |bench, value| {
                bench.iter(|| {
                    let mut buffer = Vec::with_capacity(512);
                    serde_json::to_writer(&mut buffer, black_box(value)).unwrap();
                    Bytes::from(buffer.into_boxed_slice())
                })
            },
        );
        let payload = Payload::Json(value.clone());
        group.bench_with_input(
            BenchmarkId::new("engine_schema_json", name),
            &payload,
            |bench, payload| bench.iter(|| Schema::Json.encode(black_box(payload)).unwrap()),
        );
        group.bench_with_input(
            BenchmarkId::new("simd_json_from_serde_value", name),
            &value,
            |bench, value| bench.iter(|| simd_json::serde::to_vec(black_box(value)).unwrap()),
        );
        let mut buffer = serde_json::to_vec(&value).unwrap();
        let owned = simd_json::to_owned_value(&mut buffer).unwrap();
        group.bench_with_input(
            BenchmarkId::new("simd_json_owned_value", name),
            &owned,
            |bench, owned| bench.iter(|| simd_json::to_vec(black_box(owned)).unwrap()),
        );
    }
    group.finish();
}

#[cfg(all(feature = "schema-avro", feature = "schema-proto"))]
fn schema_codecs(criterion: &mut Criterion) {
    use iggy_connect::codec::{SchemaName, SchemaOptions};
    const ROW_AVRO: &str = r#"{"type":"record","name":"Row","fields":[
        {"name":"id","type":"long"},{"name":"uuid","type":"string"},
        {"name":"email","type":"string"},{"name":"first_name","type":"string"},
        {"name":"last_name","type":"string"},{"name":"age","type":"int"},
        {"name":"balance","type":"double"},{"name":"active","type":"boolean"},
        {"name":"deleted_at","type":["null","string"]},{"name":"created_at","type":"string"},
        {"name":"updated_at","type":"string"},{"name":"country","type":"string"},
        {"name":"city","type":"string"},{"name":"zip","type":"string"},
        {"name":"score","type":"double"},{"name":"visits","type":"long"},
        {"name":"plan","type":"string"},{"name":"tags","type":{"type":"array","items":"string"}},
        {"name":"bio","type":"string"}]}"#;
    const ROW_PROTO: &str = "syntax = \"proto3\";\nmessage Row {\n int64 id = 1; string uuid = 2;\n\
        string email = 3; string first_name = 4; string last_name = 5; int32 age = 6;\n\
        double balance = 7; bool active = 8; optional string deleted_at = 9;\n\
        string created_at = 10; string updated_at = 11; string country = 12; string city = 13;\n\
        string zip = 14; double score = 15; int64 visits = 16; string plan = 17;\n\
        repeated string tags = 18; string bio = 19;\n}\n";
    let dir = tempfile::tempdir().unwrap();
    let proto_path = dir.path().join("row.proto");
    std::fs::write(&proto_path, ROW_PROTO).unwrap();
    let avro = Schema::load(
        SchemaName::Avro,
        &SchemaOptions {
            avro_schema_json: Some(ROW_AVRO.into()),
            ..SchemaOptions::default()
        },
    )
    .unwrap();
    let proto = Schema::load(
        SchemaName::Proto,
        &SchemaOptions {
            proto_schema_path: Some(proto_path.to_string_lossy().into_owned()),
            proto_message_type: Some("Row".into()),
            ..SchemaOptions::default()
        },
    )
    .unwrap();
    // Avro's union needs the null; protobuf and FlatBuffers leave an unset
    // field out.
    let with_null = Payload::Json(row());
    let mut value = row();
    value.as_object_mut().unwrap().shift_remove("deleted_at");
    let without_null = Payload::Json(value);
    let mut schemas = vec![
        ("json", Schema::Json, &with_null),
        ("avro", avro, &with_null),
        ("proto", proto, &without_null),
    ];
    schemas.extend(flatbuffer_row(dir.path()).map(|schema| ("flat_buffer", schema, &without_null)));
    let mut decode_group = criterion.benchmark_group("schema_codecs_decode");
    for (name, schema, payload) in &schemas {
        let bytes = schema.encode(payload).unwrap();
        decode_group.throughput(Throughput::Bytes(bytes.len() as u64));
        decode_group.bench_with_input(BenchmarkId::new(*name, "row"), &bytes, |bench, bytes| {
            bench.iter(|| schema.decode(black_box(bytes.clone())).unwrap())
        });
    }
    decode_group.finish();
    let mut encode_group = criterion.benchmark_group("schema_codecs_encode");
    for (name, schema, payload) in &schemas {
        encode_group.bench_with_input(
            BenchmarkId::new(*name, "row"),
            *payload,
            |bench, payload| bench.iter(|| schema.encode(black_box(payload)).unwrap()),
        );
    }
    encode_group.finish();
}

#[cfg(not(all(feature = "schema-avro", feature = "schema-proto")))]
fn schema_codecs(_: &mut Criterion) {}

/// The row as a FlatBuffers table, compiled by `flatc`; `None` (with a note)
/// when flatc is not installed.
#[cfg(all(feature = "schema-avro", feature = "schema-proto"))]
fn flatbuffer_row(dir: &std::path::Path) -> Option<Schema> {
    #[cfg(feature = "schema-flatbuffer")]
    {
        use iggy_connect::codec::{SchemaName, SchemaOptions};
        const ROW_FBS: &str = "table Row { id: long; uuid: string; email: string;\n\
            first_name: string; last_name: string; age: int; balance: double; active: bool;\n\
            deleted_at: string; created_at: string; updated_at: string; country: string;\n\
            city: string; zip: string; score: double; visits: long; plan: string;\n\
            tags: [string]; bio: string; }\nroot_type Row;\n";
        std::fs::write(dir.join("row.fbs"), ROW_FBS).unwrap();
        let compiled = std::process::Command::new("flatc")
            .args(["-b", "--schema", "row.fbs"])
            .current_dir(dir)
            .status();
        if !compiled.is_ok_and(|status| status.success()) {
            eprintln!("schema_codecs: flatc is not installed; flat_buffer left out");
            return None;
        }
        let options = SchemaOptions {
            flatbuffer_schema_path: Some(dir.join("row.bfbs").to_string_lossy().into_owned()),
            ..SchemaOptions::default()
        };
        Some(Schema::load(SchemaName::FlatBuffer, &options).unwrap())
    }
    #[cfg(not(feature = "schema-flatbuffer"))]
    {
        let _ = dir;
        None
    }
}

criterion_group!(benches, decode, encode, schema_codecs);
