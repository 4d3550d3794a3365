//! Fault injection. Every method is safe to call from any thread while
//! traffic flows; rules take effect on the next request the server reads.

use super::net::Control;
use iggy_binary_protocol::codes::{
    CREATE_TOPIC_CODE, SEND_MESSAGES_CODE, STORE_CONSUMER_OFFSET_CODE,
};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Status answered to a refused `SendMessages`: 4006
/// `CannotSaveMessagesToSegment`, what the server reports when it cannot
/// persist a batch. The client surfaces it as
/// `IggyError::CannotSaveMessagesToSegment` and does not reconnect; an
/// `IggyProducer` retries it like any failed send (3 retries by default).
pub const SEND_REFUSAL_STATUS: u32 = 4006;

/// Status answered to a refused `StoreConsumerOffset`: 10006
/// `CannotWriteToFile`, what a server that fails to persist the offset
/// reports. The client surfaces it as `IggyError::CannotWriteToFile`.
pub const OFFSET_STORE_REFUSAL_STATUS: u32 = 10006;

/// What to do with one request instead of (or after) serving it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultAction {
    /// Answer with this status and an empty body; change nothing.
    Refuse(u32),
    /// Close the connection without applying the request or replying.
    LoseRequest,
    /// Apply the request, then close the connection instead of replying.
    LoseReply,
}

struct Rule {
    command_code: u32,
    action: FaultAction,
    /// `None` applies until cleared.
    remaining: Option<u32>,
}

/// Handle for injecting faults into a running [`super::IggyTestServer`].
///
/// Refusals answer a request with a non-zero reply status and an empty body,
/// the way the real server answers a failure decided before commit; nothing
/// is stored. When several rules match one request, the oldest one wins.
pub struct Faults {
    rules: Mutex<Vec<Rule>>,
    stall: watch::Sender<Option<Duration>>,
    control: mpsc::UnboundedSender<Control>,
}

impl Faults {
    pub(crate) fn new(control: mpsc::UnboundedSender<Control>) -> Arc<Self> {
        Arc::new(Self {
            rules: Mutex::new(Vec::new()),
            stall: watch::Sender::new(None),
            control,
        })
    }

    fn rules(&self) -> MutexGuard<'_, Vec<Rule>> {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, command_code: u32, action: FaultAction, remaining: Option<u32>) {
        if remaining == Some(0) {
            return;
        }
        self.rules().push(Rule {
            command_code,
            action,
            remaining,
        });
    }

    /// The next `n` `SendMessages` (101) requests are answered with status
    /// [`SEND_REFUSAL_STATUS`] and store nothing.
    pub fn refuse_sends(&self, n: u32) {
        self.refuse(SEND_MESSAGES_CODE, SEND_REFUSAL_STATUS, n);
    }

    /// Every `SendMessages` request is refused as in
    /// [`refuse_sends`](Self::refuse_sends) until [`clear`](Self::clear).
    pub fn refuse_sends_until_cleared(&self) {
        self.refuse_until_cleared(SEND_MESSAGES_CODE, SEND_REFUSAL_STATUS);
    }

    /// The next `n` `StoreConsumerOffset` (121) requests are answered with
    /// status [`OFFSET_STORE_REFUSAL_STATUS`] and store nothing.
    pub fn refuse_offset_stores(&self, n: u32) {
        self.refuse(STORE_CONSUMER_OFFSET_CODE, OFFSET_STORE_REFUSAL_STATUS, n);
    }

    /// Every `StoreConsumerOffset` is refused until [`clear`](Self::clear).
    pub fn refuse_offset_stores_until_cleared(&self) {
        self.refuse_until_cleared(STORE_CONSUMER_OFFSET_CODE, OFFSET_STORE_REFUSAL_STATUS);
    }

    /// Every `CreateTopic` (302) is answered with `status` until
    /// [`clear`](Self::clear), e.g. 4041 `UnsupportedOptionKey`, which is what
    /// a 0.11-edge server answers to the option keys the 0.11.0 client always
    /// sends. The client surfaces `IggyError::from_code(status)`.
    pub fn refuse_topic_creation(&self, status: u32) {
        self.refuse_until_cleared(CREATE_TOPIC_CODE, status);
    }

    /// The next `n` requests with `command_code` are answered with `status`
    /// (non-zero) and change nothing. Works for any command, including reads
    /// such as a poll (100).
    pub fn refuse(&self, command_code: u32, status: u32, n: u32) {
        assert_ne!(status, 0, "a refusal needs a non-zero status");
        self.add(command_code, FaultAction::Refuse(status), Some(n));
    }

    /// Like [`refuse`](Self::refuse), until [`clear`](Self::clear).
    pub fn refuse_until_cleared(&self, command_code: u32, status: u32) {
        assert_ne!(status, 0, "a refusal needs a non-zero status");
        self.add(command_code, FaultAction::Refuse(status), None);
    }

    /// The next `n` requests with `command_code` are lost: the server closes
    /// the connection on reading one, without applying it or replying. The
    /// client sees `Disconnected` (a read is replayed after reconnecting; a
    /// write is not, so the caller or the producer's retries decide).
    pub fn lose_requests(&self, command_code: u32, n: u32) {
        self.add(command_code, FaultAction::LoseRequest, Some(n));
    }

    /// The next `n` requests with `command_code` are applied, then the
    /// connection is closed instead of replying: the outcome is unknown to
    /// the client, which is what makes a retried send a duplicate.
    pub fn lose_replies(&self, command_code: u32, n: u32) {
        self.add(command_code, FaultAction::LoseReply, Some(n));
    }

    /// Abruptly closes every open connection, and returns once they are
    /// closed. The listener stays up, so clients reconnect (the 0.11.0
    /// client paces a reconnect to the same address to `reestablish_after`,
    /// 5 s by default, after its previous connect).
    pub fn drop_connections(&self) {
        let (ack, done) = std_mpsc::channel();
        if self.control.send(Control::DropConnections(ack)).is_ok() {
            let _ = done.recv_timeout(Duration::from_secs(10));
        }
    }

    /// Holds every reply, on every connection, for `duration` after the
    /// request was applied, until [`clear`](Self::clear) (which also releases
    /// the replies being held). A hold longer than 30 s makes the client
    /// give up on the connection with `Disconnected`.
    pub fn stall_replies(&self, duration: Duration) {
        self.stall.send_replace(Some(duration));
    }

    /// Removes every rule and ends any stall.
    pub fn clear(&self) {
        self.rules().clear();
        self.stall.send_replace(None);
    }

    /// Consumes the first rule matching `command_code`.
    pub(crate) fn take_action(&self, command_code: u32) -> Option<FaultAction> {
        let mut rules = self.rules();
        let index = rules
            .iter()
            .position(|rule| rule.command_code == command_code)?;
        let action = rules[index].action;
        if let Some(remaining) = &mut rules[index].remaining {
            *remaining -= 1;
            if *remaining == 0 {
                rules.remove(index);
            }
        }
        Some(action)
    }

    pub(crate) fn stall_receiver(&self) -> watch::Receiver<Option<Duration>> {
        self.stall.subscribe()
    }
}
