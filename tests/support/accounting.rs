//! Exact message accounting for the fault suite: which `seq` of the random
//! source reached the topic and the sink, and how often.

use std::collections::BTreeMap;
use std::path::Path;

use crate::support::iggy_server::IggyTestServer;

/// How many times each `seq` was seen.
pub type Seen = BTreeMap<u64, usize>;

pub fn seqs_in_topic(server: &IggyTestServer, stream: &str, topic: &str) -> Seen {
    count(
        server
            .messages(stream, topic)
            .iter()
            .map(|message| seq_of(&message.payload)),
    )
}

/// `seq`s in a file of JSON lines, as the `faulty` sink writes them. A last
/// line without its newline is a write still in progress and is not counted.
pub fn seqs_in_file(path: &Path) -> Seen {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    count(complete.lines().map(|line| seq_of(line.as_bytes())))
}

fn seq_of(payload: &[u8]) -> u64 {
    let record: serde_json::Value = serde_json::from_slice(payload).expect("a JSON record");
    record["seq"].as_u64().expect("a seq field")
}

fn count(seqs: impl Iterator<Item = u64>) -> Seen {
    let mut seen = Seen::new();
    for seq in seqs {
        *seen.entry(seq).or_insert(0) += 1;
    }
    seen
}

/// Copies beyond the first.
pub fn duplicates(seen: &Seen) -> usize {
    seen.values().map(|times| times - 1).sum()
}

/// The `seq`s of `0..produced` missing from `seen`.
pub fn missing(seen: &Seen, produced: u64) -> Vec<u64> {
    (0..produced)
        .filter(|seq| !seen.contains_key(seq))
        .collect()
}

/// One line per scenario, the suite's summary:
/// `scenario: NAME produced=N delivered=N lost=0 duplicates=D topic_duplicates=T`.
/// `delivered` counts distinct records that reached the end of the pipeline.
pub fn report(name: &str, produced: u64, topic: &Seen, end: &Seen) -> String {
    report_set_aside(name, produced, topic, end, None)
}

/// [`report`] for a scenario that sets records aside on purpose (skipped or
/// dead-lettered): they are counted under `label`, not as lost.
pub fn report_set_aside(
    name: &str,
    produced: u64,
    topic: &Seen,
    end: &Seen,
    set_aside: Option<(&str, &[u64])>,
) -> String {
    let (label, aside) = set_aside.unwrap_or(("set_aside", &[]));
    let lost = missing(end, produced)
        .into_iter()
        .filter(|seq| !aside.contains(seq))
        .count();
    let mut line = format!(
        "scenario: {name} produced={produced} delivered={} lost={lost} duplicates={} topic_duplicates={}",
        end.len(),
        duplicates(end),
        duplicates(topic)
    );
    if !aside.is_empty() {
        line.push_str(&format!(" {label}={}", aside.len()));
    }
    println!("{line}");
    line
}
