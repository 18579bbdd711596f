/* tern bench grammar: per-token mask time of constrained decoding on a real vocabulary.
 *
 * For each grammar (the tool-call grammar of a request's tools, as tool_choice "required"
 * builds it, and json_object), a walk picks random allowed tokens and times every mask:
 * documents are generated one after another with the same matcher, as the server keeps a
 * matcher per grammar, so the first document shows the cold cost and the later ones the
 * warm one. A document longer than --doc-tokens is abandoned (the matcher is reset). */
#include "cli/cli.h"
#include "cli/opts.h"

#include "grammar/grammar.h"
#include "grammar/schema.h"
#include "server/constrain.h"
#include "tokenizer/tokenizer.h"
#include "util/mem.h"
#include "util/rng.h"
#include "util/timeutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, double *us, size_t n) {
    if (!n) {
        printf("  %-24s no masks\n", what);
        return;
    }
    qsort(us, n, sizeof *us, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += us[i];
    printf("  %-24s %6zu masks  median %8.1f us  p99 %9.1f us  max %9.1f us  mean %8.1f us\n", what, n, us[n / 2],
           us[(size_t)((double)(n - 1) * 0.99)], us[n - 1], sum / (double)n);
}

static int walk(const char *name, const char *gbnf, size_t len, const struct tern_gvocab *v, long n_masks,
                long doc_tokens, uint64_t seed) {
    struct tern_grammar *g = NULL;
    double t0 = tern_now_s();
    if (tern_grammar_compile(gbnf, len, NULL, &g)) return cli_fail("bench grammar", "%s: %s", name, tern_last_error());
    double t_compile = tern_now_s() - t0;
    struct tern_gmatch *m = NULL;
    if (tern_gmatch_new(g, v, &m)) {
        tern_grammar_free(g);
        return cli_fail("bench grammar", "%s", tern_last_error());
    }
    uint32_t nv = tern_gvocab_n_vocab(v);
    uint32_t *mask = tern_malloc(((size_t)nv + 31) / 32 * sizeof *mask);
    int32_t *allowed = tern_malloc((size_t)nv * sizeof *allowed);
    double *all = tern_malloc((size_t)n_masks * sizeof *all), *cold = tern_malloc((size_t)n_masks * sizeof *cold);
    double *warm = tern_malloc((size_t)n_masks * sizeof *warm), *cpu = tern_malloc((size_t)n_masks * sizeof *cpu);
    if (!mask || !allowed || !all || !cold || !warm || !cpu) {
        free(mask), free(allowed), free(all), free(cold), free(warm), free(cpu);
        tern_gmatch_free(m);
        tern_grammar_free(g);
        return cli_fail("bench grammar", "out of memory");
    }
    struct tern_rng rng;
    tern_rng_seed(&rng, seed);
    size_t n_all = 0, n_cold = 0, n_warm = 0, docs = 0, complete = 0, in_doc = 0;
    int rc = 0;
    while ((long)n_all < n_masks) {
        enum tern_status st;
        double ca = cpu_now(), a = tern_now_s();
        size_t cnt = tern_gmatch_mask(m, mask, &st);
        double us = (tern_now_s() - a) * 1e6;
        cpu[n_all] = (cpu_now() - ca) * 1e6;
        if (st || cnt == 0) {
            rc = cli_fail("bench grammar", "%s: the grammar is stuck: %s", name, st ? tern_last_error() : "no token");
            break;
        }
        all[n_all++] = us;
        if (docs == 0) cold[n_cold++] = us;
        else warm[n_warm++] = us;
        size_t k = 0;
        for (uint32_t w = 0; w < (nv + 31) / 32; w++)
            for (uint32_t b = mask[w]; b; b &= b - 1) allowed[k++] = (int32_t)(w * 32 + (uint32_t)__builtin_ctz(b));
        int32_t t = allowed[tern_rng_next(&rng) % k];
        /* end the document when it can end (half the time) or is too long */
        bool can_end = tern_gmatch_can_end(m);
        if (can_end && (tern_gmatch_done(m) || tern_rng_next(&rng) % 2)) {
            complete++;
            docs++;
            in_doc = 0;
            tern_gmatch_reset(m);
            continue;
        }
        if (!tern_gmatch_accept_token(m, t)) {
            /* an end-of-generation token when the document could end */
            complete += can_end;
            docs++;
            in_doc = 0;
            tern_gmatch_reset(m);
            continue;
        }
        if ((long)++in_doc >= doc_tokens) {
            docs++;
            in_doc = 0;
            tern_gmatch_reset(m);
        }
    }
    if (!rc) {
        struct tern_gmatch_stats s;
        tern_gmatch_get_stats(m, &s);
        printf("%s: %zu rules, %zu elements, compiled in %.1f ms; %zu documents (%zu complete)\n", name,
               tern_grammar_n_rules(g), tern_grammar_n_elements(g), t_compile * 1e3, docs, complete);
        printf("  cache: %llu of %llu masks from the cache; %llu trie nodes walked; %zu stack nodes; %zu states cached\n",
               (unsigned long long)s.cache_hits, (unsigned long long)s.masks, (unsigned long long)s.nodes_visited,
               s.n_stack_nodes, s.n_cached);
        report("all", all, n_all);
        report("all, thread CPU time", cpu, n_all);
        report("first document (cold)", cold, n_cold);
        report("later documents", warm, n_warm);
    }
    free(mask), free(allowed), free(all), free(cold), free(warm), free(cpu);
    tern_gmatch_free(m);
    tern_grammar_free(g);
    return rc;
}

static const struct cli_spec grammar_cli = {
    "bench grammar",
    "usage: tern bench grammar --vocab FILE.gguf [--tools REQUEST.json] [--masks N] [--doc-tokens N]\n"
    "                          [--seed S]\n"
    "\n"
    "Per-token mask time of constrained decoding on the vocabulary of FILE (e.g. the\n"
    "shared kit's conformance/tokenizer/ggml-vocab-qwen2-from-qwen3tok.gguf, 151,936\n"
    "tokens). Grammars: json_object, and with --tools the tool-call grammar of the\n"
    "request's tools as tool_choice \"required\" builds it (a JSON body with \"tools\",\n"
    "or a line of a bench transcript with request.tools). A random walk over allowed\n"
    "tokens times --masks masks per grammar; documents end where they may (half the\n"
    "time) or after --doc-tokens tokens. Reports the median, p99 and max for all masks\n"
    "(wall time, and the thread's CPU time, which a busy machine does not inflate), the\n"
    "first document (cold) and the later ones (the server keeps a matcher per grammar,\n"
    "so a grammar used again starts warm).\n"
    "\n",
    NULL,
};

static int bench_grammar_main(int argc, char **argv) {
    const char *vocab = NULL, *tools_path = NULL;
    long n_masks = 2000, doc_tokens = 300, seed = 1;
    const struct cli_opt opts[] = {
        CLI_STR1("vocab", &vocab, "FILE.gguf", "the vocabulary (a GGUF file; a vocab-only one works)"),
        CLI_STR1("tools", &tools_path, "REQUEST.json", "a request body (or transcript line) with tools"),
        CLI_INT("masks", &n_masks, 1, 10000000, "N", "masks per grammar (default 2000)"),
        CLI_INT("doc-tokens", &doc_tokens, 1, 1000000, "N", "the longest document (default 300)"),
        CLI_INT("seed", &seed, 0, INT32_MAX, "S", "the random walk's seed (default 1)"),
        CLI_END,
    };
    int o = cli_parse(&grammar_cli, opts, argc, argv, NULL);
    if (o >= 0) return o;
    if (!vocab) return cli_usage_error("bench grammar", "missing --vocab FILE");
    struct tern_tokenizer *t;
    if (tern_tokenizer_load_file(vocab, &t)) return cli_fail("bench grammar", "%s", tern_last_error());
    double t0 = tern_now_s();
    struct tern_gvocab *v;
    if (tern_gvocab_from_tokenizer(t, &v)) {
        tern_tokenizer_free(t);
        return cli_fail("bench grammar", "%s", tern_last_error());
    }
    printf("vocabulary: %s, %u tokens; trie of %zu nodes built in %.1f ms\n", vocab, tern_gvocab_n_vocab(v),
           tern_gvocab_n_nodes(v), (tern_now_s() - t0) * 1e3);
    int rc = 0;
    if (tools_path) {
        json_error_t je;
        json_t *d = json_load_file(tools_path, JSON_DISABLE_EOF_CHECK, &je);
        const json_t *tools = d ? json_object_get(d, "tools") : NULL;
        if (!tools && d) tools = json_object_get(json_object_get(d, "request"), "tools");
        if (!json_is_array(tools)) {
            rc = cli_fail("bench grammar", "%s: no \"tools\" array (%s)", tools_path, d ? "not found" : je.text);
        } else {
            struct srv_request req;
            memset(&req, 0, sizeof req);
            req.tools = (json_t *)tools;
            req.tool_choice = SRV_TOOLS_REQUIRED;
            req.parallel_tool_calls = true;
            struct tern_buf b = TERN_BUF_INIT;
            struct srv_error err;
            if (!srv_tool_gbnf(&req, SRV_TOOL_SYNTAX_JSON, false, &b, &err)) {
                rc = cli_fail("bench grammar", "tool grammar: %s", err.message);
            } else {
                char name[64];
                snprintf(name, sizeof name, "tool calls (%zu tools)", json_array_size(tools));
                rc = walk(name, b.data, b.len, v, n_masks, doc_tokens, (uint64_t)seed);
            }
            tern_buf_free(&b);
        }
        json_decref(d);
    }
    if (!rc) {
        const char *jo = tern_json_object_gbnf();
        rc = walk("json_object", jo, strlen(jo), v, n_masks, doc_tokens, (uint64_t)seed);
    }
    tern_gvocab_free(v);
    tern_tokenizer_free(t);
    return rc;
}

TERN_BENCH("grammar", "per-token mask time of constrained decoding (tool calls, json_object) on a vocabulary",
           bench_grammar_main)
