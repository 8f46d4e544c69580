//! The HTTP/1 client every outbound caller uses (webhooks, upstream token counts, fingerprint
//! probes, replay targets, the admin API): TCP_NODELAY, a connect timeout, idle pooled connections
//! kept 30 s. The proxy's forwarding client adds its own settings over [`builder`].

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Builder, Client};
use hyper_util::rt::TokioExecutor;

/// How long an idle pooled connection is kept.
pub const POOL_IDLE: Duration = Duration::from_secs(30);

/// A plain-HTTP connector: no Nagle delay, `connect_timeout` to connect.
pub fn connector(connect_timeout: Duration) -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    connector
}

/// The client builder with the shared settings (pool idle timeout).
pub fn builder() -> Builder {
    let mut builder = Client::builder(TokioExecutor::new());
    builder.pool_idle_timeout(POOL_IDLE);
    builder
}

/// A client with the shared settings, for request bodies of type `B`.
pub fn client<B>(connect_timeout: Duration) -> Client<HttpConnector, B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    builder().build(connector(connect_timeout))
}
