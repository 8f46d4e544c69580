// Mode 3 (decode QKV): warp p computes the adjacent output rows 2p and 2p + 1 of the fused QKV matrix,
// a RoPE pair, and stores them where rope_kv would: q rotated into qkv, k rotated and v as is into each
// token's sequence cache (and into qkv). Same angles as rope_kv (prelude rope_cos_sin: f64 frequency and angle, reduced
// modulo 2 pi, f32 sine and cosine); no patch rounding (patched passes use the separate kernels).
struct RopeStore {
    const int* positions;
    const u64* kv_base;
    int layer, n_layers, q_dim, kv_dim, hd;
    float base;
    // rope_inv_freq(base, j, hd) for j < hd / 2, made once (rope_inv_freq_table); null: computed here.
    const double* inv_freq;
};

// Row t's rotation of the output rows r, r + 1: cos and sin of the pair's angle (none past the K
// rows), computed apart from the store so that the streamed GEMV can have it ready before its products.
struct RopeRow {
    float c, s;
};

// TABLE: the caller guarantees `inv_freq` (no f64 pow in the code: shorter, and every launch runs it
// with a cold instruction cache).
template <bool TABLE = false>
__device__ __forceinline__ RopeRow rope_row(const RopeStore& rs, int t, int r) {
    RopeRow w = {1.0f, 0.0f};
    if (r < rs.q_dim + rs.kv_dim) {
        const int j = (r % rs.hd) / 2;
        const double inv = (TABLE || rs.inv_freq) ? rs.inv_freq[j] : rope_inv_freq(rs.base, j, rs.hd);
        rope_cos_sin(rs.positions[t], inv, &w.c, &w.s);
    }
    return w;
}

__device__ __forceinline__ void rope_store_row(const RopeStore& rs, const RopeRow& w, float* qkv, int t, int r, float a, float b) {
    int stride = rs.q_dim + 2 * rs.kv_dim, pos = rs.positions[t];
    u64 kv = rs.kv_base[t];
    if (r < rs.q_dim + rs.kv_dim) {
        float ra = a * w.c - b * w.s, rb = a * w.s + b * w.c;
        qkv[(size_t)t * stride + r] = ra;
        qkv[(size_t)t * stride + r + 1] = rb;
        if (r >= rs.q_dim) {
            float* k = kv_row(kv, pos, rs.layer, rs.n_layers, 0, rs.kv_dim) + (r - rs.q_dim);
            k[0] = ra;
            k[1] = rb;
        }
    } else {
        qkv[(size_t)t * stride + r] = a;
        qkv[(size_t)t * stride + r + 1] = b;
        float* v = kv_row(kv, pos, rs.layer, rs.n_layers, 1, rs.kv_dim) + (r - rs.q_dim - rs.kv_dim);
        v[0] = a;
        v[1] = b;
    }
}

__device__ __forceinline__ void rope_store(const RopeStore& rs, float* qkv, int t, int r, float a, float b) {
    rope_store_row(rs, rope_row(rs, t, r), qkv, t, r, a, b);
}

