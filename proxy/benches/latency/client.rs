//! HTTP/1 client plumbing for the bench: one keep-alive connection per [`Sender`] (hyper's low-level
//! `client::conn`, no pool in between, so the generator decides which connection carries what), and
//! a small reconnecting client for the proxy's admin port (`/metrics`, `/healthz`, the JSON API).

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::error::BenchError;

pub type Sender = SendRequest<Full<Bytes>>;

pub const CHAT_PATH: &str = "/v1/chat/completions";

/// Opens one keep-alive HTTP/1 connection; its driver runs as a task until either side closes it.
pub async fn connect(addr: SocketAddr) -> Result<Sender, BenchError> {
    let stream = TcpStream::connect(addr).await.map_err(|e| BenchError::io(format!("connect to {addr}"), e))?;
    let _ = stream.set_nodelay(true);
    let (sender, connection) =
        http1::handshake(TokioIo::new(stream)).await.map_err(|e| BenchError::http(format!("handshake with {addr}"), e))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// A chat-completions POST with a JSON body and extra headers.
pub fn post(addr: SocketAddr, body: Bytes, headers: &[(&'static str, String)]) -> http::Request<Full<Bytes>> {
    let mut request = http::Request::new(Full::new(body));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static(CHAT_PATH);
    let h = request.headers_mut();
    if let Ok(host) = http::HeaderValue::from_str(&addr.to_string()) {
        h.insert(http::header::HOST, host);
    }
    h.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    for (name, value) in headers {
        if let Ok(value) = http::HeaderValue::from_str(value) {
            h.insert(*name, value);
        }
    }
    request
}

/// Sends one request on `sender` and reads the whole response: (status, body).
pub async fn exchange(sender: &mut Sender, request: http::Request<Full<Bytes>>) -> Result<(u16, Bytes), BenchError> {
    sender.ready().await.map_err(|e| BenchError::http("connection not ready", e))?;
    let response = sender.send_request(request).await.map_err(|e| BenchError::http("send request", e))?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.map_err(|e| BenchError::http("read response body", e))?.to_bytes();
    Ok((status, body))
}

/// GETs on the proxy's admin port over one reused connection.
pub struct Admin {
    addr: SocketAddr,
    sender: Option<SendRequest<Empty<Bytes>>>,
}

impl Admin {
    pub fn new(addr: SocketAddr) -> Admin {
        Admin { addr, sender: None }
    }

    pub async fn get(&mut self, path: &'static str) -> Result<(u16, String), BenchError> {
        let result = self.try_get(path).await;
        if result.is_err() {
            self.sender = None;
        }
        result
    }

    async fn try_get(&mut self, path: &'static str) -> Result<(u16, String), BenchError> {
        let addr = self.addr;
        let sender = match &mut self.sender {
            Some(sender) if !sender.is_closed() => sender,
            _ => {
                let stream = TcpStream::connect(addr).await.map_err(|e| BenchError::io(format!("connect to admin {addr}"), e))?;
                let (sender, connection) =
                    http1::handshake(TokioIo::new(stream)).await.map_err(|e| BenchError::http("admin handshake", e))?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                self.sender.insert(sender)
            }
        };
        let mut request = http::Request::new(Empty::new());
        *request.uri_mut() = http::Uri::from_static(path);
        if let Ok(host) = http::HeaderValue::from_str(&addr.to_string()) {
            request.headers_mut().insert(http::header::HOST, host);
        }
        sender.ready().await.map_err(|e| BenchError::http("admin connection not ready", e))?;
        let response = sender.send_request(request).await.map_err(|e| BenchError::http(format!("GET {path}"), e))?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map_err(|e| BenchError::http(format!("GET {path} body"), e))?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// The sum of every series of metric `name` (all label sets) in the Prometheus text.
    pub async fn metric(&mut self, name: &str) -> Result<f64, BenchError> {
        let (_, text) = self.get("/metrics").await?;
        Ok(metric_sum(&text, name))
    }
}

/// Sums the samples of one metric name in Prometheus text format (0 when absent).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{')))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
