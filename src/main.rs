use std::process::ExitCode;

fn main() -> ExitCode {
    iggy_connect::cli::process::prepare();
    let cli = iggy_connect::cli::parse();
    iggy_connect::cli::run(cli)
}
