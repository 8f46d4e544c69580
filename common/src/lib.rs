//! Plumbing every ctxscope crate shares, with no dependencies of its own: the wire names the engine,
//! the proxy and replay agree on ([`wire`]), one-line error chains ([`describe_error`]), UTC
//! calendar time without a time-zone crate ([`civil`]), scratch-allocation scopes ([`scratch`]) and
//! what a live engine process runs, read from Linux's `/proc` ([`process`]).

pub mod civil;
pub mod process;
pub mod scratch;
pub mod wire;

/// The error and its causes in one line ("client error (Connect): tcp connect error: Connection refused").
pub fn describe_error(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn an_error_chain_is_one_line() {
        let error = Layer("client error (Connect)", Some(Box::new(Layer("tcp connect error", Some(Box::new(Layer("refused", None)))))));
        assert_eq!(super::describe_error(&error), "client error (Connect): tcp connect error: refused");
    }
}
