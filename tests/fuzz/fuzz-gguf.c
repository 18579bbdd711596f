/* Fuzz target for the GGUF reader: open arbitrary bytes, walk every kv and tensor,
 * touch every byte handed out, and check that whatever the reader accepts the writer
 * re-emits into a file that reads back the same (a round trip through both halves). */
#include "gguf/gguf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "fuzz-gguf: check failed: %s (line %d)\n", #cond, __LINE__);   \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

static uint64_t touch(const void *p, uint64_t n) {
    const uint8_t *b = p;
    uint64_t h = 0;
    for (uint64_t i = 0; i < n; i++) h = h * 31 + b[i];
    return h;
}

static uint64_t walk_kv(const struct gguf_file *f, const struct gguf_kv *kv) {
    uint64_t h = touch(kv->key.ptr, kv->key.len + 1); /* includes the NUL */
    CHECK(kv->key.ptr[kv->key.len] == 0);
    if (strlen(kv->key.ptr) == kv->key.len) CHECK(gguf_find_kv(f, kv->key.ptr) == kv);
    switch (kv->type) {
    case GGUF_TYPE_STRING:
        CHECK(kv->v.str.ptr[kv->v.str.len] == 0);
        h += touch(kv->v.str.ptr, kv->v.str.len);
        break;
    case GGUF_TYPE_ARRAY:
        CHECK(kv->v.arr.type != GGUF_TYPE_ARRAY && kv->v.arr.type < GGUF_TYPE_COUNT);
        if (kv->v.arr.type == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < kv->v.arr.n; i++) {
                CHECK(kv->v.arr.strs[i].ptr[kv->v.arr.strs[i].len] == 0);
                h += touch(kv->v.arr.strs[i].ptr, kv->v.arr.strs[i].len);
            }
        } else {
            for (uint64_t i = 0; i < kv->v.arr.n; i++) h += (uint64_t)gguf_arr_get_i64(kv, i);
            for (uint64_t i = 0; i < kv->v.arr.n; i++) h += (uint64_t)(gguf_arr_get_f64(kv, i) != 0);
        }
        break;
    default: h += kv->v.u64; break;
    }
    /* The typed getters must answer (any status) without trouble. */
    if (strlen(kv->key.ptr) == kv->key.len) {
        uint32_t u32;
        uint64_t u64;
        int64_t i64;
        float f32;
        bool b;
        const struct gguf_str *s;
        const struct gguf_kv *a;
        h += (uint64_t)gguf_get_u32(f, kv->key.ptr, &u32) + (uint64_t)gguf_get_u64(f, kv->key.ptr, &u64) +
             (uint64_t)gguf_get_i64(f, kv->key.ptr, &i64) + (uint64_t)gguf_get_f32(f, kv->key.ptr, &f32) +
             (uint64_t)gguf_get_bool(f, kv->key.ptr, &b) + (uint64_t)gguf_get_str(f, kv->key.ptr, &s) +
             (uint64_t)gguf_get_arr(f, kv->key.ptr, GGUF_TYPE_INT32, &a) +
             (uint64_t)gguf_get_arr(f, kv->key.ptr, GGUF_TYPE_FLOAT32, &a) +
             (uint64_t)gguf_get_arr(f, kv->key.ptr, GGUF_TYPE_STRING, &a);
    }
    return h;
}

static bool has_inner_nul(const struct gguf_str *s) { return strlen(s->ptr) != s->len; }

/* Re-emits f with the writer and checks the copy reads back equal. */
static void round_trip(const struct gguf_file *f) {
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++)
        if (has_inner_nul(&gguf_tensor_at(f, i)->name)) return; /* the writer takes C-string names */
    struct gguf_writer *w;
    if (gguf_writer_new(&w)) return;
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) CHECK(gguf_writer_set_kv(w, gguf_kv_at(f, i)) == TERN_OK);
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        CHECK(gguf_writer_add_tensor(w, t->name.ptr, t->type, t->n_dims, t->ne, t->data, t->size) == TERN_OK);
    }
    void *mem;
    size_t size;
    CHECK(gguf_writer_write_mem(w, &mem, &size) == TERN_OK);
    gguf_writer_free(w);
    struct gguf_file *g;
    enum tern_status st = gguf_open_mem(mem, size, &g);
    if (st) {
        fprintf(stderr, "fuzz-gguf: the writer's copy does not read back: %s\n", tern_last_error());
        abort();
    }
    CHECK(gguf_n_kv(g) == gguf_n_kv(f) && gguf_n_tensors(g) == gguf_n_tensors(f));
    CHECK(gguf_alignment(g) == gguf_alignment(f));
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *a = gguf_kv_at(f, i), *b = gguf_kv_at(g, i);
        CHECK(a->key.len == b->key.len && !memcmp(a->key.ptr, b->key.ptr, a->key.len));
        CHECK(a->type == b->type);
        if (a->type == GGUF_TYPE_STRING) {
            CHECK(a->v.str.len == b->v.str.len && !memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len));
        } else if (a->type == GGUF_TYPE_ARRAY) {
            CHECK(a->v.arr.type == b->v.arr.type && a->v.arr.n == b->v.arr.n);
        } else if (a->type == GGUF_TYPE_FLOAT32 || a->type == GGUF_TYPE_FLOAT64) {
            CHECK(!memcmp(&a->v.f64, &b->v.f64, sizeof a->v.f64) || (a->v.f64 != a->v.f64));
        } else if (a->type == GGUF_TYPE_BOOL) {
            CHECK(a->v.b == b->v.b);
        } else {
            CHECK(a->v.u64 == b->v.u64);
        }
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *a = gguf_tensor_at(f, i), *b = gguf_tensor_at(g, i);
        CHECK(a->type == b->type && a->size == b->size && a->n_dims == b->n_dims);
        CHECK(!memcmp(a->ne, b->ne, sizeof a->ne));
        CHECK(!memcmp(a->data, b->data, (size_t)a->size));
    }
    gguf_close(g);
    free(mem);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct gguf_file *f = NULL;
    enum tern_status st = gguf_open_mem(data, size, &f);
    if (st != TERN_OK) {
        CHECK(f == NULL);
        CHECK(tern_last_error()[0] != 0);
        return 0;
    }
    uint64_t h = gguf_version(f) + gguf_alignment(f) + gguf_data_offset(f) + gguf_file_size(f);
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) h += walk_kv(f, gguf_kv_at(f, i));
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        CHECK(t->name.ptr[t->name.len] == 0);
        CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS);
        CHECK(t->offset % gguf_alignment(f) == 0);
        CHECK(gguf_data_offset(f) + t->offset + t->size <= size);
        if (!has_inner_nul(&t->name)) CHECK(gguf_find_tensor(f, t->name.ptr) == t);
        h += touch(t->data, t->size) + t->n_elements;
    }
    round_trip(f);
    sink = h;
    gguf_close(f);
    return 0;
}
