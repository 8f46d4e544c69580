//! The upstream engine's base URL: parsed once at start-up, split for building request URIs, its
//! credentials turned into Basic auth and kept out of everything that is shown or stored.

/// The upstream engine's base URL, split for request building.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// As the user gave it, without a trailing slash and with any user information replaced by `***`
    /// (used in logs, metric labels, `/healthz`, records and error bodies).
    pub display: String,
    /// `Authorization: Basic ...` from the URL's user information, sent on every upstream request.
    pub credentials: Option<http::HeaderValue>,
    pub scheme: http::uri::Scheme,
    pub authority: http::uri::Authority,
    /// Path prefix joined in front of every request path ("" for none).
    pub base_path: String,
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("--upstream {0:?} is not a URL like http://127.0.0.1:8000: {1}")]
    Url(String, String),
    #[error("--upstream {0:?}: only http:// upstreams are supported (put TLS termination in front of ctxscope)")]
    Scheme(String),
}

impl Upstream {
    pub fn parse(text: &str) -> Result<Upstream, UpstreamError> {
        let trimmed = text.trim_end_matches('/');
        let uri: http::Uri =
            trimmed.parse().map_err(|e: http::uri::InvalidUri| UpstreamError::Url(crate::credentials::redact_url(text), e.to_string()))?;
        let scheme =
            uri.scheme().cloned().ok_or_else(|| UpstreamError::Url(crate::credentials::redact_url(text), "missing http://".into()))?;
        if scheme != http::uri::Scheme::HTTP {
            return Err(UpstreamError::Scheme(crate::credentials::redact_url(text)));
        }
        let authority = uri.authority().ok_or_else(|| UpstreamError::Url(crate::credentials::redact_url(text), "missing host".into()))?;
        let split = crate::credentials::split(authority.as_str());
        let bad_host = |e: http::uri::InvalidUri| UpstreamError::Url(crate::credentials::redact_url(text), e.to_string());
        let authority: http::uri::Authority = split.host.parse().map_err(bad_host)?;
        let display = crate::credentials::redact_url(trimmed);
        Ok(Upstream { display, credentials: split.basic, scheme, authority, base_path: uri.path().trim_end_matches('/').to_string() })
    }

    /// Puts the URL's credentials, when it had some, on an upstream request (replacing the client's).
    pub fn authorize(&self, headers: &mut http::HeaderMap) {
        if let Some(credentials) = &self.credentials {
            headers.insert(http::header::AUTHORIZATION, credentials.clone());
        }
    }

    /// The upstream URI for a client request's path and query.
    pub fn uri_for(&self, path_and_query: &str) -> Result<http::Uri, http::Error> {
        http::Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.base_path, path_and_query))
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_keeps_base_path_and_rejects_https() {
        let up = Upstream::parse("http://127.0.0.1:8000/engine/").unwrap();
        assert_eq!(up.uri_for("/v1/models?x=1").unwrap().to_string(), "http://127.0.0.1:8000/engine/v1/models?x=1");
        assert!(matches!(Upstream::parse("https://x"), Err(UpstreamError::Scheme(_))));
        assert!(Upstream::parse("not a url").is_err());
    }

    #[test]
    fn upstream_credentials_become_basic_auth_and_leave_the_display() {
        let up = Upstream::parse("http://bob:SECRET@127.0.0.1:8000/base").unwrap();
        assert_eq!(up.display, "http://***@127.0.0.1:8000/base");
        assert_eq!(up.uri_for("/v1/models").unwrap().to_string(), "http://127.0.0.1:8000/base/v1/models");
        let mut headers = http::HeaderMap::new();
        up.authorize(&mut headers);
        assert_eq!(headers[http::header::AUTHORIZATION], "Basic Ym9iOlNFQ1JFVA==");
        assert!(!format!("{up:?}").contains("SECRET"));
    }
}
