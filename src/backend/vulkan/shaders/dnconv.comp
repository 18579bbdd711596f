#version 450
// Gated DeltaNet's causal depthwise convolution + SiLU (kernels/deltanet.h, step 1), one
// invocation per channel, tokens in order: tap j meets row t + j of (window ++ x), taps
// summed in ascending order; then the window keeps the last n_conv - 1 inputs. The
// tokens are rows row0.. of x and y (one sequence of a step over several). With a trail
// (tr = 1), the window after token t goes to slot tr_slot + t of T, [slot][n_conv - 1][C]
// (speculative verification: the state after every token; the arithmetic is the same).
layout(local_size_x = 64) in;

layout(std430, binding = 0) buffer Wd { float window[]; };   // [n_conv - 1][C]
layout(std430, binding = 1) readonly buffer Cw { float cw[]; }; // [n_conv][C] tap-major
layout(std430, binding = 2) readonly buffer X { float x[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) writeonly buffer T_ { float T[]; }; // the trail (bound to window when tr = 0)

layout(push_constant) uniform P {
    uint C;
    uint n_conv;
    uint ldx;
    uint ldy;
    uint n_tok;
    uint row0;
    uint tr;
    uint tr_slot;
} p;

float in_row(uint r, uint c, uint W) { return r < W ? window[r * p.C + c] : x[(p.row0 + r - W) * p.ldx + c]; }

void main() {
    const uint c = gl_GlobalInvocationID.x;
    if (c >= p.C) return;
    const uint W = p.n_conv - 1u;
    for (uint t = 0u; t < p.n_tok; t++) {
        precise float acc = in_row(t, c, W) * cw[c];
        for (uint j = 1u; j < p.n_conv; j++) acc += in_row(t + j, c, W) * cw[j * p.C + c];
        y[(p.row0 + t) * p.ldy + c] = acc / (1.0 + exp(-acc));
        if (p.tr != 0u)
            for (uint j = 0u; j < W; j++) T[((p.tr_slot + t) * W + j) * p.C + c] = in_row(t + 1u + j, c, W);
    }
    for (uint j = 0u; j < W; j++) window[j * p.C + c] = in_row(p.n_tok + j, c, W);
}
