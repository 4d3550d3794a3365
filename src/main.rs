use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = iggy_connect::cli::parse();
    iggy_connect::cli::run(cli)
}
