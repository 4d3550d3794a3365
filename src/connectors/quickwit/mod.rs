//! The Quickwit sink.

#[cfg(feature = "quickwit-sink")]
pub mod sink;
