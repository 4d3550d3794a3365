//! What a ClickHouse HTTP answer means: its exception code (the `Code: N`
//! the body starts with, on every version) decides whether to retry, refuse
//! rows, or stop; `(at row N)` in the message names the refused row.

use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{Answer, StatusClass, classify};

/// Exception codes of data that does not fit the table (parse errors, type
/// mismatches, unknown fields, values out of range).
const DATA_CODES: &[u32] = &[
    6,   // CANNOT_PARSE_TEXT
    16,  // NO_SUCH_COLUMN_IN_TABLE
    25,  // CANNOT_PARSE_ESCAPE_SEQUENCE
    26,  // CANNOT_PARSE_QUOTED_STRING
    27,  // CANNOT_PARSE_INPUT_ASSERTION_FAILED
    32,  // ATTEMPT_TO_READ_AFTER_EOF
    33,  // CANNOT_READ_ALL_DATA
    38,  // CANNOT_PARSE_DATE
    41,  // CANNOT_PARSE_DATETIME
    53,  // TYPE_MISMATCH
    69,  // ARGUMENT_OUT_OF_BOUND
    70,  // CANNOT_CONVERT_TYPE
    72,  // CANNOT_PARSE_NUMBER
    117, // INCORRECT_DATA
    131, // TOO_LARGE_STRING_SIZE
    349, // CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
    376, // CANNOT_PARSE_UUID
    377, // ILLEGAL_SYNTAX_FOR_DATA_TYPE
    467, // CANNOT_PARSE_BOOL
    691, // UNKNOWN_ELEMENT_OF_ENUM
];

/// Exception codes of a server that is busy, overloaded or briefly unable to
/// write.
const TRANSIENT_CODES: &[u32] = &[
    159, // TIMEOUT_EXCEEDED
    202, // TOO_MANY_SIMULTANEOUS_QUERIES
    203, // NO_FREE_CONNECTION
    209, // SOCKET_TIMEOUT
    210, // NETWORK_ERROR
    236, // ABORTED
    241, // MEMORY_LIMIT_EXCEEDED
    242, // TABLE_IS_READ_ONLY
    252, // TOO_MANY_PARTS
    285, // TOO_FEW_LIVE_REPLICAS
    319, // UNKNOWN_STATUS_OF_INSERT
    394, // QUERY_WAS_CANCELLED
    425, // SYSTEM_ERROR
    439, // CANNOT_SCHEDULE_TASK
    999, // KEEPER_EXCEPTION
];

/// Codes that retrying cannot fix, with the field that usually causes them.
const FATAL_CODES: &[(u32, &str)] = &[
    (60, "table"),              // UNKNOWN_TABLE
    (81, "database"),           // UNKNOWN_DATABASE
    (164, "username"),          // READONLY
    (192, "username"),          // UNKNOWN_USER
    (193, "password"),          // WRONG_PASSWORD
    (194, "password"),          // REQUIRED_PASSWORD
    (497, "username"),          // ACCESS_DENIED
    (516, "username/password"), // AUTHENTICATION_FAILED
];

/// What an answer says about the request: `None` when it succeeded, or the
/// failure. A refusal of the data is [`Failure::Refused`]; [`at_row`] reads
/// which row the server named.
pub fn failure(answer: &Answer) -> Option<Failure> {
    let body = answer.text();
    let code = body_code(&body);
    if answer.is_success() && code.is_none() {
        return None;
    }
    let reason = summary(answer.status, &body);
    let transient = |reason| Failure::Transient {
        reason,
        retry_after: answer.retry_after,
    };
    if let Some(code) = code {
        if let Some((_, field)) = FATAL_CODES.iter().find(|(fatal, _)| *fatal == code) {
            return Some(Failure::Fatal(format!(
                "{reason} (check plugin_config.{field})"
            )));
        }
        if TRANSIENT_CODES.contains(&code) {
            return Some(transient(reason));
        }
        if DATA_CODES.contains(&code) {
            return Some(Failure::Refused(reason));
        }
    }
    Some(match answer.status {
        401 | 403 => Failure::Fatal(format!("{reason} (check plugin_config.username/password)")),
        // A server error with no code or one not listed: nothing says the
        // rows are at fault, so they are kept and retried.
        status if classify(status) == StatusClass::Transient => transient(reason),
        // Any other refusal (current servers answer 400 for bad data) is the
        // request's: its rows are isolated to find the one refused.
        _ => Failure::Refused(reason),
    })
}

/// `N` of a body starting `Code: N`.
fn body_code(body: &str) -> Option<u32> {
    let rest = body.trim_start().strip_prefix("Code: ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `N` of the last `(at row N)` in the message.
pub fn at_row(body: &str) -> Option<usize> {
    let start = body.rfind("(at row ")? + "(at row ".len();
    let digits: String = body[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok().filter(|row| *row > 0)
}

/// The answer's first line (ClickHouse puts the exception there), bounded.
fn summary(status: u16, body: &str) -> String {
    let line: String = body
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(300)
        .collect();
    let line = line.trim().trim_end_matches(',');
    if line.is_empty() {
        format!("ClickHouse answered {status}")
    } else {
        format!("ClickHouse answered {status}: {line}")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;

    const OLD_PARSE: &str = "Code: 117, e.displayText() = DB::Exception: Unknown field found while parsing JSONEachRow format: poison: (at row 4)\n, e.what() = DB::Exception\n";
    const NEW_PARSE: &str = "Code: 27. DB::Exception: Cannot parse input: expected '\"' before: 'x\"}': (while reading the value of key n): (at row 12)\n: While executing ParallelParsingBlockInputFormat. (CANNOT_PARSE_INPUT_ASSERTION_FAILED) (version 24.8.4.13 (official build))\n";

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status,
            retry_after: None,
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn given_parse_errors_of_old_and_new_servers_when_read_should_refuse_naming_the_row() {
        assert!(matches!(
            failure(&answer(500, OLD_PARSE)),
            Some(Failure::Refused(_))
        ));
        assert_eq!(at_row(OLD_PARSE), Some(4));
        assert!(matches!(
            failure(&answer(400, NEW_PARSE)),
            Some(Failure::Refused(_))
        ));
        assert_eq!(at_row(NEW_PARSE), Some(12));
    }

    #[test]
    fn given_auth_and_missing_table_errors_when_read_should_be_fatal_naming_the_field() {
        let Some(Failure::Fatal(reason)) = failure(&answer(
            401,
            "Code: 193, e.displayText() = DB::Exception: Wrong password for user default",
        )) else {
            panic!("not fatal");
        };
        assert!(reason.contains("plugin_config.password"), "{reason}");
        let Some(Failure::Fatal(reason)) = failure(&answer(
            404,
            "Code: 60. DB::Exception: Table default.x does not exist. (UNKNOWN_TABLE)",
        )) else {
            panic!("not fatal");
        };
        assert!(reason.contains("plugin_config.table"), "{reason}");
    }

    #[test]
    fn given_overload_and_bare_5xx_when_read_should_be_transient_with_the_wait_asked_for() {
        assert!(matches!(
            failure(&answer(
                500,
                "Code: 252, e.displayText() = DB::Exception: Too many parts"
            )),
            Some(Failure::Transient { .. })
        ));
        assert!(matches!(
            failure(&answer(429, "slow down")),
            Some(Failure::Transient { .. })
        ));
        let throttled = Answer {
            retry_after: Some(Duration::from_secs(7)),
            ..answer(503, "")
        };
        assert_eq!(
            failure(&throttled),
            Some(Failure::Transient {
                reason: "ClickHouse answered 503".into(),
                retry_after: Some(Duration::from_secs(7)),
            })
        );
    }

    #[test]
    fn given_an_unlisted_code_when_read_should_retry_a_5xx_and_refuse_a_4xx() {
        assert!(matches!(
            failure(&answer(500, "Code: 4242, e.displayText() = something")),
            Some(Failure::Transient { .. })
        ));
        assert_eq!(
            failure(&answer(400, "Code: 4242. DB::Exception: something")),
            Some(Failure::Refused(
                "ClickHouse answered 400: Code: 4242. DB::Exception: something".into()
            ))
        );
    }

    #[test]
    fn given_a_success_or_an_exception_after_a_200_when_read_should_tell_them_apart() {
        assert_eq!(failure(&answer(200, "")), None);
        assert!(matches!(
            failure(&answer(
                200,
                "Code: 241. DB::Exception: Memory limit exceeded"
            )),
            Some(Failure::Transient { .. })
        ));
    }
}
