//! Each planted defect is reported by the check named for it and by no
//! other; the reference server passes every check.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use idem_probe::{Detection, Options, Probe, Report, Target, Verdict, parse_header, parse_url};
use support::{Defect, serve};

async fn probe(defect: Defect, effect: bool) -> Report {
    probe_with(defect, effect, |_| {}).await
}

async fn probe_with(defect: Defect, effect: bool, configure: impl FnOnce(&mut Target)) -> Report {
    let base = serve(defect).await;
    let mut target = Target::new(
        parse_url(&format!("{base}/orders")).unwrap(),
        br#"{"sku":"A1","qty":1}"#.to_vec(),
    );
    target.credential = Some(parse_header("Authorization: Bearer tenant-one-secret").unwrap());
    target.second_credential =
        Some(parse_header("Authorization: Bearer tenant-two-secret").unwrap());
    target.failing_body = Some(br#"{"fail":422}"#.to_vec());
    target.transient_body = Some(br#"{"fail":503}"#.to_vec());
    // A route the reference server has: the made-up default path would
    // be refused whatever the key, and the check could not tell.
    target.other_url = Some(parse_url(&format!("{base}/carts/7/orders")).unwrap());
    configure(&mut target);
    let detection = Detection {
        id_pointer: Some("/id".to_owned()),
        effect_url: effect.then(|| parse_url(&format!("{base}/count")).unwrap()),
        effect_pointer: "/count".to_owned(),
    };
    let options = Options {
        pause: std::time::Duration::ZERO,
        ..Options::default()
    };
    Probe::new(target, detection, options).unwrap().run().await
}

fn verdicts(report: &Report) -> String {
    report
        .checks
        .iter()
        .map(|c| format!("{}: {:?} ({})", c.name, c.verdict, c.reason))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The check `name` fails and no other check fails.
async fn only(defect: Defect, name: &str) {
    fails(defect, false, &[name]).await;
}

fn verdict_of(report: &Report, name: &str) -> Verdict {
    report
        .checks
        .iter()
        .find(|c| c.name == name)
        .map(|c| c.verdict)
        .unwrap()
}

/// Exactly the checks `names` fail, and no secret reaches any output.
async fn fails(defect: Defect, effect: bool, names: &[&str]) -> Report {
    let report = probe(defect, effect).await;
    let all = verdicts(&report);
    let failed: Vec<_> = report
        .checks
        .iter()
        .filter(|c| c.verdict == Verdict::Fail)
        .map(|c| c.name)
        .collect();
    assert_eq!(failed, names, "{defect:?}:\n{all}");
    assert!(!report.passed(), "{all}");
    // No secret reaches any output.
    for text in [report.to_text(false), report.to_json(), report.to_junit()] {
        assert!(!text.contains("tenant-one-secret") && !text.contains("tenant-two-secret"));
    }
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_server_passes_every_check() {
    for effect in [false, true] {
        let report = probe(Defect::Correct, effect).await;
        let all = verdicts(&report);
        assert!(
            report.checks.iter().all(|c| c.verdict == Verdict::Pass),
            "effect {effect}:\n{all}"
        );
        assert!(report.passed());
        assert!(report.requests_sent <= 40, "{}", report.requests_sent);
        // One execution per success that was meant to execute: retry, body,
        // path, query, credential (two), big number, reformatted,
        // concurrency, in flight, transient.
        assert!(report.mutations.is_some(), "{all}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_not_bound_to_the_path_fails_key_bound_to_path() {
    only(Defect::PathUnbound, "key-bound-to-path").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_url_is_used_for_key_bound_to_path() {
    let base = serve(Defect::PathUnbound).await;
    let mut target = Target::new(
        parse_url(&format!("{base}/orders")).unwrap(),
        br#"{"sku":"A1"}"#.to_vec(),
    );
    target.other_url = Some(parse_url(&format!("{base}/carts/7/orders")).unwrap());
    let detection = Detection {
        id_pointer: Some("/id".to_owned()),
        ..Detection::default()
    };
    let options = Options {
        pause: std::time::Duration::ZERO,
        skip: vec!["concurrent-duplicates-execute-once".to_owned()],
        ..Options::default()
    };
    let report = Probe::new(target, detection, options).unwrap().run().await;
    let path = report
        .checks
        .iter()
        .find(|c| c.name == "key-bound-to-path")
        .unwrap();
    assert_eq!(path.verdict, Verdict::Fail, "{}", verdicts(&report));
    assert!(
        path.evidence
            .iter()
            .any(|e| e.request.contains("/carts/7/orders"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_tenants_fail_key_scoped_to_credential() {
    only(Defect::TenantsMerged, "key-scoped-to-credential").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_racy_check_then_insert_fails_concurrent_duplicates_execute_once() {
    only(Defect::Racy, "concurrent-duplicates-execute-once").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_201_replayed_as_200_fails_retry_replays_response() {
    only(Defect::CreatedAsOk, "retry-replays-response").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_5xx_fails_transient_failure_not_stored() {
    only(Defect::TransientCached, "transient-failure-not-stored").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optional_key_fails_key_required() {
    only(Defect::KeyOptional, "key-required").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_checks_are_not_applicable_and_unknown_names_refused() {
    let base = serve(Defect::Correct).await;
    let target = Target::new(
        parse_url(&format!("{base}/orders")).unwrap(),
        b"{}".to_vec(),
    );
    let options = Options {
        skip: vec!["no-such-check".to_owned()],
        ..Options::default()
    };
    let err = Probe::new(target.clone(), Detection::default(), options).unwrap_err();
    assert!(err.is_usage());
    let options = Options {
        skip: idem_probe::CHECKS
            .iter()
            .map(|c| c.name.to_owned())
            .collect(),
        ..Options::default()
    };
    let report = Probe::new(target, Detection::default(), options)
        .unwrap()
        .run()
        .await;
    assert_eq!(report.requests_sent, 0);
    assert!(
        report
            .checks
            .iter()
            .all(|c| c.verdict == Verdict::NotApplicable)
    );
}

/// Tenants in one key space that refuse each other's keys: the refusal
/// is the defect (the control under a fresh key executes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_refusing_each_others_keys_fail_key_scoped_to_credential() {
    let report = fails(
        Defect::TenantsMergedRefusing,
        false,
        &["key-scoped-to-credential"],
    )
    .await;
    let check = report
        .checks
        .iter()
        .find(|c| c.name == "key-scoped-to-credential")
        .unwrap();
    assert!(
        check.reason.contains("share one key space"),
        "{}",
        check.reason
    );
}

/// An API that refuses the probe's added field refuses it under any key:
/// the refusal proves nothing, so the checks that vary the body cannot
/// tell (naming the remedy) instead of passing; `--other-body` makes
/// key-bound-to-body tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_schema_is_not_mistaken_for_a_bound_key() {
    let report = fails(Defect::StrictSchema, false, &[]).await;
    let all = verdicts(&report);
    let body = report
        .checks
        .iter()
        .find(|c| c.name == "key-bound-to-body")
        .unwrap();
    assert_eq!(body.verdict, Verdict::CouldNotTell, "{all}");
    assert!(body.reason.contains("--other-body"), "{all}");
    assert_ne!(
        verdict_of(&report, "big-number-precision"),
        Verdict::Pass,
        "{all}"
    );

    let report = probe_with(Defect::StrictSchema, false, |t| {
        t.other_body = Some(br#"{"sku":"B2","qty":1}"#.to_vec());
    })
    .await;
    let all = verdicts(&report);
    assert_eq!(
        verdict_of(&report, "key-bound-to-body"),
        Verdict::Pass,
        "{all}"
    );
    // The same key with --other-body on a key-ignoring server executes
    // separately: a pass for the body rule, while the retry fails.
}

/// A server that never looks at the key: every request executes, so the
/// rules that need the key to mean something fail, and the binding
/// checks (which only need the requests kept apart) pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ignored_key_fails_the_rules_that_need_it() {
    fails(
        Defect::KeyIgnored,
        false,
        &[
            "key-required",
            "retry-replays-response",
            "reformatted-json-not-executed-twice",
            "concurrent-duplicates-execute-once",
            "expiry-advertised",
        ],
    )
    .await;
}

/// The same, answering one resource id to every key: ids then tell
/// nothing, and no verdict may rest on them. With an effect count, the
/// four concurrent executions are seen; the retry's count (+1) and its id
/// (the same) disagree, which tells nothing either way, and is no pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constant_resource_id_is_not_taken_for_a_replay() {
    let report = fails(
        Defect::KeyIgnoredConstantId,
        false,
        &["key-required", "expiry-advertised"],
    )
    .await;
    let all = verdicts(&report);
    for name in [
        "retry-replays-response",
        "key-bound-to-body",
        "reformatted-json-not-executed-twice",
        "concurrent-duplicates-execute-once",
    ] {
        assert_eq!(
            verdict_of(&report, name),
            Verdict::CouldNotTell,
            "{name}:\n{all}"
        );
    }
    let report = probe(Defect::KeyIgnoredConstantId, true).await;
    let all = verdicts(&report);
    assert_eq!(
        verdict_of(&report, "retry-replays-response"),
        Verdict::CouldNotTell,
        "{all}"
    );
    assert_eq!(
        verdict_of(&report, "concurrent-duplicates-execute-once"),
        Verdict::Fail,
        "{all}"
    );
}

/// The made-up default path is refused whatever the key on an API that
/// routes by path: key-bound-to-path cannot tell and names --other-url.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrouted_other_path_cannot_tell_and_names_other_url() {
    let report = probe_with(Defect::Correct, false, |t| t.other_url = None).await;
    let path = report
        .checks
        .iter()
        .find(|c| c.name == "key-bound-to-path")
        .unwrap();
    assert_eq!(path.verdict, Verdict::CouldNotTell, "{}", verdicts(&report));
    assert!(path.reason.contains("--other-url"), "{}", path.reason);
}

/// A correct API that numbers each tenant's resources on its own: tenant
/// two's ids repeat tenant one's, which is no sign of shared ids or of a
/// replay. Every check passes, with ids alone and with an effect count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_numbered_per_tenant_are_not_taken_for_shared_ids() {
    for effect in [false, true] {
        let report = probe(Defect::IdsPerTenant, effect).await;
        let all = verdicts(&report);
        assert!(
            report.checks.iter().all(|c| c.verdict == Verdict::Pass),
            "effect {effect}:\n{all}"
        );
    }
}

/// An effect count that never moves (a cache, a replica) on a server that
/// ignores keys: where the count and the ids disagree nothing is told, so
/// no check passes on the count's word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_effect_count_does_not_overrule_the_ids() {
    let report = probe(Defect::KeyIgnoredStaleCount, true).await;
    let all = verdicts(&report);
    for name in [
        "retry-replays-response",
        "reformatted-json-not-executed-twice",
        "concurrent-duplicates-execute-once",
    ] {
        assert_ne!(verdict_of(&report, name), Verdict::Pass, "{name}:\n{all}");
    }
    assert!(!report.passed(), "{all}");
}
