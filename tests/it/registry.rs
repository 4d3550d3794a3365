//! The connector registry against what describes it: the Cargo features and
//! bundles, and `describe` for every
//! registered connector (its fields, an example `validate` accepts unchanged,
//! a JSON Schema the example satisfies).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use iggy_connect::config::connector::toml_to_json;
use iggy_connect::connectors::describe;
use iggy_connect::connectors::registry::ConnectorInfo;
use iggy_connect::connectors::{ConnectorKind, Registry};
use serde_json::Value;

fn iggy_connect(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run iggy-connect")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn strings(value: &toml::Value) -> BTreeSet<String> {
    value
        .as_array()
        .expect("a list of features")
        .iter()
        .map(|item| item.as_str().expect("a feature name").to_owned())
        .collect()
}

#[test]
fn registry_cargo_features_and_bundles_agree() {
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(repo().join("Cargo.toml")).unwrap()).unwrap();
    let features = manifest["features"].as_table().expect("[features]");
    let in_tree = Registry::in_tree();

    let of_kind = |kind: ConnectorKind| -> BTreeSet<String> {
        in_tree
            .iter()
            .filter(|connector| connector.kind == kind)
            .map(|connector| connector.feature.to_owned())
            .collect()
    };
    let (sources, sinks) = (of_kind(ConnectorKind::Source), of_kind(ConnectorKind::Sink));
    for connector in in_tree {
        assert!(
            features.contains_key(connector.feature),
            "{} {} is registered with feature `{}`, which Cargo.toml does not have",
            connector.kind,
            connector.name,
            connector.feature
        );
    }
    let connector_features: BTreeSet<String> = features
        .keys()
        .filter(|name| name.ends_with("-source") || name.ends_with("-sink"))
        .cloned()
        .collect();
    let registered: BTreeSet<String> = sources.union(&sinks).cloned().collect();
    assert_eq!(
        connector_features, registered,
        "Cargo.toml's connector features and the registration lines differ"
    );

    let (all_sources, all_sinks) = (
        strings(&features["all-sources"]),
        strings(&features["all-sinks"]),
    );
    for (bundle, members, of_kind) in [
        ("all-sources", &all_sources, &sources),
        ("all-sinks", &all_sinks, &sinks),
    ] {
        assert!(
            members.is_subset(of_kind),
            "{bundle} holds a feature of the other kind: {members:?}"
        );
    }
    // `full` is every connector bundle plus bundles of other kinds (schemas),
    // never a connector named on its own.
    let full = strings(&features["full"]);
    assert!(
        full.contains("all-sources") && full.contains("all-sinks"),
        "full lacks a connector bundle: {full:?}"
    );
    for member in &full {
        assert!(
            !sources.contains(member) && !sinks.contains(member),
            "full names the connector feature `{member}` outside its bundle"
        );
    }

    // Under `full` every bundled connector is compiled in.
    if cfg!(feature = "full") {
        let compiled: BTreeSet<String> = Registry::all()
            .iter()
            .map(|info| info.feature.to_owned())
            .collect();
        let bundled: BTreeSet<String> = all_sources.union(&all_sinks).cloned().collect();
        assert!(
            bundled.is_subset(&compiled),
            "{bundled:?} not all in {compiled:?}"
        );
    }
}

#[test]
fn describe_prints_every_documented_field_of_every_connector() {
    let dir = tempfile::tempdir().unwrap();
    let all = Registry::all();
    assert!(!all.is_empty());
    for info in &all {
        let fields = describe::fields(info);
        assert!(
            !fields.is_empty(),
            "{} {} has no fields",
            info.kind,
            info.name
        );
        let output = iggy_connect(dir.path(), &["describe", &info.kind.to_string(), info.name]);
        assert!(output.status.success(), "{:?}", output);
        let text = stdout(&output);
        assert_eq!(
            text.contains("`max_in_flight` (1-64, default "),
            info.kind == ConnectorKind::Source,
            "{} {}: max_in_flight in describe:\n{text}",
            info.kind,
            info.name
        );
        for field in &fields {
            assert!(
                !field.description.is_empty(),
                "{} {}: field `{}` has no doc comment",
                info.kind,
                info.name,
                field.name
            );
            let line = text
                .lines()
                .find(|line| line.split_whitespace().next() == Some(field.name.as_str()))
                .unwrap_or_else(|| {
                    panic!(
                        "{} {}: no line for `{}`:\n{text}",
                        info.kind, info.name, field.name
                    )
                });
            assert!(line.contains(&field.kind), "{line}");
            assert!(line.contains(&field.description), "{line}");
            assert!(
                line.contains(if field.required { " yes " } else { " no " }),
                "{line}"
            );
        }
    }
}

fn example(dir: &Path, info: &ConnectorInfo) -> String {
    let output = iggy_connect(
        dir,
        &["describe", &info.kind.to_string(), info.name, "--example"],
    );
    assert!(output.status.success(), "{output:?}");
    stdout(&output)
}

const RUNTIME_CONFIG: &str = "[iggy]\naddress = \"127.0.0.1:8090\"\nusername = \"iggy\"\npassword = \"iggy\"\n[state]\npath = \"state\"\n[connectors]\nconfig_type = \"local\"\nconfig_dir = \"connectors\"\n";

#[test]
fn describe_example_is_a_connector_file_validate_accepts_unchanged_and_without_a_required_field_names_it()
 {
    for info in Registry::all() {
        let dir = tempfile::tempdir().unwrap();
        let file = example(dir.path(), &info);
        std::fs::create_dir(dir.path().join("connectors")).unwrap();
        std::fs::write(dir.path().join("connectors/example.toml"), &file).unwrap();
        std::fs::write(dir.path().join("config.toml"), RUNTIME_CONFIG).unwrap();
        let output = iggy_connect(dir.path(), &["validate", "--config", "config.toml"]);
        assert!(
            output.status.success(),
            "{} {}: validate refused its example:\n{file}\n{}",
            info.kind,
            info.name,
            String::from_utf8_lossy(&output.stderr)
        );

        let parsed: toml::Table = toml::from_str(&file).unwrap();
        // Top-level fields: `describe` also lists nested ones (`endpoints[].path`).
        let required = describe::fields(&info)
            .into_iter()
            .filter(|field| field.required && !field.name.contains(['.', '[']));
        for field in required {
            let mut without = parsed.clone();
            without["plugin_config"]
                .as_table_mut()
                .unwrap()
                .remove(&field.name);
            std::fs::write(
                dir.path().join("connectors/example.toml"),
                toml::to_string(&without).unwrap(),
            )
            .unwrap();
            let output = iggy_connect(dir.path(), &["validate", "--config", "config.toml"]);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(2),
                "{} {}: without `{}` validate passes:\n{stderr}",
                info.kind,
                info.name,
                field.name
            );
            assert!(
                stderr.contains(&format!("field `plugin_config.{}`", field.name)),
                "{} {}: without `{}`:\n{stderr}",
                info.kind,
                info.name,
                field.name
            );
        }
    }
}

#[test]
fn describe_json_schema_is_a_json_schema_that_the_example_satisfies_and_a_typo_does_not() {
    let dir = tempfile::tempdir().unwrap();
    for info in Registry::all() {
        let (kind, name) = (info.kind.to_string(), info.name);
        let output = iggy_connect(
            dir.path(),
            &["describe", &kind, name, "--format", "json-schema"],
        );
        assert!(output.status.success(), "{output:?}");
        let schema: Value = serde_json::from_str(&stdout(&output)).expect("JSON");
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        check_schema_structure(&schema, &schema, "#");

        let file: toml::Table = toml::from_str(&example(dir.path(), &info)).unwrap();
        let file = toml_to_json(&toml::Value::Table(file));
        let errors = validate(&schema, &schema, &file, "");
        assert!(
            errors.is_empty(),
            "{kind} {name}: the example breaks the schema: {errors:?}"
        );

        let mut typo = file.clone();
        typo["plugin_config"]["no_such_field"] = Value::Bool(true);
        assert!(
            !validate(&schema, &schema, &typo, "").is_empty(),
            "{kind} {name}: a typo passes"
        );
        let mut missing = file.clone();
        missing.as_object_mut().unwrap().remove("streams");
        assert!(
            !validate(&schema, &schema, &missing, "").is_empty(),
            "{kind} {name}: no streams passes"
        );
        if info.kind == ConnectorKind::Source {
            let mut in_flight = file.clone();
            for (count, fits) in [(1, true), (64, true), (0, false), (65, false)] {
                in_flight["max_in_flight"] = Value::from(count);
                assert_eq!(
                    validate(&schema, &schema, &in_flight, "").is_empty(),
                    fits,
                    "{kind} {name}: max_in_flight = {count}"
                );
            }
        }
    }
}

const TYPES: &[&str] = &[
    "null", "boolean", "object", "array", "number", "string", "integer",
];

/// The keywords used are JSON Schema's, with values of the right shape, and
/// every `$ref` resolves.
fn check_schema_structure(root: &Value, schema: &Value, at: &str) {
    let Value::Object(map) = schema else {
        assert!(
            schema.is_boolean(),
            "{at}: a schema is an object or a boolean"
        );
        return;
    };
    for (keyword, value) in map {
        let here = format!("{at}/{keyword}");
        match keyword.as_str() {
            "type" => {
                let names: Vec<&Value> = match value {
                    Value::Array(names) => names.iter().collect(),
                    other => vec![other],
                };
                for name in names {
                    assert!(
                        TYPES.contains(&name.as_str().unwrap_or("")),
                        "{here}: {name}"
                    );
                }
            }
            "$ref" => {
                let target = value
                    .as_str()
                    .and_then(|text| text.strip_prefix("#/$defs/"));
                let target = target.and_then(|name| root["$defs"].get(name));
                assert!(target.is_some(), "{here}: {value} does not resolve");
            }
            "properties" | "$defs" => {
                for (name, property) in value.as_object().unwrap_or_else(|| panic!("{here}")) {
                    check_schema_structure(root, property, &format!("{here}/{name}"));
                }
            }
            "items" | "additionalProperties" => check_schema_structure(root, value, &here),
            "anyOf" | "oneOf" | "allOf" => {
                for (index, option) in value
                    .as_array()
                    .unwrap_or_else(|| panic!("{here}"))
                    .iter()
                    .enumerate()
                {
                    check_schema_structure(root, option, &format!("{here}/{index}"));
                }
            }
            "required" | "enum" => assert!(value.is_array(), "{here}"),
            "minimum" | "maximum" | "minItems" | "maxItems" | "minLength" => {
                assert!(value.is_number(), "{here}")
            }
            "$schema" | "title" | "description" | "format" | "pattern" => {
                assert!(value.is_string(), "{here}")
            }
            "default" | "const" => {}
            other => panic!("{here}: unexpected keyword `{other}`"),
        }
    }
}

/// The errors of `value` against `schema`, for the keywords `describe` emits.
fn validate(root: &Value, schema: &Value, value: &Value, at: &str) -> Vec<String> {
    let schema = match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => &root["$defs"][reference.trim_start_matches("#/$defs/")],
        None => schema,
    };
    let mut errors = Vec::new();
    let mut fail = |message: String| errors.push(format!("{at}: {message}"));
    if let Some(types) = schema.get("type") {
        let names: Vec<&str> = match types {
            Value::Array(names) => names.iter().filter_map(Value::as_str).collect(),
            other => other.as_str().into_iter().collect(),
        };
        let fits = |name: &str| match name {
            "null" => value.is_null(),
            "boolean" => value.is_boolean(),
            "object" => value.is_object(),
            "array" => value.is_array(),
            "number" => value.is_number(),
            "integer" => value.is_i64() || value.is_u64(),
            "string" => value.is_string(),
            _ => false,
        };
        if !names.iter().any(|name| fits(name)) {
            fail(format!("expected {names:?}, found {value}"));
        }
    }
    if let Some(expected) = schema.get("const")
        && expected != value
    {
        fail(format!("expected {expected}, found {value}"));
    }
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        fail(format!("expected one of {allowed:?}, found {value}"));
    }
    if let (Some(minimum), Some(number)) = (
        schema.get("minimum").and_then(Value::as_f64),
        value.as_f64(),
    ) && number < minimum
    {
        fail(format!("{number} is below {minimum}"));
    }
    if let (Some(maximum), Some(number)) = (
        schema.get("maximum").and_then(Value::as_f64),
        value.as_f64(),
    ) && number > maximum
    {
        fail(format!("{number} is above {maximum}"));
    }
    for keyword in ["anyOf", "oneOf"] {
        if let Some(Value::Array(options)) = schema.get(keyword) {
            let fitting = options
                .iter()
                .filter(|option| validate(root, option, value, at).is_empty())
                .count();
            if fitting == 0 || (keyword == "oneOf" && fitting > 1) {
                errors.push(format!(
                    "{at}: {fitting} of the {keyword} options fit {value}"
                ));
            }
        }
    }
    if let Value::Object(fields) = value {
        for name in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !fields.contains_key(name.as_str().unwrap_or("")) {
                errors.push(format!("{at}: missing {name}"));
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (name, field) in fields {
            let here = format!("{at}.{name}");
            match (
                properties.and_then(|properties| properties.get(name)),
                schema.get("additionalProperties"),
            ) {
                (Some(property), _) => errors.extend(validate(root, property, field, &here)),
                (None, Some(Value::Bool(false))) => errors.push(format!("{here}: unknown field")),
                (None, Some(extra @ Value::Object(_))) => {
                    errors.extend(validate(root, extra, field, &here))
                }
                (None, _) => {}
            }
        }
    }
    if let (Value::Array(items), Some(item_schema)) = (value, schema.get("items")) {
        if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
            && (items.len() as u64) < min
        {
            errors.push(format!("{at}: fewer than {min} items"));
        }
        for (index, item) in items.iter().enumerate() {
            errors.extend(validate(root, item_schema, item, &format!("{at}[{index}]")));
        }
    }
    errors
}
