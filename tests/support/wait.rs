//! Waiting for conditions with a deadline, never for a fixed time. The one
//! polling loop of the tests (and benches): `eventually` for async checks,
//! `wait_for` for plain conditions on a runtime, `wait_until` off one.

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

    /// Panics once the deadline passed; else the pause before the next check.
    fn next_pause(&mut self, context: impl FnOnce() -> String) -> Duration {
        if Instant::now() >= self.at {
            panic!(
                "timed out after {:?} waiting for: {}{}",
                self.timeout,
                self.what,
                context()
            );
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        pause
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
