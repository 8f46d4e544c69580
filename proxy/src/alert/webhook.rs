//! Posts findings to an HTTP webhook (placeholder; filled in by the webhook work).
