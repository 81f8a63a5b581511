//! The layer's logs, in process: the handler runs inside the caller's span
//! although it executes in a task of its own, and each keyed request ends
//! with one debug event that names its key only by its hash.

#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{Key, MemoryStore};
use idem_http::IdempotencyLayer;
use tokio::sync::{Notify, Semaphore};
use tower::{Layer, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::{Event, Instrument, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One event as the recorder saw it.
#[derive(Debug, Clone)]
struct Seen {
    level: tracing::Level,
    message: String,
    fields: BTreeMap<String, String>,
    /// The names of the spans the event is in, innermost first.
    spans: Vec<String>,
}

/// A subscriber layer that keeps every event with the spans around it.
#[derive(Debug, Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Seen>>>);

impl Recorder {
    fn events(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    fn named(&self, message: &str) -> Vec<Seen> {
        let all = self.events();
        all.into_iter().filter(|e| e.message == message).collect()
    }
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S> tracing_subscriber::Layer<S> for Recorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let message = fields.0.remove("message").unwrap_or_default();
        let spans = ctx
            .event_scope(event)
            .map(|scope| scope.map(|span| span.name().to_owned()).collect())
            .unwrap_or_default();
        self.0.lock().unwrap().push(Seen {
            level: *event.metadata().level(),
            message,
            fields: fields.0,
            spans,
        });
    }
}

/// Steers the `/gated` handler.
struct Gate {
    open: Semaphore,
    entered: Notify,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            open: Semaphore::new(0),
            entered: Notify::new(),
        }
    }
}

/// The service behind the layer: logs from inside the handler, then
/// answers by path (`/orders` 201, `/flaky` 503, `/gated` 201 once the
/// gate opens).
fn service(
    gate: Arc<Gate>,
) -> impl tower::Service<
    Request<idem_http::Body>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |req: Request<idem_http::Body>| {
        let gate = gate.clone();
        async move {
            tracing::info!(path = req.uri().path(), "in the handler");
            let status = match req.uri().path() {
                "/flaky" => StatusCode::SERVICE_UNAVAILABLE,
                "/gated" => {
                    gate.entered.notify_one();
                    gate.open.acquire().await.unwrap().forget();
                    StatusCode::CREATED
                }
                _ => StatusCode::CREATED,
            };
            let response = Response::builder()
                .status(status)
                .body(Full::new(Bytes::from_static(b"done")))
                .unwrap();
            Ok::<_, Infallible>(response)
        }
    })
}

fn post(path: &str, key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

fn subscriber(recorder: &Recorder) -> impl Subscriber + Send + Sync {
    tracing_subscriber::registry().with(recorder.clone())
}

/// A span the caller opens around the service call (a `TraceLayer`, an
/// OpenTelemetry request span) covers the handler's events, although the
/// handler runs in the layer's own task.
#[tokio::test]
async fn the_handler_runs_in_the_callers_span() {
    let recorder = Recorder::default();
    // Thread-local, and the current-thread runtime runs the layer's task
    // on this thread too.
    let _default = tracing::subscriber::set_default(subscriber(&recorder));
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(service(Arc::default()));

    let span = tracing::info_span!("caller_request");
    let response = svc
        .oneshot(post("/orders", "span-test-key-000001", "{}"))
        .instrument(span)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);

    let inside = recorder.named("in the handler");
    assert_eq!(inside.len(), 1, "{:?}", recorder.events());
    assert_eq!(
        inside[0].spans,
        ["caller_request"],
        "the handler's event is in the caller's span"
    );
    let finished = recorder.named("request finished");
    assert_eq!(finished.len(), 1, "{:?}", recorder.events());
    assert_eq!(finished[0].spans, ["caller_request"]);
}

/// One debug event per keyed request, with its operation, outcome, status
/// and duration; the key appears only as its hash, in every event.
#[tokio::test]
async fn each_keyed_request_ends_with_one_debug_event() {
    let recorder = Recorder::default();
    let _default = tracing::subscriber::set_default(subscriber(&recorder));
    let gate = Arc::new(Gate::default());
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(service(gate.clone()));
    let call = |req| svc.clone().oneshot(req);

    let key = "log-test-key-000001";
    let status = |r: Response<idem_http::Body>| r.status();
    assert_eq!(status(call(post("/orders", key, "{}")).await.unwrap()), 201);
    assert_eq!(status(call(post("/orders", key, "{}")).await.unwrap()), 201);
    assert_eq!(
        status(call(post("/orders", key, "[1]")).await.unwrap()),
        422
    );
    let flaky = "log-test-key-000002";
    assert_eq!(
        status(call(post("/flaky", flaky, "{}")).await.unwrap()),
        503
    );
    // A duplicate while the first is running.
    let gated = "log-test-key-000003";
    let first = tokio::spawn(call(post("/gated", gated, "{}")));
    gate.entered.notified().await;
    assert_eq!(
        status(call(post("/gated", gated, "{}")).await.unwrap()),
        409
    );
    gate.open.add_permits(1);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 201);
    first.into_body().collect().await.unwrap();

    let finished = recorder.named("request finished");
    let summary: Vec<(&str, &str, &str, &str)> = finished
        .iter()
        .map(|e| {
            (
                e.fields["operation"].as_str(),
                e.fields["outcome"].as_str(),
                e.fields["status"].as_str(),
                e.fields["key"].as_str(),
            )
        })
        .collect();
    let hash = |k: &str| Key::new(k).unwrap().log_id();
    let (h1, h2, h3) = (hash(key), hash(flaky), hash(gated));
    assert_eq!(
        summary,
        [
            ("POST /orders", "executed", "201", h1.as_str()),
            ("POST /orders", "replayed", "201", h1.as_str()),
            ("POST /orders", "mismatch", "422", h1.as_str()),
            ("POST /flaky", "released", "503", h2.as_str()),
            ("POST /gated", "conflict", "409", h3.as_str()),
            ("POST /gated", "executed", "201", h3.as_str()),
        ]
    );
    for e in &finished {
        assert_eq!(e.level, tracing::Level::DEBUG);
        let ms: f64 = e.fields["duration_ms"].parse().unwrap();
        assert!((0.0..60_000.0).contains(&ms), "{ms}");
    }
    for e in recorder.events() {
        let text = format!("{} {:?}", e.message, e.fields);
        for raw in [key, flaky, gated] {
            assert!(!text.contains(raw), "a raw key in {text}");
        }
    }
}
