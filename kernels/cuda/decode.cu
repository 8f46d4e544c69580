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
};

// What phase q of the step streams: q = 4 * layer + (0 QKV, 1 o, 2 gate/up, 3 down), q = 4 * n_layers
// the output projection, beyond it nothing (units 0). mode as gemv_stream's (0 store, 1 accumulate,
// 2 SwiGLU, 3 QKV + RoPE); k rows per unit; a group is two chunks: one of each row (k = 2) or two
// consecutive chunks of the row (k = 1).
struct Gemv {
    const uint4* w;
    int units, chunks, k, mode, groups;
};

template <bool BF16>
__device__ __forceinline__ Gemv step_gemv(const StepArgs& a, int q) {
    const int E = BF16 ? 8 : 4, q_rows = (a.heads + 2 * a.kv_heads) * a.hd;
    Gemv g = {nullptr, 0, 1, 1, 0, 0};
    int cols = a.dim;
    if (q < 4 * a.n_layers) {
        const u64* l = a.layers + (size_t)(q / 4) * DS_LAYER_PTRS;
        const int p = q % 4;
        g.w = (const uint4*)l[p];
        if (p == 0) g.units = q_rows / 2, g.k = 2, g.mode = 3;
        else if (p == 1) g.units = a.dim, g.mode = 1;
        else if (p == 2) g.units = a.ffn, g.k = 2, g.mode = 2;
        else g.units = a.dim, g.mode = 1, cols = a.ffn;
    } else if (q == 4 * a.n_layers) {
        g.w = (const uint4*)a.head_w;
        g.units = a.vocab;
    }
    g.chunks = cols / E;
    const int per_lane = (g.chunks + 31) / 32;
    g.groups = g.k == 2 ? per_lane : (per_lane + 1) / 2;
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
        const int2 r = warp_units(c.g.units);
        c.u = r.x, c.ub = r.y, c.j = 0;
        if (c.u < c.ub || c.g.units == 0) return;
    }
}

// Copies the cursor's group into ring slot `slot` (both chunks; none past the stream's end) and
// advances it; one commit group per call either way.
template <bool BF16>
__device__ __forceinline__ void stream_issue(Cursor& c, const StepArgs& a, uint4* ring, int slot) {
    const int lane = threadIdx.x & 31;
    if (c.u < c.ub) {
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
        __threadfence();
        atomicAdd(count, 1u);
        unsigned seen, spins = 0;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
            if (++spins == (1u << 26)) __trap();  // a block is not resident: fail rather than hang
        } while (seen < target);
        __threadfence();
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
__device__ __forceinline__ void stream_phase(const StepArgs& a, int q, int layer, const float* xs, uint4* ring, int& slot, Cursor& cur) {
    const Gemv g = step_gemv<BF16>(a, q);
    const int2 range = warp_units(g.units);
    const int lane = threadIdx.x & 31, E = BF16 ? 8 : 4;
    const RopeStore rs = {a.positions, a.kv_base, layer, a.n_layers, a.heads * a.hd, a.kv_heads * a.hd, a.hd, a.rope_base};
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
            stream_issue<BF16>(cur, a, ring, slot);
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
// of a KV head to finish merges that head group's outputs (cluster_merge's order) into `att`.
__device__ __forceinline__ void step_attention(const StepArgs& a, int layer, float* tile, float (*qs)[MAX_HD], int* flag) {
    const int group = a.heads / a.kv_heads, kv_dim = a.kv_heads * a.hd, vecs = a.hd / 4, stride = a.hd + 4;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u64 base = a.kv_base[0];
    float* ks = tile;
    float* vs = tile + CL_TILE * stride;
    for (int item = blockIdx.x; item < a.kv_heads * a.spans; item += gridDim.x) {
        const int kvh = item / a.spans, rank = item % a.spans;
        const ClusterSpan c = cluster_span(a.positions[0] + 1, a.window, a.spans, rank);
        for (int i = threadIdx.x; i < group * vecs; i += DS_THREADS) {
            const int g = i / vecs, d = 4 * (i % vecs);
            *(float4*)&qs[g][d] = __ldcg((const float4*)(a.qkv + (kvh * group + g) * a.hd + d));
        }
        float m[4], l[4], acc[4][HD_PER_LANE];
        reset_states(m, l, acc);
        for (int i = 0; i < c.tiles; i++) {
            const int t0 = c.lo + i * CL_TILE, count = min(CL_TILE, c.hi - t0);
            for (int e = threadIdx.x; e < count * vecs; e += DS_THREADS) {
                const int j = e / vecs, d = 4 * (e % vecs);
                *(float4*)(ks + j * stride + d) = __ldcg((const float4*)(kv_row(base, t0 + j, layer, a.n_layers, 0, kv_dim) + kvh * a.hd + d));
                *(float4*)(vs + j * stride + d) = __ldcg((const float4*)(kv_row(base, t0 + j, layer, a.n_layers, 1, kv_dim) + kvh * a.hd + d));
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
            __threadfence();
            *flag = atomicAdd(&a.sync[2 + kvh], 1u) == (unsigned)a.spans - 1;
            if (*flag) __threadfence();
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
}

// Trace kinds of the phases (kernels/src/device/trace.rs): 24 QKV, 25 attention, 26 o, 27 gate/up,
// 28 down, 29 the output projection.
#define TRACE_STEP 24

// qs: the query heads of an attention item; scratch: block sums; flag: "this block merges".
template <bool BF16, int S>
__device__ __forceinline__ void decode_step_body(const StepArgs& a, float (*qs)[MAX_HD], float* scratch, int* flag) {
    extern __shared__ __align__(128) unsigned char smem[];
    pdl_launch();
    uint4* ring = (uint4*)smem;
    float* xs = (float*)(smem + (size_t)S * 2 * DS_THREADS * 16);
    Cursor cur;
    cursor_phase<BF16>(cur, a, 0);
    // The first S groups of weights before waiting for the embedding kernel.
#pragma unroll
    for (int i = 0; i < S; i++) stream_issue<BF16>(cur, a, ring, i);
    int slot = 0;
    unsigned target = 0;
    pdl_wait();
    for (int layer = 0; layer <= a.n_layers; layer++) {
        const bool head = layer == a.n_layers;
        const u64* l = a.layers + (size_t)layer * DS_LAYER_PTRS;
        trace_mark(TRACE_STEP + (head ? 5 : 0), TRACE_START);
        if (layer > 0) grid_barrier(a.sync, target);
        trace_mark(TRACE_STEP + (head ? 5 : 0), TRACE_WAITED);
        stage_row(a.x, a.dim, head ? a.head_norm : (const float*)l[4], a.eps, a.round_x, xs, scratch);
        trace_mark(TRACE_STEP + (head ? 5 : 0), TRACE_STAGED);
        stream_phase<BF16, S>(a, 4 * layer, layer, xs, ring, slot, cur);
        trace_end(TRACE_STEP + (head ? 5 : 0), TRACE_END);
        if (head) break;

        trace_mark(TRACE_STEP + 1, TRACE_START);
        grid_barrier(a.sync, target);
        trace_mark(TRACE_STEP + 1, TRACE_WAITED);
        step_attention(a, layer, xs, qs, flag);
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
            stream_phase<BF16, S>(a, 4 * layer + p, layer, xs, ring, slot, cur);
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

// Ring slots per thread (S groups of 32 bytes): 10 where shared memory allows, else 6.
// (The static arrays live here, not in the instantiations, which would each get their own.)
template <bool BF16>
__device__ __forceinline__ void decode_step_dispatch(const StepArgs& a, int slots) {
    __shared__ __align__(16) float qs[16][MAX_HD];
    __shared__ float scratch[33];
    __shared__ int flag;
    if (slots >= 10) decode_step_body<BF16, 10>(a, qs, scratch, &flag);
    else decode_step_body<BF16, 6>(a, qs, scratch, &flag);
}

#define DECODE_STEP_PARAMS                                                                                                              \
    const u64 *__restrict__ layers, const float *__restrict__ head_norm, float *x, float *qkv, float *att, float *act, float *logits,    \
        float *part_o, float *part_ml, unsigned *sync, const int *positions, const u64 *kv_base, int n_layers, int dim, int ffn, int heads, \
        int kv_heads, int hd, int vocab, float rope_base, float eps, float scale, int window, int spans, int round_x, int slots

#define DECODE_STEP_ARGS                                                                                                               \
    StepArgs a = {layers, head_w, head_norm, x, qkv, att, act, logits, part_o, part_ml, sync, positions, kv_base, n_layers, dim, ffn, \
                  heads, kv_heads, hd, vocab, rope_base, eps, scale, window, spans, round_x}

extern "C" __global__ void __launch_bounds__(DS_THREADS, 1) decode_step_bf16(const bf16_t* __restrict__ head_w, DECODE_STEP_PARAMS) {
    DECODE_STEP_ARGS;
    decode_step_dispatch<true>(a, slots);
}

extern "C" __global__ void __launch_bounds__(DS_THREADS, 1) decode_step_f32(const float* __restrict__ head_w, DECODE_STEP_PARAMS) {
    DECODE_STEP_ARGS;
    decode_step_dispatch<false>(a, slots);
}
