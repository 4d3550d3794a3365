//! Waiting for conditions with a deadline, never for a fixed time. The one
//! polling loop of the tests (and benches): `eventually` for async checks,
//! `wait_for` for plain conditions on a runtime, `wait_until` off one, and
//! `try_eventually` for checks that report a timeout as an `Err` instead of
//! panicking (the conformance suite's checks return their failures).

use std::time::{Duration, Instant};

/// The first pause between checks, doubling up to `MAX_PAUSE`: quick
/// conditions are seen at once, slow ones are not polled hot.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const MAX_PAUSE: Duration = Duration::from_millis(25);

struct Deadline<'a> {
    what: &'a str,
    timeout: Duration,
    at: Instant,
    pause: Duration,
}

impl<'a> Deadline<'a> {
    fn new(what: &'a str, timeout: Duration) -> Self {
        Self {
            what,
            timeout,
            at: Instant::now() + timeout,
            pause: FIRST_PAUSE,
        }
    }

    /// The pause before the next check; `Err` naming what was awaited once
    /// the deadline passed.
    fn try_next_pause(&mut self, context: impl FnOnce() -> String) -> Result<Duration, String> {
        if Instant::now() >= self.at {
            return Err(format!(
                "timed out after {:?} waiting for: {}{}",
                self.timeout,
                self.what,
                context()
            ));
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        Ok(pause)
    }

    /// Panics once the deadline passed; else the pause before the next check.
    fn next_pause(&mut self, context: impl FnOnce() -> String) -> Duration {
        self.try_next_pause(context)
            .unwrap_or_else(|message| panic!("{message}"))
    }

    fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }
}

/// What one check of [`try_eventually`] found.
pub enum Check<T> {
    Ready(T),
    /// Not yet; what was seen, for the message if the deadline passes.
    Pending(String),
    /// Wrong for good: stop waiting.
    Failed(String),
}

/// Awaits `check` until it is ready or failed. After `timeout` (a check still
/// running then is dropped) returns `Err` naming `what` and the last pending
/// state, never panicking. `check` returns a future rather than being an async
/// closure so that the wait is `Send` inside spawned tasks and async traits.
pub async fn try_eventually<T, F: Future<Output = Check<T>>>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> F,
) -> Result<T, String> {
    let mut deadline = Deadline::new(what, timeout);
    let mut seen = String::new();
    loop {
        let checked = tokio::time::timeout(deadline.remaining(), check()).await;
        match checked {
            Ok(Check::Ready(value)) => return Ok(value),
            Ok(Check::Failed(message)) => return Err(message),
            Ok(Check::Pending(now)) => seen = now,
            Err(_) => {}
        }
        let pause = deadline.try_next_pause(|| {
            if seen.is_empty() {
                String::new()
            } else {
                format!(" ({seen})")
            }
        })?;
        tokio::time::sleep(pause).await;
    }
}

/// Awaits `check` until it holds; panics naming `what` after `timeout`.
pub async fn eventually(what: &str, timeout: Duration, check: impl AsyncFnMut() -> bool) {
    eventually_or(what, timeout, check, String::new).await;
}

/// [`eventually`], with `context()` (a log, a state) appended to the panic.
pub async fn eventually_or(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> bool,
    context: impl Fn() -> String,
) {
    let mut deadline = Deadline::new(what, timeout);
    while !check().await {
        tokio::time::sleep(deadline.next_pause(&context)).await;
    }
}

/// Polls `condition`, without blocking the runtime, until it holds; panics
/// naming `what` after `timeout`.
pub async fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    // Its own loop, not `eventually(async || condition())`: that future would
    // not be `Send` for every lifetime, and tasks spawn it.
    let mut deadline = Deadline::new(what, timeout);
    while !condition() {
        tokio::time::sleep(deadline.next_pause(String::new)).await;
    }
}

/// The blocking form of [`wait_for`], for tests without a runtime.
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let mut deadline = Deadline::new(what, timeout);
    while !condition() {
        std::thread::sleep(deadline.next_pause(String::new));
    }
}
