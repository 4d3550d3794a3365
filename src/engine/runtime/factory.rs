//! How the runtime turns a connector config into a connector instance: the
//! registry in production, anything a test supplies instead.

use crate::config::ConnectorConfig;
use crate::connectors::{BuildError, Registry, Sink, Source};

/// Turns a connector config into a connector instance (no I/O: `open` does that).
pub trait ConnectorFactory: Send + Sync {
    fn source(&self, config: &ConnectorConfig) -> Result<Box<dyn Source>, BuildError>;
    fn sink(&self, config: &ConnectorConfig) -> Result<Box<dyn Sink>, BuildError>;
}

/// Builds the compiled-in connectors named in configs.
pub struct RegistryFactory;

impl ConnectorFactory for RegistryFactory {
    fn source(&self, config: &ConnectorConfig) -> Result<Box<dyn Source>, BuildError> {
        Registry::build_source(&config.connector, &config.plugin_config)
    }

    fn sink(&self, config: &ConnectorConfig) -> Result<Box<dyn Sink>, BuildError> {
        Registry::build_sink(&config.connector, &config.plugin_config)
    }
}
