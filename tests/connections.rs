//! Connection hygiene on the real binary: slow-header (slowloris) and silent connections are closed
//! after `--header-timeout`; under a 256 open-file limit with 300 idle connections held, `/healthz`
//! answers at once, the connections over the cap get a clear 503, and normal requests answer again
//! as soon as the idle ones time out.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::upstream::Upstream;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The proxy under `ulimit -n NOFILE` (soft and hard, so it cannot raise it), on free ports.
fn start(upstream: &str, data: &Path, nofile: u32, extra: &[&str]) -> (KillOnDrop, SocketAddr, SocketAddr) {
    start_logging(upstream, data, nofile, extra, Stdio::inherit())
}

fn start_logging(upstream: &str, data: &Path, nofile: u32, extra: &[&str], stderr: Stdio) -> (KillOnDrop, SocketAddr, SocketAddr) {
    let (port, admin) = (free_port(), free_port());
    let proxy: SocketAddr = ([127, 0, 0, 1], port).into();
    let admin: SocketAddr = ([127, 0, 0, 1], admin).into();
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
        .arg(bin())
        .args(["proxy", "--upstream", upstream, "--listen", &proxy.to_string(), "--admin", &admin.to_string()])
        .arg("--data")
        .arg(data)
        .args(extra)
        .env("CTXSCOPE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn ctxscope proxy");
    let child = KillOnDrop(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(admin).is_err() || std::net::TcpStream::connect(proxy).is_err() {
        assert!(Instant::now() < deadline, "proxy did not start listening");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, proxy, admin)
}

/// How long until the server closes `stream` (EOF or reset), sending `drip` one byte every 200 ms
/// meanwhile when given; `None` if it is still open after `limit`. Also returns what was read.
async fn closed_after(mut stream: TcpStream, drip: Option<&[u8]>, limit: Duration) -> (Option<Duration>, Vec<u8>) {
    let started = Instant::now();
    let mut read = Vec::new();
    let mut next = 0;
    let mut buf = [0u8; 1024];
    while started.elapsed() < limit {
        tokio::select! {
            n = stream.read(&mut buf) => match n {
                Ok(0) | Err(_) => return (Some(started.elapsed()), read),
                Ok(n) => read.extend_from_slice(&buf[..n]),
            },
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if let Some(drip) = drip {
                    let byte = [drip[next % drip.len()]];
                    next += 1;
                    if stream.write_all(&byte).await.is_err() {
                        return (Some(started.elapsed()), read);
                    }
                }
            }
        }
    }
    (None, read)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_connections_are_closed_after_the_header_timeout() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_child, proxy, admin) = start(&up.url(), dir.path(), 4096, &["--header-timeout", "2"]);
    let mut tasks = Vec::new();
    for i in 0..30 {
        let target = if i % 3 == 2 { admin } else { proxy };
        let mut stream = TcpStream::connect(target).await.unwrap();
        let drip: Option<&'static [u8]> = if i % 2 == 0 {
            // Slowloris: a request line, then a header that never ends, a byte at a time.
            stream.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n").await.unwrap();
            Some(b"x-slow-header-without-end")
        } else {
            None
        };
        tasks.push(tokio::spawn(closed_after(stream, drip, Duration::from_secs(10))));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let (closed, _) = task.await.unwrap();
        let closed = closed.unwrap_or_else(|| panic!("connection {i} still open after 10 s with --header-timeout 2"));
        assert!(closed >= Duration::from_millis(1500) && closed < Duration::from_secs(5), "connection {i} closed after {closed:?}");
    }
    // A keep-alive connection idle after its response is closed too.
    let mut stream = TcpStream::connect(admin).await.unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let (closed, read) = closed_after(stream, None, Duration::from_secs(10)).await;
    assert!(String::from_utf8_lossy(&read).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&read));
    assert!(closed.is_some_and(|c| c < Duration::from_secs(5)), "idle keep-alive connection open for {closed:?}");
}

/// A request whose body trickles (headers with `Content-Length: 1000`, then a byte every 200 ms).
async fn trickling(proxy: SocketAddr, drip: bool, limit: Duration) -> (Option<Duration>, Vec<u8>) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{";
    stream.write_all(head.as_bytes()).await.unwrap();
    closed_after(stream, drip.then_some(b"       ".as_slice()), limit).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_bodies_are_answered_408_in_bounded_time() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    // Defaults: under 4096 bytes/s once 10 s have passed.
    let (_child, proxy, _admin) = start(&up.url(), dir.path(), 4096, &[]);
    let tasks: Vec<_> = (0..20).map(|_| tokio::spawn(trickling(proxy, true, Duration::from_secs(30)))).collect();
    let mut times = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let (closed, read) = task.await.unwrap();
        let text = String::from_utf8_lossy(&read);
        let closed = closed.unwrap_or_else(|| panic!("trickling body {i} still open after 30 s"));
        assert!(closed >= Duration::from_secs(9) && closed < Duration::from_secs(15), "body {i} closed after {closed:?}");
        assert!(text.starts_with("HTTP/1.1 408"), "body {i}: {text}");
        assert!(text.contains("minimum of 4096 bytes/s"), "body {i}: {text}");
        times.push(closed.as_secs_f64());
    }
    let (first, last) = times.iter().fold((f64::MAX, 0.0f64), |(lo, hi), t| (lo.min(*t), hi.max(*t)));
    eprintln!("20 trickling bodies (5 bytes/s): 408 after {first:.1} to {last:.1} s");
    // A silent body under --body-timeout 2 (no rate limit): 408 after 2 s. The proxy still serves.
    let dir = tempfile::tempdir().unwrap();
    let (_child, proxy, admin) = start(&up.url(), dir.path(), 4096, &["--body-timeout", "2", "--body-min-rate", "0"]);
    let (closed, read) = trickling(proxy, false, Duration::from_secs(10)).await;
    let closed = closed.expect("a silent body is cut off");
    assert!(closed >= Duration::from_millis(1800) && closed < Duration::from_secs(5), "closed after {closed:?}");
    assert!(String::from_utf8_lossy(&read).contains("nothing for 2s"), "{}", String::from_utf8_lossy(&read));
    // The admin port's bodies too: a silent import is refused after 2 s, naming why.
    let mut stream = TcpStream::connect(admin).await.unwrap();
    stream.write_all(b"POST /api/import HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{").await.unwrap();
    let (closed, read) = closed_after(stream, None, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&read);
    assert!(closed.is_some_and(|c| c < Duration::from_secs(5)), "admin body open for {closed:?}: {text}");
    assert!(text.starts_with("HTTP/1.1 4") && text.contains("arrived too slowly"), "{text}");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let answer = post_json(&format!("http://{proxy}/v1/chat/completions"), &[], &body).await;
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_under_a_low_file_limit_do_not_stop_service() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_child, proxy, admin) = start(&up.url(), dir.path(), 256, &["--header-timeout", "3"]);
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(TcpStream::connect(proxy).await.expect("connect"));
    }
    // Health and the admin API answer at once while the proxy port is saturated.
    let health = tokio::time::timeout(Duration::from_secs(2), send("GET", &format!("http://{admin}/healthz"), &[], Vec::new()))
        .await
        .expect("/healthz timed out with 300 idle proxy connections held");
    assert_eq!(health.status, 200);
    // A request meanwhile is answered (or refused with a clear 503), never left hanging.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]});
    let url = format!("http://{proxy}/v1/chat/completions");
    let during = tokio::time::timeout(Duration::from_secs(2), post_json(&url, &[], &body)).await.expect("request hung");
    assert!(during.status == 200 || during.status == 503, "status {} during saturation", during.status);
    // Every held connection is closed: those over the cap with a 503 at once, the rest at the timeout.
    let outcomes: Vec<_> = held.into_iter().map(|s| tokio::spawn(closed_after(s, None, Duration::from_secs(10)))).collect();
    let mut refused = 0;
    for (i, task) in outcomes.into_iter().enumerate() {
        let (closed, read) = task.await.unwrap();
        assert!(closed.is_some(), "held connection {i} still open 10 s later");
        if read.starts_with(b"HTTP/1.1 503") {
            assert!(String::from_utf8_lossy(&read).contains("too_many_connections"));
            refused += 1;
        }
    }
    assert!(refused >= 200, "only {refused} of 300 connections over the cap were refused with 503");
    let after = post_json(&url, &[], &body).await;
    assert_eq!(after.status, 200, "{}", String::from_utf8_lossy(&after.body));
    let health = send("GET", &format!("http://{admin}/healthz"), &[], Vec::new()).await;
    assert_eq!(health.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_it_backs_off_and_keeps_its_connections() {
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    // A cap above the open-file limit, so that accepting runs out of descriptors (EMFILE).
    let (_child, proxy, admin) = start_logging(
        &up.url(),
        &dir.path().join("data"),
        256,
        &["--header-timeout", "8", "--max-connections", "1000"],
        Stdio::from(std::fs::File::create(&log).unwrap()),
    );
    let started = Instant::now();
    let mut kept = TcpStream::connect(admin).await.unwrap();
    let mut buf = vec![0u8; 4096];
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let n = kept.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let mut held = Vec::new();
    for _ in 0..400 {
        // Past the listen backlog a connect waits for SYN retries: those are skipped.
        if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_millis(100), TcpStream::connect(proxy)).await {
            held.push(stream);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The connection it already has is still served while accepting fails.
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(2), kept.read(&mut buf))
        .await
        .expect("an open connection went unserved at the open-file limit")
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?} after {:?}; log: {}",
        String::from_utf8_lossy(&buf[..n]),
        started.elapsed(),
        std::fs::read_to_string(&log).unwrap()
    );
    // The idle ones time out; then new connections are accepted again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = tokio::time::timeout(Duration::from_secs(1), send("GET", &format!("http://{admin}/healthz"), &[], Vec::new())).await;
        if health.is_ok_and(|h| h.status == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery after the idle connections closed");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let warnings = text.lines().filter(|l| l.contains("accept failed")).count();
    assert!(warnings >= 1, "accept never failed: the test did not reach the open-file limit");
    assert!(warnings <= 12, "{warnings} accept-failure log lines: not backing off");
}
