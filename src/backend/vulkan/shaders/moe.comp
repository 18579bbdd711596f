#version 450
// The mixture-of-experts block's own steps (model/moe.h gives the CPU's math), OP a
// specialization constant:
//   0 route:   one invocation per token: softmax over the token's n_expert router logits
//              (the CPU's order: max, exp(l - max) summed in id order, times 1 / sum), the
//              n_used largest in descending order (ties to the lowest id: strict >, ids
//              ascending), their weights renormalised to sum 1 (the sum clamped from below
//              as llama.cpp does) when norm_topk, then scaled. Writes ids[t][j], wts[t][j].
//   1 combine: one invocation per output element: y[t][i] = sum_j wts[t][j] d[t n_used + j][i]
//              in rank order (plus sigmoid(sw[t]) sd[t][i] when shared), as the CPU's combine.
//   2 group:   one invocation: the n_tok slots (here: ids[0..n_tok)) ordered by expert, slots
//              of one expert in slot order (the CPU's grouping), into order[]: a stable
//              counting sort, so the order is a function of the ids alone. Ids past
//              n_expert go last. Then the tiles of the experts' matmul: order[n_tok] = their
//              count, then (start, count) per tile, each expert's run cut into tiles of
//              up to `tile` consecutive slots (the matmul's tile: 8, or 1), in order.
//   3 bias:    one invocation per element of n_tok slot rows of n: y[s][i] += eb[ids[s]][i],
//              the expert's own bias row (gpt-oss's gate, up and down biases); an id past
//              n_expert gives NaN, never a read outside eb.
// A token's results depend on its own rows alone.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint OP = 0;

layout(std430, binding = 0) buffer B0 { float logits[]; };  // route: (n_tok, n_expert); combine, bias: y (n_tok, n)
layout(std430, binding = 1) buffer B1 { uint ids[]; };      // route: out (n_tok, n_used)
layout(std430, binding = 2) buffer B2 { float wts[]; };     // (n_tok, n_used)
layout(std430, binding = 3) readonly buffer B3 { float sd[]; }; // combine, shared: (n_tok, n)
layout(std430, binding = 4) readonly buffer B4 { float sw[]; }; // combine, shared: (n_tok)
layout(std430, binding = 5) readonly buffer B5 { float d[]; };  // combine: (n_tok n_used, n) the experts' outputs
layout(std430, binding = 6) buffer B6 { uint order[]; };        // group: out (n_tok)
layout(std430, binding = 7) readonly buffer B7 { float eb[]; }; // bias: (n_expert, n)

layout(push_constant) uniform P {
    uint n_tok;
    uint n_expert; // route
    uint n_used;
    uint norm_topk; // route
    float scale;    // route
    uint n;         // combine: the row length
    uint shared_;   // combine: add the shared expert
    uint softmax_weight; // route: gpt-oss's gate
    uint tile;      // group: slots per tile (8, or 1: tern_vk_moe_tile)
} p;

// The softmax over the X logits from lo, in place (the CPU's order).
void softmax_all(uint lo, uint X) {
    float mx = logits[lo];
    for (uint e = 1; e < X; e++)
        if (logits[lo + e] > mx) mx = logits[lo + e];
    precise float sum = 0.0;
    for (uint e = 0; e < X; e++) {
        const float v = exp(logits[lo + e] - mx);
        logits[lo + e] = v;
        sum += v;
    }
    const float inv = 1.0 / sum;
    for (uint e = 0; e < X; e++) {
        precise float v = logits[lo + e] * inv;
        logits[lo + e] = v;
    }
}

void route(uint t) {
    const uint X = p.n_expert, K = p.n_used, lo = t * X;
    if (p.softmax_weight == 0u) softmax_all(lo, X);
    // top-K (at most 1024 experts: moe.h's limit, checked by the host)
    uint taken[32];
    for (uint i = 0; i < 32u; i++) taken[i] = 0u;
    precise float tsum = 0.0;
    for (uint j = 0; j < K; j++) {
        uint best = 0;
        while (((taken[best >> 5] >> (best & 31u)) & 1u) != 0u) best++;
        for (uint e = best + 1; e < X; e++)
            if (((taken[e >> 5] >> (e & 31u)) & 1u) == 0u && logits[lo + e] > logits[lo + best]) best = e;
        taken[best >> 5] |= 1u << (best & 31u);
        const float pb = logits[lo + best];
        ids[t * K + j] = best;
        wts[t * K + j] = pb;
        tsum += pb;
    }
    if (p.softmax_weight != 0u) {
        float wm = wts[t * K];
        for (uint j = 1; j < K; j++)
            if (wts[t * K + j] > wm) wm = wts[t * K + j];
        precise float ws = 0.0;
        for (uint j = 0; j < K; j++) {
            const float v = exp(wts[t * K + j] - wm);
            wts[t * K + j] = v;
            ws += v;
        }
        const float winv = 1.0 / ws;
        for (uint j = 0; j < K; j++) {
            precise float v = wts[t * K + j] * winv;
            wts[t * K + j] = v;
        }
    }
    if (p.norm_topk != 0) {
        if (!(tsum >= 6.103515625e-5)) tsum = 6.103515625e-5;
        for (uint j = 0; j < K; j++) {
            precise float v = wts[t * K + j] / tsum;
            wts[t * K + j] = v;
        }
    }
    if (p.scale != 1.0)
        for (uint j = 0; j < K; j++) {
            precise float v = wts[t * K + j] * p.scale;
            wts[t * K + j] = v;
        }
}

void group() {
    uint start[1025]; // per expert (and one bucket for bad ids): counts, then where its slots go
    for (uint e = 0; e <= p.n_expert; e++) start[e] = 0u;
    for (uint s = 0; s < p.n_tok; s++) start[min(ids[s], p.n_expert)]++;
    uint off = 0;
    for (uint e = 0; e <= p.n_expert; e++) {
        const uint c = start[e];
        start[e] = off;
        off += c;
    }
    for (uint s = 0; s < p.n_tok; s++) {
        const uint e = min(ids[s], p.n_expert);
        order[start[e]++] = s;
    }
    // start[e] is now the end of expert e's run (the bucket of bad ids last)
    const uint tile = max(p.tile, 1u);
    uint n_tiles = 0u, from = 0u;
    for (uint e = 0; e <= p.n_expert; e++) {
        for (uint i = from; i < start[e]; i += tile) {
            order[p.n_tok + 1u + 2u * n_tiles] = i;
            order[p.n_tok + 2u + 2u * n_tiles] = min(tile, start[e] - i);
            n_tiles++;
        }
        from = start[e];
    }
    order[p.n_tok] = n_tiles;
}

void main() {
    if (OP == 3) {
        const uint i = gl_GlobalInvocationID.x, sl = gl_GlobalInvocationID.y;
        if (i >= p.n || sl >= p.n_tok) return;
        const uint e = ids[sl];
        precise float v = logits[sl * p.n + i] + (e < p.n_expert ? eb[e * p.n + i] : uintBitsToFloat(0x7fc00000u));
        logits[sl * p.n + i] = v;
        return;
    }
    if (OP == 2) {
        if (gl_GlobalInvocationID.x == 0) group();
        return;
    }
    if (OP == 0) {
        const uint t = gl_GlobalInvocationID.x;
        if (t < p.n_tok) route(t);
        return;
    }
    const uint i = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
    if (i >= p.n || t >= p.n_tok) return;
    const uint K = p.n_used;
    precise float acc = d[(t * K) * p.n + i] * wts[t * K];
    for (uint j = 1; j < K; j++) acc += d[(t * K + j) * p.n + i] * wts[t * K + j];
    if (p.shared_ != 0) {
        const float gate = 1.0 / (1.0 + exp(-sw[t]));
        acc += sd[t * p.n + i] * gate;
    }
    logits[t * p.n + i] = acc;
}
