//! The suite's own tests: every check passes on the correct reference
//! connectors and fails on the one broken the way that check is about.

use crate::reference::{self, Queue, SinkFlaw, SourceFlaw, Store};
use crate::{sink, source};

async fn source_check(check: &str, flaw: SourceFlaw) -> crate::Outcome {
    source::run(check, &reference::source(flaw), &Queue::new()).await
}

async fn sink_check(check: &str, flaw: SinkFlaw) -> crate::Outcome {
    sink::run(check, &reference::sink(flaw), &Store::new()).await
}

#[tokio::test]
async fn the_correct_reference_source_passes_every_source_check() {
    for check in source::CHECKS {
        if let Err(failure) = source_check(check, SourceFlaw::None).await {
            panic!("{check}: {failure}");
        }
    }
}

#[tokio::test]
async fn the_correct_reference_sink_passes_every_sink_check() {
    for check in sink::CHECKS {
        if let Err(failure) = sink_check(check, SinkFlaw::None).await {
            panic!("{check}: {failure}");
        }
    }
}

/// Asserts `check` fails on the flawed connector and prints why.
macro_rules! fails {
    ($test:ident, $run:ident, $check:literal, $flaw:expr) => {
        #[tokio::test]
        async fn $test() {
            assert!(source::CHECKS.contains(&$check) || sink::CHECKS.contains(&$check));
            match $run($check, $flaw).await {
                Ok(()) => panic!("{} passed on {:?}", $check, $flaw),
                Err(failure) => eprintln!("{} fails on {:?}: {failure}", $check, $flaw),
            }
        }
    };
}

fails!(
    fresh_start_fails_on_a_source_skipping_its_first_item,
    source_check,
    "fresh_start",
    SourceFlaw::SkipsFirstItem
);
fails!(
    restore_fails_on_a_source_ignoring_its_state,
    source_check,
    "restore",
    SourceFlaw::IgnoresState
);
fails!(
    corrupt_state_refused_fails_on_a_source_accepting_corrupt_state,
    source_check,
    "corrupt_state_refused",
    SourceFlaw::AcceptsCorruptState
);
fails!(
    state_round_trip_fails_on_a_source_saving_a_stale_state,
    source_check,
    "state_round_trip",
    SourceFlaw::StaleState
);
fails!(
    nothing_destructive_before_commit_fails_on_a_source_deleting_in_poll,
    source_check,
    "nothing_destructive_before_commit",
    SourceFlaw::DeletesInPoll
);
fails!(
    cancelled_poll_loses_nothing_fails_on_a_source_advancing_before_it_waits,
    source_check,
    "cancelled_poll_loses_nothing",
    SourceFlaw::AdvancesBeforeWaiting
);
fails!(
    ok_means_durable_fails_on_a_sink_not_writing,
    sink_check,
    "ok_means_durable",
    SinkFlaw::OkWithoutWriting
);
fails!(
    replayed_batch_not_duplicated_fails_on_a_duplicating_idempotent_sink,
    sink_check,
    "replayed_batch_not_duplicated",
    SinkFlaw::Duplicates
);
fails!(
    rejections_in_range_fails_on_out_of_range_indexes,
    sink_check,
    "rejections_in_range",
    SinkFlaw::RejectsOutOfRange
);
fails!(
    rejections_in_range_fails_on_a_sink_storing_what_it_refused,
    sink_check,
    "rejections_in_range",
    SinkFlaw::StoresRejected
);
fails!(
    transient_error_retried_fails_on_a_sink_answering_ok_while_down,
    sink_check,
    "transient_error_retried",
    SinkFlaw::OkWhileDown
);
fails!(
    open_while_down_is_retried_fails_on_a_sink_whose_open_is_fatal_while_down,
    sink_check,
    "open_while_down_is_retried",
    SinkFlaw::FatalOpenWhileDown
);
fails!(
    rejections_in_range_fails_on_a_sink_claiming_durable_what_it_did_not_store,
    sink_check,
    "rejections_in_range",
    SinkFlaw::ClaimsUnwrittenDurable
);
fails!(
    open_while_down_is_retried_fails_on_a_source_whose_open_is_fatal_while_down,
    source_check,
    "open_while_down_is_retried",
    SourceFlaw::FatalOpenWhileDown
);
