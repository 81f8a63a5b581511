//! The probe: its client, budget and target, and sending one request
//! with evidence kept and secrets redacted.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::budget::Budget;
use crate::catalog::CHECKS;
use crate::detect::{Answer, Detection, count_at, id_at};
use crate::error::Error;
use crate::report::Exchange;
use crate::target::{Header, Redactor, Target, is_sensitive, is_sensitive_query};

/// How the probe runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Requests to the target at most (default 40).
    pub max_requests: u32,
    /// Concurrent requests at most, and the N of the concurrency check
    /// (default 4; below 2 that check is not applicable).
    pub concurrency: u32,
    /// Pause between checks (default 100 ms).
    pub pause: Duration,
    /// Timeout of each request (default 10 s).
    pub timeout: Duration,
    /// Checks not to run, by name.
    pub skip: Vec<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            max_requests: 40,
            concurrency: 4,
            pause: Duration::from_millis(100),
            timeout: Duration::from_secs(10),
            skip: Vec::new(),
        }
    }
}

/// A configured probe: a target, how executions are detected, options.
#[derive(Debug)]
pub struct Probe {
    pub(crate) client: reqwest::Client,
    pub(crate) target: Target,
    pub(crate) detection: Detection,
    pub(crate) options: Options,
    pub(crate) redactor: Redactor,
    pub(crate) budget: Budget,
    effect_reads: AtomicU32,
    /// Ids of successful answers, to count executions.
    ids: Mutex<HashSet<String>>,
    /// Every answer, for the checks that read the whole run.
    pub(crate) answers: Mutex<Vec<Answer>>,
    /// The replay seen by `retry-replays-response`, for `replay-marked`.
    pub(crate) replay: Mutex<Option<Answer>>,
}

/// One request: the target's URL, method and headers, with these parts.
#[derive(Debug, Clone)]
pub(crate) struct Req {
    pub(crate) url: reqwest::Url,
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
        if options.concurrency == 0 {
            return Err(Error::input("--concurrency must be at least 1"));
        }
        if options.timeout.is_zero() {
            return Err(Error::input("--timeout must be more than zero"));
        }
        target.check()?;
        let client = reqwest::Client::builder()
            .timeout(options.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(options.concurrency as usize)
            .build()
            .map_err(Error::client)?;
        Ok(Probe {
            client,
            redactor: target.redactor(),
            budget: Budget::new(options.max_requests),
            target,
            detection,
            options,
            effect_reads: AtomicU32::new(0),
            ids: Mutex::default(),
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
        let mut builder = self
            .client
            .request(self.target.method.clone(), req.url.clone())
            .body(req.body.clone());
        let mut has_type = false;
        for h in &self.target.headers {
            has_type |= h.name.eq_ignore_ascii_case("content-type");
            builder = builder.header(&h.name, &h.value);
            shown.push(show(h));
        }
        if !has_type {
            builder = builder.header("content-type", "application/json");
        }
        let credential = if req.second_tenant {
            self.target.second_credential.as_ref()
        } else {
            self.target.credential.as_ref()
        };
        if let Some(c) = credential {
            builder = builder.header(&c.name, &c.value);
            shown.push(format!(
                "{}: <redacted{}>",
                c.name,
                if req.second_tenant { " 2nd" } else { "" }
            ));
        }
        if let Some(k) = &req.key {
            builder = builder.header(&self.target.key_header, k);
            shown.push(format!("{}: {k}", self.target.key_header));
        }
        let request = format!(
            "{} {} [{}]",
            self.target.method,
            redacted_url(&req.url),
            shown.join("; ")
        );
        // Redacted whole, then cut: a secret across the cut is hidden too.
        let request_body = snippet(&self.redactor.redact(&String::from_utf8_lossy(&req.body)));
        let result = match builder.send().await {
            Ok(response) => Ok(self.answer(response).await),
            Err(e) => Err(format!("request failed: {e}")),
        };
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
                all.push(a.clone());
            }
            if let (true, Some(id), Ok(mut ids)) = (a.is_success(), &a.id, self.ids.lock()) {
                ids.insert(id.clone());
            }
        }
        result
    }

    async fn answer(&self, response: reqwest::Response) -> Answer {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let status = response.status().as_u16();
        let content_type = header("content-type");
        let location = header("location");
        let retry_after = header("retry-after");
        let replayed = header("idempotent-replayed");
        let expires = header("idempotency-key-expires")
            .map(|v| format!("Idempotency-Key-Expires: {v}"))
            .or_else(|| header("expires").map(|v| format!("Expires: {v}")));
        let body = match read_capped(response).await {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) => format!("<body unreadable: {e}>"),
        };
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
        let mut builder = self.client.get(url.clone());
        if let Some(c) = &self.target.credential {
            builder = builder.header(&c.name, &c.value);
        }
        let (count, text) = match builder.send().await {
            Ok(r) if r.status().is_success() => match read_capped(r).await {
                Ok(body) => {
                    let body = String::from_utf8_lossy(&body);
                    (
                        count_at(&body, &self.detection.effect_pointer),
                        snippet(&self.redactor.redact(&body)),
                    )
                }
                Err(e) => (None, format!("body unreadable: {e}")),
            },
            Ok(r) => (None, format!("{}", r.status())),
            Err(e) => (None, format!("request failed: {e}")),
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
}

fn show(h: &Header) -> String {
    if is_sensitive(&h.name) {
        format!("{}: <redacted>", h.name)
    } else {
        format!("{}: {}", h.name, h.value)
    }
}

pub(crate) fn redacted_url(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    if u.password().is_some() {
        let _ = u.set_password(Some("redacted"));
    }
    if u.query_pairs().any(|(name, _)| is_sensitive_query(&name)) {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(n, v)| {
                let v = if is_sensitive_query(&n) {
                    "redacted".into()
                } else {
                    v.into_owned()
                };
                (n.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

/// The first 300 characters of `text`.
pub(crate) fn snippet(text: &str) -> String {
    let mut s: String = text.chars().take(300).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}

/// The most of an answer's body the probe reads: past it the body is cut
/// (and marked), so that a server cannot fill the probe's memory.
const MAX_BODY: usize = 1 << 20;

/// The body, at most [`MAX_BODY`] bytes of it, then `…<cut>`.
async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = MAX_BODY - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            body.extend_from_slice("…<cut>".as_bytes());
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn describe(a: &Answer, redactor: &Redactor) -> String {
    let mut parts = vec![a.status.to_string()];
    for (name, v) in [
        ("Content-Type", &a.content_type),
        ("Location", &a.location),
        ("Retry-After", &a.retry_after),
        ("Idempotent-Replayed", &a.replayed),
    ] {
        if let Some(v) = v {
            parts.push(format!("{name}: {v}"));
        }
    }
    parts.extend(a.expires.clone());
    redactor.redact(&format!(
        "{} {}",
        parts.join("; "),
        snippet(&redactor.redact(&a.body))
    ))
}
