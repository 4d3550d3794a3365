//! A source's state as JSON, for the API and the CLI: MessagePack with field
//! names (what sources write, see `connectors::encode_state`) both ways.

use serde_json::{Value, json};

use crate::state::{StateStore, StoredState};

/// The state's MessagePack as JSON: binary becomes a list of bytes, map keys
/// that are not strings become their JSON text.
pub fn decode(data: &[u8]) -> Result<Value, String> {
    rmpv::decode::read_value(&mut &data[..])
        .map(to_json)
        .map_err(|error| format!("not valid MessagePack: {error}"))
}

/// A JSON object as MessagePack with field names; a list of bytes stays a
/// list, which sources read back as bytes too.
pub fn encode(state: &Value) -> Result<Vec<u8>, String> {
    if !state.is_object() {
        return Err("a state is a JSON object (as the state's JSON shows it)".into());
    }
    rmp_serde::to_vec_named(state).map_err(|error| error.to_string())
}

/// What the API and `iggy-connect state show` print for a source's state:
/// `{key, connector, location, size, state}` (nulls and 0 without one).
pub fn shown(
    store: &dyn StateStore,
    key: &str,
    stored: Option<&StoredState>,
) -> Result<Value, String> {
    let location = store.location(key);
    let state = stored
        .map(|stored| decode(&stored.data))
        .transpose()
        .map_err(|error| format!("state {location} is {error}"))?;
    Ok(json!({
        "key": key,
        "connector": stored.map(|stored| stored.connector.as_str()),
        "location": location,
        "size": stored.map_or(0, |stored| stored.data.len()),
        "state": state,
    }))
}

fn to_json(value: rmpv::Value) -> Value {
    use rmpv::Value as Pack;
    match value {
        Pack::Nil => Value::Null,
        Pack::Boolean(flag) => Value::Bool(flag),
        Pack::Integer(integer) => integer
            .as_u64()
            .map(Value::from)
            .or_else(|| integer.as_i64().map(Value::from))
            .unwrap_or(Value::Null),
        Pack::F32(number) => json!(number),
        Pack::F64(number) => json!(number),
        Pack::String(text) => match text.into_str() {
            Some(text) => Value::String(text),
            None => Value::Null,
        },
        Pack::Binary(bytes) => json!(bytes),
        Pack::Array(items) => Value::Array(items.into_iter().map(to_json).collect()),
        Pack::Map(entries) => Value::Object(
            entries
                .into_iter()
                .map(|(name, value)| {
                    let name = match name {
                        Pack::String(text) => text.into_str().unwrap_or_default(),
                        other => to_json(other).to_string(),
                    };
                    (name, to_json(value))
                })
                .collect(),
        ),
        Pack::Ext(kind, data) => json!({"ext_type": kind, "data": data}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct State {
        messages_produced: u64,
        offsets: std::collections::BTreeMap<String, i64>,
        raw: serde_bytes::ByteBuf,
    }

    #[test]
    fn given_a_named_state_when_decoded_and_encoded_again_should_round_trip_through_json() {
        let state = State {
            messages_produced: 42,
            offsets: [("orders".to_owned(), -1)].into(),
            raw: serde_bytes::ByteBuf::from(vec![1, 2]),
        };
        let bytes = crate::connectors::encode_state(&state).unwrap();
        let decoded = decode(&bytes).unwrap();
        assert_eq!(
            decoded,
            json!({"messages_produced": 42, "offsets": {"orders": -1}, "raw": [1, 2]})
        );
        let again: State = crate::connectors::decode_state(&encode(&decoded).unwrap()).unwrap();
        assert_eq!(again, state);
    }

    #[test]
    fn given_json_that_is_not_an_object_when_encoded_should_be_refused() {
        assert!(encode(&json!([1])).is_err());
        assert!(decode(b"\x92\x01").is_err(), "an array of two holding one");
    }
}
