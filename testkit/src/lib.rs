//! Test support shared by ctxscope's tests and benchmarks, never by what ships.
//!
//! [`FakeUpstream`]: one scriptable HTTP/1.1 server on a real loopback socket, standing in for an
//! OpenAI-compatible engine (or a replay target, or a benchmark's engine). It accepts connections,
//! hands each request, body read whole, to the test's script, records what it received, and sends
//! the script's response: a whole body ([`json`], [`raw`]) or a stream the script writes frame by
//! frame, pacing, breaking or abandoning it ([`stream`]). What the upstream *says* is the test's; how
//! it is served is here, once. The `scripted-upstream` binary serves one fixed OpenAI-compatible
//! script on it in a process of its own, for the `openai`-client tests in tests/python.
//! [`sled_lock`]: opening a sled database again while the last handle's lock is still being let go.
//! [`tmpfs`]: a small filesystem for full-disk tests, filled to its last byte on demand.

pub mod sled_lock;
pub mod tmpfs;
pub mod upstream;

pub use upstream::{json, raw, stream, Body, FakeUpstream, Options, Received, StreamWriter};
