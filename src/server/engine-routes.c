/* The engine's other routes: /tokenize, /detokenize, and its lines of /metrics. */
#include "server/engine-impl.h"
#include "server/metrics.h"

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
    srv_metric_head(b, "tern_cache_requests_total", "counter", "Requests by reuse tier.");
    for (int t = CACHE_TIER_COLD; t < CACHE_TIER_COUNT; t++)
        tern_buf_printf(b, "tern_cache_requests_total{tier=\"%s\"} %llu\n", cache_tier_name((enum cache_tier)t),
                        (unsigned long long)cs.requests_by_tier[t]);
    srv_metric_head(b, "tern_cache_declines_total", "counter", "Candidates compared and refused, by reason.");
    for (int d = 0; d < CACHE_DECLINE_COUNT; d++)
        tern_buf_printf(b, "tern_cache_declines_total{reason=\"%s\"} %llu\n", cache_decline_name((enum cache_decline)d),
                        (unsigned long long)cs.declines_by_reason[d]);
    const struct srv_metric cache_rows[] = {
        {"tern_cache_candidates_total", "counter", "Cached states nominated and compared by their bytes.",
         SRV_U(cs.candidates)},
        {"tern_cache_checkpoints_made_total", "counter", "Recurrent-state checkpoints taken.", SRV_U(cs.ckpts_made)},
        {"tern_cache_checkpoint_evictions_total", "counter", "Checkpoints dropped to stay within the budget.",
         SRV_U(cs.ckpt_evictions)},
        {"tern_cache_forks_total", "counter", "States copied from a parked session to serve a request.",
         SRV_U(cs.forks)},
        {"tern_cache_predictions_made_total", "counter", "Predicted next prompts primed while idle.",
         SRV_U(cs.predictions_made)},
        {"tern_cache_predictions_used_total", "counter", "Primed predictions a later request resumed from.",
         SRV_U(cs.predictions_used)},
        {"tern_cache_predictions_wasted_total", "counter", "Primed predictions dropped unused.",
         SRV_U(cs.predictions_wasted)},
        {"tern_cache_predict_tokens_total", "counter", "Tokens read while priming predictions.",
         SRV_U(cs.predict_tokens)},
        {"tern_predict_seconds_total", "counter", "Idle time spent rendering and priming predictions.",
         SRV_F((double)atomic_load(&e->pred_us) * 1e-6)},
        {"tern_predict_runs_total", "counter", "Predictive priming runs started.", SRV_U(atomic_load(&e->pred_runs))},
        {"tern_predict_preempted_total", "counter", "Priming runs stopped early for an arriving request.",
         SRV_U(atomic_load(&e->pred_preempted))},
        {"tern_predict_skipped_total", "counter", "Predictions not primed (nothing to predict, or no room).",
         SRV_U(atomic_load(&e->pred_skipped))},
        {"tern_predict_active", "gauge", "1 while predictions of the last conversation are still to be primed.",
         SRV_U(atomic_load(&e->pred_active))},
        {"tern_spec_drafted_tokens_total", "counter", "Tokens proposed by speculative decoding and verified.",
         SRV_U(atomic_load(&e->spec_drafted))},
        {"tern_spec_accepted_tokens_total", "counter", "Drafted tokens the model itself picked.",
         SRV_U(atomic_load(&e->spec_accepted))},
        {"tern_spec_rounds_total", "counter", "Draft-and-verify rounds.", SRV_U(atomic_load(&e->spec_rounds))},
        {"tern_spec_refed_tokens_total", "counter",
         "Tokens read again to bring a hybrid state back after a rejection.", SRV_U(atomic_load(&e->spec_refed))},
        {"tern_engine_running", "gauge", "Requests in the engine's running set (--parallel).",
         SRV_U(atomic_load(&e->n_running))},
        {"tern_engine_priming", "gauge", "Running requests still reading their prompts.",
         SRV_U(atomic_load(&e->n_priming))},
        {"tern_engine_parallel", "gauge", "Requests the engine runs at once at most (--parallel).",
         SRV_U(e->parallel)},
        {"tern_engine_batch_tokens", "gauge", "Rows one engine step holds at most (--batch-tokens).",
         SRV_U(e->batch_tokens)},
        {"tern_engine_steps_total", "counter", "Engine steps (one forward over a batch each).",
         SRV_U(atomic_load(&e->steps))},
    };
    srv_metrics_put(b, cache_rows, TERN_ARRAY_LEN(cache_rows));
    srv_metric_head(b, "tern_engine_step_rows_total", "counter", "Rows (tokens) evaluated in steps, by kind.");
    tern_buf_printf(b, "tern_engine_step_rows_total{kind=\"decode\"} %llu\ntern_engine_step_rows_total{kind=\"prefill\"} %llu\n",
                    (unsigned long long)atomic_load(&e->step_decode_rows),
                    (unsigned long long)atomic_load(&e->step_prefill_rows));
    const struct srv_metric step_s = {"tern_engine_step_seconds_total", "counter", "Time spent in engine steps.",
                                      SRV_F((double)atomic_load(&e->step_us) * 1e-6)};
    srv_metrics_put(b, &step_s, 1);
    srv_metric_head(b, "tern_engine_step_sequences", "histogram", "Steps by the number of requests in their batch.");
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
    const struct srv_metric pool_rows[] = {
        {"tern_cache_tokens_cached_total", "counter", "Prompt tokens served from a cached state.",
         SRV_U(cs.tokens_cached)},
        {"tern_cache_tokens_read_total", "counter", "Prompt tokens the model read.", SRV_U(cs.tokens_read)},
        {"tern_cache_evictions_total", "counter", "Parked sessions evicted to stay within --cache-ram.",
         SRV_U(cs.evictions)},
        {"tern_cache_quota_evictions_total", "counter", "Evictions of a tenant over --cache-ram-per-key.",
         SRV_U(cs.quota_evictions)},
        {"tern_cache_pool_bytes", "gauge", "Bytes of parked sessions and checkpoints in RAM.", SRV_U(cs.pool_bytes)},
        {"tern_cache_sessions", "gauge", "Parked sessions in RAM.", SRV_U(cs.n_sessions)},
        {"tern_cache_checkpoints", "gauge", "Checkpoints held in RAM.", SRV_U(cs.n_checkpoints)},
    };
    srv_metrics_put(b, pool_rows, TERN_ARRAY_LEN(pool_rows));
    if (strcmp(tern_model_device(e->model), "cpu")) {
        struct tern_ckpt_vram_stats v;
        tern_model_ckpt_vram_stats(e->model, &v);
        const struct srv_metric vram_rows[] = {
            {"tern_cache_vram_budget_bytes", "gauge", "Device memory checkpoints may keep (--cache-vram).",
             SRV_U(v.budget)},
            {"tern_cache_vram_bytes", "gauge", "Device memory held by checkpoints now.", SRV_U(v.bytes)},
            {"tern_cache_vram_checkpoints", "gauge", "Checkpoints held in device memory now.", SRV_U(v.n)},
            {"tern_cache_vram_kept_total", "counter", "Checkpoints made in device memory.", SRV_U(v.kept)},
            {"tern_cache_vram_spilled_total", "counter", "Checkpoints moved to host memory (over the budget).",
             SRV_U(v.spilled)},
            {"tern_cache_vram_fallbacks_total", "counter", "Checkpoints made in host memory: no room on the device.",
             SRV_U(v.fallbacks)},
        };
        srv_metrics_put(b, vram_rows, TERN_ARRAY_LEN(vram_rows));
        uint32_t n_cpu_moe, n_moe;
        tern_model_cpu_moe(e->model, &n_cpu_moe, &n_moe);
        const struct srv_metric moe_rows[] = {
            {"tern_device_moe_layers", "gauge", "MoE layers of the model on the device.", SRV_U(n_moe)},
            {"tern_device_cpu_moe_layers", "gauge",
             "MoE layers whose routed experts stay in host memory and run on the CPU (--cpu-moe, --n-cpu-moe).",
             SRV_U(n_cpu_moe)},
            {"tern_device_cpu_layers", "gauge",
             "Layers whose weight matrices stay in host memory, their matmuls on the CPU (--gpu-layers).",
             SRV_U(tern_model_cpu_layers(e->model))},
        };
        srv_metrics_put(b, moe_rows, TERN_ARRAY_LEN(moe_rows));
        srv_metric_head(b, "tern_cache_vram_restores_total", "counter",
                        "Restores and forks from a checkpoint, by where it was.");
        tern_buf_printf(b,
                        "tern_cache_vram_restores_total{from=\"device\"} %llu\n"
                        "tern_cache_vram_restores_total{from=\"host\"} %llu\n",
                        (unsigned long long)v.restores_device, (unsigned long long)v.restores_host);
    }
    if (cs.disk_on) {
        const struct srv_metric disk_rows[] = {
            {"tern_cache_disk_writes_total", "counter", "Conversations written to the disk tier (--cache-dir).",
             SRV_U(cs.disk_writes)},
            {"tern_cache_disk_write_bytes_total", "counter", "Bytes written to the disk tier.",
             SRV_U(cs.disk_write_bytes)},
            {"tern_cache_disk_write_errors_total", "counter",
             "Writes that failed (disk full, over the budget): the conversation stayed in RAM only.",
             SRV_U(cs.disk_write_errors)},
            {"tern_cache_disk_loads_total", "counter", "Conversations resumed from the disk tier.",
             SRV_U(cs.disk_loads)},
            {"tern_cache_disk_load_bytes_total", "counter", "Bytes read from the disk tier.",
             SRV_U(cs.disk_load_bytes)},
            {"tern_cache_disk_invalid_total", "counter",
             "Files that did not verify (model, layout, checksum, size, name) and were deleted.",
             SRV_U(cs.disk_invalid)},
            {"tern_cache_disk_evictions_total", "counter", "Files deleted to stay within --cache-disk.",
             SRV_U(cs.disk_evictions)},
            {"tern_cache_disk_bytes", "gauge", "Bytes of the disk tier's files.", SRV_U(cs.disk_bytes)},
            {"tern_cache_disk_entries", "gauge", "Conversations in the disk tier.", SRV_U(cs.disk_entries)},
        };
        srv_metrics_put(b, disk_rows, TERN_ARRAY_LEN(disk_rows));
    }
    if (cs.n_tenants) {
        srv_metric_head(b, "tern_cache_tenant_bytes", "gauge",
                        "Parked state by tenant (API key; the label is a hash of which key, never the key).");
        for (uint32_t i = 0; i < cs.n_tenants; i++)
            tern_buf_printf(b, "tern_cache_tenant_bytes{tenant=\"%016llx\"} %zu\n", (unsigned long long)cs.tenants[i].id,
                            cs.tenants[i].bytes);
        srv_metric_head(b, "tern_cache_tenant_sessions", "gauge", "Parked sessions by tenant.");
        for (uint32_t i = 0; i < cs.n_tenants; i++)
            tern_buf_printf(b, "tern_cache_tenant_sessions{tenant=\"%016llx\"} %u\n",
                            (unsigned long long)cs.tenants[i].id, cs.tenants[i].sessions);
    }
}
