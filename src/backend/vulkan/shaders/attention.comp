#version 450
// Attention over the cache rows [key0, pos] of each query (key0 = 0, or with a sliding
// window of W keys pos + 1 - W once pos + 1 > W), a tile of queries per workgroup: up to QH
// query heads of one KV head (the heads of a GQA group read the same K and V rows) times up
// to QT consecutive tokens, at most QMAX queries. The tile streams the rows its queries see
// through shared memory, `rows` at a time, so each K and V row is read from device memory
// once per tile instead of once per query ("flash" attention's tiles). Per query the
// arithmetic is fixed by its own position alone, in the CPU's pages of 256 positions from
// the page of key0. Each page gives a partial softmax of its own:
//   s_j = scale * q . k_j           (each by one invocation, sequential over the head)
//   m_p = max_j s_j;  l_p = sum_j exp(s_j - m_p);  a_p = sum_j exp(s_j - m_p) v_j
// (the sum over a page is 64 lane partials, lane i: j = j0 + i, j0 + i + 64, ... in order,
// met in a fixed pairwise tree; a_p's output dims each by one invocation, j in order), and
// the pages are folded in order, the first taken as it is (fold()):
//   m' = max(m, m_p); l = l e^(m - m') + l_p e^(m_p - m'); a = a e^(m - m') + a_p e^(m_p - m').
// The tile decides which workgroup computes a query and beside which others, never its
// bits: a query gives the same bits alone, among the tokens of a chunk, and in any tile
// shape (test-vulkan checks 1 x 1 against the others).
// Split over the pages (flash-decoding; p.split): a decode step has one query per head and
// few KV heads, too few workgroups for a GPU at a long context. Mode 1 gives each page of the
// dispatch a workgroup (z) that writes each query's page partial (m_p, l_p, a_p) to `part`;
// mode 2 (a workgroup per token and head) folds them in page order with the same fold() and
// finishes as mode 0, which folds in the shader. The fold is one function of the partials,
// so both give the same bits (test-vulkan compares them); only the workgroups differ.
// With sinks (gpt-oss), head h's learned logit sk[h] joins the max and the denominator
// at the end and takes no value: m* = max(m, sk); out = acc e^(m - m*) / (l e^(m - m*) +
// e^(sk - m*)), as the CPU's attn_item.
//
// Cost (docs/gpu.md): per tile, 2 (pos + 1) d_head cache elements (F16: 4 (pos + 1) d_head
// bytes) read from device memory once and 4 (pos + 1) d_head FLOP per query: up to QMAX
// (8) FLOP per byte for a full tile, where one query per workgroup was about 1. Mode 1
// moves 4 (d_head + 2) bytes per query and page more, twice (written, read by mode 2).
//
// Cache layout: pages of 256 positions, [page][n_kv][256][head_dim] (the CPU's pages end
// to end), F32 or (F16 = 1) halves packed in uints.
// Queries and outputs are rows row0.. of their buffers (one sequence of a step over
// several; token t of the dispatch is at position pos0 + t).
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint F16 = 0;
// Words of shared memory for staged cache rows (16 KiB where the device has 32; vulkan.c).
layout(constant_id = 1) const uint STAGE = 4096u;
const uint QMAX = 8u;

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { uint kc[]; };
layout(std430, binding = 2) readonly buffer V { uint vc[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(std430, binding = 4) readonly buffer S { float sk[]; }; // (n_head), when p.sinks
// Mode 1's page partials: query (t, h) of the dispatch, page page0 + z at
// ((t n_head + h) npages + z) (head_dim + 2): m_p, l_p, then a_p
layout(std430, binding = 5) buffer R { float part[]; };

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
    uint qh;        // the tile: query heads (of one group) ...
    uint qt;        // ... times tokens, qh qt <= QMAX
    uint split;     // 0: fold in the shader; 1: write page partials; 2: fold them
    uint page0;     // (modes 1, 2) the dispatch's first page: its first token's key0's
    uint npages;    // (modes 1, 2) pages from page0 to its last token's
} p;

shared float s[QMAX * 256u]; // each query's scores, then weights, of the page
shared float red[QMAX * 64u]; // each query's lane partials
shared uint kv[STAGE];        // cache rows [r0, r0 + nr) of the page, K or V

// Query i's rows [j0, nb) of the page at b0 (empty when nb <= j0); its token is t0 + i / nh.
void qrange(uint i, uint nh, uint t0, uint b0, out uint j0, out uint nb) {
    const uint pos = p.pos0 + t0 + i / nh;
    const uint key0 = p.window != 0u && pos + 1u > p.window ? pos + 1u - p.window : 0u;
    j0 = key0 > b0 ? key0 - b0 : 0u;
    nb = pos < b0 ? 0u : min(256u, pos + 1u - b0);
}

// Element e of staged row j (rw words a row).
float staged(uint j, uint rw, uint e) {
    if (F16 != 0u) {
        const vec2 v = unpackHalf2x16(kv[j * rw + (e >> 1)]);
        return (e & 1u) == 0u ? v.x : v.y;
    }
    return uintBitsToFloat(kv[j * rw + e]);
}

// Folds a page's partial (mp, lp, ap) into a query's (m, l, a): the same operations in
// modes 0 and 2. The first page is taken as it is (no e^(-inf) to lean on).
void fold(inout float m, inout float l, inout vec4 a, float mp, float lp, vec4 ap) {
    if (m == -1.0 / 0.0) {
        m = mp, l = lp, a = ap;
        return;
    }
    const float mn = max(m, mp), c = exp(m - mn), cp = exp(mp - mn);
    precise float ln = l * c + lp * cp;
    precise vec4 an = a * c + ap * cp;
    m = mn, l = ln, a = an;
}

// Query (row, head h)'s output from its folded (m, l, a): sinks, then 1 / l.
void finish(uint row, uint h, float m, float l, vec4 a) {
    const uint hd = p.head_dim;
    float c = 1.0;
    precise float lt = l;
    if (p.sinks != 0u) { // one more logit in the max and the denominator, no value
        const float sv = sk[h];
        if (sv > m) {
            c = exp(m - sv);
            lt = l * c + 1.0;
        } else {
            lt = l + exp(sv - m);
        }
    }
    const float inv = c / lt;
    for (uint r = 0u; r < 4u; r++) {
        const uint e = gl_LocalInvocationID.x + 64u * r;
        if (e < hd) o[row * p.out_stride + h * hd + e] = a[r] * inv;
    }
}

// Where query (dispatch token t, head h)'s partial of page pg starts in `part`.
uint part_at(uint t, uint h, uint pg) {
    return ((t * p.group * p.n_kv + h) * p.npages + pg - p.page0) * (p.head_dim + 2u);
}

// Mode 2: query (token x, head y)'s page partials folded in page order.
void fold_pages() {
    const uint lid = gl_LocalInvocationID.x, hd = p.head_dim;
    const uint t = gl_WorkGroupID.x, h = gl_WorkGroupID.y, pos = p.pos0 + t;
    const uint key0 = p.window != 0u && pos + 1u > p.window ? pos + 1u - p.window : 0u;
    float m = -1.0 / 0.0, l = 0.0;
    vec4 a = vec4(0.0);
    for (uint pg = key0 >> 8; pg <= pos >> 8; pg++) {
        const uint base = part_at(t, h, pg);
        vec4 ap = vec4(0.0);
        for (uint r = 0u; r < 4u; r++)
            if (lid + 64u * r < hd) ap[r] = part[base + 2u + lid + 64u * r];
        fold(m, l, a, part[base], part[base + 1u], ap);
    }
    finish(p.row0 + t, h, m, l, a);
}

void main() {
    if (p.split == 2u) {
        fold_pages();
        return;
    }
    const uint lid = gl_LocalInvocationID.x;
    const uint hd = p.head_dim, rw = F16 != 0u ? hd / 2u : hd;
    const uint tiles_h = (p.group + p.qh - 1u) / p.qh;
    const uint g = gl_WorkGroupID.y / tiles_h;
    const uint h0 = g * p.group + (gl_WorkGroupID.y % tiles_h) * p.qh;
    const uint nh = min(p.qh, (g + 1u) * p.group - h0);
    const uint t0 = gl_WorkGroupID.x * p.qt;
    const uint nq = nh * min(p.qt, p.n_tok - t0); // query i: head h0 + i % nh, token t0 + i / nh
    const uint rows = min(256u, STAGE / rw);
    float m[QMAX], l[QMAX], mp[QMAX], lp[QMAX];
    vec4 a[QMAX], acc[QMAX]; // query i's dims lid, lid + 64, lid + 128, lid + 192
    for (uint i = 0u; i < QMAX; i++) m[i] = -1.0 / 0.0, l[i] = 0.0, mp[i] = 0.0, lp[i] = 0.0, a[i] = vec4(0.0);
    const uint posf = p.pos0 + t0, posl = p.pos0 + t0 + nq / nh - 1u;
    const uint keyf = p.window != 0u && posf + 1u > p.window ? posf + 1u - p.window : 0u;
    uint bf = keyf & ~255u, bl = posl;
    if (p.split == 1u) { // this workgroup's page only (uniform: the whole workgroup leaves)
        const uint b = (p.page0 + gl_WorkGroupID.z) * 256u;
        if (b < bf || b > posl) return;
        bf = b, bl = b;
    }
    for (uint b0 = bf; b0 <= bl; b0 += 256u) {
        // the rows any query of the tile sees: from the first token's start to the last's end
        const uint ja = keyf > b0 ? keyf - b0 : 0u, jb = min(256u, posl + 1u - b0);
        const uint wbase = ((b0 >> 8) * p.n_kv + g) * 256u * rw; // head g's rows of this page
        for (uint r0 = ja; r0 < jb; r0 += rows) {
            const uint nr = min(rows, jb - r0);
            barrier(); // every reader of the rows before is done
            for (uint x = lid; x < nr * rw; x += 64u) kv[x] = kc[wbase + r0 * rw + x];
            barrier();
            for (uint x = lid; x < nq * nr; x += 64u) {
                const uint i = x / nr, j = r0 + x % nr;
                uint j0, nb;
                qrange(i, nh, t0, b0, j0, nb);
                if (j < j0 || j >= nb) continue;
                const uint qo = (p.row0 + t0 + i / nh) * p.q_stride + (h0 + i % nh) * hd;
                precise float d = 0.0;
                for (uint e = 0u; e < hd; e++) d += q[qo + e] * staged(j - r0, rw, e);
                s[i * 256u + j] = p.scale * d;
            }
        }
        barrier();
        for (uint i = 0u; i < nq; i++) {
            uint j0, nb;
            qrange(i, nh, t0, b0, j0, nb);
            float mx = -1.0 / 0.0;
            for (uint j = j0 + lid; j < nb; j += 64u) mx = max(mx, s[i * 256u + j]);
            red[i * 64u + lid] = mx;
        }
        barrier();
        for (uint w = 32u; w > 0u; w >>= 1) {
            if (lid < w)
                for (uint i = 0u; i < nq; i++) red[i * 64u + lid] = max(red[i * 64u + lid], red[i * 64u + lid + w]);
            barrier();
        }
        for (uint i = 0u; i < nq; i++) mp[i] = red[i * 64u];
        barrier();
        for (uint i = 0u; i < nq; i++) {
            uint j0, nb;
            qrange(i, nh, t0, b0, j0, nb);
            precise float ps = 0.0;
            for (uint j = j0 + lid; j < nb; j += 64u) {
                const float e = exp(s[i * 256u + j] - mp[i]);
                s[i * 256u + j] = e;
                ps += e;
            }
            red[i * 64u + lid] = ps;
        }
        barrier();
        for (uint w = 32u; w > 0u; w >>= 1) {
            if (lid < w)
                for (uint i = 0u; i < nq; i++) {
                    precise float v = red[i * 64u + lid] + red[i * 64u + lid + w];
                    red[i * 64u + lid] = v;
                }
            barrier();
        }
        for (uint i = 0u; i < nq; i++) lp[i] = red[i * 64u], acc[i] = vec4(0.0);
        for (uint r0 = ja; r0 < jb; r0 += rows) {
            const uint nr = min(rows, jb - r0);
            barrier();
            for (uint x = lid; x < nr * rw; x += 64u) kv[x] = vc[wbase + r0 * rw + x];
            barrier();
            for (uint i = 0u; i < nq; i++) {
                uint j0, nb;
                qrange(i, nh, t0, b0, j0, nb);
                const uint js = max(j0, r0), je = min(nb, r0 + nr);
                for (uint r = 0u; r < 4u; r++) {
                    const uint e = lid + 64u * r;
                    if (e >= hd) break;
                    precise float v = acc[i][r];
                    for (uint j = js; j < je; j++) v += s[i * 256u + j] * staged(j - r0, rw, e);
                    acc[i][r] = v;
                }
            }
        }
        for (uint i = 0u; i < nq; i++) {
            uint j0, nb;
            qrange(i, nh, t0, b0, j0, nb);
            if (nb <= j0) continue; // the page is not this query's: nothing changes
            if (p.split == 0u) {
                fold(m[i], l[i], a[i], mp[i], lp[i], acc[i]);
                continue;
            }
            const uint base = part_at(t0 + i / nh, h0 + i % nh, b0 >> 8);
            if (lid == 0u) part[base] = mp[i], part[base + 1u] = lp[i];
            for (uint r = 0u; r < 4u; r++)
                if (lid + 64u * r < hd) part[base + 2u + lid + 64u * r] = acc[i][r];
        }
    }
    if (p.split != 0u) return;
    for (uint i = 0u; i < nq; i++) finish(p.row0 + t0 + i / nh, h0 + i % nh, m[i], l[i], a[i]);
}
