/* GGUF v3 writer. Metadata is serialized as it is set (one byte buffer in insertion
 * order); tensors are laid out at write time, each at an offset aligned to the file's
 * alignment and padded with zeros, as ggml lays them out. The output depends only on
 * the calls made (no timestamps, no addresses), so equal inputs give equal bytes. */
#include "gguf/gguf.h"

#include "util/buf.h"
#include "util/mem.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_VERSION_OUT 3u
/* Callback tensors are produced in slices of about this many bytes. */
#define FILL_CHUNK_BYTES ((uint64_t)4 << 20)

struct wtensor {
    char *name;
    size_t name_len;
    enum tern_dtype type;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t row_bytes, n_rows, size;
    uint64_t offset;  /* from the data section, set at write time */
    void *data;       /* owned copy, or NULL for callback tensors */
    gguf_fill_fn fill;
    void *user;
};

struct gguf_writer {
    struct tern_buf meta; /* serialized kvs */
    char **keys;
    size_t *key_lens;
    uint64_t n_kv, cap_kv;
    struct wtensor *tensors;
    uint64_t n_tensors, cap_tensors;
    uint32_t alignment;
};

enum tern_status gguf_writer_new(struct gguf_writer **out) {
    *out = tern_calloc(1, sizeof **out);
    if (!*out) return tern_errorf(TERN_ERR_NOMEM, "no memory for a GGUF writer");
    (*out)->alignment = GGUF_DEFAULT_ALIGNMENT;
    return TERN_OK;
}

void gguf_writer_free(struct gguf_writer *w) {
    if (!w) return;
    tern_buf_free(&w->meta);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    free(w->key_lens);
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->tensors);
    free(w);
}

/* ---- metadata --------------------------------------------------------------------- */

static enum tern_status put(struct tern_buf *b, const void *p, size_t n) { return tern_buf_append(b, p, n); }

static enum tern_status put_u32(struct tern_buf *b, uint32_t v) { return put(b, &v, 4); }
static enum tern_status put_u64(struct tern_buf *b, uint64_t v) { return put(b, &v, 8); }

static enum tern_status put_str(struct tern_buf *b, const char *s, uint64_t len) {
    enum tern_status st = put_u64(b, len);
    return st ? st : put(b, s, (size_t)len);
}

/* Starts a kv: checks the key is new, then records it and writes key + type. On error
 * nothing is recorded. The caller appends the value and calls kv_end. */
static enum tern_status kv_begin(struct gguf_writer *w, const char *key, size_t key_len, enum gguf_type type,
                                 size_t *mark) {
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (w->key_lens[i] == key_len && !memcmp(w->keys[i], key, key_len))
            return tern_errorf(TERN_ERR_INVALID, "gguf writer: duplicate key '%s'", key);
    if (w->n_kv == w->cap_kv) {
        uint64_t c = w->cap_kv ? w->cap_kv * 2 : 32;
        char **k = tern_reallocarray(w->keys, (size_t)c, sizeof *k);
        if (!k) return tern_errorf(TERN_ERR_NOMEM, "gguf writer: no memory for keys");
        w->keys = k;
        size_t *l = tern_reallocarray(w->key_lens, (size_t)c, sizeof *l);
        if (!l) return tern_errorf(TERN_ERR_NOMEM, "gguf writer: no memory for keys");
        w->key_lens = l;
        w->cap_kv = c;
    }
    *mark = w->meta.len;
    enum tern_status st = put_str(&w->meta, key, key_len);
    if (!st) st = put_u32(&w->meta, (uint32_t)type);
    if (st) w->meta.len = *mark;
    return st ? tern_errorf(st, "gguf writer: no memory for key '%s'", key) : TERN_OK;
}

static enum tern_status kv_end(struct gguf_writer *w, const char *key, size_t key_len, size_t mark,
                               enum tern_status st) {
    if (!st) {
        char *k = tern_strndup(key, key_len);
        if (k) {
            w->keys[w->n_kv] = k;
            w->key_lens[w->n_kv] = key_len;
            w->n_kv++;
            return TERN_OK;
        }
        st = TERN_ERR_NOMEM;
    }
    w->meta.len = mark;
    if (w->meta.data) w->meta.data[mark] = 0;
    if (st == TERN_ERR_NOMEM) return tern_errorf(st, "gguf writer: no memory for the value of '%s'", key);
    return st;
}

static enum tern_status set_scalar(struct gguf_writer *w, const char *key, enum gguf_type type, const void *v) {
    size_t mark;
    size_t klen = strlen(key);
    enum tern_status st = kv_begin(w, key, klen, type, &mark);
    if (st) return st;
    return kv_end(w, key, klen, mark, put(&w->meta, v, gguf_type_size(type)));
}

enum tern_status gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v) {
    if (!strcmp(key, "general.alignment")) {
        if (v == 0 || (v & (v - 1)))
            return tern_errorf(TERN_ERR_INVALID, "gguf writer: general.alignment %u is not a nonzero power of two", v);
        enum tern_status st = set_scalar(w, key, GGUF_TYPE_UINT32, &v);
        if (!st) w->alignment = v;
        return st;
    }
    return set_scalar(w, key, GGUF_TYPE_UINT32, &v);
}

enum tern_status gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v) {
    return set_scalar(w, key, GGUF_TYPE_INT32, &v);
}

enum tern_status gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v) {
    return set_scalar(w, key, GGUF_TYPE_UINT64, &v);
}

enum tern_status gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v) {
    return set_scalar(w, key, GGUF_TYPE_FLOAT32, &v);
}

enum tern_status gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, GGUF_TYPE_BOOL, &b);
}

static enum tern_status set_str_n(struct gguf_writer *w, const char *key, size_t klen, const char *s, uint64_t len) {
    size_t mark;
    enum tern_status st = kv_begin(w, key, klen, GGUF_TYPE_STRING, &mark);
    if (st) return st;
    return kv_end(w, key, klen, mark, put_str(&w->meta, s, len));
}

enum tern_status gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v) {
    return set_str_n(w, key, strlen(key), v, strlen(v));
}

static enum tern_status set_arr_n(struct gguf_writer *w, const char *key, size_t klen, enum gguf_type elem,
                                  const void *data, uint64_t n) {
    size_t es = gguf_type_size(elem);
    if (!es)
        return tern_errorf(TERN_ERR_INVALID, "gguf writer: '%s': array element type %s is not numeric "
                           "(use gguf_writer_set_arr_str for strings; nested arrays are not allowed)",
                           key, gguf_type_name(elem));
    size_t bytes;
    if (n > SIZE_MAX || tern_mul_overflow((size_t)n, es, &bytes))
        return tern_errorf(TERN_ERR_INVALID, "gguf writer: '%s': array of %" PRIu64 " elements is too large", key, n);
    if (elem == GGUF_TYPE_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return tern_errorf(TERN_ERR_INVALID, "gguf writer: '%s': bool element %" PRIu64 " is not 0 or 1",
                                   key, i);
    size_t mark;
    enum tern_status st = kv_begin(w, key, klen, GGUF_TYPE_ARRAY, &mark);
    if (st) return st;
    st = put_u32(&w->meta, (uint32_t)elem);
    if (!st) st = put_u64(&w->meta, n);
    if (!st && bytes) st = put(&w->meta, data, bytes);
    return kv_end(w, key, klen, mark, st);
}

enum tern_status gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_type elem,
                                     const void *data, uint64_t n) {
    return set_arr_n(w, key, strlen(key), elem, data, n);
}

static enum tern_status set_arr_str_n(struct gguf_writer *w, const char *key, size_t klen,
                                      const struct gguf_str *strs, uint64_t n) {
    size_t mark;
    enum tern_status st = kv_begin(w, key, klen, GGUF_TYPE_ARRAY, &mark);
    if (st) return st;
    st = put_u32(&w->meta, GGUF_TYPE_STRING);
    if (!st) st = put_u64(&w->meta, n);
    for (uint64_t i = 0; i < n && !st; i++) st = put_str(&w->meta, strs[i].ptr, strs[i].len);
    return kv_end(w, key, klen, mark, st);
}

enum tern_status gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const struct gguf_str *strs,
                                         uint64_t n) {
    return set_arr_str_n(w, key, strlen(key), strs, n);
}

enum tern_status gguf_writer_set_kv(struct gguf_writer *w, const struct gguf_kv *kv) {
    const char *key = kv->key.ptr;
    size_t klen = (size_t)kv->key.len;
    if (klen == strlen(key) && !strcmp(key, "general.alignment")) {
        if (kv->type != GGUF_TYPE_UINT32)
            return tern_errorf(TERN_ERR_INVALID, "gguf writer: general.alignment must be u32, not %s",
                               gguf_type_name(kv->type));
        return gguf_writer_set_u32(w, key, (uint32_t)kv->v.u64);
    }
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
    } v;
    switch (kv->type) {
    case GGUF_TYPE_UINT8: v.u8 = (uint8_t)kv->v.u64; break;
    case GGUF_TYPE_INT8: v.i8 = (int8_t)kv->v.i64; break;
    case GGUF_TYPE_UINT16: v.u16 = (uint16_t)kv->v.u64; break;
    case GGUF_TYPE_INT16: v.i16 = (int16_t)kv->v.i64; break;
    case GGUF_TYPE_UINT32: v.u32 = (uint32_t)kv->v.u64; break;
    case GGUF_TYPE_INT32: v.i32 = (int32_t)kv->v.i64; break;
    case GGUF_TYPE_UINT64: v.u64 = kv->v.u64; break;
    case GGUF_TYPE_INT64: v.i64 = kv->v.i64; break;
    case GGUF_TYPE_FLOAT32: v.f32 = (float)kv->v.f64; break;
    case GGUF_TYPE_FLOAT64: v.f64 = kv->v.f64; break;
    case GGUF_TYPE_BOOL: v.u8 = kv->v.b ? 1 : 0; break;
    case GGUF_TYPE_STRING: return set_str_n(w, key, klen, kv->v.str.ptr, kv->v.str.len);
    case GGUF_TYPE_ARRAY:
        if (kv->v.arr.type == GGUF_TYPE_STRING) return set_arr_str_n(w, key, klen, kv->v.arr.strs, kv->v.arr.n);
        return set_arr_n(w, key, klen, kv->v.arr.type, kv->v.arr.data, kv->v.arr.n);
    default: return tern_errorf(TERN_ERR_INVALID, "gguf writer: '%s': invalid value type %d", key, (int)kv->type);
    }
    size_t mark;
    enum tern_status st = kv_begin(w, key, klen, kv->type, &mark);
    if (st) return st;
    return kv_end(w, key, klen, mark, put(&w->meta, &v, gguf_type_size(kv->type)));
}

/* ---- tensors ---------------------------------------------------------------------- */

static enum tern_status tensor_new(struct gguf_writer *w, const char *name, enum tern_dtype type, uint32_t n_dims,
                                   const uint64_t *ne, struct wtensor **out) {
    size_t nlen = strlen(name);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].name_len == nlen && !memcmp(w->tensors[i].name, name, nlen))
            return tern_errorf(TERN_ERR_INVALID, "gguf writer: duplicate tensor '%s'", name);
    const struct tern_dtype_info *info = tern_dtype_info((uint32_t)type);
    if (!info) return tern_errorf(TERN_ERR_INVALID, "gguf writer: tensor '%s': unknown type %d", name, (int)type);
    if (n_dims == 0 || n_dims > GGUF_MAX_DIMS)
        return tern_errorf(TERN_ERR_INVALID, "gguf writer: tensor '%s': n_dims %u is outside 1..%d", name, n_dims,
                           GGUF_MAX_DIMS);
    struct wtensor t = {.type = type, .n_dims = n_dims};
    uint64_t n_rows = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || t.ne[d] > (uint64_t)INT64_MAX)
            return tern_errorf(TERN_ERR_INVALID, "gguf writer: tensor '%s': dimension %u is %" PRIu64, name, d,
                               t.ne[d]);
        if (d > 0 && tern_mul_overflow_u64(n_rows, t.ne[d], &n_rows))
            return tern_errorf(TERN_ERR_INVALID, "gguf writer: tensor '%s': shape overflows", name);
    }
    if (!tern_dtype_row_size(type, t.ne[0], &t.row_bytes))
        return tern_errorf(TERN_ERR_INVALID, "gguf writer: tensor '%s' (%s): row length %" PRIu64
                           " is not a multiple of the block size %u", name, info->name, t.ne[0], info->blck_size);
    t.n_rows = n_rows;
    if (tern_mul_overflow_u64(t.row_bytes, n_rows, &t.size) || t.size > SIZE_MAX / 2)
        return tern_errorf(TERN_ERR_INVALID, "gguf writer: tensor '%s': byte size overflows", name);
    if (w->n_tensors == w->cap_tensors) {
        uint64_t c = w->cap_tensors ? w->cap_tensors * 2 : 64;
        struct wtensor *p = tern_reallocarray(w->tensors, (size_t)c, sizeof *p);
        if (!p) return tern_errorf(TERN_ERR_NOMEM, "gguf writer: no memory for tensor '%s'", name);
        w->tensors = p;
        w->cap_tensors = c;
    }
    t.name = tern_strndup(name, nlen);
    if (!t.name) return tern_errorf(TERN_ERR_NOMEM, "gguf writer: no memory for tensor '%s'", name);
    t.name_len = nlen;
    w->tensors[w->n_tensors] = t;
    *out = &w->tensors[w->n_tensors];
    return TERN_OK;
}

enum tern_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum tern_dtype type,
                                        uint32_t n_dims, const uint64_t *ne, const void *data, uint64_t size) {
    struct wtensor *t;
    enum tern_status st = tensor_new(w, name, type, n_dims, ne, &t);
    if (st) return st;
    if (size != t->size) {
        free(t->name);
        return tern_errorf(TERN_ERR_INVALID, "gguf writer: tensor '%s': %" PRIu64 " bytes given, its type and shape "
                           "need %" PRIu64, name, size, t->size);
    }
    t->data = tern_malloc((size_t)size);
    if (!t->data) {
        free(t->name);
        return tern_errorf(TERN_ERR_NOMEM, "gguf writer: no memory for the %" PRIu64 " bytes of tensor '%s'", size,
                           name);
    }
    memcpy(t->data, data, (size_t)size);
    w->n_tensors++;
    return TERN_OK;
}

enum tern_status gguf_writer_add_tensor_cb(struct gguf_writer *w, const char *name, enum tern_dtype type,
                                           uint32_t n_dims, const uint64_t *ne, gguf_fill_fn fill, void *user) {
    struct wtensor *t;
    enum tern_status st = tensor_new(w, name, type, n_dims, ne, &t);
    if (st) return st;
    t->fill = fill;
    t->user = user;
    w->n_tensors++;
    return TERN_OK;
}

/* ---- output ----------------------------------------------------------------------- */

/* Where bytes go: a stdio stream or a memory block of known size. */
struct sink {
    FILE *fp;
    const char *path;
    uint8_t *mem;
    size_t pos;
};

static enum tern_status sink_write(struct sink *s, const void *p, size_t n) {
    if (!n) return TERN_OK;
    if (s->mem) {
        memcpy(s->mem + s->pos, p, n);
        s->pos += n;
        return TERN_OK;
    }
    if (fwrite(p, 1, n, s->fp) != n)
        return tern_errorf(TERN_ERR_IO, "gguf writer: writing %s failed: %s", s->path, strerror(errno));
    s->pos += n;
    return TERN_OK;
}

static enum tern_status sink_pad(struct sink *s, uint32_t alignment) {
    static const uint8_t zeros[256];
    size_t pad = (alignment - s->pos % alignment) % alignment;
    while (pad) {
        size_t n = pad < sizeof zeros ? pad : sizeof zeros;
        enum tern_status st = sink_write(s, zeros, n);
        if (st) return st;
        pad -= n;
    }
    return TERN_OK;
}

/* Lays the tensors out and serializes header + kvs + tensor infos into hdr (unpadded).
 * Returns the total file size in *total. */
static enum tern_status layout(struct gguf_writer *w, struct tern_buf *hdr, uint64_t *total) {
    uint64_t a = w->alignment, off = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        struct wtensor *t = &w->tensors[i];
        t->offset = off;
        uint64_t padded = t->size + (a - t->size % a) % a;
        if (tern_add_overflow_u64(off, padded, &off))
            return tern_errorf(TERN_ERR_INVALID, "gguf writer: total tensor size overflows");
    }
    enum tern_status st = put_u32(hdr, 0x46554747u);
    if (!st) st = put_u32(hdr, GGUF_VERSION_OUT);
    if (!st) st = put_u64(hdr, w->n_tensors);
    if (!st) st = put_u64(hdr, w->n_kv);
    if (!st) st = put(hdr, w->meta.data, w->meta.len);
    for (uint64_t i = 0; i < w->n_tensors && !st; i++) {
        const struct wtensor *t = &w->tensors[i];
        st = put_str(hdr, t->name, t->name_len);
        if (!st) st = put_u32(hdr, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && !st; d++) st = put_u64(hdr, t->ne[d]);
        if (!st) st = put_u32(hdr, (uint32_t)t->type);
        if (!st) st = put_u64(hdr, t->offset);
    }
    if (st) return tern_errorf(st, "gguf writer: no memory for the header");
    uint64_t data_start = hdr->len + (a - hdr->len % a) % a;
    if (tern_add_overflow_u64(data_start, off, total))
        return tern_errorf(TERN_ERR_INVALID, "gguf writer: file size overflows");
    return TERN_OK;
}

static enum tern_status emit(struct gguf_writer *w, const struct tern_buf *hdr, struct sink *s) {
    enum tern_status st = sink_write(s, hdr->data, hdr->len);
    if (!st) st = sink_pad(s, w->alignment);
    void *chunk = NULL; /* file sinks: one reusable slice buffer */
    uint64_t chunk_cap = 0;
    for (uint64_t i = 0; i < w->n_tensors && !st; i++) {
        const struct wtensor *t = &w->tensors[i];
        if (t->data) {
            st = sink_write(s, t->data, (size_t)t->size);
        } else {
            uint64_t rows_per = TERN_MAX(FILL_CHUNK_BYTES / t->row_bytes, 1);
            rows_per = TERN_MIN(rows_per, t->n_rows);
            uint64_t slice = rows_per * t->row_bytes;
            if (!s->mem && slice > chunk_cap) {
                free(chunk);
                chunk = tern_malloc((size_t)slice);
                chunk_cap = chunk ? slice : 0;
                if (!chunk) st = tern_errorf(TERN_ERR_NOMEM, "gguf writer: no memory for a %" PRIu64 "-byte slice", slice);
            }
            for (uint64_t r0 = 0; r0 < t->n_rows && !st; r0 += rows_per) {
                uint64_t n = TERN_MIN(rows_per, t->n_rows - r0);
                size_t bytes = (size_t)(n * t->row_bytes);
                void *dst = s->mem ? s->mem + s->pos : chunk; /* memory sinks are filled in place */
                st = t->fill(t->user, r0, n, dst);
                if (st) break;
                if (s->mem) s->pos += bytes;
                else st = sink_write(s, dst, bytes);
            }
        }
        if (!st) st = sink_pad(s, w->alignment);
    }
    free(chunk);
    return st;
}

enum tern_status gguf_writer_write_mem(struct gguf_writer *w, void **data, size_t *size) {
    *data = NULL;
    *size = 0;
    struct tern_buf hdr = TERN_BUF_INIT;
    uint64_t total;
    enum tern_status st = layout(w, &hdr, &total);
    if (!st && total > SIZE_MAX) st = tern_errorf(TERN_ERR_NOMEM, "gguf writer: %" PRIu64 " bytes do not fit", total);
    uint8_t *mem = NULL;
    if (!st) {
        mem = tern_malloc((size_t)total);
        if (!mem) st = tern_errorf(TERN_ERR_NOMEM, "gguf writer: no memory for %" PRIu64 " bytes", total);
    }
    if (!st) {
        struct sink s = {.mem = mem};
        st = emit(w, &hdr, &s);
        TERN_ASSERT(st || s.pos == total);
    }
    tern_buf_free(&hdr);
    if (st) {
        free(mem);
        return st;
    }
    *data = mem;
    *size = (size_t)total;
    return TERN_OK;
}

enum tern_status gguf_writer_write(struct gguf_writer *w, const char *path) {
    struct tern_buf hdr = TERN_BUF_INIT;
    uint64_t total;
    enum tern_status st = layout(w, &hdr, &total);
    if (st) {
        tern_buf_free(&hdr);
        return st;
    }
    struct tern_buf tmp = TERN_BUF_INIT;
    if (tern_buf_printf(&tmp, "%s.tmp-XXXXXX", path)) {
        tern_buf_free(&hdr);
        return tern_errorf(TERN_ERR_NOMEM, "gguf writer: no memory for a file name");
    }
    int fd = mkstemp(tmp.data);
    if (fd < 0) {
        st = tern_errorf(TERN_ERR_IO, "gguf writer: cannot create %s: %s", tmp.data, strerror(errno));
        tern_buf_free(&hdr);
        tern_buf_free(&tmp);
        return st;
    }
    if (fchmod(fd, 0644) != 0) { /* mkstemp makes 0600; a model file is meant to be shared */
    }
    FILE *fp = fdopen(fd, "wb");
    if (!fp) {
        st = tern_errorf(TERN_ERR_IO, "gguf writer: fdopen %s: %s", tmp.data, strerror(errno));
        close(fd);
    } else {
        /* Large writes: small ones each pay the kernel's dirty-page throttling. */
        setvbuf(fp, NULL, _IOFBF, (size_t)1 << 20);
        struct sink s = {.fp = fp, .path = tmp.data};
        st = emit(w, &hdr, &s);
        if (fclose(fp) != 0 && !st)
            st = tern_errorf(TERN_ERR_IO, "gguf writer: closing %s failed: %s", tmp.data, strerror(errno));
        if (!st && s.pos != total)
            st = tern_errorf(TERN_ERR_INTERNAL, "gguf writer: wrote %zu bytes, expected %" PRIu64, s.pos, total);
    }
    if (!st && rename(tmp.data, path) != 0)
        st = tern_errorf(TERN_ERR_IO, "gguf writer: cannot rename %s to %s: %s", tmp.data, path, strerror(errno));
    if (st) unlink(tmp.data);
    tern_buf_free(&hdr);
    tern_buf_free(&tmp);
    return st;
}
