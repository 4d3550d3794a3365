//! `filter_fields`: keeps or removes top-level fields by key and value
//! patterns. Fields named in `keep_fields` always stay. A field matches when
//! any pattern matches it; `include_matching = true` (the default) keeps the
//! matching fields and removes the others, `false` removes the matching ones.
//!
//! ```toml
//! [transforms.filter_fields]
//! enabled = true
//! keep_fields = ["id"]
//! include_matching = false
//! [[transforms.filter_fields.patterns]]
//! key_pattern = { starts_with = "tmp_" }
//! ```

use serde::Deserialize;
use serde_json::Value;

use crate::message::Payload;
use crate::transforms::pattern::{FieldPattern, KeySet, PatternConfig, compile_all};
use crate::transforms::{FieldError, Transform, TransformError, Verdict};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterFieldsConfig {
    #[serde(default)]
    pub keep_fields: Vec<String>,
    #[serde(default)]
    pub patterns: Vec<PatternConfig>,
    #[serde(default = "default_include_matching")]
    pub include_matching: bool,
}

fn default_include_matching() -> bool {
    true
}

#[derive(Debug)]
pub struct FilterFields {
    keep: KeySet,
    patterns: Vec<FieldPattern>,
    include_matching: bool,
}

impl FilterFields {
    pub(crate) fn build(config: FilterFieldsConfig) -> Result<Self, FieldError> {
        Ok(Self {
            keep: KeySet::new(config.keep_fields),
            patterns: compile_all("patterns", config.patterns)?,
            include_matching: config.include_matching,
        })
    }
}

impl Transform for FilterFields {
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        // Upstream: with neither a keep list nor patterns, nothing is filtered.
        if self.keep.is_empty() && self.patterns.is_empty() {
            return Ok(Verdict::Keep);
        }
        let Payload::Json(Value::Object(map)) = payload else {
            return Ok(Verdict::Keep);
        };
        map.retain(|key, value| {
            self.keep.contains(key)
                || self
                    .patterns
                    .iter()
                    .any(|pattern| pattern.matches(key, value))
                    == self.include_matching
        });
        Ok(Verdict::Keep)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::message::Payload;
    use crate::transforms::tests::{build_error, chain, run};

    #[test]
    fn given_keep_fields_and_patterns_when_including_should_keep_only_matches() {
        let chain = chain(
            "filter_fields",
            json!({"enabled": true, "keep_fields": ["id"], "patterns": [
                {"key_pattern": {"starts_with": "meta_"}},
                {"key_pattern": {"contains": "date"}, "value_pattern": "is_string"},
            ]}),
        );
        let out = run(
            &chain,
            json!({"id": 1, "name": "x", "meta_a": 2, "created_date": "d", "expired_date": null}),
        );
        assert_eq!(out, json!({"id": 1, "meta_a": 2, "created_date": "d"}));
    }

    #[test]
    fn given_include_matching_false_when_applied_should_remove_matches() {
        let chain = chain(
            "filter_fields",
            json!({"include_matching": false, "keep_fields": ["tmp_keep"], "patterns": [
                {"key_pattern": {"regex": "^tmp_"}},
                {"value_pattern": {"greater_than": 100}},
            ]}),
        );
        let out = run(
            &chain,
            json!({"id": 1, "tmp_a": 2, "tmp_keep": 3, "big": 1000, "small": 5}),
        );
        assert_eq!(out, json!({"id": 1, "tmp_keep": 3, "small": 5}));
    }

    #[test]
    fn given_only_keep_fields_when_applied_should_keep_just_those() {
        let chain = chain("filter_fields", json!({"keep_fields": ["a", "b"]}));
        let out = run(&chain, json!({"a": 1, "b": 2, "c": 3}));
        assert_eq!(out, json!({"a": 1, "b": 2}));
        let nothing = chain_with_nothing();
        assert_eq!(run(&nothing, json!({"a": 1})), json!({"a": 1}));
    }

    fn chain_with_nothing() -> crate::transforms::TransformChain {
        chain("filter_fields", json!({"include_matching": true}))
    }

    #[test]
    fn given_non_object_payloads_when_applied_should_pass_them_through() {
        let chain = chain("filter_fields", json!({"keep_fields": ["a"]}));
        for payload in [
            Payload::Text("a".into()),
            Payload::Raw(bytes::Bytes::from_static(b"{}")),
            Payload::Json(json!([{"b": 1}])),
        ] {
            let mut changed = payload.clone();
            chain.apply(&mut changed).unwrap();
            assert_eq!(changed, payload);
        }
    }

    #[test]
    fn given_invalid_config_when_built_should_name_the_field() {
        let error = build_error(
            "filter_fields",
            json!({"patterns": [{"key_pattern": {"regex": "[unclosed"}}]}),
        );
        assert_eq!(error.field, "patterns[0].key_pattern.regex");
        assert!(error.message.contains("invalid regex"), "{}", error.message);
        let error = build_error(
            "filter_fields",
            json!({"patterns": [{"key_pattern": {"prefix": "a"}}]}),
        );
        assert_eq!(error.field, "patterns[0].key_pattern");
        let error = build_error("filter_fields", json!({"include_matching": "yes"}));
        assert_eq!(error.field, "include_matching");
    }
}
