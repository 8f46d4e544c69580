//! Target specs as the user writes them (`engine:patches=kv_fp8,path=fast`, `url=http://host:8000`),
//! parsed once into a [`TargetSpec`]. The grammar is in [`GRAMMAR`]; every error names the bad item
//! and repeats it. Only plain `http://` is spoken (there is no TLS client in this crate).

use std::str::FromStr;

use crate::model::{TargetKind, TargetSpec};

/// The spec grammar, quoted in every parse error.
pub const GRAMMAR: &str = "a target is `engine`, `engine:KEY=VALUE,...` (keys: patches=P1,P2,..., path=golden|fast, \
url=http://HOST:PORT, model=NAME, header=K:V, name=N), or `url=http://HOST:PORT[/base],model=NAME,header=K:V,name=N` \
(a spec starting with `http://` is a URL too), or `launch=FILE.toml[,toggles=A+B][,model=NAME][,header=K:V][,name=N]` \
(an engine started from a launch profile); a comma-separated item without `=` continues the previous key's value";

const ENGINE_KEYS: [&str; 6] = ["patches", "path", "url", "model", "header", "name"];
const URL_KEYS: [&str; 4] = ["url", "model", "header", "name"];
const LAUNCH_KEYS: [&str; 5] = ["launch", "toggles", "model", "header", "name"];

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TargetError {
    #[error("empty target spec; {}", GRAMMAR)]
    Empty,
    #[error("target spec `{spec}` is neither `engine...`, `url=...` nor `launch=...`; {}", GRAMMAR)]
    UnknownKind { spec: String },
    #[error("unknown key `{key}` in target spec `{spec}` (this kind takes: {allowed}); {}", GRAMMAR)]
    UnknownKey { key: String, spec: String, allowed: String },
    #[error("item `{item}` in target spec `{spec}` has no key (write KEY=VALUE); {}", GRAMMAR)]
    NoKey { item: String, spec: String },
    #[error("key `{key}` is given twice in target spec `{spec}`")]
    Duplicate { key: String, spec: String },
    #[error("patch `{patch}` is listed twice in target spec `{spec}`")]
    DuplicatePatch { patch: String, spec: String },
    #[error("key `{key}` has an empty value in target spec `{spec}`")]
    EmptyValue { key: String, spec: String },
    #[error("path must be `golden` or `fast`, got `{value}` in target spec `{spec}`")]
    BadPath { value: String, spec: String },
    #[error("`{url}` is not a usable URL: {reason} (write http://HOST:PORT[/base])")]
    BadUrl { url: String, reason: String },
    #[error("`{url}`: only plain http:// is supported (there is no TLS client); put a plain-HTTP proxy in front")]
    Tls { url: String },
    #[error("header item `{item}` in target spec `{spec}`: {reason} (write header=NAME:VALUE)")]
    BadHeader { item: String, spec: String, reason: String },
    #[error("target spec `{spec}` has no url (write url=http://HOST:PORT)")]
    MissingUrl { spec: String },
    #[error("toggle `{toggle}` is listed twice in target spec `{spec}`")]
    DuplicateToggle { toggle: String, spec: String },
}

impl FromStr for TargetSpec {
    type Err = TargetError;

    fn from_str(spec: &str) -> Result<TargetSpec, TargetError> {
        TargetSpec::parse(spec)
    }
}

/// What replaces a secret in a stored or shown target.
pub const REDACTED: &str = "<redacted>";

impl TargetSpec {
    /// The target as it may be stored and shown: `header=` values and URL user information replaced by
    /// [`REDACTED`], in `headers`, in the URLs and in `spec`. Reports carry only this form.
    pub fn redacted(&self) -> TargetSpec {
        let mut out = self.clone();
        let mut from = 0;
        for (name, value) in &mut out.headers {
            // The value that follows this header's name in the spec (values may be short: replace
            // only that occurrence).
            let after_name = out.spec[from..].find(name.as_str()).map_or(from, |at| from + at + name.len());
            if let Some(at) = out.spec[after_name..].find(value.as_str()).filter(|_| !value.is_empty()) {
                let start = after_name + at;
                out.spec.replace_range(start..start + value.len(), REDACTED);
                from = start + REDACTED.len();
            }
            *value = REDACTED.to_string();
        }
        match &mut out.kind {
            TargetKind::Engine { url: Some(url), .. } | TargetKind::Url { url } => {
                let clean = redact_userinfo(url);
                out.spec = out.spec.replace(url.as_str(), &clean);
                *url = clean;
            }
            TargetKind::Engine { url: None, .. } | TargetKind::Launch { .. } => {}
        }
        out
    }

    /// Parses a target spec (see [`GRAMMAR`]).
    pub fn parse(spec: &str) -> Result<TargetSpec, TargetError> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(TargetError::Empty);
        }
        if spec == "engine" {
            return build_engine(spec, Vec::new());
        }
        if let Some(rest) = spec.strip_prefix("engine:") {
            return build_engine(spec, split_items(spec, rest, &ENGINE_KEYS)?);
        }
        if spec.starts_with("http://") || spec.starts_with("https://") {
            return build_url(spec, split_items(spec, &format!("url={spec}"), &URL_KEYS)?);
        }
        if spec.starts_with("url=") {
            return build_url(spec, split_items(spec, spec, &URL_KEYS)?);
        }
        if spec.starts_with("launch=") {
            return build_launch(spec, split_items(spec, spec, &LAUNCH_KEYS)?);
        }
        Err(TargetError::UnknownKind { spec: spec.to_string() })
    }

    /// The patch set of an engine target (empty for URL targets).
    pub fn patches(&self) -> &[String] {
        match &self.kind {
            TargetKind::Engine { patches, .. } => patches,
            TargetKind::Url { .. } | TargetKind::Launch { .. } => &[],
        }
    }

    /// A target started from `profile` with these toggles, named `STEM` (no toggles) or
    /// `STEM:a+b` as the parser would name it.
    pub fn launch(profile: &str, toggles: Vec<String>) -> TargetSpec {
        let name = launch_name(profile, &toggles);
        let mut spec = format!("launch={profile}");
        if !toggles.is_empty() {
            spec.push_str(&format!(",toggles={}", toggles.join("+")));
        }
        TargetSpec { name, kind: TargetKind::Launch { profile: profile.to_string(), toggles }, model: None, headers: Vec::new(), spec }
    }

    /// An engine target with this patch set, named as the parser would name it.
    pub fn engine(patches: Vec<String>, path: Option<String>, url: Option<String>) -> TargetSpec {
        let name = engine_name(&patches, path.as_deref());
        let mut spec = String::from("engine");
        let mut items = Vec::new();
        if !patches.is_empty() {
            items.push(format!("patches={}", patches.join(",")));
        }
        if let Some(p) = &path {
            items.push(format!("path={p}"));
        }
        if let Some(u) = &url {
            items.push(format!("url={u}"));
        }
        if !items.is_empty() {
            spec = format!("engine:{}", items.join(","));
        }
        TargetSpec { name, kind: TargetKind::Engine { patches, path, url }, model: None, headers: Vec::new(), spec }
    }
}

/// `http://user:pass@host/...` -> `http://<redacted>@host/...`; other URLs unchanged.
fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://{REDACTED}@{host}{}", &rest[end..]),
        None => url.to_string(),
    }
}

/// `golden` for the unpatched engine, `engine:a+b` for a patch set, `@fast` appended for a path.
pub fn engine_name(patches: &[String], path: Option<&str>) -> String {
    let base = if patches.is_empty() { "engine".to_string() } else { format!("engine:{}", patches.join("+")) };
    match path {
        None if patches.is_empty() => "golden".to_string(),
        None => base,
        Some(p) => format!("{base}@{p}"),
    }
}

/// `KEY=VALUE` pairs in order; a key repeats only for `header` and `patches` items are kept apart.
type Items = Vec<(String, Vec<String>)>;

/// Splits `KEY=VALUE,...`: an item whose text before `=` is a known key starts that key; any other
/// item continues the previous key (a list item for `patches`, `,item` appended otherwise).
fn split_items(spec: &str, list: &str, keys: &[&str]) -> Result<Items, TargetError> {
    let mut items: Items = Vec::new();
    for raw in list.split(',') {
        let item = raw.trim();
        if item.is_empty() {
            continue;
        }
        let key = item.split_once('=').map(|(k, _)| k.trim()).filter(|k| keys.contains(k));
        match (key, items.last_mut()) {
            (Some(key), _) => {
                let value = item.split_once('=').map_or("", |(_, v)| v.trim());
                if key != "header" && items.iter().any(|(k, _)| k == key) {
                    return Err(TargetError::Duplicate { key: key.to_string(), spec: spec.to_string() });
                }
                items.push((key.to_string(), vec![value.to_string()]));
            }
            (None, Some((last, values))) if last.as_str() == "patches" => values.push(item.to_string()),
            (None, Some((_, values))) if !item.contains('=') => {
                if let Some(v) = values.last_mut() {
                    v.push(',');
                    v.push_str(item);
                }
            }
            (None, _) => return Err(unknown_item(spec, item, keys)),
        }
    }
    Ok(items)
}

fn unknown_item(spec: &str, item: &str, keys: &[&str]) -> TargetError {
    match item.split_once('=') {
        Some((key, _)) => TargetError::UnknownKey { key: key.trim().to_string(), spec: spec.to_string(), allowed: keys.join(", ") },
        None => TargetError::NoKey { item: item.to_string(), spec: spec.to_string() },
    }
}

/// The single value of a key, rejecting an empty one.
fn single(spec: &str, key: &str, values: &[String]) -> Result<String, TargetError> {
    let value = values.first().cloned().unwrap_or_default();
    if value.is_empty() {
        return Err(TargetError::EmptyValue { key: key.to_string(), spec: spec.to_string() });
    }
    Ok(value)
}

fn build_engine(spec: &str, items: Items) -> Result<TargetSpec, TargetError> {
    let (mut patches, mut path, mut url, mut name) = (Vec::new(), None, None, None);
    let (mut model, mut headers) = (None, Vec::new());
    for (key, values) in &items {
        match key.as_str() {
            "patches" => patches = patch_list(spec, values)?,
            "path" => path = Some(check_path(spec, single(spec, key, values)?)?),
            "url" => url = Some(check_url(&single(spec, key, values)?)?),
            "model" => model = Some(single(spec, key, values)?),
            "header" => headers.push(parse_header(spec, &single(spec, key, values)?)?),
            _ => name = Some(single(spec, key, values)?),
        }
    }
    let mut target = TargetSpec::engine(patches, path, url);
    target.name = name.unwrap_or(target.name);
    target.model = model;
    target.headers = headers;
    target.spec = spec.to_string();
    Ok(target)
}

fn build_url(spec: &str, items: Items) -> Result<TargetSpec, TargetError> {
    let (mut url, mut model, mut name, mut headers) = (None, None, None, Vec::new());
    for (key, values) in &items {
        match key.as_str() {
            "url" => url = Some(check_url(&single(spec, key, values)?)?),
            "model" => model = Some(single(spec, key, values)?),
            "header" => headers.push(parse_header(spec, &single(spec, key, values)?)?),
            _ => name = Some(single(spec, key, values)?),
        }
    }
    let url = url.ok_or_else(|| TargetError::MissingUrl { spec: spec.to_string() })?;
    let name = name.unwrap_or_else(|| authority(&url));
    Ok(TargetSpec { name, kind: TargetKind::Url { url }, model, headers, spec: spec.to_string() })
}

fn build_launch(spec: &str, items: Items) -> Result<TargetSpec, TargetError> {
    let (mut profile, mut toggles, mut model, mut name, mut headers) = (String::new(), Vec::new(), None, None, Vec::new());
    for (key, values) in &items {
        match key.as_str() {
            "launch" => profile = single(spec, key, values)?,
            "toggles" => toggles = toggle_list(spec, &single(spec, key, values)?)?,
            "model" => model = Some(single(spec, key, values)?),
            "header" => headers.push(parse_header(spec, &single(spec, key, values)?)?),
            _ => name = Some(single(spec, key, values)?),
        }
    }
    let mut target = TargetSpec::launch(&profile, toggles);
    target.name = name.unwrap_or(target.name);
    target.model = model;
    target.headers = headers;
    target.spec = spec.to_string();
    Ok(target)
}

/// `a+b+c` -> toggle names, each once.
fn toggle_list(spec: &str, value: &str) -> Result<Vec<String>, TargetError> {
    let mut toggles: Vec<String> = Vec::new();
    for toggle in value.split('+').map(str::trim).filter(|t| !t.is_empty()) {
        if toggles.iter().any(|t| t == toggle) {
            return Err(TargetError::DuplicateToggle { toggle: toggle.to_string(), spec: spec.to_string() });
        }
        toggles.push(toggle.to_string());
    }
    Ok(toggles)
}

/// `STEM` for a profile's golden, `STEM:a+b` with toggles (STEM: the profile file's stem).
pub fn launch_name(profile: &str, toggles: &[String]) -> String {
    let stem = std::path::Path::new(profile).file_stem().map_or_else(|| profile.to_string(), |s| s.to_string_lossy().into_owned());
    if toggles.is_empty() {
        stem
    } else {
        format!("{stem}:{}", toggles.join("+"))
    }
}

fn patch_list(spec: &str, values: &[String]) -> Result<Vec<String>, TargetError> {
    let mut patches: Vec<String> = Vec::new();
    for patch in values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
        if patches.iter().any(|p| p == patch) {
            return Err(TargetError::DuplicatePatch { patch: patch.to_string(), spec: spec.to_string() });
        }
        patches.push(patch.to_string());
    }
    Ok(patches)
}

fn check_path(spec: &str, value: String) -> Result<String, TargetError> {
    match value.as_str() {
        "golden" | "fast" => Ok(value),
        _ => Err(TargetError::BadPath { value, spec: spec.to_string() }),
    }
}

/// Accepts `http://HOST:PORT[/base]`, trailing `/` removed.
pub fn check_url(url: &str) -> Result<String, TargetError> {
    if url.starts_with("https://") {
        return Err(TargetError::Tls { url: url.to_string() });
    }
    let bad = |reason: &str| TargetError::BadUrl { url: url.to_string(), reason: reason.to_string() };
    if !url.starts_with("http://") {
        return Err(bad("it must start with http://"));
    }
    let uri: http::Uri = url.parse().map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    if !matches!(uri.host(), Some(host) if !host.is_empty()) {
        return Err(bad("it has no host"));
    }
    if uri.query().is_some() {
        return Err(bad("it must not carry a query string"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// `host:port` of a checked URL (the default name of a URL target).
fn authority(url: &str) -> String {
    // Without user information: names are shown everywhere.
    let host = |a: &http::uri::Authority| a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, h)| h).to_string();
    url.parse::<http::Uri>().ok().and_then(|u| u.authority().map(host)).unwrap_or_else(|| redact_userinfo(url))
}

fn parse_header(spec: &str, item: &str) -> Result<(String, String), TargetError> {
    let bad = |reason: &str| TargetError::BadHeader { item: item.to_string(), spec: spec.to_string(), reason: reason.to_string() };
    let (name, value) = item.split_once(':').ok_or_else(|| bad("no `:` between name and value"))?;
    let (name, value) = (name.trim(), value.trim());
    http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad("not a valid header name"))?;
    http::HeaderValue::from_str(value).map_err(|_| bad("not a valid header value"))?;
    Ok((name.to_string(), value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine_kind(t: &TargetSpec) -> (Vec<String>, Option<String>, Option<String>) {
        match &t.kind {
            TargetKind::Engine { patches, path, url } => (patches.clone(), path.clone(), url.clone()),
            other => panic!("not an engine target: {other:?}"),
        }
    }

    #[test]
    fn bare_engine_is_golden() {
        let t = TargetSpec::parse("engine").unwrap();
        assert_eq!(t.name, "golden");
        assert_eq!(engine_kind(&t), (vec![], None, None));
        assert_eq!(t.spec, "engine");
    }

    #[test]
    fn patch_list_continues_until_the_next_key() {
        let t = TargetSpec::parse("engine:patches=rmsnorm_bf16,kv_fp8,path=fast").unwrap();
        assert_eq!(engine_kind(&t), (vec!["rmsnorm_bf16".into(), "kv_fp8".into()], Some("fast".into()), None));
        assert_eq!(t.name, "engine:rmsnorm_bf16+kv_fp8@fast");
        let t = TargetSpec::parse("engine:patches=rmsnorm_bf16,kv_fp8").unwrap();
        assert_eq!(t.name, "engine:rmsnorm_bf16+kv_fp8");
    }

    #[test]
    fn patch_parameters_stay_in_the_patch_list() {
        let t = TargetSpec::parse("engine:patches=ctx_shift=512,kv_fp8,url=http://127.0.0.1:9000/,name=shifted").unwrap();
        let (patches, _, url) = engine_kind(&t);
        assert_eq!(patches, vec!["ctx_shift=512".to_string(), "kv_fp8".to_string()]);
        assert_eq!(url.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(t.name, "shifted");
    }

    #[test]
    fn url_targets_with_model_headers_and_names() {
        let t = TargetSpec::parse("url=http://10.0.0.2:8000/v1,model=llama,header=Authorization:Bearer x,header=X-A:b").unwrap();
        assert_eq!(t.kind, TargetKind::Url { url: "http://10.0.0.2:8000/v1".into() });
        assert_eq!(t.name, "10.0.0.2:8000");
        assert_eq!(t.model.as_deref(), Some("llama"));
        assert_eq!(t.headers, vec![("Authorization".into(), "Bearer x".into()), ("X-A".into(), "b".into())]);
        let bare = TargetSpec::parse("http://localhost:8080,name=llamacpp").unwrap();
        assert_eq!(bare.kind, TargetKind::Url { url: "http://localhost:8080".into() });
        assert_eq!(bare.name, "llamacpp");
    }

    #[test]
    fn errors_name_the_bad_key_and_the_grammar() {
        let e = TargetSpec::parse("engine:path=fast,colour=red").unwrap_err();
        assert!(matches!(&e, TargetError::UnknownKey { key, .. } if key == "colour"), "{e}");
        assert!(e.to_string().contains("patches=P1,P2"), "{e}");
        let e = TargetSpec::parse("url=http://h:1,patches=kv_fp8").unwrap_err();
        assert!(matches!(&e, TargetError::UnknownKey { key, .. } if key == "patches"), "{e}");
        assert!(matches!(TargetSpec::parse("engine:fast").unwrap_err(), TargetError::NoKey { .. }));
        assert!(matches!(TargetSpec::parse("engine:path=slow").unwrap_err(), TargetError::BadPath { .. }));
        assert!(matches!(TargetSpec::parse("engine:path=fast,path=golden").unwrap_err(), TargetError::Duplicate { .. }));
        assert!(matches!(TargetSpec::parse("engine:patches=a,a").unwrap_err(), TargetError::DuplicatePatch { .. }));
        assert!(matches!(TargetSpec::parse("vllm").unwrap_err(), TargetError::UnknownKind { .. }));
        assert!(matches!(TargetSpec::parse("  ").unwrap_err(), TargetError::Empty));
        assert!(matches!(TargetSpec::parse("url=,model=x").unwrap_err(), TargetError::EmptyValue { .. }));
        assert!(matches!(TargetSpec::parse("model=x").unwrap_err(), TargetError::UnknownKind { .. }));
        assert!(matches!(TargetSpec::parse("url=http://h:1,header=novalue").unwrap_err(), TargetError::BadHeader { .. }));
    }

    #[test]
    fn launch_targets_name_their_profile_and_toggles() {
        let t = TargetSpec::parse("launch=deploy/profiles/llama-server.toml,toggles=kv_q4+rope,model=m").unwrap();
        assert_eq!(
            t.kind,
            TargetKind::Launch { profile: "deploy/profiles/llama-server.toml".into(), toggles: vec!["kv_q4".into(), "rope".into()] }
        );
        assert_eq!(t.name, "llama-server:kv_q4+rope");
        assert_eq!(t.model.as_deref(), Some("m"));
        let golden = TargetSpec::parse("launch=/p/sglang.toml").unwrap();
        assert_eq!(golden.name, "sglang");
        assert_eq!(golden, TargetSpec::launch("/p/sglang.toml", vec![]));
        assert_eq!(TargetSpec::parse("launch=a.toml,toggles=x,name=N").unwrap().name, "N");
        assert!(matches!(TargetSpec::parse("launch=a.toml,toggles=x+x").unwrap_err(), TargetError::DuplicateToggle { .. }));
        assert!(matches!(TargetSpec::parse("launch=a.toml,patches=x").unwrap_err(), TargetError::UnknownKey { .. }));
        assert!(matches!(TargetSpec::parse("launch=,toggles=x").unwrap_err(), TargetError::EmptyValue { .. }));
    }

    #[test]
    fn only_plain_http() {
        let e = TargetSpec::parse("https://api.example.com").unwrap_err();
        assert!(matches!(e, TargetError::Tls { .. }));
        assert!(e.to_string().contains("no TLS client"));
        assert!(matches!(TargetSpec::parse("url=ftp://h:1").unwrap_err(), TargetError::BadUrl { .. }));
        assert!(matches!(TargetSpec::parse("engine:url=https://h:1").unwrap_err(), TargetError::Tls { .. }));
    }

    #[test]
    fn engine_constructor_round_trips_through_the_parser() {
        let made = TargetSpec::engine(vec!["kv_fp8".into(), "ctx_shift=64".into()], Some("golden".into()), None);
        let parsed = TargetSpec::parse(&made.spec).unwrap();
        assert_eq!(made, parsed);
        assert_eq!(TargetSpec::engine(vec![], None, None).name, "golden");
    }

    #[test]
    fn redacted_targets_keep_no_header_value_or_url_password() {
        let t = TargetSpec::parse("url=http://u:PASSWORD@h:1,model=m,header=Authorization:Bearer SECRET-KEY,header=x-k:v").unwrap();
        let r = t.redacted();
        let shown = serde_json::to_string(&r).unwrap();
        assert_eq!(r.spec, "url=http://<redacted>@h:1,model=m,header=Authorization:<redacted>,header=x-k:<redacted>");
        for secret in ["PASSWORD", "SECRET-KEY"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert_eq!(r.headers[0], ("Authorization".to_string(), REDACTED.to_string()));
        assert_eq!(r.name, t.name);
        assert_eq!(r.redacted(), r);
    }
}
