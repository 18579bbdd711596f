/* tern mkmodel: write a deterministic random-weight model of a given architecture and
 * shape (src/model/mkmodel.h). */
#include "cli/cli.h"
#include "model/mkmodel.h"
#include "util/dtype.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void usage(FILE *out) {
    fprintf(out,
            "usage: tern mkmodel (--arch ARCH | --preset NAME) --out FILE [options]\n"
            "\n"
            "Writes a random-weight GGUF model with the metadata keys and tensor names and shapes\n"
            "that real models of the architecture carry. Same options and seed, same bytes.\n"
            "\n"
            "  --arch ARCH            llama, qwen2, qwen3, qwen35, qwen3moe, qwen35moe, qwen3next or gpt-oss\n"
            "  --preset NAME          %s\n"
            "                         (options given with a preset override it)\n"
            "  --out FILE, -o FILE    output path (written atomically)\n"
            "  --type TYPE            f32 (default), f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,\n"
            "                         q4_k, q5_k, q6_k, q4_k_m, iq4_xs, iq4_nl, q2_k, q3_k, iq2_xxs,\n"
            "                         iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m, mxfp4_moe (MoE: experts\n"
            "                         MXFP4, other matrices Q8_0, as gpt-oss files). Quantized types give\n"
            "                         output.weight Q6_K as llama-quantize does (--pure: no such\n"
            "                         exception; IQ4_XS and low-bit rows not a multiple of 256 take\n"
            "                         IQ4_NL);\n"
            "                         1-D tensors, norms and ssm_a/ssm_dt/ssm_conv1d stay F32\n"
            "  --pure                 every matrix in TYPE (no Q6_K output)\n"
            "  --pad-normal           padding tokens are normal tokens whose text is rendered (for\n"
            "                         benchmarks that count a random model's streamed tokens)\n"
            "  --seed N               random seed (default 1234)\n"
            "  --vocab FILE           copy the vocabulary and chat template (every tokenizer.* key)\n"
            "                         from a GGUF; default: a small built-in byte-level vocabulary\n"
            "  --name NAME            general.name\n"
            "  --dry-run              list the tensors (name, type, shape) and totals; write nothing\n"
            "\n"
            "shape:\n"
            "  --n-layer N  --n-embd N  --n-head N  --n-head-kv N  --head-dim N  --n-ff N\n"
            "  --n-ctx N                context_length written to the file\n"
            "  --n-vocab N              vocabulary size; the vocabulary is padded with [PAD<id>] tokens\n"
            "                           up to it (never cut)\n"
            "  --tied / --untied        tie the output projection to token_embd (no output.weight)\n"
            "  --rope-theta X  --rms-eps X  --rope-dim N\n"
            "qwen35 (Gated DeltaNet layers):\n"
            "  --ssm-heads-k N (group_count)  --ssm-heads-v N (time_step_rank)\n"
            "  --ssm-state N (head dim)  --ssm-conv N (kernel)  --full-attn-interval N\n"
            "  --rope-sections A,B,C,D  (default: the rope pairs split as Qwen3.5 does)\n"
            "  --mtp N                  N (0 or 1) multi-token-prediction blocks after the layers\n"
            "                           (blk.<n_layer>.nextn.*, as real Qwen3.5 files carry: --spec mtp)\n"
            "  --mtp-echo               tests: the MTP block passes the hidden state through (its\n"
            "                           guesses then often match a repeating random model)\n"
            "  --mtp-echo-attn          likewise, but its attention stays random (a perturbation\n"
            "                           that depends on its KV rows)\n"
            "qwen3moe / qwen35moe / gpt-oss (mixture of experts; gpt-oss: window 128 on even\n"
            "  layers, YaRN factor 32 over 4096, sinks and biases; tiny-gptoss: window 16):\n"
            "  --experts N  --experts-used N  --expert-ff N  --shared-expert-ff N (qwen35moe, qwen3next)\n"
            "  --sliding-window N (gpt-oss)\n"
            "  Large models are written tensor by tensor: memory stays small whatever the size\n"
            "  (qwen3-30b-a3b --type q4_k_m: about 17 GB of file, a few MB of RAM)\n"
            "\n"
            "  --help                 this text\n",
            tern_mkmodel_preset_names());
}

enum {
    OPT_ARCH = 256, OPT_PRESET, OPT_TYPE, OPT_PURE, OPT_PADNORMAL, OPT_SEED, OPT_VOCAB, OPT_NAME, OPT_DRY_RUN,
    OPT_N_LAYER, OPT_N_EMBD, OPT_N_HEAD, OPT_N_HEAD_KV, OPT_HEAD_DIM, OPT_N_FF, OPT_N_CTX, OPT_N_VOCAB,
    OPT_TIED, OPT_UNTIED, OPT_ROPE_THETA, OPT_RMS_EPS, OPT_ROPE_DIM,
    OPT_SSM_K, OPT_SSM_V, OPT_SSM_STATE, OPT_SSM_CONV, OPT_FULL_ATTN, OPT_ROPE_SECTIONS,
    OPT_EXPERTS, OPT_EXPERTS_USED, OPT_EXPERT_FF, OPT_SHEXP_FF, OPT_MTP, OPT_MTP_ECHO, OPT_MTP_ECHO_ATTN, OPT_WINDOW,
};

/* A shape option given on the command line; applied after the arch/preset defaults. */
struct override {
    int opt;
    const char *val;
};

static int apply(const struct override *o, struct tern_mkmodel_params *p) {
    long v = 0;
    double d = 0;
    uint32_t *field = NULL;
    long lo = 1, hi = 1L << 24;
    switch (o->opt) {
    case OPT_N_LAYER: field = &p->n_layer; hi = 1024; break;
    case OPT_N_EMBD: field = &p->n_embd; break;
    case OPT_N_HEAD: field = &p->n_head; hi = 4096; break;
    case OPT_N_HEAD_KV: field = &p->n_head_kv; hi = 4096; break;
    case OPT_HEAD_DIM: field = &p->head_dim; hi = 65536; break;
    case OPT_N_FF: field = &p->n_ff; break;
    case OPT_N_CTX: field = &p->n_ctx; hi = UINT32_MAX; break;
    case OPT_N_VOCAB: field = &p->n_vocab; break;
    case OPT_ROPE_DIM: field = &p->rope_dim; hi = 65536; break;
    case OPT_SSM_K: field = &p->ssm_k_heads; hi = 4096; break;
    case OPT_SSM_V: field = &p->ssm_v_heads; hi = 4096; break;
    case OPT_SSM_STATE: field = &p->ssm_state; hi = 65536; break;
    case OPT_SSM_CONV: field = &p->ssm_conv; hi = 64; break;
    case OPT_FULL_ATTN: field = &p->full_attn_interval; hi = 1024; break;
    case OPT_EXPERTS: field = &p->n_expert; hi = 1024; break;
    case OPT_EXPERTS_USED: field = &p->n_expert_used; hi = 64; break;
    case OPT_EXPERT_FF: field = &p->n_ff_exp; break;
    case OPT_SHEXP_FF: field = &p->n_ff_shexp; break;
    case OPT_WINDOW: field = &p->sliding_window; break;
    case OPT_MTP: field = &p->n_mtp; lo = 0; hi = 1; break;
    case OPT_TIED: p->tied = true; return 0;
    case OPT_MTP_ECHO: p->mtp_echo = 1; return 0;
    case OPT_MTP_ECHO_ATTN: p->mtp_echo = 2; return 0;
    case OPT_UNTIED: p->tied = false; return 0;
    case OPT_ROPE_THETA:
        if (!cli_parse_float(o->val, 1e-3, 1e12, &d))
            return cli_usage_error("mkmodel", "--rope-theta '%s' is not a number in [0.001, 1e12]", o->val);
        p->rope_theta = (float)d;
        return 0;
    case OPT_RMS_EPS:
        if (!cli_parse_float(o->val, 1e-12, 1, &d) || d <= 0)
            return cli_usage_error("mkmodel", "--rms-eps '%s' is not a number in (0, 1]", o->val);
        p->rms_eps = (float)d;
        return 0;
    case OPT_ROPE_SECTIONS: {
        long s[4];
        char extra;
        if (sscanf(o->val, "%ld,%ld,%ld,%ld%c", &s[0], &s[1], &s[2], &s[3], &extra) != 4)
            return cli_usage_error("mkmodel", "--rope-sections '%s' is not four comma-separated integers", o->val);
        for (int i = 0; i < 4; i++) {
            if (s[i] < 0 || s[i] > 65536)
                return cli_usage_error("mkmodel", "--rope-sections value %ld is outside 0..65536", s[i]);
            p->rope_sections[i] = (int32_t)s[i];
        }
        return 0;
    }
    default: return cli_usage_error("mkmodel", "internal: option %d", o->opt);
    }
    if (!cli_parse_int(o->val, lo, hi, &v))
        return cli_usage_error("mkmodel", "value '%s' is not an integer in %ld..%ld", o->val, lo, hi);
    *field = (uint32_t)v;
    return 0;
}

static int print_plan(const struct tern_mkmodel_params *p) {
    struct tern_mkmodel_tensor *t;
    uint32_t n;
    struct tern_mkmodel_stats s;
    if (tern_mkmodel_plan(p, &t, &n, &s)) return cli_fail("mkmodel", "%s", tern_last_error());
    for (uint32_t i = 0; i < n; i++) {
        char shape[64];
        if (t[i].n_dims == 1) snprintf(shape, sizeof shape, "[%" PRIu64 "]", t[i].ne[0]);
        else if (t[i].n_dims == 2) snprintf(shape, sizeof shape, "[%" PRIu64 ", %" PRIu64 "]", t[i].ne[0], t[i].ne[1]);
        else
            snprintf(shape, sizeof shape, "[%" PRIu64 ", %" PRIu64 ", %" PRIu64 "]", t[i].ne[0], t[i].ne[1],
                     t[i].ne[2]);
        printf("%-40s %-6s %s\n", t[i].name, tern_dtype_name(t[i].type), shape);
    }
    printf("%s: %u tensors, n_vocab %u, %" PRIu64 " parameters (%.2f M), %" PRIu64 " bytes (%.1f MB) of tensor data\n",
           tern_mk_arch_name(p->arch), n, s.n_vocab, s.n_params, (double)s.n_params / 1e6, s.n_bytes,
           (double)s.n_bytes / 1e6);
    free(t);
    return 0;
}

static int mkmodel_main(int argc, char **argv) {
    static const struct option opts[] = {
        {"arch", required_argument, NULL, OPT_ARCH},
        {"preset", required_argument, NULL, OPT_PRESET},
        {"out", required_argument, NULL, 'o'},
        {"type", required_argument, NULL, OPT_TYPE},
        {"pure", no_argument, NULL, OPT_PURE},
        {"pad-normal", no_argument, NULL, OPT_PADNORMAL},
        {"seed", required_argument, NULL, OPT_SEED},
        {"vocab", required_argument, NULL, OPT_VOCAB},
        {"name", required_argument, NULL, OPT_NAME},
        {"dry-run", no_argument, NULL, OPT_DRY_RUN},
        {"n-layer", required_argument, NULL, OPT_N_LAYER},
        {"n-embd", required_argument, NULL, OPT_N_EMBD},
        {"n-head", required_argument, NULL, OPT_N_HEAD},
        {"n-head-kv", required_argument, NULL, OPT_N_HEAD_KV},
        {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
        {"n-ff", required_argument, NULL, OPT_N_FF},
        {"n-ctx", required_argument, NULL, OPT_N_CTX},
        {"n-vocab", required_argument, NULL, OPT_N_VOCAB},
        {"tied", no_argument, NULL, OPT_TIED},
        {"untied", no_argument, NULL, OPT_UNTIED},
        {"rope-theta", required_argument, NULL, OPT_ROPE_THETA},
        {"rms-eps", required_argument, NULL, OPT_RMS_EPS},
        {"rope-dim", required_argument, NULL, OPT_ROPE_DIM},
        {"ssm-heads-k", required_argument, NULL, OPT_SSM_K},
        {"ssm-heads-v", required_argument, NULL, OPT_SSM_V},
        {"ssm-state", required_argument, NULL, OPT_SSM_STATE},
        {"ssm-conv", required_argument, NULL, OPT_SSM_CONV},
        {"experts", required_argument, NULL, OPT_EXPERTS},
        {"experts-used", required_argument, NULL, OPT_EXPERTS_USED},
        {"expert-ff", required_argument, NULL, OPT_EXPERT_FF},
        {"shared-expert-ff", required_argument, NULL, OPT_SHEXP_FF},
        {"sliding-window", required_argument, NULL, OPT_WINDOW},
        {"full-attn-interval", required_argument, NULL, OPT_FULL_ATTN},
        {"rope-sections", required_argument, NULL, OPT_ROPE_SECTIONS},
        {"mtp", required_argument, NULL, OPT_MTP},
        {"mtp-echo", no_argument, NULL, OPT_MTP_ECHO},
        {"mtp-echo-attn", no_argument, NULL, OPT_MTP_ECHO_ATTN},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *arch = NULL, *preset = NULL, *out = NULL, *type = NULL, *vocab = NULL, *name = NULL;
    const char *seed_s = NULL;
    bool pure = false, dry_run = false, pad_normal = false;
    struct override ov[64];
    int n_ov = 0, c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":ho:", opts, NULL)) != -1) {
        switch (c) {
        case 'h': usage(stdout); return 0;
        case 'o': out = optarg; break;
        case OPT_ARCH: arch = optarg; break;
        case OPT_PRESET: preset = optarg; break;
        case OPT_TYPE: type = optarg; break;
        case OPT_PURE: pure = true; break;
        case OPT_PADNORMAL: pad_normal = true; break;
        case OPT_SEED: seed_s = optarg; break;
        case OPT_VOCAB: vocab = optarg; break;
        case OPT_NAME: name = optarg; break;
        case OPT_DRY_RUN: dry_run = true; break;
        case ':': return cli_usage_error("mkmodel", "option '%s' needs a value", argv[optind - 1]);
        case '?': return cli_usage_error("mkmodel", "unknown option '%s'", argv[optind - 1]);
        default:
            if (n_ov == (int)(sizeof ov / sizeof ov[0])) return cli_usage_error("mkmodel", "too many options");
            ov[n_ov++] = (struct override){c, optarg};
            break;
        }
    }
    if (optind < argc) return cli_usage_error("mkmodel", "unexpected argument '%s'", argv[optind]);
    if (!out && !dry_run) return cli_usage_error("mkmodel", "missing --out FILE");
    if (!arch && !preset) return cli_usage_error("mkmodel", "missing --arch or --preset");

    struct tern_mkmodel_params p;
    if (preset) {
        if (tern_mkmodel_preset(preset, &p)) return cli_usage_error("mkmodel", "%s", tern_last_error());
        enum tern_mk_arch a;
        if (arch && (!tern_mk_arch_from_name(arch, &a) || a != p.arch))
            return cli_usage_error("mkmodel", "--arch %s contradicts preset %s (%s)", arch, preset,
                                   tern_mk_arch_name(p.arch));
    } else {
        enum tern_mk_arch a;
        if (!tern_mk_arch_from_name(arch, &a))
            return cli_usage_error("mkmodel", "unknown architecture '%s' (llama, qwen2, qwen3, qwen35, qwen3moe, qwen35moe, qwen3next, gpt-oss)", arch);
        tern_mkmodel_defaults(a, &p);
    }
    for (int i = 0; i < n_ov; i++) {
        int rc = apply(&ov[i], &p);
        if (rc) return rc;
    }
    if (type && !tern_mkmodel_parse_type(type, &p.wtype, &p.mix))
        return cli_usage_error("mkmodel", "unknown --type '%s'", type);
    p.pad_normal = pad_normal;
    if (pure && p.mix == TERN_MK_LIKE_QUANTIZE) p.mix = TERN_MK_UNIFORM;
    if (pure && p.mix == TERN_MK_Q4_K_M)
        return cli_usage_error("mkmodel", "--pure contradicts --type q4_k_m (a mix); use --type q4_k");
    if (seed_s) {
        char *end;
        unsigned long long s = strtoull(seed_s, &end, 10);
        if (!*seed_s || *end || seed_s[0] == '-')
            return cli_usage_error("mkmodel", "--seed '%s' is not a non-negative integer", seed_s);
        p.seed = s;
    }
    p.vocab_path = vocab;
    char default_name[96];
    if (!name && preset) {
        snprintf(default_name, sizeof default_name, "%s-random", preset);
        name = default_name;
    }
    p.name = name;
    if (tern_mkmodel_check(&p)) return cli_usage_error("mkmodel", "%s", tern_last_error());

    struct tern_mkmodel_stats s;
    if (dry_run) return print_plan(&p);
    enum tern_status st = tern_mkmodel_write(&p, out, &s);
    if (st) return cli_fail("mkmodel", "%s", tern_last_error());
    fprintf(stderr,
            "tern mkmodel: wrote %s: %s, %u layers, n_embd %u, n_vocab %u, %u tensors, %.2f M params, "
            "%.1f MB of tensor data%s\n",
            out, tern_mk_arch_name(p.arch), p.n_layer, p.n_embd, s.n_vocab, s.n_tensors, (double)s.n_params / 1e6,
            (double)s.n_bytes / 1e6, s.n_f32_fallback ? " (some tensors kept F32: rows not a block multiple)" : "");
    return 0;
}

TERN_COMMAND("mkmodel", "write a deterministic random-weight model of a given architecture and shape", mkmodel_main)
