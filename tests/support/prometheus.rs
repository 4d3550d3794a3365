//! Parses the Prometheus text format, enough to check counters in tests.

use std::collections::BTreeMap;

/// Parses Prometheus text into `(name, labels, value)` samples.
pub fn parse_metrics(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.trim_end_matches('}');
                let labels = labels
                    .split("\",")
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (label, value) = pair.split_once('=').unwrap();
                        (label.to_owned(), value.trim_matches('"').to_owned())
                    })
                    .collect();
                (name.to_owned(), labels)
            }
            None => (series.to_owned(), BTreeMap::new()),
        };
        samples.push((name, labels, value.parse().unwrap()));
    }
    samples
}

pub fn sample(
    samples: &[(String, BTreeMap<String, String>, f64)],
    name: &str,
    key: &str,
    extra: &[(&str, &str)],
) -> Option<f64> {
    samples
        .iter()
        .find(|(sample_name, labels, _)| {
            sample_name == name
                && labels.get("connector_key").map(String::as_str) == Some(key)
                && extra
                    .iter()
                    .all(|(label, value)| labels.get(*label).map(String::as_str) == Some(*value))
        })
        .map(|(_, _, value)| *value)
}
