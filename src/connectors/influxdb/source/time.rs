//! RFC 3339 times as nanoseconds since the epoch, both ways, with the full
//! nanosecond precision InfluxDB keeps.

const NANOS_PER_SECOND: i64 = 1_000_000_000;

/// `2024-03-01T10:00:00.123456789Z` (also a space for `T`, no zone = UTC, as
/// InfluxDB 3 answers, or a `+hh:mm` offset) as ns since the epoch.
pub fn parse(text: &str) -> Option<i64> {
    let text = text.trim();
    let bytes = text.as_bytes();
    if bytes.len() < 19 || !matches!(bytes[10], b'T' | b't' | b' ') {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|byte| byte.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if bytes[4] != b'-' || bytes[7] != b'-' || bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut nanos = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        nanos = fraction[..digits].parse::<i64>().ok()? * 10_i64.pow(9 - digits as u32);
        rest = &fraction[digits..];
    }
    let offset_seconds = match rest {
        "" | "Z" | "z" => 0,
        zone if zone.len() == 6 && matches!(&zone[3..4], ":") => {
            let sign = match &zone[..1] {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            let hours: i64 = zone[1..3].parse().ok()?;
            let minutes: i64 = zone[4..6].parse().ok()?;
            sign * (hours * 3600 + minutes * 60)
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_seconds;
    seconds.checked_mul(NANOS_PER_SECOND)?.checked_add(nanos)
}

/// ns since the epoch as `2024-03-01T10:00:00.123456789Z` (always nine digits).
pub fn format(nanos: i64) -> String {
    let seconds = nanos.div_euclid(NANOS_PER_SECOND);
    let fraction = nanos.rem_euclid(NANOS_PER_SECOND);
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{fraction:09}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted + 2) / 5 + 1;
    let month = if shifted < 10 {
        shifted + 3
    } else {
        shifted - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_rfc3339_times_when_parsed_and_formatted_should_round_trip_to_the_nanosecond() {
        assert_eq!(parse("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse("2024-03-01T00:00:01.5Z"),
            Some(1_709_251_201_500_000_000)
        );
        assert_eq!(
            parse("2024-03-01 00:00:01.500000000"),
            Some(1_709_251_201_500_000_000)
        );
        assert_eq!(
            parse("2024-03-01T01:00:01.5+01:00"),
            Some(1_709_251_201_500_000_000)
        );
        assert_eq!(
            format(1_709_251_201_500_000_001),
            "2024-03-01T00:00:01.500000001Z"
        );
        assert_eq!(format(-1), "1969-12-31T23:59:59.999999999Z");
        assert_eq!(parse(&format(-1)), Some(-1));
        for nanos in [0, 951_782_400_000_000_000, 4_102_444_800_123_456_789] {
            assert_eq!(parse(&format(nanos)), Some(nanos));
        }
        for bad in [
            "",
            "yesterday",
            "2024-13-01T00:00:00Z",
            "2024-03-01T00:00:00.Z",
            "2024-03-01T00:00:00+1",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
