//! The engine's listener runs the proxy's serving loop (`ctxscope_http`): a connection that never
//! sends a request head is closed after the head timeout instead of holding a descriptor for ever,
//! and the server goes on answering others.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxscope_engine::scheduler::{self, EngineOptions};
use ctxscope_engine::{Model, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[test]
fn silent_connections_are_closed_after_the_head_timeout() {
    let path = common::model_path();
    let model = Arc::new(Model::load(&path).expect("model loads"));
    let (engine, _thread) = scheduler::start(model.clone(), EngineOptions::for_model(&model));
    let config = ServerConfig { header_timeout: Duration::from_millis(500), ..ServerConfig::default() };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let (addr, stop, server) = common::serve(engine, config).await;

        // Silent, then half a request head: both closed once the timeout passes.
        let mut silent = TcpStream::connect(addr).await.expect("connects");
        let mut partial = TcpStream::connect(addr).await.expect("connects");
        partial.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n").await.expect("writes");
        let started = Instant::now();
        for stream in [&mut silent, &mut partial] {
            let mut buf = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await;
            assert!(read.is_ok(), "the connection stayed open for 10 s");
        }
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(400), "closed before the timeout: {waited:?}");

        // Others are still served.
        let mut ok = TcpStream::connect(addr).await.expect("connects");
        ok.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.expect("writes");
        let mut raw = Vec::new();
        ok.read_to_end(&mut raw).await.expect("reads");
        let text = String::from_utf8_lossy(&raw);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");

        let _ = stop.send(());
        server.await.expect("server stops");
    });
}
