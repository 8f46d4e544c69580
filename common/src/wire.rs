//! Header names on the wire between replay, the proxy and the engine.

/// Picks the engine's computation path for one request (`golden` or `fast`); echoed on the response.
pub const PATH_HEADER: &str = "x-ctxscope-path";

/// Picks the engine's patch set for one request (comma-separated `name` / `name=value`); a
/// generation echoes the set it applied.
pub const PATCHES_HEADER: &str = "x-ctxscope-patches";
