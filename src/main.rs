use std::process::ExitCode;

fn main() -> ExitCode {
    raise_open_files_limit();
    let cli = iggy_connect::cli::parse();
    iggy_connect::cli::run(cli)
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
