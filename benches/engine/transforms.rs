//! Cost of each transform per message, on a record shaped like a change event
//! (`cargo bench --bench engine -- transform_per_message`). The payload is cloned outside the timed
//! part, so the figures are the transform alone.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group};
use iggy_connect::message::{Headers, Payload, TopicRef};
use iggy_connect::transforms::{MessageMeta, Side, TransformChain};
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

/// `remap` and `filter` (feature `vrl`) beside no transform and the built-in
/// transforms doing the same work, through `apply_with` as a source runs
/// them (with the message's metadata): a ~200 B and a ~1 KB JSON record.
fn vrl_transforms(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("remap_per_message");
    let small = json!({
        "uid": "u-1842", "email": "ann.smith@example.com", "level": "info",
        "at": "2026-01-02 03:04:05", "amount": 129.5, "items": [1, 2, 3],
        "country": "PL", "session": "9f8e7d6c-5b4a-3210-fedc-ba9876543210",
    });
    let mut large = small.clone();
    large["description"] = json!("x".repeat(650));
    large["tags"] = json!(["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]);
    large["address"] =
        json!({"street": "Main St 1", "city": "Warsaw", "zip": "00-001", "country": "PL"});
    let three_lines =
        ".user_id = del(.uid)\n.at = parse_timestamp!(.at, \"%Y-%m-%d %H:%M:%S\")\n%key = .user_id";
    let mut cases: Vec<(&str, Vec<(String, Value)>)> = vec![("none", vec![])];
    if cfg!(feature = "vrl") {
        cases.push((
            "remap/no_op",
            vec![("remap".into(), json!({"source": "."}))],
        ));
        cases.push((
            "remap/rename+parse_timestamp+key",
            vec![("remap".into(), json!({"source": three_lines}))],
        ));
        cases.push((
            "filter/two_fields",
            vec![(
                "filter".into(),
                json!({"condition": ".level == \"info\" && .amount > 100"}),
            )],
        ));
    }
    cases.push((
        "builtin/update_fields_rename",
        vec![
            (
                "add_fields".into(),
                json!({"fields": [{"key": "user_id", "value": {"static": "u-1842"}}]}),
            ),
            ("delete_fields".into(), json!({"fields": ["uid"]})),
        ],
    ));
    let topic = TopicRef {
        stream: "bench".into(),
        topic: "records".into(),
    };
    for (size, record) in [("200B", &small), ("1KB", &large)] {
        let payload = Payload::Json(record.clone());
        for (name, configs) in &cases {
            let chain = TransformChain::build(configs).unwrap();
            group.bench_function(format!("{name}/{size}"), |bench| {
                bench.iter_batched_ref(
                    || (payload.clone(), Headers::new()),
                    |(payload, headers)| {
                        let mut meta = MessageMeta::headers_only(Side::Source, headers);
                        meta.topic = Some(&topic);
                        chain.apply_with(black_box(payload), &mut meta).unwrap()
                    },
                    BatchSize::SmallInput,
                )
            });
        }
    }
    group.finish();
}

criterion_group!(benches, transforms, vrl_transforms);
