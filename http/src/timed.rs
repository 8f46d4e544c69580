//! A request body read under a deadline: no frame for `idle`, or an average rate below `min_rate`
//! bytes per second once `grace` has passed, ends the body with [`BodyTimeout`]. A client that
//! trickles its body (one byte every few seconds) then holds neither a connection slot nor an
//! upstream connection for longer than that.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// Errors a body stream may end with, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body's error as one concrete type (a boxed `dyn Error` as a body's error type trips rustc's
/// `Send` inference in generic services): the connection's error, or a [`BodyTimeout`].
#[derive(Debug)]
pub struct BodyError(BoxError);

impl BodyError {
    pub fn new(error: impl Into<BoxError>) -> BodyError {
        BodyError(error.into())
    }

    /// The error inside.
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl From<hyper::Error> for BodyError {
    fn from(error: hyper::Error) -> BodyError {
        BodyError::new(error)
    }
}

/// How slowly a request body may arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BodyLimits {
    /// The longest wait for the next part of the body.
    pub idle: Duration,
    /// The lowest average rate (bytes per second) once `grace` has passed; 0: no rate limit.
    pub min_rate: u64,
    pub grace: Duration,
}

impl Default for BodyLimits {
    fn default() -> BodyLimits {
        BodyLimits { idle: Duration::from_secs(30), min_rate: 4096, grace: Duration::from_secs(10) }
    }
}

/// Why a body was cut off.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the request body arrived too slowly: {received} bytes in {:.1} s ({reason})", elapsed.as_secs_f64())]
pub struct BodyTimeout {
    pub received: u64,
    pub elapsed: Duration,
    pub reason: String,
}

impl BodyTimeout {
    /// The timeout in an error's chain of sources, if it is there.
    pub fn find<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyTimeout> {
        let mut current = Some(error);
        while let Some(e) = current {
            if let Some(found) = e.downcast_ref::<BodyTimeout>() {
                return Some(found);
            }
            if let Some(found) = e.downcast_ref::<BodyError>().and_then(|b| b.inner().downcast_ref::<BodyTimeout>()) {
                return Some(found);
            }
            current = e.source();
        }
        None
    }
}

/// `inner` under [`BodyLimits`]. Only time spent waiting on the client counts: while the reader
/// does not ask for more (an upstream that reads slowly), no clock runs.
pub struct TimedBody<B> {
    inner: B,
    limits: BodyLimits,
    received: u64,
    /// Time spent waiting for the client's next frame, closed waits only.
    waited: Duration,
    /// When the current wait began (the inner body answered Pending).
    waiting_since: Option<Instant>,
    deadline: Pin<Box<Sleep>>,
    ended: bool,
}

impl<B> TimedBody<B> {
    pub fn new(inner: B, limits: BodyLimits) -> TimedBody<B> {
        let deadline = Box::pin(tokio::time::sleep(Duration::ZERO));
        TimedBody { inner, limits, received: 0, waited: Duration::ZERO, waiting_since: None, deadline, ended: false }
    }

    /// For a wait that began at `since`: the earlier of `idle` after it, and the moment the time
    /// waited in all would pass what `min_rate` allows for the bytes received (never before `grace`).
    fn deadline_from(&self, since: Instant) -> Instant {
        let idle = since + self.limits.idle;
        if self.limits.min_rate == 0 {
            return idle;
        }
        let allowed = Duration::from_secs_f64(self.received as f64 / self.limits.min_rate as f64).max(self.limits.grace);
        idle.min(since + allowed.saturating_sub(self.waited))
    }

    fn timeout(&self, now: Instant) -> BodyTimeout {
        let this_wait = self.waiting_since.map_or(Duration::ZERO, |s| now - s);
        let elapsed = self.waited + this_wait;
        let reason = if this_wait >= self.limits.idle {
            format!("nothing for {:?}", self.limits.idle)
        } else {
            format!("under the minimum of {} bytes/s", self.limits.min_rate)
        };
        BodyTimeout { received: self.received, elapsed, reason }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if polled.is_ready() {
            if let Some(since) = self.waiting_since.take() {
                self.waited += Instant::now() - since;
            }
        }
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                self.received += frame.data_ref().map_or(0, |d| d.len() as u64);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(BodyError::new(error)))),
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if self.waiting_since.is_none() {
                    let now = Instant::now();
                    self.waiting_since = Some(now);
                    let deadline = self.deadline_from(now);
                    self.deadline.as_mut().reset(deadline);
                }
                match self.deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.ended = true;
                        let timeout = self.timeout(Instant::now());
                        Poll::Ready(Some(Err(BodyError::new(timeout))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// One byte every `every`, `left` times.
    struct Trickle {
        every: Duration,
        left: usize,
        sleep: Pin<Box<Sleep>>,
    }

    impl Trickle {
        fn new(every: Duration, left: usize) -> Trickle {
            Trickle { every, left, sleep: Box::pin(tokio::time::sleep(every)) }
        }
    }

    impl Body for Trickle {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.left == 0 {
                return Poll::Ready(None);
            }
            match self.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.left -= 1;
                    let next = Instant::now() + self.every;
                    self.sleep.as_mut().reset(next);
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"z")))))
                }
                Poll::Pending => Poll::Pending,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_is_cut_off_by_the_rate() {
        let started = Instant::now();
        let body = TimedBody::new(Trickle::new(Duration::from_secs(5), 1000), BodyLimits::default());
        let error = body.collect().await.expect_err("cut off");
        let timeout = BodyTimeout::find(&error).expect("a BodyTimeout");
        assert_eq!(started.elapsed(), Duration::from_secs(10), "cut at the grace period");
        assert_eq!(timeout.received, 2, "the bytes of 5 s and 10 s");
        assert!(timeout.to_string().contains("minimum of 4096 bytes/s"), "{timeout}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_pauses_costs_the_client_nothing() {
        // Bytes every 100 ms, but the reader takes one and then waits 60 s (a slow upstream).
        let mut body = TimedBody::new(Trickle::new(Duration::from_millis(100), 20), BodyLimits::default());
        let mut frames = 0;
        while let Some(frame) = body.frame().await {
            frame.expect("never cut off: the client was never slow");
            frames += 1;
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        assert_eq!(frames, 20);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_body_is_cut_off_after_idle_and_a_quick_one_passes() {
        let limits = BodyLimits { idle: Duration::from_secs(3), min_rate: 0, grace: Duration::ZERO };
        let started = Instant::now();
        let error = TimedBody::new(Trickle::new(Duration::from_secs(60), 2), limits).collect().await.expect_err("cut off");
        assert!(BodyTimeout::find(&error).unwrap().to_string().contains("nothing for 3s"));
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        let quick = TimedBody::new(Trickle::new(Duration::from_millis(1), 100), BodyLimits::default()).collect().await.unwrap();
        assert_eq!(quick.to_bytes().len(), 100);
    }
}
