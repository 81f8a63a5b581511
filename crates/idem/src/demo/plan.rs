//! The demo's intents, planned from its seed: the same seed gives the same
//! run, over HTTP or through a broker.

use crate::cli::DemoArgs;

/// Every account's balance at the start.
pub(crate) const START_BALANCE: i64 = 1_000;

/// One intent's plan.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) key: String,
    pub(crate) body: serde_json::Value,
    pub(crate) duplicate: bool,
    pub(crate) reuse: bool,
}

pub(crate) fn plans(args: &DemoArgs, accounts: usize) -> Vec<Plan> {
    // SplitMix64 from the seed: the same seed gives the same run.
    let mut state = args.seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut unit = move || (next() as f64) / (u64::MAX as f64);
    (0..args.intents)
        .map(|i| {
            let from = (unit() * accounts as f64) as usize % accounts;
            let to = (from + 1 + (unit() * (accounts - 1) as f64) as usize) % accounts;
            let amount = 1 + (unit() * 400.0) as i64;
            Plan {
                key: format!("demo-{}-intent-{i:07}", args.seed),
                body: serde_json::json!({"from": format!("acct-{from}"), "to": format!("acct-{to}"), "amount": amount}),
                duplicate: unit() < args.duplicate_rate,
                reuse: unit() < args.reuse_rate,
            }
        })
        .collect()
}
