//! `payments-client [--url URL] [--token TOKEN] INTENT_FILE [AMOUNT CURRENCY TO]`:
//! makes one payment through the payments example, retried under the
//! intent file's key. Run it again on the same file after a crash or a
//! timeout: the service replays the first answer, and pays once.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    match payments_client::run(std::env::args().skip(1)).await {
        Ok(outcome) => {
            println!("{outcome}");
            if outcome.is_success() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprint!("payments-client: {e}");
            let mut source = e.source();
            while let Some(cause) = source {
                eprint!(": {cause}");
                source = cause.source();
            }
            eprintln!();
            ExitCode::FAILURE
        }
    }
}
