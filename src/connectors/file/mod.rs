//! The file connectors: a source that tails local files matched by globs and a
//! sink that appends messages to local files. They share nothing but the
//! folder (and the compressions they read or write).

#[cfg(feature = "file-sink")]
pub mod sink;
#[cfg(feature = "file-source")]
pub mod source;
