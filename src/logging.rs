//! Logs go to standard error through `tracing`, as text or JSON; `RUST_LOG`
//! sets the filter (default `info`). Standard output is left to sinks.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::runtime::LogFormat;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
