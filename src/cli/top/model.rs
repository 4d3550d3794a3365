//! What `top` shows: connectors sampled from the control API (`/stats` for the
//! counters, `/sources` and `/sinks` for status, lag and last error) and the
//! rows computed from two consecutive samples.

use std::cmp::Ordering;
use std::time::Duration;

use serde_json::Value;

use crate::connectors::ConnectorKind;

/// One connector's figures at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub kind: ConnectorKind,
    pub key: String,
    pub connector: String,
    pub status: String,
    /// Source: records polled; sink: messages consumed from Iggy.
    pub messages_in: u64,
    /// Source: messages sent to Iggy; sink: messages written.
    pub messages_out: u64,
    pub bytes: u64,
    pub errors: u64,
    pub dead_lettered: u64,
    /// Batches per duration bucket since start, and the buckets' upper bounds
    /// in µs (`None`: the last, open bucket).
    pub batch_counts: Vec<u64>,
    pub batch_bounds_us: Vec<Option<u64>>,
    pub lag: Option<Lag>,
    pub last_error: Option<String>,
}

/// The `lag` field of a status answer (null when the runtime cannot tell).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lag {
    pub messages: Option<u64>,
    pub bytes: Option<u64>,
    pub oldest_age_ms: Option<u64>,
}

/// A 99th percentile read from histogram buckets: at most a bound, or beyond
/// the last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Latency {
    AtMost(u64),
    Beyond(u64),
}

/// A table row: rates over the time between two samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub sample: Sample,
    /// Per second; `None` on the first sample.
    pub in_rate: Option<f64>,
    pub out_rate: Option<f64>,
    pub bytes_rate: Option<f64>,
    /// Over the batches of the interval (since start on the first sample);
    /// `None` when no batch ended.
    pub p99: Option<Latency>,
}

/// The columns, in display order; each can sort the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    Key,
    Status,
    In,
    Out,
    Bytes,
    Errors,
    DeadLetters,
    Lag,
    P99,
    LastError,
}

impl Column {
    pub const ALL: [Column; 10] = [
        Column::Key,
        Column::Status,
        Column::In,
        Column::Out,
        Column::Bytes,
        Column::Errors,
        Column::DeadLetters,
        Column::Lag,
        Column::P99,
        Column::LastError,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Column::Key => "CONNECTOR",
            Column::Status => "STATUS",
            Column::In => "IN/s",
            Column::Out => "OUT/s",
            Column::Bytes => "BYTES/s",
            Column::Errors => "ERRORS",
            Column::DeadLetters => "DLQ",
            Column::Lag => "LAG",
            Column::P99 => "P99",
            Column::LastError => "LAST ERROR",
        }
    }

    /// The next column to sort by (`o`), wrapping around.
    pub fn next(self) -> Column {
        let index = Column::ALL.iter().position(|column| *column == self);
        Column::ALL[index.map_or(0, |index| (index + 1) % Column::ALL.len())]
    }
}

impl Sample {
    /// Joins `/stats`'s `connectors` with the `/sources` and `/sinks` lists,
    /// by kind and key.
    pub fn all(stats: &Value, sources: &Value, sinks: &Value) -> Vec<Sample> {
        let empty = Vec::new();
        let listed = |kind: ConnectorKind| match kind {
            ConnectorKind::Source => sources.as_array().unwrap_or(&empty),
            ConnectorKind::Sink => sinks.as_array().unwrap_or(&empty),
        };
        stats["connectors"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .filter_map(|counters| {
                let kind: ConnectorKind = counters["connector_type"].as_str()?.parse().ok()?;
                let key = counters["key"].as_str()?;
                let info = listed(kind)
                    .iter()
                    .find(|info| info["key"].as_str() == Some(key))
                    .unwrap_or(&Value::Null);
                Some(Sample::from_answers(kind, counters, info))
            })
            .collect()
    }

    fn from_answers(kind: ConnectorKind, counters: &Value, info: &Value) -> Sample {
        let count = |name: &str| counters[name].as_u64().unwrap_or(0);
        let (messages_in, messages_out) = match kind {
            ConnectorKind::Source => (count("messages_produced"), count("messages_sent")),
            ConnectorKind::Sink => (count("messages_consumed"), count("messages_processed")),
        };
        let durations = &counters["batch_durations"];
        let status = info["status"]
            .as_str()
            .or_else(|| counters["status"].as_str())
            .unwrap_or("unknown");
        Sample {
            kind,
            key: counters["key"].as_str().unwrap_or_default().to_owned(),
            connector: counters["connector"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            status: status.to_owned(),
            messages_in,
            messages_out,
            bytes: count("bytes"),
            errors: count("errors"),
            dead_lettered: count("messages_dead_lettered"),
            batch_counts: numbers(&durations["counts"])
                .map(Option::unwrap_or_default)
                .collect(),
            batch_bounds_us: numbers(&durations["bounds_us"]).collect(),
            lag: Lag::from_answer(&info["lag"]),
            last_error: info["last_error"]["message"].as_str().map(str::to_owned),
        }
    }
}

impl Lag {
    fn from_answer(lag: &Value) -> Option<Lag> {
        lag.is_object().then(|| Lag {
            messages: lag["messages"].as_u64(),
            bytes: lag["bytes"].as_u64(),
            oldest_age_ms: lag["oldest_age_ms"].as_u64(),
        })
    }

    /// Messages behind when known, else bytes; for sorting.
    fn amount(self) -> Option<u64> {
        self.messages.or(self.bytes)
    }
}

impl Row {
    /// The row of `current`, with rates since `previous` (the same connector
    /// `elapsed` earlier) when there is one.
    pub fn new(current: Sample, previous: Option<&Sample>, elapsed: Duration) -> Row {
        let seconds = elapsed.as_secs_f64();
        let previous = previous.filter(|_| seconds > 0.0);
        let rate = |now: u64, before: fn(&Sample) -> u64| {
            previous.map(|previous| now.saturating_sub(before(previous)) as f64 / seconds)
        };
        let window: Vec<u64> = match previous {
            Some(previous) if previous.batch_counts.len() == current.batch_counts.len() => current
                .batch_counts
                .iter()
                .zip(&previous.batch_counts)
                .map(|(now, before)| now.saturating_sub(*before))
                .collect(),
            _ => current.batch_counts.clone(),
        };
        Row {
            in_rate: rate(current.messages_in, |sample| sample.messages_in),
            out_rate: rate(current.messages_out, |sample| sample.messages_out),
            bytes_rate: rate(current.bytes, |sample| sample.bytes),
            p99: percentile(&window, &current.batch_bounds_us, 0.99),
            sample: current,
        }
    }

    /// Compares two rows by a column; numbers ascending, unknown first.
    pub fn compare(&self, other: &Row, column: Column) -> Ordering {
        let rate = |value: Option<f64>, other: Option<f64>| {
            value.partial_cmp(&other).unwrap_or(Ordering::Equal)
        };
        let (mine, theirs) = (&self.sample, &other.sample);
        match column {
            Column::Key => (mine.kind, &mine.key).cmp(&(theirs.kind, &theirs.key)),
            Column::Status => mine.status.cmp(&theirs.status),
            Column::In => rate(self.in_rate, other.in_rate),
            Column::Out => rate(self.out_rate, other.out_rate),
            Column::Bytes => rate(self.bytes_rate, other.bytes_rate),
            Column::Errors => mine.errors.cmp(&theirs.errors),
            Column::DeadLetters => mine.dead_lettered.cmp(&theirs.dead_lettered),
            Column::Lag => (mine.lag.and_then(Lag::amount)).cmp(&theirs.lag.and_then(Lag::amount)),
            Column::P99 => self.p99.cmp(&other.p99),
            Column::LastError => mine.last_error.cmp(&theirs.last_error),
        }
    }

    /// Whether the filter text is in the key, the connector name or the
    /// status (case-insensitive).
    pub fn matches(&self, filter: &str) -> bool {
        let filter = filter.to_lowercase();
        [
            self.sample.key.as_str(),
            self.sample.connector.as_str(),
            self.sample.status.as_str(),
            &self.sample.kind.to_string(),
        ]
        .iter()
        .any(|field| field.to_lowercase().contains(&filter))
    }
}

/// The bucket holding the `quantile` of `counts` (per-bucket counts).
pub fn percentile(counts: &[u64], bounds_us: &[Option<u64>], quantile: f64) -> Option<Latency> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * quantile).ceil().max(1.0) as u64;
    let mut seen = 0;
    let index = counts.iter().position(|count| {
        seen += count;
        seen >= rank
    })?;
    match bounds_us.get(index).copied().flatten() {
        Some(bound) => Some(Latency::AtMost(bound)),
        None => {
            let last = bounds_us.iter().rev().find_map(|bound| *bound)?;
            Some(Latency::Beyond(last))
        }
    }
}

fn numbers(value: &Value) -> impl Iterator<Item = Option<u64>> + '_ {
    value.as_array().into_iter().flatten().map(Value::as_u64)
}

/// A running sink's sample with `messages_in` messages (as many out, ten
/// bytes each) and `counts` batches per bucket (bounds 1, 2, 4... µs).
#[cfg(test)]
pub fn sample(key: &str, messages_in: u64, counts: Vec<u64>) -> Sample {
    Sample {
        kind: ConnectorKind::Sink,
        key: key.into(),
        connector: "stdout".into(),
        status: "running".into(),
        messages_in,
        messages_out: messages_in,
        bytes: messages_in * 10,
        errors: 0,
        dead_lettered: 0,
        batch_bounds_us: (0..counts.len())
            .map(|index| (index + 1 < counts.len()).then(|| 1 << index))
            .collect(),
        batch_counts: counts,
        lag: None,
        last_error: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn given_the_api_answers_when_joined_should_take_counters_status_lag_and_error() {
        let stats = json!({"connectors": [
            {"key": "pg", "connector_type": "sink", "connector": "postgres", "status": "running",
             "messages_consumed": 10, "messages_processed": 8, "bytes": 100, "errors": 2,
             "messages_dead_lettered": 1,
             "batch_durations": {"bounds_us": [1, 2, null], "counts": [0, 3, 1]}},
            {"key": "gen", "connector_type": "source", "connector": "random", "status": "running",
             "messages_produced": 5, "messages_sent": 4},
        ]});
        let sinks = json!([{"key": "pg", "status": "error",
            "last_error": {"message": "refused", "timestamp": 1},
            "lag": {"messages": 7, "bytes": null, "oldest_age_ms": 1500, "partitions": []}}]);
        let sources = json!([{"key": "gen", "status": "running", "last_error": null}]);
        let samples = Sample::all(&stats, &sources, &sinks);
        assert_eq!(samples.len(), 2);
        let pg = &samples[0];
        assert_eq!((pg.messages_in, pg.messages_out, pg.bytes), (10, 8, 100));
        assert_eq!((pg.errors, pg.dead_lettered), (2, 1));
        assert_eq!(pg.status, "error");
        assert_eq!(pg.last_error.as_deref(), Some("refused"));
        assert_eq!(
            pg.lag,
            Some(Lag {
                messages: Some(7),
                bytes: None,
                oldest_age_ms: Some(1500)
            })
        );
        assert_eq!(pg.batch_bounds_us, vec![Some(1), Some(2), None]);
        let generator = &samples[1];
        assert_eq!((generator.messages_in, generator.messages_out), (5, 4));
        assert_eq!(generator.lag, None);
    }

    #[test]
    fn given_two_samples_when_a_row_is_made_should_give_rates_and_the_interval_p99() {
        let before = sample("a", 100, vec![50, 0, 0, 0]);
        let now = sample("a", 300, vec![50, 99, 1, 0]);
        let row = Row::new(now.clone(), Some(&before), Duration::from_secs(2));
        assert_eq!(row.in_rate, Some(100.0));
        assert_eq!(row.bytes_rate, Some(1000.0));
        // 100 batches in the interval: the 99th is in bucket 1 (≤ 2 µs), the
        // 50 fast ones before the interval do not count.
        assert_eq!(row.p99, Some(Latency::AtMost(2)));
        let first = Row::new(now, None, Duration::ZERO);
        assert_eq!(first.in_rate, None);
        assert_eq!(first.p99, Some(Latency::AtMost(2)));
    }

    #[test]
    fn given_counts_when_a_percentile_is_read_should_name_its_bucket() {
        let bounds = [Some(1), Some(2), None];
        assert_eq!(percentile(&[0, 0, 0], &bounds, 0.99), None);
        assert_eq!(
            percentile(&[1, 0, 0], &bounds, 0.99),
            Some(Latency::AtMost(1))
        );
        assert_eq!(
            percentile(&[98, 1, 1], &bounds, 0.99),
            Some(Latency::AtMost(2))
        );
        assert_eq!(
            percentile(&[1, 0, 5], &bounds, 0.99),
            Some(Latency::Beyond(2))
        );
    }
}
