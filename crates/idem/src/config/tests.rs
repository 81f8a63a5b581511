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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// The HTTP/2 settings, any values: an error or a config.
    #[test]
    fn any_http2_settings_are_an_error_or_a_config(
        protocol in prop::sample::select(vec!["http1", "h2", "h2c", "auto", "h3", ""]),
        scheme in prop::sample::select(vec!["http", "https"]),
        streams in any::<u32>(),
        window in (any::<u32>(), prop::sample::select(vec!["", "KiB", "MiB", "GiB"])),
        keepalive in duration_text(),
        idle in duration_text(),
        http2 in any::<bool>(),
    ) {
        let text = format!(
            "upstream = \"{scheme}://127.0.0.1:1\"\nupstream_protocol = {protocol:?}\nhttp2 = {http2}\n\
             h2_max_streams = {streams}\nh2_stream_window = \"{}{}\"\nh2_connection_window = \"{}{}\"\n\
             h2_keepalive_interval = {keepalive:?}\nh2_idle_timeout = {idle:?}\n",
            window.0, window.1, window.0, window.1
        );
        check(&text);
    }
}

/// Each HTTP/2 setting is checked against its bounds and against the
/// others, with a message that names it.
#[test]
fn http2_settings_are_checked() {
    let refused = |text: &str, names: &str| {
        let file = FileConfig::parse(text).unwrap();
        let err = GatewayConfig::from_file(&ServeArgs::default(), &file).unwrap_err();
        assert!(err.to_string().contains(names), "{text}: {err}");
    };
    let up = "upstream = \"http://127.0.0.1:1\"\n";
    refused(
        &format!("{up}upstream_protocol = \"h3\""),
        "--upstream-protocol",
    );
    refused(&format!("{up}upstream_protocol = \"h2\""), "use h2c");
    refused(
        "upstream = \"https://127.0.0.1:1\"\nupstream_protocol = \"h2c\"",
        "use h2",
    );
    refused(&format!("{up}h2_max_streams = 0"), "h2-max-streams");
    refused(
        &format!("{up}h2_max_header_list = \"100\""),
        "h2-max-header-list",
    );
    refused(
        &format!("{up}h2_stream_window = \"4MiB\"\nh2_connection_window = \"1MiB\""),
        "--h2-connection-window must be at least --h2-stream-window",
    );
    let file = FileConfig::parse(&format!(
        "{up}upstream_protocol = \"h2c\"\nhttp2 = false\nh2_keepalive_interval = \"0s\""
    ))
    .unwrap();
    let cfg = GatewayConfig::from_file(&ServeArgs::default(), &file).unwrap();
    assert_eq!(cfg.upstream_protocol, idem_gateway::UpstreamProtocol::H2c);
    assert!(!cfg.http2.enabled);
    assert_eq!(cfg.http2.keep_alive_interval, None);
    assert_eq!(cfg.http2.max_concurrent_streams, 100);
}
