//! Delivery settings that both a connector's config and the engine running it
//! name. A leaf module: it imports neither `config` nor `engine`.

/// What a sink does with a message its backend refuses for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Stop the sink (status `error`, reason `rejected`); offsets stay put.
    #[default]
    Stop,
    /// Count the message and move on.
    Skip,
    /// Send it to the dead-letter topic with headers saying why, then move on.
    Dlq,
}

impl std::str::FromStr for OnError {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "stop" => Ok(OnError::Stop),
            "skip" => Ok(OnError::Skip),
            "dlq" => Ok(OnError::Dlq),
            other => Err(format!(
                "expected \"stop\", \"skip\" or \"dlq\", found \"{other}\""
            )),
        }
    }
}
