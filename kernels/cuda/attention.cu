// Causal attention over a KV cache, f32, without a materialized score matrix: one block per (query
// token, head); each thread walks a strided share of the keys with an online softmax (running max, sum
// and weighted values), then the block merges the threads' partial states. q is [tokens][heads * hd];
// k and v are [len][kv_heads * hd] holding every position 0..len; the queries are the last `tokens`
// positions (query t sits at len - tokens + t and sees positions <= its own). Grouped-query: head h
// reads KV head h / (heads / kv_heads). hd <= 128, blockDim.x == 64.

#define ATTN_THREADS 64
#define MAX_HD 128
// NVRTC has no math headers: -infinity by its bits.
#define NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void attention_f32(const float* q, const float* k, const float* v, float* out,
                                         int tokens, int len, int heads, int kv_heads, int hd, float scale) {
    int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    int kvh = h / (heads / kv_heads);
    int pos = len - tokens + t;
    const float* qv = q + ((size_t)t * heads + h) * hd;
    float m = NEG_INF, l = 0.0f, acc[MAX_HD];
    for (int d = 0; d < hd; d++) acc[d] = 0.0f;
    for (int j = tid; j <= pos; j += ATTN_THREADS) {
        const float* kj = k + ((size_t)j * kv_heads + kvh) * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += qv[d] * kj[d];
        s *= scale;
        float m_new = fmaxf(m, s);
        float correction = expf(m - m_new), p = expf(s - m_new);
        const float* vj = v + ((size_t)j * kv_heads + kvh) * hd;
        for (int d = 0; d < hd; d++) acc[d] = acc[d] * correction + p * vj[d];
        l = l * correction + p;
        m = m_new;
    }
    __shared__ float ms[ATTN_THREADS], ls[ATTN_THREADS], accs[ATTN_THREADS][MAX_HD];
    ms[tid] = m;
    __syncthreads();
    float global_max = NEG_INF;
    for (int i = 0; i < ATTN_THREADS; i++) global_max = fmaxf(global_max, ms[i]);
    float w = (m == NEG_INF) ? 0.0f : expf(m - global_max);
    ls[tid] = l * w;
    for (int d = 0; d < hd; d++) accs[tid][d] = acc[d] * w;
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < ATTN_THREADS; i++) total += ls[i];
    float* o = out + ((size_t)t * heads + h) * hd;
    for (int d = tid; d < hd; d += ATTN_THREADS) {
        float sum = 0.0f;
        for (int i = 0; i < ATTN_THREADS; i++) sum += accs[i][d];
        o[d] = sum / total;
    }
}

// Embedding gather: out[t] = table[ids[t]], rows of `dim`.
extern "C" __global__ void embed_f32(const float* table, const int* ids, float* out, int dim) {
    int t = blockIdx.x;
    const float* row = table + (size_t)ids[t] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[(size_t)t * dim + i] = row[i];
}
