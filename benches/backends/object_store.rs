//! Throughput of the object_store source: JSON lines or Parquet objects ->
//! source -> Iggy, from a local directory and from moto's S3 server (PyPI
//! `moto[server]`, a Python process on loopback; `scripts/s3-emulator`
//! installs it), beside the ceiling measured in the same run: a raw `get`
//! of the same objects, one after the other, with the `object_store` client.
//!
//!     cargo bench --features object-store-source --bench backends -- object_store
//!
//! The case prints one `bench:` line with `objects=N`, `mb=` (the objects'
//! bytes as stored: Parquet is columnar and compressed, so its `mb` is
//! smaller for the same records), `mb_per_s=` and `raw_get_records_per_s=` / `raw_get_mb_per_s=`
//! (the ceiling) added. `BENCH_SCALE` multiplies the number of objects.
#![cfg(feature = "object-store-source")]

use std::sync::Arc;
use std::time::Instant;

use ::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use iggy_connect::connectors::ConnectorKind;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages};
use crate::support::s3::S3Server;

const CASES: &[&str] = &[
    "local_jsonl_to_iggy",
    "moto_jsonl_to_iggy",
    "local_parquet_to_iggy",
    "moto_parquet_to_iggy",
];
const TOPIC: &str = "records";
const LINES: u64 = 1000;

inventory::submit! {
    crate::Bench {
        name: "object_store",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let iggy = Iggy::start();
    let objects = common::scaled(100, 2);
    let parquet = case.contains("parquet");
    let bodies: Vec<(String, Vec<u8>)> = (0..objects)
        .map(|index| {
            let seqs = index * LINES..(index + 1) * LINES;
            if parquet {
                (format!("in/{index:06}.parquet"), parquet_body(seqs))
            } else {
                let body: String = seqs
                    .map(|seq| {
                        format!("{{\"seq\":{seq},\"name\":\"record {seq}\",\"amount\":{seq}.5}}\n")
                    })
                    .collect();
                (format!("in/{index:06}.jsonl"), body.into_bytes())
            }
        })
        .collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let server;
    let (store, url, extra): (Arc<dyn ObjectStore>, String, String) = match case.as_str() {
        "local_jsonl_to_iggy" | "local_parquet_to_iggy" => {
            let store = ::object_store::local::LocalFileSystem::new_with_prefix(dir.path())
                .expect("local store");
            (
                Arc::new(store),
                format!("file://{}/in", dir.path().display()),
                String::new(),
            )
        }
        _ => {
            server = S3Server::start().await;
            server.create_bucket("bench").await;
            let store = ::object_store::aws::AmazonS3Builder::new()
                .with_bucket_name("bench")
                .with_region("us-east-1")
                .with_endpoint(server.endpoint())
                .with_allow_http(true)
                .with_virtual_hosted_style_request(false)
                .with_access_key_id("bench")
                .with_secret_access_key("bench")
                .build()
                .expect("s3 store");
            let extra = format!(
                "region = \"us-east-1\"\nendpoint = \"{}\"\naccess_key_id = \"bench\"\nsecret_access_key = \"bench\"",
                server.endpoint()
            );
            (Arc::new(store), "s3://bench/in".to_owned(), extra)
        }
    };
    let mut bytes = 0u64;
    for (key, body) in &bodies {
        bytes += body.len() as u64;
        store
            .put(&key.as_str().into(), PutPayload::from(body.clone()))
            .await
            .expect("put");
    }
    // The ceiling: every object fetched whole, one after the other.
    let started = Instant::now();
    for (key, _) in &bodies {
        let body = store.get(&key.as_str().into()).await.expect("get");
        body.bytes().await.expect("body");
    }
    let raw = started.elapsed().as_secs_f64();
    let records = objects * LINES;
    let stream = common::unique(&case);
    let stages = Stages::install();
    let pipeline = Pipeline::new(
        &iggy,
        &format!(
            r#"
                type = "source"
                key = "object_store"
                path = "object_store"
                [[streams]]
                stream = "{stream}"
                topic = "{TOPIC}"
                schema = "json"
                batch_length = 1000
                [plugin_config]
                url = "{url}"
                format = "auto"
                batch_size = 1000
                {extra}
                "#
        ),
    );
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Source, "object_store", records)
        .await;
    pipeline.runtime.shutdown().await;
    let mb = bytes as f64 / 1e6;
    Report {
        name: &case,
        messages: records,
        elapsed,
        latencies: stages.latencies("object_store"),
        extra: vec![
            ("objects", objects.to_string()),
            ("mb", format!("{mb:.1}")),
            ("mb_per_s", format!("{:.1}", mb / elapsed.as_secs_f64())),
            (
                "raw_get_records_per_s",
                format!("{:.0}", records as f64 / raw),
            ),
            ("raw_get_mb_per_s", format!("{:.1}", mb / raw)),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
}

/// The same records as the JSON lines case, as one Parquet file (snappy).
fn parquet_body(seqs: std::ops::Range<u64>) -> Vec<u8> {
    use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
    let column = |array: ArrayRef| array;
    let batch = RecordBatch::try_from_iter([
        (
            "seq",
            column(Arc::new(Int64Array::from_iter_values(
                seqs.clone().map(|seq| seq as i64),
            ))),
        ),
        (
            "name",
            column(Arc::new(StringArray::from_iter_values(
                seqs.clone().map(|seq| format!("record {seq}")),
            ))),
        ),
        (
            "amount",
            column(Arc::new(Float64Array::from_iter_values(
                seqs.map(|seq| seq as f64 + 0.5),
            ))),
        ),
    ])
    .expect("record batch");
    let properties = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::SNAPPY)
        .build();
    let mut out = Vec::new();
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), Some(properties))
            .expect("parquet writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
    out
}
