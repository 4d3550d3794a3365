use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = iggy_connect::cli::Cli::parse();
    iggy_connect::cli::run(cli)
}
