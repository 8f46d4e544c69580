//! Our dequantization against gguf-py's (llama.cpp's Python package) on random blocks of every
//! supported quantized type. Fixtures: tests/fixtures/dequant.json, made by make_dequant_fixtures.py.

use ctxscope_formats::gguf::{dequantize, GgmlType};
use serde_json::Value;

#[test]
fn every_quantized_type_matches_gguf_py() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/dequant.json")).unwrap();
    let fixtures: Value = serde_json::from_str(&text).unwrap();
    let cases = fixtures["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    for case in cases {
        let name = case["type"].as_str().unwrap();
        let hex = case["bytes_hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let expected: Vec<f32> = case["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let ours = dequantize(name, GgmlType(case["type_id"].as_u64().unwrap() as u32), &bytes, expected.len() as u64).unwrap();
        assert_eq!(ours.len(), expected.len(), "{name}");
        for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
            let tolerance = 1e-6 * b.abs().max(1.0);
            assert!((a - b).abs() <= tolerance, "{name} element {i}: ours {a}, gguf-py {b}");
        }
    }
}
