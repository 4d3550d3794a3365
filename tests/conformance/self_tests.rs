//! The suite's own tests: every check passes on the correct reference
//! connectors and fails on the one broken the way that check is about.

use libtest_mimic::{Failed, Trial};

use crate::reference::{self, Queue, SinkFlaw, SourceFlaw, Store, WebQueue, WebStore};
use crate::{block_on, sink, source};

/// The self-tests, named `self_tests::<what it proves>`.
pub fn trials() -> Vec<Trial> {
    let mut trials = vec![
        trial(
            "the_correct_reference_source_passes_every_source_check",
            the_correct_reference_source_passes_every_source_check,
        ),
        trial(
            "the_correct_reference_sink_passes_every_sink_check",
            the_correct_reference_sink_passes_every_sink_check,
        ),
    ];
    trials.extend(
        FAILS
            .iter()
            .map(|case| Trial::test(format!("self_tests::{}", case.name), move || case.fails())),
    );
    trials
}

fn trial(name: &str, body: fn() -> Result<(), Failed>) -> Trial {
    Trial::test(format!("self_tests::{name}"), body)
}

async fn source_check(check: &str, flaw: SourceFlaw) -> crate::Outcome {
    if WIRE_CHECKS.contains(&check) {
        let queue = WebQueue::start().await;
        return source::run(check, &reference::web_source(flaw), &queue).await;
    }
    source::run(check, &reference::source(flaw), &Queue::new()).await
}

/// The checks about a connection run against the reference connectors
/// reached over HTTP, the others against the in-memory ones.
async fn sink_check(check: &str, flaw: SinkFlaw) -> crate::Outcome {
    if WIRE_CHECKS.contains(&check) {
        let store = WebStore::start().await;
        return sink::run(check, &reference::web_sink(flaw), &store).await;
    }
    sink::run(check, &reference::sink(flaw), &Store::new()).await
}

const WIRE_CHECKS: [&str; 3] = [
    "connection_dropped_mid_batch",
    "retry_after_carried",
    "connection_dropped_mid_run",
];

fn the_correct_reference_source_passes_every_source_check() -> Result<(), Failed> {
    block_on(async {
        for check in source::CHECKS {
            source_check(check, SourceFlaw::None)
                .await
                .map_err(|failure| format!("{check}: {failure}"))?;
        }
        Ok(())
    })
}

fn the_correct_reference_sink_passes_every_sink_check() -> Result<(), Failed> {
    block_on(async {
        for check in sink::CHECKS {
            sink_check(check, SinkFlaw::None)
                .await
                .map_err(|failure| format!("{check}: {failure}"))?;
        }
        Ok(())
    })
}

/// A check that must fail on a connector with one flaw.
struct Fails {
    name: &'static str,
    check: &'static str,
    flaw: Flaw,
}

#[derive(Debug, Clone, Copy)]
enum Flaw {
    Source(SourceFlaw),
    Sink(SinkFlaw),
}

impl Fails {
    /// Passes when `check` fails on the flawed connector, and prints why.
    fn fails(&self) -> Result<(), Failed> {
        if !source::CHECKS.contains(&self.check) && !sink::CHECKS.contains(&self.check) {
            return Err(format!("no check {}", self.check).into());
        }
        let outcome = block_on(async {
            match self.flaw {
                Flaw::Source(flaw) => source_check(self.check, flaw).await,
                Flaw::Sink(flaw) => sink_check(self.check, flaw).await,
            }
        });
        match outcome {
            Ok(()) => Err(format!("{} passed on {:?}", self.check, self.flaw).into()),
            Err(failure) => {
                eprintln!(
                    "{} fails on {:?}: {}",
                    self.check,
                    self.flaw,
                    failure.message().unwrap_or_default()
                );
                Ok(())
            }
        }
    }
}

const FAILS: &[Fails] = &[
    Fails {
        name: "fresh_start_fails_on_a_source_skipping_its_first_item",
        check: "fresh_start",
        flaw: Flaw::Source(SourceFlaw::SkipsFirstItem),
    },
    Fails {
        name: "restore_fails_on_a_source_ignoring_its_state",
        check: "restore",
        flaw: Flaw::Source(SourceFlaw::IgnoresState),
    },
    Fails {
        name: "corrupt_state_refused_fails_on_a_source_accepting_corrupt_state",
        check: "corrupt_state_refused",
        flaw: Flaw::Source(SourceFlaw::AcceptsCorruptState),
    },
    Fails {
        name: "state_round_trip_fails_on_a_source_saving_a_stale_state",
        check: "state_round_trip",
        flaw: Flaw::Source(SourceFlaw::StaleState),
    },
    Fails {
        name: "nothing_destructive_before_commit_fails_on_a_source_deleting_in_poll",
        check: "nothing_destructive_before_commit",
        flaw: Flaw::Source(SourceFlaw::DeletesInPoll),
    },
    Fails {
        name: "cancelled_poll_loses_nothing_fails_on_a_source_advancing_before_it_waits",
        check: "cancelled_poll_loses_nothing",
        flaw: Flaw::Source(SourceFlaw::AdvancesBeforeWaiting),
    },
    Fails {
        name: "ok_means_durable_fails_on_a_sink_not_writing",
        check: "ok_means_durable",
        flaw: Flaw::Sink(SinkFlaw::OkWithoutWriting),
    },
    Fails {
        name: "replayed_batch_not_duplicated_fails_on_a_duplicating_idempotent_sink",
        check: "replayed_batch_not_duplicated",
        flaw: Flaw::Sink(SinkFlaw::Duplicates),
    },
    Fails {
        name: "rejections_in_range_fails_on_out_of_range_indexes",
        check: "rejections_in_range",
        flaw: Flaw::Sink(SinkFlaw::RejectsOutOfRange),
    },
    Fails {
        name: "rejections_in_range_fails_on_a_sink_storing_what_it_refused",
        check: "rejections_in_range",
        flaw: Flaw::Sink(SinkFlaw::StoresRejected),
    },
    Fails {
        name: "transient_error_retried_fails_on_a_sink_answering_ok_while_down",
        check: "transient_error_retried",
        flaw: Flaw::Sink(SinkFlaw::OkWhileDown),
    },
    Fails {
        name: "open_while_down_is_retried_fails_on_a_sink_whose_open_is_fatal_while_down",
        check: "open_while_down_is_retried",
        flaw: Flaw::Sink(SinkFlaw::FatalOpenWhileDown),
    },
    Fails {
        name: "rejections_in_range_fails_on_a_sink_claiming_durable_what_it_did_not_store",
        check: "rejections_in_range",
        flaw: Flaw::Sink(SinkFlaw::ClaimsUnwrittenDurable),
    },
    Fails {
        name: "connection_dropped_mid_batch_fails_on_a_sink_taking_a_cut_request_as_written",
        check: "connection_dropped_mid_batch",
        flaw: Flaw::Sink(SinkFlaw::OkWhenCut),
    },
    Fails {
        name: "retry_after_carried_fails_on_a_sink_dropping_retry_after",
        check: "retry_after_carried",
        flaw: Flaw::Sink(SinkFlaw::DropsRetryAfter),
    },
    Fails {
        name: "connection_dropped_mid_run_fails_on_a_source_taking_a_cut_connection_as_fatal",
        check: "connection_dropped_mid_run",
        flaw: Flaw::Source(SourceFlaw::FatalWhenCut),
    },
    Fails {
        name: "open_while_down_is_retried_fails_on_a_source_whose_open_is_fatal_while_down",
        check: "open_while_down_is_retried",
        flaw: Flaw::Source(SourceFlaw::FatalOpenWhileDown),
    },
];
