//! Micro benchmarks in one process, no backend (criterion):
//!
//!     cargo bench --bench engine                        # all of them
//!     cargo bench --bench engine -- state_save          # a group (criterion's filter, a regex)
//!
//! - `runtime`: `state_save`, `random_source_poll`, `engine_source`,
//!   `engine_sink` (the engine's own cost around the connectors);
//! - `codec`: `json_decode`, `json_encode`, `schema_codecs_*` (per message);
//! - `transforms`: `transform_per_message`.

mod codec;
mod runtime;
mod transforms;

criterion::criterion_main!(runtime::benches, codec::benches, transforms::benches);
