/* GGUF reader: validates everything before it trusts it (see gguf.h).
 *
 * Memory policy: nothing is allocated from a count read in the file until that count
 * has been checked against the bytes that remain, so the memory used is proportional
 * to the header actually present, never to a number an attacker wrote. The kv and
 * tensor tables grow by doubling as entries are parsed; string arrays are measured in
 * a first pass (lengths only) and then copied into one exactly sized block. Every
 * string is copied NUL-terminated and every numeric array is copied 8-byte aligned,
 * so callers may read arrays through typed pointers. */
#include "gguf/gguf.h"

#include "util/hash.h"
#include "util/log.h"
#include "util/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define HEADER_BYTES 24u       /* magic, version, n_tensors, n_kv */
/* The least bytes one kv and one tensor info can occupy in the file: a count check
 * against the remaining bytes uses them to refuse absurd counts before any work. */
#define MIN_KV_BYTES (8u + 4u + 1u)             /* key length, type, 1-byte value */
#define MIN_TENSOR_BYTES (8u + 4u + 8u + 4u + 8u) /* name length, n_dims, 1 dim, type, offset */

/* ---- arena: every string and array copy lives here, freed at once ------------------ */

struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

#define CHUNK_BYTES (64u * 1024u)

static void *arena_alloc(struct chunk **head, size_t n) {
    size_t need = (n + 7u) & ~(size_t)7u;
    if (need < n) return NULL;
    struct chunk *c = *head;
    if (!c || c->cap - c->used < need) {
        size_t cap = need > CHUNK_BYTES ? need : CHUNK_BYTES;
        size_t total;
        if (tern_add_overflow(sizeof(struct chunk), cap, &total)) return NULL;
        c = tern_malloc(total);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = *head;
        *head = c;
    }
    void *p = c->data + c->used;
    c->used += need;
    return p;
}

static void arena_free(struct chunk *c) {
    while (c) {
        struct chunk *next = c->next;
        free(c);
        c = next;
    }
}

/* Zero-length arrays point here rather than at NULL, so memcpy(dst, data, 0) is fine. */
static const _Alignas(16) unsigned char empty_array[16];

/* ---- the file handle -------------------------------------------------------------- */

struct gguf_file {
    char *path;
    const uint8_t *base;
    size_t size;
    void *map;   /* mmap'd region (size bytes), or NULL */
    void *owned; /* heap copy (no_mmap), or NULL */
    bool locked;

    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;

    struct gguf_kv *kvs;
    uint64_t n_kv, cap_kv;
    struct gguf_tensor *tensors;
    uint64_t n_tensors, cap_tensors;

    /* Open-addressing hash tables: slot = index + 1, 0 = empty; mask = n_slots - 1. */
    uint64_t *kv_slots, kv_mask;
    uint64_t *t_slots, t_mask;

    struct chunk *arena;
};

const char *gguf_type_name(enum gguf_type t) {
    static const char *const names[GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
    };
    return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "unknown";
}

size_t gguf_type_size(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

static bool is_int_type(enum gguf_type t) {
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64: return true;
    default: return false;
    }
}

static bool is_signed_type(enum gguf_type t) {
    return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_INT64;
}

static bool is_float_type(enum gguf_type t) { return t == GGUF_TYPE_FLOAT32 || t == GGUF_TYPE_FLOAT64; }

/* ---- cursor over the file bytes ----------------------------------------------------- */

struct rd {
    const uint8_t *p;
    uint64_t size;
    uint64_t pos;
    struct gguf_file *f;
    char what[160]; /* what is being read, for messages: "kv 3 'general.name'" */
};

static uint64_t rd_left(const struct rd *r) { return r->size - r->pos; }

static enum tern_status rd_truncated(const struct rd *r, const char *field, uint64_t need) {
    return tern_errorf(TERN_ERR_FORMAT, "%s: %s needs %" PRIu64 " bytes at offset %" PRIu64
                       " but the file ends at %" PRIu64 " (truncated?)",
                       r->what, field, need, r->pos, r->size);
}

static enum tern_status rd_u32(struct rd *r, const char *field, uint32_t *v) {
    *v = 0;
    if (rd_left(r) < 4) return rd_truncated(r, field, 4);
    memcpy(v, r->p + r->pos, 4);
    r->pos += 4;
    return TERN_OK;
}

static enum tern_status rd_u64(struct rd *r, const char *field, uint64_t *v) {
    *v = 0;
    if (rd_left(r) < 8) return rd_truncated(r, field, 8);
    memcpy(v, r->p + r->pos, 8);
    r->pos += 8;
    return TERN_OK;
}

/* A length-prefixed string, copied NUL-terminated into the arena. */
static enum tern_status rd_str(struct rd *r, const char *field, struct gguf_str *out) {
    uint64_t len;
    enum tern_status st = rd_u64(r, field, &len);
    if (st) return st;
    if (len > rd_left(r))
        return tern_errorf(TERN_ERR_FORMAT, "%s: %s length %" PRIu64 " at offset %" PRIu64
                           " runs past end of file (%" PRIu64 ")",
                           r->what, field, len, r->pos - 8, r->size);
    char *s = arena_alloc(&r->f->arena, (size_t)len + 1);
    if (!s) return tern_errorf(TERN_ERR_NOMEM, "%s: no memory for a %" PRIu64 "-byte %s", r->what, len, field);
    memcpy(s, r->p + r->pos, (size_t)len);
    s[len] = 0;
    r->pos += len;
    out->ptr = s;
    out->len = len;
    return TERN_OK;
}

/* Printable form of a name for messages: at most 64 bytes, no control characters. */
static const char *printable(const struct gguf_str *s, char *buf, size_t cap) {
    size_t n = 0;
    for (uint64_t i = 0; i < s->len && n + 4 < cap; i++) {
        unsigned char c = (unsigned char)s->ptr[i];
        buf[n++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
        if (i == 63 && s->len > 64) {
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
    }
    buf[n] = 0;
    return buf;
}

/* ---- metadata --------------------------------------------------------------------- */

static enum tern_status read_scalar(struct rd *r, enum gguf_type t, struct gguf_kv *kv) {
    size_t n = gguf_type_size(t);
    if (rd_left(r) < n) return rd_truncated(r, "value", n);
    const uint8_t *p = r->p + r->pos;
    switch (t) {
    case GGUF_TYPE_UINT8: kv->v.u64 = p[0]; break;
    case GGUF_TYPE_INT8: kv->v.i64 = (int8_t)p[0]; break;
    case GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); kv->v.i64 = x; break; }
    case GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); kv->v.i64 = x; break; }
    case GGUF_TYPE_UINT64: { uint64_t x; memcpy(&x, p, 8); kv->v.u64 = x; break; }
    case GGUF_TYPE_INT64: { int64_t x; memcpy(&x, p, 8); kv->v.i64 = x; break; }
    case GGUF_TYPE_FLOAT32: { float x; memcpy(&x, p, 4); kv->v.f64 = x; break; }
    case GGUF_TYPE_FLOAT64: { double x; memcpy(&x, p, 8); kv->v.f64 = x; break; }
    case GGUF_TYPE_BOOL:
        if (p[0] > 1)
            return tern_errorf(TERN_ERR_FORMAT, "%s: bool value %u at offset %" PRIu64 " is neither 0 nor 1",
                               r->what, p[0], r->pos);
        kv->v.b = p[0] != 0;
        break;
    default: return tern_errorf(TERN_ERR_INTERNAL, "%s: read_scalar of type %d", r->what, (int)t);
    }
    r->pos += n;
    return TERN_OK;
}

static enum tern_status read_str_array(struct rd *r, uint64_t n, struct gguf_kv *kv) {
    /* Each element needs at least its 8-byte length. */
    if (n > rd_left(r) / 8)
        return tern_errorf(TERN_ERR_FORMAT, "%s: string array count %" PRIu64 " cannot fit in the %" PRIu64
                           " bytes left in the file", r->what, n, rd_left(r));
    /* First pass: lengths only, so the copies are sized from bytes that are present. */
    uint64_t pos = r->pos, total = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        if (r->size - pos < 8)
            return tern_errorf(TERN_ERR_FORMAT, "%s: string %" PRIu64 " of %" PRIu64 ": length at offset %" PRIu64
                               " runs past end of file (%" PRIu64 ")", r->what, i, n, pos, r->size);
        memcpy(&len, r->p + pos, 8);
        pos += 8;
        if (len > r->size - pos)
            return tern_errorf(TERN_ERR_FORMAT, "%s: string %" PRIu64 " of %" PRIu64 ": length %" PRIu64
                               " at offset %" PRIu64 " runs past end of file (%" PRIu64 ")",
                               r->what, i, n, len, pos - 8, r->size);
        pos += len;
        total += len + 1; /* cannot overflow: bounded by the file size plus n */
    }
    size_t strs_bytes;
    if (tern_mul_overflow((size_t)n, sizeof(struct gguf_str), &strs_bytes))
        return tern_errorf(TERN_ERR_NOMEM, "%s: %" PRIu64 " strings overflow size_t", r->what, n);
    struct gguf_str *strs = n ? arena_alloc(&r->f->arena, strs_bytes) : (struct gguf_str *)(void *)empty_array;
    char *chars = total ? arena_alloc(&r->f->arena, (size_t)total) : NULL;
    if (!strs || (total && !chars))
        return tern_errorf(TERN_ERR_NOMEM, "%s: no memory for %" PRIu64 " strings (%" PRIu64 " bytes)", r->what, n, total);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        memcpy(&len, r->p + r->pos, 8);
        r->pos += 8;
        memcpy(chars, r->p + r->pos, (size_t)len);
        chars[len] = 0;
        strs[i].ptr = chars;
        strs[i].len = len;
        chars += len + 1;
        r->pos += len;
    }
    kv->v.arr.strs = strs;
    kv->v.arr.data = NULL;
    return TERN_OK;
}

static enum tern_status read_array(struct rd *r, struct gguf_kv *kv) {
    uint32_t et;
    uint64_t n;
    enum tern_status st = rd_u32(r, "array element type", &et);
    if (st) return st;
    if (et == GGUF_TYPE_ARRAY)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "%s: nested arrays (an array of arrays) are not supported", r->what);
    if (et >= GGUF_TYPE_COUNT)
        return tern_errorf(TERN_ERR_FORMAT, "%s: unknown array element type %u (valid: 0..%d)", r->what, et,
                           GGUF_TYPE_COUNT - 1);
    if ((st = rd_u64(r, "array count", &n))) return st;
    kv->v.arr.type = (enum gguf_type)et;
    kv->v.arr.n = n;
    if (et == GGUF_TYPE_STRING) return read_str_array(r, n, kv);

    size_t es = gguf_type_size((enum gguf_type)et);
    uint64_t bytes;
    if (tern_mul_overflow_u64(n, es, &bytes) || bytes > rd_left(r))
        return tern_errorf(TERN_ERR_FORMAT, "%s: array of %" PRIu64 " %s (%zu bytes each) at offset %" PRIu64
                           " runs past end of file (%" PRIu64 ")",
                           r->what, n, gguf_type_name((enum gguf_type)et), es, r->pos, r->size);
    const uint8_t *src = r->p + r->pos;
    if (et == GGUF_TYPE_BOOL) {
        for (uint64_t i = 0; i < n; i++)
            if (src[i] > 1)
                return tern_errorf(TERN_ERR_FORMAT, "%s: bool element %" PRIu64 " is %u, neither 0 nor 1",
                                   r->what, i, src[i]);
    }
    void *data = (void *)empty_array;
    if (bytes) {
        data = arena_alloc(&r->f->arena, (size_t)bytes);
        if (!data) return tern_errorf(TERN_ERR_NOMEM, "%s: no memory for a %" PRIu64 "-byte array", r->what, bytes);
        memcpy(data, src, (size_t)bytes);
    }
    kv->v.arr.data = data;
    kv->v.arr.strs = NULL;
    r->pos += bytes;
    return TERN_OK;
}

static enum tern_status read_kv(struct rd *r, uint64_t i, uint64_t n_kv, struct gguf_kv *kv) {
    snprintf(r->what, sizeof r->what, "kv %" PRIu64 " of %" PRIu64, i, n_kv);
    enum tern_status st = rd_str(r, "key", &kv->key);
    if (st) return st;
    char name[80];
    snprintf(r->what, sizeof r->what, "kv %" PRIu64 " '%s'", i, printable(&kv->key, name, sizeof name));
    uint32_t t;
    if ((st = rd_u32(r, "value type", &t))) return st;
    if (t >= GGUF_TYPE_COUNT)
        return tern_errorf(TERN_ERR_FORMAT, "%s: unknown value type %u (valid: 0..%d)", r->what, t, GGUF_TYPE_COUNT - 1);
    kv->type = (enum gguf_type)t;
    if (t == GGUF_TYPE_STRING) return rd_str(r, "string", &kv->v.str);
    if (t == GGUF_TYPE_ARRAY) return read_array(r, kv);
    return read_scalar(r, kv->type, kv);
}

/* ---- tensor infos ----------------------------------------------------------------- */

static enum tern_status read_tensor_info(struct rd *r, uint64_t i, uint64_t n_tensors, struct gguf_tensor *t) {
    snprintf(r->what, sizeof r->what, "tensor %" PRIu64 " of %" PRIu64, i, n_tensors);
    enum tern_status st = rd_str(r, "name", &t->name);
    if (st) return st;
    char name[80];
    snprintf(r->what, sizeof r->what, "tensor '%s'", printable(&t->name, name, sizeof name));
    if ((st = rd_u32(r, "n_dims", &t->n_dims))) return st;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return tern_errorf(TERN_ERR_FORMAT, "%s: n_dims %u is outside 1..%d", r->what, t->n_dims, GGUF_MAX_DIMS);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if ((st = rd_u64(r, "dimension", &t->ne[d]))) return st;
        if (t->ne[d] == 0) return tern_errorf(TERN_ERR_FORMAT, "%s: dimension %u is 0", r->what, d);
        if (t->ne[d] > (uint64_t)INT64_MAX || tern_mul_overflow_u64(n_el, t->ne[d], &n_el) ||
            n_el > (uint64_t)INT64_MAX)
            return tern_errorf(TERN_ERR_FORMAT, "%s: dimension %u (%" PRIu64 ") makes the element count overflow 2^63",
                               r->what, d, t->ne[d]);
    }
    t->n_elements = n_el;
    uint32_t type;
    if ((st = rd_u32(r, "type", &type))) return st;
    const struct tern_dtype_info *info = tern_dtype_info(type);
    if (!info) return tern_errorf(TERN_ERR_UNSUPPORTED, "%s has unknown tensor type %u", r->what, type);
    t->type = (enum tern_dtype)type;
    uint64_t row_bytes;
    if (t->ne[0] % info->blck_size)
        return tern_errorf(TERN_ERR_FORMAT, "%s (%s): row length %" PRIu64 " is not a multiple of the block size %u",
                           r->what, info->name, t->ne[0], info->blck_size);
    if (!tern_dtype_row_size(t->type, t->ne[0], &row_bytes) ||
        tern_mul_overflow_u64(row_bytes, n_el / t->ne[0], &t->size))
        return tern_errorf(TERN_ERR_FORMAT, "%s (%s): byte size of %" PRIu64 " elements overflows", r->what,
                           info->name, n_el);
    if ((st = rd_u64(r, "offset", &t->offset))) return st;
    t->data = NULL;
    return TERN_OK;
}

/* ---- hash tables -------------------------------------------------------------------- */

static enum tern_status table_build(uint64_t n, uint64_t **slots_out, uint64_t *mask_out) {
    uint64_t n_slots = 16;
    while (n_slots < 2 * n) n_slots *= 2; /* n is bounded by the file size, so this ends */
    uint64_t *slots = tern_calloc((size_t)n_slots, sizeof *slots);
    if (!slots) return tern_errorf(TERN_ERR_NOMEM, "no memory for a %" PRIu64 "-slot hash table", n_slots);
    *slots_out = slots;
    *mask_out = n_slots - 1;
    return TERN_OK;
}

/* Finds name in a table whose entries are reached through name_at(i). Returns the slot
 * (empty or matching). */
static uint64_t table_probe(const uint64_t *slots, uint64_t mask, const char *s, uint64_t len,
                            const struct gguf_str *(*name_at)(const struct gguf_file *, uint64_t),
                            const struct gguf_file *f) {
    uint64_t h = tern_hash64(s, (size_t)len) & mask;
    for (;;) {
        uint64_t v = slots[h];
        if (!v) return h;
        const struct gguf_str *k = name_at(f, v - 1);
        if (k->len == len && !memcmp(k->ptr, s, (size_t)len)) return h;
        h = (h + 1) & mask;
    }
}

static const struct gguf_str *kv_name(const struct gguf_file *f, uint64_t i) { return &f->kvs[i].key; }
static const struct gguf_str *tensor_name(const struct gguf_file *f, uint64_t i) { return &f->tensors[i].name; }

static enum tern_status index_kvs(struct gguf_file *f) {
    enum tern_status st = table_build(f->n_kv, &f->kv_slots, &f->kv_mask);
    if (st) return st;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const struct gguf_str *k = &f->kvs[i].key;
        uint64_t h = table_probe(f->kv_slots, f->kv_mask, k->ptr, k->len, kv_name, f);
        if (f->kv_slots[h]) {
            char name[80];
            return tern_errorf(TERN_ERR_FORMAT, "duplicate key '%s' (kv %" PRIu64 " and kv %" PRIu64 ")",
                               printable(k, name, sizeof name), f->kv_slots[h] - 1, i);
        }
        f->kv_slots[h] = i + 1;
    }
    return TERN_OK;
}

static enum tern_status index_tensors(struct gguf_file *f) {
    enum tern_status st = table_build(f->n_tensors, &f->t_slots, &f->t_mask);
    if (st) return st;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const struct gguf_str *k = &f->tensors[i].name;
        uint64_t h = table_probe(f->t_slots, f->t_mask, k->ptr, k->len, tensor_name, f);
        if (f->t_slots[h]) {
            char name[80];
            return tern_errorf(TERN_ERR_FORMAT, "duplicate tensor name '%s' (tensor %" PRIu64 " and tensor %" PRIu64 ")",
                               printable(k, name, sizeof name), f->t_slots[h] - 1, i);
        }
        f->t_slots[h] = i + 1;
    }
    return TERN_OK;
}

/* ---- parse ------------------------------------------------------------------------ */

/* Grows a table by doubling so that its size follows the entries actually parsed. */
static enum tern_status grow(void **arr, uint64_t *cap, uint64_t need, size_t elem) {
    if (need <= *cap) return TERN_OK;
    uint64_t c = *cap ? *cap * 2 : 16;
    void *p = tern_reallocarray(*arr, (size_t)c, elem);
    if (!p) return tern_errorf(TERN_ERR_NOMEM, "no memory for %" PRIu64 " table entries", c);
    *arr = p;
    *cap = c;
    return TERN_OK;
}

static enum tern_status parse(struct gguf_file *f, bool no_data) {
    struct rd r = {.p = f->base, .size = f->size, .pos = 0, .f = f};
    snprintf(r.what, sizeof r.what, "header");
    if (f->size < 4)
        return tern_errorf(TERN_ERR_FORMAT, "file is %zu bytes, too short for the GGUF magic", f->size);
    uint32_t magic, version;
    memcpy(&magic, f->base, 4);
    if (magic != GGUF_MAGIC) {
        char shown[8];
        for (int i = 0; i < 4; i++) shown[i] = (f->base[i] >= 0x20 && f->base[i] < 0x7f) ? (char)f->base[i] : '?';
        shown[4] = 0;
        return tern_errorf(TERN_ERR_FORMAT, "bad magic \"%s\" (0x%08x): not a GGUF file", shown, magic);
    }
    r.pos = 4;
    enum tern_status st = rd_u32(&r, "version", &version);
    if (st) return st;
    if (version == 1)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "GGUF version 1 is not supported (only versions 2 and 3)");
    if (version != 2 && version != 3) {
        uint32_t swapped = __builtin_bswap32(version);
        if (swapped >= 1 && swapped <= 3)
            return tern_errorf(TERN_ERR_UNSUPPORTED, "big-endian GGUF (version %u byte-swapped) is not supported",
                               swapped);
        return tern_errorf(TERN_ERR_UNSUPPORTED, "GGUF version %u is not supported (only versions 2 and 3)", version);
    }
    f->version = version;
    uint64_t n_tensors, n_kv;
    if ((st = rd_u64(&r, "tensor count", &n_tensors))) return st;
    if ((st = rd_u64(&r, "kv count", &n_kv))) return st;
    if (n_kv > rd_left(&r) / MIN_KV_BYTES)
        return tern_errorf(TERN_ERR_FORMAT, "kv count %" PRIu64 " cannot fit in the %" PRIu64
                           " bytes after the header (each kv needs at least %u)",
                           n_kv, rd_left(&r), MIN_KV_BYTES);
    if (n_tensors > rd_left(&r) / MIN_TENSOR_BYTES)
        return tern_errorf(TERN_ERR_FORMAT, "tensor count %" PRIu64 " cannot fit in the %" PRIu64
                           " bytes after the header (each tensor info needs at least %u)",
                           n_tensors, rd_left(&r), MIN_TENSOR_BYTES);

    for (uint64_t i = 0; i < n_kv; i++) {
        if ((st = grow((void **)&f->kvs, &f->cap_kv, i + 1, sizeof *f->kvs))) return st;
        struct gguf_kv *kv = &f->kvs[i];
        memset(kv, 0, sizeof *kv);
        if ((st = read_kv(&r, i, n_kv, kv))) return st;
        f->n_kv = i + 1;
    }
    if ((st = index_kvs(f))) return st;

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *akv = gguf_find_kv(f, "general.alignment");
    if (akv) {
        if (akv->type != GGUF_TYPE_UINT32)
            return tern_errorf(TERN_ERR_FORMAT, "general.alignment has type %s, expected u32",
                               gguf_type_name(akv->type));
        uint64_t a = akv->v.u64;
        if (a == 0 || a > UINT32_MAX || (a & (a - 1)))
            return tern_errorf(TERN_ERR_FORMAT, "general.alignment %" PRIu64 " is not a nonzero power of two below 2^32",
                               a);
        f->alignment = (uint32_t)a;
    }

    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((st = grow((void **)&f->tensors, &f->cap_tensors, i + 1, sizeof *f->tensors))) return st;
        struct gguf_tensor *t = &f->tensors[i];
        memset(t, 0, sizeof *t);
        if ((st = read_tensor_info(&r, i, n_tensors, t))) return st;
        f->n_tensors = i + 1;
    }
    if ((st = index_tensors(f))) return st;

    uint64_t a = f->alignment, data_offset;
    if (tern_add_overflow_u64(r.pos, a - 1, &data_offset))
        return tern_errorf(TERN_ERR_FORMAT, "data offset overflows");
    data_offset -= data_offset % a;
    f->data_offset = data_offset;

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        struct gguf_tensor *t = &f->tensors[i];
        char name[80];
        printable(&t->name, name, sizeof name);
        if (t->offset % a)
            return tern_errorf(TERN_ERR_FORMAT, "tensor '%s' offset %" PRIu64 " is not a multiple of the alignment %u",
                               name, t->offset, f->alignment);
        uint64_t start, end;
        bool overflow = tern_add_overflow_u64(data_offset, t->offset, &start) ||
                        tern_add_overflow_u64(start, t->size, &end);
        if (overflow || end > f->size) {
            if (no_data) continue;
            if (overflow)
                return tern_errorf(TERN_ERR_FORMAT, "tensor '%s' offset %" PRIu64 " + %" PRIu64
                                   " bytes overflows (data section at %" PRIu64 ")",
                                   name, t->offset, t->size, data_offset);
            return tern_errorf(TERN_ERR_FORMAT, "tensor '%s' offset %" PRIu64 " + %" PRIu64
                               " bytes runs past end of file (%zu)", name, start, t->size, f->size);
        }
        t->data = f->base + start;
    }
    return TERN_OK;
}

static void file_free(struct gguf_file *f) {
    if (!f) return;
    if (f->map) {
        if (f->locked) munlock(f->map, f->size);
        munmap(f->map, f->size);
    }
    tern_aligned_free(f->owned);
    free(f->kvs);
    free(f->tensors);
    free(f->kv_slots);
    free(f->t_slots);
    arena_free(f->arena);
    free(f->path);
    free(f);
}

void gguf_close(struct gguf_file *f) { file_free(f); }

static enum tern_status file_new(const char *path, struct gguf_file **out) {
    struct gguf_file *f = tern_calloc(1, sizeof *f);
    if (!f) return tern_errorf(TERN_ERR_NOMEM, "no memory for a GGUF handle");
    f->path = tern_strdup(path);
    if (!f->path) {
        free(f);
        return tern_errorf(TERN_ERR_NOMEM, "no memory for a GGUF handle");
    }
    *out = f;
    return TERN_OK;
}

enum tern_status gguf_open_mem(const void *data, size_t size, struct gguf_file **out) {
    *out = NULL;
    struct gguf_file *f;
    enum tern_status st = file_new("", &f);
    if (st) return st;
    f->base = size ? data : empty_array;
    f->size = size;
    if ((st = parse(f, false))) {
        file_free(f);
        return st;
    }
    *out = f;
    return TERN_OK;
}

static enum tern_status read_all(int fd, const char *path, void *buf, size_t size) {
    size_t done = 0;
    while (done < size) {
        ssize_t n = pread(fd, (char *)buf + done, size - done, (off_t)done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return tern_errorf(TERN_ERR_IO, "%s: read failed at offset %zu: %s", path, done, strerror(errno));
        if (n == 0) return tern_errorf(TERN_ERR_IO, "%s: file shrank while reading (%zu of %zu bytes)", path, done, size);
        done += (size_t)n;
    }
    return TERN_OK;
}

enum tern_status gguf_open(const char *path, const struct gguf_open_opts *opts, struct gguf_file **out) {
    static const struct gguf_open_opts defaults = {0};
    if (!opts) opts = &defaults;
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tern_errorf(TERN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return tern_errorf(TERN_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return tern_errorf(TERN_ERR_IO, "%s is not a regular file", path);
    }
    if (sb.st_size < (off_t)HEADER_BYTES) {
        close(fd);
        return tern_errorf(TERN_ERR_FORMAT, "%s: file is %lld bytes, shorter than the %u-byte GGUF header", path,
                           (long long)sb.st_size, HEADER_BYTES);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return tern_errorf(TERN_ERR_IO, "%s: file too large to address", path);
    }
    struct gguf_file *f;
    enum tern_status st = file_new(path, &f);
    if (st) {
        close(fd);
        return st;
    }
    f->size = (size_t)sb.st_size;
    if (opts->no_mmap) {
        f->owned = tern_aligned_alloc(f->size);
        if (!f->owned) {
            st = tern_errorf(TERN_ERR_NOMEM, "%s: no memory to read %zu bytes", path, f->size);
        } else {
#ifdef MADV_HUGEPAGE
            /* Decode streams every weight once per token: 2 MiB pages spare it a TLB
             * miss every 4 KiB (advice only; where it is refused the pages stay small). */
            const uintptr_t a0 = ((uintptr_t)f->owned + 4095) & ~(uintptr_t)4095;
            const uintptr_t a1 = ((uintptr_t)f->owned + f->size) & ~(uintptr_t)4095;
            if (a1 > a0) (void)madvise((void *)a0, a1 - a0, MADV_HUGEPAGE);
#endif
            st = read_all(fd, path, f->owned, f->size);
            f->base = f->owned;
        }
    } else {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            st = tern_errorf(TERN_ERR_IO, "cannot map %s (%zu bytes): %s", path, f->size, strerror(errno));
        } else {
            f->map = m;
            f->base = m;
#ifdef MADV_HUGEPAGE
            /* Where the kernel collapses read-only file pages into 2 MiB ones, let it
             * (advice only; most kernels leave a file mapping in 4 KiB pages). */
            (void)madvise(m, f->size, MADV_HUGEPAGE);
#endif
        }
    }
    close(fd);
    if (!st && opts->mlock) {
        void *p = f->map ? f->map : f->owned;
        if (mlock(p, f->size) == 0) {
            f->locked = f->map != NULL;
        } else {
            TERN_LOG_WARN("%s: mlock of %zu bytes failed (%s); raise RLIMIT_MEMLOCK (ulimit -l) to pin the weights",
                          path, f->size, strerror(errno));
        }
    }
    if (!st) st = parse(f, opts->no_data);
    if (st) {
        if (st != TERN_ERR_IO) tern_error_prefix(st, "%s", path);
        file_free(f);
        return st;
    }
    *out = f;
    return TERN_OK;
}

/* ---- accessors -------------------------------------------------------------------- */

uint32_t gguf_version(const struct gguf_file *f) { return f->version; }
uint32_t gguf_alignment(const struct gguf_file *f) { return f->alignment; }
uint64_t gguf_data_offset(const struct gguf_file *f) { return f->data_offset; }
uint64_t gguf_file_size(const struct gguf_file *f) { return f->size; }
const char *gguf_path(const struct gguf_file *f) { return f->path; }

uint64_t gguf_n_kv(const struct gguf_file *f) { return f->n_kv; }

const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, uint64_t i) { return i < f->n_kv ? &f->kvs[i] : NULL; }

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key) {
    if (!f->kv_slots) return NULL;
    uint64_t h = table_probe(f->kv_slots, f->kv_mask, key, strlen(key), kv_name, f);
    return f->kv_slots[h] ? &f->kvs[f->kv_slots[h] - 1] : NULL;
}

uint64_t gguf_n_tensors(const struct gguf_file *f) { return f->n_tensors; }

const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, uint64_t i) {
    return i < f->n_tensors ? &f->tensors[i] : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name) {
    if (!f->t_slots) return NULL;
    uint64_t h = table_probe(f->t_slots, f->t_mask, name, strlen(name), tensor_name, f);
    return f->t_slots[h] ? &f->tensors[f->t_slots[h] - 1] : NULL;
}

/* ---- typed getters ---------------------------------------------------------------- */

static enum tern_status not_found(const char *key) {
    return tern_errorf(TERN_ERR_INVALID, "key not found: '%s'", key);
}

static enum tern_status wrong_type(const struct gguf_kv *kv, const char *key, const char *want) {
    return tern_errorf(TERN_ERR_FORMAT, "key '%s' has type %s, expected %s", key, gguf_type_name(kv->type), want);
}

/* An integer kv's value within [lo, hi] (as signed/unsigned 64-bit ranges allow). */
static enum tern_status kv_int(const struct gguf_kv *kv, const char *key, bool want_signed, uint64_t hi_u,
                               int64_t lo_i, int64_t hi_i, uint64_t *u, int64_t *s) {
    if (!is_int_type(kv->type)) return wrong_type(kv, key, "an integer");
    if (is_signed_type(kv->type)) {
        int64_t v = kv->v.i64;
        if (want_signed ? (v < lo_i || v > hi_i) : (v < 0 || (uint64_t)v > hi_u))
            return tern_errorf(TERN_ERR_FORMAT, "key '%s' value %" PRId64 " is out of range", key, v);
        if (want_signed) *s = v; else *u = (uint64_t)v;
    } else {
        uint64_t v = kv->v.u64;
        if (want_signed ? v > (uint64_t)hi_i : v > hi_u)
            return tern_errorf(TERN_ERR_FORMAT, "key '%s' value %" PRIu64 " is out of range", key, v);
        if (want_signed) *s = (int64_t)v; else *u = v;
    }
    return TERN_OK;
}

enum tern_status gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return not_found(key);
    uint64_t u;
    enum tern_status st = kv_int(kv, key, false, UINT32_MAX, 0, 0, &u, NULL);
    if (!st) *out = (uint32_t)u;
    return st;
}

enum tern_status gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return not_found(key);
    return kv_int(kv, key, false, UINT64_MAX, 0, 0, out, NULL);
}

enum tern_status gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return not_found(key);
    return kv_int(kv, key, true, 0, INT64_MIN, INT64_MAX, NULL, out);
}

enum tern_status gguf_get_f32(const struct gguf_file *f, const char *key, float *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return not_found(key);
    if (is_float_type(kv->type)) *out = (float)kv->v.f64;
    else if (is_signed_type(kv->type)) *out = (float)kv->v.i64;
    else if (is_int_type(kv->type)) *out = (float)kv->v.u64;
    else return wrong_type(kv, key, "a number");
    return TERN_OK;
}

enum tern_status gguf_get_bool(const struct gguf_file *f, const char *key, bool *out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return not_found(key);
    if (kv->type != GGUF_TYPE_BOOL) return wrong_type(kv, key, "bool");
    *out = kv->v.b;
    return TERN_OK;
}

enum tern_status gguf_get_str(const struct gguf_file *f, const char *key, const struct gguf_str **out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return not_found(key);
    if (kv->type != GGUF_TYPE_STRING) return wrong_type(kv, key, "str");
    *out = &kv->v.str;
    return TERN_OK;
}

enum tern_status gguf_get_u32_or(const struct gguf_file *f, const char *key, uint32_t def, uint32_t *out) {
    if (!gguf_find_kv(f, key)) {
        *out = def;
        return TERN_OK;
    }
    return gguf_get_u32(f, key, out);
}

enum tern_status gguf_get_f32_or(const struct gguf_file *f, const char *key, float def, float *out) {
    if (!gguf_find_kv(f, key)) {
        *out = def;
        return TERN_OK;
    }
    return gguf_get_f32(f, key, out);
}

enum tern_status gguf_get_bool_or(const struct gguf_file *f, const char *key, bool def, bool *out) {
    if (!gguf_find_kv(f, key)) {
        *out = def;
        return TERN_OK;
    }
    return gguf_get_bool(f, key, out);
}

enum tern_status gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_type elem,
                              const struct gguf_kv **out) {
    const struct gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return not_found(key);
    if (kv->type != GGUF_TYPE_ARRAY)
        return tern_errorf(TERN_ERR_FORMAT, "key '%s' has type %s, expected an array of %s", key,
                           gguf_type_name(kv->type), gguf_type_name(elem));
    enum gguf_type et = kv->v.arr.type;
    bool ok = et == elem || (is_int_type(elem) && is_int_type(et)) || (is_float_type(elem) && is_float_type(et));
    if (!ok)
        return tern_errorf(TERN_ERR_FORMAT, "key '%s' is an array of %s, expected an array of %s", key,
                           gguf_type_name(et), gguf_type_name(elem));
    *out = kv;
    return TERN_OK;
}

/* Float to integer without undefined behaviour: NaN gives 0, out-of-range values clamp. */
static int64_t f64_to_i64(double x) {
    if (!(x == x)) return 0;
    if (x >= 9223372036854775807.0) return INT64_MAX;
    if (x <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)x;
}

int64_t gguf_arr_get_i64(const struct gguf_kv *kv, uint64_t i) {
    TERN_ASSERT(kv->type == GGUF_TYPE_ARRAY && i < kv->v.arr.n);
    const void *d = kv->v.arr.data;
    switch (kv->v.arr.type) {
    case GGUF_TYPE_UINT8: return ((const uint8_t *)d)[i];
    case GGUF_TYPE_INT8: return ((const int8_t *)d)[i];
    case GGUF_TYPE_UINT16: return ((const uint16_t *)d)[i];
    case GGUF_TYPE_INT16: return ((const int16_t *)d)[i];
    case GGUF_TYPE_UINT32: return ((const uint32_t *)d)[i];
    case GGUF_TYPE_INT32: return ((const int32_t *)d)[i];
    case GGUF_TYPE_UINT64: return (int64_t)((const uint64_t *)d)[i];
    case GGUF_TYPE_INT64: return ((const int64_t *)d)[i];
    case GGUF_TYPE_BOOL: return ((const uint8_t *)d)[i];
    case GGUF_TYPE_FLOAT32: return f64_to_i64(((const float *)d)[i]);
    case GGUF_TYPE_FLOAT64: return f64_to_i64(((const double *)d)[i]);
    default: break;
    }
    TERN_ASSERT(!"gguf_arr_get_i64 on a string array");
    return 0;
}

double gguf_arr_get_f64(const struct gguf_kv *kv, uint64_t i) {
    TERN_ASSERT(kv->type == GGUF_TYPE_ARRAY && i < kv->v.arr.n);
    const void *d = kv->v.arr.data;
    switch (kv->v.arr.type) {
    case GGUF_TYPE_FLOAT32: return ((const float *)d)[i];
    case GGUF_TYPE_FLOAT64: return ((const double *)d)[i];
    case GGUF_TYPE_UINT64: return (double)((const uint64_t *)d)[i];
    default: return (double)gguf_arr_get_i64(kv, i);
    }
}

bool gguf_read_fits_memory(const char *path, uint64_t *size, uint64_t *avail) {
    if (size) *size = 0;
    if (avail) *avail = 0;
    struct stat sb;
    if (!path || stat(path, &sb) != 0 || sb.st_size <= 0) return false;
    FILE *mi = fopen("/proc/meminfo", "r");
    if (!mi) return false;
    char line[256];
    unsigned long long kb = 0;
    bool found = false;
    while (!found && fgets(line, sizeof line, mi)) found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    fclose(mi);
    if (!found) return false;
    const uint64_t fs = (uint64_t)sb.st_size, av = (uint64_t)kb * 1024;
    if (size) *size = fs;
    if (avail) *avail = av;
    return fs <= av / 2;
}
