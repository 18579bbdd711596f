#version 450
// y[t][r] = dot(w row r, x row t). A workgroup takes WG_ROWS rows and a tile of up to TT
// tokens (each weight decoded once for the tile); a row's LANES invocations split its k
// into chunks of 32 elements (a 32-wide block, a 32-element sub-block of a 256-wide one,
// or 32 floats), lane l taking chunks l, l + LANES, ... in order, so that neighbouring
// invocations read neighbouring bytes of the row (a coalesced read, where one invocation
// per row read addresses a row apart). Each lane sums its chunks in order; the LANES
// partial sums then meet in a fixed pairwise tree in shared memory (no subgroup
// operations, whose shape would be the driver's). The shape of every output's reduction
// depends on k alone, never on how many rows or tokens the dispatch covers, where its
// tile starts, or the subgroup size: decode and prefill give the same bits (DESIGN.md §11).
//
// WTYPE (ggml's type numbers): 0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0,
// 12 Q4_K, 13 Q5_K, 14 Q6_K, 20 IQ4_NL, 23 IQ4_XS, 30 BF16, 39 MXFP4, and the low-bit types 10 Q2_K,
// 11 Q3_K, 16 IQ2_XXS, 17 IQ2_XS, 22 IQ2_S, 18 IQ3_XXS, 21 IQ3_S, 19 IQ1_S, 29 IQ1_M (each
// weight formed as ggml dequantizes it), with ggml's block layouts. Weights are read as 32-bit words (any byte offset); block
// sizes with an F16 scale are even, so those scales sit at even offsets (MXFP4's 17-byte
// blocks have a byte exponent, read bytewise). Within a chunk the products are summed in
// element order, then scaled (a block's d) and added to the lane's sum chunk by chunk.
// The sums are `precise` (no fused multiply-add the driver may choose per pipeline), so
// every pipeline built from this shader rounds the same way.

// A workgroup of 128 invocations computes WG_ROWS rows (of one tile of tokens), LANES
// invocations each (a power of two, at most 32: 32 on a GPU, 1 on a CPU device; vulkan.c).
layout(constant_id = 2) const uint LANES = 32u;
// Invocations per workgroup (3: 128 with several lanes, 64 with one; vulkan.c).
layout(constant_id = 3) const uint WG_SIZE = 128u;
const uint WG_ROWS = WG_SIZE / LANES;
// Cost per output (docs/gpu.md, "What each kernel moves"): k b / 8T bytes of weights (b bits
// per weight, T tokens in the tile), 4k of activations (shared by the workgroup's rows, from
// cache), 2k FLOP: 16T / b FLOP per weight byte (Q4_K: 3.6 at decode, 28 at T = 8).
// Workgroups along x before the row index carries into z (the dispatch's x is at most GX).
const uint GX = 1024u;
layout(local_size_x_id = 3, local_size_y = 1, local_size_z = 1) in;

layout(constant_id = 0) const uint WTYPE = 0;
// INDEXED (the MoE experts' matmul): W holds n_expert matrices expert_stride bytes apart;
// order[] holds the slots grouped by expert (tern_vk_moe_group) and then the tiles: at
// order[n_tok] their count, then (start, count) pairs, each up to TT consecutive entries of
// the grouping that share one expert. The y index of the dispatch is the tile: its slots
// read the expert's rows once for all of them (as the plain matmul's tile of tokens), and
// neighbouring workgroups read the same expert. Slot s's expert is ids[s], its input row x
// row s / x_div (each token's n_used slots share its row for gate/up: x_div = n_used;
// down: 1), its output row y row s. The same reduction as the plain matmul, from the
// expert's rows: the tile decides which workgroup computes a slot and beside which
// others, never its bits.
layout(constant_id = 1) const uint INDEXED = 0;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
// The same weights as 16-byte words (an alias of binding 0), for load16's aligned loads.
layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer I { uint ids[]; };
layout(std430, binding = 4) readonly buffer O { uint order[]; };
// The I-quant grids as compact codes (kernels/quant.h), two 16-bit codes per word:
// IQ2_XXS at word 0, IQ2_XS at 128, IQ2_S at 384, IQ3_XXS at 896, IQ3_S at 1024, IQ1_S at 1280.
layout(std430, binding = 5) readonly buffer C { uint codes[]; };

layout(push_constant) uniform P {
    uint k;
    uint n;
    uint n_tok;
    uint row_bytes;
    uint x_div;         // INDEXED only
    uint expert_stride; // INDEXED only
    uint n_expert;      // INDEXED only
} p;

// The byte at byte offset o of the weights.
uint wbyte(uint o) { return (w[o >> 2] >> ((o & 3u) * 8u)) & 0xffu; }
// A byte as a signed int8, and the byte at o so.
int sext8(uint u) { return int(u) - int((u & 0x80u) << 1); }
int sbyte(uint o) { return sext8(wbyte(o)); }
// The 16-bit little-endian value at an even byte offset.
uint whalf(uint o) { return (w[o >> 2] >> ((o & 2u) * 8u)) & 0xffffu; }
// The 32-bit little-endian value at any byte offset: one load where o is a multiple of 4, else
// the two words it straddles (never a word that holds none of its bytes).
uint wword(uint o) {
    const uint s = (o & 3u) * 8u;
    const uint lo = w[o >> 2];
    return s == 0u ? lo : (lo >> s) | (w[(o >> 2) + 1u] << (32u - s));
}

// The 16 bytes at byte offset o as four words: one 16-byte load where o is a multiple of 16
// (Q4_K and Q5_K blocks are 144 and 176 bytes, so in every row of a matrix, and of an
// expert whose stride keeps it so); else the four or five words that hold them, shifted
// into place (the 17- to 34-byte blocks, Q6_K's 210): the same bytes either way.
void load16(uint o, out uint v[4]) {
    const uint b = o >> 2, sh = (o & 3u) * 8u;
    if ((o & 15u) == 0u) {
        const uvec4 a = w4[o >> 4];
        v = uint[4](a.x, a.y, a.z, a.w);
    } else if (sh == 0u) {
        for (uint t = 0u; t < 4u; t++) v[t] = w[b + t];
    } else {
        uint lo = w[b];
        for (uint t = 0u; t < 4u; t++) {
            const uint hi = w[b + t + 1u]; // within the 16 bytes' last word
            v[t] = (lo >> sh) | (hi << (32u - sh));
            lo = hi;
        }
    }
}
// The 32 bytes at o as eight words, two load16.
void load32(uint o, out uint v[8]) {
    uint a[4], c[4];
    load16(o, a);
    load16(o + 16u, c);
    v = uint[8](a[0], a[1], a[2], a[3], c[0], c[1], c[2], c[3]);
}
// Byte l of load16's or load32's words.
#define VBYTE(v, l) (((v)[(l) >> 2] >> (((l) & 3u) * 8u)) & 0xffu)

// IQ4_NL / IQ4_XS: a 4-bit index stands for one of these levels (a fact of the format).
// As int8 four to a word (byte i of word g: level 4 g + i), read by level16: selects and a
// bit-field extract, where a table indexed per invocation goes to local memory on some
// devices (lavapipe: 12.6 -> 4.9 ms for a 2048 x 2048 IQ4_NL matmul of one token).
const uvec4 IQ4_LEVELS = uvec4(0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u); // -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113
// MXFP4: twice the E2M1 values, as ggml stores them (the scale is then 2^(e - 128)).
const uvec4 MXFP4_LEVELS = uvec4(0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu); // 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12
// Level q (0..15) of 16 int8 levels packed as IQ4_LEVELS.
int level16(uvec4 pk, uint q) {
    const uint wd = q < 8u ? (q < 4u ? pk.x : pk.y) : (q < 12u ? pk.z : pk.w);
    return bitfieldExtract(int(wd), int((q & 3u) * 8u), 8);
}

// The 6-bit scale and min of sub-block sb (0..7) of a Q4_K / Q5_K block whose 12 scale
// bytes start at so.
void k_scale_min(uint so, uint sb, out uint sc, out uint mn) {
    if (sb < 4u) {
        sc = wbyte(so + sb) & 63u;
        mn = wbyte(so + sb + 4u) & 63u;
    } else {
        sc = (wbyte(so + sb + 4u) & 15u) | ((wbyte(so + sb - 4u) >> 6) << 4);
        mn = (wbyte(so + sb + 4u) >> 4) | ((wbyte(so + sb) >> 6) << 4);
    }
}

// Code i of the list at word offset L.
const uint IQ2XXS_CODES = 0u, IQ2XS_CODES = 128u, IQ2S_CODES = 384u, IQ3XXS_CODES = 896u, IQ3S_CODES = 1024u,
           IQ1S_CODES = 1280u;
#define IQ_CODE(L, i) ((codes[(L) + ((i) >> 1)] >> (16u * ((i) & 1u))) & 0xffffu)

// The 2-bit grids' levels, IQ3_XXS's 3-bit ones (IQ3_S's are 2 l + 1; IQ1's l - 1).
const uint IQ2_LEVELS[3] = uint[3](8u, 25u, 43u);
const uint IQ3XXS_LEVELS[8] = uint[8](4u, 12u, 20u, 28u, 36u, 44u, 52u, 62u);

// Sign bit e (0..7) of a 7-bit sign index: the eighth makes the count of negatives even.
bool sign7(uint s7, uint e) { return e < 7u ? ((s7 >> e) & 1u) != 0u : (bitCount(s7) & 1) != 0; }

// Bytes of a low-bit super-block.
uint lowbit_bytes() {
    return WTYPE == 16 ? 66u : WTYPE == 17 ? 74u : WTYPE == 22 ? 82u : WTYPE == 18 ? 98u : WTYPE == 21 ? 110u
         : WTYPE == 19 ? 50u : 56u;
}

// A tile: one invocation computes row r for up to TT tokens (the INDEXED matmul: up to TT
// slots of one expert), decoding each weight once for all of them. What an output computes does not
// change with the tile: the same products and sums in the same order as alone. TT is 8, or 1
// for a dispatch of one token (decode; vulkan.c): a one-token pipeline keeps one sum per
// lane instead of eight (fewer registers on a GPU, and on lavapipe, which runs every
// iteration of the tile's loops masked, 1.4-2x the decode speed of the tiny kit models).
layout(constant_id = 4) const uint TT = 8u;
uint nt;       // tokens in this tile (1..TT)
uint xo[TT];   // their x rows' offsets
uint yr[TT];   // their y rows
// Each invocation's sums for the tile's tokens, for the reduction across the row's lanes.
shared float part[128u * TT];
// The float types' elements of this lane: chunks of 32, lane l taking chunks l, l + LANES, ...
#define FLOAT_CHUNKS for (uint c = lane * 32u; c < p.k; c += LANES * 32u) for (uint i = c; i < min(c + 32u, p.k); i++)
// The block sums s[u] of the tile's tokens: s[u] += w x for one weight, w formed once.
#define BLOCK_BEGIN precise float s[TT]; for (uint u = 0u; u < TT; u++) s[u] = 0.0;
#define ADD(WV, OFF) { precise float wv_ = (WV); for (uint u = 0u; u < TT; u++) if (u < nt) s[u] += wv_ * x[xo[u] + (OFF)]; }
#define BLOCK_END(D) for (uint u = 0u; u < TT; u++) acc[u] += (D) * s[u];
#define BLOCK_END1 for (uint u = 0u; u < TT; u++) acc[u] += s[u];
// Whole rows summed straight into acc (the float types).
#define ADD_ACC(WV, OFF) { precise float wv_ = (WV); for (uint u = 0u; u < TT; u++) if (u < nt) acc[u] += wv_ * x[xo[u] + (OFF)]; }

void main() {
    const uint lid = gl_LocalInvocationID.x, lane = lid % LANES;
    const uint r = (gl_WorkGroupID.x + gl_WorkGroupID.z * GX) * WG_ROWS + lid / LANES;
    // An invocation with nothing to compute still takes part in the reduction's barriers.
    bool live = r < p.n;
    uint ro = r * p.row_bytes;
    uint t0 = 0u;
    nt = 1u;
    if (INDEXED != 0) {
        const uint tile = gl_WorkGroupID.y;
        live = live && tile < order[p.n_tok];
        uint first = 0u;
        if (live) {
            first = order[p.n_tok + 1u + 2u * tile];
            nt = order[p.n_tok + 2u + 2u * tile];
        }
        live = live && nt >= 1u && nt <= TT && first < p.n_tok && nt <= p.n_tok - first; // a bad tile: nothing
        for (uint u = 0u; u < TT; u++) {
            yr[u] = live ? order[first + min(u, nt - 1u)] : 0u;
            live = live && yr[u] < p.n_tok; // a bad order entry: nothing to write
        }
        if (live) {
            const uint e = ids[yr[0]];
            if (e >= p.n_expert) { // a routing bug must not read out of the weights: NaN marks it
                if (lane == 0u)
                    for (uint u = 0u; u < TT; u++)
                        if (u < nt) y[yr[u] * p.n + r] = uintBitsToFloat(0x7fc00000u);
                live = false;
            }
            for (uint u = 0u; u < TT; u++) xo[u] = (yr[u] / p.x_div) * p.k;
            ro += e * p.expert_stride;
        }
    } else {
        t0 = gl_WorkGroupID.y * TT;
        live = live && t0 < p.n_tok;
        if (live) nt = min(TT, p.n_tok - t0);
        for (uint u = 0u; u < TT; u++) {
            xo[u] = (t0 + min(u, nt - 1u)) * p.k;
            yr[u] = t0 + u;
        }
    }
    precise float acc[TT];
    for (uint u = 0u; u < TT; u++) acc[u] = 0.0;
    if (!live) {
    } else if (WTYPE == 0) {
        const uint wo = ro >> 2;
        FLOAT_CHUNKS ADD_ACC(uintBitsToFloat(w[wo + i]), i)
    } else if (WTYPE == 1) {
        FLOAT_CHUNKS ADD_ACC(unpackHalf2x16(whalf(ro + 2u * i)).x, i)
    } else if (WTYPE == 8) { // Q8_0: d, 32 x int8
        const uint nb = p.k / 32u;
        for (uint b = lane; b < nb; b += LANES) {
            const uint bo = ro + b * 34u;
            const float d = unpackHalf2x16(whalf(bo)).x;
            uint qs[8];
            load32(bo + 2u, qs); // the 32 int8 (never 16-byte aligned: the words, shifted)
            BLOCK_BEGIN
            for (uint i = 0; i < 32u; i++) {
                ADD(float(sext8(VBYTE(qs, i))), b * 32u + i)
            }
            BLOCK_END(d)
        }
    } else if (WTYPE == 2) { // Q4_0: d, 16 bytes of nibbles (low: 0..15, high: 16..31), minus 8
        const uint nb = p.k / 32u;
        for (uint b = lane; b < nb; b += LANES) {
            const uint bo = ro + b * 18u;
            const float d = unpackHalf2x16(whalf(bo)).x;
            uint qn[4];
            load16(bo + 2u, qn); // the 16 bytes of nibbles
            BLOCK_BEGIN
            for (uint i = 0; i < 32u; i++) {
                const uint q = (VBYTE(qn, i & 15u) >> ((i >> 4) * 4u)) & 15u;
                ADD(float(int(q) - 8), b * 32u + i)
            }
            BLOCK_END(d)
        }
    } else if (WTYPE == 6) { // Q5_0: d, 32 high bits, 16 bytes of nibbles, minus 16
        const uint nb = p.k / 32u;
        for (uint b = lane; b < nb; b += LANES) {
            const uint bo = ro + b * 22u;
            const float d = unpackHalf2x16(whalf(bo)).x;
            const uint qh = wword(bo + 2u);
            uint qn[4];
            load16(bo + 6u, qn); // the 16 bytes of nibbles
            BLOCK_BEGIN
            for (uint i = 0; i < 32u; i++) {
                const uint lo = (VBYTE(qn, i & 15u) >> ((i >> 4) * 4u)) & 15u;
                const uint q = lo | (((qh >> i) & 1u) << 4);
                ADD(float(int(q) - 16), b * 32u + i)
            }
            BLOCK_END(d)
        }
    } else if (WTYPE == 12) { // Q4_K: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles
        const uint nb = p.k / 256u;
        // Chunk c is sub-block sb = c % 8 of block c / 8: its scale and min, its 32 nibbles
        // (the low or high halves of the 32 bytes of pair sb / 2) read once per chunk. Each
        // weight is (d sc) q - dmin mn, as ggml forms it, then summed in element order.
        for (uint c = lane; c < nb * 8u; c += LANES) {
            const uint b = c >> 3, sb = c & 7u, hi = sb & 1u;
            const uint bo = ro + b * 144u;
            const float d = unpackHalf2x16(whalf(bo)).x;
            const float dmin = unpackHalf2x16(whalf(bo + 2u)).x;
            uint sc, mn;
            k_scale_min(bo + 4u, sb, sc, mn);
            precise const float dsc = d * float(sc), dmn = dmin * float(mn);
            uint qs[8];
            load32(bo + 16u + 32u * (sb >> 1), qs);
            BLOCK_BEGIN
            for (uint l = 0u; l < 32u; l++) {
                const uint q = (VBYTE(qs, l) >> (hi * 4u)) & 15u;
                ADD(dsc * float(q) - dmn, b * 256u + sb * 32u + l)
            }
            BLOCK_END1
        }
    } else if (WTYPE == 14) { // Q6_K: 128 bytes low nibbles, 64 bytes high 2-bits, 16 int8 scales, d
        const uint nb = p.k / 256u;
        // Chunk c: elements 32 (c % 8) .. of block c / 8, in half n = (c % 8) / 4, quarter
        // qt = c % 4: low nibbles from 32 bytes at 64 n + 32 (qt % 2) (shifted by 4 (qt / 2)),
        // high bits from the 32 at 128 + 32 n (shifted by 2 qt), scales 8 n + 2 qt and the
        // next (16 elements each). Each weight (d sc) q, as ggml forms it.
        for (uint c = lane; c < nb * 8u; c += LANES) {
            const uint b = c >> 3, n = (c & 7u) >> 2, qt = c & 3u;
            const uint bo = ro + b * 210u;
            const float d = unpackHalf2x16(whalf(bo + 208u)).x;
            precise const float ds0 = d * float(sbyte(bo + 192u + 8u * n + 2u * qt));
            precise const float ds1 = d * float(sbyte(bo + 193u + 8u * n + 2u * qt));
            uint ql[8], qh[8];
            load32(bo + 64u * n + 32u * (qt & 1u), ql);
            load32(bo + 128u + 32u * n, qh);
            BLOCK_BEGIN
            for (uint l = 0u; l < 32u; l++) {
                const uint lo = (VBYTE(ql, l) >> ((qt >> 1) * 4u)) & 15u;
                const uint hb = (VBYTE(qh, l) >> (2u * qt)) & 3u;
                ADD((l < 16u ? ds0 : ds1) * float(int(lo | (hb << 4)) - 32), b * 256u + (c & 7u) * 32u + l)
            }
            BLOCK_END1
        }
    } else if (WTYPE == 30) { // BF16: the top half of an F32
        FLOAT_CHUNKS ADD_ACC(uintBitsToFloat(whalf(ro + 2u * i) << 16), i)
    } else if (WTYPE == 3) { // Q4_1: d, m, 16 bytes of nibbles (as Q4_0's); w = d q + m, element by element
        const uint nb = p.k / 32u;
        for (uint b = lane; b < nb; b += LANES) {
            const uint bo = ro + b * 20u;
            const float d = unpackHalf2x16(whalf(bo)).x;
            const float m = unpackHalf2x16(whalf(bo + 2u)).x;
            uint qn[4];
            load16(bo + 4u, qn); // the 16 bytes of nibbles
            BLOCK_BEGIN
            for (uint i = 0; i < 32u; i++) {
                const uint q = (VBYTE(qn, i & 15u) >> ((i >> 4) * 4u)) & 15u;
                ADD(d * float(q) + m, b * 32u + i)
            }
            BLOCK_END1
        }
    } else if (WTYPE == 7) { // Q5_1: d, m, 32 high bits, 16 bytes of nibbles; w = d q + m
        const uint nb = p.k / 32u;
        for (uint b = lane; b < nb; b += LANES) {
            const uint bo = ro + b * 24u;
            const float d = unpackHalf2x16(whalf(bo)).x;
            const float m = unpackHalf2x16(whalf(bo + 2u)).x;
            const uint qh = wword(bo + 4u);
            uint qn[4];
            load16(bo + 8u, qn); // the 16 bytes of nibbles
            BLOCK_BEGIN
            for (uint i = 0; i < 32u; i++) {
                const uint lo = (VBYTE(qn, i & 15u) >> ((i >> 4) * 4u)) & 15u;
                const uint q = lo | (((qh >> i) & 1u) << 4);
                ADD(d * float(q) + m, b * 32u + i)
            }
            BLOCK_END1
        }
    } else if (WTYPE == 20) { // IQ4_NL: d, 16 bytes of nibbles (as Q4_0's) indexing the levels
        const uint nb = p.k / 32u;
        for (uint b = lane; b < nb; b += LANES) {
            const uint bo = ro + b * 18u;
            const float d = unpackHalf2x16(whalf(bo)).x;
            uint qn[4];
            load16(bo + 2u, qn); // the 16 bytes of nibbles
            BLOCK_BEGIN
            for (uint i = 0; i < 32u; i++) {
                const uint q = (VBYTE(qn, i & 15u) >> ((i >> 4) * 4u)) & 15u;
                ADD(float(level16(IQ4_LEVELS, q)), b * 32u + i)
            }
            BLOCK_END(d)
        }
    } else if (WTYPE == 39) { // MXFP4: an E8M0 byte e, 16 bytes of nibbles (as Q4_0's) indexing the levels
        const uint nb = p.k / 32u;
        for (uint b = lane; b < nb; b += LANES) {
            const uint bo = ro + b * 17u;
            const uint e = wbyte(bo);
            // 2^(e - 128), exactly (e < 2: the subnormals 2^-128 and 2^-127, which a device
            // that flushes subnormals reads as 0)
            const float d = uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
            uint qn[4];
            load16(bo + 1u, qn); // the 16 bytes of nibbles
            BLOCK_BEGIN
            for (uint i = 0; i < 32u; i++) {
                const uint q = (VBYTE(qn, i & 15u) >> ((i >> 4) * 4u)) & 15u;
                ADD(float(level16(MXFP4_LEVELS, q)), b * 32u + i)
            }
            BLOCK_END(d)
        }
    } else if (WTYPE == 23) { // IQ4_XS: d, 2 + 4 bytes of 6-bit sub-block scales, 128 bytes of nibbles
        const uint nb = p.k / 256u;
        for (uint c = lane; c < nb * 8u; c += LANES) { // chunk c: block c / 8, its elements 32 (c % 8) ..
            const uint b = c >> 3, j = c & 7u;
            const uint bo = ro + b * 136u;
            const float d = unpackHalf2x16(whalf(bo)).x;
            const uint sh = whalf(bo + 2u);
            {
                const uint ls = ((wbyte(bo + 4u + j / 2u) >> (4u * (j & 1u))) & 15u) | (((sh >> (2u * j)) & 3u) << 4);
                const float dl = d * float(int(ls) - 32);
                uint qn[4];
                load16(bo + 8u + 16u * j, qn); // the 16 bytes of nibbles
                BLOCK_BEGIN
                for (uint l = 0; l < 32u; l++) {
                    const uint q = (VBYTE(qn, l & 15u) >> ((l >> 4) * 4u)) & 15u;
                    ADD(float(level16(IQ4_LEVELS, q)), b * 256u + 32u * j + l)
                }
                BLOCK_END(dl)
            }
        }
    } else if (WTYPE == 13) { // Q5_K: d, dmin, 12 bytes of scales/mins, 32 bytes of fifth bits, 128 of nibbles
        const uint nb = p.k / 256u;
        // As Q4_K, with the fifth bit of element l from bit sb of byte l of the 32 qh bytes.
        for (uint c = lane; c < nb * 8u; c += LANES) {
            const uint b = c >> 3, sb = c & 7u, hi = sb & 1u;
            const uint bo = ro + b * 176u;
            const float d = unpackHalf2x16(whalf(bo)).x;
            const float dmin = unpackHalf2x16(whalf(bo + 2u)).x;
            uint sc, mn;
            k_scale_min(bo + 4u, sb, sc, mn);
            precise const float dsc = d * float(sc), dmn = dmin * float(mn);
            uint qs[8], qh[8];
            load32(bo + 48u + 32u * (sb >> 1), qs);
            load32(bo + 16u, qh);
            BLOCK_BEGIN
            for (uint l = 0u; l < 32u; l++) {
                const uint q = ((VBYTE(qs, l) >> (hi * 4u)) & 15u) | (((VBYTE(qh, l) >> sb) & 1u) << 4);
                ADD(dsc * float(q) - dmn, b * 256u + sb * 32u + l)
            }
            BLOCK_END1
        }
    } else if (WTYPE == 10 || WTYPE == 11) {
        // Q2_K (84 bytes: 16 scale bytes, 64 bytes of 2-bit levels, d, dmin) and Q3_K (110:
        // 32 bytes of high bits, 64 of 2-bit levels, 12 of 6-bit scales, d). Chunk c is
        // elements 32 (c % 8) .. of block c / 8: half h = (c % 8) / 4, step jj = c % 4, so its
        // levels are bits 2 jj of the 32 bytes at h; scales 2 (c % 8) and the next (16
        // elements each). Each weight as ggml forms it: Q2_K (d sc) q - dmin m, Q3_K
        // (d (s - 32)) (q - 4 [high bit clear]).
        const uint nb = p.k / 256u, bb = WTYPE == 10 ? 84u : 110u;
        for (uint c = lane; c < nb * 8u; c += LANES) {
            const uint b = c >> 3, h = (c & 7u) >> 2, jj = c & 3u, j0 = 2u * (c & 7u);
            const uint bo = ro + b * bb;
            uint qs[8], hm[8];
            float dl[2], ml[2];
            if (WTYPE == 10) {
                const float d = unpackHalf2x16(whalf(bo + 80u)).x, dmin = unpackHalf2x16(whalf(bo + 82u)).x;
                for (uint t = 0u; t < 2u; t++) {
                    const uint sc = wbyte(bo + j0 + t);
                    precise const float a = d * float(sc & 15u), m = dmin * float(sc >> 4);
                    dl[t] = a;
                    ml[t] = m;
                }
                load32(bo + 16u + 32u * h, qs);
            } else {
                const float d = unpackHalf2x16(whalf(bo + 108u)).x;
                for (uint t = 0u; t < 2u; t++) {
                    const uint j = j0 + t;
                    const uint lo = (wbyte(bo + 96u + (j & 7u)) >> (4u * (j >> 3))) & 15u;
                    const uint hi = (wbyte(bo + 104u + (j & 3u)) >> (2u * (j >> 2))) & 3u;
                    precise const float a = d * float(int(lo | (hi << 4)) - 32);
                    dl[t] = a;
                    ml[t] = 0.0;
                }
                load32(bo + 32u + 32u * h, qs);
                load32(bo, hm);
            }
            BLOCK_BEGIN
            for (uint l = 0u; l < 32u; l++) {
                const uint u = (VBYTE(qs, l) >> (2u * jj)) & 3u;
                if (WTYPE == 10) {
                    ADD(dl[l >> 4] * float(u) - ml[l >> 4], b * 256u + (c & 7u) * 32u + l)
                } else {
                    const int q = int(u) - (((VBYTE(hm, l) >> (4u * h + jj)) & 1u) != 0u ? 0 : 4);
                    ADD(dl[l >> 4] * float(q), b * 256u + (c & 7u) * 32u + l)
                }
            }
            BLOCK_END1
        }
    } else if (WTYPE == 16 || WTYPE == 17 || WTYPE == 22 || WTYPE == 18 || WTYPE == 21 || WTYPE == 19 ||
               WTYPE == 29) { // the I-quants, as ggml's dequantize_row_* forms each weight
        // A chunk is sub-block ib of a super-block: its scale once, each group of 8 weights'
        // grid code and signs once, then the 8 weights (the weights, products and sums those
        // of one weight at a time, in the same order).
        const uint nb = p.k / 256u, bb = lowbit_bytes();
        for (uint c = lane; c < nb * 8u; c += LANES) { // chunk c: block c / 8, its elements 32 (c % 8) ..
            const uint b = c >> 3, ib = c & 7u, xb = b * 256u + ib * 32u;
            const uint bo = ro + b * bb;
            const float d = unpackHalf2x16(whalf(bo)).x; // the block's d (IQ1_M's is spread over its scales)
            BLOCK_BEGIN
            if (WTYPE == 16 || WTYPE == 17 || WTYPE == 22) { // IQ2_XXS, IQ2_XS, IQ2_S
                // the chunk's code bytes, sign bytes and scale bytes, each read once by words
                const uint aux = WTYPE == 16 ? wword(bo + 6u + 8u * ib) : 0u;
                const uint q4 = WTYPE == 16 ? wword(bo + 2u + 8u * ib) : WTYPE == 22 ? wword(bo + 2u + 4u * ib) : 0u;
                const uint s4 = WTYPE == 22 ? wword(bo + 34u + 4u * ib) : 0u;
                const uint hb = WTYPE == 22 ? wbyte(bo + 66u + ib) : 0u;
                const uint lb = WTYPE == 17 ? wbyte(bo + 66u + ib) : WTYPE == 22 ? wbyte(bo + 74u + ib) : 0u;
                for (uint g = 0u; g < 4u; g++) {
                    uint idx, signs, ls;
                    if (WTYPE == 16) {
                        idx = IQ_CODE(IQ2XXS_CODES, (q4 >> (8u * g)) & 255u);
                        signs = (aux >> (7u * g)) & 127u;
                        ls = aux >> 28;
                    } else if (WTYPE == 17) {
                        const uint v = whalf(bo + 2u + 2u * (4u * ib + g));
                        idx = IQ_CODE(IQ2XS_CODES, v & 511u);
                        signs = v >> 9;
                        ls = (lb >> (4u * (g >> 1))) & 15u;
                    } else {
                        const uint ix = ((q4 >> (8u * g)) & 255u) | ((hb << (8u - 2u * g)) & 0x300u);
                        idx = IQ_CODE(IQ2S_CODES, ix);
                        signs = (s4 >> (8u * g)) & 255u;
                        ls = (lb >> (4u * (g >> 1))) & 15u;
                    }
                    const float db = d * (0.5 + float(ls)) * 0.25;
                    for (uint e = 0u; e < 8u; e++) {
                        const bool neg = WTYPE == 22 ? ((signs >> e) & 1u) != 0u : sign7(signs, e);
                        ADD(db * float(IQ2_LEVELS[(idx >> (2u * e)) & 3u]) * (neg ? -1.0 : 1.0), xb + 8u * g + e)
                    }
                }
            } else if (WTYPE == 18) { // IQ3_XXS: 64 grid indices, per sub-block 4 x 7 sign bits and a scale
                const uint aux = wword(bo + 66u + 4u * ib);
                const uint q8[2] = uint[2](wword(bo + 2u + 8u * ib), wword(bo + 6u + 8u * ib)); // the 8 code bytes
                const float db = d * (0.5 + float(aux >> 28)) * 0.5;
                for (uint g = 0u; g < 4u; g++) {
                    const uint s7 = (aux >> (7u * g)) & 127u;
                    for (uint h = 0u; h < 2u; h++) {
                        const uint idx = IQ_CODE(IQ3XXS_CODES, (q8[g >> 1] >> (16u * (g & 1u) + 8u * h)) & 255u);
                        for (uint e = 0u; e < 4u; e++)
                            ADD(db * float(IQ3XXS_LEVELS[(idx >> (3u * e)) & 7u]) * (sign7(s7, 4u * h + e) ? -1.0 : 1.0),
                                xb + 8u * g + 4u * h + e)
                    }
                }
            } else if (WTYPE == 21) { // IQ3_S: 9-bit indices (qs, qh), 8 sign bits per group, 4-bit scales
                const uint qh = wbyte(bo + 66u + ib);
                const uint ls = (wbyte(bo + 106u + (ib >> 1)) >> (4u * (ib & 1u))) & 15u;
                const float db = d * float(1u + 2u * ls);
                const uint q8[2] = uint[2](wword(bo + 2u + 8u * ib), wword(bo + 6u + 8u * ib)); // the 8 code bytes
                const uint s4 = wword(bo + 74u + 4u * ib);                                         // the 4 sign bytes
                for (uint g = 0u; g < 4u; g++) {
                    const uint signs = (s4 >> (8u * g)) & 255u;
                    for (uint h = 0u; h < 2u; h++) {
                        const uint ix = ((q8[g >> 1] >> (16u * (g & 1u) + 8u * h)) & 255u) | ((qh << (8u - 2u * g - h)) & 256u);
                        const uint code = IQ_CODE(IQ3S_CODES, ix);
                        for (uint e = 0u; e < 4u; e++)
                            ADD(db * float(2u * ((code >> (3u * e)) & 7u) + 1u) * (((signs >> (4u * h + e)) & 1u) != 0u ? -1.0 : 1.0),
                                xb + 8u * g + 4u * h + e)
                    }
                }
            } else if (WTYPE == 19) { // IQ1_S: 11-bit indices into the -1/0/+1 grid, per sub-block scale and shift
                const uint qh = whalf(bo + 34u + 2u * ib);
                const float dl = d * float(2u * ((qh >> 12) & 7u) + 1u);
                const float delta = (qh & 0x8000u) != 0u ? -0.125 : 0.125;
                const uint q4 = wword(bo + 2u + 4u * ib);
                for (uint g = 0u; g < 4u; g++) {
                    const uint code = IQ_CODE(IQ1S_CODES, ((q4 >> (8u * g)) & 255u) | (((qh >> (3u * g)) & 7u) << 8));
                    for (uint e = 0u; e < 8u; e++)
                        ADD(dl * (float(int((code >> (2u * e)) & 3u) - 1) + delta), xb + 8u * g + e)
                }
            } else { // IQ1_M: as IQ1_S with a shift per group and 3-bit scales per 16; d spread over the scales
                const uint s0 = whalf(bo + 48u), s1 = whalf(bo + 50u), s2 = whalf(bo + 52u), s3 = whalf(bo + 54u);
                const float dm = unpackHalf2x16((s0 >> 12) | ((s1 >> 8) & 0xf0u) | ((s2 >> 4) & 0xf00u) | (s3 & 0xf000u)).x;
                const uint sw = whalf(bo + 48u + 2u * (ib >> 1));
                const uint q4 = wword(bo + 4u * ib), qh2 = whalf(bo + 32u + 2u * ib);
                for (uint g = 0u; g < 4u; g++) {
                    const float dl = dm * float(2u * ((sw >> (6u * (ib & 1u) + 3u * (g >> 1))) & 7u) + 1u);
                    const uint qh = (qh2 >> (8u * (g >> 1))) & 255u;
                    const uint code = IQ_CODE(IQ1S_CODES, ((q4 >> (8u * g)) & 255u) | (((g & 1u) == 0u ? qh << 8 : qh << 4) & 0x700u));
                    const float delta = (qh & ((g & 1u) == 0u ? 0x08u : 0x80u)) != 0u ? -0.125 : 0.125;
                    for (uint e = 0u; e < 8u; e++)
                        ADD(dl * (float(int((code >> (2u * e)) & 3u) - 1) + delta), xb + 8u * g + e)
                }
            }
            BLOCK_END1
        }
    }
    // The LANES partial sums of a row, pairwise in a fixed tree: lane l takes l + 16, then
    // l + 8, ..., so the sum's shape depends on LANES alone.
    // With one lane (a CPU device) the pipeline has no barrier and no shared memory: the
    // specialization removes this branch, and lavapipe runs a barrier-free shader faster.
    if (LANES > 1u) {
        for (uint u = 0u; u < TT; u++) part[lid * TT + u] = acc[u];
        for (uint h = LANES / 2u; h > 0u; h >>= 1) {
            memoryBarrierShared();
            barrier();
            if (lane < h)
                for (uint u = 0u; u < TT; u++) {
                    precise float v = part[lid * TT + u] + part[(lid + h) * TT + u];
                    part[lid * TT + u] = v;
                }
        }
        for (uint u = 0u; u < TT; u++) acc[u] = part[lid * TT + u];
    }
    if (live && lane == 0u)
        for (uint u = 0u; u < TT; u++)
            if (u < nt) y[yr[u] * p.n + r] = acc[u];
}
