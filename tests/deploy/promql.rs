//! Reading the artefacts the deploy tests check: rule expressions from alerts.yml, metric names in
//! PromQL, histogram names from the metric catalogue, and samples of the Prometheus text format.

use std::collections::{BTreeMap, BTreeSet};

use ctxscope_proxy::metrics as m;

use super::read;

/// The `expr:` of every rule, plain or block scalar (`>-`, `|`): the YAML that alerts.yml uses.
pub fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let Some(rest) = line.trim_start().strip_prefix("expr:") else { continue };
        let rest = rest.trim();
        if !(rest.starts_with('>') || rest.starts_with('|')) {
            out.push(rest.to_string());
            continue;
        }
        let mut body = Vec::new();
        while i < lines.len() && (lines[i].trim().is_empty() || indent(lines[i]) > indent(line)) {
            body.push(lines[i].trim());
            i += 1;
        }
        out.push(body.join(" "));
    }
    out
}

/// `yaml` without each `key` line and the lines indented under it.
pub fn strip_block(yaml: &str, key: &str) -> String {
    let mut out = String::new();
    let mut inside: Option<usize> = None;
    for line in yaml.lines() {
        if let Some(level) = inside {
            if line.trim().is_empty() || indent(line) > level {
                continue;
            }
            inside = None;
        }
        if line.trim() == key {
            inside = Some(indent(line));
            continue;
        }
        out += line;
        out.push('\n');
    }
    out
}

pub fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Every `ctxscope_...` metric name in a PromQL expression.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    for (at, _) in expr.match_indices("ctxscope_") {
        if expr[..at].chars().last().is_some_and(ident) {
            continue;
        }
        let tail = &expr[at..];
        let end = tail.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
    }
    names
}

/// Histogram names, from the `describe_histogram!` calls in proxy/src/metrics.rs.
pub fn histogram_names() -> BTreeSet<String> {
    let source = read("proxy/src/metrics.rs");
    let consts: BTreeMap<&str, &str> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub const ")?.split_once(": &str = \""))
        .filter_map(|(ident, rest)| Some((ident, rest.split_once('"')?.0)))
        .collect();
    // The macro's first argument, wherever rustfmt breaks the call.
    let histograms: BTreeSet<String> = source
        .split("metrics::describe_histogram!(")
        .skip(1)
        .filter_map(|call| call.split(',').next())
        .map(|ident| consts.get(ident.trim()).unwrap_or_else(|| panic!("describe_histogram!({ident}) names no const")).to_string())
        .collect();
    assert!(!histograms.is_empty(), "no describe_histogram! in proxy/src/metrics.rs");
    for name in &histograms {
        assert!(m::ALL.contains(&name.as_str()), "histogram {name} is missing from metrics::ALL");
    }
    histograms
}

/// The catalogue name a series name belongs to (a histogram's `_bucket`, `_sum`, `_count` stripped).
pub fn base_name<'a>(name: &'a str, histograms: &BTreeSet<String>) -> &'a str {
    ["_bucket", "_sum", "_count"].iter().filter_map(|s| name.strip_suffix(s)).find(|base| histograms.contains(*base)).unwrap_or(name)
}

pub fn resolves(name: &str, histograms: &BTreeSet<String>) -> bool {
    m::ALL.contains(&base_name(name, histograms))
}

/// One sample of the Prometheus text format.
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// Samples of a `/metrics` body (comments skipped; label values unescaped enough for ours).
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad /metrics line: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let mut map = BTreeMap::new();
        let mut rest = labels;
        while let Some((key, tail)) = rest.split_once("=\"") {
            let (value, tail) = tail.split_once('"').unwrap_or_else(|| panic!("bad labels in /metrics line: {line}"));
            map.insert(key.trim_start_matches(',').to_string(), value.to_string());
            rest = tail;
        }
        let value = value.parse().unwrap_or_else(|_| panic!("bad value in /metrics line: {line}"));
        out.push(Sample { name: name.to_string(), labels: map, value });
    }
    out
}
