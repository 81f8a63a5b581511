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

mod check_config;
mod cli;
mod config;
mod demo;
mod exit;
mod gateway;
mod logging;
mod records;
mod stores;
mod tls;
mod units;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc's malloc: the request path allocates and
/// frees many small buffers across worker threads, and glibc's malloc and
/// free were about a tenth of the gateway's CPU (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
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
            eprintln!("idem: {} (see idem --help)", usage_error_line(&e));
            return exit::Exit::Usage.into();
        }
    };
    // Before the command runs, so that every event reaches the log.
    if let Err(e) = logging::init(cli.log_level.as_deref(), cli.log_format) {
        eprintln!("idem: {e:#}");
        return exit::Exit::Usage.into();
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
                gateway::serve(cfg).await.map(|()| ExitCode::SUCCESS)
            }
            cli::Command::CheckConfig(args) => {
                check_config::run(&args).map(|()| exit::Exit::Success.into())
            }
            cli::Command::Demo(args) => demo::run(args).await,
            cli::Command::Records(cmd) => records::run(cmd).await.map(|()| ExitCode::SUCCESS),
        }
    });
    // Background tasks (sweeper, upkeep) end with the runtime.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(code) => code,
        Err(e) => exit::report(&e),
    }
}

/// One line for a command line clap refused: clap's own first line, except
/// that an unexpected argument is shown only by its flag name. A value
/// typed where no value belongs (a credential after a flag that takes none,
/// `--credential=...` where no such flag exists) may be a secret, and error
/// lines end up in terminals' scrollback and CI logs.
fn usage_error_line(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() == ErrorKind::UnknownArgument {
        let arg = match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::String(arg)) => arg.as_str(),
            _ => "",
        };
        return match shown_flag_name(arg) {
            Some(flag) => format!("unexpected argument '{flag}'"),
            None => "unexpected argument (a value is not shown: it may be a secret)".to_owned(),
        };
    }
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("invalid arguments");
    first.trim_start_matches("error: ").to_owned()
}

/// The flag name of `arg` if it looks like one (`--name` or `-x`, without
/// anything after `=`), or `None` for a value.
fn shown_flag_name(arg: &str) -> Option<&str> {
    let name = arg.split('=').next().unwrap_or_default();
    let is_flag = |rest: &str| {
        !rest.is_empty()
            && rest.len() <= 40
            && rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    match name.strip_prefix("--") {
        Some(rest) if is_flag(rest) => Some(name),
        Some(_) => None,
        None => match name.strip_prefix('-') {
            Some(rest) if is_flag(rest) => Some(name),
            _ => None,
        },
    }
}

#[cfg(test)]
mod usage_tests {
    use super::shown_flag_name;

    #[test]
    fn values_and_secret_shaped_flags_are_not_shown() {
        assert_eq!(shown_flag_name("--credential"), Some("--credential"));
        assert_eq!(
            shown_flag_name("--credential=Bearer hunter2"),
            Some("--credential")
        );
        assert_eq!(shown_flag_name("-x"), Some("-x"));
        for secret in [
            "hunter2",
            "Bearer abc",
            "--sk_live_51Habc",
            "-",
            "--",
            "--x y",
            "---------------------------------------------------------",
        ] {
            assert_eq!(shown_flag_name(secret), None, "{secret}");
        }
    }
}
