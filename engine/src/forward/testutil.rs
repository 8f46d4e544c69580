//! Test helpers shared by the kernel tests: a seeded generator and weight matrices quantized as
//! ggml's reference quantizers do.

use super::fast::f32_to_f16;
use crate::model::{Matrix, QuantMatrix};
use ctxscope_formats::gguf::{dequantize, GgmlType};

/// xorshift in [-1, 1).
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.next() * scale).collect()
    }
}

fn h(v: f32) -> [u8; 2] {
    f32_to_f16(v).to_le_bytes()
}

/// ggml's reference quantizers (Q4_1 = 3, Q4_0 = 2, Q8_0 = 8) (enough to make valid blocks).
fn quantize_weights(ggml_type: u32, w: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in w.chunks(32) {
        match ggml_type {
            3 => {
                let (min, max) = b.iter().fold((f32::MAX, f32::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(h(d));
                out.extend(h(min));
                let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
                out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
            }
            2 => {
                let max = b.iter().fold(0f32, |m, v| if v.abs() > m.abs() { *v } else { m });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(h(d));
                let q = |v: f32| ((v * id + 8.5) as u8).min(15);
                out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
            }
            8 => {
                let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(h(d));
                out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
            }
            _ => unreachable!(),
        }
    }
    out
}

pub fn matrix(ggml_type: u32, rows: usize, cols: usize, seed: u64) -> Matrix {
    let bytes = quantize_weights(ggml_type, &Rng(seed).vec(rows * cols, 0.5));
    let t = GgmlType(ggml_type);
    let f32 = dequantize("w", t, &bytes, (rows * cols) as u64).unwrap();
    Matrix { name: "w".into(), rows, cols, f32, quant: QuantMatrix { ggml_type: t, row_bytes: bytes.len() / rows, bytes } }
}

/// The DeepSeek-V4 `tiny` checkpoint and its transformers references (tests/fixtures/deepseek_v4/tiny).
pub mod tiny {
    use std::path::PathBuf;

    use ctxscope_formats::SafeTensors;
    use serde_json::Value;

    use crate::model::deepseek_v4::DeepseekV4Config;

    pub fn dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/deepseek_v4/tiny")
    }

    /// A JSON file of the directory.
    pub fn json(name: &str) -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir().join(name)).unwrap()).unwrap()
    }

    pub fn config() -> DeepseekV4Config {
        DeepseekV4Config::from_json(&json("config.json")).unwrap()
    }

    pub fn tensors() -> SafeTensors {
        SafeTensors::open_dir(&dir()).unwrap()
    }

    /// A JSON array of numbers as f32.
    pub fn floats(v: &Value) -> Vec<f32> {
        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
    }

    /// ‖ours − reference‖ / ‖reference‖.
    pub fn rel_l2(ours: &[f32], reference: &[f32]) -> f32 {
        let diff: f32 = ours.iter().zip(reference).map(|(a, b)| (a - b) * (a - b)).sum();
        (diff / reference.iter().map(|b| b * b).sum::<f32>()).sqrt()
    }
}
