/* Random-weight model generator (see mkmodel.h). */
#include "model/mkmodel.h"

#include "util/threadpool.h"

#include "gguf/gguf.h"
#include "kernels/kernels.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/rng.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- PRNG: xoshiro256** seeded by splitmix64, normals by Box-Muller ----------------- */

struct rng {
    struct tern_rng x;
    double spare;
    bool has_spare;
};

static void rng_seed(struct rng *r, uint64_t seed) {
    tern_rng_seed(&r->x, seed);
    r->has_spare = false;
}

static double rng_uniform(struct rng *r) { return tern_rng_uniform(&r->x); } /* [0, 1) */

static double rng_normal(struct rng *r) {
    if (r->has_spare) {
        r->has_spare = false;
        return r->spare;
    }
    double u1 = 1.0 - rng_uniform(r); /* (0, 1]: log is finite */
    double u2 = rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1));
    double th = 6.283185307179586 * u2;
    r->spare = rad * sin(th);
    r->has_spare = true;
    return rad * cos(th);
}

/* ---- architectures, presets, types --------------------------------------------------- */

static const char *const arch_names[] = {"llama",     "qwen2",   "qwen3",    "qwen35",
                                         "qwen3moe",  "qwen35moe", "gpt-oss", "qwen3next"};

const char *tern_mk_arch_name(enum tern_mk_arch a) {
    return (unsigned)a < TERN_ARRAY_LEN(arch_names) ? arch_names[a] : "unknown";
}

bool tern_mk_arch_from_name(const char *s, enum tern_mk_arch *out) {
    for (size_t i = 0; i < TERN_ARRAY_LEN(arch_names); i++) {
        if (!strcmp(s, arch_names[i])) {
            *out = (enum tern_mk_arch)i;
            return true;
        }
    }
    return false;
}

void tern_mkmodel_defaults(enum tern_mk_arch arch, struct tern_mkmodel_params *p) {
    memset(p, 0, sizeof *p);
    p->arch = arch;
    p->n_layer = 4;
    p->n_embd = 256;
    p->n_head = 4;
    p->n_head_kv = 2;
    p->head_dim = 64;
    p->n_ff = 768;
    p->rms_eps = 1e-6f;
    p->ssm_k_heads = 2;
    p->ssm_v_heads = 4;
    p->ssm_state = 64;
    p->ssm_conv = 4;
    p->full_attn_interval = 4;
    p->wtype = TERN_DTYPE_F32;
    p->mix = TERN_MK_UNIFORM;
    p->seed = 1234;
    switch (arch) {
    case TERN_MK_LLAMA: p->n_ctx = 4096; p->rope_theta = 10000.0f; p->rms_eps = 1e-5f; break;
    case TERN_MK_QWEN2: p->n_ctx = 32768; p->rope_theta = 1e6f; break;
    case TERN_MK_QWEN3: p->n_ctx = 40960; p->rope_theta = 1e6f; break;
    case TERN_MK_QWEN35: p->n_ctx = 262144; p->rope_theta = 1e7f; break;
    case TERN_MK_QWEN3MOE: p->n_ctx = 40960; p->rope_theta = 1e6f; break;
    case TERN_MK_QWEN35MOE: p->n_ctx = 262144; p->rope_theta = 1e7f; break;
    case TERN_MK_QWEN3NEXT: p->n_ctx = 262144; p->rope_theta = 1e7f; break;
    case TERN_MK_GPTOSS: /* gpt-oss-20b's config.json, at the tiny kit model's width */
        p->n_ctx = 131072;
        p->rope_theta = 150000.0f;
        p->rms_eps = 1e-5f;
        p->n_embd = 192;
        p->n_ff = 160;
        p->n_expert = 8;
        p->n_expert_used = 4;
        p->n_ff_exp = 160;
        p->sliding_window = 128;
        p->yarn_factor = 32.0f;
        p->yarn_orig_ctx = 4096;
        break;
    }
    if (arch == TERN_MK_QWEN3MOE || arch == TERN_MK_QWEN35MOE || arch == TERN_MK_QWEN3NEXT) {
        p->n_expert = 8;
        p->n_expert_used = 2;
        p->n_ff_exp = arch == TERN_MK_QWEN3MOE ? 128 : 64;
        p->n_ff_shexp = arch == TERN_MK_QWEN3MOE ? 0 : 128;
    }
}

static bool is_moe(enum tern_mk_arch a) {
    return a == TERN_MK_QWEN3MOE || a == TERN_MK_QWEN35MOE || a == TERN_MK_GPTOSS || a == TERN_MK_QWEN3NEXT;
}
/* The hybrid layout (Gated DeltaNet + gated attention every full_attn_interval-th layer). */
static bool is_hybrid(enum tern_mk_arch a) {
    return a == TERN_MK_QWEN35 || a == TERN_MK_QWEN35MOE || a == TERN_MK_QWEN3NEXT;
}
/* A shared expert with its sigmoid gate in every MoE layer. */
static bool has_shexp(enum tern_mk_arch a) { return a == TERN_MK_QWEN35MOE || a == TERN_MK_QWEN3NEXT; }

struct preset {
    const char *name;
    enum tern_mk_arch arch;
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    bool tied;
    uint32_t ssm_k_heads, ssm_v_heads, ssm_state, ssm_conv, full_attn_interval, rope_dim;
    uint32_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
};

static const struct preset presets[] = {
    /* The shapes of /work/shared/models/tiny-*.gguf (n_vocab of the qwen-mini vocab). */
    {"tiny-qwen3", TERN_MK_QWEN3, 4, 256, 4, 2, 64, 768, 4122, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"tiny-qwen35", TERN_MK_QWEN35, 8, 256, 4, 2, 64, 768, 4122, false, 2, 4, 64, 4, 4, 16, 0, 0, 0, 0},
    {"tiny-llama", TERN_MK_LLAMA, 4, 256, 4, 2, 64, 768, 4122, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"tiny-qwen2", TERN_MK_QWEN2, 4, 256, 4, 2, 64, 768, 4122, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* Qwen3-0.6B. */
    {"qwen3-0.6b", TERN_MK_QWEN3, 28, 1024, 16, 8, 128, 3072, 151936, true, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* The Qwen3.5-0.8B text model (conformance/perf-reference.md). */
    {"qwen3.5-0.8b", TERN_MK_QWEN35, 24, 1024, 8, 2, 256, 3584, 248320, true, 16, 16, 128, 4, 4, 64, 0, 0, 0, 0},
    /* The shared tiny MoE models (models/README.md). */
    {"tiny-qwen3moe", TERN_MK_QWEN3MOE, 4, 256, 4, 2, 64, 768, 4122, false, 0, 0, 0, 0, 0, 0, 8, 2, 128, 0},
    {"tiny-qwen35moe", TERN_MK_QWEN35MOE, 4, 256, 4, 2, 64, 0, 4122, false, 2, 4, 64, 4, 4, 16, 8, 2, 64, 128},
    /* Qwen3-8B (the GPU benchmarks' dense shape). */
    {"qwen3-8b", TERN_MK_QWEN3, 36, 4096, 32, 8, 128, 12288, 151936, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* Qwen3-30B-A3B / Qwen3-Coder-30B-A3B: 128 experts of 768, 8 per token. */
    {"qwen3-30b-a3b", TERN_MK_QWEN3MOE, 48, 2048, 32, 4, 128, 6144, 151936, false, 0, 0, 0, 0, 0, 0, 128, 8, 768, 0},
    /* Qwen3.5-35B-A3B's text model (its config.json: 40 layers, 3 DeltaNet : 1 gated
     * attention, 16 k / 32 v linear heads of 128, 256 experts of 512, 8 per token, a
     * shared expert of 512, partial rotary 0.25 of head 256). */
    {"qwen3.5-35b-a3b", TERN_MK_QWEN35MOE, 40, 2048, 16, 2, 256, 0, 248320, false, 16, 32, 128, 4, 4, 64, 256, 8,
     512, 512},
    /* The kit's tiny-gptoss (window 16, below) and gpt-oss-20b (its config.json: 24 layers,
     * 64 q / 8 kv heads of 64, 32 experts of 2880, 4 per token, window 128, o200k_harmony's
     * 201088 ids). */
    {"tiny-gptoss", TERN_MK_GPTOSS, 4, 192, 4, 2, 64, 160, 4122, false, 0, 0, 0, 0, 0, 0, 8, 4, 160, 0},
    {"gpt-oss-20b", TERN_MK_GPTOSS, 24, 2880, 64, 8, 64, 2880, 201088, false, 0, 0, 0, 0, 0, 0, 32, 4, 2880, 0},
    /* The kit's tiny-qwen3next and Qwen3-Coder-Next / Qwen3-Next-80B-A3B (their config.json:
     * 48 layers, 3 DeltaNet : 1 gated attention, 16 q / 2 kv heads of 256 with a quarter
     * rotary, 16 k / 32 v linear heads of 128, 512 experts of 512, 10 per token, a shared
     * expert of 512, Qwen3's 151936 ids; intermediate_size 5120 is written and unused). */
    {"tiny-qwen3next", TERN_MK_QWEN3NEXT, 4, 256, 4, 2, 64, 512, 4122, false, 2, 4, 64, 4, 4, 16, 8, 2, 64, 128},
    {"qwen3-coder-next", TERN_MK_QWEN3NEXT, 48, 2048, 16, 2, 256, 5120, 151936, false, 16, 32, 128, 4, 4, 64, 512, 10,
     512, 512},
};

const char *tern_mkmodel_preset_names(void) {
    return "tiny-qwen3, tiny-qwen35, tiny-qwen3moe, tiny-qwen35moe, tiny-llama, tiny-qwen2, qwen3-0.6b, qwen3.5-0.8b, "
           "qwen3-8b, qwen3-30b-a3b, qwen3.5-35b-a3b, tiny-gptoss, gpt-oss-20b, tiny-qwen3next, qwen3-coder-next";
}

enum tern_status tern_mkmodel_preset(const char *name, struct tern_mkmodel_params *p) {
    for (size_t i = 0; i < TERN_ARRAY_LEN(presets); i++) {
        const struct preset *s = &presets[i];
        if (strcmp(s->name, name)) continue;
        tern_mkmodel_defaults(s->arch, p);
        p->n_layer = s->n_layer;
        p->n_embd = s->n_embd;
        p->n_head = s->n_head;
        p->n_head_kv = s->n_head_kv;
        p->head_dim = s->head_dim;
        p->n_ff = s->n_ff;
        p->n_vocab = s->n_vocab;
        p->tied = s->tied;
        if (is_moe(s->arch)) {
            p->n_expert = s->n_expert;
            p->n_expert_used = s->n_expert_used;
            p->n_ff_exp = s->n_ff_exp;
            p->n_ff_shexp = s->n_ff_shexp;
        }
        if (!strcmp(s->name, "tiny-gptoss")) p->sliding_window = 16; /* the kit's, shorter than its prompts */
        if (is_hybrid(s->arch)) {
            p->ssm_k_heads = s->ssm_k_heads;
            p->ssm_v_heads = s->ssm_v_heads;
            p->ssm_state = s->ssm_state;
            p->ssm_conv = s->ssm_conv;
            p->full_attn_interval = s->full_attn_interval;
            p->rope_dim = s->rope_dim;
        }
        return TERN_OK;
    }
    return tern_errorf(TERN_ERR_INVALID, "unknown preset '%s' (known: %s)", name, tern_mkmodel_preset_names());
}

bool tern_mkmodel_parse_type(const char *s, enum tern_dtype *wtype, enum tern_mk_mix *mix) {
    static const struct {
        const char *name;
        enum tern_dtype t;
        enum tern_mk_mix mix;
    } types[] = {
        {"f32", TERN_DTYPE_F32, TERN_MK_UNIFORM},        {"f16", TERN_DTYPE_F16, TERN_MK_UNIFORM},
        {"bf16", TERN_DTYPE_BF16, TERN_MK_UNIFORM},      {"q8_0", TERN_DTYPE_Q8_0, TERN_MK_LIKE_QUANTIZE},
        {"q4_0", TERN_DTYPE_Q4_0, TERN_MK_LIKE_QUANTIZE}, {"q4_1", TERN_DTYPE_Q4_1, TERN_MK_LIKE_QUANTIZE},
        {"q5_0", TERN_DTYPE_Q5_0, TERN_MK_LIKE_QUANTIZE}, {"q5_1", TERN_DTYPE_Q5_1, TERN_MK_LIKE_QUANTIZE},
        {"q4_k", TERN_DTYPE_Q4_K, TERN_MK_LIKE_QUANTIZE}, {"q5_k", TERN_DTYPE_Q5_K, TERN_MK_LIKE_QUANTIZE},
        {"q6_k", TERN_DTYPE_Q6_K, TERN_MK_LIKE_QUANTIZE}, {"q4_k_m", TERN_DTYPE_Q4_K, TERN_MK_Q4_K_M},
        {"iq4_xs", TERN_DTYPE_IQ4_XS, TERN_MK_LIKE_QUANTIZE}, {"iq4_nl", TERN_DTYPE_IQ4_NL, TERN_MK_LIKE_QUANTIZE},
        {"mxfp4_moe", TERN_DTYPE_Q8_0, TERN_MK_MXFP4_MOE},
        {"q2_k", TERN_DTYPE_Q2_K, TERN_MK_Q2_K},          {"q3_k", TERN_DTYPE_Q3_K, TERN_MK_LIKE_QUANTIZE},
        {"q3_k_m", TERN_DTYPE_Q3_K, TERN_MK_Q3_K_M},      {"ud_q2", TERN_DTYPE_IQ2_XXS, TERN_MK_UD_Q2},
        {"iq2_xxs", TERN_DTYPE_IQ2_XXS, TERN_MK_LIKE_QUANTIZE}, {"iq2_xs", TERN_DTYPE_IQ2_XS, TERN_MK_LIKE_QUANTIZE},
        {"iq2_s", TERN_DTYPE_IQ2_S, TERN_MK_LIKE_QUANTIZE}, {"iq3_xxs", TERN_DTYPE_IQ3_XXS, TERN_MK_LIKE_QUANTIZE},
        {"iq3_s", TERN_DTYPE_IQ3_S, TERN_MK_LIKE_QUANTIZE}, {"iq1_s", TERN_DTYPE_IQ1_S, TERN_MK_LIKE_QUANTIZE},
        {"iq1_m", TERN_DTYPE_IQ1_M, TERN_MK_LIKE_QUANTIZE},
    };
    for (size_t i = 0; i < TERN_ARRAY_LEN(types); i++) {
        if (!strcasecmp(s, types[i].name)) {
            *wtype = types[i].t;
            *mix = types[i].mix;
            return true;
        }
    }
    return false;
}

/* llama.cpp's LLAMA_FTYPE numbering for general.file_type. */
static uint32_t file_type(enum tern_dtype t, enum tern_mk_mix mix) {
    if (mix == TERN_MK_Q4_K_M) return 15;
    if (mix == TERN_MK_MXFP4_MOE) return 38;
    if (mix == TERN_MK_Q2_K) return 10;
    if (mix == TERN_MK_Q3_K_M) return 12;
    if (mix == TERN_MK_UD_Q2) return 19; /* its most common expert type, IQ2_XXS, as such files say */
    switch (t) {
    case TERN_DTYPE_F32: return 0;
    case TERN_DTYPE_F16: return 1;
    case TERN_DTYPE_Q4_0: return 2;
    case TERN_DTYPE_Q4_1: return 3;
    case TERN_DTYPE_Q8_0: return 7;
    case TERN_DTYPE_Q5_0: return 8;
    case TERN_DTYPE_Q5_1: return 9;
    case TERN_DTYPE_Q4_K: return 14; /* Q4_K_S */
    case TERN_DTYPE_Q5_K: return 16; /* Q5_K_S */
    case TERN_DTYPE_Q6_K: return 18;
    case TERN_DTYPE_BF16: return 32;
    case TERN_DTYPE_IQ4_NL: return 25;
    case TERN_DTYPE_IQ4_XS: return 30;
    case TERN_DTYPE_Q2_K: return 10;
    case TERN_DTYPE_Q3_K: return 11; /* Q3_K_S */
    case TERN_DTYPE_IQ2_XXS: return 19;
    case TERN_DTYPE_IQ2_XS: return 20;
    case TERN_DTYPE_IQ3_XXS: return 23;
    case TERN_DTYPE_IQ1_S: return 24;
    case TERN_DTYPE_IQ3_S: return 26;
    case TERN_DTYPE_IQ2_S: return 28;
    case TERN_DTYPE_IQ1_M: return 31;
    default: return 0;
    }
}

static bool is_float_type(enum tern_dtype t) {
    return t == TERN_DTYPE_F32 || t == TERN_DTYPE_F16 || t == TERN_DTYPE_BF16;
}

#define LIMIT_DIM 1048576u     /* embedding, ffn and head sizes */
#define LIMIT_VOCAB 16777216u
#define LIMIT_LAYERS 1024u
#define LIMIT_HEADS 4096u

static enum tern_status check_range(const char *what, uint32_t v, uint32_t lo, uint32_t hi) {
    if (v < lo || v > hi) return tern_errorf(TERN_ERR_INVALID, "%s %u is outside %u..%u", what, v, lo, hi);
    return TERN_OK;
}

enum tern_status tern_mkmodel_check(const struct tern_mkmodel_params *p) {
    enum tern_status st;
    if ((unsigned)p->arch >= TERN_ARRAY_LEN(arch_names))
        return tern_errorf(TERN_ERR_INVALID, "unknown architecture %d", (int)p->arch);
    if ((st = check_range("n_layer", p->n_layer, 1, LIMIT_LAYERS))) return st;
    if ((st = check_range("n_embd", p->n_embd, 1, LIMIT_DIM))) return st;
    if ((st = check_range("n_head", p->n_head, 1, LIMIT_HEADS))) return st;
    if ((st = check_range("n_head_kv", p->n_head_kv, 1, p->n_head))) return st;
    if ((st = check_range("head_dim", p->head_dim, 1, 65536))) return st;
    if ((st = check_range("n_ff", p->n_ff, has_shexp(p->arch) ? 0 : 1, LIMIT_DIM))) return st;
    if (is_moe(p->arch)) {
        if ((st = check_range("experts", p->n_expert, 1, 1024))) return st;
        if ((st = check_range("experts used", p->n_expert_used, 1, TERN_MIN(p->n_expert, 64u)))) return st;
        if ((st = check_range("expert ffn", p->n_ff_exp, 1, LIMIT_DIM))) return st;
        if (has_shexp(p->arch) && (st = check_range("shared expert ffn", p->n_ff_shexp, 1, LIMIT_DIM)))
            return st;
    }
    if (p->arch == TERN_MK_GPTOSS) {
        if ((st = check_range("sliding window", p->sliding_window, 1, UINT32_MAX))) return st;
        if (!(p->yarn_factor >= 1.0f) || p->yarn_orig_ctx == 0)
            return tern_errorf(TERN_ERR_INVALID, "YaRN factor %g must be at least 1 and the original context %u positive",
                               (double)p->yarn_factor, p->yarn_orig_ctx);
    }
    if (p->mix == TERN_MK_MXFP4_MOE && !is_moe(p->arch))
        return tern_errorf(TERN_ERR_INVALID, "the mxfp4_moe type mix needs a mixture-of-experts architecture, not %s",
                           arch_names[p->arch]);
    if ((st = check_range("n_ctx", p->n_ctx, 1, UINT32_MAX))) return st;
    if (p->n_vocab && (st = check_range("n_vocab", p->n_vocab, 1, LIMIT_VOCAB))) return st;
    if (p->n_head % p->n_head_kv)
        return tern_errorf(TERN_ERR_INVALID, "n_head %u is not a multiple of n_head_kv %u", p->n_head, p->n_head_kv);
    if ((uint64_t)p->n_head * p->head_dim > LIMIT_DIM)
        return tern_errorf(TERN_ERR_INVALID, "n_head x head_dim = %" PRIu64 " exceeds %u",
                           (uint64_t)p->n_head * p->head_dim, LIMIT_DIM);
    uint32_t rope_dim = p->rope_dim;
    if (rope_dim && (rope_dim > p->head_dim || rope_dim % 2))
        return tern_errorf(TERN_ERR_INVALID, "rope dimension %u must be even and at most head_dim %u", rope_dim,
                           p->head_dim);
    if (!(p->rope_theta > 0) || !(p->rms_eps > 0))
        return tern_errorf(TERN_ERR_INVALID, "rope_theta %g and rms_eps %g must be positive", p->rope_theta,
                           p->rms_eps);
    if (p->mtp_echo > 2) return tern_errorf(TERN_ERR_INVALID, "mtp_echo %u is not 0, 1 or 2", p->mtp_echo);
    if (p->n_mtp > 1 || (p->n_mtp && !is_hybrid(p->arch)))
        return tern_errorf(TERN_ERR_INVALID, "%u MTP blocks: only qwen35, qwen35moe and qwen3next take one (--mtp 0 or 1)",
                           p->n_mtp);
    if (is_hybrid(p->arch)) {
        if ((st = check_range("ssm k-heads", p->ssm_k_heads, 1, LIMIT_HEADS))) return st;
        if ((st = check_range("ssm v-heads", p->ssm_v_heads, 1, LIMIT_HEADS))) return st;
        if ((st = check_range("ssm state", p->ssm_state, 1, 65536))) return st;
        if ((st = check_range("ssm conv kernel", p->ssm_conv, 1, 64))) return st;
        if ((st = check_range("full attention interval", p->full_attn_interval, 1, LIMIT_LAYERS))) return st;
        if (p->ssm_v_heads % p->ssm_k_heads)
            return tern_errorf(TERN_ERR_INVALID, "ssm v-heads %u is not a multiple of ssm k-heads %u", p->ssm_v_heads,
                               p->ssm_k_heads);
        if ((uint64_t)(2 * p->ssm_k_heads + p->ssm_v_heads) * p->ssm_state > LIMIT_DIM)
            return tern_errorf(TERN_ERR_INVALID, "ssm projection width exceeds %u", LIMIT_DIM);
        uint32_t rd = rope_dim ? rope_dim : p->head_dim / 4;
        int32_t sum = 0;
        for (int i = 0; i < 4; i++) {
            if (p->rope_sections[i] < 0)
                return tern_errorf(TERN_ERR_INVALID, "rope section %d is negative (%d)", i, p->rope_sections[i]);
            sum += p->rope_sections[i];
        }
        if (sum && (uint32_t)sum * 2 != rd)
            return tern_errorf(TERN_ERR_INVALID, "rope sections sum to %d pairs, rope dimension %u has %u", sum, rd,
                               rd / 2);
        if (rd < 2)
            return tern_errorf(TERN_ERR_INVALID, "rope dimension %u (head_dim %u / 4) is below 2", rd, p->head_dim);
    }
    if (!tern_dtype_info((uint32_t)p->wtype) || (!is_float_type(p->wtype) && !tern_quantize_supported(p->wtype)))
        return tern_errorf(TERN_ERR_UNSUPPORTED, "no quantizer for type %s", tern_dtype_name((uint32_t)p->wtype));
    return TERN_OK;
}

/* ---- tensors ------------------------------------------------------------------------ */

/* INIT_ZERO and INIT_PASS (tern_mkmodel_params.mtp_echo) draw like INIT_WEIGHT and then
 * write 0, resp. the matrix that passes the second half of its input through; INIT_SIGN
 * is +-1 by the sign of a normal, INIT_LOUD N(0, 0.1). gpt-oss (as the kit's generator):
 * attention sinks INIT_SINK N(0, 1), expert gate/up biases INIT_GU_BIAS N(0, 4), so that
 * the swiglu clamp fires; its other biases and expert matrices INIT_LOUD. */
enum init {
    INIT_WEIGHT,
    INIT_NORM,
    INIT_SSM_A,
    INIT_DT_BIAS,
    INIT_CONV,
    INIT_ZERO,
    INIT_PASS,
    INIT_SIGN,
    INIT_LOUD,
    INIT_SINK,
    INIT_GU_BIAS
};

struct mk_tensor {
    char name[96];
    enum init init;
    enum tern_dtype type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t row_bytes;
    uint64_t seed;
    struct rng rng;
    struct mk_rows *rows; /* shared by all tensors */
};

/* One fill call's rows, generated and quantized on the pool. The values are those of one
 * random stream per tensor drawn in order: a thread starting at element e skips the
 * stream ahead to e (xoshiro steps are cheap next to the log and sincos of a normal), so
 * the bytes do not depend on the number of threads. */
struct mk_rows {
    float *buf;
    size_t cap; /* floats */
    struct tern_threadpool *pool;
    /* the current task */
    struct mk_tensor *t;
    uint64_t row0, n_rows;
    void *dst;
    _Atomic int failed;
};

struct mk_ctx {
    const struct tern_mkmodel_params *p;
    struct mk_tensor *t;
    uint32_t n, cap;
    uint32_t n_wv, i_wv; /* llama-quantize's count of attn_v / attn_qkv tensors (Q4_K_M) */
    uint32_t n_fallback;
    char first_fallback[160];
    uint64_t max_ne0;
};

/* Advances r past m normals (rng_normal's pairs: two uniforms make two normals). */
static void rng_skip_normals(struct rng *r, uint64_t m) {
    if (m && r->has_spare) {
        r->has_spare = false;
        m--;
    }
    for (uint64_t i = 0; i < m / 2 * 2; i++) (void)rng_uniform(r);
    if (m % 2) (void)rng_normal(r); /* leaves the pair's second value as the spare */
}

static float init_value(struct mk_tensor *t, struct rng *r) {
    switch (t->init) {
    case INIT_NORM:
    case INIT_DT_BIAS: return (float)(1.0 + 0.02 * rng_normal(r));
    case INIT_SSM_A: return (float)-exp(rng_uniform(r) * log(16.0));
    case INIT_CONV: return (float)(0.3 * rng_normal(r));
    case INIT_SIGN: return rng_normal(r) < 0 ? -1.0f : 1.0f;
    case INIT_LOUD: return (float)(0.1 * rng_normal(r));
    case INIT_SINK: return (float)rng_normal(r);
    case INIT_GU_BIAS: return (float)(4.0 * rng_normal(r));
    default: return (float)(0.02 * rng_normal(r));
    }
}

static void fill_task(void *ctx, int ith, int nth) {
    struct mk_rows *q = ctx;
    struct mk_tensor *t = q->t;
    const uint64_t k = t->ne[0];
    const uint64_t r0 = q->n_rows * (uint64_t)ith / (uint64_t)nth, r1 = q->n_rows * (uint64_t)(ith + 1) / (uint64_t)nth;
    struct rng r = t->rng; /* the stream at this call's first element */
    rng_skip_normals(&r, r0 * k);
    for (uint64_t row = r0; row < r1; row++) {
        float *v = t->type == TERN_DTYPE_F32 ? (float *)((uint8_t *)q->dst + row * t->row_bytes) : q->buf + row * k;
        for (uint64_t i = 0; i < k; i++) v[i] = init_value(t, &r);
        if (t->init == INIT_ZERO || t->init == INIT_PASS) {
            memset(v, 0, (size_t)k * sizeof *v);
            if (t->init == INIT_PASS) v[k / 2 + q->row0 + row] = 1.0f; /* output j = input n_embd + j */
        }
        if (t->type != TERN_DTYPE_F32 && !tern_quantize_row(t->type, v, (uint8_t *)q->dst + row * t->row_bytes, (size_t)k))
            q->failed = 1;
    }
}

static enum tern_status fill(void *user, uint64_t row0, uint64_t n_rows, void *dst) {
    struct mk_tensor *t = user;
    struct mk_rows *q = t->rows;
    if (row0 == 0) rng_seed(&t->rng, t->seed);
    const uint64_t k = t->ne[0];
    if (t->type != TERN_DTYPE_F32 && n_rows * k > q->cap) {
        float *b = tern_malloc((size_t)(n_rows * k) * sizeof(float));
        if (!b) return tern_errorf(TERN_ERR_NOMEM, "mkmodel: no memory for %" PRIu64 " rows of '%s'", n_rows, t->name);
        free(q->buf);
        q->buf = b;
        q->cap = (size_t)(n_rows * k);
    }
    q->t = t;
    q->row0 = row0;
    q->n_rows = n_rows;
    q->dst = dst;
    q->failed = 0;
    /* ssm_a draws uniforms, not normals: its few values are drawn in one go */
    if (q->pool && n_rows > 1 && t->init != INIT_SSM_A) tern_threadpool_run(q->pool, fill_task, q);
    else fill_task(q, 0, 1);
    if (q->failed) return tern_error_prefix(TERN_ERR_INTERNAL, "quantizing '%s'", t->name);
    if (t->init == INIT_SSM_A)
        for (uint64_t i = 0; i < n_rows * k; i++) (void)rng_uniform(&t->rng);
    else
        rng_skip_normals(&t->rng, n_rows * k);
    return TERN_OK;
}

/* use_more_bits as llama-quantize decides it: the first and last eighth of the layers
 * and every third one between get the larger type. */
static bool more_bits(uint32_t i, uint32_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static bool name_ends(const char *name, const char *suffix) {
    size_t n = strlen(name), s = strlen(suffix);
    return n >= s && !strcmp(name + n - s, suffix);
}

/* The type a tensor gets: 1-D tensors and the ones llama-quantize keeps in F32 stay F32;
 * matrices get the weight type, adjusted by the mix; a row length the type's blocks do
 * not divide falls back to F32. */
static enum tern_dtype pick_type(struct mk_ctx *c, const struct mk_tensor *t, uint32_t layer) {
    const struct tern_mkmodel_params *p = c->p;
    if (t->n_dims < 2 ||
        (t->init != INIT_WEIGHT && t->init != INIT_ZERO && t->init != INIT_PASS && t->init != INIT_LOUD))
        return TERN_DTYPE_F32;
    /* llama-quantize keeps the MoE routers and every bias (gpt-oss's 2-D expert ones) in F32 */
    if (name_ends(t->name, ".ffn_gate_inp.weight") || name_ends(t->name, ".ffn_gate_inp_shexp.weight") ||
        name_ends(t->name, ".bias"))
        return TERN_DTYPE_F32;
    enum tern_dtype type = p->wtype;
    if (p->mix == TERN_MK_MXFP4_MOE && t->n_dims == 3) type = TERN_DTYPE_MXFP4; /* the stacked experts */
    bool is_output = !strcmp(t->name, "output.weight") || (p->tied && !strcmp(t->name, "token_embd.weight"));
    if (p->mix != TERN_MK_UNIFORM && is_output && type != TERN_DTYPE_Q8_0 && type != TERN_DTYPE_Q6_K &&
        !is_float_type(type))
        type = TERN_DTYPE_Q6_K;
    const bool is_wv = name_ends(t->name, ".attn_v.weight") || name_ends(t->name, ".attn_qkv.weight");
    const bool is_down = name_ends(t->name, ".ffn_down.weight") || name_ends(t->name, ".ffn_down_exps.weight") ||
                         name_ends(t->name, ".ffn_down_shexp.weight");
    /* The low-bit mixes' rules, as llama-quantize's read-back shows them (docs/moe.md). */
    if (p->mix == TERN_MK_Q2_K) {
        if (is_wv) type = p->n_head >= 4 * p->n_head_kv ? TERN_DTYPE_Q4_K : TERN_DTYPE_Q3_K;
        else if (is_down || name_ends(t->name, ".attn_output.weight")) type = TERN_DTYPE_Q3_K;
    } else if (p->mix == TERN_MK_Q3_K_M) {
        if (is_wv) type = c->i_wv++ < 2 ? TERN_DTYPE_Q5_K : TERN_DTYPE_Q4_K;
        else if (name_ends(t->name, ".attn_output.weight")) type = TERN_DTYPE_Q4_K;
        else if (is_down) type = layer < p->n_layer / 16 ? TERN_DTYPE_Q5_K : TERN_DTYPE_Q4_K;
    } else if (p->mix == TERN_MK_UD_Q2 && !is_output) {
        const bool more = more_bits(layer, p->n_layer);
        if (name_ends(t->name, "_exps.weight"))
            type = name_ends(t->name, ".ffn_down_exps.weight") ? (more ? TERN_DTYPE_IQ3_S : TERN_DTYPE_IQ3_XXS)
                                                               : (more ? TERN_DTYPE_IQ2_S : TERN_DTYPE_IQ2_XXS);
        else if (name_ends(t->name, ".attn_k.weight") || name_ends(t->name, ".attn_v.weight") ||
                 name_ends(t->name, ".ssm_alpha.weight") || name_ends(t->name, ".ssm_beta.weight") ||
                 name_ends(t->name, ".ssm_ba.weight"))
            type = TERN_DTYPE_Q8_0;
        else if (name_ends(t->name, "_shexp.weight") || !strcmp(t->name, "token_embd.weight"))
            type = TERN_DTYPE_Q4_K;
        else if (!strncmp(t->name, "blk.", 4))
            type = TERN_DTYPE_IQ3_S; /* attention, DeltaNet and dense FFN projections */
        else
            type = TERN_DTYPE_Q4_K;
    }
    if (p->mix == TERN_MK_Q4_K_M) {
        if (name_ends(t->name, ".attn_v.weight") || name_ends(t->name, ".attn_qkv.weight")) {
            if (more_bits(c->i_wv, c->n_wv)) type = TERN_DTYPE_Q6_K;
            c->i_wv++;
        } else if ((name_ends(t->name, ".ffn_down.weight") || name_ends(t->name, ".ffn_down_exps.weight") ||
                    name_ends(t->name, ".ffn_down_shexp.weight")) &&
                   more_bits(layer, p->n_layer)) {
            type = TERN_DTYPE_Q6_K;
        }
    }
    /* llama-quantize's fallback: IQ4_XS rows that are not a multiple of 256 take IQ4_NL. */
    if (type == TERN_DTYPE_IQ4_XS && t->ne[0] % tern_matmul_k_multiple(TERN_DTYPE_IQ4_XS) &&
        t->ne[0] % tern_matmul_k_multiple(TERN_DTYPE_IQ4_NL) == 0)
        type = TERN_DTYPE_IQ4_NL;
    const struct tern_dtype_info *info = tern_dtype_info((uint32_t)type);
    if (t->ne[0] % info->blck_size) {
        /* llama-quantize's fallbacks for rows the K-quant blocks do not divide */
        enum tern_dtype fb = type;
        switch (type) {
        case TERN_DTYPE_Q4_K: fb = TERN_DTYPE_Q5_0; break;
        case TERN_DTYPE_Q5_K: fb = TERN_DTYPE_Q5_1; break;
        case TERN_DTYPE_Q6_K: fb = TERN_DTYPE_Q8_0; break;
        case TERN_DTYPE_Q2_K: case TERN_DTYPE_Q3_K: case TERN_DTYPE_IQ2_XXS: case TERN_DTYPE_IQ2_XS:
        case TERN_DTYPE_IQ2_S: case TERN_DTYPE_IQ3_XXS: case TERN_DTYPE_IQ3_S: case TERN_DTYPE_IQ1_S:
        case TERN_DTYPE_IQ1_M: fb = TERN_DTYPE_IQ4_NL; break;
        default: break;
        }
        const struct tern_dtype_info *fi = tern_dtype_info((uint32_t)fb);
        if (fb != type && t->ne[0] % fi->blck_size == 0 && tern_quantize_supported(fb)) return fb;
    }
    if (t->ne[0] % info->blck_size) {
        TERN_LOG_DEBUG("mkmodel: '%s' stays F32: its rows of %" PRIu64 " are not a multiple of the %s block size %u",
                       t->name, t->ne[0], info->name, info->blck_size);
        if (c->n_fallback++ == 0) {
            snprintf(c->first_fallback, sizeof c->first_fallback, "'%s' (rows of %" PRIu64 ", %s blocks of %u)",
                     t->name, t->ne[0], info->name, info->blck_size);
        }
        return TERN_DTYPE_F32;
    }
    return type;
}

static enum tern_status add_v(struct mk_ctx *c, enum init init, uint32_t layer, uint64_t ne0, uint64_t ne1,
                              uint64_t ne2, const char *fmt, va_list ap) {
    if (c->n == c->cap) {
        uint32_t cap = c->cap ? c->cap * 2 : 64;
        struct mk_tensor *t = tern_reallocarray(c->t, cap, sizeof *t);
        if (!t) return tern_errorf(TERN_ERR_NOMEM, "mkmodel: no memory for the tensor list");
        c->t = t;
        c->cap = cap;
    }
    struct mk_tensor *t = &c->t[c->n];
    memset(t, 0, sizeof *t);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    t->init = init;
    t->n_dims = ne2 ? 3 : ne1 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1 ? ne1 : 1;
    t->ne[2] = ne2 ? ne2 : 1;
    t->ne[3] = 1;
    t->seed = c->p->seed ^ tern_hash64(t->name, strlen(t->name));
    t->type = pick_type(c, t, layer);
    c->max_ne0 = TERN_MAX(c->max_ne0, ne0);
    c->n++;
    return TERN_OK;
}

static enum tern_status add(struct mk_ctx *c, enum init init, uint32_t layer, uint64_t ne0, uint64_t ne1,
                            const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    enum tern_status st = add_v(c, init, layer, ne0, ne1, 0, fmt, ap);
    va_end(ap);
    return st;
}

/* A stack of ne2 matrices [ne0, ne1] (MoE experts). */
static enum tern_status add3(struct mk_ctx *c, enum init init, uint32_t layer, uint64_t ne0, uint64_t ne1,
                             uint64_t ne2, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    enum tern_status st = add_v(c, init, layer, ne0, ne1, ne2, fmt, ap);
    va_end(ap);
    return st;
}

static bool is_full_attn(const struct tern_mkmodel_params *p, uint32_t il) {
    return !is_hybrid(p->arch) || (il + 1) % p->full_attn_interval == 0;
}

static enum tern_status build_tensors(struct mk_ctx *c, uint32_t n_vocab) {
    const struct tern_mkmodel_params *p = c->p;
    const uint64_t e = p->n_embd, hd = p->head_dim, q = (uint64_t)p->n_head * hd, kv = (uint64_t)p->n_head_kv * hd;
    const uint64_t ssm_inner = (uint64_t)p->ssm_v_heads * p->ssm_state;
    const uint64_t ssm_conv_ch = 2 * (uint64_t)p->ssm_k_heads * p->ssm_state + ssm_inner;
    /* The Q4_K_M mix counts attn_v/attn_qkv tensors before it picks any type. */
    c->n_wv = p->n_layer + p->n_mtp;
    enum tern_status st = TERN_OK;
#define ADD(...) do { if ((st = add(c, __VA_ARGS__))) return st; } while (0)
    ADD(INIT_WEIGHT, 0, e, n_vocab, "token_embd.weight");
    ADD(INIT_NORM, 0, e, 0, "output_norm.weight");
    if (!p->tied) ADD(INIT_WEIGHT, 0, e, n_vocab, "output.weight");
    /* The MTP blocks (qwen35, --mtp) follow the main layers, as llama.cpp's converter
     * writes them: a full-attention decoder layer plus the nextn tensors. */
    for (uint32_t il = 0; il < p->n_layer + p->n_mtp; il++) {
        const bool mtp = il >= p->n_layer;
        /* mtp_echo: the block passes the hidden state through (mkmodel.h) */
        const enum init out_init = mtp && p->mtp_echo ? INIT_ZERO : INIT_WEIGHT;
        /* mtp_echo 2: an attention loud enough to change some guesses */
        const enum init attn_out_init = !mtp || !p->mtp_echo ? INIT_WEIGHT : p->mtp_echo == 1 ? INIT_ZERO : INIT_LOUD;
        ADD(INIT_NORM, il, e, 0, "blk.%u.attn_norm.weight", il);
        if (mtp) {
            /* input [embedding | hidden] */
            ADD(p->mtp_echo ? INIT_PASS : INIT_WEIGHT, il, 2 * e, e, "blk.%u.nextn.eh_proj.weight", il);
            /* mtp_echo: random signs, so that the embedding half (were it the one passed
             * through) would point nowhere */
            ADD(p->mtp_echo ? INIT_SIGN : INIT_NORM, il, e, 0, "blk.%u.nextn.enorm.weight", il);
            ADD(INIT_NORM, il, e, 0, "blk.%u.nextn.hnorm.weight", il);
            ADD(INIT_NORM, il, e, 0, "blk.%u.nextn.shared_head_norm.weight", il);
        }
        if (is_hybrid(p->arch)) {
            ADD(INIT_NORM, il, e, 0, "blk.%u.post_attention_norm.weight", il);
            if (mtp || is_full_attn(p, il)) {
                ADD(INIT_WEIGHT, il, e, 2 * q, "blk.%u.attn_q.weight", il); /* per head: q then gate */
                ADD(INIT_WEIGHT, il, e, kv, "blk.%u.attn_k.weight", il);
                ADD(INIT_WEIGHT, il, e, kv, "blk.%u.attn_v.weight", il);
                ADD(attn_out_init, il, q, e, "blk.%u.attn_output.weight", il);
                ADD(INIT_NORM, il, hd, 0, "blk.%u.attn_q_norm.weight", il);
                ADD(INIT_NORM, il, hd, 0, "blk.%u.attn_k_norm.weight", il);
            } else {
                ADD(INIT_WEIGHT, il, e, ssm_conv_ch, "blk.%u.attn_qkv.weight", il);
                ADD(INIT_WEIGHT, il, e, ssm_inner, "blk.%u.attn_gate.weight", il);
                ADD(INIT_CONV, il, p->ssm_conv, ssm_conv_ch, "blk.%u.ssm_conv1d.weight", il);
                ADD(INIT_DT_BIAS, il, p->ssm_v_heads, 0, "blk.%u.ssm_dt.bias", il);
                ADD(INIT_SSM_A, il, p->ssm_v_heads, 0, "blk.%u.ssm_a", il);
                if (p->arch == TERN_MK_QWEN3NEXT) { /* per k-head [beta | alpha] */
                    ADD(INIT_WEIGHT, il, e, 2 * p->ssm_v_heads, "blk.%u.ssm_ba.weight", il);
                } else {
                    ADD(INIT_WEIGHT, il, e, p->ssm_v_heads, "blk.%u.ssm_beta.weight", il);
                    ADD(INIT_WEIGHT, il, e, p->ssm_v_heads, "blk.%u.ssm_alpha.weight", il);
                }
                ADD(INIT_NORM, il, p->ssm_state, 0, "blk.%u.ssm_norm.weight", il);
                ADD(INIT_WEIGHT, il, ssm_inner, e, "blk.%u.ssm_out.weight", il);
            }
        } else {
            bool bias = p->arch == TERN_MK_QWEN2 || p->arch == TERN_MK_GPTOSS;
            const enum init binit = p->arch == TERN_MK_GPTOSS ? INIT_LOUD : INIT_WEIGHT;
            ADD(INIT_WEIGHT, il, e, q, "blk.%u.attn_q.weight", il);
            if (bias) ADD(binit, il, q, 0, "blk.%u.attn_q.bias", il);
            ADD(INIT_WEIGHT, il, e, kv, "blk.%u.attn_k.weight", il);
            if (bias) ADD(binit, il, kv, 0, "blk.%u.attn_k.bias", il);
            ADD(INIT_WEIGHT, il, e, kv, "blk.%u.attn_v.weight", il);
            if (bias) ADD(binit, il, kv, 0, "blk.%u.attn_v.bias", il);
            ADD(INIT_WEIGHT, il, q, e, "blk.%u.attn_output.weight", il);
            if (p->arch == TERN_MK_QWEN3 || p->arch == TERN_MK_QWEN3MOE) {
                ADD(INIT_NORM, il, hd, 0, "blk.%u.attn_k_norm.weight", il);
                ADD(INIT_NORM, il, hd, 0, "blk.%u.attn_q_norm.weight", il);
            }
            if (p->arch == TERN_MK_GPTOSS) {
                ADD(INIT_LOUD, il, e, 0, "blk.%u.attn_output.bias", il);
                ADD(INIT_SINK, il, p->n_head, 0, "blk.%u.attn_sinks.weight", il);
                ADD(INIT_NORM, il, e, 0, "blk.%u.post_attention_norm.weight", il);
            } else {
                ADD(INIT_NORM, il, e, 0, "blk.%u.ffn_norm.weight", il);
            }
        }
        if (is_moe(p->arch)) {
            const uint64_t x = p->n_expert, f = p->n_ff_exp, sf = p->n_ff_shexp;
            ADD(INIT_WEIGHT, il, e, x, "blk.%u.ffn_gate_inp.weight", il);
            if (p->arch == TERN_MK_GPTOSS) {
                /* each matrix followed by its bias ([n, n_expert] for the experts), in the
                 * converter's order */
                ADD(INIT_LOUD, il, x, 0, "blk.%u.ffn_gate_inp.bias", il);
                if ((st = add3(c, INIT_LOUD, il, e, f, x, "blk.%u.ffn_gate_exps.weight", il))) return st;
                ADD(INIT_GU_BIAS, il, f, x, "blk.%u.ffn_gate_exps.bias", il);
                if ((st = add3(c, INIT_LOUD, il, e, f, x, "blk.%u.ffn_up_exps.weight", il))) return st;
                ADD(INIT_GU_BIAS, il, f, x, "blk.%u.ffn_up_exps.bias", il);
                if ((st = add3(c, out_init, il, f, e, x, "blk.%u.ffn_down_exps.weight", il))) return st;
                ADD(INIT_LOUD, il, e, x, "blk.%u.ffn_down_exps.bias", il);
            } else if ((st = add3(c, INIT_WEIGHT, il, e, f, x, "blk.%u.ffn_gate_exps.weight", il)) ||
                       (st = add3(c, INIT_WEIGHT, il, e, f, x, "blk.%u.ffn_up_exps.weight", il)) ||
                       (st = add3(c, out_init, il, f, e, x, "blk.%u.ffn_down_exps.weight", il))) {
                return st;
            }
            if (sf) {
                /* [n_embd, 1] as the HF converter writes it; 1-D once llama-quantize has
                 * rewritten it, so a quantized file carries the 1-D form. */
                ADD(INIT_WEIGHT, il, e, is_float_type(p->wtype) ? 1 : 0, "blk.%u.ffn_gate_inp_shexp.weight", il);
                ADD(INIT_WEIGHT, il, e, sf, "blk.%u.ffn_gate_shexp.weight", il);
                ADD(INIT_WEIGHT, il, e, sf, "blk.%u.ffn_up_shexp.weight", il);
                ADD(out_init, il, sf, e, "blk.%u.ffn_down_shexp.weight", il);
            }
        } else {
            ADD(INIT_WEIGHT, il, e, p->n_ff, "blk.%u.ffn_gate.weight", il);
            ADD(INIT_WEIGHT, il, e, p->n_ff, "blk.%u.ffn_up.weight", il);
            ADD(out_init, il, p->n_ff, e, "blk.%u.ffn_down.weight", il);
        }
    }
#undef ADD
    return TERN_OK;
}

/* ---- vocabulary ---------------------------------------------------------------------- */

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the others are
 * shifted to U+0100 and up, so that every byte has a visible one-character token. The
 * token ids follow GPT-2's order: the printable bytes first, then the rest. */
static void byte_tokens(char text[256][4], uint8_t order[256]) {
    uint32_t n = 0, extra = 0;
    bool seen[256] = {false};
    for (uint32_t b = 0; b < 256; b++) {
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
            order[n++] = (uint8_t)b;
            seen[b] = true;
        }
    }
    for (uint32_t b = 0; b < 256; b++)
        if (!seen[b]) order[n++] = (uint8_t)b;
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t cp = seen[b] ? b : 256 + extra++;
        if (cp < 0x80) {
            text[b][0] = (char)cp;
            text[b][1] = 0;
        } else {
            text[b][0] = (char)(0xc0 | (cp >> 6));
            text[b][1] = (char)(0x80 | (cp & 0x3f));
            text[b][2] = 0;
        }
    }
}

/* A small ChatML template written for tern (the format Qwen models use). */
static const char chat_template[] =
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n";

static const char *const builtin_merges[][2] = {
    {"\xc4\xa0", "t"}, {"h", "e"}, {"i", "n"}, {"e", "r"}, {"o", "n"}, {"r", "e"}, {"a", "n"}, {"\xc4\xa0t", "he"},
};
static const struct {
    const char *text;
    int32_t type; /* 3 control, 4 user-defined */
} builtin_specials[] = {
    {"<|endoftext|>", 3}, {"<|im_start|>", 3}, {"<|im_end|>", 3}, {"<think>", 4},
    {"</think>", 4},      {"<tool_call>", 4},  {"</tool_call>", 4},
};
#define BUILTIN_N (256 + TERN_ARRAY_LEN(builtin_merges) + TERN_ARRAY_LEN(builtin_specials))

/* Token arrays padded up to n with "[PAD<id>]" tokens of type UNUSED (5), as llama.cpp's
 * converter pads a vocabulary to the embedding size. */
struct vocab_arrays {
    struct gguf_str *tokens;
    char *pad_text;
    int32_t *types;
    float *scores;
};

static void vocab_arrays_free(struct vocab_arrays *v) {
    free(v->tokens);
    free(v->pad_text);
    free(v->types);
    free(v->scores);
}

static enum tern_status pad_tokens(struct vocab_arrays *v, uint32_t n_have, uint32_t n, bool normal) {
    size_t text_bytes = (size_t)(n - n_have) * 20;
    v->pad_text = tern_malloc(text_bytes ? text_bytes : 1);
    if (!v->pad_text) return tern_errorf(TERN_ERR_NOMEM, "mkmodel: no memory to pad the vocabulary");
    for (uint32_t i = n_have; i < n; i++) {
        char *s = v->pad_text + (size_t)(i - n_have) * 20;
        int len = snprintf(s, 20, "[PAD%u]", i);
        v->tokens[i] = (struct gguf_str){s, (uint64_t)len};
        if (v->types) v->types[i] = normal ? 1 : 5;
        if (v->scores) v->scores[i] = 0.0f;
    }
    return TERN_OK;
}

static enum tern_status write_builtin_vocab(struct gguf_writer *w, uint32_t n_vocab, bool pad_normal) {
    char text[256][4];
    uint8_t order[256];
    byte_tokens(text, order);
    struct vocab_arrays v = {0};
    v.tokens = tern_calloc(n_vocab, sizeof *v.tokens);
    v.types = tern_calloc(n_vocab, sizeof *v.types);
    char merged[TERN_ARRAY_LEN(builtin_merges)][16];
    char merge_text[TERN_ARRAY_LEN(builtin_merges)][16];
    struct gguf_str merges[TERN_ARRAY_LEN(builtin_merges)];
    enum tern_status st = TERN_OK;
    if (!v.tokens || !v.types) st = tern_errorf(TERN_ERR_NOMEM, "mkmodel: no memory for the vocabulary");
    if (!st) {
        uint32_t id = 0;
        for (; id < 256; id++) {
            v.tokens[id] = (struct gguf_str){text[order[id]], strlen(text[order[id]])};
            v.types[id] = 1;
        }
        for (size_t i = 0; i < TERN_ARRAY_LEN(builtin_merges); i++, id++) {
            int n = snprintf(merged[i], sizeof merged[i], "%s%s", builtin_merges[i][0], builtin_merges[i][1]);
            v.tokens[id] = (struct gguf_str){merged[i], (uint64_t)n};
            v.types[id] = 1;
            n = snprintf(merge_text[i], sizeof merge_text[i], "%s %s", builtin_merges[i][0], builtin_merges[i][1]);
            merges[i] = (struct gguf_str){merge_text[i], (uint64_t)n};
        }
        for (size_t i = 0; i < TERN_ARRAY_LEN(builtin_specials); i++, id++) {
            v.tokens[id] = (struct gguf_str){builtin_specials[i].text, strlen(builtin_specials[i].text)};
            v.types[id] = builtin_specials[i].type;
        }
        st = pad_tokens(&v, id, n_vocab, pad_normal);
    }
    const uint32_t endoftext = 256 + TERN_ARRAY_LEN(builtin_merges), im_end = endoftext + 2;
    if (!st) st = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (!st) st = gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
    if (!st) st = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", v.tokens, n_vocab);
    if (!st) st = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.types, n_vocab);
    if (!st) st = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, TERN_ARRAY_LEN(builtin_merges));
    if (!st) st = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", im_end);
    if (!st) st = gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", endoftext);
    if (!st) st = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", endoftext);
    if (!st) st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    if (!st) st = gguf_writer_set_str(w, "tokenizer.chat_template", chat_template);
    vocab_arrays_free(&v);
    return st;
}

/* Copies every tokenizer.* key of vf; the per-token arrays are padded to n_vocab. */
static enum tern_status copy_vocab(struct gguf_writer *w, const struct gguf_file *vf, uint32_t n_have,
                                   uint32_t n_vocab, bool pad_normal) {
    for (uint64_t i = 0; i < gguf_n_kv(vf); i++) {
        const struct gguf_kv *kv = gguf_kv_at(vf, i);
        if (strncmp(kv->key.ptr, "tokenizer.", 10)) continue;
        bool per_token = kv->type == GGUF_TYPE_ARRAY && kv->v.arr.n == n_have &&
                         (!strcmp(kv->key.ptr, "tokenizer.ggml.tokens") ||
                          (!strcmp(kv->key.ptr, "tokenizer.ggml.token_type") && kv->v.arr.type == GGUF_TYPE_INT32) ||
                          (!strcmp(kv->key.ptr, "tokenizer.ggml.scores") && kv->v.arr.type == GGUF_TYPE_FLOAT32));
        enum tern_status st;
        if (n_vocab == n_have || !per_token) {
            st = gguf_writer_set_kv(w, kv);
        } else {
            struct vocab_arrays v = {0};
            st = TERN_OK;
            if (kv->v.arr.type == GGUF_TYPE_STRING) {
                v.tokens = tern_calloc(n_vocab, sizeof *v.tokens);
                if (!v.tokens) st = tern_errorf(TERN_ERR_NOMEM, "mkmodel: no memory to pad the vocabulary");
                if (!st) {
                    memcpy(v.tokens, kv->v.arr.strs, (size_t)n_have * sizeof *v.tokens);
                    st = pad_tokens(&v, n_have, n_vocab, pad_normal);
                }
                if (!st) st = gguf_writer_set_arr_str(w, kv->key.ptr, v.tokens, n_vocab);
            } else {
                size_t es = 4;
                void *a = tern_calloc(n_vocab, es);
                if (!a) st = tern_errorf(TERN_ERR_NOMEM, "mkmodel: no memory to pad the vocabulary");
                if (!st) {
                    memcpy(a, kv->v.arr.data, (size_t)n_have * es);
                    for (uint32_t j = n_have; j < n_vocab; j++) {
                        if (kv->v.arr.type == GGUF_TYPE_INT32) ((int32_t *)a)[j] = 5;
                        else ((float *)a)[j] = 0.0f;
                    }
                    st = gguf_writer_set_arr(w, kv->key.ptr, kv->v.arr.type, a, n_vocab);
                }
                free(a);
            }
            vocab_arrays_free(&v);
        }
        if (st) return st;
    }
    return TERN_OK;
}

/* ---- metadata and the file ------------------------------------------------------------ */

static enum tern_status set_arch_u32(struct gguf_writer *w, const char *arch, const char *key, uint32_t v) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return gguf_writer_set_u32(w, k, v);
}

static enum tern_status set_arch_f32(struct gguf_writer *w, const char *arch, const char *key, float v) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return gguf_writer_set_f32(w, k, v);
}

static enum tern_status write_metadata(struct gguf_writer *w, const struct tern_mkmodel_params *p,
                                       const struct gguf_file *vf, uint32_t n_have, uint32_t n_vocab) {
    const char *a = tern_mk_arch_name(p->arch);
    char name[128];
    if (p->name) snprintf(name, sizeof name, "%s", p->name);
    else snprintf(name, sizeof name, "%s-random", a);
    enum tern_status st = gguf_writer_set_str(w, "general.architecture", a);
    if (!st) st = gguf_writer_set_str(w, "general.name", name);
    if (!st) st = set_arch_u32(w, a, "block_count", p->n_layer + p->n_mtp);
    if (!st && p->n_mtp) st = set_arch_u32(w, a, "nextn_predict_layers", p->n_mtp);
    if (!st) st = set_arch_u32(w, a, "context_length", p->n_ctx);
    if (!st) st = set_arch_u32(w, a, "embedding_length", p->n_embd);
    /* qwen35moe files have no dense feed-forward key; qwen3moe ones carry it unused */
    if (!st && p->arch != TERN_MK_QWEN35MOE) st = set_arch_u32(w, a, "feed_forward_length", p->n_ff);
    if (!st && is_moe(p->arch)) {
        st = set_arch_u32(w, a, "expert_count", p->n_expert);
        if (!st) st = set_arch_u32(w, a, "expert_used_count", p->n_expert_used);
        if (!st) st = set_arch_u32(w, a, "expert_feed_forward_length", p->n_ff_exp);
        if (!st && p->n_ff_shexp) st = set_arch_u32(w, a, "expert_shared_feed_forward_length", p->n_ff_shexp);
    }
    if (!st) st = set_arch_u32(w, a, "attention.head_count", p->n_head);
    if (!st) st = set_arch_u32(w, a, "attention.head_count_kv", p->n_head_kv);
    if (!st) st = set_arch_f32(w, a, "rope.freq_base", p->rope_theta);
    if (!st) st = set_arch_f32(w, a, "attention.layer_norm_rms_epsilon", p->rms_eps);
    /* Qwen3 and Qwen3.5 converters always write the head size; llama and qwen2 ones
     * only where it differs from n_embd / n_head (the loader's default). */
    bool head_keys = p->arch == TERN_MK_QWEN3 || is_hybrid(p->arch) || p->arch == TERN_MK_QWEN3MOE ||
                     p->arch == TERN_MK_GPTOSS ||
                     (uint64_t)p->head_dim * p->n_head != p->n_embd;
    if (!st && head_keys) st = set_arch_u32(w, a, "attention.key_length", p->head_dim);
    if (!st && head_keys) st = set_arch_u32(w, a, "attention.value_length", p->head_dim);
    if (!st) st = gguf_writer_set_u32(w, "general.file_type", file_type(p->wtype, p->mix));
    if (!st && !is_float_type(p->wtype)) st = gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (!st && p->arch == TERN_MK_GPTOSS) {
        char k[128];
        st = set_arch_u32(w, a, "attention.sliding_window", p->sliding_window);
        snprintf(k, sizeof k, "%s.rope.scaling.type", a);
        if (!st) st = gguf_writer_set_str(w, k, "yarn");
        if (!st) st = set_arch_f32(w, a, "rope.scaling.factor", p->yarn_factor);
        if (!st) st = set_arch_u32(w, a, "rope.scaling.original_context_length", p->yarn_orig_ctx);
    }
    if (!st && p->arch == TERN_MK_LLAMA) st = set_arch_u32(w, a, "rope.dimension_count", p->rope_dim ? p->rope_dim : p->head_dim);
    if (!st && is_hybrid(p->arch)) {
        uint32_t rd = p->rope_dim ? p->rope_dim : p->head_dim / 4;
        int32_t sec[4];
        memcpy(sec, p->rope_sections, sizeof sec);
        if (!sec[0] && !sec[1] && !sec[2] && !sec[3]) {
            /* Qwen3.5 splits its rotary pairs [11, 11, 10] of 32 (time, height, width). */
            int32_t pairs = (int32_t)rd / 2;
            sec[0] = sec[1] = (int32_t)lround(pairs * 11.0 / 32.0);
            sec[2] = pairs - 2 * sec[0];
            sec[3] = 0;
            if (sec[2] < 0) {
                sec[0] = sec[1] = pairs / 2;
                sec[2] = pairs - 2 * sec[0];
            }
        }
        st = set_arch_u32(w, a, "ssm.conv_kernel", p->ssm_conv);
        if (!st) st = set_arch_u32(w, a, "ssm.state_size", p->ssm_state);
        if (!st) st = set_arch_u32(w, a, "ssm.group_count", p->ssm_k_heads);
        if (!st) st = set_arch_u32(w, a, "ssm.time_step_rank", p->ssm_v_heads);
        if (!st) st = set_arch_u32(w, a, "ssm.inner_size", p->ssm_v_heads * p->ssm_state);
        if (!st) st = set_arch_u32(w, a, "full_attention_interval", p->full_attn_interval);
        if (!st) st = set_arch_u32(w, a, "rope.dimension_count", rd);
        char k[128];
        snprintf(k, sizeof k, "%s.rope.dimension_sections", a);
        /* qwen3next: plain partial NeoX, no sections */
        if (!st && p->arch != TERN_MK_QWEN3NEXT) st = gguf_writer_set_arr(w, k, GGUF_TYPE_INT32, sec, 4);
    }
    if (!st) st = vf ? copy_vocab(w, vf, n_have, n_vocab, p->pad_normal) : write_builtin_vocab(w, n_vocab, p->pad_normal);
    if (!st) st = set_arch_u32(w, a, "vocab_size", n_vocab);
    return st;
}

/* Checks p, opens the vocabulary and lays out the tensors (with types and row sizes).
 * On error nothing is left open. */
static enum tern_status prepare(const struct tern_mkmodel_params *p, struct mk_ctx *c, struct gguf_file **vf_out,
                                uint32_t *n_have_out, struct tern_mkmodel_stats *s) {
    enum tern_status st = tern_mkmodel_check(p);
    if (st) return st;
    struct gguf_file *vf = NULL;
    uint32_t n_have = BUILTIN_N;
    if (p->vocab_path) {
        struct gguf_open_opts opts = {.no_data = true};
        if ((st = gguf_open(p->vocab_path, &opts, &vf))) return tern_error_prefix(st, "vocab");
        const struct gguf_kv *tok;
        st = gguf_get_arr(vf, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tok);
        if (!st && (tok->v.arr.n == 0 || tok->v.arr.n > LIMIT_VOCAB))
            st = tern_errorf(TERN_ERR_INVALID, "%s has %" PRIu64 " tokens (1..%u allowed)", p->vocab_path,
                             tok->v.arr.n, LIMIT_VOCAB);
        if (st) {
            gguf_close(vf);
            return tern_error_prefix(st, "vocab %s", p->vocab_path);
        }
        n_have = (uint32_t)tok->v.arr.n;
    }
    uint32_t n_vocab = p->n_vocab > n_have ? p->n_vocab : n_have;
    if (p->n_vocab && p->n_vocab < n_have) {
        if (!vf)
            return tern_errorf(TERN_ERR_INVALID, "n_vocab %u is smaller than the built-in vocabulary (%u tokens)",
                               p->n_vocab, n_have);
        TERN_LOG_INFO("mkmodel: the vocabulary has %u tokens; n_vocab %u is raised to it", n_have, p->n_vocab);
    }
    if (n_vocab > n_have) TERN_LOG_INFO("mkmodel: vocabulary padded from %u to %u tokens", n_have, n_vocab);

    *c = (struct mk_ctx){.p = p};
    st = build_tensors(c, n_vocab);
    if (!st && c->n_fallback)
        TERN_LOG_INFO("mkmodel: %u tensors stay F32 because their row length is not a multiple of the type's block "
                      "size, e.g. %s (TERN_LOG=debug lists them)", c->n_fallback, c->first_fallback);
    *s = (struct tern_mkmodel_stats){.n_vocab = n_vocab, .n_f32_fallback = c->n_fallback, .n_tensors = c->n};
    for (uint32_t i = 0; i < c->n && !st; i++) {
        struct mk_tensor *t = &c->t[i];
        if (!tern_dtype_row_size(t->type, t->ne[0], &t->row_bytes))
            st = tern_errorf(TERN_ERR_INTERNAL, "mkmodel: '%s' row size", t->name);
        s->n_params += t->ne[0] * t->ne[1] * t->ne[2];
        s->n_bytes += t->row_bytes * t->ne[1] * t->ne[2];
    }
    if (st) {
        free(c->t);
        c->t = NULL;
        gguf_close(vf);
        return st;
    }
    *vf_out = vf;
    *n_have_out = n_have;
    return TERN_OK;
}

enum tern_status tern_mkmodel_plan(const struct tern_mkmodel_params *p, struct tern_mkmodel_tensor **out,
                                   uint32_t *n_out, struct tern_mkmodel_stats *stats) {
    *out = NULL;
    *n_out = 0;
    struct mk_ctx c;
    struct gguf_file *vf;
    uint32_t n_have;
    struct tern_mkmodel_stats s;
    enum tern_status st = prepare(p, &c, &vf, &n_have, &s);
    if (st) return st;
    gguf_close(vf);
    struct tern_mkmodel_tensor *list = tern_calloc(c.n, sizeof *list);
    if (!list) {
        free(c.t);
        return tern_errorf(TERN_ERR_NOMEM, "mkmodel: no memory for the tensor list");
    }
    for (uint32_t i = 0; i < c.n; i++) {
        memcpy(list[i].name, c.t[i].name, sizeof list[i].name);
        list[i].type = c.t[i].type;
        list[i].n_dims = c.t[i].n_dims;
        memcpy(list[i].ne, c.t[i].ne, sizeof list[i].ne);
    }
    free(c.t);
    *out = list;
    *n_out = s.n_tensors;
    if (stats) *stats = s;
    return TERN_OK;
}

enum tern_status tern_mkmodel_write(const struct tern_mkmodel_params *p, const char *path,
                                    struct tern_mkmodel_stats *stats) {
    struct mk_ctx c;
    struct gguf_file *vf;
    uint32_t n_have;
    struct tern_mkmodel_stats s;
    enum tern_status st = prepare(p, &c, &vf, &n_have, &s);
    if (st) return st;
    struct gguf_writer *w = NULL;
    struct mk_rows rows = {0};
    /* A pool only pays for big models; a failure to start one just means one thread. */
    if (s.n_params > ((uint64_t)64 << 20) && tern_threadpool_new(0, &rows.pool)) rows.pool = NULL;
    if (!st) st = gguf_writer_new(&w);
    if (!st) st = write_metadata(w, p, vf, n_have, s.n_vocab);
    for (uint32_t i = 0; i < c.n && !st; i++) {
        struct mk_tensor *t = &c.t[i];
        t->rows = &rows;
        st = gguf_writer_add_tensor_cb(w, t->name, t->type, t->n_dims, t->ne, fill, t);
    }
    if (!st) st = gguf_writer_write(w, path);
    if (!st && stats) *stats = s;
    gguf_writer_free(w);
    free(rows.buf);
    tern_threadpool_free(rows.pool);
    free(c.t);
    gguf_close(vf);
    return st;
}
