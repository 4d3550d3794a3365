//! Deterministic message ids and column renaming for sources that read
//! database rows (the postgres and mysql sources), and the id hash for
//! sources whose records carry a key of their own (the rabbitmq source).

/// A deterministic Iggy message id for a row version, so a row read twice (after
/// a NACK or a crash) carries the same id both times and Iggy's or a sink's
/// deduplication can drop the copy.
///
/// - The tracking column is the key and its value is an integer in `0..2^64`:
///   the high 64 bits are FNV-1a-64 of the table name and the low 64 bits are
///   the key itself, so the key can be read off the id and two tables never share ids.
/// - Otherwise: FNV-1a-128 of `table \0 key \0 tracking value`, so a row whose
///   tracking value changed (an update) gets a new id.
pub fn message_id(table: &str, tracking: &str, key: Option<&str>, key_is_tracking: bool) -> u128 {
    if key_is_tracking && let Ok(number) = tracking.parse::<u64>() {
        return (u128::from(fnv1a_64(table.as_bytes())) << 64) | u128::from(number);
    }
    hash_id(&[table, key.unwrap_or(""), tracking])
}

/// A deterministic Iggy message id from text parts: FNV-1a-128 of the parts
/// joined by `\0` (a record's origin and its key at that origin).
pub fn hash_id(parts: &[&str]) -> u128 {
    let mut hash = Fnv128::new();
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            hash.write(&[0]);
        }
        hash.write(part.as_bytes());
    }
    hash.finish()
}

fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(PRIME)
    })
}

struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

    fn new() -> Self {
        Self(Self::OFFSET)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u128::from(*byte)).wrapping_mul(Self::PRIME);
        }
    }

    fn finish(&self) -> u128 {
        self.0
    }
}

/// `userId` -> `user_id`, `HTTPServer` -> `http_server`, `Order Date` -> `order_date`.
pub fn to_snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (index, &current) in chars.iter().enumerate() {
        if current == ' ' || current == '-' {
            if !out.ends_with('_') {
                out.push('_');
            }
            continue;
        }
        if current.is_uppercase() && index > 0 {
            let previous = chars[index - 1];
            let next_is_lower = chars.get(index + 1).is_some_and(|next| next.is_lowercase());
            let boundary = previous.is_lowercase()
                || previous.is_ascii_digit()
                || (previous.is_uppercase() && next_is_lower);
            if boundary && !out.ends_with('_') {
                out.push('_');
            }
        }
        out.extend(current.to_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_integer_tracking_key_when_identified_should_keep_the_key_in_the_low_bits() {
        let id = message_id("orders", "42", None, true);
        assert_eq!(id as u64, 42);
        assert_ne!(id >> 64, 0);
        assert_ne!(id, message_id("users", "42", None, true));
        assert_eq!(id, message_id("orders", "42", None, true));
    }

    #[test]
    fn given_other_keys_when_identified_should_hash_the_row_version() {
        let first = message_id("orders", "2024-01-01", Some("7"), false);
        assert_eq!(first, message_id("orders", "2024-01-01", Some("7"), false));
        assert_ne!(first, message_id("orders", "2024-01-02", Some("7"), false));
        assert_ne!(first, message_id("orders", "2024-01-01", Some("8"), false));
        assert_ne!(
            message_id("orders", "abc", None, true),
            message_id("orders", "abd", None, true)
        );
    }

    #[test]
    fn given_column_names_when_snake_cased_should_split_words() {
        assert_eq!(to_snake_case("userId"), "user_id");
        assert_eq!(to_snake_case("UserName"), "user_name");
        assert_eq!(to_snake_case("HTTPServer"), "http_server");
        assert_eq!(to_snake_case("Order Date"), "order_date");
        assert_eq!(to_snake_case("already_snake"), "already_snake");
    }
}
