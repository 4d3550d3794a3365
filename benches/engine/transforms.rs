//! Cost of each transform per message, on a record shaped like a change event
//! (`cargo bench --bench engine -- transform_per_message`). The payload is cloned outside the timed
//! part, so the figures are the transform alone.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group};
use iggy_connect::message::Payload;
use iggy_connect::transforms::TransformChain;
use serde_json::{Value, json};

fn record() -> Value {
    json!({
        "id": "0b4a3c52-6f7e-4a44-9d1c-1c2f3e4d5a6b",
        "table_name": "orders",
        "operation_type": "INSERT",
        "level": "info",
        "amount": 129.5,
        "customer_id": 42,
        "meta_source": "db-1",
        "meta_lsn": "0/16B3748",
        "tmp_trace": "abc",
        "data": {"order_id": 912_345_678_u64, "status": "new", "items": [1, 2, 3]},
        "old_data": null,
    })
}

fn cases() -> Vec<(&'static str, Vec<(String, Value)>)> {
    let one = |kind: &str, config: Value| vec![(kind.to_owned(), config)];
    vec![
        (
            "add_fields/static",
            one(
                "add_fields",
                json!({"fields": [{"key": "message", "value": {"static": "hello"}}]}),
            ),
        ),
        (
            "add_fields/date_time+uuid_v7+timestamp_millis",
            one(
                "add_fields",
                json!({"fields": [
                    {"key": "received_at", "value": {"computed": "date_time"}},
                    {"key": "event_id", "value": {"computed": "uuid_v7"}},
                    {"key": "received_ms", "value": {"computed": "timestamp_millis"}},
                ]}),
            ),
        ),
        (
            "delete_fields/2_keys",
            one(
                "delete_fields",
                json!({"fields": ["tmp_trace", "old_data"]}),
            ),
        ),
        (
            "update_fields/3_conditions",
            one(
                "update_fields",
                json!({"fields": [
                    {"key": "level", "value": {"static": "warn"}, "condition": "key_exists"},
                    {"key": "region", "value": {"static": "eu"}, "condition": "key_not_exists"},
                    {"key": "operation_type", "value": {"static": "UPSERT"}},
                ]}),
            ),
        ),
        (
            "filter_fields/keep_fields",
            one(
                "filter_fields",
                json!({"keep_fields": ["id", "table_name", "data"]}),
            ),
        ),
        (
            "filter_fields/key_regex+value_type",
            one(
                "filter_fields",
                json!({"include_matching": false, "patterns": [
                    {"key_pattern": {"regex": "^(tmp|meta)_"}},
                    {"value_pattern": "is_null"},
                ]}),
            ),
        ),
        (
            "filter_messages/exact_key_equals",
            one(
                "filter_messages",
                json!({"include_matching": false, "patterns": [
                    {"key_pattern": {"exact": "level"}, "value_pattern": {"equals": "debug"}},
                ]}),
            ),
        ),
        (
            "filter_messages/value_regex_scan",
            one(
                "filter_messages",
                json!({"patterns": [{"value_pattern": {"regex": "^0/[0-9A-F]+$"}}]}),
            ),
        ),
        (
            "unwrap_envelope",
            one("unwrap_envelope", json!({"field": "data"})),
        ),
        (
            "chain/filter_messages+delete+add+unwrap",
            vec![
                (
                    "filter_messages".into(),
                    json!({"include_matching": false, "patterns": [
                        {"key_pattern": {"exact": "level"}, "value_pattern": {"equals": "debug"}},
                    ]}),
                ),
                ("delete_fields".into(), json!({"fields": ["tmp_trace"]})),
                (
                    "add_fields".into(),
                    json!({"fields": [{"key": "message", "value": {"static": "hello"}}]}),
                ),
                ("unwrap_envelope".into(), json!({"field": "data"})),
            ],
        ),
    ]
}

fn transforms(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("transform_per_message");
    let payload = Payload::Json(record());
    for (name, configs) in cases() {
        let chain = TransformChain::build(&configs).unwrap();
        group.bench_function(name, |bench| {
            bench.iter_batched_ref(
                || payload.clone(),
                |payload| chain.apply(black_box(payload)).unwrap(),
                BatchSize::SmallInput,
            )
        });
    }
    let text = Payload::Text("plain text passes through".into());
    let chain = TransformChain::build(&cases().pop().unwrap().1).unwrap();
    group.bench_function("chain/non_json_pass_through", |bench| {
        bench.iter_batched_ref(
            || text.clone(),
            |payload| chain.apply(black_box(payload)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, transforms);
