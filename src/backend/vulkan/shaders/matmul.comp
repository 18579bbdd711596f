#version 450
// y[t][r] = dot(w row r, x row t): one invocation per output element, reducing over k
// in one fixed order (blocks in order, elements in order inside a block), so an
// element's bits do not depend on how many rows or tokens the dispatch covers.
//
// WTYPE 0: F32 weights; 1: F16 (pairs packed in uint); 8: Q8_0 (34-byte blocks: an F16
// scale, then 32 int8). Weights are read as 32-bit words; row_bytes is a multiple of 2.
// The sums are `precise` (no fused multiply-add the driver may choose per pipeline), so
// every pipeline built from this shader rounds the same way.

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(constant_id = 0) const uint WTYPE = 0;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };

layout(push_constant) uniform P {
    uint k;
    uint n;
    uint n_tok;
    uint row_bytes;
} p;

// The byte at byte offset o of the weights.
uint wbyte(uint o) { return (w[o >> 2] >> ((o & 3u) * 8u)) & 0xffu; }
// The 16-bit little-endian value at an even byte offset.
uint whalf(uint o) { return (w[o >> 2] >> ((o & 2u) * 8u)) & 0xffffu; }

void main() {
    const uint r = gl_GlobalInvocationID.x;
    const uint t = gl_GlobalInvocationID.y;
    if (r >= p.n || t >= p.n_tok) return;
    const uint xo = t * p.k;
    const uint ro = r * p.row_bytes;
    precise float acc = 0.0;
    if (WTYPE == 0) {
        const uint wo = ro >> 2;
        for (uint i = 0; i < p.k; i++) acc += uintBitsToFloat(w[wo + i]) * x[xo + i];
    } else if (WTYPE == 1) {
        for (uint i = 0; i < p.k; i++) acc += unpackHalf2x16(whalf(ro + 2u * i)).x * x[xo + i];
    } else if (WTYPE == 8) {
        const uint nb = p.k / 32u;
        for (uint b = 0; b < nb; b++) {
            const uint bo = ro + b * 34u;
            const float d = unpackHalf2x16(whalf(bo)).x;
            precise float s = 0.0;
            for (uint i = 0; i < 32u; i++) {
                const uint u = wbyte(bo + 2u + i);
                const int q = int(u) - int((u & 0x80u) << 1); // two's complement int8
                s += float(q) * x[xo + b * 32u + i];
            }
            acc += d * s;
        }
    }
    y[t * p.n + r] = acc;
}
