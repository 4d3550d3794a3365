//! Sizes in config files: `"8MiB"`, `"500 KB"`, `"1048576"` (`max_in_flight_bytes`, the file-writing sinks).

/// A size such as `"8MiB"`, `"500 KB"`, `"1GB"` or `"1048576"` in bytes
/// (KB, MB, GB are powers of 1000; KiB, MiB, GiB of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|character: char| !(character.is_ascii_digit() || character == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let expected = || format!("expected a size such as \"8MiB\" or \"500KB\", found \"{text}\"");
    let number: f64 = number.parse().map_err(|_| expected())?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "kib" | "k" => 1 << 10,
        "mb" => 1_000_000,
        "mib" | "m" => 1 << 20,
        "gb" => 1_000_000_000,
        "gib" | "g" => 1 << 30,
        _ => return Err(expected()),
    };
    Ok((number * multiplier as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_sizes_when_parsed_should_follow_their_unit() {
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("500 KB"), Ok(500_000));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert!(parse_size("MiB").is_err());
    }
}
