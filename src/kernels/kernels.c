/* Kernel dispatch: picks the ISA once (CPUID, TERN_ISA) and routes every call through
 * that ISA's table, falling back to the portable entry where an ISA has none. The ops
 * (ops.c) and the Gated DeltaNet core (kernels/deltanet.c) follow the same choice: this is
 * the only place that reads CPUID or TERN_ISA. */
#include "kernels/kernels.h"
#include "kernels/kernels-impl.h"
#include "kernels/quant.h"
#include "util/log.h"
#include "util/status.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static enum tern_isa active_isa = TERN_ISA_PORTABLE;
static bool have_avx2;
static bool have_avx512, use_avx512;

static bool cpu_has_avx2_fma_f16c(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (c & bit_F16C) != 0;
#else
    return false;
#endif
}

/* AVX-512 F, BW, VL, DQ and VNNI, with the OS saving the zmm state (the compiler's CPU
 * model checks XCR0 before it reports an AVX-512 feature). */
static bool cpu_has_avx512_tiles(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

float tern_fp16_lut[65536];
float tern_e8m0_half_lut[256];

static void init_isa(void) {
    for (uint32_t h = 0; h < 65536; h++) tern_fp16_lut[h] = tern_fp16_to_f32((tern_fp16)h);
    for (uint32_t e = 0; e < 256; e++) tern_e8m0_half_lut[e] = tern_e8m0_half((uint8_t)e);
    have_avx2 = cpu_has_avx2_fma_f16c();
    active_isa = have_avx2 ? TERN_ISA_AVX2 : TERN_ISA_PORTABLE;
    have_avx512 = have_avx2 && cpu_has_avx512_tiles();
    const char *w = getenv("TERN_AVX512");
    use_avx512 = have_avx512 && !(w && !strcmp(w, "0"));
    const char *e = getenv("TERN_ISA");
    if (e && *e) {
        if (!strcasecmp(e, "portable")) {
            active_isa = TERN_ISA_PORTABLE;
        } else if (!strcasecmp(e, "avx2")) {
            if (!have_avx2) TERN_LOG_WARN("TERN_ISA=avx2 but this CPU lacks AVX2/FMA/F16C; using portable kernels");
        } else {
            TERN_LOG_WARN("TERN_ISA='%s' is not one of portable, avx2; ignored", e);
        }
    }
    TERN_LOG_DEBUG("kernels: %s%s", tern_isa_name(active_isa),
                   active_isa == TERN_ISA_AVX2 && use_avx512 ? " (AVX-512 tiles)" : "");
}

void tern_kernels_init(void) { pthread_once(&init_once, init_isa); }

enum tern_isa tern_kernels_isa(void) {
    tern_kernels_init();
    return active_isa;
}

const char *tern_isa_name(enum tern_isa isa) {
    switch (isa) {
    case TERN_ISA_PORTABLE: return "portable";
    case TERN_ISA_AVX2: return "avx2";
    }
    return "unknown";
}

bool tern_kernels_isa_available(enum tern_isa isa) {
    tern_kernels_init();
    return isa == TERN_ISA_PORTABLE || (isa == TERN_ISA_AVX2 && have_avx2);
}

bool tern_kernels_set_isa(enum tern_isa isa) {
    tern_kernels_init();
    if (isa == TERN_ISA_AVX2 && !have_avx2) return false;
    if (isa != TERN_ISA_AVX2 && isa != TERN_ISA_PORTABLE) return false;
    active_isa = isa;
    return true;
}

bool tern_kernels_avx512_available(void) {
    tern_kernels_init();
    return have_avx512;
}

bool tern_kernels_avx512(void) {
    tern_kernels_init();
    return use_avx512;
}

bool tern_kernels_set_avx512(bool on) {
    tern_kernels_init();
    if (on && !have_avx512) return false;
    use_avx512 = on;
    return true;
}

static const struct tern_kernel_table *table(void) {
    return active_isa == TERN_ISA_AVX2 ? &tern_kernels_avx2 : &tern_kernels_portable;
}

bool tern_matmul_supported(enum tern_dtype wtype) {
    return (unsigned)wtype < TERN_DTYPE_COUNT && tern_kernels_portable.matmul[wtype] != NULL;
}

uint32_t tern_matmul_k_multiple(enum tern_dtype wtype) {
    const struct tern_dtype_info *i = tern_dtype_info((uint32_t)wtype);
    return i ? i->blck_size : 0;
}

enum tern_dtype tern_act_type(enum tern_dtype wtype) {
    switch (wtype) {
    case TERN_DTYPE_Q4_0:
    case TERN_DTYPE_Q4_1:
    case TERN_DTYPE_Q5_0:
    case TERN_DTYPE_Q5_1:
    case TERN_DTYPE_Q8_0:
    case TERN_DTYPE_IQ4_NL:
    case TERN_DTYPE_MXFP4: return TERN_DTYPE_Q8_0;
    case TERN_DTYPE_Q4_K:
    case TERN_DTYPE_Q5_K:
    case TERN_DTYPE_Q6_K:
    case TERN_DTYPE_IQ4_XS:
    case TERN_DTYPE_Q2_K:
    case TERN_DTYPE_Q3_K:
    case TERN_DTYPE_IQ2_XXS:
    case TERN_DTYPE_IQ2_XS:
    case TERN_DTYPE_IQ2_S:
    case TERN_DTYPE_IQ3_XXS:
    case TERN_DTYPE_IQ3_S:
    case TERN_DTYPE_IQ1_S:
    case TERN_DTYPE_IQ1_M: return TERN_DTYPE_Q8_K;
    default: return TERN_DTYPE_F32;
    }
}

size_t tern_act_row_bytes(enum tern_dtype wtype, size_t k) {
    const struct tern_dtype_info *i = tern_dtype_info((uint32_t)tern_act_type(wtype));
    return k / i->blck_size * i->type_size;
}

void tern_act_prepare(enum tern_dtype wtype, const float *x, void *out, size_t k) {
    tern_kernels_init();
    const enum tern_dtype at = tern_act_type(wtype);
    TERN_ASSERT(tern_matmul_supported(wtype));
    TERN_ASSERT(k % tern_dtype_info((uint32_t)at)->blck_size == 0);
    tern_act_fn fn = table()->act[at];
    if (!fn) fn = tern_kernels_portable.act[at];
    fn(x, out, k);
}

void tern_matmul(enum tern_dtype wtype, const void *w, size_t w_row_bytes, size_t k,
                 const void *act, size_t act_row_bytes, size_t n_tok, float *y, size_t ldy,
                 size_t r0, size_t r1) {
    tern_kernels_init();
    TERN_ASSERT(tern_matmul_supported(wtype));
    if (r0 >= r1 || n_tok == 0) return;
    const struct tern_dtype_info *wi = tern_dtype_info((uint32_t)wtype);
    TERN_ASSERT(k > 0 && k % wi->blck_size == 0);
    TERN_ASSERT(w_row_bytes >= k / wi->blck_size * wi->type_size);
    TERN_ASSERT(n_tok == 1 || act_row_bytes >= tern_act_row_bytes(wtype, k));
    TERN_ASSERT(n_tok == 1 || ldy >= r1);
    tern_matmul_fn fn = NULL;
    if (active_isa == TERN_ISA_AVX2 && use_avx512) fn = tern_kernels_avx512_tiles.matmul[wtype];
    if (!fn) fn = table()->matmul[wtype];
    if (!fn) fn = tern_kernels_portable.matmul[wtype];
    fn(w, w_row_bytes, k, act, act_row_bytes, n_tok, y, ldy, r0, r1);
}
