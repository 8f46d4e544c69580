//! Health signals that follow the truth: the capture queue gauge falls back to 0 once the queue is
//! drained (it kept its last figure before), and `/healthz` reports capture `on` while writes succeed.
//! The full-disk half (`degraded` while writes fail, `on` again after) is in tests/disk_full.rs.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::upstream::Upstream;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_depth_gauge_returns_to_zero_when_drained() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::builder(&up.url(), dir.path()).start();
    let url = format!("{}/v1/chat/completions", proxy.url());
    for i in 0..8 {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": format!("question {i}")}]});
        assert_eq!(post_json(&url, &[], &body).await.status, 200);
    }
    proxy.wait_turns(8).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let depth = metric_value(&proxy.admin_url(), "ctxscope_capture_queue_depth").await;
        if depth == Some(0.0) {
            break;
        }
        assert!(Instant::now() < deadline, "queue drained but ctxscope_capture_queue_depth is {depth:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let health = get_json(&format!("{}/healthz", proxy.admin_url())).await;
    assert_eq!(health["capture"], "on", "{health}");
    assert!(health.get("reason").is_none(), "{health}");
    proxy.stop();
}
