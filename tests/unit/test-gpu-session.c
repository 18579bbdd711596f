/* Sessions on the Vulkan backend (tern_model_use_device, session.c over backend/vulkan/gpu.h), on the
 * kit's tiny-qwen3 (attention only) and tiny-qwen35 (hybrid), each in F32 and Q8_0, and
 * tiny-gptoss (window and sink attention, its MoE; MXFP4 here, F32 for the pages):
 * resumed equals cold, bit for bit, within the device (DESIGN.md §5, §7):
 * - chunks of 1, 7, 64 and 512 (and, on F32, token by token in separate calls): every
 *   position's logits and the state hash identical;
 * - a checkpoint taken during priming, then other tokens, then restore and the rest again:
 *   the logits and the state hash of the cold run;
 * - fork at p (the live end, and an earlier p: attention-only without a checkpoint, the
 *   hybrid with the one taken at p) then the rest: the cold run's;
 * - kv_export + the recurrent bytes -> tern_session_import + kv_import: the cold hash, and
 *   the next token's logits;
 * - a cancelled eval stops at a chunk boundary and the rest then gives the cold run's;
 * - tern_eval_batch of two device sessions gives each its own eval's bits;
 * - tern_eval_batch as one device step over several sessions' rows (a fresh prompt, a
 *   decoded token, a logits_all chunk, at different positions; and a batch of more rows
 *   than the device's chunk, split into steps with sessions cut across them): every
 *   item's logits and state hash equal its session's evaluated alone; the device's entry
 *   (tern_gpu_eval_batch) refuses one state twice in a step;
 * - rewinding an attention-only session then re-reading equals cold; the hybrid refuses;
 * - the checkpoint's and KV export's bytes are laid out as the CPU's (F32: the same values
 *   within the backends' tolerance), so the disk tier reads the same on both;
 * - checkpoints kept in device memory (tern_model_set_ckpt_vram): within the budget they
 *   stay on the device (counted), the oldest spill to host memory; restoring or forking
 *   from one on the device, spilled, or made in host memory gives the cold run's logits
 *   and hash, and their bytes are the host checkpoints' (fork and restore copy on the
 *   device: every case above runs through those copies too);
 * - a device without room for a checkpoint ($TERN_TEST_VK_DEVICE_BYTES): the oldest on the
 *   device makes way, else the checkpoint is made in host memory; both restore to cold;
 * - a recurrent state trail (tern_eval_opts.rec_trail, in a batch item too; a hybrid's
 *   kept on the device): the eval's bits unchanged, rewinding inside it gives the cold
 *   state, the rest then the cold logits; before it or once dropped a hybrid refuses,
 *   and dropping it gives its device memory back;
 * - KV pages on the device: a session takes them as it grows (560 positions: three pages,
 *   in pieces that cross them) and equals one that held its whole context from the start:
 *   every logit, the hash, KV export across pages, an import into the middle of a page
 *   (the page's other rows stay), a fork, a rewind across a page; its device bytes are
 *   its pages'; restored or rewound far back it gives the pages beyond back (a page of
 *   room kept), and growing again gives the same bits; on a device with room for one
 *   context, a session without room for its pages is refused with the sizes and keeps
 *   its state, and through the cache the parked session is evicted for the leased one's
 *   pages (cache_reserve);
 * - partial offload (tern_model_set_cpu_moe) on the three MoE models: every layer's, two
 *   layers' and auto's routed experts on the CPU (auto on a device capped to leave two
 *   there): fewer device bytes, token by token = chunks, auto = asking for its layers,
 *   the full device's likeliest tokens and logits but for routing near-ties, and the
 *   device batches above with two layers offloaded;
 * - what a device session cannot do is refused with a message: a device chosen after a
 *   session exists (TERN_ERR_STATE), the pages of a context larger than the device's
 *   memory (TERN_ERR_NOMEM with the sizes; the session goes on).
 * Skips (77) without a Vulkan device or the kit, unless TERN_REQUIRE_VULKAN=1 /
 * TERN_REQUIRE_SHARED=1 make that a failure. Short prompts: lavapipe is slow.
 *
 * `lite` (test-gpu-session-lite, the twin run under ASan+UBSan): the same assertions on the
 * hybrid tiny-qwen35 and tiny-qwen35moe only (the code paths of the attention-only models
 * are a subset of the hybrid's); the full test runs the rest in the normal build. */
#include "harness.h"
#include "exact.h"

#include "backend/vulkan/vulkan.h"
#include "cache/cache.h"
#include "backend/vulkan/gpu.h"
#include "model/model.h" /* the device context: its byte counts, for a device made to be full */
#define GPU_OF(m) ((struct tern_gpu *)(m)->backend_ctx)
#include "tern.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_TOK 72u /* the prompt: chunks of 64 split it, 512 does not */
#define P_CUT 40u /* the checkpoint / fork / rewind position */

static int dev = -1;
static uint32_t load_cpu_moe; /* load()'s partial offload (tern_model_set_cpu_moe) */
static uint32_t load_gpu_layers = TERN_GPU_LAYERS_ALL; /* and tern_model_set_gpu_layers */
static bool lite;              /* the sanitizer build's twin (above) */

static int setup(void **state) {
    (void)state;
    dev = th_vulkan_device();
    return 0;
}

static struct tern_model *load(const char *rel, bool gpu) {
    th_require_shared(rel);
    struct tern_model_params mp;
    tern_model_params_default(&mp);
    mp.path = th_shared_path(rel);
    mp.n_threads = 2;
    struct tern_model *m = NULL;
    if (tern_model_load(&mp, &m)) fail_msg("%s: %s", rel, tern_last_error());
    tern_model_set_cpu_moe(m, load_cpu_moe, 1u << 20);
    tern_model_set_gpu_layers(m, load_gpu_layers, 1u << 20);
    if (gpu && th_use_vulkan(m, dev, 64)) fail_msg("%s on vulkan:%d: %s", rel, dev, tern_last_error());
    return m;
}

static struct tern_session *new_session(struct tern_model *m, enum tern_kv_type kv) {
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = 256;
    sp.kv_type = kv;
    struct tern_session *s = NULL;
    if (tern_session_new(m, &sp, &s)) fail_msg("session: %s", tern_last_error());
    return s;
}

/* A session that has read toks[0..n) in chunks of chunk (0: token by token); every
 * position's logits into l when set. */
static struct tern_session *primed(struct tern_model *m, const int32_t *toks, size_t n, uint32_t chunk, float *l) {
    const size_t nv = tern_model_info(m)->n_vocab;
    struct tern_session *s = new_session(m, TERN_KV_F16);
    if (chunk == 0) {
        for (size_t i = 0; i < n; i++) {
            struct tern_eval_opts o = {.n_chunk = 1, .logits_all = l ? l + i * nv : NULL};
            assert_int_equal(tern_session_eval(s, toks + i, 1, &o), TERN_OK);
        }
    } else {
        struct tern_eval_opts o = {.n_chunk = chunk, .logits_all = l};
        assert_int_equal(tern_session_eval(s, toks, n, &o), TERN_OK);
    }
    assert_int_equal(tern_session_n_past(s), n);
    return s;
}

static void keep_ckpt(void *user, struct tern_checkpoint *c) {
    struct tern_checkpoint **slot = user;
    tern_checkpoint_free(*slot);
    *slot = c;
}

static int stop_after_first(void *user, size_t done, size_t total) {
    (void)total;
    *(size_t *)user = done;
    return 1;
}

/* The logits after the last token equal row `row` of the cold run's. */
static void assert_last_logits(const struct tern_session *s, const float *cold, size_t row, size_t nv) {
    const float *l = tern_session_logits(s);
    assert_non_null(l);
    assert_memory_equal(l, cold + row * nv, nv * sizeof(float));
}

/* quantized: the separate token-by-token calls are left out (chunks of 1 remain): lavapipe
 * is slow, and the weights' type changes only the matmul's loads */
static void check_model(const char *rel, bool quantized) {
    struct tern_model *m = load(rel, true);
    const struct tern_model_info *info = tern_model_info(m);
    const size_t nv = info->n_vocab;
    const bool hybrid = info->hybrid;
    assert_non_null(strstr(tern_model_device(m), "vulkan:"));
    int32_t *toks = tx_prompt(N_TOK + 1), other[24];
    for (size_t i = 0; i <= N_TOK; i++) toks[i] %= (int32_t)nv;
    for (size_t i = 0; i < 24; i++) other[i] = (int32_t)((toks[i] * 7 + 11) % (int32_t)nv);
    const size_t lbytes = N_TOK * nv * sizeof(float);
    float *cold = malloc(lbytes), *l = malloc(lbytes);

    /* chunking: 512 (one chunk) is the cold reference */
    struct tern_session *ref = primed(m, toks, N_TOK, 512, cold);
    const uint64_t h = tern_session_hash(ref);
    static const uint32_t chunks[] = {0, 1, 7, 64};
    for (size_t i = quantized ? 1 : 0; i < sizeof chunks / sizeof *chunks; i++) {
        memset(l, 0, lbytes);
        struct tern_session *s = primed(m, toks, N_TOK, chunks[i], l);
        assert_memory_equal(l, cold, lbytes);
        assert_true(tern_session_hash(s) == h);
        tern_session_free(s);
    }
    printf("%-28s chunks 1/7/64/512%s: logits and state hash %016llx identical\n", rel,
           quantized ? "" : " and token by token", (unsigned long long)h);

    /* a checkpoint taken during priming; other tokens; restore; the rest again */
    struct tern_checkpoint *ck = NULL;
    {
        struct tern_session *s = new_session(m, TERN_KV_F16);
        const uint32_t pos[] = {P_CUT};
        struct tern_eval_opts o = {.n_chunk = 64, .ckpt_pos = pos, .n_ckpt = 1, .on_ckpt = keep_ckpt, .ckpt_user = &ck};
        assert_int_equal(tern_session_eval(s, toks, N_TOK, &o), TERN_OK);
        assert_non_null(ck);
        assert_int_equal(tern_checkpoint_pos(ck), P_CUT);
        assert_true(tern_session_hash(s) == h); /* taking it changed nothing */
        assert_int_equal(tern_session_restore(s, ck), TERN_OK);
        assert_int_equal(tern_session_eval(s, other, 24, NULL), TERN_OK); /* a diverging history */
        assert_true(tern_session_hash(s) != h);
        assert_int_equal(tern_session_restore(s, ck), TERN_OK); /* its tokens before P_CUT still match */
        assert_int_equal(tern_session_n_past(s), P_CUT);
        tern_session_free(s);
        /* the same in a session whose tokens before P_CUT match */
        s = primed(m, toks, P_CUT, 7, NULL);
        assert_int_equal(tern_session_eval(s, other, 24, NULL), TERN_OK);
        if (hybrid) assert_int_equal(tern_session_rewind(s, P_CUT), TERN_ERR_STATE);
        assert_int_equal(tern_session_restore(s, ck), TERN_OK);
        assert_int_equal(tern_session_n_past(s), P_CUT);
        struct tern_eval_opts o2 = {.n_chunk = 5, .logits_all = l};
        assert_int_equal(tern_session_eval(s, toks + P_CUT, N_TOK - P_CUT, &o2), TERN_OK);
        assert_memory_equal(l, cold + P_CUT * nv, (N_TOK - P_CUT) * nv * sizeof(float));
        assert_true(tern_session_hash(s) == h);
        /* checkpoint_update retakes it at the end; restoring it changes nothing */
        struct tern_checkpoint *c2 = NULL;
        assert_int_equal(tern_session_checkpoint(s, &c2), TERN_OK);
        assert_int_equal(tern_session_checkpoint_update(s, c2), TERN_OK);
        assert_int_equal(tern_checkpoint_pos(c2), N_TOK);
        assert_int_equal(tern_session_restore(s, c2), TERN_OK);
        assert_true(tern_session_hash(s) == h);
        tern_checkpoint_free(c2);
        tern_session_free(s);
    }

    /* fork: at the live end (no checkpoint) and at P_CUT */
    {
        struct tern_session *f = NULL;
        assert_int_equal(tern_session_fork(ref, N_TOK, NULL, &f), TERN_OK);
        assert_true(tern_session_hash(f) == h);
        assert_last_logits(f, cold, N_TOK - 1, nv);
        tern_session_free(f);
        if (hybrid) assert_int_equal(tern_session_fork(ref, P_CUT, NULL, &f), TERN_ERR_STATE);
        assert_int_equal(tern_session_fork(ref, P_CUT, hybrid ? ck : NULL, &f), TERN_OK);
        assert_int_equal(tern_session_n_past(f), P_CUT);
        struct tern_eval_opts o = {.n_chunk = 64, .logits_all = l};
        assert_int_equal(tern_session_eval(f, toks + P_CUT, N_TOK - P_CUT, &o), TERN_OK);
        assert_memory_equal(l, cold + P_CUT * nv, (N_TOK - P_CUT) * nv * sizeof(float));
        assert_true(tern_session_hash(f) == h);
        tern_session_free(f);
    }

    /* rewind: attention-only models read the rest again */
    if (!hybrid) {
        struct tern_session *s = primed(m, toks, N_TOK, 64, NULL);
        assert_int_equal(tern_session_rewind(s, P_CUT), TERN_OK);
        assert_int_equal(tern_session_eval(s, toks + P_CUT, N_TOK - P_CUT, NULL), TERN_OK);
        assert_true(tern_session_hash(s) == h);
        assert_last_logits(s, cold, N_TOK - 1, nv);
        tern_session_free(s);
    }

    /* the disk tier's path: export, import, the same state and the same next token */
    {
        const size_t rb = tern_state_kv_row_bytes(m, TERN_KV_F16);
        uint8_t *kv = malloc(N_TOK * rb), *kv2 = malloc(N_TOK * rb);
        assert_int_equal(tern_session_kv_export(ref, 0, N_TOK, kv), TERN_OK);
        const void *rec = tern_session_rec_data(ref);
        assert_true(hybrid ? rec != NULL : rec == NULL);
        struct tern_session_params sp;
        tern_session_params_default(&sp);
        sp.n_ctx = 256;
        struct tern_session *s = NULL;
        assert_int_equal(tern_session_import(m, &sp, toks, N_TOK, rec, &s), TERN_OK);
        /* in two pieces, as the disk tier's blocks */
        assert_int_equal(tern_session_kv_import(s, 0, P_CUT, kv, N_TOK), TERN_OK);
        assert_int_equal(tern_session_kv_export(ref, P_CUT, N_TOK, kv2), TERN_OK);
        assert_int_equal(tern_session_kv_import(s, P_CUT, N_TOK, kv2, N_TOK - P_CUT), TERN_OK);
        assert_true(tern_session_hash(s) == h);
        assert_null(tern_session_logits(s));
        if (hybrid) {
            struct tern_checkpoint *ci = NULL;
            assert_int_equal(tern_checkpoint_import(s, P_CUT, tern_checkpoint_data(ck), info->recurrent_bytes, &ci),
                             TERN_OK);
            assert_memory_equal(tern_checkpoint_data(ci), tern_checkpoint_data(ck), info->recurrent_bytes);
            tern_checkpoint_free(ci);
        }
        float *a = malloc(nv * sizeof(float));
        struct tern_session *r2 = NULL;
        assert_int_equal(tern_session_fork(ref, N_TOK, NULL, &r2), TERN_OK);
        assert_int_equal(tern_session_eval(r2, toks + N_TOK, 1, NULL), TERN_OK);
        memcpy(a, tern_session_logits(r2), nv * sizeof(float));
        assert_int_equal(tern_session_eval(s, toks + N_TOK, 1, NULL), TERN_OK);
        assert_memory_equal(tern_session_logits(s), a, nv * sizeof(float));
        assert_true(tern_session_hash(s) == tern_session_hash(r2));
        free(a);
        free(kv);
        free(kv2);
        tern_session_free(r2);
        tern_session_free(s);
    }

    /* cancellation at a chunk boundary, then the rest */
    {
        struct tern_session *s = new_session(m, TERN_KV_F16);
        size_t done = 0;
        struct tern_eval_opts o = {.n_chunk = 16, .progress = stop_after_first, .user = &done};
        assert_int_equal(tern_session_eval(s, toks, N_TOK, &o), TERN_ERR_CANCELLED);
        assert_int_equal(done, 16);
        assert_int_equal(tern_session_n_past(s), 16);
        assert_int_equal(tern_session_eval(s, toks + 16, N_TOK - 16, NULL), TERN_OK);
        assert_true(tern_session_hash(s) == h);
        assert_last_logits(s, cold, N_TOK - 1, nv);
        tern_session_free(s);
    }

    /* a batch of two device sessions: each gets its own eval's bits */
    {
        struct tern_session *a = primed(m, toks, P_CUT, 64, NULL), *b = new_session(m, TERN_KV_F16);
        float *la = malloc((N_TOK - P_CUT) * nv * sizeof(float));
        const struct tern_batch_item items[] = {
            {.s = a, .toks = toks + P_CUT, .n = N_TOK - P_CUT, .logits_all = la},
            {.s = b, .toks = toks, .n = N_TOK, .logits = true},
        };
        assert_int_equal(tern_eval_batch(items, 2), TERN_OK);
        assert_memory_equal(la, cold + P_CUT * nv, (N_TOK - P_CUT) * nv * sizeof(float));
        assert_true(tern_session_hash(a) == h && tern_session_hash(b) == h);
        assert_last_logits(b, cold, N_TOK - 1, nv);
        free(la);
        tern_session_free(a);
        tern_session_free(b);
    }

    /* the state trail (speculative verification; a hybrid's kept in device memory): the
     * eval's bits do not change, rewinding to a position it reached gives the cold state
     * there and the rest then the cold logits; before it, or once dropped, a hybrid
     * refuses. Also through a batch item. (An attention-only model keeps no trail: its
     * rewinds are tested above.) */
    if (hybrid) {
        enum { K = 9 };
        void *trail = malloc(K * (info->recurrent_bytes + 1));
        float *lt = malloc(K * nv * sizeof(float));
        for (int batched = 0; batched < 2; batched++) {
            struct tern_session *s = primed(m, toks, N_TOK - K, 64, NULL);
            if (batched) {
                const struct tern_batch_item it = {.s = s, .toks = toks + N_TOK - K, .n = K, .logits_all = lt,
                                                   .rec_trail = trail};
                assert_int_equal(tern_eval_batch(&it, 1), TERN_OK);
            } else {
                struct tern_eval_opts o = {.rec_trail = trail, .logits_all = lt, .n_chunk = 4};
                assert_int_equal(tern_session_eval(s, toks + N_TOK - K, K, &o), TERN_OK);
            }
            assert_memory_equal(lt, cold + (N_TOK - K) * nv, K * nv * sizeof(float));
            assert_true(tern_session_hash(s) == h);
            assert_int_equal(tern_session_rewind(s, N_TOK - K), TERN_ERR_STATE);
            uint32_t p = N_TOK - 1;
            for (; p > N_TOK - K; p -= 3) {
                assert_int_equal(tern_session_rewind(s, p), TERN_OK);
                struct tern_session *c = primed(m, toks, p, 64, NULL);
                assert_true(tern_session_hash(s) == tern_session_hash(c));
                tern_session_free(c);
            }
            p += 3;
            assert_int_equal(tern_session_eval(s, toks + p, N_TOK - p, NULL), TERN_OK);
            assert_last_logits(s, cold, N_TOK - 1, nv);
            assert_true(tern_session_hash(s) == h);
            /* the next eval forgets the trail; so does dropping it */
            assert_int_equal(tern_session_rewind(s, N_TOK - 1), TERN_ERR_STATE);
            tern_session_free(s);
        }
        struct tern_session *s = primed(m, toks, 4, 64, NULL);
        const size_t b0 = tern_session_bytes(s);
        struct tern_eval_opts o = {.rec_trail = trail};
        assert_int_equal(tern_session_eval(s, toks + 4, 3, &o), TERN_OK);
        /* the trail's 3 slots are device memory of the session's, given back when dropped */
        assert_true(tern_session_bytes(s) >= b0 + 3 * info->recurrent_bytes);
        tern_session_drop_trail(s);
        assert_true(tern_session_bytes(s) == b0);
        assert_int_equal(tern_session_rewind(s, 6), TERN_ERR_STATE);
        tern_session_free(s);
        free(lt);
        free(trail);
    }

    /* refusals */
    {
        struct tern_session *s = new_session(m, TERN_KV_F16);
        assert_int_equal(th_use_vulkan(m, dev, 64), TERN_ERR_STATE);
        tern_session_free(s);
        struct tern_session_params sp;
        tern_session_params_default(&sp);
        sp.n_ctx = 1u << 24;
        sp.kv_type = TERN_KV_F32;
        /* its pages come with use: a context larger than the device is made, and refused
         * when its pages are asked for (the server asks for the whole context at start) */
        assert_int_equal(tern_session_new(m, &sp, &s), TERN_OK);
        assert_int_equal(tern_session_reserve(s, 1u << 24), TERN_ERR_NOMEM);
        assert_non_null(strstr(tern_last_error(), "MiB"));
        printf("%-28s refused: %s\n", rel, tern_last_error());
        assert_int_equal(tern_session_n_past(s), 0);
        assert_int_equal(tern_session_eval(s, toks, 8, NULL), TERN_OK); /* it keeps working */
        tern_session_free(s);
    }
    printf("%-28s checkpoint/restore, fork, rewind, export/import, cancel, batch: equal to cold\n", rel);
    tern_checkpoint_free(ck);
    tern_session_free(ref);
    free(cold);
    free(l);
    free(toks);
    tern_model_free(m);
}

/* The device's checkpoint and KV bytes are laid out as the CPU's: on F32 weights and an
 * F32 cache the same values, within the backends' parity (not bits). */
static void check_layout(const char *rel) {
    struct tern_model *mc = load(rel, false), *mg = load(rel, true);
    const struct tern_model_info *info = tern_model_info(mc);
    int32_t *toks = tx_prompt(P_CUT);
    for (size_t i = 0; i < P_CUT; i++) toks[i] %= (int32_t)info->n_vocab;
    struct tern_session *c = new_session(mc, TERN_KV_F32), *g = new_session(mg, TERN_KV_F32);
    assert_int_equal(tern_session_eval(c, toks, P_CUT, NULL), TERN_OK);
    assert_int_equal(tern_session_eval(g, toks, P_CUT, NULL), TERN_OK);
    const size_t rb = tern_state_kv_row_bytes(mc, TERN_KV_F32);
    assert_int_equal(rb, tern_state_kv_row_bytes(mg, TERN_KV_F32));
    float *kc = malloc(P_CUT * rb), *kg = malloc(P_CUT * rb);
    assert_int_equal(tern_session_kv_export(c, 0, P_CUT, kc), TERN_OK);
    assert_int_equal(tern_session_kv_export(g, 0, P_CUT, kg), TERN_OK);
    double worst = 0, mx = 0;
    for (size_t i = 0; i < P_CUT * rb / sizeof(float); i++) {
        worst = fmax(worst, fabs((double)kc[i] - kg[i]));
        mx = fmax(mx, fabs(kc[i]));
    }
    printf("%-28s KV export: device vs CPU max diff %.2e (largest %.2f)\n", rel, worst, mx);
    assert_true(mx > 0 && worst <= 1e-3 * mx);
    if (info->hybrid) {
        const float *rc = tern_session_rec_data(c), *rg = tern_session_rec_data(g);
        assert_non_null(rc);
        assert_non_null(rg);
        worst = mx = 0;
        for (size_t i = 0; i < info->recurrent_bytes / sizeof(float); i++) {
            worst = fmax(worst, fabs((double)rc[i] - rg[i]));
            mx = fmax(mx, fabs(rc[i]));
        }
        printf("%-28s recurrent state: device vs CPU max diff %.2e (largest %.2f)\n", rel, worst, mx);
        assert_true(mx > 0 && worst <= 1e-3 * mx);
    }
    free(kc);
    free(kg);
    free(toks);
    tern_session_free(c);
    tern_session_free(g);
    tern_model_free(mc);
    tern_model_free(mg);
}

struct ck_set {
    struct tern_checkpoint *c[4];
    size_t n;
};

static void collect_ckpt(void *user, struct tern_checkpoint *c) {
    struct ck_set *k = user;
    assert_true(k->n < 4);
    k->c[k->n++] = c;
}

static void vram_stats(struct tern_model *m, struct tern_ckpt_vram_stats *v) { tern_model_ckpt_vram_stats(m, v); }

/* s has read toks[0..N_TOK); after other tokens, restoring c and reading the rest must
 * give the cold run's logits and hash (s is then back where it was). */
static void restore_equals_cold(struct tern_session *s, const int32_t *toks, const int32_t *other,
                                const struct tern_checkpoint *c, const float *cold, uint64_t h, float *l) {
    const size_t nv = tern_model_info(tern_session_model(s))->n_vocab;
    const uint32_t p = tern_checkpoint_pos(c);
    assert_int_equal(tern_session_n_past(s), N_TOK);
    assert_int_equal(tern_session_eval(s, other, 8, NULL), TERN_OK);
    assert_int_equal(tern_session_restore(s, c), TERN_OK);
    assert_int_equal(tern_session_n_past(s), p);
    struct tern_eval_opts o = {.n_chunk = 64, .logits_all = l};
    assert_int_equal(tern_session_eval(s, toks + p, N_TOK - p, &o), TERN_OK);
    assert_memory_equal(l, cold + (size_t)p * nv, (N_TOK - p) * nv * sizeof(float));
    assert_true(tern_session_hash(s) == h);
}

/* Checkpoints in device memory on the hybrid: budget, spill, bits. */
static void test_qwen35_vram(void **state) {
    (void)state;
    const char *rel = "models/tiny-qwen35-f32.gguf";
    struct tern_model *m = load(rel, true);
    const struct tern_model_info *info = tern_model_info(m);
    const size_t nv = info->n_vocab, rb = info->recurrent_bytes;
    int32_t *toks = tx_prompt(N_TOK), other[8];
    for (size_t i = 0; i < N_TOK; i++) toks[i] %= (int32_t)nv;
    for (size_t i = 0; i < 8; i++) other[i] = (int32_t)((toks[i] * 5 + 3) % (int32_t)nv);
    const size_t lbytes = N_TOK * nv * sizeof(float);
    float *cold = malloc(lbytes), *l = malloc(lbytes);
    struct tern_session *ref = primed(m, toks, N_TOK, 512, cold);
    const uint64_t h = tern_session_hash(ref);
    struct tern_session *rs = primed(m, toks, N_TOK, 64, NULL); /* restores into it */
    static const uint32_t pos[] = {16, P_CUT, 56};

    /* the default keeps nothing on the device */
    struct tern_ckpt_vram_stats v;
    vram_stats(m, &v);
    assert_true(v.budget == 0 && v.n == 0 && v.bytes == 0);
    struct ck_set host = {0}, dev = {0};
    {
        struct tern_session *s = new_session(m, TERN_KV_F16);
        struct tern_eval_opts o = {.n_chunk = 64, .ckpt_pos = pos, .n_ckpt = 3, .on_ckpt = collect_ckpt, .ckpt_user = &host};
        assert_int_equal(tern_session_eval(s, toks, N_TOK, &o), TERN_OK);
        tern_session_free(s);
    }
    vram_stats(m, &v);
    assert_int_equal(host.n, 3);
    assert_true(v.n == 0 && v.kept == 0);

    /* a budget of two: the third pushes the first out to host memory */
    tern_model_set_ckpt_vram(m, 2 * rb);
    {
        struct tern_session *s = new_session(m, TERN_KV_F16);
        struct tern_eval_opts o = {.n_chunk = 64, .ckpt_pos = pos, .n_ckpt = 3, .on_ckpt = collect_ckpt, .ckpt_user = &dev};
        assert_int_equal(tern_session_eval(s, toks, N_TOK, &o), TERN_OK);
        assert_true(tern_session_hash(s) == h); /* taking them changed nothing */
        tern_session_free(s);                   /* checkpoints outlive their session */
    }
    assert_int_equal(dev.n, 3);
    vram_stats(m, &v);
    printf("%-28s vram budget %zu: %u on the device (%zu bytes), %llu kept, %llu spilled\n", rel, v.budget, v.n, v.bytes,
           (unsigned long long)v.kept, (unsigned long long)v.spilled);
    assert_true(v.n == 2 && v.bytes == 2 * rb && v.bytes <= v.budget && v.kept == 3 && v.spilled == 1);
    assert_int_equal(tern_checkpoint_bytes(dev.c[1]), tern_checkpoint_bytes(host.c[1])); /* the pool's count */

    /* restore from the device (1, 2), from the spilled one (0), from host ones: cold bits */
    for (size_t i = 0; i < 3; i++) restore_equals_cold(rs, toks, other, dev.c[i], cold, h, l);
    restore_equals_cold(rs, toks, other, host.c[1], cold, h, l);
    vram_stats(m, &v);
    assert_true(v.restores_device == 2 && v.restores_host == 2);
    /* fork from one on the device */
    {
        struct tern_session *f = NULL;
        assert_int_equal(tern_session_fork(ref, pos[2], dev.c[2], &f), TERN_OK);
        struct tern_eval_opts o = {.n_chunk = 7, .logits_all = l};
        assert_int_equal(tern_session_eval(f, toks + pos[2], N_TOK - pos[2], &o), TERN_OK);
        assert_memory_equal(l, cold + (size_t)pos[2] * nv, (N_TOK - pos[2]) * nv * sizeof(float));
        assert_true(tern_session_hash(f) == h);
        tern_session_free(f);
    }
    /* their bytes are the host checkpoints' (read back, still on the device) */
    for (size_t i = 0; i < 3; i++)
        assert_memory_equal(tern_checkpoint_data(dev.c[i]), tern_checkpoint_data(host.c[i]), rb);
    vram_stats(m, &v);
    assert_true(v.n == 2 && v.restores_device == 3);

    /* a smaller budget spills at once; the spilled one restores to the bits it gave on
     * the device */
    tern_model_set_ckpt_vram(m, rb);
    vram_stats(m, &v);
    assert_true(v.n == 1 && v.bytes == rb && v.spilled == 2);
    restore_equals_cold(rs, toks, other, dev.c[1], cold, h, l);
    restore_equals_cold(rs, toks, other, dev.c[2], cold, h, l);
    vram_stats(m, &v);
    assert_true(v.restores_device == 4 && v.restores_host == 3);
    /* a budget below one checkpoint keeps none; freeing one on the device gives its bytes back */
    tern_model_set_ckpt_vram(m, 2 * rb);
    struct tern_checkpoint *extra = NULL;
    assert_int_equal(tern_session_checkpoint(ref, &extra), TERN_OK);
    vram_stats(m, &v);
    assert_true(v.n == 2 && v.bytes == 2 * rb);
    tern_checkpoint_free(extra);
    vram_stats(m, &v);
    assert_true(v.n == 1 && v.bytes == rb);
    tern_model_set_ckpt_vram(m, rb - 1);
    vram_stats(m, &v);
    assert_true(v.n == 0 && v.bytes == 0);
    assert_int_equal(tern_session_checkpoint(ref, &extra), TERN_OK);
    vram_stats(m, &v);
    assert_true(v.n == 0);
    tern_checkpoint_free(extra);
    printf("%-28s checkpoints on the device, spilled and in host memory: restore and fork equal to cold\n", rel);

    for (size_t i = 0; i < 3; i++) {
        tern_checkpoint_free(host.c[i]);
        tern_checkpoint_free(dev.c[i]);
    }
    tern_session_free(rs);
    tern_session_free(ref);
    free(cold);
    free(l);
    free(toks);
    tern_model_free(m);
}

/* A device with room for one session and 1.5 (or 0.5) checkpoints: the oldest makes way
 * for a new one (spilled), or the new one is made in host memory (a fallback). */
static void vram_full(const char *rel, float room) {
    struct tern_model *m = load(rel, true);
    const size_t rb = tern_model_info(m)->recurrent_bytes, nv = tern_model_info(m)->n_vocab;
    /* a session of 2048 positions: the device's room then passes the weights' size in the
     * file, which tern_gpu_new checks first (the token embedding stays on the host) */
    const size_t used = tern_gpu_bytes(GPU_OF(m)) + tern_gpu_state_need(GPU_OF(m), 2048, true);
    tern_model_free(m);
    char cap[32];
    snprintf(cap, sizeof cap, "%zu", used + (size_t)(room * (float)rb));
    setenv("TERN_TEST_VK_DEVICE_BYTES", cap, 1);
    m = load(rel, true);
    unsetenv("TERN_TEST_VK_DEVICE_BYTES");
    tern_model_set_ckpt_vram(m, 8 * rb); /* the budget is not what is short */
    int32_t *toks = tx_prompt(N_TOK), other[8];
    for (size_t i = 0; i < N_TOK; i++) toks[i] %= (int32_t)nv;
    for (size_t i = 0; i < 8; i++) other[i] = (int32_t)((toks[i] * 3 + 1) % (int32_t)nv);
    float *cold = malloc(N_TOK * nv * sizeof(float)), *l = malloc(N_TOK * nv * sizeof(float));
    struct ck_set ck = {0};
    static const uint32_t pos[] = {16, P_CUT};
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = 2048;
    struct tern_session *ref = NULL;
    assert_int_equal(tern_session_new(m, &sp, &ref), TERN_OK);
    assert_int_equal(tern_session_reserve(ref, 2048), TERN_OK); /* the device's room for a session */
    struct tern_eval_opts o = {.n_chunk = 64, .logits_all = cold, .ckpt_pos = pos, .n_ckpt = 2, .on_ckpt = collect_ckpt,
                               .ckpt_user = &ck};
    assert_int_equal(tern_session_eval(ref, toks, N_TOK, &o), TERN_OK);
    const uint64_t h = tern_session_hash(ref);
    struct tern_ckpt_vram_stats v;
    vram_stats(m, &v);
    printf("%-28s a device with room for %.1f checkpoints: %u on it, %llu spilled, %llu made in host memory\n", rel,
           (double)room, v.n, (unsigned long long)v.spilled, (unsigned long long)v.fallbacks);
    if (room >= 1) assert_true(v.n == 1 && v.kept == 2 && v.spilled == 1 && v.fallbacks == 0);
    else assert_true(v.n == 0 && v.kept == 0 && v.fallbacks == 2);
    /* ref's cold logits were taken with checkpoints along the way: they change nothing */
    struct tern_session *rs = ref; /* restored into ref itself: the device has room for one session */
    for (size_t i = 0; i < 2; i++) restore_equals_cold(rs, toks, other, ck.c[i], cold, h, l);
    tern_session_free(ref);
    for (size_t i = 0; i < 2; i++) tern_checkpoint_free(ck.c[i]);
    free(cold);
    free(l);
    free(toks);
    tern_model_free(m);
}

/* ---- KV pages on the device ------------------------------------------------------ */

#define N_LONG 560u /* three pages of 256 */

/* Device bytes of one KV page of 256 positions in every attention layer (K and V). */
static size_t page_bytes_all(struct tern_model *m) {
    return tern_gpu_state_need(GPU_OF(m), TERN_VK_KV_PAGE, true) - tern_gpu_state_need(GPU_OF(m), 0, true);
}

static struct tern_session *long_session(struct tern_model *m) {
    struct tern_session_params sp;
    tern_session_params_default(&sp);
    sp.n_ctx = 1024;
    struct tern_session *s = NULL;
    if (tern_session_new(m, &sp, &s)) fail_msg("session: %s", tern_last_error());
    return s;
}

/* A session takes its pages as it grows (a growth re-lays the pages it had into a larger
 * buffer on the device) and gets the bits of one that held its whole context from the
 * start: every position's logits, the state hash, KV rows across pages (export, import
 * into the middle of a page, which leaves the page's other rows alone), a fork, a restore
 * far back (the pages beyond it given back, the page kept re-laid on the device) and
 * (attention only) rewinds across a page. */
static void check_pages(const char *rel) {
    struct tern_model *m = load(rel, true);
    const struct tern_model_info *info = tern_model_info(m);
    const size_t nv = info->n_vocab;
    int32_t *base = tx_prompt(400), *toks = malloc(N_LONG * sizeof *toks); /* the kit's prompt, and again */
    for (size_t i = 0; i < N_LONG; i++) toks[i] = (base[i % 400] + (int32_t)(i / 400)) % (int32_t)nv;
    free(base);
    const size_t page = page_bytes_all(m), lbytes = N_LONG * nv * sizeof(float);
    assert_true(page > 0);
    struct tern_session *whole = long_session(m), *grown = long_session(m);
    const size_t b0 = tern_gpu_state_need(GPU_OF(m), 0, true); /* the recurrent parts; no pages yet */
    assert_int_equal(tern_gpu_state_bytes((struct tern_gpu_state *)grown->dev), b0);
    assert_int_equal(tern_session_reserve(whole, 1024), TERN_OK);
    assert_int_equal(tern_gpu_state_bytes((struct tern_gpu_state *)whole->dev), b0 + 4 * page);
    assert_int_equal(tern_session_reserve(whole, 1025), TERN_ERR_RANGE);
    float *lw = malloc(lbytes), *lg = malloc(lbytes);
    struct tern_eval_opts o = {.n_chunk = 64, .logits_all = lw};
    /* the whole context with attention folded in one dispatch, the pieces below split over
     * their pages where a dispatch has few workgroups (a GPU's choice): the same bits */
    tern_vk_set_attention_split(tern_gpu_vk(GPU_OF(m)), false);
    assert_int_equal(tern_session_eval(whole, toks, N_LONG, &o), TERN_OK);
    tern_vk_set_attention_split(tern_gpu_vk(GPU_OF(m)), true);
    const uint64_t h = tern_session_hash(whole);
    /* in pieces that end inside pages and cross them, in chunks of 7 and 64 */
    static const uint32_t cut[] = {0, 100, 300, N_LONG};
    struct tern_checkpoint *ck = NULL; /* at 100, the end of the first piece */
    const uint32_t ck_pos[] = {100};
    for (size_t i = 0; i < 3; i++) {
        struct tern_eval_opts og = {.n_chunk = i == 1 ? 64 : 7, .logits_all = lg + (size_t)cut[i] * nv};
        if (i == 0) og.ckpt_pos = ck_pos, og.n_ckpt = 1, og.on_ckpt = keep_ckpt, og.ckpt_user = &ck;
        assert_int_equal(tern_session_eval(grown, toks + cut[i], cut[i + 1] - cut[i], &og), TERN_OK);
        assert_int_equal(tern_gpu_state_bytes((struct tern_gpu_state *)grown->dev), b0 + (i + 1) * page);
    }
    assert_memory_equal(lg, lw, lbytes);
    assert_true(tern_session_hash(grown) == h);
    /* KV rows across pages */
    const size_t rb = tern_state_kv_row_bytes(m, TERN_KV_F16), nr = 430;
    uint8_t *kw = malloc(nr * rb), *kg = malloc(nr * rb), *junk = malloc(nr * rb);
    assert_int_equal(tern_session_kv_export(whole, 100, 100 + nr, kw), TERN_OK);
    assert_int_equal(tern_session_kv_export(grown, 100, 100 + nr, kg), TERN_OK);
    assert_memory_equal(kw, kg, nr * rb);
    for (size_t i = 0; i < nr * rb; i++) junk[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(tern_session_kv_import(grown, 250, 262, junk, 12), TERN_OK);
    assert_true(tern_session_hash(grown) != h);
    static const uint32_t span[][3] = {{100, 250, 1}, {250, 262, 0}, {262, 530, 1}}; /* rows, equal */
    for (size_t i = 0; i < 3; i++) {
        const uint32_t a0 = span[i][0], a1 = span[i][1];
        assert_int_equal(tern_session_kv_export(whole, a0, a1, kw), TERN_OK);
        assert_int_equal(tern_session_kv_export(grown, a0, a1, kg), TERN_OK);
        assert_int_equal(memcmp(kw, kg, (a1 - a0) * rb) == 0, span[i][2]);
    }
    assert_int_equal(tern_session_kv_export(whole, 100, 100 + nr, kw), TERN_OK);
    assert_int_equal(tern_session_kv_import(grown, 100, 100 + nr, kw, nr), TERN_OK);
    assert_true(tern_session_hash(grown) == h);
    /* a fork at the end takes the pages it needs */
    struct tern_session *f = NULL;
    assert_int_equal(tern_session_fork(grown, N_LONG, NULL, &f), TERN_OK);
    assert_true(tern_session_hash(f) == h);
    assert_int_equal(tern_gpu_state_bytes((struct tern_gpu_state *)f->dev), b0 + 3 * page);
    tern_session_free(f);
    /* restored far back, the session gives its pages beyond the checkpoint's back (the
     * page it keeps re-laid on the device), takes them again as it grows, and the rest
     * gives the same bits */
    assert_non_null(ck);
    assert_int_equal(tern_session_restore(grown, ck), TERN_OK);
    assert_int_equal(tern_gpu_state_bytes((struct tern_gpu_state *)grown->dev), b0 + page);
    struct tern_eval_opts og = {.n_chunk = 64, .logits_all = lg};
    assert_int_equal(tern_session_eval(grown, toks + 100, N_LONG - 100, &og), TERN_OK);
    assert_memory_equal(lg, lw + 100 * nv, (N_LONG - 100) * nv * sizeof(float));
    assert_true(tern_session_hash(grown) == h);
    assert_int_equal(tern_gpu_state_bytes((struct tern_gpu_state *)grown->dev), b0 + 3 * page);
    tern_checkpoint_free(ck);
    if (!info->hybrid) {
        /* back across a page boundary (a page of room kept: nothing re-laid), then the
         * rest again */
        assert_int_equal(tern_session_rewind(grown, 400), TERN_OK);
        assert_int_equal(tern_gpu_state_bytes((struct tern_gpu_state *)grown->dev), b0 + 3 * page);
        assert_int_equal(tern_session_eval(grown, toks + 400, N_LONG - 400, &og), TERN_OK);
        assert_memory_equal(lg, lw + 400 * nv, (N_LONG - 400) * nv * sizeof(float));
        /* far back: down to one page */
        assert_int_equal(tern_session_rewind(grown, 200), TERN_OK);
        assert_int_equal(tern_gpu_state_bytes((struct tern_gpu_state *)grown->dev), b0 + page);
        assert_int_equal(tern_session_eval(grown, toks + 200, N_LONG - 200, &og), TERN_OK);
        assert_memory_equal(lg, lw + 200 * nv, (N_LONG - 200) * nv * sizeof(float));
        assert_true(tern_session_hash(grown) == h);
    }
    printf("%-28s KV pages of %zu bytes: a session grown page by page equals one of its whole context (hash "
           "%016llx)\n",
           rel, page, (unsigned long long)h);
    tern_session_free(whole);
    tern_session_free(grown);
    free(lw), free(lg), free(kw), free(kg), free(junk), free(toks);
    tern_model_free(m);
}

static void test_pages_qwen3(void **state) {
    (void)state;
    check_pages("models/tiny-qwen3-f32.gguf");
}

static void test_pages_qwen35(void **state) {
    (void)state;
    check_pages("models/tiny-qwen35-f32.gguf");
}

/* gpt-oss: window layers (16 keys) whose windows straddle the pages, sinks; the rewinds
 * and forks land inside the window of the end and beyond it */
static void test_pages_gptoss(void **state) {
    (void)state;
    check_pages("models/tiny-gptoss-f32.gguf");
}

/* A device with room for one session's whole context: a session that cannot have its
 * pages is refused with the sizes (and keeps what it had); through the cache, the parked
 * session gives way for the leased one's pages (cache_reserve). */
static void check_pages_full(const char *rel) {
    struct tern_model *m = load(rel, true);
    const size_t used = tern_gpu_bytes(GPU_OF(m)) + tern_gpu_state_need(GPU_OF(m), 2048, true) +
                        tern_gpu_state_need(GPU_OF(m), 0, true); /* and a second session's recurrent state */
    tern_model_free(m);
    char cap[32];
    snprintf(cap, sizeof cap, "%zu", used);
    setenv("TERN_TEST_VK_DEVICE_BYTES", cap, 1);
    m = load(rel, true);
    unsetenv("TERN_TEST_VK_DEVICE_BYTES");
    const size_t nv = tern_model_info(m)->n_vocab;
    int32_t *toks = tx_prompt(64);
    for (size_t i = 0; i < 64; i++) toks[i] %= (int32_t)nv;
    struct cache_params p;
    memset(&p, 0, sizeof p);
    tern_session_params_default(&p.session);
    p.session.n_ctx = 2048;
    p.session.n_chunk = 64;
    p.ram_bytes = (size_t)1 << 30;
    p.pool = true;
    p.turn_token = -1;
    struct cache *c = NULL;
    assert_int_equal(cache_new(m, &p, &c), TERN_OK);
    /* conversation a reads 32 tokens (a page) and is parked */
    struct cache_ident ia = {.tenant = "", .key = "a"}, ib = {.tenant = "", .key = "b"};
    struct cache_lease la, lb;
    assert_int_equal(cache_acquire(c, &ia, toks, 32, &la), TERN_OK);
    assert_int_equal(cache_reserve(c, la.session, 32), TERN_OK);
    assert_int_equal(tern_session_eval(la.session, toks, 32, NULL), TERN_OK);
    cache_release(c, &la, true);
    /* b, alone: no room for its whole context beside a's page, refused with the sizes, and
     * an eval that needs no more pages than it can have still runs */
    struct tern_session *alone = NULL;
    struct tern_session_params sp = p.session;
    assert_int_equal(tern_session_new(m, &sp, &alone), TERN_OK);
    assert_int_equal(tern_session_reserve(alone, 2048), TERN_ERR_NOMEM);
    assert_non_null(strstr(tern_last_error(), "KV cache"));
    assert_non_null(strstr(tern_last_error(), "MiB left"));
    assert_int_equal(tern_session_n_past(alone), 0);
    assert_int_equal(tern_session_eval(alone, toks + 32, 8, NULL), TERN_OK);
    tern_session_free(alone);
    /* b through the cache: a gives way */
    struct cache_stats st0, st1;
    cache_get_stats(c, &st0);
    assert_int_equal(cache_acquire(c, &ib, toks + 32, 32, &lb), TERN_OK);
    assert_int_equal(cache_reserve(c, lb.session, 2048), TERN_OK);
    assert_int_equal(tern_session_eval(lb.session, toks + 32, 32, NULL), TERN_OK);
    cache_get_stats(c, &st1);
    assert_int_equal(st1.evictions, st0.evictions + 1);
    cache_release(c, &lb, true);
    printf("%-28s a device with room for one context: a session without room refused, a parked one evicted for "
           "the leased one\n",
           rel);
    cache_free(c);
    free(toks);
    tern_model_free(m);
}

static void test_pages_full(void **state) {
    (void)state;
    check_pages_full("models/tiny-qwen3-f32.gguf");
    check_pages_full("models/tiny-qwen35-q8_0.gguf");
}

/* A solo reference: a session that read pre[0..n_pre) in chunks of 64, then each of the
 * evals ev[k] alone (tern_session_eval), its logits (the last token's, or every token's
 * when all) and state hash after each. */
struct solo_eval {
    const int32_t *toks;
    uint32_t n;
    bool all;
    float *logits; /* out: [n][n_vocab] when all, else [n_vocab] */
    uint64_t hash; /* out */
};

static void solo(struct tern_model *m, const int32_t *pre, uint32_t n_pre, struct solo_eval *ev, size_t n_ev) {
    const size_t nv = tern_model_info(m)->n_vocab;
    struct tern_session *s = n_pre ? primed(m, pre, n_pre, 64, NULL) : new_session(m, TERN_KV_F16);
    for (size_t k = 0; k < n_ev; k++) {
        struct tern_eval_opts o = {.logits_all = ev[k].all ? ev[k].logits : NULL};
        assert_int_equal(tern_session_eval(s, ev[k].toks, ev[k].n, &o), TERN_OK);
        if (!ev[k].all) memcpy(ev[k].logits, tern_session_logits(s), nv * sizeof(float));
        ev[k].hash = tern_session_hash(s);
    }
    tern_session_free(s);
}

/* After a batch: the item's logits (its logits_all rows, or the session's logits) and
 * state hash are its solo eval's. */
static void assert_item(const struct tern_batch_item *it, const struct solo_eval *ev, uint32_t n_past, size_t nv) {
    assert_int_equal(tern_session_n_past(it->s), n_past);
    if (it->logits_all) {
        assert_memory_equal(it->logits_all, ev->logits, (size_t)it->n * nv * sizeof(float));
        assert_memory_equal(tern_session_logits(it->s), ev->logits + (size_t)(it->n - 1) * nv, nv * sizeof(float));
    } else {
        assert_non_null(tern_session_logits(it->s));
        assert_memory_equal(tern_session_logits(it->s), ev->logits, nv * sizeof(float));
    }
    assert_true(tern_session_hash(it->s) == ev->hash);
}

/* tern_eval_batch on the device (one step over several sessions' rows, split into steps
 * of the device's chunk of 64 when they are more) against each session alone. */
static void check_batch(const char *rel) {
    struct tern_model *m = load(rel, true);
    const size_t nv = tern_model_info(m)->n_vocab;
    int32_t *toks = tx_prompt(N_TOK + 1), p2[70];
    for (size_t i = 0; i <= N_TOK; i++) toks[i] %= (int32_t)nv;
    for (size_t i = 0; i < 70; i++) p2[i] = (int32_t)((toks[i] * 13 + 5) % (int32_t)nv);
    float *a1 = malloc(nv * sizeof(float)), *a2 = malloc(nv * sizeof(float)), *b1 = malloc(nv * sizeof(float));
    float *b2 = malloc(nv * sizeof(float)), *c = malloc(20 * nv * sizeof(float)), *d = malloc(50 * nv * sizeof(float));
    float *gc = malloc(20 * nv * sizeof(float)), *gd = malloc(50 * nv * sizeof(float));

    /* alone: A decodes one token after P_CUT, then another; B reads a fresh prompt of 30,
     * then 40 more; C reads 20 tokens after 10 with every row's logits; D a fresh prompt
     * of 50 with every row's logits */
    struct solo_eval ea[] = {{toks + P_CUT, 1, false, a1, 0}, {toks + P_CUT + 1, 1, false, a2, 0}};
    struct solo_eval eb[] = {{p2, 30, false, b1, 0}, {p2 + 30, 40, false, b2, 0}};
    struct solo_eval ec[] = {{toks + 10, 20, true, c, 0}}, ed[] = {{toks, 50, true, d, 0}};
    solo(m, toks, P_CUT, ea, 2);
    solo(m, NULL, 0, eb, 2);
    solo(m, toks, 10, ec, 1);
    solo(m, NULL, 0, ed, 1);

    struct tern_session *A = primed(m, toks, P_CUT, 64, NULL), *B = new_session(m, TERN_KV_F16);
    struct tern_session *C = primed(m, toks, 10, 64, NULL), *D = new_session(m, TERN_KV_F16);
    /* one step of 51 rows: A's token, B's prompt (its last row's logits), C's 20 rows */
    const struct tern_batch_item s1[] = {
        {.s = A, .toks = toks + P_CUT, .n = 1, .logits = true},
        {.s = B, .toks = p2, .n = 30, .logits = true},
        {.s = C, .toks = toks + 10, .n = 20, .logits_all = gc},
    };
    assert_int_equal(tern_eval_batch(s1, 3), TERN_OK);
    assert_item(&s1[0], &ea[0], P_CUT + 1, nv);
    assert_item(&s1[1], &eb[0], 30, nv);
    assert_item(&s1[2], &ec[0], 30, nv);
    /* 91 rows, more than the chunk: steps of 64 and 27 rows; B is cut across them (its
     * last row in the second), D's rows all in the first */
    const struct tern_batch_item s2[] = {
        {.s = A, .toks = toks + P_CUT + 1, .n = 1, .logits = true},
        {.s = D, .toks = toks, .n = 50, .logits_all = gd},
        {.s = B, .toks = p2 + 30, .n = 40, .logits = true},
    };
    assert_int_equal(tern_eval_batch(s2, 3), TERN_OK);
    assert_item(&s2[0], &ea[1], P_CUT + 2, nv);
    assert_item(&s2[1], &ed[0], 50, nv);
    assert_item(&s2[2], &eb[1], 70, nv);
    /* 68 rows: a logits_all item cut across the steps (C: 38 rows in the first, 4 in the
     * second), an item without logits (B: a prompt chunk before the last) and A's 24
     * tokens, each equal to the same evaluated alone */
    {
        float *l = malloc(42 * nv * sizeof(float)), *r = malloc(42 * nv * sizeof(float));
        const struct tern_batch_item s3[] = {
            {.s = B, .toks = toks, .n = 2},
            {.s = A, .toks = toks, .n = 24, .logits = true},
            {.s = C, .toks = toks + 30, .n = 42, .logits_all = l},
        };
        assert_int_equal(tern_eval_batch(s3, 3), TERN_OK);
        struct solo_eval eb3[] = {{p2, 30, false, b1, 0}, {p2 + 30, 40, false, b2, 0}, {toks, 2, false, a1, 0}};
        solo(m, NULL, 0, eb3, 3);
        assert_int_equal(tern_session_n_past(B), 72);
        assert_null(tern_session_logits(B));
        assert_true(tern_session_hash(B) == eb3[2].hash);
        struct solo_eval ea3[] = {{toks + P_CUT, 1, false, a1, 0}, {toks + P_CUT + 1, 1, false, a2, 0},
                                  {toks, 24, false, b1, 0}};
        solo(m, toks, P_CUT, ea3, 3);
        assert_item(&s3[1], &ea3[2], P_CUT + 26, nv);
        struct solo_eval ec3[] = {{toks + 10, 20, true, gc, 0}, {toks + 30, 42, true, r, 0}};
        solo(m, toks, 10, ec3, 2);
        assert_item(&s3[2], &ec3[1], 72, nv);
        free(l);
        free(r);
    }
    /* the device's entry refuses one state twice in a step before computing anything */
    {
        const uint64_t ha = tern_session_hash(A);
        const struct tern_gpu_seq twice[] = {{.st = (struct tern_gpu_state *)A->dev, .pos0 = tern_session_n_past(A), .toks = toks, .n = 1},
                                             {.st = (struct tern_gpu_state *)A->dev, .pos0 = tern_session_n_past(A) + 1, .toks = toks, .n = 1}};
        assert_int_equal(tern_gpu_eval_batch(GPU_OF(m), twice, 2, 0), TERN_ERR_INVALID);
        assert_non_null(strstr(tern_last_error(), "one state"));
        assert_true(tern_session_hash(A) == ha);
    }
    printf("%-28s device batches of 3 sessions (51 rows; 91 and 68 rows in steps of 64): each item's logits and "
           "state hash equal its session alone\n",
           rel);
    tern_session_free(A), tern_session_free(B), tern_session_free(C), tern_session_free(D);
    float *fr[] = {a1, a2, b1, b2, c, d, gc, gd};
    for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) free(fr[i]);
    free(toks);
    tern_model_free(m);
}

static void test_batch_qwen3(void **state) {
    (void)state;
    check_batch("models/tiny-qwen3-f32.gguf");
}

static void test_batch_qwen35(void **state) {
    (void)state;
    check_batch("models/tiny-qwen35-f32.gguf");
}

/* The matmul as a GPU runs it (32 invocations per weight row, summed in a tree) on this
 * device, whatever its own choice (a CPU device takes 1): a hybrid MoE's logits and state
 * hash are the same bits token by token and in chunks of 7, 64 and 512 (the indexed
 * experts' matmul, the DeltaNet's and attention's projections, the output). */
static void test_lanes32_chunks(void **state) {
    (void)state;
    const char *rel = "models/tiny-qwen35moe-q4_k_m.gguf";
    setenv("TERN_TEST_VK_MATMUL_LANES", "32", 1);
    struct tern_model *m = load(rel, true);
    unsetenv("TERN_TEST_VK_MATMUL_LANES");
    if (tern_vk_matmul_lanes(tern_gpu_vk(GPU_OF(m))) != 32)
        fail_msg("TERN_TEST_VK_MATMUL_LANES=32 was not taken: build with -DTERN_TEST_HOOKS=ON");
    const size_t nv = tern_model_info(m)->n_vocab, n = 40;
    int32_t *toks = tx_prompt(n);
    for (size_t i = 0; i < n; i++) toks[i] %= (int32_t)nv;
    float *cold = malloc(n * nv * sizeof(float)), *l = malloc(n * nv * sizeof(float));
    struct tern_session *ref = primed(m, toks, n, 512, cold);
    static const uint32_t chunks[] = {0, 7, 64};
    for (size_t i = 0; i < 3; i++) {
        memset(l, 0, n * nv * sizeof(float));
        struct tern_session *s = primed(m, toks, n, chunks[i], l);
        assert_memory_equal(l, cold, n * nv * sizeof(float));
        assert_true(tern_session_hash(s) == tern_session_hash(ref));
        tern_session_free(s);
    }
    printf("%-28s matmul lanes 32: token by token and chunks 7/64/512 identical (hash %016llx)\n", rel,
           (unsigned long long)tern_session_hash(ref));
    tern_session_free(ref);
    free(cold), free(l), free(toks);
    tern_model_free(m);
}

/* Partial offload (tern_model_set_cpu_moe): the first layers' routed experts in host memory,
 * run by the CPU's MoE block between the device's halves of the step. */
struct offload_run {
    float *l;            /* [n][n_vocab] every position's logits, chunks of 64 */
    uint64_t hash;
    size_t bytes;        /* tern_gpu_bytes */
    uint32_t n_cpu, n_moe;
    uint32_t n_cpu_layers; /* tern_model_cpu_layers */
};

static void offload_run(const char *rel, uint32_t req, const char *cap, const int32_t *toks, size_t n,
                        struct offload_run *r, bool chunks) {
    if (cap) setenv("TERN_TEST_VK_DEVICE_BYTES", cap, 1);
    load_cpu_moe = req;
    struct tern_model *m = load(rel, true);
    load_cpu_moe = 0;
    unsetenv("TERN_TEST_VK_DEVICE_BYTES");
    const size_t nv = tern_model_info(m)->n_vocab;
    r->bytes = tern_gpu_bytes(GPU_OF(m));
    tern_model_cpu_moe(m, &r->n_cpu, &r->n_moe);
    r->n_cpu_layers = tern_model_cpu_layers(m);
    r->l = malloc(n * nv * sizeof(float));
    struct tern_session *s = primed(m, toks, n, 64, r->l);
    r->hash = tern_session_hash(s);
    if (chunks) { /* token by token and in chunks of 7: the same bits */
        float *l = malloc(n * nv * sizeof(float));
        static const uint32_t ch[] = {0, 7};
        for (size_t i = 0; i < 2; i++) {
            memset(l, 0, n * nv * sizeof(float));
            struct tern_session *t = primed(m, toks, n, ch[i], l);
            assert_memory_equal(l, r->l, n * nv * sizeof(float));
            assert_true(tern_session_hash(t) == r->hash);
            tern_session_free(t);
        }
        free(l);
    }
    tern_session_free(s);
    tern_model_free(m);
}

/* Two offload runs (o[0], o[1]) against everything on the device (ref), position by
 * position: the largest difference relative to the position's largest logit (worst), the
 * positions past 2 % of it (far), and the positions whose likeliest token differs where
 * the device's best two are more than 1e-3 of it apart (flips; the first in *flip_at). */
struct logit_diff {
    double worst;
    size_t far, flips, flip_at;
};

static struct logit_diff offload_diff(const struct offload_run *ref, const struct offload_run *const o[2], size_t n,
                                      size_t nv) {
    struct logit_diff r = {0, 0, 0, SIZE_MAX};
    for (size_t t = 0; t < n; t++) {
        const float *a = ref->l + t * nv;
        float scale = 0;
        for (size_t i = 0; i < nv; i++) scale = fmaxf(scale, fabsf(a[i]));
        for (size_t k = 0; k < 2; k++) {
            const float *b = o[k]->l + t * nv;
            size_t ia = 0, ib = 0;
            double d = 0;
            for (size_t i = 0; i < nv; i++) {
                if (a[i] > a[ia]) ia = i;
                if (b[i] > b[ib]) ib = i;
                d = fmax(d, fabs((double)a[i] - b[i]));
            }
            if (ia != ib && fabs((double)a[ia] - a[ib]) > 1e-3 * scale) {
                if (!r.flips++) r.flip_at = t;
            }
            r.far += d > 2e-2 * scale;
            r.worst = fmax(r.worst, d / scale);
        }
    }
    return r;
}

static void check_cpu_moe(const char *rel) {
    struct tern_model *m0 = load(rel, false);
    const size_t nv = tern_model_info(m0)->n_vocab, n = 32;
    const uint32_t n_layer = tern_model_info(m0)->n_layer;
    tern_model_free(m0);
    int32_t *toks = tx_prompt(n);
    for (size_t i = 0; i < n; i++) toks[i] %= (int32_t)nv;
    struct offload_run full, all, two, au, au0;
    offload_run(rel, 0, NULL, toks, n, &full, false);
    offload_run(rel, TERN_CPU_MOE_ALL, NULL, toks, n, &all, false);
    offload_run(rel, 2, NULL, toks, n, &two, true);
    assert_int_equal(full.n_cpu, 0);
    assert_int_equal(full.n_moe, n_layer);
    assert_int_equal(all.n_cpu, n_layer);
    assert_int_equal(two.n_cpu, 2);
    /* the device holds fewer weights: the experts left in host memory */
    assert_true(all.bytes < two.bytes && two.bytes < full.bytes);
    /* against everything on the device: the same likeliest token at every position, the
     * logits within the CPU's and the device's kernels' differences */
    const struct offload_run *o[] = {&all, &two};
    const struct logit_diff df = offload_diff(&full, o, n, nv);
    if (df.flips)
        fail_msg("%s: position %zu (and %zu more): the likeliest token differs with experts on the CPU", rel,
                 df.flip_at, df.flips - 1);
    const double worst = df.worst;
    const size_t far = df.far;
    /* within 2 % of the largest logit but where the CPU's and the device's router logits
     * break a near-tie of the top-k differently (a token's expert changes): at most one
     * position in eight, and never by half the largest logit */
    if (far > 2 * n / 8 || worst > 0.5)
        fail_msg("%s: %zu of %zu positions differ by more than 2 %% of the largest logit, the most %.3f", rel, far,
                 2 * n, worst);
    /* auto: a device with room for the last n_layer - 2 layers' experts (two.bytes -
     * all.bytes) and half a layer's more beside the rest and the reserve keeps the first
     * two on the CPU: the bits of asking for them */
    char cap[32];
    snprintf(cap, sizeof cap, "%zu", two.bytes + (1u << 20) + (full.bytes - two.bytes) / 4);
    offload_run(rel, TERN_CPU_MOE_AUTO, cap, toks, n, &au, false);
    assert_int_equal(au.n_cpu, 2);
    assert_int_equal(au.bytes, two.bytes);
    assert_memory_equal(au.l, two.l, n * nv * sizeof(float));
    assert_true(au.hash == two.hash);
    /* auto with room for everything: nothing on the CPU, the device's own bits */
    offload_run(rel, TERN_CPU_MOE_AUTO, NULL, toks, n, &au0, false);
    assert_int_equal(au0.n_cpu, 0);
    assert_memory_equal(au0.l, full.l, n * nv * sizeof(float));
    printf("%-28s cpu-moe: all/2/auto(%u of %u) layers' experts on the CPU (%.1f/%.1f KiB off the device); with 2, token "
           "by token = chunks; logits of %zu of %zu positions past 2 %% of the device's, the most %.3f\n",
           rel, au.n_cpu, n_layer, (full.bytes - all.bytes) / 1024.0, (full.bytes - two.bytes) / 1024.0, far, 2 * n,
           worst);
    struct offload_run *rs[] = {&full, &all, &two, &au, &au0};
    for (size_t i = 0; i < 5; i++) free(rs[i]->l);
    free(toks);
}

static void test_cpu_moe(void **state) {
    (void)state;
    check_cpu_moe("models/tiny-qwen35moe-q4_k_m.gguf");
    if (lite) return;
    check_cpu_moe("models/tiny-gptoss-mxfp4.gguf");
    check_cpu_moe("models/tiny-qwen3moe-q8_0.gguf");
    /* the device's batches with two layers' experts on the CPU: each item's bits its own */
    load_cpu_moe = 2;
    check_batch("models/tiny-qwen35moe-q4_k_m.gguf");
    load_cpu_moe = 0;
}

/* --gpu-layers (tern_model_set_gpu_layers): the matrices of the layers past the first N in
 * host memory, their matmuls on the CPU between the device's operations. */
static void check_gpu_layers(const char *rel, double tol) {
    struct tern_model *m0 = load(rel, false);
    const size_t nv = tern_model_info(m0)->n_vocab, n = 32;
    const uint32_t n_layer = tern_model_info(m0)->n_layer;
    tern_model_free(m0);
    int32_t *toks = tx_prompt(n);
    for (size_t i = 0; i < n; i++) toks[i] %= (int32_t)nv;
    struct offload_run full, two, none, au, au_all;
    offload_run(rel, 0, NULL, toks, n, &full, false);
    load_gpu_layers = 2;
    offload_run(rel, 0, NULL, toks, n, &two, true); /* token by token = chunks of 7 = 64 */
    load_gpu_layers = 0;
    offload_run(rel, 0, NULL, toks, n, &none, false);
    /* auto: a device with room for two layers' matrices and half of a third beside the
     * rest and the reserve (1 MiB) takes two: the bits of asking for them; with room for
     * everything, the device's own bits */
    char cap[32];
    snprintf(cap, sizeof cap, "%zu", two.bytes + (1u << 20) + (two.bytes - none.bytes) / 4);
    load_gpu_layers = TERN_GPU_LAYERS_AUTO;
    offload_run(rel, 0, cap, toks, n, &au, false);
    offload_run(rel, 0, NULL, toks, n, &au_all, false);
    load_gpu_layers = TERN_GPU_LAYERS_ALL;
    assert_int_equal(full.n_cpu_layers, 0);
    assert_int_equal(two.n_cpu_layers, n_layer - 2);
    assert_int_equal(none.n_cpu_layers, n_layer);
    assert_int_equal(au.n_cpu_layers, n_layer - 2);
    assert_int_equal(au.bytes, two.bytes);
    assert_memory_equal(au.l, two.l, n * nv * sizeof(float));
    assert_true(au.hash == two.hash);
    assert_int_equal(au_all.n_cpu_layers, 0);
    assert_memory_equal(au_all.l, full.l, n * nv * sizeof(float));
    /* the device holds fewer weights: the later layers' matrices left in host memory */
    assert_true(none.bytes < two.bytes && two.bytes < full.bytes);
    /* against everything on the device: the logits within tol of the largest, and the
     * likeliest token at every position but where the device's best two are within 1e-3
     * of the largest logit or, with quantized weights (tol > 1e-2), at one position in
     * eight (the CPU's kernels read quantized activations where the device reads F32
     * ones: a random model's near-ties break either way) */
    const struct offload_run *o[] = {&two, &none};
    const struct logit_diff df = offload_diff(&full, o, n, nv);
    if (tol <= 1e-2 && df.flips)
        fail_msg("%s: position %zu (and %zu more): the likeliest token differs with layers on the CPU", rel, df.flip_at,
                 df.flips - 1);
    const double worst = df.worst;
    const size_t flips = df.flips;
    if (worst > tol || flips > 2 * n / 8)
        fail_msg("%s: the logits differ by %.3g of the largest (bound %.3g), the likeliest token at %zu of %zu positions",
                 rel, worst, tol, flips, 2 * n);
    printf("%-28s gpu-layers: 2, 0 and auto (%.1f/%.1f KiB off the device); with 2, token by token = chunks; logits within "
           "%.2g of the largest of the device's, the likeliest token other at %zu of %zu positions\n",
           rel, (full.bytes - two.bytes) / 1024.0, (full.bytes - none.bytes) / 1024.0, worst, flips, 2 * n);
    free(full.l), free(two.l), free(none.l), free(au.l), free(au_all.l), free(toks);
}

static void test_gpu_layers(void **state) {
    (void)state;
    check_gpu_layers("models/tiny-qwen35-f32.gguf", 1e-3);
    check_gpu_layers("models/tiny-qwen35moe-q4_k_m.gguf", 0.5); /* (routing near-ties: test_cpu_moe) */
    if (lite) return;
    check_gpu_layers("models/tiny-qwen3-q8_0.gguf", 0.1);
    check_gpu_layers("models/tiny-gptoss-mxfp4.gguf", 0.5);
    /* the device's batches with two layers on the device: each item's bits its own */
    load_gpu_layers = 2;
    check_batch("models/tiny-qwen35moe-q4_k_m.gguf");
    load_gpu_layers = TERN_GPU_LAYERS_ALL;
}

static void test_qwen35_vram_full(void **state) {
    (void)state;
    vram_full("models/tiny-qwen35-f32.gguf", 1.5f);
    vram_full("models/tiny-qwen35-f32.gguf", 0.5f);
}

static void test_qwen3_f32(void **state) {
    (void)state;
    check_model("models/tiny-qwen3-f32.gguf", false);
    check_layout("models/tiny-qwen3-f32.gguf");
}

static void test_qwen3_q8_0(void **state) {
    (void)state;
    check_model("models/tiny-qwen3-q8_0.gguf", true);
}

static void test_qwen35_f32(void **state) {
    (void)state;
    check_model("models/tiny-qwen35-f32.gguf", false);
    check_layout("models/tiny-qwen35-f32.gguf");
}

static void test_gptoss_mxfp4(void **state) {
    (void)state;
    check_model("models/tiny-gptoss-mxfp4.gguf", true);
}

static void test_qwen35_q8_0(void **state) {
    (void)state;
    check_model("models/tiny-qwen35-q8_0.gguf", true);
}

int main(int argc, char **argv) {
    lite = argc > 1 && !strcmp(argv[1], "lite");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_f32),
        cmocka_unit_test(test_qwen3_q8_0),
        cmocka_unit_test(test_qwen35_f32),
        cmocka_unit_test(test_qwen35_q8_0),
        cmocka_unit_test(test_qwen35_vram),
        cmocka_unit_test(test_qwen35_vram_full),
        cmocka_unit_test(test_pages_qwen3),
        cmocka_unit_test(test_pages_qwen35),
        cmocka_unit_test(test_pages_gptoss),
        cmocka_unit_test(test_gptoss_mxfp4),
        cmocka_unit_test(test_pages_full),
        cmocka_unit_test(test_batch_qwen3),
        cmocka_unit_test(test_batch_qwen35),
        cmocka_unit_test(test_lanes32_chunks),
        cmocka_unit_test(test_cpu_moe),
        cmocka_unit_test(test_gpu_layers),
    };
    const struct CMUnitTest lite_tests[] = {
        cmocka_unit_test(test_qwen35_f32),
        cmocka_unit_test(test_qwen35_vram),
        cmocka_unit_test(test_qwen35_vram_full),
        cmocka_unit_test(test_pages_qwen35),
        cmocka_unit_test(test_pages_full),
        cmocka_unit_test(test_batch_qwen35),
        cmocka_unit_test(test_lanes32_chunks),
        cmocka_unit_test(test_cpu_moe),
        cmocka_unit_test(test_gpu_layers),
    };
    if (lite) return cmocka_run_group_tests(lite_tests, setup, NULL);
    return cmocka_run_group_tests(tests, setup, NULL);
}
