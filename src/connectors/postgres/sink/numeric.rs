//! A `u128` bound as PostgreSQL `NUMERIC`, written straight into the binary
//! wire format, so a batch of message ids needs no per-id string or big-decimal
//! allocation.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo};
use sqlx::{Encode, Postgres, Type};

/// Built-in type OIDs, fixed across PostgreSQL installations.
const NUMERIC_OID: u32 = 1700;
const NUMERIC_ARRAY_OID: u32 = 1231;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgU128(pub u128);

impl Type<Postgres> for PgU128 {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(NUMERIC_OID))
    }
}

impl PgHasArrayType for PgU128 {
    fn array_type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(Oid(NUMERIC_ARRAY_OID))
    }
}

impl Encode<'_, Postgres> for PgU128 {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        let (digits, count) = base_10000_digits(self.0);
        // ndigits, weight, sign (positive), dscale (integer), then the digits.
        buf.extend_from_slice(&(count as i16).to_be_bytes());
        let weight = if count == 0 { 0 } else { digits.len_total - 1 };
        buf.extend_from_slice(&(weight as i16).to_be_bytes());
        buf.extend_from_slice(&0u16.to_be_bytes());
        buf.extend_from_slice(&0u16.to_be_bytes());
        for digit in &digits.values[..count] {
            buf.extend_from_slice(&digit.to_be_bytes());
        }
        Ok(IsNull::No)
    }

    fn size_hint(&self) -> usize {
        8 + 2 * 10
    }
}

/// Base-10000 digits, most significant first. A u128 has at most 39 decimal
/// digits, so at most 10 base-10000 digits.
struct Digits {
    values: [i16; 10],
    /// Digits before trailing zeros are dropped (decides the weight).
    len_total: usize,
}

/// The digits and how many to send: PostgreSQL drops trailing zero digits and
/// keeps the magnitude in the weight.
fn base_10000_digits(mut value: u128) -> (Digits, usize) {
    let mut reversed = [0i16; 10];
    let mut len = 0;
    while value > 0 {
        reversed[len] = (value % 10_000) as i16;
        value /= 10_000;
        len += 1;
    }
    let mut values = [0i16; 10];
    for index in 0..len {
        values[index] = reversed[len - 1 - index];
    }
    let significant = values[..len]
        .iter()
        .rposition(|digit| *digit != 0)
        .map_or(0, |last| last + 1);
    (
        Digits {
            values,
            len_total: len,
        },
        significant,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(value: u128) -> Vec<u8> {
        let mut buffer = PgArgumentBuffer::default();
        let _ = PgU128(value).encode_by_ref(&mut buffer).unwrap();
        buffer.to_vec()
    }

    fn words(bytes: &[u8]) -> Vec<i16> {
        bytes
            .chunks(2)
            .map(|pair| i16::from_be_bytes([pair[0], pair[1]]))
            .collect()
    }

    #[test]
    fn given_integers_when_encoded_should_follow_the_numeric_wire_format() {
        assert_eq!(words(&encode(0)), vec![0, 0, 0, 0]);
        assert_eq!(words(&encode(12_345)), vec![2, 1, 0, 0, 1, 2345]);
        assert_eq!(words(&encode(10_000)), vec![1, 1, 0, 0, 1]);
        assert_eq!(words(&encode(7)), vec![1, 0, 0, 0, 7]);
        let max = words(&encode(u128::MAX));
        assert_eq!(max[..4], [10, 9, 0, 0]);
        assert_eq!(max[4], 340); // 340282366920938463463374607431768211455
    }
}
