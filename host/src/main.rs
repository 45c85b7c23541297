//! The `leasehold` binary: parse the command line, set up logging, run the command. The
//! command line ([`cli`]) and the narrated demo ([`demo`]) belong to the binary; everything
//! they run is in the `leasehold` library.

use std::process::ExitCode;

use clap::Parser;

mod cli;
#[cfg(feature = "demo")]
mod demo;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = cli::args::Cli::parse();
    leasehold::logging::init(cli.log_format);
    cli::main(cli).await
}
