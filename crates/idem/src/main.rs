//! `idem`: the gateway that puts idempotency in front of any HTTP service
//! (`idem serve`), the demo that proves one effect per intent under
//! injected faults (`idem demo`), and operator tools (`idem records`).
//!
//! Raw input (flags, environment, TOML) is parsed in `cli` and validated
//! once into `config::GatewayConfig`; the rest of the program sees only
//! the validated form. Errors reach `main`, which prints one line (one
//! per configuration problem) and exits with the code of `exit`'s table:
//! 0 success, 1 runtime failure, 2 usage or configuration error, 3 not
//! found.

mod admin;
mod check_config;
mod cli;
mod config;
mod demo;
mod durability;
mod exit;
mod logging;
mod probe;
mod records;
mod serve;
mod tls;
mod units;
mod usage;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc's malloc: the request path allocates and
/// frees many small buffers across worker threads, and glibc's malloc and
/// free were about a tenth of the gateway's CPU (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The environment variable with which an operator keeps transparent huge
/// pages: mimalloc's own switch (`MIMALLOC_ALLOW_THP=1`); when it is set,
/// whatever its value, mimalloc decides and `idem` leaves the setting alone.
#[cfg(target_os = "linux")]
const ALLOW_THP: &str = "MIMALLOC_ALLOW_THP";

/// Turns transparent huge pages off for this process. mimalloc asks the
/// kernel for huge pages, and the first touch of each one zeroes 2 MiB while
/// a request waits: with new keys kept in memory that was 2% of the
/// machine's CPU under the gateway bench and about 2 ms of its p99
/// (docs/benchmarks-history.md, "Huge pages"). Best effort: a kernel that
/// refuses the switch (before Linux 3.15, or a seccomp profile) keeps its
/// own, and the refusal is returned for the log.
fn disable_transparent_huge_pages() -> Option<std::io::Error> {
    #[cfg(target_os = "linux")]
    if std::env::var_os(ALLOW_THP).is_none() {
        return rustix::thread::disable_transparent_huge_pages(true)
            .err()
            .map(std::io::Error::from);
    }
    None
}

fn main() -> ExitCode {
    // First, before the threads start and the heap grows.
    let huge_pages_refused = disable_transparent_huge_pages();
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            e.exit()
        }
        Err(e) => {
            let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
            eprintln!("idem: {} (see idem --help)", usage::error_line(&e, &args));
            return exit::Exit::Usage.into();
        }
    };
    // Before the command runs, so that every event reaches the log.
    if let Err(e) = logging::init(cli.log_level.as_deref(), cli.log_format) {
        logging::print_error_as(Some(cli.log_format), &format!("{e:#}"));
        return exit::Exit::Usage.into();
    }
    if let Some(e) = huge_pages_refused {
        tracing::debug!(error = %e, "transparent huge pages stay as the kernel set them");
    }
    tls::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            logging::print_error(&format!("cannot start the runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            cli::Command::Serve(args) => {
                let cfg = config::GatewayConfig::from_args(&args)?;
                serve::serve(cfg).await.map(|()| ExitCode::SUCCESS)
            }
            cli::Command::CheckConfig(args) => {
                check_config::run(&args).map(|()| exit::Exit::Success.into())
            }
            cli::Command::Demo(args) => demo::run(args).await,
            cli::Command::Records(cmd) => records::run(cmd).await.map(|()| ExitCode::SUCCESS),
            cli::Command::Probe(args) => probe::run(&args).await,
        }
    });
    // Background tasks (sweeper, upkeep) end with the runtime.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(code) => code,
        Err(e) => exit::report(&e),
    }
}
