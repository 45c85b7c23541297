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
    if !matches!(
        cli.command,
        cli::args::Command::Run(_) | cli::args::Command::Demo(_)
    ) {
        default_sigpipe();
    }
    leasehold::logging::init(cli.log_format);
    cli::main(cli).await
}

/// A one-shot command whose output is closed early (`leasehold runs | head`) ends quietly, as
/// Unix tools do, instead of panicking on the failed write: Rust ignores SIGPIPE, so a write to
/// a closed pipe is an error `println!` panics on. Not for `run` and `demo`, which serve and
/// must outlive a closed pipe (their sockets are written with `MSG_NOSIGNAL` anyway).
#[allow(unsafe_code)]
fn default_sigpipe() {
    // SAFETY: sets SIGPIPE's disposition to the default; the process installs no handler for
    // it, and `signal` is safe to call from any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
