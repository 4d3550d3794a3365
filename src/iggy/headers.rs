//! Conversion between our header values and Iggy's typed user headers.

use std::collections::BTreeMap;

use bytes::Bytes;
use iggy::prelude::{HeaderKey, HeaderKind, HeaderValue as IggyHeaderValue, IggyMessage};

use crate::message::{HeaderValue, Headers};

/// Our headers as Iggy's map; `None` when there are none.
pub fn to_iggy(headers: &Headers) -> Result<Option<BTreeMap<HeaderKey, IggyHeaderValue>>, String> {
    if headers.is_empty() {
        return Ok(None);
    }
    let mut map = BTreeMap::new();
    for (key, value) in headers {
        let key = HeaderKey::try_from(key.as_str())
            .map_err(|error| format!("header key \"{key}\": {error}"))?;
        let value = match value {
            HeaderValue::String(text) => IggyHeaderValue::try_from(text.as_str()),
            HeaderValue::Bool(flag) => Ok(IggyHeaderValue::from(*flag)),
            HeaderValue::Int(number) => Ok(IggyHeaderValue::from(*number)),
            HeaderValue::UInt(number) => Ok(IggyHeaderValue::from(*number)),
            HeaderValue::Float(number) => Ok(IggyHeaderValue::from(*number)),
            HeaderValue::Raw(bytes) => IggyHeaderValue::from_raw(HeaderKind::Raw, bytes),
        }
        .map_err(|error| format!("header \"{key}\": {error}"))?;
        map.insert(key, value);
    }
    Ok(Some(map))
}

/// A polled message's headers as ours. Headers that do not parse are dropped
/// (the payload is what matters; the bad header is named in the log).
pub fn from_iggy(message: &IggyMessage) -> Headers {
    let map = match message.user_headers_map() {
        Ok(Some(map)) => map,
        Ok(None) => return Headers::new(),
        Err(error) => {
            tracing::warn!(offset = message.header.offset, %error, "cannot parse user headers; dropping them");
            return Headers::new();
        }
    };
    map.into_iter()
        .map(|(key, value)| (key.to_string_value(), convert_value(&value)))
        .collect()
}

fn convert_value(value: &IggyHeaderValue) -> HeaderValue {
    let converted = match value.kind() {
        HeaderKind::String => value
            .as_str()
            .map(|text| HeaderValue::String(text.to_owned()))
            .ok(),
        HeaderKind::Bool => value.as_bool().map(HeaderValue::Bool).ok(),
        HeaderKind::Int8 => value
            .as_int8()
            .map(|number| HeaderValue::Int(number.into()))
            .ok(),
        HeaderKind::Int16 => value
            .as_int16()
            .map(|number| HeaderValue::Int(number.into()))
            .ok(),
        HeaderKind::Int32 => value
            .as_int32()
            .map(|number| HeaderValue::Int(number.into()))
            .ok(),
        HeaderKind::Int64 => value.as_int64().map(HeaderValue::Int).ok(),
        HeaderKind::Uint8 => value
            .as_uint8()
            .map(|number| HeaderValue::UInt(number.into()))
            .ok(),
        HeaderKind::Uint16 => value
            .as_uint16()
            .map(|number| HeaderValue::UInt(number.into()))
            .ok(),
        HeaderKind::Uint32 => value
            .as_uint32()
            .map(|number| HeaderValue::UInt(number.into()))
            .ok(),
        HeaderKind::Uint64 => value.as_uint64().map(HeaderValue::UInt).ok(),
        HeaderKind::Float32 => value
            .as_float32()
            .map(|number| HeaderValue::Float(number.into()))
            .ok(),
        HeaderKind::Float64 => value.as_float64().map(HeaderValue::Float).ok(),
        _ => None,
    };
    converted.unwrap_or_else(|| HeaderValue::Raw(Bytes::copy_from_slice(value.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_headers_of_each_kind_when_round_tripped_should_keep_their_values() {
        let headers: Headers = vec![
            ("s".into(), HeaderValue::String("text".into())),
            ("b".into(), HeaderValue::Bool(true)),
            ("i".into(), HeaderValue::Int(-5)),
            ("u".into(), HeaderValue::UInt(7)),
            ("f".into(), HeaderValue::Float(1.5)),
            ("r".into(), HeaderValue::Raw(Bytes::from_static(&[0, 1, 2]))),
        ];
        let message = IggyMessage::builder()
            .payload(Bytes::from_static(b"x"))
            .user_headers(to_iggy(&headers).unwrap().unwrap())
            .build()
            .unwrap();
        let mut back = from_iggy(&message);
        back.sort_by(|a, b| a.0.cmp(&b.0));
        let mut expected = headers;
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(back, expected);
    }
}
