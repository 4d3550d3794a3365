//! Process-wide settings made once at start, before any thread exists; the
//! benches' case processes call [`prepare`] too, so they measure what runs.

/// Raises the open-files limit, tunes glibc's allocator (one arena, no
/// heap trimmed or mapped per batch) and installs rustls's default crypto
/// provider (`connectors::kit::crypto`).
pub fn prepare() {
    raise_open_files_limit();
    tune_malloc();
    crate::connectors::kit::crypto::ensure_default_provider();
}

/// Raises the soft limit on open files to the hard limit, so a flood of
/// connections to an HTTP source meets its `max_connections` long before the
/// process runs out of descriptors (a common soft default is 1024). Best
/// effort: where it cannot be raised, the old limit stays.
fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some() && limit.current != limit.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: limit.maximum,
                maximum: limit.maximum,
            },
        );
    }
}

/// Two settings of glibc's allocator, both measured on the pipelines of
/// BENCHMARKS.md ("Peak RSS at the defaults", "The allocator's thresholds"):
///
/// - One arena. glibc gives each thread that allocates an arena of its own
///   (up to eight per core), and each keeps what its thread freed: a batch
///   built on one worker and dropped on another left 5-6 MB of a Postgres ->
///   Iggy -> Postgres runtime's 31 MB peak in arenas. One arena costs no
///   throughput measurable here: the small allocations go through each
///   thread's cache without the arena's lock.
/// - Fixed thresholds: memory blocks under 4 MiB come from the heap, and the
///   heap gives memory back to the kernel once 16 MiB are free at its top.
///   With glibc's moving defaults (from 128 KiB) a batch's vectors and its
///   request buffer (100 KB to a few MB) were mapped and unmapped, or the
///   heap grown and trimmed, once per batch: a quarter of a random source's
///   worker time went to page faults (`perf`), and its pipeline to Iggy
///   gained 10-30% without them, at the same peak RSS.
///
/// `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES` in the environment still decide:
/// the runtime then sets none of them.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none()
        && std::env::var_os("GLIBC_TUNABLES").is_none()
    {
        const MIB: libc::c_int = 1024 * 1024;
        // SAFETY: called once at start, before any other thread exists;
        // mallopt only sets parameters of the allocator.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
            libc::mallopt(libc::M_MMAP_THRESHOLD, 4 * MIB);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 16 * MIB);
        }
    }
}
