//! The fake upstream: an accept loop, request recording, and response helpers.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// A response body: whole or streamed; a stream may end in an I/O error (a reset connection).
pub type Body = BoxBody<Bytes, std::io::Error>;

/// A request as the fake received it, its body read whole.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: http::Method,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Received {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// How the fake serves.
#[derive(Debug, Clone)]
pub struct Options {
    /// Keep every request for [`FakeUpstream::received`] (a benchmark turns this off).
    pub record: bool,
    /// `TCP_NODELAY` on accepted connections.
    pub nodelay: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { record: true, nodelay: false }
    }
}

type Script = dyn Fn(Received) -> Pin<Box<dyn Future<Output = http::Response<Body>> + Send>> + Send + Sync;

struct Shared {
    script: Box<Script>,
    options: Options,
    requests: AtomicU64,
    received: Mutex<Vec<Received>>,
}

/// A scripted upstream on `127.0.0.1`, serving until the runtime it started on ends.
pub struct FakeUpstream {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl FakeUpstream {
    /// Starts serving; each request is answered by `script`.
    pub async fn start<F, Fut>(script: F) -> FakeUpstream
    where
        F: Fn(Received) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = http::Response<Body>> + Send + 'static,
    {
        FakeUpstream::start_with(Options::default(), script).await
    }

    /// As [`FakeUpstream::start`], with `options`.
    pub async fn start_with<F, Fut>(options: Options, script: F) -> FakeUpstream
    where
        F: Fn(Received) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = http::Response<Body>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port for the fake upstream");
        FakeUpstream::serve(listener, options, script)
    }

    /// As [`FakeUpstream::start_with`], on a listener the caller bound (any address and port).
    pub fn serve<F, Fut>(listener: TcpListener, options: Options, script: F) -> FakeUpstream
    where
        F: Fn(Received) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = http::Response<Body>> + Send + 'static,
    {
        let addr = listener.local_addr().expect("the fake upstream's address");
        let script: Box<Script> = Box::new(move |received| Box::pin(script(received)));
        let shared = Arc::new(Shared { script, options, requests: AtomicU64::new(0), received: Mutex::new(Vec::new()) });
        let serving = shared.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                if serving.options.nodelay {
                    let _ = stream.set_nodelay(true);
                }
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| answer(shared.clone(), request));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        FakeUpstream { addr, shared }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Every request received so far (with [`Options::record`]).
    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

async fn answer(shared: Arc<Shared>, request: http::Request<Incoming>) -> Result<http::Response<Body>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let received = Received { method: parts.method, path: parts.uri.path().to_string(), headers: parts.headers, body };
    shared.requests.fetch_add(1, Ordering::SeqCst);
    if shared.options.record {
        shared.received.lock().unwrap_or_else(|p| p.into_inner()).push(received.clone());
    }
    Ok((shared.script)(received).await)
}

/// A whole response of `content_type`.
pub fn raw(status: u16, content_type: &str, body: impl Into<Bytes>) -> http::Response<Body> {
    let mut response = http::Response::new(Full::new(body.into()).map_err(|never| match never {}).boxed());
    *response.status_mut() = http::StatusCode::from_u16(status).expect("a valid status");
    response.headers_mut().insert(http::header::CONTENT_TYPE, content_type.parse().expect("a valid content type"));
    response
}

/// A whole JSON response.
pub fn json(status: u16, value: &serde_json::Value) -> http::Response<Body> {
    raw(status, "application/json", value.to_string())
}

/// A streamed response of `content_type` and the writer that feeds it: each [`StreamWriter::send`]
/// is one body frame; [`StreamWriter::reset`] ends the body with an error (the connection is cut);
/// dropping the writer ends it cleanly. The channel holds one frame, so a writer waits for the reader.
pub fn stream(status: u16, content_type: &str) -> (StreamWriter, http::Response<Body>) {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    let mut response = http::Response::new(BodyExt::boxed(Receiver(rx)));
    *response.status_mut() = http::StatusCode::from_u16(status).expect("a valid status");
    response.headers_mut().insert(http::header::CONTENT_TYPE, content_type.parse().expect("a valid content type"));
    (StreamWriter(tx), response)
}

/// Writes a streamed response ([`stream`]).
pub struct StreamWriter(mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>);

impl StreamWriter {
    /// Sends one frame; `false` once the reader has gone away.
    pub async fn send(&self, data: impl Into<Bytes>) -> bool {
        self.0.send(Ok(Frame::data(data.into()))).await.is_ok()
    }

    /// Cuts the stream with an error.
    pub async fn reset(self) {
        let _ = self.0.send(Err(std::io::Error::other("scripted reset"))).await;
    }

    /// Waits until the reader has gone away.
    pub async fn closed(&self) {
        self.0.closed().await
    }
}

/// An mpsc receiver as a body.
struct Receiver(mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>);

impl hyper::body::Body for Receiver {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.0.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn exchange(addr: SocketAddr, request: &str) -> String {
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        let _ = socket.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn scripts_answer_whole_and_streamed_bodies_and_requests_are_recorded() {
        let fake = FakeUpstream::start(|received: Received| async move {
            if received.path == "/stream" {
                let (writer, response) = stream(200, "text/event-stream");
                tokio::spawn(async move {
                    writer.send("data: 1\n\n").await;
                    writer.send("data: 2\n\n").await;
                });
                return response;
            }
            json(201, &serde_json::json!({"echo": received.json().unwrap_or_default()}))
        })
        .await;
        let whole = exchange(fake.addr, "POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 7\r\nconnection: close\r\n\r\n{\"a\":1}").await;
        assert!(whole.starts_with("HTTP/1.1 201") && whole.ends_with(r#"{"echo":{"a":1}}"#), "{whole}");
        let streamed = exchange(fake.addr, "GET /stream HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n").await;
        assert!(
            streamed.contains("text/event-stream") && streamed.contains("data: 1\n\n") && streamed.contains("data: 2\n\n"),
            "{streamed}"
        );
        assert_eq!(fake.requests(), 2);
        let received = fake.received();
        assert_eq!((received[0].method.as_str(), received[0].path.as_str(), &received[0].body[..]), ("POST", "/x", &b"{\"a\":1}"[..]));
    }
}
