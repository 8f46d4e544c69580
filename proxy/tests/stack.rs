//! The proxy's tower stack (`ctxscope_proxy::stack`) driven with `oneshot` over an in-memory
//! upstream, no socket: the client gets the upstream's bytes exactly, and the capture queue gets the
//! exchange as it passed (request, response, status, outcome); non-LLM paths pass uncaptured, and an
//! announced body over the limit is refused before the upstream sees it.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctxscope_proxy::body::{full, ProxyBody};
use ctxscope_proxy::capture::exchange::{Exchange, Outcome};
use ctxscope_proxy::capture::layer::CaptureSettings;
use ctxscope_proxy::capture::queue::{self, Sink};
use ctxscope_proxy::responses_state::ResponsesStateLayer;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// The exchanges the capture queue delivered.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<Exchange>>>);

impl Sink for Recorded {
    fn process(&mut self, exchange: Exchange) {
        self.0.lock().unwrap().push(exchange);
    }
}

impl Recorded {
    fn wait_for(&self, n: usize) -> Vec<Exchange> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.0.lock().unwrap().len() < n {
            assert!(Instant::now() < deadline, "the capture queue got {} exchanges, expected {n}", self.0.lock().unwrap().len());
            std::thread::sleep(Duration::from_millis(5));
        }
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// A body of the given frames, one per poll.
struct Frames(std::collections::VecDeque<Bytes>);

impl hyper::body::Body for Frames {
    type Data = Bytes;
    type Error = ctxscope_proxy::body::BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, ctxscope_proxy::body::BodyError>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

const SSE: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Pa\"}}]}\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"ris\"}}]}\n\ndata: [DONE]\n\n";

/// An upstream that answers every request with the SSE stream above, in three uneven frames, and
/// counts what it was sent.
fn upstream(
    calls: Arc<Mutex<Vec<Bytes>>>,
) -> impl tower::Service<Request<ProxyBody>, Response = Response<ProxyBody>, Error = Infallible, Future: Send> + Clone + Send + 'static {
    tower::service_fn(move |request: Request<ProxyBody>| {
        let calls = calls.clone();
        async move {
            let body = request.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            calls.lock().unwrap().push(body);
            let body = Frames([&SSE[..7], &SSE[7..70], &SSE[70..]].iter().map(|s| Bytes::from(s.to_string())).collect()).boxed_unsync();
            Ok::<_, Infallible>(Response::builder().status(200).header("content-type", "text/event-stream").body(body).unwrap())
        }
    })
}

#[tokio::test]
async fn the_stack_passes_bytes_through_and_captures_the_exchange_without_a_socket() {
    let recorded = Recorded::default();
    let (sender, worker) = queue::spawn(recorded.clone(), 16, Duration::from_secs(3600));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let settings = CaptureSettings { session_header: None, max_capture_bytes: 1 << 20, max_request_bytes: 1024, findings_header: None };
    let service = ctxscope_proxy::stack(settings, sender, ResponsesStateLayer::new(false, None), upstream(calls.clone()));

    let request_body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Capital of France?"}]}"#;
    let request = Request::post("/v1/chat/completions").header("authorization", "Bearer k").body(full(request_body)).unwrap();
    let response = service.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(bytes, SSE.as_bytes(), "the client gets the upstream's bytes exactly");
    assert_eq!(calls.lock().unwrap().as_slice(), [Bytes::from(request_body)], "the upstream got the request as sent");

    let exchange = recorded.wait_for(1).pop().unwrap();
    assert_eq!((exchange.method.as_str(), exchange.path.as_str()), ("POST", "/v1/chat/completions"));
    assert_eq!(exchange.request.lock().unwrap().to_vec(), request_body.as_bytes());
    assert_eq!(exchange.response.to_vec(), SSE.as_bytes());
    assert_eq!((exchange.status, exchange.outcome, exchange.frames), (Some(200), Outcome::Complete, 3));
    assert!(exchange.response.complete);
    assert!(exchange.authorization.as_ref().is_some_and(|v| v.is_sensitive()), "the key travels marked sensitive, for counting only");

    // Not an LLM endpoint: forwarded, not captured.
    let response = service.clone().oneshot(Request::get("/v1/models").body(full("")).unwrap()).await.unwrap();
    assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), SSE.as_bytes());
    // Over the announced limit: refused here, never sent upstream.
    let big = Request::post("/v1/chat/completions").header("content-length", "4096").body(full(vec![b' '; 4096])).unwrap();
    let response = service.oneshot(big).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(calls.lock().unwrap().len(), 2, "the oversized request never reached the upstream");
    assert!(worker.join(Duration::from_secs(5)));
    assert!(recorded.0.lock().unwrap().is_empty(), "neither the models call nor the refused request was captured");
}
