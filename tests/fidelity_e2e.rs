//! `ctxscope fidelity` end to end on the default model: the real binary sweeps golden and two context
//! faults (`ctx_shift=N`, `auto_truncate=N`) over a length below N and one above it. Below the limit
//! the faults change nothing, so their recall equals golden's; above it they lose the planted facts
//! (or the question), so their recall falls and never beats golden's.

mod support;

use serde_json::Value;
use support::*;

const LIMIT: u64 = 512;

fn recall(report: &Value, target: &str, length: u64) -> (f64, f64, u64) {
    let cell = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == target && c["length"] == length)
        .unwrap_or_else(|| panic!("no cell for {target} at {length}: {report}"));
    (cell["recall"].as_f64().unwrap(), cell["golden"].as_f64().unwrap(), cell["prompt_tokens"].as_u64().unwrap_or(0))
}

#[test]
fn context_faults_keep_golden_recall_below_their_limit_and_lose_it_past_it() {
    let shift = format!("engine:patches=ctx_shift={LIMIT}");
    let truncate = format!("engine:patches=auto_truncate={LIMIT}");
    let report = cli_json(&[
        "fidelity",
        "--lengths",
        "256,1k",
        "--turns",
        "3",
        "--depths",
        "0",
        "--seed",
        "1",
        "--max-tokens",
        "12",
        "--target",
        &shift,
        "--target",
        &truncate,
        "--json",
    ]);
    let (short, long) = (256, 1024);
    let (golden_short, _, short_tokens) = recall(&report, "golden", short);
    let (golden_long, _, long_tokens) = recall(&report, "golden", long);
    assert!(short_tokens < LIMIT && long_tokens > LIMIT, "lengths must straddle the limit: {short_tokens} and {long_tokens} tokens");
    assert!(golden_short > 0.0, "golden recalls nothing even at {short_tokens} tokens: {report}");
    for fault in ["engine:ctx_shift=512", "engine:auto_truncate=512"] {
        let (below, golden_below, _) = recall(&report, fault, short);
        let (above, golden_above, _) = recall(&report, fault, long);
        assert_eq!((golden_below, golden_above), (golden_short, golden_long), "golden beside every cell");
        assert_eq!(below, golden_short, "{fault} changed recall below its limit");
        assert!(above <= golden_long, "{fault} recalls more than golden past its limit: {above} > {golden_long}");
        assert!(above < below, "{fault} recall did not fall past its limit: {below} -> {above}");
    }
}

/// `ctxscope bisect --metric fidelity`: delta debugging over a patch set, each subset judged by a
/// sweep's recall against golden's. `kv_fp8` keeps golden's recall at this length (the sweep above
/// and BENCHMARKS.md); `auto_truncate=128` cuts a ~300-token prompt to its head, so it is the culprit.
#[test]
fn bisect_by_fidelity_names_the_context_fault() {
    let args = [
        "bisect",
        "--metric",
        "fidelity",
        "--patches",
        "kv_fp8,auto_truncate=128",
        "--lengths",
        "256",
        "--turns",
        "3",
        "--depths",
        "0",
        "--seed",
        "1",
        "--max-tokens",
        "12",
        "--json",
    ];
    let report = cli_json(&args);
    let golden: f64 = report["golden"]["cells"].as_array().unwrap().iter().map(|c| c["recall"].as_f64().unwrap()).sum();
    assert!(golden > 0.0, "golden recalls nothing: {report}");
    assert_eq!(report["bisect"]["metric"], "fidelity", "{report}");
    assert_eq!(report["bisect"]["culprit"], serde_json::json!(["auto_truncate=128"]), "{report}");
    let wrong = cli(&["bisect", "7", "--metric", "fidelity", "--patches", "kv_fp8"]);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success() && stderr.contains("drop the conversation id"), "{stderr}");
    let missing = cli(&["bisect", "--patches", "kv_fp8"]);
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && stderr.contains("needs a captured conversation id"), "{stderr}");
}
