#version 450
// Attention of one query head of one token per workgroup, over the cache rows [key0, pos]
// (key0 = 0, or with a sliding window of W keys pos + 1 - W once pos + 1 > W): in the
// CPU's pages of 256 positions, from the page of key0, an online softmax per page:
//   s_j = scale * q . k_j           (each by one invocation, sequential over the head)
//   m' = max(m, max_j s_j); c = exp(m - m'); l = l c + sum_j exp(s_j - m')
//   acc = acc c + sum_j exp(s_j - m') v_j   (each output dim by one invocation, j in order)
// With sinks (gpt-oss), head h's learned logit sk[h] joins the max and the denominator
// at the end and takes no value: m* = max(m, sk); out = acc e^(m - m*) / (l e^(m - m*) +
// e^(sk - m*)), as the CPU's attn_item. The sums over a block use a tree whose shape
// depends on the block and the query's position alone. A token's result therefore depends
// only on its own positions, never on the other queries.
//
// Cost: 4 (pos + 1) d_head bytes of F16 K and V per query head and token (a KV head's rows
// read again by each head of its group and each token), 4 (pos + 1) d_head FLOP: about 1
// FLOP per byte, bandwidth-bound (docs/gpu.md).
//
// Cache layout: pages of 256 positions, [page][n_kv][256][head_dim] (the CPU's pages end
// to end), F32 or (F16 = 1) halves packed in uints.
// Queries and outputs are rows row0.. of their buffers (one sequence of a step over
// several; token t of the dispatch is at position pos0 + t).
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint F16 = 0;

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { uint kc[]; };
layout(std430, binding = 2) readonly buffer V { uint vc[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(std430, binding = 4) readonly buffer S { float sk[]; }; // (n_head), when p.sinks

layout(push_constant) uniform P {
    uint head_dim;
    uint n_kv;      // kv heads (a page holds n_kv heads' rows)
    uint q_stride;
    uint out_stride;
    uint pos0;
    uint group;     // query heads per kv head
    float scale;
    uint n_tok;
    uint row0;      // the dispatch's first row of q and o
    uint window;    // keys a query sees, its own included (0: every earlier key)
    uint sinks;     // 1: add sk[h] to head h's softmax
} p;

shared float s[256];
shared float red[64];

float cache_at(uint which, uint idx) {
    if (F16 != 0u) {
        const vec2 v = unpackHalf2x16(which == 0u ? kc[idx >> 1] : vc[idx >> 1]);
        return (idx & 1u) == 0u ? v.x : v.y;
    }
    return uintBitsToFloat(which == 0u ? kc[idx] : vc[idx]);
}

void main() {
    const uint t = gl_WorkGroupID.x, h = gl_WorkGroupID.y;
    const uint lid = gl_LocalInvocationID.x;
    const uint hd = p.head_dim, g = h / p.group;
    const uint pos = p.pos0 + t;
    const uint qo = (p.row0 + t) * p.q_stride + h * hd;
    float m = -1.0 / 0.0, l = 0.0;
    float acc[4] = float[4](0.0, 0.0, 0.0, 0.0); // dims lid, lid + 64, lid + 128, lid + 192
    const uint key0 = p.window != 0u && pos + 1u > p.window ? pos + 1u - p.window : 0u;
    for (uint b0 = key0 & ~255u; b0 <= pos; b0 += 256u) {
        const uint j0 = key0 > b0 ? key0 - b0 : 0u; // the page's rows [j0, nb)
        const uint nb = min(256u, pos + 1u - b0);
        const uint base = ((b0 >> 8) * p.n_kv + g) * 256u * hd; // head g's rows of this page
        for (uint j = j0 + lid; j < nb; j += 64u) {
            precise float d = 0.0;
            const uint ko = base + j * hd;
            for (uint e = 0u; e < hd; e++) d += q[qo + e] * cache_at(0u, ko + e);
            s[j] = p.scale * d;
        }
        barrier();
        float mx = -1.0 / 0.0;
        for (uint j = j0 + lid; j < nb; j += 64u) mx = max(mx, s[j]);
        red[lid] = mx;
        barrier();
        for (uint w = 32u; w > 0u; w >>= 1) {
            if (lid < w) red[lid] = max(red[lid], red[lid + w]);
            barrier();
        }
        const float mn = max(m, red[0]);
        const float c = exp(m - mn);
        barrier();
        precise float ps = 0.0;
        for (uint j = j0 + lid; j < nb; j += 64u) {
            const float e = exp(s[j] - mn);
            s[j] = e;
            ps += e;
        }
        red[lid] = ps;
        barrier();
        for (uint w = 32u; w > 0u; w >>= 1) {
            if (lid < w) {
                precise float v = red[lid] + red[lid + w];
                red[lid] = v;
            }
            barrier();
        }
        precise float ln = l * c + red[0];
        l = ln;
        for (uint r = 0u; r < 4u; r++) {
            const uint e = lid + 64u * r;
            if (e >= hd) break;
            precise float a = acc[r] * c;
            for (uint j = j0; j < nb; j++) a += s[j] * cache_at(1u, base + j * hd + e);
            acc[r] = a;
        }
        m = mn;
        barrier();
    }
    float a = 1.0;
    precise float lt = l;
    if (p.sinks != 0u) { // one more logit in the max and the denominator, no value
        const float sv = sk[h];
        if (sv > m) {
            a = exp(m - sv);
            lt = l * a + 1.0;
        } else {
            lt = l + exp(sv - m);
        }
    }
    const float inv = a / lt;
    for (uint r = 0u; r < 4u; r++) {
        const uint e = lid + 64u * r;
        if (e < hd) o[(p.row0 + t) * p.out_stride + h * hd + e] = acc[r] * inv;
    }
}
