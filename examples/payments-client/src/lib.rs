//! A client of the payments example (`examples/axum-payments`) that makes
//! one payment, retried by `idem_retry::RetryMiddleware` under one
//! `Idempotency-Key` of its own.
//!
//! The key is made once per intent and written, with the payment, to an
//! intent file *before the first try*. A client that crashed or was
//! stopped without an answer is started again on the same file: it sends
//! the same payment under the same key, and the service replays the first
//! answer instead of paying twice. (A key the middleware generates itself
//! is only known once an answer came back, too late for that.)
//!
//! ```text
//! payments-client [--url URL] [--token TOKEN] INTENT_FILE [AMOUNT CURRENCY TO]
//! ```
//!
//! The payment's fields are needed only when the intent file does not
//! exist yet. It prints the status, whether the answer was a replay
//! (`Idempotent-Replayed: true`), the key sent and the body; it exits 0 on
//! a 2xx.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest_middleware::ClientWithMiddleware;
use serde::{Deserialize, Serialize};

/// Errors of this example, boxed.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Where the service listens unless `--url` says otherwise.
pub const DEFAULT_URL: &str = "http://127.0.0.1:3000";
/// The credential sent unless `--token` says otherwise. The service scopes
/// keys by `Authorization`: a retry must send the same one.
pub const DEFAULT_TOKEN: &str = "Bearer payments-client-0123456789";

/// The payment asked for, as the service reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewPayment {
    /// In the currency's smallest unit (cents).
    pub amount: u64,
    /// An ISO 4217 code.
    pub currency: String,
    /// Who is paid.
    pub to: String,
}

/// One intent: the payment and the key it is sent under, every time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// The `Idempotency-Key`: a UUID v4 made by this client.
    pub key: String,
    /// What is sent under it.
    pub payment: NewPayment,
}

impl Intent {
    /// The intent in `path`; or, if there is none, a new one for `payment`
    /// with a fresh key, written to `path` (durably, before it is
    /// returned: the key must exist before anything is sent).
    ///
    /// # Errors
    /// The file cannot be read, written or parsed; `payment` is `None` and
    /// there is no file; or the file holds another payment than `payment`
    /// (a new payment needs a new intent file).
    pub fn load_or_create(path: &Path, payment: Option<NewPayment>) -> Result<Intent, BoxError> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let intent: Intent = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("{}: not an intent file: {e}", path.display()))?;
                match payment {
                    Some(p) if p != intent.payment => Err(format!(
                        "{} holds another payment ({:?}); use a new intent file for a new payment",
                        path.display(),
                        intent.payment
                    )
                    .into()),
                    _ => Ok(intent),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let Some(payment) = payment else {
                    return Err(format!(
                        "{}: no intent file; give AMOUNT CURRENCY TO to make one",
                        path.display()
                    )
                    .into());
                };
                let intent = Intent {
                    key: uuid::Uuid::new_v4().to_string(),
                    payment,
                };
                write_durably(path, &serde_json::to_vec_pretty(&intent)?)?;
                Ok(intent)
            }
            Err(e) => Err(format!("{}: {e}", path.display()).into()),
        }
    }
}

/// Writes `bytes` to `path` through a temporary file, synced and renamed,
/// so a crash leaves either no intent or the whole of it.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The service's base URL.
    pub url: String,
    /// The `Authorization` header.
    pub token: String,
    /// Where the intent is kept.
    pub intent_file: PathBuf,
    /// The payment, for a new intent file.
    pub payment: Option<NewPayment>,
}

/// How to call the binary.
pub const USAGE: &str =
    "usage: payments-client [--url URL] [--token TOKEN] INTENT_FILE [AMOUNT CURRENCY TO]";

impl Args {
    /// Reads the arguments after the program's name.
    ///
    /// # Errors
    /// An unknown option, a missing value, or a malformed amount.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Args, BoxError> {
        let mut url = DEFAULT_URL.to_owned();
        let mut token = DEFAULT_TOKEN.to_owned();
        let mut positional = Vec::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--url" => url = args.next().ok_or("--url needs a value")?,
                "--token" => token = args.next().ok_or("--token needs a value")?,
                s if s.starts_with("--") => return Err(format!("unknown option {s}").into()),
                _ => positional.push(arg),
            }
        }
        let (intent_file, payment) = match positional.as_slice() {
            [file] => (file, None),
            [file, amount, currency, to] => {
                let amount = amount
                    .parse()
                    .map_err(|e| format!("AMOUNT {amount:?}: {e}"))?;
                let payment = NewPayment {
                    amount,
                    currency: currency.clone(),
                    to: to.clone(),
                };
                (file, Some(payment))
            }
            _ => return Err(USAGE.into()),
        };
        Ok(Args {
            url: url.trim_end_matches('/').to_owned(),
            token,
            intent_file: PathBuf::from(intent_file),
            payment,
        })
    }
}

/// The service's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The final status, after any retries.
    pub status: u16,
    /// `Idempotent-Replayed: true`: the service answered from its record,
    /// and the payment was made by an earlier try.
    pub replayed: bool,
    /// The key the middleware sent (`idem_retry::SentKey`).
    pub key: Option<String>,
    /// The body, as text.
    pub body: String,
}

impl Outcome {
    /// A 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "status: {}", self.status)?;
        writeln!(f, "replayed: {}", self.replayed)?;
        writeln!(f, "key: {}", self.key.as_deref().unwrap_or("(none)"))?;
        write!(f, "body: {}", self.body)
    }
}

/// A reqwest client with idem's retry middleware (3 attempts, jittered
/// backoff, `Retry-After` honoured, a retry budget). With the `tls`
/// feature (a default), https:// URLs work: rustls on ring, installed here
/// as the process's provider.
///
/// # Errors
/// reqwest cannot build its client.
pub fn client() -> Result<ClientWithMiddleware, BoxError> {
    // Already installed (a second client, or the application's own): fine.
    #[cfg(feature = "tls")]
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        // Above the service's wait limit for a duplicate in flight.
        .timeout(Duration::from_secs(30))
        .build()?;
    Ok(reqwest_middleware::ClientBuilder::new(http)
        .with(idem_retry::RetryMiddleware::new(
            idem_retry::RetryPolicy::default(),
        ))
        .build())
}

/// Sends `intent` to `POST {url}/payments` under its key.
///
/// # Errors
/// No answer after the retries (the intent file is kept: run again), or
/// the middleware's own failure (an `idem_retry::RetryError`).
pub async fn pay(
    client: &ClientWithMiddleware,
    url: &str,
    token: &str,
    intent: &Intent,
) -> Result<Outcome, BoxError> {
    let response = client
        .post(format!("{url}/payments"))
        .header(reqwest::header::AUTHORIZATION, token)
        // An RFC 8941 sf-string, as the IETF draft writes it.
        .header(
            idem_retry::header_names::IDEMPOTENCY_KEY,
            format!("\"{}\"", intent.key),
        )
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&intent.payment)?)
        .send()
        .await
        .map_err(|e| -> BoxError {
            match e {
                reqwest_middleware::Error::Middleware(e) => {
                    match e.downcast::<idem_retry::RetryError>() {
                        Ok(retry) => Box::new(retry),
                        Err(other) => other.into(),
                    }
                }
                reqwest_middleware::Error::Reqwest(e) => Box::new(e),
            }
        })?;
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get(idem_retry::header_names::IDEMPOTENT_REPLAYED)
        .is_some_and(|v| v == "true");
    let key = response
        .extensions()
        .get::<idem_retry::SentKey>()
        .map(|k| k.0.to_string());
    let body = response.text().await?;
    Ok(Outcome {
        status,
        replayed,
        key,
        body,
    })
}

/// What the binary does: load or make the intent, send it, and return the
/// answer.
///
/// # Errors
/// As [`Args::parse`], [`Intent::load_or_create`], [`client`] and [`pay`].
pub async fn run(args: impl IntoIterator<Item = String>) -> Result<Outcome, BoxError> {
    let args = Args::parse(args)?;
    let intent = Intent::load_or_create(&args.intent_file, args.payment)?;
    pay(&client()?, &args.url, &args.token, &intent).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is a failed assertion

    use super::*;

    fn args(list: &[&str]) -> Result<Args, BoxError> {
        Args::parse(list.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn the_command_line_is_read_as_documented() {
        let a = args(&["--url", "http://h:1/", "i.json", "1250", "EUR", "acct_42"]).unwrap();
        assert_eq!(a.url, "http://h:1");
        assert_eq!(a.token, DEFAULT_TOKEN);
        assert_eq!(a.intent_file, PathBuf::from("i.json"));
        assert_eq!(a.payment.unwrap().amount, 1250);
        assert_eq!(args(&["i.json"]).unwrap().payment, None);
        assert_eq!(args(&["i.json"]).unwrap().url, DEFAULT_URL);
        for bad in [
            &[][..],
            &["i.json", "1"],
            &["--url"],
            &["--nope", "i.json"],
            &["i", "x", "EUR", "a"],
        ] {
            assert!(args(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_intent_keeps_its_key_and_its_payment() {
        let dir = std::env::temp_dir().join(format!("payments-client-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("intent.json");
        let payment = NewPayment {
            amount: 5,
            currency: "EUR".to_owned(),
            to: "acct_1".to_owned(),
        };
        assert!(Intent::load_or_create(&path, None).is_err());
        let made = Intent::load_or_create(&path, Some(payment.clone())).unwrap();
        assert!(made.key.len() >= 16, "{}", made.key);
        assert_eq!(Intent::load_or_create(&path, None).unwrap(), made);
        assert_eq!(
            Intent::load_or_create(&path, Some(payment.clone())).unwrap(),
            made
        );
        let other = NewPayment {
            amount: 6,
            ..payment
        };
        assert!(Intent::load_or_create(&path, Some(other)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
