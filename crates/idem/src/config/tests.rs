//! Any configuration text, and any settings, give an error or a
//! configuration: never a panic.

use super::GatewayConfig;
use super::file::FileConfig;
use crate::cli::ServeArgs;
use proptest::prelude::*;

fn check(text: &str) {
    // Any text: an error or a config, never a panic.
    if let Ok(file) = FileConfig::parse(text) {
        let mut args = ServeArgs::default();
        if file.upstream.is_none() {
            args.upstream = Some("http://127.0.0.1:1".into());
        }
        let _ = GatewayConfig::from_file(&args, &file);
    }
}

fn duration_text() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just(0u64), 1u64..100, any::<u64>()],
        prop::sample::select(vec!["", "ms", "s", "m", "h", "d", "y", " s", "µs"]),
    )
        .prop_map(|(n, u)| format!("{n}{u}"))
}

/// Cases per property: 2,000 in every test run; set
/// `IDEM_CONFIG_FUZZ_CASES` for a long run.
fn cases() -> u32 {
    std::env::var("IDEM_CONFIG_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn any_text_is_an_error_or_a_config(text in "\\PC{0,200}") {
        check(&text);
    }

    #[test]
    fn any_settings_are_an_error_or_a_config(
        ttl in duration_text(),
        lease in duration_text(),
        wait in duration_text(),
        timeout in duration_text(),
        idle in duration_text(),
        body in (any::<u32>(), prop::sample::select(vec!["", "B", "KiB", "MiB", "GiB"])),
        path in "[/{}*a-z.%]{0,20}",
        method in "[A-Za-z]{0,8}",
        fields in prop::collection::vec("[/a-z~0-9]{0,6}", 0..3),
    ) {
        let text = format!(
            "upstream = \"http://127.0.0.1:1\"\nttl = {ttl:?}\nlease = {lease:?}\nwait = {wait:?}\n\
             upstream_timeout = {timeout:?}\nupstream_idle_timeout = {idle:?}\nmax_body = \"{}{}\"\n\
             [[route]]\nmethod = {method:?}\npath = {path:?}\nlease = {lease:?}\nfingerprint_fields = {fields:?}\n",
            body.0, body.1
        );
        check(&text);
    }
}
