//! Runs every scenario of `idem_model::scenarios` at one size and prints,
//! for each, its state count and verdict, and the counterexamples found.
//!
//! `cargo run --release -p idem-model --example check -- [ci|deep]
//! [threads=N] [gateways=N] [requests=N] [horizon=N] [lease=N]
//! [crashes=N]` (`bench/model.sh` runs `deep`): a size, then overrides of
//! its bounds. Exits non-zero if a verdict is not the expected one.

use std::process::ExitCode;

use idem_model::{Config, check, find, scenarios};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).peekable();
    let mut size = match args.peek().map(String::as_str) {
        Some("ci") => Config::safe(),
        _ => Config::deep(),
    };
    if args.peek().is_some_and(|a| a == "ci" || a == "deep") {
        args.next();
    }
    let mut threads = 1;
    for arg in args {
        let parsed = arg
            .split_once('=')
            .and_then(|(k, v)| Some((k, v.parse::<u8>().ok()?)));
        match parsed {
            Some(("threads", n)) => threads = usize::from(n),
            Some(("gateways", n)) => size.gateways = n,
            Some(("requests", n)) => size.requests = n,
            Some(("horizon", n)) => {
                size.horizon = n;
                size.ttl = n.saturating_add(1);
            }
            Some(("lease", n)) => size.lease = n,
            Some(("crashes", n)) => size.faults.crashes = n,
            _ => {
                eprintln!("unknown argument {arg:?}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "size: {} gateways, {} requests each, ticks 0..={}, lease {} ticks, {} crashes; {threads} thread(s)",
        size.gateways, size.requests, size.horizon, size.lease, size.faults.crashes
    );
    let mut wrong = 0;
    for scenario in scenarios(size) {
        let checked = match scenario.breaks {
            Some(property) => find(scenario.config, property, threads),
            None => check(scenario.config, threads),
        };
        let broken: Vec<_> = scenario
            .holds
            .iter()
            .copied()
            .filter(|p| checked.counterexample(p).is_some())
            .collect();
        let found = scenario
            .breaks
            .and_then(|p| checked.counterexample(p).map(|t| (p, t)));
        let as_expected = broken.is_empty() && found.is_some() == scenario.breaks.is_some();
        wrong += usize::from(!as_expected);
        println!(
            "\n{}: {} unique states ({} generated, depth {}, {:.1} s{}) {}",
            scenario.name,
            checked.unique_states,
            checked.states,
            checked.max_depth,
            checked.elapsed.as_secs_f64(),
            if checked.exhaustive {
                ""
            } else {
                ", stopped at the counterexample"
            },
            if as_expected {
                "as expected"
            } else {
                "UNEXPECTED"
            },
        );
        for p in broken {
            println!("  broken: {p}");
        }
        if let Some((property, trace)) = found {
            println!("  counterexample to {property:?}:");
            for line in trace.lines() {
                println!("    {line}");
            }
        }
    }
    if wrong == 0 {
        ExitCode::SUCCESS
    } else {
        println!("\n{wrong} scenario(s) not as expected");
        ExitCode::FAILURE
    }
}
