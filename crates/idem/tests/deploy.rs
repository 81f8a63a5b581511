//! `deploy/` against the real gateway: every metric the Prometheus alert
//! rules and the Grafana dashboard name is one `idem serve` exports on its
//! admin `/metrics`, every label value they match on is one the code uses,
//! every alert has a section in the runbook, and (where `promtool` is
//! installed) the rules file is valid.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_http::metrics::Outcome;
use support::{executions, gateway, upstream};

/// The child half: serves the counting upstream until killed.
#[test]
#[ignore = "child process of the gateway tests; run by them"]
fn upstream_child() {
    support::upstream_child_main();
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn read(relative: &str) -> String {
    let path = deploy_dir().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every metric name the code registers, whether or not its event has
/// happened yet (some series appear only after a crash or a store failure).
fn registered() -> BTreeSet<&'static str> {
    use idem_http::{maintenance, metrics, store_watch};
    BTreeSet::from([
        metrics::REQUESTS,
        metrics::TAKEOVERS,
        metrics::IN_PROGRESS,
        metrics::OLDEST,
        metrics::STORE_DURATION,
        metrics::REPLAY_CACHE_HITS,
        metrics::STALE,
        metrics::UNRECORDED,
        maintenance::RECONCILED,
        maintenance::PURGED,
        store_watch::STORE_LOSSES,
        store_watch::LOSS_WINDOW_OPEN,
        store_watch::EPOCH_CHECKS_FAILED,
    ])
}

/// Every `outcome` label value of `idem_requests_total`.
fn outcomes() -> BTreeSet<&'static str> {
    Outcome::ALL.iter().map(|o| o.as_str()).collect()
}

/// The `action` label values of `idem_reconciled_total` (maintenance.rs).
const ACTIONS: [&str; 4] = idem_http::maintenance::RECONCILE_ACTIONS;

/// The `op` label values of `idem_store_duration_seconds` (metrics.rs).
const OPS: [&str; 5] = ["claim", "complete", "release", "get", "find_by_key"];

/// Names starting `idem_` in `text` (a PromQL expression, or YAML).
fn metric_names(text: &str) -> BTreeSet<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("idem_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let len = tail.find(|c: char| !word(c)).unwrap_or(tail.len());
        if !before.is_some_and(word) {
            names.insert(tail[..len].to_owned());
        }
        rest = &tail[len..];
    }
    names
}

/// The values a PromQL text matches `label` against: `label="v"` and each
/// alternative of `label=~"a|b"`.
fn label_values(text: &str, label: &str) -> BTreeSet<String> {
    let mut values = BTreeSet::new();
    for op in ["=\"", "=~\""] {
        let pattern = format!("{label}{op}");
        let mut rest = text;
        while let Some(at) = rest.find(&pattern) {
            let tail = &rest[at + pattern.len()..];
            let end = tail.find('"').unwrap();
            for v in tail[..end].split('|') {
                values.insert(v.to_owned());
            }
            rest = &tail[end..];
        }
    }
    values
}

/// The rules file without its comment lines.
fn rules_text() -> String {
    read("prometheus/idem-alerts.yml")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One alerting rule, read line by line (the file keeps one key a line).
struct Alert {
    name: String,
    block: String,
}

impl Alert {
    /// The value of `key:` in this rule, quotes stripped.
    fn field(&self, key: &str) -> Option<String> {
        self.block.lines().find_map(|l| {
            let v = l.trim().strip_prefix(key)?.strip_prefix(':')?;
            Some(v.trim().trim_matches('"').to_owned())
        })
    }
}

fn alerts() -> Vec<Alert> {
    let text = rules_text();
    let mut out: Vec<Alert> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert:") {
            out.push(Alert {
                name: name.trim().to_owned(),
                block: String::new(),
            });
        } else if let Some(alert) = out.last_mut() {
            alert.block.push_str(line);
            alert.block.push('\n');
        }
    }
    out
}

/// Every PromQL text in the dashboard: panel targets (rows nest panels)
/// and template variable queries.
fn dashboard_exprs() -> Vec<String> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<String>) {
        for panel in panels.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                out.push(target["expr"].as_str().unwrap().to_owned());
            }
            walk(&panel["panels"], out);
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("grafana/idem-dashboard.json")).unwrap();
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["definition"].as_str() {
            out.push(q.to_owned());
        }
    }
    out
}

/// `# TYPE name kind` lines of a Prometheus text scrape: (name, kind).
fn scraped_types(scrape: &str) -> BTreeSet<(String, String)> {
    scrape
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("# TYPE ")?.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect()
}

/// Drives a gateway through executed, replayed, mismatch, conflict, held
/// (then released by recovery) and purged, and scrapes its `/metrics`
/// once the series those produce are all there.
async fn scrape_after_traffic() -> String {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &support::SHORT_LIVED).await;
    let c = reqwest::Client::new();
    let key = |tag: &str| format!("deploy-{tag}-{}-0000000", std::process::id());
    let post = |path: &str, k: &str, body: &'static str| {
        c.post(format!("{}{path}", g.base))
            .header("idempotency-key", k)
            .body(body)
            .send()
    };

    let k = key("orders");
    assert_eq!(post("/orders", &k, "{}").await.unwrap().status(), 201);
    let replay = post("/orders", &k, "{}").await.unwrap();
    assert!(replay.headers().contains_key("idempotent-replayed"));
    assert_eq!(
        post("/orders", &k, "{\"x\":1}").await.unwrap().status(),
        422
    );

    // A slow request: its retry conflicts; the upstream then times out, the
    // outcome is unknown, the key is held and recovery releases it.
    let slow = key("slow");
    let first = tokio::spawn(post("/slow", &slow, "{}"));
    while executions(&up, &slow).await == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(post("/slow", &slow, "{}").await.unwrap().status(), 409);
    assert_eq!(first.await.unwrap().unwrap().status(), 504);
    reqwest::get(format!("{up}/release")).await.unwrap();

    let wanted = [
        "idem_requests_total{outcome=\"executed\"}",
        "idem_requests_total{outcome=\"replayed\"}",
        "idem_requests_total{outcome=\"mismatch\"}",
        "idem_requests_total{outcome=\"conflict\"}",
        "idem_requests_total{outcome=\"held\"}",
        "idem_store_duration_seconds_bucket{op=\"claim\"",
        "idem_records_in_progress ",
        "idem_in_progress_oldest_seconds ",
        "idem_records_purged_total ",
        "idem_reconciled_total{action=\"released\"}",
    ];
    let mut text = String::new();
    for _ in 0..200 {
        text = support::metrics_text(&g).await;
        if wanted.iter().all(|w| text.contains(w)) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let missing: Vec<_> = wanted.iter().filter(|w| !text.contains(**w)).collect();
    panic!("series never appeared: {missing:?}\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_in_the_alerts_and_dashboard_is_exported() {
    let scrape = scrape_after_traffic().await;
    let types = scraped_types(&scrape);
    let scraped: BTreeSet<&str> = types.iter().map(|(n, _)| n.as_str()).collect();
    let histograms: BTreeSet<&str> = types
        .iter()
        .filter(|(_, kind)| kind == "histogram")
        .map(|(n, _)| n.as_str())
        .collect();
    assert!(
        histograms.contains(idem_http::metrics::STORE_DURATION),
        "the store latency is a Prometheus histogram: {scrape}"
    );
    let registered = registered();
    // Everything the code registers that this traffic produced is in the
    // scrape under that name (so the list above is not wishful).
    for name in &registered {
        let caused = ![
            idem_http::metrics::TAKEOVERS,
            idem_http::metrics::STALE,
            idem_http::metrics::UNRECORDED,
            idem_http::metrics::REPLAY_CACHE_HITS,
        ]
        .contains(name);
        if caused {
            assert!(scraped.contains(name), "{name} not in the scrape: {scrape}");
        }
    }

    let mut texts = vec![("idem-alerts.yml".to_owned(), rules_text())];
    texts.extend(
        dashboard_exprs()
            .into_iter()
            .map(|e| ("idem-dashboard.json".to_owned(), e)),
    );
    let mut named = 0;
    let mut not_seen = BTreeSet::new();
    for (file, text) in &texts {
        for name in metric_names(text) {
            named += 1;
            let known = |n: &str| scraped.contains(n) || registered.contains(n);
            let ok = known(&name)
                || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
                    name.strip_suffix(suffix).is_some_and(|base| {
                        histograms.contains(base) || base == idem_http::metrics::STORE_DURATION
                    })
                });
            assert!(ok, "{file} names `{name}`, which idem does not export");
            if !scraped.contains(name.as_str()) && !histograms.iter().any(|h| name.starts_with(h)) {
                not_seen.insert(name);
            }
        }
        let outcomes = outcomes();
        for v in label_values(text, "outcome") {
            assert!(outcomes.contains(v.as_str()), "{file}: no outcome `{v}`");
        }
        for v in label_values(text, "action") {
            assert!(ACTIONS.contains(&v.as_str()), "{file}: no action `{v}`");
        }
        for v in label_values(text, "op") {
            assert!(OPS.contains(&v.as_str()), "{file}: no store op `{v}`");
        }
        for v in label_values(text, "cause") {
            assert!(
                idem_core::LOSS_CAUSES.contains(&v.as_str()),
                "{file}: no loss cause `{v}`"
            );
        }
    }
    assert!(named >= 20, "the deploy files name metrics ({named})");
    for name in not_seen {
        println!("{name}: registered by the code, no event in this run");
    }
}

/// A GitHub heading anchor: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn every_alert_is_complete_and_has_a_runbook_section() {
    let runbook = read("RUNBOOK.md");
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(anchor)
        .collect();
    let alerts = alerts();
    assert!(alerts.len() >= 9, "{} alerts", alerts.len());
    for alert in &alerts {
        let name = &alert.name;
        for key in ["expr", "for", "severity", "summary", "description"] {
            assert!(alert.field(key).is_some(), "{name} has no `{key}`");
        }
        let severity = alert.field("severity").unwrap();
        assert!(
            ["critical", "warning", "info"].contains(&severity.as_str()),
            "{name}: severity {severity}"
        );
        let url = alert.field("runbook_url").unwrap_or_default();
        let (_, fragment) = url
            .split_once("deploy/RUNBOOK.md#")
            .unwrap_or_else(|| panic!("{name}: runbook_url {url:?}"));
        assert_eq!(fragment, anchor(name), "{name}: runbook_url {url}");
        assert!(
            anchors.contains(fragment),
            "deploy/RUNBOOK.md has no section `## {name}`"
        );
    }
    // And no runbook section for an alert that no longer exists.
    let names: BTreeSet<String> = alerts.iter().map(|a| anchor(&a.name)).collect();
    for heading in runbook.lines().filter_map(|l| l.strip_prefix("## Idem")) {
        let a = anchor(&format!("Idem{heading}"));
        assert!(
            names.contains(&a),
            "RUNBOOK.md: `## Idem{heading}` is no alert"
        );
    }
}

#[test]
fn the_dashboard_is_a_grafana_model_with_a_prometheus_datasource_variable() {
    let d: serde_json::Value = serde_json::from_str(&read("grafana/idem-dashboard.json")).unwrap();
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(
        vars.iter().any(|v| v["type"] == "datasource"
            && v["query"] == "prometheus"
            && v["name"] == "datasource"),
        "a `datasource` variable of type prometheus"
    );
    let mut ids = BTreeSet::new();
    for panel in d["panels"].as_array().unwrap() {
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "panel ids are unique"
        );
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{}",
                panel["title"]
            );
        }
    }
}

#[test]
fn promtool_accepts_the_rules() {
    let rules = deploy_dir().join("prometheus/idem-alerts.yml");
    let Ok(out) = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
    else {
        println!("promtool is not installed: `promtool check rules` skipped");
        return;
    };
    assert!(
        out.status.success(),
        "promtool check rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every series the alert rules and the dashboard read exists from the
/// gateway's start, at zero, before any request: an alert on a counter
/// that has not moved yet (`increase(...) > 0`) still has a series, and a
/// dashboard panel is not empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_alerted_series_exists_before_any_traffic() {
    let (_up, up) = upstream();
    let g = gateway(&up, "memory:", &support::SHORT_LIVED).await;
    let scrape = support::metrics_text(&g).await;
    let types = scraped_types(&scrape);
    let scraped: BTreeSet<&str> = types.iter().map(|(n, _)| n.as_str()).collect();
    let mut texts = vec![rules_text()];
    texts.extend(dashboard_exprs());
    let mut checked = 0;
    for text in &texts {
        for name in metric_names(text) {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .filter(|base| scraped.contains(base))
                .unwrap_or(&name);
            assert!(
                scraped.contains(base),
                "`{name}` has no series before traffic:\n{scrape}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "the deploy files name metrics ({checked})");
    for outcome in outcomes() {
        let series = format!("idem_requests_total{{outcome=\"{outcome}\"}} 0");
        assert!(scrape.contains(&series), "no {series}:\n{scrape}");
    }
    let closed = idem_gateway::UPSTREAM_CONNECTIONS_CLOSED;
    assert!(scrape.contains(&format!("{closed}{{reason=")), "{scrape}");
}
