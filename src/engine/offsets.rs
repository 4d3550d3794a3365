//! Moving a stopped sink's consumer-group offsets (`POST /sinks/{key}/offsets`,
//! `iggy-connect offsets`): on every topic of its `[[streams]]`, or on one.

use serde::Serialize;

use crate::config::{ConnectorConfig, KindConfig};
use crate::connectors::Degraded;
use crate::iggy::{Bus, BusError, ConsumerSpec, OffsetMove, OffsetReset};

/// The moves on one topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopicMoves {
    pub stream: String,
    pub topic: String,
    pub consumer_group: String,
    pub partitions: Vec<OffsetMove>,
}

#[derive(Debug, thiserror::Error)]
pub enum OffsetsError {
    #[error("\"{0}\" is a source; only sinks have consumer-group offsets")]
    NotASink(String),
    #[error("sink \"{key}\" reads no topic {stream}/{topic}")]
    NoSuchTopic {
        key: String,
        stream: String,
        topic: String,
    },
    #[error("{stream}/{topic}: {source}")]
    Bus {
        stream: String,
        topic: String,
        #[source]
        source: BusError,
    },
}

/// Moves the sink's group on each topic it reads (`only`: just that
/// stream/topic) to `to`. Topics already moved stay moved when a later one
/// fails; the error names the one that did.
pub async fn reset(
    bus: &dyn Bus,
    config: &ConnectorConfig,
    to: &OffsetReset,
    only: Option<(&str, &str)>,
) -> Result<Vec<TopicMoves>, OffsetsError> {
    let topics = sink_topics(config, only)?;
    let mut moved = Vec::new();
    for (stream, topic, group) in topics {
        let spec = ConsumerSpec {
            stream: stream.to_owned(),
            topic: topic.to_owned(),
            group: group.to_owned(),
            batch_length: 1,
            poll_interval: std::time::Duration::from_millis(100),
            connector_key: config.key.clone(),
            degraded: Degraded::default(),
            lag: Default::default(),
        };
        let partitions =
            bus.reset_offsets(&spec, to)
                .await
                .map_err(|source| OffsetsError::Bus {
                    stream: stream.to_owned(),
                    topic: topic.to_owned(),
                    source,
                })?;
        tracing::warn!(
            connector_key = %config.key,
            stream,
            topic,
            consumer_group = group,
            ?to,
            "sink offsets moved"
        );
        moved.push(TopicMoves {
            stream: stream.to_owned(),
            topic: topic.to_owned(),
            consumer_group: group.to_owned(),
            partitions,
        });
    }
    Ok(moved)
}

/// The sink's `(stream, topic, consumer group)`s, or only the one `only` names.
fn sink_topics<'a>(
    config: &'a ConnectorConfig,
    only: Option<(&str, &str)>,
) -> Result<Vec<(&'a str, &'a str, &'a str)>, OffsetsError> {
    let KindConfig::Sink { streams, .. } = &config.kind_config else {
        return Err(OffsetsError::NotASink(config.key.clone()));
    };
    let topics: Vec<(&str, &str, &str)> = streams
        .iter()
        .flat_map(|stream| {
            stream.topics.iter().map(|topic| {
                (
                    stream.stream.as_str(),
                    topic.as_str(),
                    stream.consumer_group.as_str(),
                )
            })
        })
        .filter(|(stream, topic, _)| only.is_none_or(|only| only == (*stream, *topic)))
        .collect();
    match only {
        Some((stream, topic)) if topics.is_empty() => Err(OffsetsError::NoSuchTopic {
            key: config.key.clone(),
            stream: stream.to_owned(),
            topic: topic.to_owned(),
        }),
        _ => Ok(topics),
    }
}

/// Reads `earliest`, `latest`, `timestamp:<RFC 3339 or microseconds>` or
/// `<partition>=<offset>,...` (the CLI's form of the API's `to`).
pub fn parse_target(text: &str) -> Result<OffsetReset, String> {
    match text {
        "earliest" => return Ok(OffsetReset::Earliest),
        "latest" => return Ok(OffsetReset::Latest),
        _ => {}
    }
    if let Some(time) = text.strip_prefix("timestamp:") {
        return parse_timestamp(time).map(OffsetReset::Timestamp);
    }
    let mut offsets = std::collections::BTreeMap::new();
    for pair in text.split(',') {
        let parsed = pair
            .split_once('=')
            .and_then(|(partition, offset)| {
                Some((partition.trim().parse().ok()?, offset.trim().parse().ok()?))
            })
            .ok_or_else(|| {
                format!(
                    "\"{text}\" is not earliest, latest, timestamp:<time> or <partition>=<offset>,..."
                )
            })?;
        offsets.insert(parsed.0, parsed.1);
    }
    Ok(OffsetReset::Offsets(offsets))
}

/// An RFC 3339 time or microseconds since the epoch.
pub fn parse_timestamp(text: &str) -> Result<u64, String> {
    if let Ok(micros) = text.parse::<u64>() {
        return Ok(micros);
    }
    let time = humantime::parse_rfc3339_weak(text).map_err(|error| {
        format!("\"{text}\" is not an RFC 3339 time or microseconds since the epoch: {error}")
    })?;
    time.duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_micros() as u64)
        .map_err(|_| format!("\"{text}\" is before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_each_form_of_target_when_parsed_should_give_its_reset() {
        assert_eq!(parse_target("earliest"), Ok(OffsetReset::Earliest));
        assert_eq!(parse_target("latest"), Ok(OffsetReset::Latest));
        assert_eq!(
            parse_target("timestamp:2024-03-01T00:00:01Z"),
            Ok(OffsetReset::Timestamp(1_709_251_201_000_000))
        );
        assert_eq!(
            parse_target("timestamp:1709251201000000"),
            Ok(OffsetReset::Timestamp(1_709_251_201_000_000))
        );
        assert_eq!(
            parse_target("1=10, 2=0"),
            Ok(OffsetReset::Offsets([(1, 10), (2, 0)].into()))
        );
        for bad in ["", "first", "1=x", "timestamp:yesterday", "1:10"] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }
}
