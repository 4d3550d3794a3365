//! iggy-connect: move data between external systems and Apache Iggy streams,
//! with at-least-once delivery, in one static binary.
//!
//! The library holds everything; `main.rs` only parses the command line.
//!
//! Layers, bottom first: a file imports only from its own layer and those
//! below, and no two files import each other, directly or around a circle
//! (`tests/it/layers.rs` checks both). `a::*` is every module under `a` not
//! listed itself.
//! 1. `message`, `delivery`, `clock`, `sync`, `lag`
//! 2. `codec`, `transforms`, `connectors`, `connectors::entry`, `connectors::kit::backoff`
//! 3. `connectors::registry`
//! 4. `config`
//! 5. `iggy`, `logging`, `telemetry`, `state`, `connectors::kit`, `connectors::describe`
//! 6. `connectors::*` (every backend folder)
//! 7. `engine`
//! 8. `api`
//! 9. `cli`

pub mod api;
pub mod cli;
pub mod clock;
pub mod codec;
pub mod config;
pub mod connectors;
pub mod delivery;
pub mod engine;
pub mod iggy;
pub mod lag;
pub mod logging;
pub mod message;
pub mod state;
mod sync;
pub mod telemetry;
pub mod transforms;
