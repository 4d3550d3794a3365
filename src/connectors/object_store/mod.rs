//! The `object_store` source: objects under a prefix of any store the
//! `object_store` crate speaks (`s3://`, `az://`, `gs://`, `file://`), read
//! in a stable order and decoded into one message per record.

#[cfg(feature = "object-store-source")]
pub mod source;
