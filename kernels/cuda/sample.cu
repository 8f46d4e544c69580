// Sampling on the device, so that a decode step copies back a token and not a vocabulary of logits.
// One block (1024 threads) per row of `vocab` logits.

#define ARGMAX_HELD 8
#define ARGMAX_MERGE_HELD 2

// Greedy, one row over many blocks: grid (rows, blocks), 256 threads. Each block takes a slice of the
// row: its maximum (first index on ties, as the host sampler), and the sum of exp(logit - its max);
// the last block of the row to finish (a counter in `counters`, reset by it) merges the partials into
// the row's token and the log-probability of that token. With `next_ids` (and `next_positions`), it
// also writes the row's next decode inputs: the token as the next id, the position plus one.
extern "C" __global__ void argmax_logprob(const float* __restrict__ logits, int vocab, int* __restrict__ token, float* __restrict__ logprob,
                                          float* __restrict__ part_v, int* __restrict__ part_i, float* __restrict__ part_s,
                                          int* __restrict__ counters, int* __restrict__ next_ids, int* __restrict__ next_positions) {
    pdl_launch();
    trace_mark(TRACE_ARGMAX, TRACE_START);
    pdl_wait();
    trace_mark(TRACE_ARGMAX, TRACE_WAITED);
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    __shared__ float scratch[33];
    __shared__ int last;
    int row = blockIdx.x, b = blockIdx.y, blocks = gridDim.y;
    const float* r = logits + (size_t)row * vocab;
    int per = (vocab + blocks - 1) / blocks;
    int lo = b * per, hi = min(vocab, lo + per);
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    // The thread's first ARGMAX_HELD logits are loaded at once and kept for the exp-sum (one memory
    // latency, not one per logit); a longer slice goes on in the loop. Same order either way.
    float held[ARGMAX_HELD];
#pragma unroll
    for (int k = 0; k < ARGMAX_HELD; k++) {
        int i = lo + threadIdx.x + k * blockDim.x;
        held[k] = i < hi ? r[i] : NEG_INF;
    }
#pragma unroll
    for (int k = 0; k < ARGMAX_HELD; k++) {
        if (held[k] > bv) { bv = held[k]; bi = lo + threadIdx.x + k * blockDim.x; }
    }
    for (int i = lo + threadIdx.x + ARGMAX_HELD * blockDim.x; i < hi; i += blockDim.x) {
        float v = r[i];
        if (v > bv) { bv = v; bi = i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffff, bv, o);
        int oi = __shfl_xor_sync(0xffffffff, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) { best_v[warp] = bv; best_i[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = lane < warps ? best_v[lane] : NEG_INF;
        bi = lane < warps ? best_i[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffff, bv, o);
            int oi = __shfl_xor_sync(0xffffffff, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { best_v[0] = bv; best_i[0] = bi; }
    }
    __syncthreads();
    float mx = best_v[0];
    float sum = 0.0f;
    if (mx != NEG_INF) {
#pragma unroll
        for (int k = 0; k < ARGMAX_HELD; k++) {
            if (lo + threadIdx.x + k * blockDim.x < hi) sum += expf(held[k] - mx);
        }
        for (int i = lo + threadIdx.x + ARGMAX_HELD * blockDim.x; i < hi; i += blockDim.x) sum += expf(r[i] - mx);
    }
    sum = block_sum(sum, scratch);
    size_t slot = (size_t)row * blocks + b;
    if (threadIdx.x == 0) {
        part_v[slot] = mx;
        part_i[slot] = best_i[0];
        part_s[slot] = sum;
        __threadfence();
        last = atomicAdd(&counters[row], 1) == blocks - 1;
    }
    __syncthreads();
    if (!last || warp != 0) return;
    __threadfence();
    // Warp 0 of the last block merges the row's partials (blocks <= 1024, 32 per lane at most). A lane's
    // first ARGMAX_MERGE_HELD partials are loaded at once and kept for the sum (one round trip to L2,
    // not one for the maximum and another for the sum); more go on in loops. Same order either way.
    const size_t part = (size_t)row * blocks;
    float hv[ARGMAX_MERGE_HELD], hs[ARGMAX_MERGE_HELD];
    int hx[ARGMAX_MERGE_HELD];
#pragma unroll
    for (int h = 0; h < ARGMAX_MERGE_HELD; h++) {
        const int k = lane + 32 * h;
        const bool in = k < blocks;
        hv[h] = in ? __ldcg(&part_v[part + k]) : NEG_INF;
        hx[h] = in ? __ldcg(&part_i[part + k]) : 0x7fffffff;
        hs[h] = in ? __ldcg(&part_s[part + k]) : 0.0f;
    }
    float m = NEG_INF;
    int idx = 0x7fffffff;
#pragma unroll
    for (int h = 0; h < ARGMAX_MERGE_HELD; h++) {
        if (hv[h] > m || (hv[h] == m && hx[h] < idx)) { m = hv[h]; idx = hx[h]; }
    }
    for (int k = lane + 32 * ARGMAX_MERGE_HELD; k < blocks; k += 32) {
        float v = __ldcg(&part_v[part + k]);
        int i = __ldcg(&part_i[part + k]);
        if (v > m || (v == m && i < idx)) { m = v; idx = i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffff, m, o);
        int oi = __shfl_xor_sync(0xffffffff, idx, o);
        if (ov > m || (ov == m && oi < idx)) { m = ov; idx = oi; }
    }
    float total = 0.0f;
#pragma unroll
    for (int h = 0; h < ARGMAX_MERGE_HELD; h++) {
        if (hv[h] != NEG_INF) total += hs[h] * expf(hv[h] - m);
    }
    for (int k = lane + 32 * ARGMAX_MERGE_HELD; k < blocks; k += 32) {
        float v = __ldcg(&part_v[part + k]);
        if (v != NEG_INF) total += __ldcg(&part_s[part + k]) * expf(v - m);
    }
    total = warp_sum(total);
    // A row with no maximum (every logit NaN, or -inf) picks token 0, as the host's argmax does, not
    // the sentinel: a decode pass feeds its pick to the next step's embedding gather on the device.
    if (idx == 0x7fffffff) idx = 0;
    if (lane == 0) {
        token[row] = idx;
        logprob[row] = -logf(total);
        counters[row] = 0;
        // A decode pass's inputs for the next step, if asked: row r's next token is its pick, at the
        // next position (every kernel of this pass that reads the positions has finished: this one
        // waited for them).
        if (next_ids) {
            next_ids[row] = idx;
            next_positions[row] += 1;
        }
    }
    trace_mark(TRACE_ARGMAX, TRACE_END);  // the merging warp only
}

// Temperature + top-p: keeps the smallest set of most probable tokens whose mass reaches top_p (found
// by bisecting the probability threshold, no sort), then draws with uniforms[row] (the host's seeded
// generator) over the kept tokens in index order. The kept set and its distribution are the host
// sampler's; which token a given uniform maps to differs (the host walks the set by probability).
// logprob: the chosen token's log-probability at temperature 1 (as the host reports it).
extern "C" __global__ void top_p_sample(const float* __restrict__ logits, int vocab, const float* __restrict__ temperature,
                                        const float* __restrict__ top_p, const float* __restrict__ uniforms, int* __restrict__ token,
                                        float* __restrict__ logprob) {
    pdl_launch();
    pdl_wait();
    __shared__ float scratch[33];
    __shared__ float best_v[32];
    __shared__ int chosen;
    const float* row = logits + (size_t)blockIdx.x * vocab;
    float t = temperature[blockIdx.x], want = top_p[blockIdx.x];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float mx = NEG_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, row[i]);
    mx = warp_max(mx);
    if (lane == 0) best_v[warp] = mx;
    __syncthreads();
    mx = NEG_INF;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) mx = fmaxf(mx, best_v[w]);
    float total = 0.0f, plain = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        total += expf((row[i] - mx) / t);
        plain += expf(row[i] - mx);
    }
    total = block_sum(total, scratch);
    plain = block_sum(plain, scratch);
    // Largest threshold p* (relative probability in (0, 1]) whose kept mass reaches top_p.
    float lo = 0.0f, hi = 1.0f;
    for (int it = 0; it < 40; it++) {
        float mid = 0.5f * (lo + hi), mass = 0.0f;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            float p = expf((row[i] - mx) / t);
            if (p >= mid) mass += p;
        }
        mass = block_sum(mass, scratch);
        if (mass / total >= want) lo = mid; else hi = mid;
    }
    float kept_mass = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float p = expf((row[i] - mx) / t);
        if (p >= lo) kept_mass += p;
    }
    kept_mass = block_sum(kept_mass, scratch);
    float target = uniforms[blockIdx.x] * kept_mass;
    if (threadIdx.x == 0) chosen = -1;
    // Walk the kept tokens in index order, a block-wide chunk at a time, until the running mass passes
    // the target.
    float before = 0.0f;
    for (int c0 = 0; c0 < vocab; c0 += blockDim.x) {
        int i = c0 + threadIdx.x;
        float p = 0.0f;
        if (i < vocab) {
            p = expf((row[i] - mx) / t);
            if (p < lo) p = 0.0f;
        }
        // Inclusive scan of p across the block.
        float v = p;
        for (int o = 1; o < 32; o <<= 1) {
            float u = __shfl_up_sync(0xffffffff, v, o);
            if (lane >= o) v += u;
        }
        __syncthreads();
        if (lane == 31) best_v[warp] = v;
        __syncthreads();
        float offset = 0.0f;
        for (int w = 0; w < warp; w++) offset += best_v[w];
        float incl = before + offset + v;
        if (p > 0.0f && incl > target && incl - p <= target) atomicMax(&chosen, i);
        float chunk_total = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) chunk_total += best_v[w];
        before += chunk_total;
        __syncthreads();
        if (chosen >= 0) break;
    }
    if (threadIdx.x == 0) {
        if (chosen < 0) {
            // Rounding left the target past the last kept token: take the most probable one.
            int arg = 0;
            for (int i = 0; i < vocab; i++) if (row[i] == mx) { arg = i; break; }
            chosen = arg;
        }
        token[blockIdx.x] = chosen;
        // Reported at temperature 1, as the host sampler does.
        logprob[blockIdx.x] = row[chosen] - mx - logf(plain);
    }
}
