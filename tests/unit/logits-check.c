/* Conformance logits checker (see logits-check.h); mirrors check_logits.py. */
#include "logits-check.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lc_ref {
    char name[160];
    size_t n, nv;
    int32_t *prompt;
    int32_t *greedy;
    size_t n_greedy;
    size_t greedy_required;
    float *logits;   /* [n][nv] or NULL when not shipped */
    int32_t *top5_ids;   /* [n][5] */
    float *top5_vals;    /* [n][5] */
    double *margins;     /* [n] */
    double ref_rms;
    bool f32;
    /* tolerance */
    double t_rel;        /* f32: max_abs_rel_to_pos_max */
    double rms_max, rms_strict, top1_margin, top1_min_frac; /* quant */
};

static int32_t *int_array(json_t *a, size_t *n) {
    if (!json_is_array(a)) return NULL;
    *n = json_array_size(a);
    int32_t *p = calloc(*n ? *n : 1, sizeof *p);
    if (!p) return NULL;
    for (size_t i = 0; i < *n; i++) p[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return p;
}

struct lc_ref *lc_ref_load(const char *json_path) {
    json_error_t err;
    json_t *j = json_load_file(json_path, 0, &err);
    if (!j) {
        fprintf(stderr, "logits-check: %s: %s (line %d)\n", json_path, err.text, err.line);
        return NULL;
    }
    struct lc_ref *r = calloc(1, sizeof *r);
    if (!r) goto fail;
    snprintf(r->name, sizeof r->name, "%s:%s", json_string_value(json_object_get(j, "model")),
             json_string_value(json_object_get(j, "prompt_name")));
    r->n = (size_t)json_integer_value(json_object_get(j, "n_tokens"));
    r->nv = (size_t)json_integer_value(json_object_get(j, "n_vocab"));
    size_t np = 0;
    r->prompt = int_array(json_object_get(j, "prompt_ids"), &np);
    r->greedy = int_array(json_object_get(j, "greedy_ids"), &r->n_greedy);
    if (!r->prompt || !r->greedy || np != r->n || r->n == 0 || r->nv == 0) {
        fprintf(stderr, "logits-check: %s: bad prompt_ids / greedy_ids / sizes\n", json_path);
        goto fail;
    }
    r->ref_rms = json_real_value(json_object_get(j, "ref_logits_rms"));
    json_t *tol = json_object_get(j, "tolerance");
    const char *kind = json_string_value(json_object_get(tol, "kind"));
    if (!kind) goto fail;
    r->f32 = !strcmp(kind, "f32");
    r->greedy_required = (size_t)json_integer_value(json_object_get(tol, "greedy_required_prefix"));
    if (r->f32) {
        r->t_rel = json_number_value(json_object_get(tol, "max_abs_rel_to_pos_max"));
    } else {
        r->rms_max = json_number_value(json_object_get(tol, "rms_rel_max"));
        r->rms_strict = json_number_value(json_object_get(tol, "rms_rel_strict"));
        r->top1_margin = json_number_value(json_object_get(tol, "top1_margin"));
        r->top1_min_frac = json_number_value(json_object_get(tol, "top1_min_frac"));
    }
    json_t *top5 = json_object_get(j, "top5"), *margins = json_object_get(j, "margins");
    if (json_array_size(top5) != r->n || json_array_size(margins) != r->n) {
        fprintf(stderr, "logits-check: %s: top5/margins do not have n_tokens entries\n", json_path);
        goto fail;
    }
    r->top5_ids = calloc(r->n * 5, sizeof *r->top5_ids);
    r->top5_vals = calloc(r->n * 5, sizeof *r->top5_vals);
    r->margins = calloc(r->n, sizeof *r->margins);
    if (!r->top5_ids || !r->top5_vals || !r->margins) goto fail;
    for (size_t p = 0; p < r->n; p++) {
        json_t *e = json_array_get(top5, p), *ids = json_object_get(e, "ids"), *vals = json_object_get(e, "values");
        if (json_array_size(ids) != 5 || json_array_size(vals) != 5) goto fail;
        for (size_t i = 0; i < 5; i++) {
            r->top5_ids[p * 5 + i] = (int32_t)json_integer_value(json_array_get(ids, i));
            r->top5_vals[p * 5 + i] = (float)json_number_value(json_array_get(vals, i));
        }
        r->margins[p] = json_number_value(json_array_get(margins, p));
    }
    const char *lf = json_string_value(json_object_get(j, "logits_file"));
    if (lf) {
        char path[4096];
        const char *slash = strrchr(json_path, '/');
        const int dl = slash ? (int)(slash - json_path) : 1;
        snprintf(path, sizeof path, "%.*s/%s", dl, slash ? json_path : ".", lf);
        FILE *f = fopen(path, "rb");
        r->logits = malloc(r->n * r->nv * sizeof(float));
        if (!f || !r->logits || fread(r->logits, sizeof(float), r->n * r->nv, f) != r->n * r->nv ||
            fgetc(f) != EOF) {
            fprintf(stderr, "logits-check: %s: cannot read %zu x %zu floats exactly\n", path, r->n, r->nv);
            if (f) fclose(f);
            goto fail;
        }
        fclose(f);
    }
    json_decref(j);
    return r;
fail:
    json_decref(j);
    lc_ref_free(r);
    return NULL;
}

void lc_ref_free(struct lc_ref *r) {
    if (!r) return;
    free(r->prompt);
    free(r->greedy);
    free(r->logits);
    free(r->top5_ids);
    free(r->top5_vals);
    free(r->margins);
    free(r);
}

const char *lc_ref_name(const struct lc_ref *r) { return r->name; }
size_t lc_ref_n_tokens(const struct lc_ref *r) { return r->n; }
size_t lc_ref_n_vocab(const struct lc_ref *r) { return r->nv; }
const int32_t *lc_ref_prompt(const struct lc_ref *r) { return r->prompt; }
size_t lc_ref_n_greedy(const struct lc_ref *r) { return r->n_greedy; }
const int32_t *lc_ref_greedy(const struct lc_ref *r) { return r->greedy; }
bool lc_ref_is_f32(const struct lc_ref *r) { return r->f32; }

/* First maximum: ties go to the lowest id. */
static size_t argmax(const float *x, size_t n) {
    size_t bi = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[bi]) bi = i;
    return bi;
}

void lc_check(const struct lc_ref *r, const float *cand, const int32_t *greedy, size_t n_greedy, bool strict,
              struct lc_result *res) {
    memset(res, 0, sizeof *res);
    const size_t n = r->n, nv = r->nv;
    double sq = 0.0;
    size_t cnt = 0, top1_dis = 0;
    for (size_t p = 0; p < n; p++) {
        const float *c = cand + p * nv;
        double scale = 0.0, d = 0.0;
        size_t ref_top;
        if (r->logits) {
            const float *rr = r->logits + p * nv;
            for (size_t v = 0; v < nv; v++) {
                scale = fmax(scale, fabs(rr[v]));
                const double e = (double)rr[v] - (double)c[v];
                sq += e * e;
                d = fmax(d, fabs(e));
            }
            cnt += nv;
            ref_top = argmax(rr, nv);
        } else {
            for (size_t i = 0; i < 5; i++) {
                const double rv = r->top5_vals[p * 5 + i];
                scale = fmax(scale, fabs(rv));
                const double e = rv - (double)c[r->top5_ids[p * 5 + i]];
                sq += e * e;
                d = fmax(d, fabs(e));
            }
            cnt += 5;
            ref_top = (size_t)r->top5_ids[p * 5];
        }
        const double rel = scale > 0 ? d / scale : d;
        if (rel > res->max_rel) {
            res->max_rel = rel;
            res->worst_pos = p;
        }
        res->max_abs = fmax(res->max_abs, d);
        if (argmax(c, nv) != ref_top) {
            top1_dis++;
            const double need = r->f32 ? 2 * r->t_rel * scale : r->top1_margin;
            if (r->margins[p] >= need) res->n_top1_bad++;
        }
    }
    res->rms_rel = r->ref_rms > 0 ? sqrt(sq / (double)cnt) / r->ref_rms : 0.0;
    res->top1_frac = 1.0 - (double)top1_dis / (double)n;
    bool pass = res->n_top1_bad == 0;
    if (r->f32) {
        pass = pass && res->max_rel <= r->t_rel;
    } else {
        pass = pass && res->rms_rel <= (strict ? r->rms_strict : r->rms_max);
        if (n >= 100 && res->top1_frac < r->top1_min_frac) pass = false;
    }
    res->greedy_required = r->greedy_required;
    if (greedy) {
        size_t k = 0;
        while (k < r->n_greedy && k < n_greedy && r->greedy[k] == greedy[k]) k++;
        res->greedy_agree = k;
        if (k < r->greedy_required) pass = false;
    }
    res->pass = pass;
    if (r->f32)
        snprintf(res->summary, sizeof res->summary,
                 "%s: max rel %.3g at pos %zu (bound %.1e), top-1 %.3f (%zu bad), greedy %zu/%zu (need %zu): %s",
                 r->name, res->max_rel, res->worst_pos, r->t_rel, res->top1_frac, res->n_top1_bad, res->greedy_agree,
                 r->n_greedy, r->greedy_required, pass ? "PASS" : "FAIL");
    else
        snprintf(res->summary, sizeof res->summary,
                 "%s: RMS rel %.4f (bound %.3g%s, strict %.3g)%s, top-1 %.3f (%zu bad), greedy %zu/%zu (need %zu): %s",
                 r->name, res->rms_rel, strict ? r->rms_strict : r->rms_max, strict ? " strict" : "", r->rms_strict,
                 r->logits ? "" : " [top-5 only]", res->top1_frac, res->n_top1_bad, res->greedy_agree, r->n_greedy,
                 r->greedy_required, pass ? "PASS" : "FAIL");
}
