//! An OTLP/HTTP receiver for the `LATENCY_OTLP=1` variant: answers every POST at once with an empty
//! protobuf body (a full success) and counts requests and bytes, so that the proxy exporting to it pays
//! the whole export path (mapping, encoding, posting) while the receiver itself costs next to nothing.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::error::BenchError;

pub struct OtlpSink {
    pub addr: SocketAddr,
    pub posts: Arc<AtomicU64>,
    pub bytes: Arc<AtomicU64>,
}

impl OtlpSink {
    pub async fn start() -> Result<OtlpSink, BenchError> {
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| BenchError::io("bind the OTLP sink", e))?;
        let addr = listener.local_addr().map_err(|e| BenchError::io("OTLP sink address", e))?;
        let (posts, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (p, b) = (posts.clone(), bytes.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (p, b) = (p.clone(), b.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
                        let (p, b) = (p.clone(), b.clone());
                        async move {
                            let body = request.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                            p.fetch_add(1, Ordering::Relaxed);
                            b.fetch_add(body.len() as u64, Ordering::Relaxed);
                            let mut response = http::Response::new(Full::new(Bytes::new()));
                            response
                                .headers_mut()
                                .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/x-protobuf"));
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Ok(OtlpSink { addr, posts, bytes })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}
