//! The probe: its client, budget and target, and sending one request
//! with evidence kept and secrets redacted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use crate::budget::Budget;
use crate::catalog::CHECKS;
use crate::client::{HttpClient, Response};
use crate::detect::{Answer, Detection, Seen, count_at, id_at};
use crate::error::Error;
use crate::report::Exchange;
use crate::target::{Header, Redactor, Target, header_pair, is_sensitive, redacted_url};

/// The most concurrent requests a probe sends: a check, not a load test
/// (and each answer in flight may hold up to 1 MiB).
pub const MAX_CONCURRENCY: u32 = 64;

/// How the probe runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Requests to the target at most (default 40).
    pub max_requests: u32,
    /// Concurrent requests at most, and the N of the concurrency check
    /// (default 4, at most [`MAX_CONCURRENCY`]; below 2 that check is not
    /// applicable).
    pub concurrency: u32,
    /// Pause between checks (default 100 ms).
    pub pause: Duration,
    /// Timeout of each request (default 10 s).
    pub timeout: Duration,
    /// Checks not to run, by name.
    pub skip: Vec<String>,
    /// PEM certificates an `https://` target must chain to (only these);
    /// `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            max_requests: 40,
            concurrency: 4,
            pause: Duration::from_millis(100),
            timeout: Duration::from_secs(10),
            skip: Vec::new(),
            ca_pem: None,
        }
    }
}

/// A configured probe: a target, how executions are detected, options.
pub struct Probe {
    pub(crate) client: HttpClient,
    pub(crate) target: Target,
    pub(crate) detection: Detection,
    pub(crate) options: Options,
    pub(crate) redactor: Redactor,
    pub(crate) budget: Budget,
    effect_reads: AtomicU32,
    /// Ids of successful answers, by tenant and path (an API may number
    /// each tenant's or each route's resources on its own), each with the
    /// key it was first answered to, to count executions.
    ids: Mutex<HashMap<(bool, String, String), Option<String>>>,
    /// One id was answered to two different keys (or to a key and to no
    /// key): ids do not tell executions apart on this API.
    ids_shared: AtomicBool,
    /// What the checks that read the whole run need of every answer.
    pub(crate) answers: Mutex<Vec<Seen>>,
    /// The replay seen by `retry-replays-response`, for `replay-marked`,
    /// and whether it was told a replay by resource ids alone.
    pub(crate) replay: Mutex<Option<(Answer, bool)>>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The target's Debug hides its secrets; answers are not shown.
        f.debug_struct("Probe")
            .field("target", &self.target)
            .field("options", &self.options.max_requests)
            .finish_non_exhaustive()
    }
}

/// One request: the target's URL, method and headers, with these parts.
#[derive(Debug, Clone)]
pub(crate) struct Req {
    pub(crate) url: url::Url,
    pub(crate) body: Vec<u8>,
    pub(crate) key: Option<String>,
    pub(crate) second_tenant: bool,
}

impl Probe {
    /// Builds a probe. Fails with [`crate::ErrorKind::Input`] when a
    /// `--skip` name is not a check's, or a concurrency of 0;
    /// [`crate::ErrorKind::Client`] when the HTTP client cannot be built.
    pub fn new(target: Target, detection: Detection, options: Options) -> Result<Probe, Error> {
        for name in &options.skip {
            if !CHECKS.iter().any(|c| c.name == name) {
                return Err(Error::input(format!(
                    "--skip {name}: no such check (the checks: {})",
                    CHECKS.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
                )));
            }
        }
        if !(1..=MAX_CONCURRENCY).contains(&options.concurrency) {
            return Err(Error::input(format!(
                "--concurrency must be from 1 to {MAX_CONCURRENCY}"
            )));
        }
        if options.timeout.is_zero() {
            return Err(Error::input("--timeout must be more than zero"));
        }
        target.check()?;
        let https = std::iter::once(&target.url)
            .chain(&target.other_url)
            .chain(&detection.effect_url)
            .any(|u| u.scheme() == "https");
        let client = HttpClient::new(
            options.ca_pem.as_deref(),
            https,
            options.concurrency as usize,
            options.timeout,
        )?;
        Ok(Probe {
            client,
            redactor: target.redactor(),
            budget: Budget::new(options.max_requests),
            target,
            detection,
            options,
            effect_reads: AtomicU32::new(0),
            ids: Mutex::default(),
            ids_shared: AtomicBool::new(false),
            answers: Mutex::default(),
            replay: Mutex::default(),
        })
    }

    /// Mutating requests sent, effect reads, and distinct resource ids
    /// seen in successful answers.
    pub(crate) fn counts(&self) -> (u32, u32, u64) {
        let ids = self.ids.lock().map(|i| i.len() as u64).unwrap_or(0);
        (
            self.budget.sent(),
            self.effect_reads.load(Ordering::SeqCst),
            ids,
        )
    }

    /// Whether one resource id was answered under two different keys:
    /// then ids cannot tell a replay from a second execution.
    pub(crate) fn ids_shared(&self) -> bool {
        self.ids_shared.load(Ordering::SeqCst)
    }

    /// A fresh random key.
    pub(crate) fn key(&self) -> String {
        format!("idem-probe-{}", uuid::Uuid::new_v4().simple())
    }

    /// The plain request with a key.
    pub(crate) fn req(&self, key: Option<String>) -> Req {
        Req {
            url: self.target.url.clone(),
            body: self.target.body.clone(),
            key,
            second_tenant: false,
        }
    }

    /// Sends `req` after taking one request from the budget; the exchange
    /// goes to `evidence`. Fails with the reason when the budget is spent
    /// or the request failed.
    pub(crate) async fn send(
        &self,
        req: &Req,
        evidence: &Mutex<Vec<Exchange>>,
    ) -> Result<Answer, String> {
        if !self.budget.take(1) {
            return Err(format!(
                "the request budget (--max-requests {}) is spent",
                self.options.max_requests
            ));
        }
        self.send_taken(req, evidence).await
    }

    /// Sends `req` from budget already taken.
    pub(crate) async fn send_taken(
        &self,
        req: &Req,
        evidence: &Mutex<Vec<Exchange>>,
    ) -> Result<Answer, String> {
        let mut shown = Vec::new();
        let mut headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
        let mut has_type = false;
        let credential = if req.second_tenant {
            self.target.second_credential.as_ref()
        } else {
            self.target.credential.as_ref()
        };
        // Each header once: sent as given, shown redacted.
        for h in &self.target.headers {
            has_type |= h.name.eq_ignore_ascii_case("content-type");
            shown.push(show(h));
            headers.push(h.to_http()?);
        }
        if let Some(c) = credential {
            shown.push(format!(
                "{}: <redacted{}>",
                c.name,
                if req.second_tenant { " 2nd" } else { "" }
            ));
            headers.push(c.to_http()?);
        }
        if let Some(k) = &req.key {
            shown.push(format!("{}: {k}", self.target.key_header));
            headers.push(header_pair(&self.target.key_header, k)?);
        }
        if !has_type {
            headers.push((
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ));
        }
        let request = format!(
            "{} {} [{}]",
            self.target.method,
            redacted_url(&req.url),
            shown.join("; ")
        );
        // Redacted whole, then cut: a secret across the cut is hidden too.
        let request_body = snippet(&self.redactor.redact(&String::from_utf8_lossy(&req.body)));
        let result = self
            .client
            .send(
                self.target.method.clone(),
                &req.url,
                headers,
                req.body.clone(),
            )
            .await
            .map(|response| self.answer(response));
        let answer_text = match &result {
            Ok(a) => describe(a, &self.redactor),
            Err(e) => self.redactor.redact(e),
        };
        if let Ok(mut ev) = evidence.lock() {
            ev.push(Exchange {
                request: self.redactor.redact(&request),
                request_body,
                answer: answer_text,
            });
        }
        if let Ok(a) = &result {
            if let Ok(mut all) = self.answers.lock() {
                all.push(Seen::of(a));
            }
            if let (true, Some(id), Ok(mut ids)) = (a.is_success(), &a.id, self.ids.lock()) {
                let first_key = ids
                    .entry((req.second_tenant, req.url.path().to_owned(), id.clone()))
                    .or_insert_with(|| req.key.clone());
                if *first_key != req.key {
                    self.ids_shared.store(true, Ordering::SeqCst);
                }
            }
        }
        result
    }

    fn answer(&self, response: Response) -> Answer {
        let header = |name: &str| {
            response
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let status = response.status;
        let content_type = header("content-type");
        let location = header("location");
        let retry_after = header("retry-after");
        let replayed = header("idempotent-replayed");
        let expires = header("idempotency-key-expires");
        let body = String::from_utf8_lossy(&response.body).into_owned();
        let id = match &self.detection.id_pointer {
            Some(p) if (200..300).contains(&status) => id_at(&body, p),
            _ => None,
        }
        .or_else(|| location.clone().filter(|_| (200..300).contains(&status)));
        Answer {
            status,
            content_type,
            location,
            retry_after,
            replayed,
            expires,
            body,
            id,
        }
    }

    /// The effect count, if `--effect-url` is given and answers.
    pub(crate) async fn effect_count(&self, evidence: &Mutex<Vec<Exchange>>) -> Option<i64> {
        let url = self.detection.effect_url.clone()?;
        self.effect_reads.fetch_add(1, Ordering::SeqCst);
        let mut headers = Vec::new();
        if let Some(c) = &self.target.credential {
            match c.to_http() {
                Ok(h) => headers.push(h),
                Err(e) => return self.effect_failed(&url, &e, evidence),
            }
        }
        let sent = self
            .client
            .send(http::Method::GET, &url, headers, Vec::new())
            .await;
        let (count, text) = match sent {
            Ok(r) if (200..300).contains(&r.status) => {
                let body = String::from_utf8_lossy(&r.body);
                (
                    count_at(&body, &self.detection.effect_pointer),
                    snippet(&self.redactor.redact(&body)),
                )
            }
            Ok(r) => (None, r.status.to_string()),
            Err(e) => (None, self.redactor.redact(&e)),
        };
        if let Ok(mut ev) = evidence.lock() {
            ev.push(Exchange {
                request: format!("GET {} (effect count)", redacted_url(&url)),
                request_body: String::new(),
                answer: text,
            });
        }
        count
    }

    fn effect_failed(
        &self,
        url: &url::Url,
        reason: &str,
        evidence: &Mutex<Vec<Exchange>>,
    ) -> Option<i64> {
        if let Ok(mut ev) = evidence.lock() {
            ev.push(Exchange {
                request: format!("GET {} (effect count)", redacted_url(url)),
                request_body: String::new(),
                answer: self.redactor.redact(reason),
            });
        }
        None
    }
}

fn show(h: &Header) -> String {
    if is_sensitive(&h.name) {
        format!("{}: <redacted>", h.name)
    } else {
        format!("{}: {}", h.name, h.value)
    }
}

/// The first 300 characters of `text`.
pub(crate) fn snippet(text: &str) -> String {
    let mut s: String = text.chars().take(300).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}

fn describe(a: &Answer, redactor: &Redactor) -> String {
    let mut parts = vec![a.status.to_string()];
    for (name, v) in [
        ("Content-Type", &a.content_type),
        ("Location", &a.location),
        ("Retry-After", &a.retry_after),
        ("Idempotent-Replayed", &a.replayed),
        ("Idempotency-Key-Expires", &a.expires),
    ] {
        if let Some(v) = v {
            parts.push(format!("{name}: {v}"));
        }
    }
    redactor.redact(&format!(
        "{} {}",
        parts.join("; "),
        snippet(&redactor.redact(&a.body))
    ))
}
