/* The engine's other routes: /tokenize, /detokenize, and its lines of /metrics. */
#include "server/engine-impl.h"

#include "server/respond.h"
#include "tokenizer/tokenizer.h"
#include "util/mem.h"
#include "util/utf8.h"

#include <string.h>

/* /tokenize bounds (docs/SERVING.md, Limits and abuse): the response is ~10 bytes per
 * token, ~200 with pieces, and built as JSON nodes first, so the work and the memory of
 * one request are bounded by its text and, with pieces, by its tokens. */
#define TOKENIZE_MAX_BYTES ((size_t)1 << 20)
#define TOKENIZE_MAX_PIECES 65536

json_t *engine_tokenize(void *self, const json_t *body, struct srv_error *err) {
    struct srv_engine *e = self;
    const json_t *c = json_object_get(body, "content");
    if (!json_is_string(c)) {
        srv_error_bad(err, "content", "'content' must be a string");
        return NULL;
    }
    const json_t *as = json_object_get(body, "add_special"), *ps = json_object_get(body, "parse_special");
    const json_t *wp = json_object_get(body, "with_pieces");
    if ((as && !json_is_boolean(as)) || (ps && !json_is_boolean(ps)) || (wp && !json_is_boolean(wp))) {
        srv_error_bad(err, NULL, "'add_special', 'parse_special' and 'with_pieces' must be booleans");
        return NULL;
    }
    int flags = (json_is_true(as) ? TERN_TOK_ADD_SPECIAL : 0) | (ps && json_is_false(ps) ? 0 : TERN_TOK_PARSE_SPECIAL);
    if (json_string_length(c) > TOKENIZE_MAX_BYTES) {
        srv_error_set(err, 413, "invalid_request_error", "request_too_large", "content",
                      "'content' is %zu bytes; /tokenize takes at most %zu (send it in parts)", json_string_length(c),
                      TOKENIZE_MAX_BYTES);
        return NULL;
    }
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (tern_tokenize(e->tok, json_string_value(c), json_string_length(c), flags, &ids, &n, &cap)) {
        free(ids);
        srv_error_set(err, 500, "server_error", NULL, NULL, "tokenizer: %s", tern_last_error());
        return NULL;
    }
    if (json_is_true(wp) && n > TOKENIZE_MAX_PIECES) {
        free(ids);
        srv_error_bad(err, "with_pieces", "'with_pieces' returns at most %d tokens; the content has %zu (send it in "
                      "parts, or without with_pieces)", TOKENIZE_MAX_PIECES, n);
        return NULL;
    }
    json_t *arr = json_array();
    struct tern_buf piece = TERN_BUF_INIT;
    for (size_t i = 0; i < n; i++) {
        if (json_is_true(wp)) {
            tern_buf_clear(&piece);
            tern_token_piece(e->tok, ids[i], TERN_TOK_PARSE_SPECIAL, &piece);
            json_t *pv = json_stringn(piece.data ? piece.data : "", piece.len);
            if (!pv) { /* a partial UTF-8 sequence: give the bytes */
                pv = json_array();
                for (size_t k = 0; k < piece.len; k++) json_array_append_new(pv, json_integer((unsigned char)piece.data[k]));
            }
            json_array_append_new(arr, json_pack("{s:i,s:o}", "id", (int)ids[i], "piece", pv));
        } else {
            json_array_append_new(arr, json_integer(ids[i]));
        }
    }
    tern_buf_free(&piece);
    free(ids);
    return json_pack("{s:o}", "tokens", arr);
}

json_t *engine_detokenize(void *self, const json_t *body, struct srv_error *err) {
    struct srv_engine *e = self;
    const json_t *t = json_object_get(body, "tokens");
    if (!json_is_array(t)) {
        srv_error_bad(err, "tokens", "'tokens' must be an array of token ids");
        return NULL;
    }
    size_t n = json_array_size(t);
    int32_t *ids = tern_malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    uint32_t nv = tern_tokenizer_n_vocab(e->tok);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv) {
            free(ids);
            srv_error_bad(err, "tokens", "'tokens[%zu]' must be a token id below %u", i, nv);
            return NULL;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    struct tern_buf out = TERN_BUF_INIT;
    enum tern_status st = tern_detokenize(e->tok, ids, n, TERN_TOK_PARSE_SPECIAL, &out);
    free(ids);
    if (st) {
        tern_buf_free(&out);
        srv_error_set(err, 500, "server_error", NULL, NULL, "detokenize: %s", tern_last_error());
        return NULL;
    }
    /* ids that split or end inside a UTF-8 sequence: replace what is broken (U+FFFD) */
    struct tern_buf text = TERN_BUF_INIT;
    st = tern_utf8_sanitize(&text, out.data ? out.data : "", out.len);
    tern_buf_free(&out);
    json_t *s = st ? NULL : json_stringn(text.data ? text.data : "", text.len);
    tern_buf_free(&text);
    if (!s) {
        srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    return json_pack("{s:o}", "content", s);
}

void engine_metrics(void *self, struct tern_buf *b) {
    struct srv_engine *e = self;
    struct cache_stats cs;
    cache_get_stats(e->cache, &cs);
    tern_buf_puts(b, "# HELP tern_cache_requests_total Requests by reuse tier.\n"
                     "# TYPE tern_cache_requests_total counter\n");
    for (int t = CACHE_TIER_COLD; t < CACHE_TIER_COUNT; t++)
        tern_buf_printf(b, "tern_cache_requests_total{tier=\"%s\"} %llu\n", cache_tier_name((enum cache_tier)t),
                        (unsigned long long)cs.requests_by_tier[t]);
    tern_buf_puts(b, "# HELP tern_cache_declines_total Candidates compared and refused, by reason.\n"
                     "# TYPE tern_cache_declines_total counter\n");
    for (int d = 0; d < CACHE_DECLINE_COUNT; d++)
        tern_buf_printf(b, "tern_cache_declines_total{reason=\"%s\"} %llu\n", cache_decline_name((enum cache_decline)d),
                        (unsigned long long)cs.declines_by_reason[d]);
    tern_buf_printf(b,
                    "# TYPE tern_cache_candidates_total counter\ntern_cache_candidates_total %llu\n"
                    "# TYPE tern_cache_checkpoints_made_total counter\ntern_cache_checkpoints_made_total %llu\n"
                    "# TYPE tern_cache_checkpoint_evictions_total counter\ntern_cache_checkpoint_evictions_total %llu\n"
                    "# TYPE tern_cache_forks_total counter\ntern_cache_forks_total %llu\n"
                    "# TYPE tern_cache_predictions_made_total counter\ntern_cache_predictions_made_total %llu\n"
                    "# TYPE tern_cache_predictions_used_total counter\ntern_cache_predictions_used_total %llu\n"
                    "# TYPE tern_cache_predictions_wasted_total counter\ntern_cache_predictions_wasted_total %llu\n"
                    "# TYPE tern_cache_predict_tokens_total counter\ntern_cache_predict_tokens_total %llu\n",
                    (unsigned long long)cs.candidates, (unsigned long long)cs.ckpts_made,
                    (unsigned long long)cs.ckpt_evictions, (unsigned long long)cs.forks,
                    (unsigned long long)cs.predictions_made, (unsigned long long)cs.predictions_used,
                    (unsigned long long)cs.predictions_wasted, (unsigned long long)cs.predict_tokens);
    tern_buf_printf(b,
                    "# HELP tern_predict_seconds_total Idle time spent rendering and priming predictions.\n"
                    "# TYPE tern_predict_seconds_total counter\ntern_predict_seconds_total %.6f\n"
                    "# TYPE tern_predict_runs_total counter\ntern_predict_runs_total %llu\n"
                    "# TYPE tern_predict_preempted_total counter\ntern_predict_preempted_total %llu\n"
                    "# TYPE tern_predict_skipped_total counter\ntern_predict_skipped_total %llu\n"
                    "# HELP tern_predict_active 1 while predictions of the last conversation are still to be primed.\n"
                    "# TYPE tern_predict_active gauge\ntern_predict_active %d\n",
                    (double)atomic_load(&e->pred_us) * 1e-6, (unsigned long long)atomic_load(&e->pred_runs),
                    (unsigned long long)atomic_load(&e->pred_preempted),
                    (unsigned long long)atomic_load(&e->pred_skipped), atomic_load(&e->pred_active));
    tern_buf_printf(b,
                    "# HELP tern_spec_drafted_tokens_total Tokens proposed by speculative decoding and verified.\n"
                    "# TYPE tern_spec_drafted_tokens_total counter\ntern_spec_drafted_tokens_total %llu\n"
                    "# HELP tern_spec_accepted_tokens_total Drafted tokens the model itself picked.\n"
                    "# TYPE tern_spec_accepted_tokens_total counter\ntern_spec_accepted_tokens_total %llu\n"
                    "# TYPE tern_spec_rounds_total counter\ntern_spec_rounds_total %llu\n"
                    "# HELP tern_spec_refed_tokens_total Tokens read again to bring a hybrid state back after a rejection.\n"
                    "# TYPE tern_spec_refed_tokens_total counter\ntern_spec_refed_tokens_total %llu\n",
                    (unsigned long long)atomic_load(&e->spec_drafted), (unsigned long long)atomic_load(&e->spec_accepted),
                    (unsigned long long)atomic_load(&e->spec_rounds), (unsigned long long)atomic_load(&e->spec_refed));
    tern_buf_printf(b,
                    "# HELP tern_engine_running Requests in the engine's running set (--parallel).\n"
                    "# TYPE tern_engine_running gauge\ntern_engine_running %u\n"
                    "# HELP tern_engine_priming Running requests still reading their prompts.\n"
                    "# TYPE tern_engine_priming gauge\ntern_engine_priming %u\n"
                    "# TYPE tern_engine_parallel gauge\ntern_engine_parallel %u\n"
                    "# TYPE tern_engine_batch_tokens gauge\ntern_engine_batch_tokens %u\n"
                    "# HELP tern_engine_steps_total Engine steps (one forward over a batch each).\n"
                    "# TYPE tern_engine_steps_total counter\ntern_engine_steps_total %llu\n"
                    "# HELP tern_engine_step_rows_total Rows (tokens) evaluated in steps, by kind.\n"
                    "# TYPE tern_engine_step_rows_total counter\n"
                    "tern_engine_step_rows_total{kind=\"decode\"} %llu\n"
                    "tern_engine_step_rows_total{kind=\"prefill\"} %llu\n"
                    "# TYPE tern_engine_step_seconds_total counter\ntern_engine_step_seconds_total %.6f\n"
                    "# HELP tern_engine_step_sequences Steps by the number of requests in their batch.\n"
                    "# TYPE tern_engine_step_sequences histogram\n",
                    atomic_load(&e->n_running), atomic_load(&e->n_priming), e->parallel, e->batch_tokens,
                    (unsigned long long)atomic_load(&e->steps), (unsigned long long)atomic_load(&e->step_decode_rows),
                    (unsigned long long)atomic_load(&e->step_prefill_rows), (double)atomic_load(&e->step_us) * 1e-6);
    uint64_t cum = 0;
    for (int k = 0; k < ENG_STEP_HIST; k++) {
        cum += atomic_load(&e->step_hist[k]);
        if (k + 1 < ENG_STEP_HIST)
            tern_buf_printf(b, "tern_engine_step_sequences_bucket{le=\"%u\"} %llu\n", 1u << k, (unsigned long long)cum);
        else
            tern_buf_printf(b, "tern_engine_step_sequences_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)cum);
    }
    tern_buf_printf(b, "tern_engine_step_sequences_sum %llu\ntern_engine_step_sequences_count %llu\n",
                    (unsigned long long)atomic_load(&e->step_seqs), (unsigned long long)cum);
    tern_buf_printf(b,
                    "# TYPE tern_cache_tokens_cached_total counter\ntern_cache_tokens_cached_total %llu\n"
                    "# TYPE tern_cache_tokens_read_total counter\ntern_cache_tokens_read_total %llu\n"
                    "# TYPE tern_cache_evictions_total counter\ntern_cache_evictions_total %llu\n"
                    "# HELP tern_cache_quota_evictions_total Evictions of a tenant over --cache-ram-per-key.\n"
                    "# TYPE tern_cache_quota_evictions_total counter\ntern_cache_quota_evictions_total %llu\n"
                    "# TYPE tern_cache_pool_bytes gauge\ntern_cache_pool_bytes %zu\n"
                    "# TYPE tern_cache_sessions gauge\ntern_cache_sessions %u\n"
                    "# TYPE tern_cache_checkpoints gauge\ntern_cache_checkpoints %u\n",
                    (unsigned long long)cs.tokens_cached,
                    (unsigned long long)cs.tokens_read, (unsigned long long)cs.evictions,
                    (unsigned long long)cs.quota_evictions, cs.pool_bytes,
                    cs.n_sessions, cs.n_checkpoints);
    if (strcmp(tern_model_device(e->model), "cpu")) {
        struct tern_ckpt_vram_stats v;
        tern_model_ckpt_vram_stats(e->model, &v);
        tern_buf_printf(b,
                        "# HELP tern_cache_vram_budget_bytes Device memory checkpoints may keep (--cache-vram).\n"
                        "# TYPE tern_cache_vram_budget_bytes gauge\ntern_cache_vram_budget_bytes %zu\n"
                        "# HELP tern_cache_vram_bytes Device memory held by checkpoints now.\n"
                        "# TYPE tern_cache_vram_bytes gauge\ntern_cache_vram_bytes %zu\n"
                        "# TYPE tern_cache_vram_checkpoints gauge\ntern_cache_vram_checkpoints %u\n"
                        "# HELP tern_cache_vram_kept_total Checkpoints made in device memory.\n"
                        "# TYPE tern_cache_vram_kept_total counter\ntern_cache_vram_kept_total %llu\n"
                        "# HELP tern_cache_vram_spilled_total Checkpoints moved to host memory (over the budget).\n"
                        "# TYPE tern_cache_vram_spilled_total counter\ntern_cache_vram_spilled_total %llu\n"
                        "# HELP tern_cache_vram_fallbacks_total Checkpoints made in host memory: no room on the device.\n"
                        "# TYPE tern_cache_vram_fallbacks_total counter\ntern_cache_vram_fallbacks_total %llu\n"
                        "# HELP tern_cache_vram_restores_total Restores and forks from a checkpoint, by where it was.\n"
                        "# TYPE tern_cache_vram_restores_total counter\n"
                        "tern_cache_vram_restores_total{from=\"device\"} %llu\n"
                        "tern_cache_vram_restores_total{from=\"host\"} %llu\n",
                        v.budget, v.bytes, v.n, (unsigned long long)v.kept, (unsigned long long)v.spilled,
                        (unsigned long long)v.fallbacks, (unsigned long long)v.restores_device,
                        (unsigned long long)v.restores_host);
    }
    if (cs.disk_on)
        tern_buf_printf(b,
                        "# HELP tern_cache_disk_writes_total Conversations written to the disk tier (--cache-dir).\n"
                        "# TYPE tern_cache_disk_writes_total counter\ntern_cache_disk_writes_total %llu\n"
                        "# TYPE tern_cache_disk_write_bytes_total counter\ntern_cache_disk_write_bytes_total %llu\n"
                        "# HELP tern_cache_disk_write_errors_total Writes that failed (disk full, over the budget): "
                        "the conversation stayed in RAM only.\n"
                        "# TYPE tern_cache_disk_write_errors_total counter\ntern_cache_disk_write_errors_total %llu\n"
                        "# TYPE tern_cache_disk_loads_total counter\ntern_cache_disk_loads_total %llu\n"
                        "# TYPE tern_cache_disk_load_bytes_total counter\ntern_cache_disk_load_bytes_total %llu\n"
                        "# HELP tern_cache_disk_invalid_total Files that did not verify (model, layout, checksum, "
                        "size, name) and were deleted.\n"
                        "# TYPE tern_cache_disk_invalid_total counter\ntern_cache_disk_invalid_total %llu\n"
                        "# TYPE tern_cache_disk_evictions_total counter\ntern_cache_disk_evictions_total %llu\n"
                        "# TYPE tern_cache_disk_bytes gauge\ntern_cache_disk_bytes %llu\n"
                        "# TYPE tern_cache_disk_entries gauge\ntern_cache_disk_entries %u\n",
                        (unsigned long long)cs.disk_writes, (unsigned long long)cs.disk_write_bytes,
                        (unsigned long long)cs.disk_write_errors, (unsigned long long)cs.disk_loads,
                        (unsigned long long)cs.disk_load_bytes, (unsigned long long)cs.disk_invalid,
                        (unsigned long long)cs.disk_evictions, (unsigned long long)cs.disk_bytes, cs.disk_entries);
    if (cs.n_tenants)
        tern_buf_puts(b, "# HELP tern_cache_tenant_bytes Parked state by tenant (API key; the label is a hash of "
                         "which key, never the key).\n# TYPE tern_cache_tenant_bytes gauge\n"
                         "# TYPE tern_cache_tenant_sessions gauge\n");
    for (uint32_t i = 0; i < cs.n_tenants; i++)
        tern_buf_printf(b,
                        "tern_cache_tenant_bytes{tenant=\"%016llx\"} %zu\n"
                        "tern_cache_tenant_sessions{tenant=\"%016llx\"} %u\n",
                        (unsigned long long)cs.tenants[i].id, cs.tenants[i].bytes,
                        (unsigned long long)cs.tenants[i].id, cs.tenants[i].sessions);
}
