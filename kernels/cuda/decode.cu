// ---- Persistent decode step (sm_90 and earlier alike) ----
// One launch computes a batch-1 decode step from the embedded token to the logits: for every layer the
// fused QKV projection with RoPE and the K/V store, attention, the output projection with the residual
// add, gate/up with SwiGLU, the down projection with the residual add, then the final norm and the
// output projection. One block per SM stays resident for the whole step, and the phases hand over
// through a grid barrier (a counter in global memory) instead of kernel boundaries.
//
// The weights are one stream per thread: each warp owns a contiguous share of every phase's output
// units (as gemv_stream: a row, a gate/up pair, a RoPE pair), each thread keeps S groups of two 16-byte
// chunks in flight with cp.async into its own shared-memory slots, and the stream runs on across phase
// and layer boundaries — weights do not depend on activations, so while a block waits at a barrier or
// computes attention, its slots fill with the next phase's weights. A phase reads its input rows from
// global memory (L2, `ld.global.cg`: other blocks wrote them) into shared memory after the barrier,
// through the RMSNorm where the phase takes one.
//
// Arithmetic: every product, norm and epilogue is computed as the streamed GEMV computes it (same
// per-lane chunk order, same warp reduction, rmsnorm_f32's summation order over 256 threads) and
// attention as attn_decode_cluster with `spans` blocks per KV head (the same spans, tiles and merge
// order; partials through global memory, merged by the last block of a KV head to finish): a step's
// logits are bit-identical to the kernel-per-op pass with the same cluster size.
//
// Requirements (checked by the launch wrapper): the whole grid resident at once (one block per SM; a
// barrier that waits for an absent block would never return, so a barrier that has spun for seconds
// traps instead of hanging), one token row, hd <= MAX_HD and a multiple of 4, heads per KV head <= 16,
// spans <= DS_MAX_SPANS. `sync` holds zeros before a launch and after it (the last block to finish
// resets it): [0] the barrier count, [1] blocks finished, [2 + kvh] attention partials arrived.

#define DS_THREADS 512
#define DS_WARPS (DS_THREADS / 32)
// The streamed GEMV's block size: the norm's statistics are summed by this many threads (rmsnorm_f32's order).
#define DS_NORM_THREADS 256
#define DS_MAX_SPANS 32
// Per layer in `layers`: wqkv, wo, w_gu, w_down, attn_norm, ffn_norm (device addresses).
#define DS_LAYER_PTRS 6
// Trace kinds of the phases (kernels/src/device/trace.rs): 24 QKV, 25 attention, 26 o, 27 gate/up,
// 28 down, 29 the output projection.
#define TRACE_STEP 24

struct StepArgs {
    const u64* layers;
    const void* head_w;
    const float* head_norm;
    float *x, *qkv, *att, *act, *logits, *part_o, *part_ml;
    unsigned* sync;
    const int* positions;
    const u64* kv_base;
    int n_layers, dim, ffn, heads, kv_heads, hd, vocab;
    float rope_base, eps, scale;
    int window, spans, round_x;
    // Attention's first K/V tile rides in the weight stream (`early_kv_fits`).
    bool early;
};

// What phase q of the step streams: q = 5 * layer + (0 QKV, 1 attention, 2 o, 3 gate/up, 4 down),
// q = 5 * n_layers the output projection, beyond it nothing (units 0). mode as gemv_stream's (0 store,
// 1 accumulate, 2 SwiGLU, 3 QKV + RoPE) or 4: attention's K/V, one group per thread (the block's share
// of its first span's first tile, all but the newest position, into the attention tile: issued in the
// stream S groups ahead, those loads are queued before the next phase's weights, not behind them); k
// rows per unit; a group is two chunks: one of each row (k = 2) or two consecutive chunks of the row (k = 1).
struct Gemv {
    const uint4* w;
    int units, chunks, k, mode, groups;
};

template <bool BF16>
__device__ __forceinline__ Gemv step_gemv(const StepArgs& a, int q) {
    const int E = BF16 ? 8 : 4, q_rows = (a.heads + 2 * a.kv_heads) * a.hd;
    Gemv g = {nullptr, 0, 1, 1, 0, 0};
    int cols = a.dim;
    if (q < 5 * a.n_layers) {
        const u64* l = a.layers + (size_t)(q / 5) * DS_LAYER_PTRS;
        const int p = q % 5;
        g.w = p == 0 ? (const uint4*)l[0] : p == 1 ? nullptr : (const uint4*)l[p - 1];
        if (p == 0) g.units = q_rows / 2, g.k = 2, g.mode = 3;
        else if (p == 1) g.units = 1, g.mode = 4;
        else if (p == 2) g.units = a.dim, g.mode = 1;
        else if (p == 3) g.units = a.ffn, g.k = 2, g.mode = 2;
        else g.units = a.dim, g.mode = 1, cols = a.ffn;
    } else if (q == 5 * a.n_layers) {
        g.w = (const uint4*)a.head_w;
        g.units = a.vocab;
    }
    g.chunks = cols / E;
    const int per_lane = (g.chunks + 31) / 32;
    g.groups = g.mode == 4 ? 1 : g.k == 2 ? per_lane : (per_lane + 1) / 2;
    return g;
}

// Weight row of slot r of unit u, and the chunk of that row a lane takes in group j.
__device__ __forceinline__ size_t gemv_row(const Gemv& g, int u, int r) {
    return g.mode == 3 ? 2 * (size_t)u + r : g.mode == 2 ? (size_t)u + (size_t)r * g.units : (size_t)u;
}

__device__ __forceinline__ int gemv_chunk(const Gemv& g, int lane, int j, int r) {
    return g.k == 2 ? lane + 32 * j : lane + 32 * (2 * j + r);
}

// A warp's share of a phase's units: [lo, hi).
__device__ __forceinline__ int2 warp_units(int units) {
    const long long warps = (long long)gridDim.x * DS_WARPS, gw = (long long)blockIdx.x * DS_WARPS + (threadIdx.x >> 5);
    return make_int2((int)(gw * units / warps), (int)((gw + 1) * units / warps));
}

// The issue side of a thread's weight stream: the next group to copy (phase q, unit u < ub, group j).
struct Cursor {
    Gemv g;
    int q, u, ub, j;
};

// Moves the cursor to the first phase from q on in which this warp has units (or past the end).
template <bool BF16>
__device__ __forceinline__ void cursor_phase(Cursor& c, const StepArgs& a, int q) {
    for (;; q++) {
        c.q = q;
        c.g = step_gemv<BF16>(a, q);
        const int2 r = c.g.mode == 4 ? make_int2(0, 1) : warp_units(c.g.units);
        c.u = r.x, c.ub = r.y, c.j = 0;
        if (c.u < c.ub || c.g.units == 0) return;
    }
}

// The block's first attention item of `layer` (KV head, span): its span, and where its K/V rows are.
struct StepItem {
    ClusterSpan c;
    int kvh;
    u64 base;
};

__device__ __forceinline__ StepItem step_item(const StepArgs& a, int item) {
    StepItem it;
    it.kvh = item / a.spans;
    it.c = cluster_span(a.positions[0] + 1, a.window, a.spans, item % a.spans);
    it.base = a.kv_base[0];
    return it;
}

// Rows [t0, t0 + count) of the item's K and V into the tile (rows of stride hd + 4): with cp.async
// (`early`: all but the newest position, which the QKV phase is still writing) or with loads from L2.
__device__ __forceinline__ void load_tile(const StepArgs& a, const StepItem& it, int layer, int t0, int count, float* tile, bool early) {
    const int vecs = a.hd / 4, stride = a.hd + 4, kv_dim = a.kv_heads * a.hd;
    for (int e = threadIdx.x; e < count * vecs; e += DS_THREADS) {
        const int j = e / vecs, d = 4 * (e % vecs);
        const float* k = kv_row(it.base, t0 + j, layer, a.n_layers, 0, kv_dim) + it.kvh * a.hd + d;
        const float* v = kv_row(it.base, t0 + j, layer, a.n_layers, 1, kv_dim) + it.kvh * a.hd + d;
        float* ks = tile + j * stride + d;
        float* vs = tile + (CL_ROWS + j) * stride + d;
        if (!early) {
            *(float4*)ks = __ldcg((const float4*)k);
            *(float4*)vs = __ldcg((const float4*)v);
        } else if (t0 + j != it.c.len - 1) {
            cp_async16(ks, k);
            cp_async16(vs, v);
        }
    }
}

// Copies the cursor's group into ring slot `slot` (both chunks; none past the stream's end; the K/V
// pseudo-phase's copies into the tile) and advances it; one commit group per call either way.
template <bool BF16>
__device__ __forceinline__ void stream_issue(Cursor& c, const StepArgs& a, uint4* ring, int slot, float* tile) {
    const int lane = threadIdx.x & 31;
    if (c.u < c.ub && c.g.mode == 4) {
        if (a.early && (int)blockIdx.x < a.kv_heads * a.spans) {
            const StepItem it = step_item(a, blockIdx.x);
            if (it.c.tiles > 0) load_tile(a, it, c.q / 5, it.c.lo, min(it.c.tile, it.c.hi - it.c.lo), tile, true);
        }
        cursor_phase<BF16>(c, a, c.q + 1);
    } else if (c.u < c.ub) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int chunk = gemv_chunk(c.g, lane, c.j, r);
            if (chunk < c.g.chunks) cp_async16(&ring[(slot * 2 + r) * DS_THREADS + threadIdx.x], c.g.w + gemv_row(c.g, c.u, c.g.k == 2 ? r : 0) * c.g.chunks + chunk);
        }
        if (++c.j == c.g.groups) {
            c.j = 0;
            if (++c.u == c.ub) cursor_phase<BF16>(c, a, c.q + 1);
        }
    }
    cp_async_commit();
}

// The grid barrier: every block's writes before it are visible to every block after it. Thread 0
// counts this block in (release) and spins until all `gridDim.x` blocks of this barrier have (acquire).
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned& target) {
    target += gridDim.x;
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
        unsigned seen, spins = 0;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
            if (++spins == (1u << 26)) __trap();  // a block is not resident: fail rather than hang
        } while (seen < target);
    }
    __syncthreads();
}

// A phase's input row (cols values written by other blocks) into shared memory: normalized when
// `norm_w` is given (the streamed GEMV's statistics and formula), rounded to bf16 when `round_x`.
__device__ __forceinline__ void stage_row(const float* src, int cols, const float* norm_w, float eps, int round_x, float* xs, float* scratch) {
    if (norm_w) {
        float sum = 0.0f;
        if (threadIdx.x < DS_NORM_THREADS) {
            for (int i = threadIdx.x; i < cols; i += DS_NORM_THREADS) {
                const float v = __ldcg(src + i);
                sum += v * v;
                xs[i] = v;
            }
        }
        // block_sum's barriers order the stores above before the reads below.
        const float scale = 1.0f / sqrtf(block_sum(sum, scratch) / cols + eps);
        for (int i = threadIdx.x; i < cols; i += DS_THREADS) {
            const float v = xs[i] * scale * __ldg(norm_w + i);
            xs[i] = round_x ? round_bf16(v) : v;
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += DS_THREADS) {
            const float v = __ldcg(src + i);
            xs[i] = round_x ? round_bf16(v) : v;
        }
    }
    __syncthreads();
}

// The consume side: this warp's units of phase q (the ring holds them in order, S groups ahead),
// each group folded into the unit's sums and its slot refilled from the cursor, then the epilogue.
template <bool BF16, int S>
__device__ __forceinline__ void stream_phase(const StepArgs& a, int q, int layer, const float* xs, uint4* ring, int& slot, Cursor& cur, float* tile) {
    const Gemv g = step_gemv<BF16>(a, q);
    const int2 range = warp_units(g.units);
    const int lane = threadIdx.x & 31, E = BF16 ? 8 : 4;
    const RopeStore rs = {a.positions, a.kv_base, layer, a.n_layers, a.heads * a.hd, a.kv_heads * a.hd, a.hd, a.rope_base, nullptr};
    for (int u = range.x; u < range.y; u++) {
        RopeRow rr = {1.0f, 0.0f};
        if (g.mode == 3 && lane == 0) rr = rope_row(rs, 0, 2 * u);
        float acc = 0.0f, acc2 = 0.0f;
        for (int j = 0; j < g.groups; j++) {
            cp_async_wait<S - 1>();  // this thread's oldest group has landed
            const uint4 c0 = ring[(slot * 2) * DS_THREADS + threadIdx.x], c1 = ring[(slot * 2 + 1) * DS_THREADS + threadIdx.x];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int chunk = gemv_chunk(g, lane, j, r);
                if (chunk >= g.chunks || (g.k == 2 && r == 1)) continue;
                float wa[8], wb[8], xv[8];
                unpack16<BF16>(r == 0 ? c0 : c1, wa);
                const float4* xp = (const float4*)(xs + (size_t)chunk * E);
                float4 lo = xp[0];
                xv[0] = lo.x; xv[1] = lo.y; xv[2] = lo.z; xv[3] = lo.w;
                if (BF16) {
                    float4 hi = xp[1];
                    xv[4] = hi.x; xv[5] = hi.y; xv[6] = hi.z; xv[7] = hi.w;
                }
                if (g.k == 2) {
                    unpack16<BF16>(c1, wb);
#pragma unroll
                    for (int e = 0; e < E; e++) {
                        acc += wa[e] * xv[e];
                        acc2 += wb[e] * xv[e];
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < E; e++) acc += wa[e] * xv[e];
                }
            }
            // The slot just read is refilled only now, after the arithmetic that consumed it.
            stream_issue<BF16>(cur, a, ring, slot, tile);
            if (++slot == S) slot = 0;
        }
        const float s = warp_sum(acc), v = g.k == 2 ? warp_sum(acc2) : 0.0f;
        if (lane == 0) {
            if (g.mode == 3) {
                rope_store_row(rs, rr, a.qkv, 0, 2 * u, s, v);
            } else if (g.mode == 2) {
                a.act[u] = s / (1.0f + expf(-s)) * v;
            } else if (g.mode == 1) {
                a.x[u] = __ldcg(a.x + u) + s;
            } else {
                a.logits[u] = s;
            }
        }
    }
}

// Decode attention of `layer` for the one row: item i = (KV head i / spans, span i % spans) per block
// in turn, each as one block of attn_decode_cluster (its span's tiles through `tile`, K and V rows of
// stride hd + 4), its (max, sum, unnormalized output) per query head into the partials; the last block
// of a KV head to finish merges that head group's outputs (cluster_merge's order) into `att`. The
// stream's K/V group (the oldest in flight) is consumed here: with `a.early`, tile 0 of the first item
// is in the tile but for the newest position.
template <bool BF16, int S>
__device__ __forceinline__ void step_attention(const StepArgs& a, int layer, float* tile, float (*qs)[MAX_HD], int* flag, uint4* ring, int& slot, Cursor& cur) {
    const int group = a.heads / a.kv_heads, vecs = a.hd / 4, stride = a.hd + 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* ks = tile;
    float* vs = tile + CL_ROWS * stride;
    cp_async_wait<S - 1>();
    __syncthreads();
    for (int item = blockIdx.x; item < a.kv_heads * a.spans; item += gridDim.x) {
        const StepItem it = step_item(a, item);
        const int kvh = it.kvh;
        const ClusterSpan& c = it.c;
        for (int i = threadIdx.x; i < group * vecs; i += DS_THREADS) {
            const int g = i / vecs, d = 4 * (i % vecs);
            *(float4*)&qs[g][d] = __ldcg((const float4*)(a.qkv + (kvh * group + g) * a.hd + d));
        }
        float m[4], l[4], acc[4][HD_PER_LANE];
        reset_states(m, l, acc);
        for (int i = 0; i < c.tiles; i++) {
            const int t0 = c.lo + i * c.tile, count = min(c.tile, c.hi - t0);
            if (!a.early || i > 0 || item != (int)blockIdx.x) {
                load_tile(a, it, layer, t0, count, tile, false);
            } else if (c.len - 1 < t0 + count) {
                // The newest position (the QKV phase stored it) into its row of the early tile.
                load_tile(a, it, layer, c.len - 1, 1, tile + (c.len - 1 - t0) * stride, false);
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int g = warp + DS_WARPS * k;
                if (g >= group) break;
                attend_ring(qs[g], ks, vs, stride, count, a.hd, a.scale, m[k], l[k], acc[k]);
            }
            __syncthreads();  // the tile is free again
        }
        trace_mark(TRACE_STEP + 1, TRACE_STAGED);  // this span's state is computed
        // This span's partial: slot (item * group + g).
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int g = warp + DS_WARPS * k;
            if (g >= group) break;
            const size_t p = (size_t)item * group + g;
            if (lane == 0) {
                a.part_ml[2 * p] = m[k];
                a.part_ml[2 * p + 1] = l[k];
            }
#pragma unroll
            for (int e = 0; e < HD_PER_LANE; e++) {
                if (lane + 32 * e < a.hd) a.part_o[p * a.hd + lane + 32 * e] = acc[k][e];
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // Release this block's partial (ordered by the barrier above), acquire the others' if last.
            unsigned before;
            asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(a.sync + 2 + kvh) : "memory");
            *flag = before == (unsigned)a.spans - 1;
        }
        __syncthreads();
        if (*flag) {
            const int outs = group * a.hd;
            for (int o = threadIdx.x; o < outs; o += DS_THREADS) {
                const int g = o / a.hd, d = o % a.hd;
                const float* ml = a.part_ml + 2 * ((size_t)kvh * a.spans * group + g);
                float mx = NEG_INF;
                for (int b = 0; b < a.spans; b++) mx = fmaxf(mx, __ldcg(ml + 2 * (size_t)b * group));
                float sum = 0.0f, acc_o = 0.0f;
                for (int b = 0; b < a.spans; b++) {
                    const float mb = __ldcg(ml + 2 * (size_t)b * group), w = mb == NEG_INF ? 0.0f : expf(mb - mx);
                    sum += __ldcg(ml + 2 * (size_t)b * group + 1) * w;
                    acc_o += __ldcg(a.part_o + (((size_t)kvh * a.spans + b) * group + g) * a.hd + d) * w;
                }
                a.att[kvh * outs + o] = acc_o / sum;
            }
            if (threadIdx.x == 0) a.sync[2 + kvh] = 0;
        }
        __syncthreads();
    }
    // The K/V group's place in the stream is refilled.
    stream_issue<BF16>(cur, a, ring, slot, tile);
    if (++slot == S) slot = 0;
}

// Whether every thread's stream holds at least S groups between two layers' K/V groups, so that a
// layer's early K/V copies are issued only after the previous layer's attention is done with the
// tile (uniform over the grid: shapes and grid only).
template <bool BF16>
__device__ __forceinline__ bool early_kv_fits(const StepArgs& a, int S) {
    const long long warps = (long long)gridDim.x * DS_WARPS;
    int gap = 1;
    for (int q = 2; q <= 5; q++) {
        const Gemv g = step_gemv<BF16>(a, q == 5 ? 0 : q);
        gap += (int)(g.units / warps) * g.groups;
    }
    return gap >= S;
}

// qs: the query heads of an attention item; scratch: block sums; flag: "this block merges".
template <bool BF16, int S>
__device__ __forceinline__ void decode_step_body(const StepArgs& a, float (*qs)[MAX_HD], float* scratch, int* flag) {
    extern __shared__ __align__(128) unsigned char smem[];
    pdl_launch();
    // Shared memory: the ring, the staged input row, the attention tile.
    uint4* ring = (uint4*)smem;
    float* xs = (float*)(smem + (size_t)S * 2 * DS_THREADS * 16);
    float* tile = xs + max(a.dim, a.ffn);
    Cursor cur;
    cursor_phase<BF16>(cur, a, 0);
    // The first S groups of weights before waiting for the embedding kernel.
#pragma unroll
    for (int i = 0; i < S; i++) stream_issue<BF16>(cur, a, ring, i, tile);
    int slot = 0;
    unsigned target = 0;
    pdl_wait();
    for (int layer = 0; layer <= a.n_layers; layer++) {
        const bool head = layer == a.n_layers;
        const u64* l = a.layers + (size_t)layer * DS_LAYER_PTRS;
        const int kind = TRACE_STEP + (head ? 5 : 0);  // the output projection, or this layer's QKV
        trace_mark(kind, TRACE_START);
        if (layer > 0) grid_barrier(a.sync, target);
        trace_mark(kind, TRACE_WAITED);
        stage_row(a.x, a.dim, head ? a.head_norm : (const float*)l[4], a.eps, a.round_x, xs, scratch);
        trace_mark(kind, TRACE_STAGED);
        stream_phase<BF16, S>(a, 5 * layer, layer, xs, ring, slot, cur, tile);
        trace_end(kind, TRACE_END);
        if (head) break;

        trace_mark(TRACE_STEP + 1, TRACE_START);
        grid_barrier(a.sync, target);
        trace_mark(TRACE_STEP + 1, TRACE_WAITED);
        step_attention<BF16, S>(a, layer, tile, qs, flag, ring, slot, cur);
        trace_end(TRACE_STEP + 1, TRACE_END);

        // o (+ residual), gate/up (SwiGLU), down (+ residual): input, its norm, its width.
        const float* inputs[3] = {a.att, a.x, a.act};
        const float* norms[3] = {nullptr, (const float*)l[5], nullptr};
        const int widths[3] = {a.dim, a.dim, a.ffn};
#pragma unroll 1
        for (int p = 1; p <= 3; p++) {
            trace_mark(TRACE_STEP + 1 + p, TRACE_START);
            grid_barrier(a.sync, target);
            trace_mark(TRACE_STEP + 1 + p, TRACE_WAITED);
            stage_row(inputs[p - 1], widths[p - 1], norms[p - 1], a.eps, a.round_x, xs, scratch);
            trace_mark(TRACE_STEP + 1 + p, TRACE_STAGED);
            stream_phase<BF16, S>(a, 5 * layer + 1 + p, layer, xs, ring, slot, cur, tile);
            trace_end(TRACE_STEP + 1 + p, TRACE_END);
        }
    }
    cp_async_wait<0>();
    // The last block out resets the counters for the next launch (every other block is past its last barrier).
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&a.sync[1], 1u) == gridDim.x - 1) {
            a.sync[0] = 0;
            a.sync[1] = 0;
        }
    }
}

// Ring slots per thread (S groups of 32 bytes): 4 (default) or 8 (`StepPlan::slots`).
// (The static arrays live here, not in the instantiations, which would each get their own.)
template <bool BF16>
__device__ __forceinline__ void decode_step_dispatch(StepArgs& a, int slots) {
    __shared__ __align__(16) float qs[16][MAX_HD];
    __shared__ float scratch[33];
    __shared__ int flag;
    if (slots >= 8) {
        a.early = early_kv_fits<BF16>(a, 8);
        decode_step_body<BF16, 8>(a, qs, scratch, &flag);
    } else {
        a.early = early_kv_fits<BF16>(a, 4);
        decode_step_body<BF16, 4>(a, qs, scratch, &flag);
    }
}

#define DECODE_STEP_PARAMS                                                                                                              \
    const u64 *__restrict__ layers, const float *__restrict__ head_norm, float *x, float *qkv, float *att, float *act, float *logits,    \
        float *part_o, float *part_ml, unsigned *sync, const int *positions, const u64 *kv_base, int n_layers, int dim, int ffn, int heads, \
        int kv_heads, int hd, int vocab, float rope_base, float eps, float scale, int window, int spans, int round_x, int slots

#define DECODE_STEP_ARGS                                                                                                               \
    StepArgs a = {layers, head_w, head_norm, x, qkv, att, act, logits, part_o, part_ml, sync, positions, kv_base, n_layers, dim, ffn, \
                  heads, kv_heads, hd, vocab, rope_base, eps, scale, window, spans, round_x, false}

extern "C" __global__ void __launch_bounds__(DS_THREADS, 1) decode_step_bf16(const bf16_t* __restrict__ head_w, DECODE_STEP_PARAMS) {
    DECODE_STEP_ARGS;
    decode_step_dispatch<true>(a, slots);
}

extern "C" __global__ void __launch_bounds__(DS_THREADS, 1) decode_step_f32(const float* __restrict__ head_w, DECODE_STEP_PARAMS) {
    DECODE_STEP_ARGS;
    decode_step_dispatch<false>(a, slots);
}
