/* tern inspect FILE [--json] [--all]: what a GGUF file holds (metadata, tensors,
 * totals), as text or as one JSON document. */
#include "cli/cli.h"
#include "cli/opts.h"
#include "gguf/gguf.h"
#include "util/buf.h"
#include "util/mem.h"
#include "util/utf8.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ARR_SHOWN 8       /* array elements shown unless --all */
#define STR_SHOWN 120     /* string bytes shown in text unless --all */

#define STR_(x) #x
#define STR(x) STR_(x)
static const struct cli_spec inspect_cli = {
    "inspect",
    "usage: tern inspect FILE [--json] [--all]\n"
    "\n"
    "Shows what a GGUF file holds: metadata (long arrays abbreviated to their type,\n"
    "count and first " STR(ARR_SHOWN) " elements), tensors (name, type, shape, offset, bytes) and\n"
    "totals (parameters, bytes by type). The file is validated as a model load would.\n"
    "\n",
    NULL,
};

/* ---- text ------------------------------------------------------------------------- */

/* Appends s quoted, with C-style escapes for quotes, backslashes and non-printables;
 * UTF-8 passes through. Stops after max bytes (0 = no limit) with "...". */
static void put_quoted(struct tern_buf *b, const char *s, uint64_t len, uint64_t max) {
    (void)tern_buf_putc(b, '"');
    uint64_t n = max && len > max ? max : len;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') (void)tern_buf_printf(b, "\\%c", c);
        else if (c == '\n') (void)tern_buf_puts(b, "\\n");
        else if (c == '\t') (void)tern_buf_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) (void)tern_buf_printf(b, "\\x%02x", c);
        else (void)tern_buf_putc(b, (char)c);
    }
    (void)tern_buf_putc(b, '"');
    if (n < len) (void)tern_buf_printf(b, "... (%" PRIu64 " bytes)", len);
}

static void put_scalar(struct tern_buf *b, const struct gguf_kv *kv, bool all) {
    switch (kv->type) {
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_INT64: (void)tern_buf_printf(b, "%" PRId64, kv->v.i64); break;
    case GGUF_TYPE_FLOAT32: (void)tern_buf_printf(b, "%.9g", kv->v.f64); break;
    case GGUF_TYPE_FLOAT64: (void)tern_buf_printf(b, "%.17g", kv->v.f64); break;
    case GGUF_TYPE_BOOL: (void)tern_buf_puts(b, kv->v.b ? "true" : "false"); break;
    case GGUF_TYPE_STRING: put_quoted(b, kv->v.str.ptr, kv->v.str.len, all ? 0 : STR_SHOWN); break;
    default: (void)tern_buf_printf(b, "%" PRIu64, kv->v.u64); break;
    }
}

static void put_elem(struct tern_buf *b, const struct gguf_kv *kv, uint64_t i) {
    enum gguf_type t = kv->v.arr.type;
    if (t == GGUF_TYPE_STRING) put_quoted(b, kv->v.arr.strs[i].ptr, kv->v.arr.strs[i].len, 60);
    else if (t == GGUF_TYPE_FLOAT32) (void)tern_buf_printf(b, "%.9g", gguf_arr_get_f64(kv, i));
    else if (t == GGUF_TYPE_FLOAT64) (void)tern_buf_printf(b, "%.17g", gguf_arr_get_f64(kv, i));
    else if (t == GGUF_TYPE_BOOL) (void)tern_buf_puts(b, gguf_arr_get_i64(kv, i) ? "true" : "false");
    else if (t == GGUF_TYPE_UINT64) (void)tern_buf_printf(b, "%" PRIu64, ((const uint64_t *)kv->v.arr.data)[i]);
    else (void)tern_buf_printf(b, "%" PRId64, gguf_arr_get_i64(kv, i));
}

static void put_shape(struct tern_buf *b, const struct gguf_tensor *t) {
    (void)tern_buf_putc(b, '[');
    for (uint32_t d = 0; d < t->n_dims; d++) (void)tern_buf_printf(b, "%s%" PRIu64, d ? ", " : "", t->ne[d]);
    (void)tern_buf_putc(b, ']');
}

struct type_total {
    uint64_t n_tensors, n_params, bytes;
};

static void human(char *out, size_t cap, double v, const char *const *units) {
    int u = 0;
    while (v >= 1000 && units[u + 1]) {
        v /= 1000;
        u++;
    }
    snprintf(out, cap, u ? "%.2f %s" : "%.0f%s", v, units[u]);
}

static void totals(const struct gguf_file *f, struct type_total *by_type, uint64_t *params, uint64_t *bytes) {
    *params = *bytes = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        by_type[t->type].n_tensors++;
        by_type[t->type].n_params += t->n_elements;
        by_type[t->type].bytes += t->size;
        *params += t->n_elements;
        *bytes += t->size;
    }
}

static int print_text(const struct gguf_file *f, bool all) {
    struct tern_buf b = TERN_BUF_INIT;
    (void)tern_buf_printf(&b, "file: %s\n", gguf_path(f));
    (void)tern_buf_printf(&b, "GGUF v%u, %" PRIu64 " bytes, alignment %u, data at offset %" PRIu64 "\n",
                          gguf_version(f), gguf_file_size(f), gguf_alignment(f), gguf_data_offset(f));
    (void)tern_buf_printf(&b, "\nmetadata (%" PRIu64 " keys):\n", gguf_n_kv(f));
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        (void)tern_buf_puts(&b, "  ");
        size_t start = b.len;
        put_quoted(&b, kv->key.ptr, kv->key.len, 0);
        /* Keys are shown bare when they need no escaping (the usual case). */
        if (b.len - start == kv->key.len + 2) {
            memmove(b.data + start, b.data + start + 1, kv->key.len);
            b.len -= 2;
            b.data[b.len] = 0;
        }
        size_t w = b.len - start;
        (void)tern_buf_printf(&b, "%*s ", w < 40 ? (int)(40 - w) : 0, "");
        if (kv->type == GGUF_TYPE_ARRAY) {
            uint64_t n = kv->v.arr.n, shown = all ? n : TERN_MIN(n, (uint64_t)ARR_SHOWN);
            char tname[24];
            snprintf(tname, sizeof tname, "arr[%s]", gguf_type_name(kv->v.arr.type));
            (void)tern_buf_printf(&b, "%-9s %" PRIu64 ": [", tname, n);
            for (uint64_t j = 0; j < shown; j++) {
                if (j) (void)tern_buf_puts(&b, ", ");
                put_elem(&b, kv, j);
            }
            (void)tern_buf_puts(&b, shown < n ? ", ...]" : "]");
        } else {
            (void)tern_buf_printf(&b, "%-9s ", gguf_type_name(kv->type));
            put_scalar(&b, kv, all);
        }
        (void)tern_buf_putc(&b, '\n');
    }
    (void)tern_buf_printf(&b, "\ntensors (%" PRIu64 "):\n", gguf_n_tensors(f));
    if (gguf_n_tensors(f))
        (void)tern_buf_printf(&b, "  %-40s %-7s %-24s %12s %12s\n", "name", "type", "shape", "offset", "bytes");
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        struct tern_buf shape = TERN_BUF_INIT;
        put_shape(&shape, t);
        (void)tern_buf_printf(&b, "  %-40s %-7s %-24s %12" PRIu64 " %12" PRIu64 "\n", t->name.ptr,
                              tern_dtype_name(t->type), shape.data, t->offset, t->size);
        tern_buf_free(&shape);
    }
    struct type_total by_type[TERN_DTYPE_COUNT] = {{0}};
    uint64_t params, bytes;
    totals(f, by_type, &params, &bytes);
    static const char *const pu[] = {"", "K", "M", "B", "T", NULL};
    static const char *const bu[] = {" B", "kB", "MB", "GB", "TB", NULL};
    char hp[32], hb[32];
    human(hp, sizeof hp, (double)params, pu);
    human(hb, sizeof hb, (double)bytes, bu);
    (void)tern_buf_printf(&b, "\ntotals: %" PRIu64 " parameters (%s), %" PRIu64 " bytes (%s) of tensor data\n",
                          params, hp, bytes, hb);
    for (uint32_t t = 0; t < TERN_DTYPE_COUNT; t++) {
        if (!by_type[t].n_tensors) continue;
        human(hb, sizeof hb, (double)by_type[t].bytes, bu);
        (void)tern_buf_printf(&b, "  %-7s %5" PRIu64 " tensors %14" PRIu64 " params %14" PRIu64 " bytes (%s)\n",
                              tern_dtype_name(t), by_type[t].n_tensors, by_type[t].n_params, by_type[t].bytes, hb);
    }
    if (!b.data) return cli_fail("inspect", "out of memory");
    fwrite(b.data, 1, b.len, stdout);
    tern_buf_free(&b);
    return 0;
}

/* ---- JSON ------------------------------------------------------------------------- */

/* A JSON string from bytes that may be invalid UTF-8 or hold NULs: ill-formed bytes
 * become U+FFFD (util/utf8.h's rule), so the document is always valid. */
static json_t *jstr(const char *s, uint64_t len) {
    json_t *j = json_stringn(s, (size_t)len);
    if (j) return j;
    struct tern_buf b = TERN_BUF_INIT;
    j = tern_utf8_sanitize(&b, s, (size_t)len) ? NULL : json_stringn(b.data ? b.data : "", b.len);
    tern_buf_free(&b);
    return j;
}

static json_t *jelem(const struct gguf_kv *kv, uint64_t i) {
    switch (kv->v.arr.type) {
    case GGUF_TYPE_STRING: return jstr(kv->v.arr.strs[i].ptr, kv->v.arr.strs[i].len);
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64: return json_real(gguf_arr_get_f64(kv, i));
    case GGUF_TYPE_BOOL: return json_boolean(gguf_arr_get_i64(kv, i));
    case GGUF_TYPE_UINT64: {
        uint64_t v = ((const uint64_t *)kv->v.arr.data)[i];
        return v > INT64_MAX ? json_real((double)v) : json_integer((json_int_t)v);
    }
    default: return json_integer(gguf_arr_get_i64(kv, i));
    }
}

static json_t *jscalar(const struct gguf_kv *kv) {
    switch (kv->type) {
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_INT64: return json_integer(kv->v.i64);
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64: return json_real(kv->v.f64);
    case GGUF_TYPE_BOOL: return json_boolean(kv->v.b);
    case GGUF_TYPE_STRING: return jstr(kv->v.str.ptr, kv->v.str.len);
    default: return kv->v.u64 > INT64_MAX ? json_real((double)kv->v.u64) : json_integer((json_int_t)kv->v.u64);
    }
}

static int print_json(const struct gguf_file *f, bool all) {
    json_t *doc = json_object();
    json_object_set_new(doc, "path", jstr(gguf_path(f), strlen(gguf_path(f))));
    json_object_set_new(doc, "version", json_integer(gguf_version(f)));
    json_object_set_new(doc, "file_size", json_integer((json_int_t)gguf_file_size(f)));
    json_object_set_new(doc, "alignment", json_integer(gguf_alignment(f)));
    json_object_set_new(doc, "data_offset", json_integer((json_int_t)gguf_data_offset(f)));
    bool has_f64 = false;
    json_t *meta = json_array();
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        json_t *o = json_object();
        json_object_set_new(o, "key", jstr(kv->key.ptr, kv->key.len));
        json_object_set_new(o, "type", json_string(gguf_type_name(kv->type)));
        if (kv->type == GGUF_TYPE_ARRAY) {
            uint64_t n = kv->v.arr.n, shown = all ? n : TERN_MIN(n, (uint64_t)ARR_SHOWN);
            json_object_set_new(o, "elem_type", json_string(gguf_type_name(kv->v.arr.type)));
            json_object_set_new(o, "count", json_integer((json_int_t)n));
            json_t *vals = json_array();
            for (uint64_t j = 0; j < shown; j++) json_array_append_new(vals, jelem(kv, j));
            json_object_set_new(o, "values", vals);
            json_object_set_new(o, "truncated", json_boolean(shown < n));
            has_f64 |= kv->v.arr.type == GGUF_TYPE_FLOAT64;
        } else {
            json_object_set_new(o, "value", jscalar(kv));
            has_f64 |= kv->type == GGUF_TYPE_FLOAT64;
        }
        json_array_append_new(meta, o);
    }
    json_object_set_new(doc, "metadata", meta);
    json_t *tensors = json_array();
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        json_t *o = json_object();
        json_object_set_new(o, "name", jstr(t->name.ptr, t->name.len));
        json_object_set_new(o, "type", json_string(tern_dtype_name(t->type)));
        json_t *shape = json_array();
        for (uint32_t d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer((json_int_t)t->ne[d]));
        json_object_set_new(o, "shape", shape);
        json_object_set_new(o, "offset", json_integer((json_int_t)t->offset));
        json_object_set_new(o, "bytes", json_integer((json_int_t)t->size));
        json_array_append_new(tensors, o);
    }
    json_object_set_new(doc, "tensors", tensors);
    struct type_total by_type[TERN_DTYPE_COUNT] = {{0}};
    uint64_t params, bytes;
    totals(f, by_type, &params, &bytes);
    json_t *tot = json_object();
    json_object_set_new(tot, "parameters", json_integer((json_int_t)params));
    json_object_set_new(tot, "bytes", json_integer((json_int_t)bytes));
    json_t *bt = json_object();
    for (uint32_t t = 0; t < TERN_DTYPE_COUNT; t++) {
        if (!by_type[t].n_tensors) continue;
        json_t *o = json_object();
        json_object_set_new(o, "tensors", json_integer((json_int_t)by_type[t].n_tensors));
        json_object_set_new(o, "parameters", json_integer((json_int_t)by_type[t].n_params));
        json_object_set_new(o, "bytes", json_integer((json_int_t)by_type[t].bytes));
        json_object_set_new(bt, tern_dtype_name(t), o);
    }
    json_object_set_new(tot, "by_type", bt);
    json_object_set_new(doc, "totals", tot);
    /* f32 values print with 9 significant digits (exact for a float, and readable);
     * a file with f64 values gets 17 so that nothing is lost. */
    char *s = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(has_f64 ? 17 : 9));
    json_decref(doc);
    if (!s) return cli_fail("inspect", "out of memory");
    puts(s);
    free(s);
    return 0;
}

static int inspect_main(int argc, char **argv) {
    bool json = false, all = false;
    const struct cli_opt opts[] = {
        CLI_FLAG("json", &json, "one JSON document with the same content"),
        CLI_FLAG("all", &all, "do not abbreviate arrays or long strings"),
        CLI_END,
    };
    int file;
    int c = cli_parse(&inspect_cli, opts, argc, argv, &file);
    if (c >= 0) return c;
    if (file >= argc) return cli_usage_error("inspect", "missing FILE");
    if (file + 1 < argc) return cli_usage_error("inspect", "unexpected argument '%s'", argv[file + 1]);
    struct gguf_file *f;
    enum tern_status st = gguf_open(argv[file], NULL, &f);
    if (st) return cli_fail("inspect", "%s", tern_last_error());
    int rc = json ? print_json(f, all) : print_text(f, all);
    gguf_close(f);
    return rc;
}

TERN_COMMAND("inspect", "show a GGUF file's metadata, tensors and totals (--json)", inspect_main)
