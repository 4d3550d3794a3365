//! `filter_messages` (ours; upstream has no way to drop a whole message): keeps
//! or drops whole messages by the same key and value patterns as
//! `filter_fields`. A pattern matches a message when one of its top-level
//! fields matches both the key and the value part. `match = "any"` (the
//! default) needs one pattern to match, `"all"` needs every pattern to.
//! `include_matching = true` (the default) keeps only the matching messages;
//! `false` drops the matching ones. Dropped messages are counted in
//! `messages_filtered`, not as errors. Payloads that are not a JSON object are
//! never dropped.
//!
//! ```toml
//! [transforms.filter_messages]
//! enabled = true
//! include_matching = false
//! [[transforms.filter_messages.patterns]]
//! key_pattern = { exact = "level" }
//! value_pattern = { equals = "debug" }
//! ```

use serde::Deserialize;
use serde_json::Value;

use crate::message::Payload;
use crate::transforms::pattern::{FieldPattern, PatternConfig, compile_all};
use crate::transforms::{FieldError, Transform, TransformError, Verdict};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterMessagesConfig {
    pub patterns: Vec<PatternConfig>,
    #[serde(default = "default_include_matching")]
    pub include_matching: bool,
    #[serde(default, rename = "match")]
    pub match_mode: MatchMode,
}

fn default_include_matching() -> bool {
    true
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchMode {
    #[default]
    Any,
    All,
}

#[derive(Debug)]
pub struct FilterMessages {
    patterns: Vec<FieldPattern>,
    include_matching: bool,
    match_mode: MatchMode,
}

impl FilterMessages {
    pub(crate) fn build(config: FilterMessagesConfig) -> Result<Self, FieldError> {
        if config.patterns.is_empty() {
            return Err(FieldError::new(
                "patterns",
                "expected at least one pattern (a message filter without patterns would keep or drop everything)",
            ));
        }
        let patterns = compile_all("patterns", config.patterns)?;
        if let Some(index) = patterns.iter().position(FieldPattern::is_empty) {
            return Err(FieldError::new(
                format!("patterns[{index}]"),
                "expected key_pattern, value_pattern or both",
            ));
        }
        Ok(Self {
            patterns,
            include_matching: config.include_matching,
            match_mode: config.match_mode,
        })
    }
}

impl Transform for FilterMessages {
    fn apply(&self, payload: &mut Payload) -> Result<Verdict, TransformError> {
        let Payload::Json(Value::Object(map)) = payload else {
            return Ok(Verdict::Keep);
        };
        let matched = match self.match_mode {
            MatchMode::Any => self
                .patterns
                .iter()
                .any(|pattern| pattern.matches_any_field(map)),
            MatchMode::All => self
                .patterns
                .iter()
                .all(|pattern| pattern.matches_any_field(map)),
        };
        Ok(if matched == self.include_matching {
            Verdict::Keep
        } else {
            Verdict::Drop
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::message::Payload;
    use crate::transforms::Verdict;
    use crate::transforms::tests::{build_error, chain};

    fn verdict(chain: &crate::transforms::TransformChain, value: serde_json::Value) -> Verdict {
        chain.apply(&mut Payload::Json(value)).unwrap()
    }

    #[test]
    fn given_include_matching_false_when_a_pattern_matches_should_drop_the_message() {
        let chain = chain(
            "filter_messages",
            json!({"enabled": true, "include_matching": false, "patterns": [
                {"key_pattern": {"exact": "level"}, "value_pattern": {"equals": "debug"}},
                {"key_pattern": {"starts_with": "test_"}},
            ]}),
        );
        assert_eq!(verdict(&chain, json!({"level": "debug"})), Verdict::Drop);
        assert_eq!(verdict(&chain, json!({"test_run": true})), Verdict::Drop);
        assert_eq!(verdict(&chain, json!({"level": "info"})), Verdict::Keep);
        assert_eq!(verdict(&chain, json!({"debug": "level"})), Verdict::Keep);
    }

    #[test]
    fn given_include_matching_and_all_when_applied_should_keep_only_full_matches() {
        let chain = chain(
            "filter_messages",
            json!({"match": "all", "patterns": [
                {"key_pattern": {"exact": "country"}, "value_pattern": {"equals": "PL"}},
                {"value_pattern": {"greater_than": 100}},
            ]}),
        );
        assert_eq!(
            verdict(&chain, json!({"country": "PL", "total": 150})),
            Verdict::Keep
        );
        assert_eq!(
            verdict(&chain, json!({"country": "PL", "total": 50})),
            Verdict::Drop
        );
        assert_eq!(
            verdict(&chain, json!({"country": "DE", "total": 150})),
            Verdict::Drop
        );
        assert_eq!(verdict(&chain, json!({})), Verdict::Drop);
    }

    #[test]
    fn given_non_object_payloads_when_applied_should_keep_them_unchanged() {
        let chain = chain(
            "filter_messages",
            json!({"patterns": [{"key_pattern": {"exact": "a"}}]}),
        );
        for payload in [
            Payload::Text("a".into()),
            Payload::Raw(bytes::Bytes::from_static(b"{\"a\":1}")),
            Payload::Json(json!(["a"])),
        ] {
            let mut changed = payload.clone();
            assert_eq!(chain.apply(&mut changed).unwrap(), Verdict::Keep);
            assert_eq!(changed, payload);
        }
    }

    #[test]
    fn given_invalid_config_when_built_should_name_the_field() {
        let error = build_error("filter_messages", json!({"patterns": []}));
        assert_eq!(error.field, "patterns");
        let error = build_error("filter_messages", json!({"include_matching": true}));
        assert_eq!(error.field, "patterns");
        let error = build_error("filter_messages", json!({"patterns": [{}]}));
        assert_eq!(error.field, "patterns[0]");
        let error = build_error(
            "filter_messages",
            json!({"match": "some", "patterns": [{"key_pattern": {"exact": "a"}}]}),
        );
        assert_eq!(error.field, "match");
    }
}
