//! Conversion between our header values and Iggy's typed user headers.

use std::collections::BTreeMap;
use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use iggy::prelude::{
    HeaderKey, HeaderKind, HeaderValue as IggyHeaderValue, IggyError, IggyMessage,
    MAX_USER_HEADERS_SIZE,
};

use crate::message::{HeaderName, HeaderValue, Headers};

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

/// Appends our headers in Iggy's wire form (what `IggyMessage::user_headers`
/// holds) to `out`; the range of `out` they took, `None` when there are
/// none. Encoded straight from ours: building Iggy's map first costs two
/// allocations per header and a tree per message, a fifth of a keyed
/// source's CPU time (perf, `cargo bench --bench backends -- kafka`); and a
/// batch's headers share one buffer rather than an allocation each. Headers
/// with a repeated name go through the map (the last one wins).
pub fn put_wire(headers: &Headers, out: &mut BytesMut) -> Result<Option<Range<usize>>, String> {
    if headers.is_empty() {
        return Ok(None);
    }
    let start = out.len();
    if has_repeated_name(headers) {
        if let Some(map) = to_iggy(headers)? {
            let wire = iggy_common::wire_conversions::user_headers_to_wire(&map);
            out.extend_from_slice(wire.as_bytes());
        }
    } else {
        out.reserve(check(headers)?);
        for (key, value) in headers {
            put_field(out, HeaderKind::String, key.as_bytes());
            let (kind, bytes) = wire_value(value);
            put_field(out, kind, &bytes);
        }
    }
    Ok(Some(start..out.len()))
}

/// Whether Iggy can carry these headers (names and values of 1 to 255
/// bytes, all of them within Iggy's limit); the size of their wire form.
pub fn check(headers: &Headers) -> Result<usize, String> {
    let mut size = 0;
    for (key, value) in headers {
        if key.is_empty() || key.len() > 255 {
            return Err(format!(
                "header key \"{key}\": {}",
                IggyError::InvalidHeaderValue
            ));
        }
        let (_, bytes) = wire_value(value);
        if bytes.is_empty() || bytes.len() > 255 {
            return Err(format!(
                "header \"{key}\": {}",
                IggyError::InvalidHeaderValue
            ));
        }
        size += FIELD_OVERHEAD * 2 + key.len() + bytes.len();
    }
    if size > MAX_USER_HEADERS_SIZE as usize {
        return Err(format!(
            "{size} bytes of headers exceed Iggy's limit of {MAX_USER_HEADERS_SIZE}"
        ));
    }
    Ok(size)
}

/// A field's kind code and length before its bytes.
const FIELD_OVERHEAD: usize = 1 + 4;

/// A value's kind and bytes as Iggy's `HeaderValue::from` writes them.
fn wire_value(value: &HeaderValue) -> (HeaderKind, WireBytes<'_>) {
    match value {
        HeaderValue::String(text) => (HeaderKind::String, WireBytes::Borrowed(text.as_bytes())),
        HeaderValue::Raw(bytes) => (HeaderKind::Raw, WireBytes::Borrowed(bytes.as_ref())),
        HeaderValue::Bool(flag) => (HeaderKind::Bool, WireBytes::Fixed([u8::from(*flag); 8], 1)),
        HeaderValue::Int(number) => (HeaderKind::Int64, WireBytes::Fixed(number.to_le_bytes(), 8)),
        HeaderValue::UInt(number) => (
            HeaderKind::Uint64,
            WireBytes::Fixed(number.to_le_bytes(), 8),
        ),
        HeaderValue::Float(number) => (
            HeaderKind::Float64,
            WireBytes::Fixed(number.to_le_bytes(), 8),
        ),
    }
}

/// A value's bytes: borrowed, or a number's on the stack.
enum WireBytes<'a> {
    Borrowed(&'a [u8]),
    Fixed([u8; 8], usize),
}

impl std::ops::Deref for WireBytes<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Borrowed(bytes) => bytes,
            Self::Fixed(bytes, length) => &bytes[..*length],
        }
    }
}

fn put_field(wire: &mut BytesMut, kind: HeaderKind, bytes: &[u8]) {
    wire.put_u8(kind.as_code());
    // At most 255: `check` refused anything longer.
    wire.put_u32_le(bytes.len() as u32);
    wire.put_slice(bytes);
}

fn has_repeated_name(headers: &Headers) -> bool {
    headers
        .iter()
        .enumerate()
        .any(|(index, (key, _))| headers[..index].iter().any(|(earlier, _)| earlier == key))
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
        .map(|(key, value)| {
            let name = key
                .as_str()
                .map_or_else(|_| key.to_string_value().into(), HeaderName::from);
            (name, convert_value(&value))
        })
        .collect()
}

fn convert_value(value: &IggyHeaderValue) -> HeaderValue {
    let converted = match value.kind() {
        HeaderKind::String => value
            .as_str()
            .map(|text| HeaderValue::String(text.into()))
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
pub(crate) mod tests {
    use super::*;

    /// One message's headers in their own buffer.
    pub(crate) fn to_wire(headers: &Headers) -> Result<Option<Bytes>, String> {
        let mut wire = BytesMut::new();
        Ok(put_wire(headers, &mut wire)?.map(|_| wire.freeze()))
    }

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

    #[test]
    fn given_headers_when_encoded_directly_should_read_back_as_through_iggys_map() {
        let headers: Headers = vec![
            ("s".into(), HeaderValue::String("text".into())),
            ("b".into(), HeaderValue::Bool(true)),
            ("i".into(), HeaderValue::Int(-5)),
            ("u".into(), HeaderValue::UInt(7)),
            ("f".into(), HeaderValue::Float(1.5)),
            ("r".into(), HeaderValue::Raw(Bytes::from_static(&[0, 1, 2]))),
        ];
        let direct = to_wire(&headers).unwrap().unwrap();
        let through_map = || {
            IggyMessage::builder()
                .payload(Bytes::from_static(b"x"))
                .user_headers(to_iggy(&headers).unwrap().unwrap())
                .build()
                .unwrap()
        };
        let expected = through_map();
        assert_eq!(direct.len(), expected.user_headers.as_ref().unwrap().len());
        let message = IggyMessage {
            user_headers: Some(direct),
            ..through_map()
        };
        assert_eq!(message.user_headers_map(), expected.user_headers_map());
        let repeated: Headers = vec![
            ("k".into(), HeaderValue::Int(1)),
            ("k".into(), HeaderValue::Int(2)),
        ];
        let message = IggyMessage {
            user_headers: to_wire(&repeated).unwrap(),
            ..through_map()
        };
        assert_eq!(from_iggy(&message), vec![("k".into(), HeaderValue::Int(2))]);
    }

    #[test]
    fn given_a_name_or_value_iggy_cannot_carry_when_checked_should_name_it() {
        let empty_value: Headers = vec![("k".into(), HeaderValue::String(Default::default()))];
        assert!(check(&empty_value).unwrap_err().contains("\"k\""));
        let long_name: Headers = vec![("n".repeat(256).into(), HeaderValue::Int(1))];
        assert!(check(&long_name).is_err());
        assert!(to_wire(&long_name).is_err());
        assert_eq!(to_wire(&Headers::new()), Ok(None));
    }
}
