// Causal grouped-query attention over the sequences' KV caches (see prelude: one buffer per sequence,
// position-major), f32, no materialized score matrix. K/V tiles of 32 positions are staged in shared
// memory; within a warp lane j scores key j, the warp keeps an online softmax (running max, sum) and
// each lane accumulates head dims lane, lane+32, ... Query rows come from the fused qkv rows (stride
// `q_stride` floats); head h reads KV head h / (heads / kv_heads). hd <= 128, a multiple of 4. `window` > 0 keeps
// the last `window` positions (the sliding_window patch).

#define TILE 32

// Folds one staged tile into a query's online-softmax state. q: the query in shared memory; valid
// positions of this tile for this query: [lo, hi) relative to the tile.
__device__ __forceinline__ void attend_tile(const float* qs, const float (*ks)[MAX_HD + 1], const float (*vs)[MAX_HD + 1], int lo, int hi,
                                            int hd, float scale, float& m, float& l, float* acc) {
    int lane = threadIdx.x & 31;
    float s = NEG_INF;
    if (lane >= lo && lane < hi) {
        float dot = 0.0f;
        for (int d = 0; d < hd; d++) dot += qs[d] * ks[lane][d];
        s = dot * scale;
    }
    float m_new = fmaxf(m, warp_max(s));
    if (m_new == NEG_INF) return;
    float correction = expf(m - m_new);
    float p = (s == NEG_INF) ? 0.0f : expf(s - m_new);
    l = l * correction + warp_sum(p);
#pragma unroll
    for (int k = 0; k < HD_PER_LANE; k++) acc[k] *= correction;
    for (int j = lo; j < hi; j++) {
        float pj = __shfl_sync(0xffffffff, p, j);
#pragma unroll
        for (int k = 0; k < HD_PER_LANE; k++) {
            int d = lane + 32 * k;
            if (d < hd) acc[k] += pj * vs[j][d];
        }
    }
    m = m_new;
}

// Stages K and V rows [start, start + count) of `layer` (count <= TILE) into shared memory, 16 bytes
// per load (hd % 4 == 0): every thread issues all its loads before its first store, so a tile costs
// one memory latency, not one per element. blockDim.x == 128.
#define STAGE_PER_THREAD (TILE * MAX_HD / 4 / 128)
__device__ __forceinline__ void stage_tile(u64 base, int start, int count, int layer, int n_layers, int kvh, int kv_dim, int hd,
                                           float (*ks)[MAX_HD + 1], float (*vs)[MAX_HD + 1]) {
    int vecs = hd / 4, total = count * vecs;
    float4 kr[STAGE_PER_THREAD], vr[STAGE_PER_THREAD];
#pragma unroll
    for (int u = 0; u < STAGE_PER_THREAD; u++) {
        int i = threadIdx.x + u * 128;
        if (i < total) {
            int j = i / vecs, c = i % vecs;
            kr[u] = __ldg((const float4*)(kv_row(base, start + j, layer, n_layers, 0, kv_dim) + kvh * hd) + c);
            vr[u] = __ldg((const float4*)(kv_row(base, start + j, layer, n_layers, 1, kv_dim) + kvh * hd) + c);
        }
    }
#pragma unroll
    for (int u = 0; u < STAGE_PER_THREAD; u++) {
        int i = threadIdx.x + u * 128;
        if (i < total) {
            int j = i / vecs, d = 4 * (i % vecs);
            ks[j][d] = kr[u].x; ks[j][d + 1] = kr[u].y; ks[j][d + 2] = kr[u].z; ks[j][d + 3] = kr[u].w;
            vs[j][d] = vr[u].x; vs[j][d + 1] = vr[u].y; vs[j][d + 2] = vr[u].z; vs[j][d + 3] = vr[u].w;
        }
    }
}

// Prefill: `tokens` query rows of ONE sequence at positions start .. start + tokens - 1 (their K/V
// already stored). Grid (ceil(tokens / 16), heads), 128 threads: each warp owns 4 query rows.
#define PF_ROWS 16
extern "C" __global__ void attn_prefill(const float* __restrict__ q, int q_stride, u64 kv_base, int layer, int n_layers,
                                        float* __restrict__ out, int tokens, int start, int heads, int kv_heads, int hd,
                                        float scale, int window) {
    pdl_launch();
    pdl_wait();
    __shared__ float ks[TILE][MAX_HD + 1], vs[TILE][MAX_HD + 1];
    __shared__ float qs[PF_ROWS][MAX_HD];
    int h = blockIdx.y, kvh = h / (heads / kv_heads), kv_dim = kv_heads * hd;
    int first_row = blockIdx.x * PF_ROWS, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rows_here = min(PF_ROWS, tokens - first_row);
    for (int i = threadIdx.x; i < rows_here * hd; i += blockDim.x) {
        int r = i / hd, d = i % hd;
        qs[r][d] = q[(size_t)(first_row + r) * q_stride + h * hd + d];
    }
    float m[4], l[4], acc[4][HD_PER_LANE];
    reset_states(m, l, acc);
    int last_pos = start + first_row + rows_here - 1;
    int lowest = window > 0 ? max(0, start + first_row + 1 - window) : 0;
    for (int t0 = (lowest / TILE) * TILE; t0 <= last_pos; t0 += TILE) {
        int count = min(TILE, last_pos + 1 - t0);
        __syncthreads();
        stage_tile(kv_base, t0, count, layer, n_layers, kvh, kv_dim, hd, ks, vs);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = warp * 4 + i;
            if (r >= rows_here) break;
            int pos = start + first_row + r;
            int lo_pos = window > 0 ? max(0, pos + 1 - window) : 0;
            int lo = max(0, lo_pos - t0), hi = min(count, pos + 1 - t0);
            if (lo < hi) attend_tile(qs[r], ks, vs, lo, hi, hd, scale, m[i], l[i], acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int r = warp * 4 + i;
        if (r >= rows_here) break;
        float* o = out + (size_t)(first_row + r) * heads * hd + h * hd;
#pragma unroll
        for (int k = 0; k < HD_PER_LANE; k++) {
            int d = lane + 32 * k;
            if (d < hd) o[d] = acc[i][k] / l[i];
        }
    }
}

// Decode (split-K): one query row per sequence, row t at positions[t], its cache at kv_base[t].
// Grid (rows, kv_heads, splits), 128 threads; the block takes every query head of its KV head group
// (warp w: heads w, w + 4, ...; group <= 16) over its share of the visible positions and writes an
// unnormalized partial (acc, max, sum); the last block of a (row, KV head) to finish (a counter in
// `counters`, reset by that block) merges the group's partials into `out`, so no second launch is
// needed. Without the patch (chunk == 0) split s covers one span of ceil(visible / splits) positions;
// with attn_splitk_bf16=chunk, the visible positions are cut into chunks of `chunk` (from the window
// start, as the CPU), split s takes chunks s, s + splits, ..., and each chunk's max, exp-sum and
// normalized output are rounded to bf16 before they are merged in f32. splits <= 32.
extern "C" __global__ void attn_decode(const float* __restrict__ q, int q_stride, const int* __restrict__ positions,
                                       const u64* __restrict__ kv_base, int layer, int n_layers, float* __restrict__ part_o,
                                       float* __restrict__ part_ml, int heads, int kv_heads, int hd, float scale, int window,
                                       int splits, int chunk, float* __restrict__ out, int* __restrict__ counters) {
    pdl_launch();
    trace_mark(TRACE_ATTN_DECODE, TRACE_START);
    pdl_wait();
    trace_mark(TRACE_ATTN_DECODE, TRACE_WAITED);
    __shared__ float ks[TILE][MAX_HD + 1], vs[TILE][MAX_HD + 1];
    __shared__ float qs[16][MAX_HD];
    __shared__ int last;
    int t = blockIdx.x, kvh = blockIdx.y, s = blockIdx.z;
    int group = heads / kv_heads, kv_dim = kv_heads * hd, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int len = positions[t] + 1;
    int first = window > 0 ? max(0, len - window) : 0;
    int visible = len - first;
    u64 base = kv_base[t];
    for (int i = threadIdx.x; i < group * hd; i += blockDim.x) {
        int g = i / hd, d = i % hd;
        qs[g][d] = q[(size_t)t * q_stride + (kvh * group + g) * hd + d];
    }
    // Block state per owned head (up to 4 per warp).
    float bm[4], bl[4], bacc[4][HD_PER_LANE];
    reset_states(bm, bl, bacc);
    int piece = chunk > 0 ? chunk : (visible + splits - 1) / splits;
    int pieces = piece > 0 ? (visible + piece - 1) / piece : 0;
    for (int c = s; c < pieces; c += splits) {
        int p_lo = first + c * piece, p_hi = min(len, p_lo + piece);
        float m[4], l[4], acc[4][HD_PER_LANE];
        reset_states(m, l, acc);
        for (int t0 = p_lo; t0 < p_hi; t0 += TILE) {
            int count = min(TILE, p_hi - t0);
            __syncthreads();
            stage_tile(base, t0, count, layer, n_layers, kvh, kv_dim, hd, ks, vs);
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int g = warp + 4 * i;
                if (g >= group) break;
                attend_tile(qs[g], ks, vs, 0, count, hd, scale, m[i], l[i], acc[i]);
            }
        }
        // Fold the piece into the block state (rounded first under the patch).
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int g = warp + 4 * i;
            if (g >= group || m[i] == NEG_INF) continue;
            if (chunk > 0) {
                float rl = round_bf16(l[i]);
#pragma unroll
                for (int k = 0; k < HD_PER_LANE; k++) acc[i][k] = round_bf16(acc[i][k] / l[i]) * rl;
                m[i] = round_bf16(m[i]);
                l[i] = rl;
            }
            float mm = fmaxf(bm[i], m[i]);
            float a = expf(bm[i] - mm), b = expf(m[i] - mm);
            bl[i] = bl[i] * a + l[i] * b;
#pragma unroll
            for (int k = 0; k < HD_PER_LANE; k++) bacc[i][k] = bacc[i][k] * a + acc[i][k] * b;
            bm[i] = mm;
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int g = warp + 4 * i;
        if (g >= group) break;
        size_t slot = ((size_t)t * heads + kvh * group + g) * splits + s;
#pragma unroll
        for (int k = 0; k < HD_PER_LANE; k++) {
            int d = lane + 32 * k;
            if (d < hd) part_o[slot * hd + d] = bacc[i][k];
        }
        if (lane == 0) {
            part_ml[slot * 2] = bm[i];
            part_ml[slot * 2 + 1] = bl[i];
        }
    }
    // Publish the partial; the last block of this (row, KV head) merges all of them.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[t * kv_heads + kvh], 1) == splits - 1;
    __syncthreads();
    trace_mark(TRACE_ATTN_DECODE, TRACE_STAGED);  // the block's partial is out
    if (!last) return;
    __threadfence();
    __shared__ float weight[16][32];
    // Warp w merges the statistics of heads w, w + 4, ...: lane s holds split s.
    for (int g = warp; g < group; g += 4) {
        size_t slot0 = ((size_t)t * heads + kvh * group + g) * splits;
        float m = lane < splits ? __ldcg(&part_ml[(slot0 + lane) * 2]) : NEG_INF;
        float l = lane < splits ? __ldcg(&part_ml[(slot0 + lane) * 2 + 1]) : 0.0f;
        float mx = warp_max(m);
        float w = (m == NEG_INF) ? 0.0f : expf(m - mx);
        float total = warp_sum(l * w);
        weight[g][lane] = w / total;
    }
    __syncthreads();
    // Two outputs per pass (i and i + blockDim.x; the second repeats the first where there is none),
    // so that twice the loads are in flight. Every split's partial is written (an empty one as zeros
    // with weight 0), so the loads are unconditional and independent; each sum runs in split order.
    const int outs = group * hd;
    for (int i = threadIdx.x; i < outs; i += 2 * blockDim.x) {
        const int i2 = i + blockDim.x < outs ? i + blockDim.x : i;
        const int g1 = i / hd, d1 = i % hd, g2 = i2 / hd, d2 = i2 % hd;
        const size_t s1 = ((size_t)t * heads + kvh * group + g1) * splits, s2 = ((size_t)t * heads + kvh * group + g2) * splits;
        float acc1 = 0.0f, acc2 = 0.0f;
#pragma unroll 8
        for (int sp = 0; sp < splits; sp++) {
            acc1 += __ldcg(&part_o[(s1 + sp) * hd + d1]) * weight[g1][sp];
            acc2 += __ldcg(&part_o[(s2 + sp) * hd + d2]) * weight[g2][sp];
        }
        out[(size_t)t * heads * hd + (kvh * group + g1) * hd + d1] = acc1;
        if (i2 != i) out[(size_t)t * heads * hd + (kvh * group + g2) * hd + d2] = acc2;
    }
    if (threadIdx.x == 0) counters[t * kv_heads + kvh] = 0;
    trace_end(TRACE_ATTN_DECODE, TRACE_END);  // the merging block only
}

// ---- Decode attention merged inside a thread-block cluster (sm_90) ----
// Split-K without global partials: grid (cluster, kv_heads, rows), one cluster of `gridDim.x` (<= 16)
// blocks per (row, KV head), of max(group, 2) warps (one per query head; two at least, so that the
// newest K and V rows of hd <= 128 have a thread per float4). Block r takes the r-th contiguous span
// of the visible positions and streams its K/V tiles (ClusterSpan: one of up to CL_ROWS positions, or
// CL_TILE each) through a ring of CL_RING tile slots in shared memory with cp.async; the tiles of
// cached positions are issued before griddepcontrol.wait (positions and cache bases are written by the
// host before a pass, never by a kernel, and old positions are immutable), only the newest position —
// stored by the QKV kernel just before — is loaded after it. Each warp keeps an online softmax for its
// query head as attn_decode (lane j scores keys j and j + 32 of a tile).
// Then every block pushes its state into the shared memory of the blocks that merge it: its (max, sum)
// per head to all, its unnormalized output o to block o / per (remote stores, no round trip); after
// one cluster barrier each block merges its `per` outputs from its own shared memory, in block order.
// Dynamic shared memory, sized to the shape (ClusterSmem): 37 KB a block for the 1B shape, where static
// arrays sized for 16 heads of 128 took 53.
#define CL_RING 2
#define CL_MAX 16

// The dynamic shared memory of a cluster attention block, in floats from its start: the ring
// (CL_RING * CL_TILE rows of K, then as many of V, of hd + 4 floats; rows padded to 16 bytes: float4
// reads of a key row per lane are conflict-free by quarter warp; slot s is rows s * CL_TILE onwards of
// each, so a one-tile span of up to CL_ROWS positions takes the whole ring), the group's query heads
// [group][hd], what the cluster pushes here — every block's (max, sum) per head [size][group][2] and
// its share of the outputs this block merges [size][per] — and the merge's weights [group][size].
// Device::attn_decode_cluster sizes it.
struct ClusterSmem {
    float *ring, *qs, *rx_ml, *rx_acc, *weight;
    int per;
};

static_assert(CL_RING * CL_TILE >= CL_ROWS, "the ring holds a one-tile span");

__device__ __forceinline__ ClusterSmem cluster_smem(float* base, int hd, int group, int size) {
    ClusterSmem m;
    m.per = (group * hd + size - 1) / size;
    m.ring = base;
    m.qs = m.ring + CL_RING * 2 * CL_TILE * (hd + 4);
    m.rx_ml = m.qs + group * hd;
    m.rx_acc = m.rx_ml + size * group * 2;
    m.weight = m.rx_acc + size * m.per;
    return m;
}

// Row `j` of tile i's K (kind 0) or V (kind 1) in the ring.
__device__ __forceinline__ float* ring_row(float* ring, int i, int kind, int j, int stride) {
    return ring + (kind * CL_RING * CL_TILE + (i % CL_RING) * CL_TILE + j) * stride;
}

// Tile i's K/V copies into ring slot i % CL_RING, one commit group per call (empty ones too); the
// newest position is left out (cluster_attend loads it after the wait).
__device__ __forceinline__ void cluster_issue(float* ring, int i, const ClusterSpan& c, u64 base, int layer, int n_layers, int kvh, int hd, int kv_dim) {
    const int stride = hd + 4, vecs = hd / 4;
    if (i < c.tiles) {
        const int t0 = c.lo + i * c.tile, count = min(c.tile, c.hi - t0);
        for (int e = threadIdx.x; e < count * vecs; e += blockDim.x) {
            const int j = e / vecs, d = 4 * (e % vecs);
            if (t0 + j == c.len - 1) continue;
            cp_async16(ring_row(ring, i, 0, j, stride) + d, kv_row(base, t0 + j, layer, n_layers, 0, kv_dim) + kvh * hd + d);
            cp_async16(ring_row(ring, i, 1, j, stride) + d, kv_row(base, t0 + j, layer, n_layers, 1, kv_dim) + kvh * hd + d);
        }
    }
    cp_async_commit();
}

// Whether this thread carries part of the newest position's K and V rows (the block holding it:
// thread d < 2 * hd / 4 a float4, kept until its tile's slot is ready), and that part (loaded after
// the wait, beside the query loads, by `newest_row`).
__device__ __forceinline__ bool carries_newest(const ClusterSpan& c, int hd) { return c.tiles > 0 && c.hi == c.len && (int)threadIdx.x < hd / 2; }

__device__ __forceinline__ float4 newest_row(const ClusterSpan& c, u64 base, int layer, int n_layers, int kvh, int hd, int kv_dim) {
    const int vecs = hd / 4, kind = threadIdx.x / vecs, d = 4 * (threadIdx.x % vecs);
    if (!carries_newest(c, hd)) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return *(const float4*)(kv_row(base, c.len - 1, layer, n_layers, kind, kv_dim) + kvh * hd + d);
}

// The block's span through the ring (its first CL_RING tiles already issued, nothing else in flight;
// called after the wait, with this thread's part of the newest row); warp w owns query head w (warps
// past the group only help copy). Leaves the head's online-softmax state. One head per warp keeps one
// inlined copy of attend_ring: the kernel runs once per launch with a cold instruction cache.
__device__ __forceinline__ void cluster_attend(float* ring, const ClusterSpan& c, const float* qs, float4 newest, u64 base, int layer,
                                               int n_layers, int kvh, int hd, int kv_dim, int group, float scale, float& m, float& l,
                                               float (&acc)[HD_PER_LANE]) {
    const int stride = hd + 4, vecs = hd / 4, g = threadIdx.x >> 5;
    const bool carries = carries_newest(c, hd);
    const int kind = threadIdx.x / vecs, d = 4 * (threadIdx.x % vecs);
    m = NEG_INF;
    l = 0.0f;
#pragma unroll
    for (int k = 0; k < HD_PER_LANE; k++) acc[k] = 0.0f;
    for (int i = 0; i < c.tiles; i++) {
        cp_async_wait<CL_RING - 1>();  // tile i's group has landed (one group is committed per tile)
        const int t0 = c.lo + i * c.tile, count = min(c.tile, c.hi - t0);
        if (carries && c.len - 1 < t0 + count) *(float4*)(ring_row(ring, i, kind, c.len - 1 - t0, stride) + d) = newest;
        __syncthreads();
        if (i == 0) trace_mark(TRACE_ATTN_CLUSTER, TRACE_READY);
        if (g < group) attend_ring(qs + g * hd, ring_row(ring, i, 0, 0, stride), ring_row(ring, i, 1, 0, stride), stride, count, hd, scale, m, l, acc);
        __syncthreads();  // the slot is free again
        cluster_issue(ring, i + CL_RING, c, base, layer, n_layers, kvh, hd, kv_dim);
    }
}

// Every block's state into the shared memory of the blocks that merge it — (max, sum) of each head to
// every block (lane b to block b), output o = g * hd + d to block o / per at slot rank * per + o % per
// (remote stores, no round trip) — one cluster barrier, then this block's `per` outputs merged from its
// own shared memory in block order into `out` (the row's heads * hd values): each head's weight per
// block, exp(m_b - max), once per (head, block) by as many threads, then each output's two sums, every
// chain's loads issued ahead (unrolled to CL_MAX). The same operations in the same order as one thread
// merging an output alone (the persistent step's merge), so the same sums bit for bit.
__device__ __forceinline__ void cluster_merge(float m, float l, const float (&acc)[HD_PER_LANE], const ClusterSmem& sm, int size, int rank,
                                              int kvh, int group, int hd, float* out) {
    const int g = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int outs = group * hd, per = sm.per;
    if (g < group) {
        if (lane < size) {
            st_cluster(&sm.rx_ml[(rank * group + g) * 2], lane, m);
            st_cluster(&sm.rx_ml[(rank * group + g) * 2 + 1], lane, l);
        }
#pragma unroll
        for (int e = 0; e < HD_PER_LANE; e++) {
            const int o = g * hd + lane + 32 * e;
            if (lane + 32 * e < hd) st_cluster(&sm.rx_acc[rank * per + o % per], o / per, acc[e]);
        }
    }
    cluster_sync();
    trace_mark(TRACE_ATTN_CLUSTER, TRACE_STAGED);  // every block's state is here
    const int o_lo = rank * per, o_hi = min(o_lo + per, outs);  // this block's outputs
    const int g_lo = o_lo / hd, heads_here = o_lo < o_hi ? (o_hi - 1) / hd - g_lo + 1 : 0;
    for (int i = threadIdx.x; i < heads_here * size; i += blockDim.x) {
        const int g = g_lo + i / size, b = i % size;
        float mx = NEG_INF;
#pragma unroll
        for (int e = 0; e < CL_MAX; e++) {
            if (e < size) mx = fmaxf(mx, sm.rx_ml[(e * group + g) * 2]);
        }
        const float mb = sm.rx_ml[(b * group + g) * 2];
        sm.weight[g * size + b] = mb == NEG_INF ? 0.0f : expf(mb - mx);
    }
    __syncthreads();
    for (int k = threadIdx.x; k < per; k += blockDim.x) {
        const int o = o_lo + k, g = o / hd;
        if (o >= outs) break;
        float sum = 0.0f, acc_o = 0.0f;
#pragma unroll
        for (int b = 0; b < CL_MAX; b++) {
            if (b < size) {
                const float w = sm.weight[g * size + b];
                sum += sm.rx_ml[(b * group + g) * 2 + 1] * w;
                acc_o += sm.rx_acc[b * per + k] * w;
            }
        }
        out[kvh * outs + o] = acc_o / sum;
    }
}

// The kernel, for head dimension HD (0: `hd_arg`, any multiple of 4 up to MAX_HD) and clusters of
// SIZE blocks (0: gridDim.x). Compile-time values turn the index arithmetic's divisions by hd, hd / 4
// and the cluster size into shifts and drop the lanes' dead head-dimension slots and the merge's
// guards: shorter code (the 1B shape's 38.9 KB → 24.8 KB with NVRTC 13.5), which every launch runs
// with a cold instruction cache. The same operations in the same order.
template <int HD, int SIZE>
__device__ __forceinline__ void attn_decode_cluster_body(const float* __restrict__ q, int q_stride, const int* __restrict__ positions,
                                                         const u64* __restrict__ kv_base, int layer, int n_layers, int heads,
                                                         int kv_heads, int hd_arg, float scale, int window, float* __restrict__ out) {
    extern __shared__ __align__(16) float smem_f[];
    const int hd = HD > 0 ? HD : hd_arg;
    pdl_launch();
    cluster_arrive();
    trace_mark(TRACE_ATTN_CLUSTER, TRACE_START);
    const int size = SIZE > 0 ? SIZE : (int)gridDim.x, rank = (int)cluster_rank(), kvh = blockIdx.y, t = blockIdx.z;
    const int group = heads / kv_heads, kv_dim = kv_heads * hd, vecs = hd / 4;
    const ClusterSmem sm = cluster_smem(smem_f, hd, group, size);
    float *ring = sm.ring, *qs = sm.qs;
    const ClusterSpan c = cluster_span(positions[t] + 1, window, size, rank);
    const u64 base = kv_base[t];
#pragma unroll
    for (int i = 0; i < CL_RING; i++) cluster_issue(ring, i, c, base, layer, n_layers, kvh, hd, kv_dim);
    pdl_wait();
    trace_mark(TRACE_ATTN_CLUSTER, TRACE_WAITED);
    // The newest K/V row (stored by the QKV kernel) and the group's query heads: loads in flight together.
    const float4 newest = newest_row(c, base, layer, n_layers, kvh, hd, kv_dim);
    for (int i = threadIdx.x; i < group * vecs; i += blockDim.x) {
        const int g = i / vecs, d = 4 * (i % vecs);
        *(float4*)&qs[g * hd + d] = *(const float4*)(q + (size_t)t * q_stride + (kvh * group + g) * hd + d);
    }
    float m, l, acc[HD_PER_LANE];
    cluster_attend(ring, c, qs, newest, base, layer, n_layers, kvh, hd, kv_dim, group, scale, m, l, acc);
    trace_mark(TRACE_ATTN_CLUSTER, TRACE_ATTENDED);
    cluster_wait();  // every block of the cluster has started
    cluster_merge(m, l, acc, sm, size, rank, kvh, group, hd, out + (size_t)t * heads * hd);
    trace_end(TRACE_ATTN_CLUSTER, TRACE_END);
}

#define ATTN_DECODE_CLUSTER_PARAMS                                                                                           \
    const float *__restrict__ q, int q_stride, const int *__restrict__ positions, const u64 *__restrict__ kv_base, int layer, \
        int n_layers, int heads, int kv_heads, int hd, float scale, int window, float *__restrict__ out
#define ATTN_DECODE_CLUSTER_ARGS q, q_stride, positions, kv_base, layer, n_layers, heads, kv_heads, hd, scale, window, out

// Device::attn_decode_cluster launches the build for its head dimension and cluster size where there
// is one (the default cluster of 16 at head dimensions 64 and 128).
extern "C" __global__ void attn_decode_cluster(ATTN_DECODE_CLUSTER_PARAMS) { attn_decode_cluster_body<0, 0>(ATTN_DECODE_CLUSTER_ARGS); }
extern "C" __global__ void attn_decode_cluster_hd64_c16(ATTN_DECODE_CLUSTER_PARAMS) {
    attn_decode_cluster_body<64, 16>(ATTN_DECODE_CLUSTER_ARGS);
}
extern "C" __global__ void attn_decode_cluster_hd128_c16(ATTN_DECODE_CLUSTER_PARAMS) {
    attn_decode_cluster_body<128, 16>(ATTN_DECODE_CLUSTER_ARGS);
}
