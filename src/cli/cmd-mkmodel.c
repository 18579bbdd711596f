/* tern mkmodel: write a deterministic random-weight model of a given architecture and
 * shape (src/model/mkmodel.h). */
#include "cli/cli.h"
#include "cli/opts.h"
#include "model/mkmodel.h"
#include "util/dtype.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct cli_spec mkmodel_cli = {
    "mkmodel",
    "usage: tern mkmodel (--arch ARCH | --preset NAME) --out FILE [options]\n"
    "\n"
    "Writes a random-weight GGUF model with the metadata keys and tensor names and shapes\n"
    "that real models of the architecture carry. Same options and seed, same bytes.\n"
    "\n",
    "Large models are written tensor by tensor: memory stays small whatever the size\n"
    "(qwen3-30b-a3b --type q4_k_m: about 17 GB of file, a few MB of RAM).\n",
};

/* --rope-sections A,B,C,D */
static bool parse_sections(const char *v, void *dst) {
    int32_t *out = dst;
    long s[4];
    char extra;
    if (sscanf(v, "%ld,%ld,%ld,%ld%c", &s[0], &s[1], &s[2], &s[3], &extra) != 4) return false;
    for (int i = 0; i < 4; i++)
        if (s[i] < 0 || s[i] > 65536) return false;
    for (int i = 0; i < 4; i++) out[i] = (int32_t)s[i];
    return true;
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
    const char *arch = NULL, *preset = NULL, *out = NULL, *type = NULL, *vocab = NULL, *name = NULL;
    bool pure = false, dry_run = false, pad_normal = false;
    /* The shape options write straight into p: parsed once to learn the preset or arch,
     * then again over the defaults these give, so that what is given overrides them. */
    struct tern_mkmodel_params p;
    tern_mkmodel_defaults(TERN_MK_LLAMA, &p);
    char preset_help[512];
    snprintf(preset_help, sizeof preset_help, "%s (options given with a preset override it)",
             tern_mkmodel_preset_names());
    const struct cli_opt opts[] = {
        CLI_STR1("arch", &arch, "ARCH", "llama, qwen2, qwen3, qwen35, qwen3moe, qwen35moe, qwen3next or gpt-oss"),
        CLI_STR1("preset", &preset, "NAME", preset_help),
        CLI_STR1("o|out", &out, "FILE", "output path (written atomically)"),
        CLI_STR1("type", &type, "TYPE",
                 "f32 (default), f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m, iq4_xs, iq4_nl, "
                 "q2_k, q3_k, q3_k_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m, mxfp4_moe (MoE: experts "
                 "MXFP4, other matrices Q8_0, as gpt-oss files), ud_q2 (a low-bit MoE mix in the manner of unsloth's "
                 "UD-Q2_K_XL: routed experts IQ2_XXS/IQ2_S gate and up, IQ3_XXS/IQ3_S down; projections IQ3_S; "
                 "shared experts Q4_K). Quantized types give output.weight Q6_K as llama-quantize does (--pure: no "
                 "such exception; IQ4_XS and low-bit rows not a multiple of 256 take IQ4_NL); q2_k, q3_k_m and "
                 "q4_k_m are llama-quantize's mixes (more bits on attn_v, attn_output, ffn_down); 1-D tensors, "
                 "norms and ssm_a/ssm_dt/ssm_conv1d stay F32"),
        CLI_FLAG("pure", &pure, "every matrix in TYPE (no Q6_K output)"),
        CLI_FLAG("pad-normal", &pad_normal,
                 "padding tokens are normal tokens whose text is rendered (for benchmarks that count a random "
                 "model's streamed tokens)"),
        CLI_U64("seed", &p.seed, "N", "random seed (default 1234)"),
        CLI_STR1("vocab", &vocab, "FILE",
                 "copy the vocabulary and chat template (every tokenizer.* key) from a GGUF; default: a small "
                 "built-in byte-level vocabulary"),
        CLI_STR1("name", &name, "NAME", "general.name"),
        CLI_FLAG("dry-run", &dry_run, "list the tensors (name, type, shape) and totals; write nothing"),
        CLI_SECTION("shape"),
        CLI_INT("n-layer", &p.n_layer, 1, 1024, "N", "layers"),
        CLI_INT("n-embd", &p.n_embd, 1, 1 << 24, "N", "embedding width"),
        CLI_INT("n-head", &p.n_head, 1, 4096, "N", "attention heads"),
        CLI_INT("n-head-kv", &p.n_head_kv, 1, 4096, "N", "key/value heads"),
        CLI_INT("head-dim", &p.head_dim, 1, 65536, "N", "head width"),
        CLI_INT("n-ff", &p.n_ff, 1, 1 << 24, "N", "feed-forward width"),
        CLI_INT("n-ctx", &p.n_ctx, 1, UINT32_MAX, "N", "context_length written to the file"),
        CLI_INT("n-vocab", &p.n_vocab, 1, 1 << 24, "N",
                "vocabulary size; the vocabulary is padded with [PAD<id>] tokens up to it (never cut)"),
        CLI_SET("tied", &p.tied, 1, "tie the output projection to token_embd (no output.weight)"),
        CLI_SET("untied", &p.tied, 0, "a separate output.weight"),
        CLI_NUM("rope-theta", &p.rope_theta, 1e-3, 1e12, "X", "rope base frequency"),
        CLI_NUM("rms-eps", &p.rms_eps, 1e-12, 1, "X", "RMS norm epsilon"),
        CLI_INT("rope-dim", &p.rope_dim, 1, 65536, "N", "rotated dimensions per head"),
        CLI_SECTION("qwen35 (Gated DeltaNet layers)"),
        CLI_INT("ssm-heads-k", &p.ssm_k_heads, 1, 4096, "N", "key heads (group_count)"),
        CLI_INT("ssm-heads-v", &p.ssm_v_heads, 1, 4096, "N", "value heads (time_step_rank)"),
        CLI_INT("ssm-state", &p.ssm_state, 1, 65536, "N", "head dim"),
        CLI_INT("ssm-conv", &p.ssm_conv, 1, 64, "N", "convolution kernel"),
        CLI_INT("full-attn-interval", &p.full_attn_interval, 1, 1024, "N", "every N-th layer is attention"),
        CLI_FN("rope-sections", p.rope_sections, parse_sections, "four comma-separated integers in 0..65536",
               "A,B,C,D", "(default: the rope pairs split as Qwen3.5 does)"),
        CLI_INT("mtp", &p.n_mtp, 0, 1, "N",
                "N (0 or 1) multi-token-prediction blocks after the layers (blk.<n_layer>.nextn.*, as real Qwen3.5 "
                "files carry: --spec mtp)"),
        CLI_SET("mtp-echo", &p.mtp_echo, 1,
                "tests: the MTP block passes the hidden state through (its guesses then often match a repeating "
                "random model)"),
        CLI_SET("mtp-echo-attn", &p.mtp_echo, 2,
                "likewise, but its attention stays random (a perturbation that depends on its KV rows)"),
        CLI_SECTION("mixture of experts (qwen3moe, qwen35moe, qwen3next, gpt-oss)"),
        CLI_INT("experts", &p.n_expert, 1, 1024, "N", "experts per layer"),
        CLI_INT("experts-used", &p.n_expert_used, 1, 64, "N", "experts a token is routed to"),
        CLI_INT("expert-ff", &p.n_ff_exp, 1, 1 << 24, "N", "an expert's feed-forward width"),
        CLI_INT("shared-expert-ff", &p.n_ff_shexp, 1, 1 << 24, "N", "the shared expert's (qwen35moe, qwen3next)"),
        CLI_INT("sliding-window", &p.sliding_window, 1, 1 << 24, "N",
                "gpt-oss's window on even layers (default 128; tiny-gptoss 16; with YaRN factor 32 over 4096, "
                "sinks and biases)"),
        CLI_END,
    };
    int c = cli_parse(&mkmodel_cli, opts, argc, argv, NULL);
    if (c >= 0) return c;
    if (!out && !dry_run) return cli_usage_error("mkmodel", "missing --out FILE");
    if (!arch && !preset) return cli_usage_error("mkmodel", "missing --arch or --preset");

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
    if ((c = cli_parse(&mkmodel_cli, opts, argc, argv, NULL)) >= 0) return c; /* the options over the defaults */
    if (type && !tern_mkmodel_parse_type(type, &p.wtype, &p.mix))
        return cli_usage_error("mkmodel", "unknown --type '%s'", type);
    p.pad_normal = pad_normal;
    if (pure && (p.mix == TERN_MK_LIKE_QUANTIZE || p.mix == TERN_MK_Q2_K)) p.mix = TERN_MK_UNIFORM;
    if (pure && (p.mix == TERN_MK_Q4_K_M || p.mix == TERN_MK_Q3_K_M || p.mix == TERN_MK_UD_Q2))
        return cli_usage_error("mkmodel", "--pure contradicts --type %s (a mix)", type);
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
