//! The `leasehold` binary: parse the command line, set up logging, run the command.

use std::process::ExitCode;

use clap::Parser;
use leasehold::cli::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_logging(cli.log_format);
    cli::main(cli).await
}
