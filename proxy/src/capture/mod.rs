//! Capture: the middleware that tees exchanges off the hot path, the bounded queue, and the worker
//! pipeline that turns them into stored, threaded, token-counted turns.

pub mod composition;
pub mod exchange;
pub mod guard;
pub mod hashes;
pub mod known;
pub mod layer;
pub mod pipeline;
pub mod queue;
pub mod responses;
pub mod sink;
pub mod tee;
pub mod thread;
pub mod tokens;
pub mod upstream_count;
