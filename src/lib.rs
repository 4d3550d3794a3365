//! iggy-connect: move data between external systems and Apache Iggy streams,
//! with at-least-once delivery, in one static binary.
//!
//! The library holds everything; `main.rs` only parses the command line.

pub mod api;
pub mod cli;
pub mod clock;
pub mod codec;
pub mod config;
pub mod connectors;
pub mod delivery;
pub mod engine;
pub mod iggy;
pub mod logging;
pub mod message;
pub mod state;
mod sync;
pub mod telemetry;
pub mod transforms;
