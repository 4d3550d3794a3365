use bytes::Bytes;
use serde_json::{Value, json};

use crate::message::{HeaderValue, Headers, Payload, TopicRef};
use crate::transforms::tests::{build_error, chain, run};
use crate::transforms::{MessageMeta, Side, TransformChain, Verdict};

fn source_meta<'a>(topic: &'a TopicRef, headers: &'a mut Headers) -> MessageMeta<'a> {
    MessageMeta {
        side: Side::Source,
        topic: Some(topic),
        partition: None,
        id: Some(42),
        offset: None,
        timestamp: None,
        origin_timestamp: Some(1_700_000_000_000_000),
        headers,
        key: None,
    }
}

fn topic() -> TopicRef {
    TopicRef {
        stream: "shop".into(),
        topic: "orders".into(),
    }
}

#[test]
fn given_a_remap_when_applied_should_rename_mask_parse_and_set_the_key_and_a_header() {
    let chain = chain(
        "remap",
        json!({"source": r#"
.user_id = del(.uid)
.email = redact!(.email, filters: [r'^[^@]+'])
.at = format_timestamp!(parse_timestamp!(.at, "%Y-%m-%d %H:%M:%S"), "%+")
%key = .user_id
%headers.origin = %stream + "/" + %topic
"#}),
    );
    let topic = topic();
    let mut headers = vec![("tenant".into(), HeaderValue::from("acme"))];
    let mut meta = source_meta(&topic, &mut headers);
    let mut payload = Payload::Json(
        json!({"uid": "u-7", "email": "ann@example.com", "at": "2026-01-02 03:04:05"}),
    );
    assert_eq!(
        chain.apply_with(&mut payload, &mut meta).unwrap(),
        Verdict::Keep
    );
    assert_eq!(
        payload,
        Payload::Json(json!({
            "at": "2026-01-02T03:04:05+00:00",
            "email": "[REDACTED]@example.com",
            "user_id": "u-7",
        }))
    );
    assert_eq!(meta.key.as_deref(), Some("u-7"));
    assert_eq!(meta.partition_for_source(), Some(crc32fast::hash(b"u-7")));
    assert_eq!(
        headers,
        vec![
            ("origin".into(), HeaderValue::from("shop/orders")),
            ("tenant".into(), HeaderValue::from("acme")),
        ]
    );
}

#[test]
fn given_the_metadata_when_read_should_show_the_message_id_topic_and_timestamps() {
    let chain = chain(
        "remap",
        json!({"source": r#". = { "id": %id, "stream": %stream, "offset": %offset, "origin": to_unix_timestamp!(%origin_timestamp), "tenant": %headers.tenant }"#}),
    );
    let topic = topic();
    let mut headers = vec![("tenant".into(), HeaderValue::from("acme"))];
    let mut payload = Payload::Json(json!({}));
    chain
        .apply_with(&mut payload, &mut source_meta(&topic, &mut headers))
        .unwrap();
    assert_eq!(
        payload,
        Payload::Json(
            json!({"id": "42", "offset": null, "origin": 1_700_000_000i64, "stream": "shop", "tenant": "acme"})
        )
    );
}

#[test]
fn given_a_compile_error_when_built_should_show_vrl_diagnostic_with_line_column_caret_and_hint() {
    let error = build_error("remap", json!({"source": ".a = 1\n.b = parse_json(.c)\n"}));
    assert_eq!(error.field, "source");
    let message = error.message;
    assert!(message.contains("error[E103]"), "{message}");
    assert!(message.contains("┌─ source:2:6"), "{message}");
    assert!(message.contains("2 │ .b = parse_json(.c)"), "{message}");
    assert!(message.contains("^^^^"), "{message}");
    assert!(
        message.contains("adding a `!`: `parse_json!(.c)`"),
        "{message}"
    );
}

#[test]
fn given_a_program_file_when_built_should_run_it_and_name_the_file_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.vrl");
    std::fs::write(&good, ".n = to_int!(.n) + 1\n").unwrap();
    let chain = chain("remap", json!({"file": good.to_str().unwrap()}));
    assert_eq!(run(&chain, json!({"n": 1})), json!({"n": 2}));

    let bad = dir.path().join("bad.vrl");
    std::fs::write(&bad, "# comment\n.n = nosuch(.n)\n").unwrap();
    let error = build_error("remap", json!({"file": bad.to_str().unwrap()}));
    assert_eq!(error.field, "file");
    let location = format!("┌─ {}:2:6", bad.display());
    assert!(error.message.contains(&location), "{}", error.message);
    assert!(
        error.message.contains("undefined function"),
        "{}",
        error.message
    );

    let error = build_error("remap", json!({"file": "/nonexistent/x.vrl"}));
    assert_eq!(error.field, "file");
    let error = build_error("remap", json!({"source": ".", "file": "x.vrl"}));
    assert_eq!(error.field, "file");
    let error = build_error("remap", json!({"drop_on_error": true}));
    assert_eq!(error.field, "source");
}

#[test]
fn given_a_runtime_error_when_drop_on_error_should_fail_the_message_else_pass_it_unchanged() {
    let program = r#".n = to_int!(.n) * 2"#;
    let failing = chain("remap", json!({"source": program}));
    let mut payload = Payload::Json(json!({"n": "x"}));
    let error = failing.apply(&mut payload).unwrap_err();
    assert_eq!(error.transform, "remap");
    assert!(error.message.contains("to_int"), "{}", error.message);
    assert_eq!(payload, Payload::Json(json!({"n": "x"})));

    let lenient = chain("remap", json!({"source": program, "drop_on_error": false}));
    assert_eq!(run(&lenient, json!({"n": "x"})), json!({"n": "x"}));
    assert_eq!(run(&lenient, json!({"n": 2})), json!({"n": 4}));
}

#[test]
fn given_abort_when_drop_on_abort_should_drop_the_message_else_pass_it_unchanged() {
    let program = r#"if .level == "debug" { abort }; .seen = true"#;
    let dropping = chain("remap", json!({"source": program}));
    let mut payload = Payload::Json(json!({"level": "debug"}));
    assert_eq!(dropping.apply(&mut payload).unwrap(), Verdict::Drop);
    assert_eq!(
        run(&dropping, json!({"level": "info"})),
        json!({"level": "info", "seen": true})
    );

    let keeping = chain("remap", json!({"source": program, "drop_on_abort": false}));
    assert_eq!(
        run(&keeping, json!({"level": "debug"})),
        json!({"level": "debug"})
    );
}

#[test]
fn given_text_and_raw_payloads_when_remapped_should_keep_their_shape_unless_the_result_is_structured()
 {
    let upcase = chain("remap", json!({"source": ". = upcase!(.)"}));
    let mut text = Payload::Text("hello".into());
    upcase.apply(&mut text).unwrap();
    assert_eq!(text, Payload::Text("HELLO".into()));
    let mut raw = Payload::Raw(Bytes::from_static(b"abc"));
    upcase.apply(&mut raw).unwrap();
    assert_eq!(raw, Payload::Raw(Bytes::from_static(b"ABC")));

    let parse = chain("remap", json!({"source": ". = parse_json!(.)"}));
    let mut text = Payload::Text(r#"{"a": [1, 2]}"#.into());
    parse.apply(&mut text).unwrap();
    assert_eq!(text, Payload::Json(json!({"a": [1, 2]})));
}

#[test]
fn given_writes_to_read_only_metadata_when_built_should_refuse_the_program() {
    for program in ["%offset = 1", "%stream = \"x\"", "%id = \"1\""] {
        let error = build_error("remap", json!({"source": program}));
        assert!(
            error.message.contains("read-only"),
            "{program}: {}",
            error.message
        );
    }
}

#[test]
fn given_env_functions_when_not_enabled_should_refuse_them_and_accept_them_when_enabled() {
    let program = r#".home = get_env_var!("PATH")"#;
    let error = build_error("remap", json!({"source": program}));
    assert!(
        error.message.contains("undefined function"),
        "{}",
        error.message
    );
    let chain = chain(
        "remap",
        json!({"source": program, "enable_env_functions": true}),
    );
    assert!(run(&chain, json!({}))["home"].is_string());

    let error = build_error("remap", json!({"source": ".h = get_hostname!()"}));
    assert!(
        error.message.contains("undefined function"),
        "{}",
        error.message
    );
    let error = build_error(
        "remap",
        json!({"source": ".", "enable_network_functions": true}),
    );
    assert_eq!(error.field, "enable_network_functions");
}

#[test]
fn given_a_timezone_when_parsing_local_times_should_use_it() {
    let program = r#".at = to_unix_timestamp(parse_timestamp!(.at, "%Y-%m-%d %H:%M:%S"))"#;
    let utc = chain("remap", json!({"source": program}));
    let warsaw = chain(
        "remap",
        json!({"source": program, "timezone": "Europe/Warsaw"}),
    );
    let at = json!({"at": "2026-01-02 03:00:00"});
    assert_eq!(run(&utc, at.clone())["at"], json!(1_767_322_800));
    assert_eq!(run(&warsaw, at)["at"], json!(1_767_322_800 - 3600));
    let error = build_error("remap", json!({"source": ".", "timezone": "Mars/Base"}));
    assert_eq!(error.field, "timezone");
}

#[test]
fn given_a_filter_condition_when_applied_should_keep_true_and_drop_false() {
    let chain = chain(
        "filter",
        json!({"condition": r#".level == "error" && .latency_ms > 500"#}),
    );
    let verdict = |value: Value| chain.apply(&mut Payload::Json(value)).unwrap();
    assert_eq!(
        verdict(json!({"level": "error", "latency_ms": 900})),
        Verdict::Keep
    );
    assert_eq!(
        verdict(json!({"level": "error", "latency_ms": 100})),
        Verdict::Drop
    );
    assert_eq!(
        verdict(json!({"level": "info", "latency_ms": 900})),
        Verdict::Drop
    );
}

#[test]
fn given_a_filter_on_headers_when_applied_should_read_the_metadata() {
    let chain = chain(
        "filter",
        json!({"condition": r#"%headers.tenant == "acme""#}),
    );
    let topic = topic();
    let mut acme = vec![("tenant".into(), HeaderValue::from("acme"))];
    let mut other = vec![("tenant".into(), HeaderValue::from("other"))];
    let mut payload = Payload::Json(json!({}));
    assert_eq!(
        chain
            .apply_with(&mut payload, &mut source_meta(&topic, &mut acme))
            .unwrap(),
        Verdict::Keep
    );
    assert_eq!(
        chain
            .apply_with(&mut payload, &mut source_meta(&topic, &mut other))
            .unwrap(),
        Verdict::Drop
    );
}

#[test]
fn given_a_filter_that_is_not_a_boolean_or_assigns_when_built_should_be_a_config_error() {
    let error = build_error("filter", json!({"condition": ".level"}));
    assert_eq!(error.field, "condition");
    assert!(error.message.contains("boolean"), "{}", error.message);
    let error = build_error("filter", json!({"condition": ".a = true"}));
    assert!(error.message.contains("read-only"), "{}", error.message);
    let error = build_error("filter", json!({"condition": ".a =="}));
    assert!(
        error.message.contains("┌─ condition:1:"),
        "{}",
        error.message
    );
}

#[test]
fn given_a_filter_whose_condition_fails_when_applied_should_be_a_transform_error() {
    for condition in ["to_int!(.n) > 1", ".n > 1"] {
        let chain = chain("filter", json!({"condition": condition}));
        let error = chain
            .apply(&mut Payload::Json(json!({"n": "x"})))
            .unwrap_err();
        assert_eq!(error.transform, "filter");
        assert!(
            error.message.contains("got integer") || error.message.contains("Invalid integer"),
            "{condition}: {}",
            error.message
        );
        assert!(
            !error.message.contains("assert"),
            "{condition}: {}",
            error.message
        );
    }
}

#[test]
fn given_named_tables_with_a_type_when_built_should_run_several_remaps_in_file_order() {
    let chain = TransformChain::build(&[
        (
            "first".into(),
            json!({"type": "remap", "source": ".trail = [\"first\"]"}),
        ),
        (
            "keep_big".into(),
            json!({"type": "filter", "condition": ".n > 1"}),
        ),
        (
            "second".into(),
            json!({"type": "remap", "source": ".trail = push(array!(.trail), \"second\")"}),
        ),
    ])
    .unwrap();
    assert_eq!(
        chain.names().collect::<Vec<_>>(),
        ["remap", "filter", "remap"]
    );
    assert_eq!(
        run(&chain, json!({"n": 2})),
        json!({"n": 2, "trail": ["first", "second"]})
    );
    assert_eq!(
        chain.apply(&mut Payload::Json(json!({"n": 1}))).unwrap(),
        Verdict::Drop
    );
    let error = TransformChain::build(&[("mask".into(), json!({"source": "."}))]).unwrap_err();
    assert!(error.message.contains("type = "), "{}", error.message);
    let error =
        TransformChain::build(&[("mask".into(), json!({"type": "remap", "source": ".a = "}))])
            .unwrap_err();
    assert_eq!(error.transform, "mask");
    assert_eq!(error.field, "source");
}

#[test]
fn given_a_program_that_changes_nothing_in_the_payload_when_applied_should_leave_it_as_it_was() {
    // Key order and an integer past i64::MAX survive: the payload is not
    // converted to VRL and back when the program does not change it.
    let input = json!({"z": 1, "a": 18_446_744_073_709_551_615_u64, "m": {"y": true, "b": 1.5}});
    for (program, key) in [
        (".", None),
        ("x = .z", None),
        ("log(.z, level: \"debug\")", None),
        ("assert!(.z == 1)", None),
        ("%key = .z", Some("1")),
        ("%key = .m.b", Some("1.5")),
        ("if .a == null { %key = \"none\" }", None),
    ] {
        let remap = chain("remap", json!({"source": program}));
        let topic = topic();
        let mut headers = Headers::new();
        let mut meta = source_meta(&topic, &mut headers);
        let mut payload = Payload::Json(input.clone());
        assert_eq!(
            remap.apply_with(&mut payload, &mut meta).unwrap(),
            Verdict::Keep,
            "{program}"
        );
        let Payload::Json(output) = payload else {
            panic!("{program}: expected JSON, found {payload:?}");
        };
        assert_eq!(output.to_string(), input.to_string(), "{program}");
        assert_eq!(meta.key.as_deref(), key, "{program}");
    }
}

#[test]
fn given_a_read_only_program_that_fails_when_applied_should_still_fail_the_message() {
    let remap = chain("remap", json!({"source": r#"assert!(.level == "info")"#}));
    assert_eq!(
        run(&remap, json!({"level": "info"})),
        json!({"level": "info"})
    );
    let mut payload = Payload::Json(json!({"level": "debug"}));
    let error = remap.apply(&mut payload).unwrap_err();
    assert_eq!(error.transform, "remap");
    assert_eq!(payload, Payload::Json(json!({"level": "debug"})));
}

#[test]
fn given_del_without_an_assignment_when_applied_should_change_the_payload() {
    let remap = chain("remap", json!({"source": "del(.a)\ndel(.m.y)"}));
    assert_eq!(
        run(&remap, json!({"a": 1, "m": {"y": true, "b": 2}, "z": 3})),
        json!({"m": {"b": 2}, "z": 3})
    );
}

#[test]
fn given_a_program_reading_the_whole_payload_when_applied_should_see_every_field() {
    let remap = chain("remap", json!({"source": "%key = encode_json(.)"}));
    let topic = topic();
    let mut headers = Headers::new();
    let mut meta = source_meta(&topic, &mut headers);
    let mut payload = Payload::Json(json!({"b": 1, "a": {"c": [2, null]}}));
    remap.apply_with(&mut payload, &mut meta).unwrap();
    assert_eq!(meta.key.as_deref(), Some(r#"{"a":{"c":[2,null]},"b":1}"#));
}

#[test]
fn given_a_changed_payload_when_converted_back_should_write_timestamps_regexes_and_big_integers_as_text()
 {
    let remap = chain(
        "remap",
        json!({"source": ".t = t'2026-01-02T03:04:05Z'\n.r = r'ab+'\n.f = float!(.f) * 2\n.copy = .big"}),
    );
    assert_eq!(
        run(
            &remap,
            json!({"big": 18_446_744_073_709_551_615_u64, "f": 1.25, "s": "x", "arr": [1, null, {"k": false}]})
        ),
        json!({
            "big": 18_446_744_073_709_551_615_u64, "copy": "18446744073709551615", "f": 2.5, "s": "x", "arr": [1, null, {"k": false}],
            "t": "2026-01-02T03:04:05Z", "r": "ab+",
        })
    );
}

#[test]
fn given_a_filter_on_nested_and_missing_fields_when_applied_should_read_them() {
    let filter = chain(
        "filter",
        json!({"condition": ".a.b == 1 && !exists(.missing) && .list[1] == \"y\""}),
    );
    let keep = json!({"a": {"b": 1}, "list": ["x", "y"], "other": "z"});
    assert_eq!(run(&filter, keep.clone()), keep);
    let mut payload = Payload::Json(json!({"a": {"b": 1}, "list": ["x"], "missing": 0}));
    assert_eq!(filter.apply(&mut payload).unwrap(), Verdict::Drop);
}

#[test]
fn given_programs_when_compiled_should_know_what_of_the_payload_they_need_and_which_do_nothing() {
    use super::target::View;
    use super::{Access, ProgramOptions, ProgramText, compile};
    use vrl::value::KeyString;
    let compiled = |source: &str| {
        let text = ProgramText {
            text: source.into(),
            name: "source".into(),
            field: "source",
        };
        compile(&text, &ProgramOptions::default(), Access::Remap).unwrap()
    };
    for program in [".", "x = .a", "%key == null", "true"] {
        assert!(compiled(program).inert, "{program}");
    }
    for program in [
        "log(.a)",
        "assert!(.a == 1)",
        "%key = .a",
        "if .a == 1 { abort }",
        "del(.a)",
        ".a = 1",
    ] {
        assert!(!compiled(program).inert, "{program}");
    }
    let fields =
        |names: &[&str]| View::Fields(names.iter().map(|name| KeyString::from(*name)).collect());
    assert_eq!(
        compiled("%key = .a.b\n%headers.x = .c[0]\nlog(.a)").view,
        fields(&["a", "c"])
    );
    assert_eq!(compiled("del(.a)").view, fields(&["a"]));
    assert_eq!(compiled(".b.c = 1").view, fields(&["b"]));
    assert_eq!(
        compiled(".user_id = del(.uid)").view,
        fields(&["uid", "user_id"])
    );
    for program in [
        ". = {\"a\": 1}",
        ".a = 1\n. = merge(., {\"b\": 2})",
        "%key = encode_json(.)",
        "%key = .[0]",
        "%key = get!(., [\"a\"])",
    ] {
        assert_eq!(compiled(program).view, View::Whole, "{program}");
    }
}

#[test]
fn given_a_program_changing_some_fields_when_applied_should_keep_the_others_in_their_order() {
    let remap = chain(
        "remap",
        json!({"source": ".user_id = del(.uid)\n.m.y = 2\ndel(.gone)"}),
    );
    let output = run(
        &remap,
        json!({"z": 1, "uid": "u-1", "m": {"x": 1}, "gone": true, "a": 18_446_744_073_709_551_615_u64}),
    );
    assert_eq!(
        output.to_string(),
        r#"{"z":1,"m":{"x":1,"y":2},"a":18446744073709551615,"user_id":"u-1"}"#
    );
}
