//! Process-wide settings made once at start, before any thread exists; the
//! benches' case processes call [`prepare`] too, so they measure what runs.

/// Raises the open-files limit and keeps glibc's allocator to one arena.
pub fn prepare() {
    raise_open_files_limit();
    one_malloc_arena();
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

/// glibc gives each thread that allocates an arena of its own (up to eight
/// per core), and each keeps what its thread freed: a batch built on one
/// worker and dropped on another left 5-6 MB of a Postgres -> Iggy ->
/// Postgres runtime's 31 MB peak in arenas (BENCHMARKS.md, "Peak RSS at the
/// defaults"). One arena costs no throughput measurable here: the small
/// allocations go through each thread's cache without the arena's lock.
/// `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES` in the environment still decide.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none()
        && std::env::var_os("GLIBC_TUNABLES").is_none()
    {
        // SAFETY: called once at start, before any other thread exists;
        // mallopt only sets a parameter of the allocator.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}
