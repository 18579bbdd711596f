/* gguf: writer -> reader round trips, the real shared files, a table of malformed files
 * (each asserts the status and a fragment of the message), truncation at every byte,
 * and allocation failure injection during open. */
#include "harness.h"

#include "gguf/gguf.h"
#include "util/buf.h"
#include "util/fp16.h"
#include "util/mem.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#define CHECK_OK(expr)                                                                    \
    do {                                                                                  \
        enum tern_status st_ = (expr);                                                    \
        if (st_ != TERN_OK) fail_msg("%s -> %d: %s", #expr, st_, tern_last_error());      \
    } while (0)

static void assert_error(enum tern_status st, enum tern_status want, const char *fragment) {
    if (st != want || !strstr(tern_last_error(), fragment))
        fail_msg("want status %d with \"%s\", got %d: %s", want, fragment, st, tern_last_error());
}

/* ---- a writer with one of everything ------------------------------------------------ */

static const float t_f32[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12.5f};

static struct gguf_writer *writer_everything(void) {
    struct gguf_writer *w;
    CHECK_OK(gguf_writer_new(&w));
    CHECK_OK(gguf_writer_set_str(w, "general.architecture", "test"));
    CHECK_OK(gguf_writer_set_u32(w, "u32", 4000000000u));
    CHECK_OK(gguf_writer_set_i32(w, "i32", -7));
    CHECK_OK(gguf_writer_set_u64(w, "u64", UINT64_MAX - 1));
    CHECK_OK(gguf_writer_set_f32(w, "f32", 0.25f));
    CHECK_OK(gguf_writer_set_bool(w, "bool", true));
    /* The remaining scalar types go through the generic setter. */
    struct gguf_kv kv = {.key = {"u8", 2}, .type = GGUF_TYPE_UINT8, .v.u64 = 200};
    CHECK_OK(gguf_writer_set_kv(w, &kv));
    kv = (struct gguf_kv){.key = {"i8", 2}, .type = GGUF_TYPE_INT8, .v.i64 = -100};
    CHECK_OK(gguf_writer_set_kv(w, &kv));
    kv = (struct gguf_kv){.key = {"u16", 3}, .type = GGUF_TYPE_UINT16, .v.u64 = 65535};
    CHECK_OK(gguf_writer_set_kv(w, &kv));
    kv = (struct gguf_kv){.key = {"i16", 3}, .type = GGUF_TYPE_INT16, .v.i64 = -32768};
    CHECK_OK(gguf_writer_set_kv(w, &kv));
    kv = (struct gguf_kv){.key = {"i64", 3}, .type = GGUF_TYPE_INT64, .v.i64 = INT64_MIN};
    CHECK_OK(gguf_writer_set_kv(w, &kv));
    kv = (struct gguf_kv){.key = {"f64", 3}, .type = GGUF_TYPE_FLOAT64, .v.f64 = 1e-300};
    CHECK_OK(gguf_writer_set_kv(w, &kv));
    kv = (struct gguf_kv){.key = {"nul", 3}, .type = GGUF_TYPE_STRING, .v.str = {"a\0b", 3}};
    CHECK_OK(gguf_writer_set_kv(w, &kv));

    const uint8_t a_u8[] = {0, 1, 255};
    const int8_t a_i8[] = {-128, 0, 127};
    const uint16_t a_u16[] = {1, 65535};
    const int16_t a_i16[] = {-2, 2};
    const uint32_t a_u32[] = {7, 8, 9, 4294967295u};
    const int32_t a_i32[] = {11, 11, 10, 0};
    const uint64_t a_u64[] = {UINT64_MAX};
    const int64_t a_i64[] = {-5, 5};
    const float a_f32[] = {-1.5f, 0, 3.25f};
    const double a_f64[] = {1.0 / 3};
    const uint8_t a_bool[] = {1, 0, 1};
    CHECK_OK(gguf_writer_set_arr(w, "arr.u8", GGUF_TYPE_UINT8, a_u8, 3));
    CHECK_OK(gguf_writer_set_arr(w, "arr.i8", GGUF_TYPE_INT8, a_i8, 3));
    CHECK_OK(gguf_writer_set_arr(w, "arr.u16", GGUF_TYPE_UINT16, a_u16, 2));
    CHECK_OK(gguf_writer_set_arr(w, "arr.i16", GGUF_TYPE_INT16, a_i16, 2));
    CHECK_OK(gguf_writer_set_arr(w, "arr.u32", GGUF_TYPE_UINT32, a_u32, 4));
    CHECK_OK(gguf_writer_set_arr(w, "arr.i32", GGUF_TYPE_INT32, a_i32, 4));
    CHECK_OK(gguf_writer_set_arr(w, "arr.u64", GGUF_TYPE_UINT64, a_u64, 1));
    CHECK_OK(gguf_writer_set_arr(w, "arr.i64", GGUF_TYPE_INT64, a_i64, 2));
    CHECK_OK(gguf_writer_set_arr(w, "arr.f32", GGUF_TYPE_FLOAT32, a_f32, 3));
    CHECK_OK(gguf_writer_set_arr(w, "arr.f64", GGUF_TYPE_FLOAT64, a_f64, 1));
    CHECK_OK(gguf_writer_set_arr(w, "arr.bool", GGUF_TYPE_BOOL, a_bool, 3));
    CHECK_OK(gguf_writer_set_arr(w, "arr.empty", GGUF_TYPE_INT32, NULL, 0));
    const struct gguf_str strs[] = {{"hello", 5}, {"", 0}, {"x\0y", 3}, {"\xc4\xa0the", 5}};
    CHECK_OK(gguf_writer_set_arr_str(w, "arr.str", strs, 4));

    uint64_t ne2[2] = {4, 3};
    CHECK_OK(gguf_writer_add_tensor(w, "t.f32", TERN_DTYPE_F32, 2, ne2, t_f32, sizeof t_f32));
    uint16_t h[8];
    for (int i = 0; i < 8; i++) h[i] = tern_f32_to_fp16((float)i - 3.5f);
    uint64_t ne1[1] = {8};
    CHECK_OK(gguf_writer_add_tensor(w, "t.f16", TERN_DTYPE_F16, 1, ne1, h, sizeof h));
    uint8_t q[2 * 34];
    for (int i = 0; i < (int)sizeof q; i++) q[i] = (uint8_t)(i * 7);
    uint64_t neq[2] = {32, 2};
    CHECK_OK(gguf_writer_add_tensor(w, "t.q8_0", TERN_DTYPE_Q8_0, 2, neq, q, sizeof q));
    uint16_t bf[16] = {0};
    uint64_t ne4[4] = {2, 2, 2, 2};
    CHECK_OK(gguf_writer_add_tensor(w, "t.bf16", TERN_DTYPE_BF16, 4, ne4, bf, sizeof bf));
    return w;
}

static void check_everything(const struct gguf_file *f) {
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), 32);
    assert_int_equal(gguf_data_offset(f) % 32, 0);
    assert_int_equal(gguf_n_kv(f), 26);
    assert_string_equal(gguf_kv_at(f, 0)->key.ptr, "general.architecture");

    const struct gguf_str *s;
    CHECK_OK(gguf_get_str(f, "general.architecture", &s));
    assert_string_equal(s->ptr, "test");
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    bool b;
    CHECK_OK(gguf_get_u32(f, "u32", &u32));
    assert_int_equal(u32, 4000000000u);
    CHECK_OK(gguf_get_i64(f, "i32", &i64));
    assert_int_equal(i64, -7);
    assert_error(gguf_get_u32(f, "i32", &u32), TERN_ERR_FORMAT, "'i32' value -7 is out of range");
    CHECK_OK(gguf_get_u64(f, "u64", &u64));
    assert_true(u64 == UINT64_MAX - 1);
    assert_error(gguf_get_u32(f, "u64", &u32), TERN_ERR_FORMAT, "out of range");
    assert_error(gguf_get_i64(f, "u64", &i64), TERN_ERR_FORMAT, "out of range");
    CHECK_OK(gguf_get_f32(f, "f32", &f32));
    assert_true(f32 == 0.25f);
    CHECK_OK(gguf_get_f32(f, "u32", &f32)); /* ints are accepted as floats */
    assert_true(f32 == 4e9f);
    CHECK_OK(gguf_get_bool(f, "bool", &b));
    assert_true(b);
    assert_error(gguf_get_u32(f, "bool", &u32), TERN_ERR_FORMAT, "expected an integer");
    assert_error(gguf_get_bool(f, "u8", &b), TERN_ERR_FORMAT, "'u8' has type u8, expected bool");
    CHECK_OK(gguf_get_u32(f, "u8", &u32));
    assert_int_equal(u32, 200);
    CHECK_OK(gguf_get_i64(f, "i8", &i64));
    assert_int_equal(i64, -100);
    CHECK_OK(gguf_get_u32(f, "u16", &u32));
    assert_int_equal(u32, 65535);
    CHECK_OK(gguf_get_i64(f, "i16", &i64));
    assert_int_equal(i64, -32768);
    CHECK_OK(gguf_get_i64(f, "i64", &i64));
    assert_true(i64 == INT64_MIN);
    const struct gguf_kv *kv = gguf_find_kv(f, "f64");
    assert_non_null(kv);
    assert_int_equal(kv->type, GGUF_TYPE_FLOAT64);
    assert_true(kv->v.f64 == 1e-300);
    kv = gguf_find_kv(f, "nul");
    assert_int_equal(kv->v.str.len, 3);
    assert_memory_equal(kv->v.str.ptr, "a\0b", 4); /* NUL-terminated copy */

    assert_error(gguf_get_u32(f, "absent", &u32), TERN_ERR_INVALID, "key not found: 'absent'");
    CHECK_OK(gguf_get_u32_or(f, "absent", 9, &u32));
    assert_int_equal(u32, 9);
    CHECK_OK(gguf_get_f32_or(f, "absent", 1.5f, &f32));
    assert_true(f32 == 1.5f);
    CHECK_OK(gguf_get_bool_or(f, "bool", false, &b));
    assert_true(b);
    assert_error(gguf_get_bool_or(f, "u32", false, &b), TERN_ERR_FORMAT, "expected bool");

    const struct gguf_kv *a;
    CHECK_OK(gguf_get_arr(f, "arr.u8", GGUF_TYPE_INT32, &a)); /* any integer type */
    assert_int_equal(a->v.arr.n, 3);
    assert_int_equal(gguf_arr_get_i64(a, 2), 255);
    CHECK_OK(gguf_get_arr(f, "arr.i8", GGUF_TYPE_INT8, &a));
    assert_int_equal(gguf_arr_get_i64(a, 0), -128);
    CHECK_OK(gguf_get_arr(f, "arr.u16", GGUF_TYPE_UINT16, &a));
    assert_int_equal(gguf_arr_get_i64(a, 1), 65535);
    CHECK_OK(gguf_get_arr(f, "arr.i16", GGUF_TYPE_INT16, &a));
    assert_int_equal(gguf_arr_get_i64(a, 0), -2);
    CHECK_OK(gguf_get_arr(f, "arr.u32", GGUF_TYPE_UINT32, &a));
    assert_int_equal(gguf_arr_get_i64(a, 3), 4294967295ll);
    CHECK_OK(gguf_get_arr(f, "arr.i32", GGUF_TYPE_INT32, &a));
    assert_int_equal(a->v.arr.type, GGUF_TYPE_INT32);
    assert_int_equal(((const int32_t *)a->v.arr.data)[2], 10); /* typed access is aligned */
    CHECK_OK(gguf_get_arr(f, "arr.u64", GGUF_TYPE_UINT64, &a));
    assert_true(gguf_arr_get_f64(a, 0) == (double)UINT64_MAX);
    CHECK_OK(gguf_get_arr(f, "arr.i64", GGUF_TYPE_INT64, &a));
    assert_int_equal(gguf_arr_get_i64(a, 0), -5);
    CHECK_OK(gguf_get_arr(f, "arr.f32", GGUF_TYPE_FLOAT32, &a));
    assert_true(gguf_arr_get_f64(a, 2) == 3.25);
    assert_true(((const float *)a->v.arr.data)[0] == -1.5f);
    CHECK_OK(gguf_get_arr(f, "arr.f64", GGUF_TYPE_FLOAT32, &a)); /* any float width */
    assert_true(gguf_arr_get_f64(a, 0) == 1.0 / 3);
    CHECK_OK(gguf_get_arr(f, "arr.bool", GGUF_TYPE_BOOL, &a));
    assert_int_equal(gguf_arr_get_i64(a, 1), 0);
    assert_int_equal(gguf_arr_get_i64(a, 2), 1);
    CHECK_OK(gguf_get_arr(f, "arr.empty", GGUF_TYPE_INT32, &a));
    assert_int_equal(a->v.arr.n, 0);
    assert_non_null(a->v.arr.data);
    assert_error(gguf_get_arr(f, "arr.f32", GGUF_TYPE_INT32, &a), TERN_ERR_FORMAT,
                 "'arr.f32' is an array of f32, expected an array of i32");
    assert_error(gguf_get_arr(f, "u32", GGUF_TYPE_INT32, &a), TERN_ERR_FORMAT, "expected an array");
    CHECK_OK(gguf_get_arr(f, "arr.str", GGUF_TYPE_STRING, &a));
    assert_int_equal(a->v.arr.n, 4);
    assert_string_equal(a->v.arr.strs[0].ptr, "hello");
    assert_int_equal(a->v.arr.strs[1].len, 0);
    assert_string_equal(a->v.arr.strs[1].ptr, "");
    assert_int_equal(a->v.arr.strs[2].len, 3);
    assert_memory_equal(a->v.arr.strs[2].ptr, "x\0y", 4);
    assert_string_equal(a->v.arr.strs[3].ptr, "\xc4\xa0the");

    assert_int_equal(gguf_n_tensors(f), 4);
    const struct gguf_tensor *t = gguf_find_tensor(f, "t.f32");
    assert_non_null(t);
    assert_int_equal(t->type, TERN_DTYPE_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 4);
    assert_int_equal(t->ne[1], 3);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->n_elements, 12);
    assert_int_equal(t->size, 48);
    assert_memory_equal(t->data, t_f32, 48);
    assert_ptr_equal(gguf_tensor_at(f, 0), t);
    t = gguf_find_tensor(f, "t.f16");
    assert_int_equal(t->offset % 32, 0);
    assert_true(tern_fp16_to_f32(((const uint16_t *)t->data)[7]) == 3.5f);
    t = gguf_find_tensor(f, "t.q8_0");
    assert_int_equal(t->size, 68);
    assert_int_equal(((const uint8_t *)t->data)[67], (uint8_t)(67 * 7));
    t = gguf_find_tensor(f, "t.bf16");
    assert_int_equal(t->n_dims, 4);
    assert_int_equal(t->n_elements, 16);
    assert_null(gguf_find_tensor(f, "t.f3"));
    assert_null(gguf_tensor_at(f, 4));
    assert_null(gguf_kv_at(f, 26));
}

/* The server's read-or-map default: a small file fits (its size reported, MemAvailable
 * above twice it), a missing one is refused with both figures 0. */
static void test_read_fits_memory(void **state) {
    (void)state;
    char path[] = "/tmp/tern-test-fits-XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "GGUF0123", 8), 8);
    close(fd);
    uint64_t size = 1, avail = 1;
    assert_true(gguf_read_fits_memory(path, &size, &avail));
    assert_int_equal(size, 8);
    assert_true(avail >= 16);
    unlink(path);
    assert_false(gguf_read_fits_memory(path, &size, &avail));
    assert_int_equal(size, 0);
    assert_int_equal(avail, 0);
    assert_false(gguf_read_fits_memory(NULL, NULL, NULL));
}

static void test_roundtrip_mem_and_file(void **state) {
    (void)state;
    struct gguf_writer *w = writer_everything();
    void *mem;
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, &mem, &size));
    assert_int_equal(size % 32, 0);
    struct gguf_file *f;
    CHECK_OK(gguf_open_mem(mem, size, &f));
    check_everything(f);
    assert_string_equal(gguf_path(f), "");
    assert_int_equal(gguf_file_size(f), size);
    gguf_close(f);

    /* The file writer gives the same bytes, and both open modes read them. */
    char path[512];
    snprintf(path, sizeof path, "%s/everything.gguf", th_tmpdir());
    CHECK_OK(gguf_writer_write(w, path));
    size_t flen;
    char *fbytes = th_read_file(path, &flen);
    assert_non_null(fbytes);
    assert_int_equal(flen, size);
    assert_memory_equal(fbytes, mem, size);
    free(fbytes);
    struct gguf_open_opts opts = {0};
    CHECK_OK(gguf_open(path, &opts, &f));
    check_everything(f);
    assert_string_equal(gguf_path(f), path);
    gguf_close(f);
    opts.no_mmap = true;
    opts.mlock = true; /* may fail under a small RLIMIT_MEMLOCK: a warning, not an error */
    CHECK_OK(gguf_open(path, &opts, &f));
    check_everything(f);
    gguf_close(f);

    /* Re-writing what was read gives identical bytes (every kv through set_kv). */
    CHECK_OK(gguf_open_mem(mem, size, &f));
    struct gguf_writer *w2;
    CHECK_OK(gguf_writer_new(&w2));
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) CHECK_OK(gguf_writer_set_kv(w2, gguf_kv_at(f, i)));
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        CHECK_OK(gguf_writer_add_tensor(w2, t->name.ptr, t->type, t->n_dims, t->ne, t->data, t->size));
    }
    void *mem2;
    size_t size2;
    CHECK_OK(gguf_writer_write_mem(w2, &mem2, &size2));
    assert_int_equal(size2, size);
    assert_memory_equal(mem2, mem, size);
    free(mem2);
    gguf_writer_free(w2);
    gguf_close(f);
    free(mem);
    gguf_writer_free(w);
    gguf_writer_free(NULL);
    gguf_close(NULL);
}

static void test_writer_rejects(void **state) {
    (void)state;
    struct gguf_writer *w;
    CHECK_OK(gguf_writer_new(&w));
    CHECK_OK(gguf_writer_set_u32(w, "a", 1));
    assert_error(gguf_writer_set_str(w, "a", "x"), TERN_ERR_INVALID, "duplicate key 'a'");
    assert_error(gguf_writer_set_u32(w, "general.alignment", 48), TERN_ERR_INVALID, "general.alignment 48");
    assert_error(gguf_writer_set_arr(w, "n", GGUF_TYPE_ARRAY, NULL, 0), TERN_ERR_INVALID, "not numeric");
    uint8_t bad_bool = 2;
    assert_error(gguf_writer_set_arr(w, "bb", GGUF_TYPE_BOOL, &bad_bool, 1), TERN_ERR_INVALID, "bool element 0");
    float x[64] = {0};
    uint64_t ne[2] = {8, 2};
    CHECK_OK(gguf_writer_add_tensor(w, "w", TERN_DTYPE_F32, 2, ne, x, 64));
    assert_error(gguf_writer_add_tensor(w, "w", TERN_DTYPE_F32, 2, ne, x, 64), TERN_ERR_INVALID,
                 "duplicate tensor 'w'");
    assert_error(gguf_writer_add_tensor(w, "v", TERN_DTYPE_F32, 2, ne, x, 60), TERN_ERR_INVALID,
                 "60 bytes given, its type and shape need 64");
    assert_error(gguf_writer_add_tensor(w, "q", TERN_DTYPE_Q4_K, 2, ne, x, 64), TERN_ERR_INVALID,
                 "row length 8 is not a multiple of the block size 256");
    assert_error(gguf_writer_add_tensor(w, "u", (enum tern_dtype)4, 2, ne, x, 64), TERN_ERR_INVALID,
                 "unknown type 4");
    uint64_t ne0[2] = {8, 0};
    assert_error(gguf_writer_add_tensor(w, "z", TERN_DTYPE_F32, 2, ne0, x, 0), TERN_ERR_INVALID, "dimension 1 is 0");
    assert_error(gguf_writer_add_tensor(w, "d", TERN_DTYPE_F32, 5, ne, x, 64), TERN_ERR_INVALID, "n_dims 5");
    /* The writer is still usable and holds what succeeded. */
    void *mem;
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, &mem, &size));
    struct gguf_file *f;
    CHECK_OK(gguf_open_mem(mem, size, &f));
    assert_int_equal(gguf_n_kv(f), 1);
    assert_int_equal(gguf_n_tensors(f), 1);
    gguf_close(f);
    free(mem);
    gguf_writer_free(w);
}

static void test_alignment_key(void **state) {
    (void)state;
    struct gguf_writer *w;
    CHECK_OK(gguf_writer_new(&w));
    CHECK_OK(gguf_writer_set_u32(w, "general.alignment", 64));
    float x[3] = {1, 2, 3};
    uint64_t ne[1] = {3};
    CHECK_OK(gguf_writer_add_tensor(w, "a", TERN_DTYPE_F32, 1, ne, x, 12));
    CHECK_OK(gguf_writer_add_tensor(w, "b", TERN_DTYPE_F32, 1, ne, x, 12));
    void *mem;
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, &mem, &size));
    struct gguf_file *f;
    CHECK_OK(gguf_open_mem(mem, size, &f));
    assert_int_equal(gguf_alignment(f), 64);
    assert_int_equal(gguf_data_offset(f) % 64, 0);
    assert_int_equal(gguf_find_tensor(f, "b")->offset, 64);
    assert_int_equal(size % 64, 0);
    gguf_close(f);
    free(mem);
    gguf_writer_free(w);
}

/* A callback tensor written in several slices equals the same tensor given whole. */
struct fill_state {
    uint64_t next_row, calls;
};

static enum tern_status fill_rows(void *user, uint64_t row0, uint64_t n_rows, void *dst) {
    struct fill_state *s = user;
    if (row0 != s->next_row) return tern_errorf(TERN_ERR_INTERNAL, "rows out of order");
    float *p = dst;
    for (uint64_t r = 0; r < n_rows; r++)
        for (uint64_t c = 0; c < 1024; c++) p[r * 1024 + c] = (float)((row0 + r) * 3 + c);
    s->next_row = row0 + n_rows;
    s->calls++;
    return TERN_OK;
}

static enum tern_status fill_fail(void *user, uint64_t row0, uint64_t n_rows, void *dst) {
    (void)user, (void)row0, (void)n_rows, (void)dst;
    return tern_errorf(TERN_ERR_CANCELLED, "stop here");
}

static void test_streamed_tensor(void **state) {
    (void)state;
    const uint64_t rows = 1100; /* 4.3 MB: more than one slice */
    float *whole = malloc(rows * 1024 * sizeof(float));
    struct fill_state ref = {0};
    fill_rows(&ref, 0, rows, whole);
    uint64_t ne[2] = {1024, rows};

    struct gguf_writer *a, *b;
    CHECK_OK(gguf_writer_new(&a));
    CHECK_OK(gguf_writer_add_tensor(a, "w", TERN_DTYPE_F32, 2, ne, whole, rows * 4096));
    CHECK_OK(gguf_writer_new(&b));
    struct fill_state fs = {0};
    CHECK_OK(gguf_writer_add_tensor_cb(b, "w", TERN_DTYPE_F32, 2, ne, fill_rows, &fs));
    void *ma, *mb;
    size_t sa, sb;
    CHECK_OK(gguf_writer_write_mem(a, &ma, &sa));
    CHECK_OK(gguf_writer_write_mem(b, &mb, &sb));
    assert_true(fs.calls >= 2);
    assert_int_equal(sa, sb);
    assert_memory_equal(ma, mb, sa);
    char path[512];
    snprintf(path, sizeof path, "%s/streamed.gguf", th_tmpdir());
    fs = (struct fill_state){0};
    CHECK_OK(gguf_writer_write(b, path));
    size_t flen;
    char *fb = th_read_file(path, &flen);
    assert_int_equal(flen, sa);
    assert_memory_equal(fb, ma, sa);
    free(fb);

    /* A failing callback aborts the write and leaves no file behind. */
    struct gguf_writer *c;
    CHECK_OK(gguf_writer_new(&c));
    CHECK_OK(gguf_writer_add_tensor_cb(c, "w", TERN_DTYPE_F32, 2, ne, fill_fail, NULL));
    snprintf(path, sizeof path, "%s/failed.gguf", th_tmpdir());
    assert_error(gguf_writer_write(c, path), TERN_ERR_CANCELLED, "stop here");
    FILE *fp = fopen(path, "rb");
    assert_null(fp);
    DIR *d = opendir(th_tmpdir());
    struct dirent *e;
    while ((e = readdir(d))) assert_null(strstr(e->d_name, "failed.gguf"));
    closedir(d);

    gguf_writer_free(a);
    gguf_writer_free(b);
    gguf_writer_free(c);
    free(ma);
    free(mb);
    free(whole);
}

/* Many keys and tensors: every one is found through the hash tables. */
static void test_many_keys(void **state) {
    (void)state;
    struct gguf_writer *w;
    CHECK_OK(gguf_writer_new(&w));
    char name[64];
    for (uint32_t i = 0; i < 1500; i++) {
        snprintf(name, sizeof name, "k.%u", i);
        CHECK_OK(gguf_writer_set_u32(w, name, i));
    }
    float x = 0;
    uint64_t ne[1] = {1};
    for (uint32_t i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "blk.%u.w", i);
        CHECK_OK(gguf_writer_add_tensor(w, name, TERN_DTYPE_F32, 1, ne, &x, 4));
    }
    void *mem;
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, &mem, &size));
    struct gguf_file *f;
    CHECK_OK(gguf_open_mem(mem, size, &f));
    for (uint32_t i = 0; i < 1500; i++) {
        snprintf(name, sizeof name, "k.%u", i);
        uint32_t v;
        CHECK_OK(gguf_get_u32(f, name, &v));
        assert_int_equal(v, i);
    }
    for (uint32_t i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "blk.%u.w", i);
        const struct gguf_tensor *t = gguf_find_tensor(f, name);
        assert_non_null(t);
        assert_int_equal(t->offset, (uint64_t)i * 32);
    }
    assert_null(gguf_find_kv(f, "k.1500"));
    assert_null(gguf_find_tensor(f, "blk.1000.w"));
    gguf_close(f);
    free(mem);
    gguf_writer_free(w);
}

/* ---- the shared files ---------------------------------------------------------------- */

static struct gguf_file *open_shared(const char *rel) {
    struct gguf_file *f = NULL;
    CHECK_OK(gguf_open(th_shared_path(rel), NULL, &f));
    return f;
}

static void test_shared_models(void **state) {
    (void)state;
    th_require_shared("models/tiny-qwen3-f32.gguf");
    struct gguf_file *f = open_shared("models/tiny-qwen3-f32.gguf");
    assert_int_equal(gguf_n_tensors(f), 47);
    const struct gguf_str *s;
    CHECK_OK(gguf_get_str(f, "general.architecture", &s));
    assert_string_equal(s->ptr, "qwen3");
    uint32_t n;
    CHECK_OK(gguf_get_u32(f, "qwen3.block_count", &n));
    assert_int_equal(n, 4);
    CHECK_OK(gguf_get_u32(f, "qwen3.embedding_length", &n));
    assert_int_equal(n, 256);
    const struct gguf_kv *tok;
    CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tok));
    assert_int_equal(tok->v.arr.n, 4122);
    assert_string_equal(tok->v.arr.strs[4097].ptr, "<|im_start|>");
    const struct gguf_tensor *t = gguf_find_tensor(f, "blk.3.attn_q.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 256);
    assert_int_equal(t->ne[1], 256); /* 4 heads x 64 */
    uint64_t params = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        t = gguf_tensor_at(f, i);
        assert_int_equal(t->type, TERN_DTYPE_F32);
        assert_non_null(t->data);
        params += t->n_elements;
    }
    assert_true(params > 5200000 && params < 5300000); /* "5.26 M params" */
    gguf_close(f);

    f = open_shared("models/tiny-qwen35-f32.gguf");
    assert_int_equal(gguf_n_tensors(f), 109);
    CHECK_OK(gguf_get_str(f, "general.architecture", &s));
    assert_string_equal(s->ptr, "qwen35");
    const struct gguf_kv *sec;
    CHECK_OK(gguf_get_arr(f, "qwen35.rope.dimension_sections", GGUF_TYPE_INT32, &sec));
    assert_int_equal(sec->v.arr.n, 4);
    assert_int_equal(gguf_arr_get_i64(sec, 0), 3);
    assert_int_equal(gguf_arr_get_i64(sec, 2), 2);
    assert_non_null(gguf_find_tensor(f, "blk.0.ssm_a"));
    assert_non_null(gguf_find_tensor(f, "blk.3.attn_q_norm.weight"));
    gguf_close(f);

    f = open_shared("models/stories260K.gguf");
    assert_int_equal(gguf_n_tensors(f), 48);
    CHECK_OK(gguf_get_str(f, "general.architecture", &s));
    assert_string_equal(s->ptr, "llama");
    gguf_close(f);

    /* Mixed-type quantized files: the types named in models/README.md. */
    f = open_shared("models/tiny-qwen3-q4_k_m.gguf");
    int n_q4k = 0, n_q6k = 0, n_f32 = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        t = gguf_tensor_at(f, i);
        n_q4k += t->type == TERN_DTYPE_Q4_K;
        n_q6k += t->type == TERN_DTYPE_Q6_K;
        n_f32 += t->type == TERN_DTYPE_F32;
    }
    assert_int_equal(n_f32, 17);
    assert_int_equal(n_q4k, 25);
    assert_int_equal(n_q6k, 5);
    assert_int_equal(gguf_find_tensor(f, "output.weight")->type, TERN_DTYPE_Q6_K);
    gguf_close(f);
}

/* Every GGUF file of the kit opens, with mmap and without. */
static void test_shared_all_files(void **state) {
    (void)state;
    th_require_shared("conformance/tokenizer");
    const char *dirs[] = {"models", "conformance/tokenizer"};
    int n_files = 0, n_vocab_only = 0;
    for (size_t di = 0; di < 2; di++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", th_shared_path(dirs[di]));
        DIR *d = opendir(dir);
        assert_non_null(d);
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (l < 5 || strcmp(e->d_name + l - 5, ".gguf")) continue;
            char path[8192];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            for (int mode = 0; mode < 2; mode++) {
                struct gguf_open_opts opts = {.no_mmap = mode == 1};
                struct gguf_file *f;
                enum tern_status st = gguf_open(path, &opts, &f);
                if (st) fail_msg("%s: %s", path, tern_last_error());
                const struct gguf_kv *tok;
                CHECK_OK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tok));
                assert_true(tok->v.arr.n > 0);
                if (mode == 0) n_vocab_only += gguf_n_tensors(f) == 0;
                gguf_close(f);
            }
            n_files++;
        }
        closedir(d);
    }
    if (n_files < 15) fail_msg("only %d GGUF files found", n_files);
    assert_true(n_vocab_only >= 1);
}

/* A real file cut just after its tensor infos: metadata-only opens work with no_data,
 * a full open names the first tensor whose bytes are missing. */
static void test_shared_truncated(void **state) {
    (void)state;
    th_require_shared("models/tiny-qwen3-f32.gguf");
    size_t len;
    char *bytes = th_read_file(th_shared_path("models/tiny-qwen3-f32.gguf"), &len);
    assert_non_null(bytes);
    struct gguf_file *f;
    CHECK_OK(gguf_open_mem(bytes, len, &f));
    uint64_t cut = gguf_data_offset(f) + 1000;
    gguf_close(f);
    char path[512];
    snprintf(path, sizeof path, "%s/cut.gguf", th_tmpdir());
    FILE *fp = fopen(path, "wb");
    assert_int_equal(fwrite(bytes, 1, cut, fp), cut);
    fclose(fp);
    assert_error(gguf_open(path, NULL, &f), TERN_ERR_FORMAT, "runs past end of file");
    assert_null(f);
    assert_non_null(strstr(tern_last_error(), path));
    struct gguf_open_opts opts = {.no_data = true};
    CHECK_OK(gguf_open(path, &opts, &f));
    assert_int_equal(gguf_n_tensors(f), 47);
    assert_null(gguf_find_tensor(f, "blk.3.attn_q.weight")->data);
    gguf_close(f);
    free(bytes);
}

/* ---- malformed files ----------------------------------------------------------------- */

/* A tiny byte builder for hand-made files. */
struct bb {
    struct tern_buf b;
};
static void bb_u32(struct bb *b, uint32_t v) { CHECK_OK(tern_buf_append(&b->b, &v, 4)); }
static void bb_u64(struct bb *b, uint64_t v) { CHECK_OK(tern_buf_append(&b->b, &v, 8)); }
static void bb_u8(struct bb *b, uint8_t v) { CHECK_OK(tern_buf_append(&b->b, &v, 1)); }
static void bb_str(struct bb *b, const char *s) {
    bb_u64(b, strlen(s));
    CHECK_OK(tern_buf_append(&b->b, s, strlen(s)));
}
static void bb_header(struct bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    CHECK_OK(tern_buf_append(&b->b, "GGUF", 4));
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void bb_kv_u32(struct bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, GGUF_TYPE_UINT32);
    bb_u32(b, v);
}
/* A tensor info with up to 4 dims. */
static void bb_tensor(struct bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                      uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) bb_u64(b, ne[i]);
    bb_u32(b, type);
    bb_u64(b, offset);
}
static void bb_pad(struct bb *b, size_t align) {
    while (b->b.len % align) bb_u8(b, 0);
}
static void bb_zeros(struct bb *b, size_t n) {
    for (size_t i = 0; i < n; i++) bb_u8(b, 0);
}

/* Opens b's bytes from an exactly sized heap copy (so ASan sees any over-read). */
static enum tern_status open_bytes(const void *p, size_t n) {
    void *copy = malloc(n ? n : 1);
    memcpy(copy, p, n);
    struct gguf_file *f = NULL;
    enum tern_status st = gguf_open_mem(copy, n, &f);
    if (!st) {
        assert_non_null(f);
        gguf_close(f);
    } else {
        assert_null(f);
    }
    free(copy);
    return st;
}

static enum tern_status open_bb(struct bb *b) {
    enum tern_status st = open_bytes(b->b.data, b->b.len);
    tern_buf_free(&b->b);
    return st;
}

static void test_malformed_table(void **state) {
    (void)state;
    struct bb b = {TERN_BUF_INIT};
    const uint64_t ne_4x2[2] = {4, 2};

    /* The baseline is valid, so each case below fails for its own reason. */
    bb_header(&b, 3, 1, 1);
    bb_kv_u32(&b, "a", 1);
    bb_tensor(&b, "w", 2, ne_4x2, TERN_DTYPE_F32, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 32);
    CHECK_OK(open_bb(&b));

    assert_error(open_bytes("GGUF", 4), TERN_ERR_FORMAT, "version needs 4 bytes");
    assert_error(open_bytes("", 0), TERN_ERR_FORMAT, "too short for the GGUF magic");
    CHECK_OK(tern_buf_append(&b.b, "GGML", 4));
    bb_zeros(&b, 20);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "bad magic \"GGML\"");

    bb_header(&b, 1, 0, 0);
    assert_error(open_bb(&b), TERN_ERR_UNSUPPORTED, "GGUF version 1 is not supported");
    bb_header(&b, 4, 0, 0);
    assert_error(open_bb(&b), TERN_ERR_UNSUPPORTED, "GGUF version 4 is not supported");
    bb_header(&b, 0x03000000u, 0, 0);
    assert_error(open_bb(&b), TERN_ERR_UNSUPPORTED, "big-endian GGUF (version 3 byte-swapped)");
    bb_header(&b, 2, 0, 0); /* v2 is read like v3 */
    CHECK_OK(open_bb(&b));

    bb_header(&b, 3, 0, UINT64_MAX);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "kv count 18446744073709551615 cannot fit");
    bb_header(&b, 3, 1u << 30, 0);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "tensor count 1073741824 cannot fit");

    bb_header(&b, 3, 0, 1);
    bb_u64(&b, UINT64_MAX); /* key length */
    bb_zeros(&b, 16);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "key length 18446744073709551615 at offset 24 runs past end of file");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "s");
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, UINT64_MAX - 3); /* string length that would wrap pos + len */
    bb_zeros(&b, 8);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "kv 0 's': string length 18446744073709551612");

    bb_header(&b, 3, 0, 2);
    bb_kv_u32(&b, "dup", 1);
    bb_kv_u32(&b, "dup", 2);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "duplicate key 'dup' (kv 0 and kv 1)");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "t");
    bb_u32(&b, 13);
    bb_zeros(&b, 8);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "kv 0 't': unknown value type 13");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "b");
    bb_u32(&b, GGUF_TYPE_BOOL);
    bb_u8(&b, 2);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "bool value 2");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "nest");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u64(&b, 1);
    bb_zeros(&b, 16);
    assert_error(open_bb(&b), TERN_ERR_UNSUPPORTED, "kv 0 'nest': nested arrays");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_UINT64);
    bb_u64(&b, UINT64_MAX / 4); /* count * 8 overflows */
    bb_zeros(&b, 16);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "array of 4611686018427387903 u64");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "strs");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 1000000);
    bb_zeros(&b, 64);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "string array count 1000000 cannot fit");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "strs");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_u64(&b, 3);
    bb_str(&b, "ok");
    bb_u64(&b, 100); /* second string runs past the end */
    bb_zeros(&b, 20);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "string 1 of 3: length 100");

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "arr");
    bb_u32(&b, GGUF_TYPE_ARRAY);
    bb_u32(&b, 99);
    bb_u64(&b, 0);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "unknown array element type 99");

    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 48);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "general.alignment 48 is not a nonzero power of two");
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 0);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "general.alignment 0");
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, GGUF_TYPE_STRING);
    bb_str(&b, "32");
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "general.alignment has type str");

    /* Tensors. */
    bb_header(&b, 3, 2, 0);
    bb_tensor(&b, "w", 2, ne_4x2, TERN_DTYPE_F32, 0);
    bb_tensor(&b, "w", 2, ne_4x2, TERN_DTYPE_F32, 32);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "duplicate tensor name 'w' (tensor 0 and tensor 1)");

    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "blk.0.w", 2, ne_4x2, 4, 0); /* 4 was Q4_2, removed from ggml */
    bb_pad(&b, 32);
    bb_zeros(&b, 32);
    assert_error(open_bb(&b), TERN_ERR_UNSUPPORTED, "tensor 'blk.0.w' has unknown tensor type 4");

    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "w", 2, ne_4x2, 1000, 0);
    bb_pad(&b, 32);
    bb_zeros(&b, 32);
    assert_error(open_bb(&b), TERN_ERR_UNSUPPORTED, "unknown tensor type 1000");

    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "w", 2, ne_4x2, TERN_DTYPE_F32, 16);
    bb_pad(&b, 32);
    bb_zeros(&b, 64);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "tensor 'w' offset 16 is not a multiple of the alignment 32");

    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "blk.3.attn_q.weight", 2, ne_4x2, TERN_DTYPE_F32, 32);
    bb_pad(&b, 32);
    bb_zeros(&b, 40); /* 32 + 32 bytes would be needed */
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "tensor 'blk.3.attn_q.weight' offset 128 + 32 bytes runs past end of file (136)");

    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "w", 2, ne_4x2, TERN_DTYPE_F32, UINT64_MAX - 31); /* aligned, wraps when added */
    bb_pad(&b, 32);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "overflows");

    const uint64_t ne_big[3] = {1u << 31, 1u << 31, 1u << 2};
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "big", 3, ne_big, TERN_DTYPE_F32, 0);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "tensor 'big': dimension 2 (4) makes the element count overflow");

    const uint64_t ne_huge[1] = {UINT64_MAX};
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "h", 1, ne_huge, TERN_DTYPE_F32, 0);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "dimension 0 (18446744073709551615)");

    const uint64_t ne_bytes[2] = {1u << 31, 1u << 31}; /* 2^62 elements x 4 bytes */
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "wide", 2, ne_bytes, TERN_DTYPE_F32, 0);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "byte size of 4611686018427387904 elements overflows");

    const uint64_t ne_zero[2] = {4, 0};
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "z", 2, ne_zero, TERN_DTYPE_F32, 0);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "tensor 'z': dimension 1 is 0");

    const uint64_t ne_5[5] = {1, 1, 1, 1, 1};
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "five", 5, ne_5, TERN_DTYPE_F32, 0);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "tensor 'five': n_dims 5 is outside 1..4");
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "none", 0, ne_5, TERN_DTYPE_F32, 0);
    bb_zeros(&b, 32);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "n_dims 0");

    const uint64_t ne_row[2] = {100, 2};
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "q", 2, ne_row, TERN_DTYPE_Q4_K, 0);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "tensor 'q' (Q4_K): row length 100 is not a multiple of the block size 256");

    /* A name with control bytes is shown safely in the message. */
    bb_header(&b, 3, 1, 0);
    bb_tensor(&b, "a\nb", 0, ne_5, TERN_DTYPE_F32, 0);
    bb_zeros(&b, 32);
    assert_error(open_bb(&b), TERN_ERR_FORMAT, "tensor 'a?b'");

    /* A vocab-style file with no tensors and no trailing padding is fine. */
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "x", 5);
    CHECK_OK(open_bb(&b));
}

/* Every strict prefix of a valid file is refused cleanly (and never read past). */
static void test_truncated_every_byte(void **state) {
    (void)state;
    struct gguf_writer *w = writer_everything();
    void *mem;
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, &mem, &size));
    gguf_writer_free(w);
    struct gguf_file *f;
    CHECK_OK(gguf_open_mem(mem, size, &f));
    uint64_t last_end = 0; /* end of the last tensor's bytes */
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        last_end = TERN_MAX(last_end, gguf_data_offset(f) + t->offset + t->size);
    }
    uint64_t header_end = gguf_data_offset(f);
    gguf_close(f);
    for (size_t n = 0; n < size; n++) {
        enum tern_status st = open_bytes(mem, n);
        if (n >= last_end) {
            CHECK_OK(st); /* only trailing padding is missing */
            continue;
        }
        if (st != TERN_ERR_FORMAT) fail_msg("prefix %zu: status %d: %s", n, st, tern_last_error());
        if (n >= header_end && !strstr(tern_last_error(), "runs past end of file"))
            fail_msg("prefix %zu: %s", n, tern_last_error());
    }
    free(mem);
}

/* ---- allocation failure injection ------------------------------------------------------ */

static void test_alloc_failures(void **state) {
    (void)state;
    struct gguf_writer *w = writer_everything();
    void *mem;
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, &mem, &size));
    gguf_writer_free(w);
    char path[512];
    snprintf(path, sizeof path, "%s/fail.gguf", th_tmpdir());
    FILE *fp = fopen(path, "wb");
    assert_int_equal(fwrite(mem, 1, size, fp), size);
    fclose(fp);

    for (int mode = 0; mode < 3; mode++) {
        long n;
        for (n = 0; n < 1000; n++) {
            struct gguf_file *f = NULL;
            struct gguf_open_opts opts = {.no_mmap = mode == 2};
            tern_alloc_fail_after(n);
            enum tern_status st = mode == 0 ? gguf_open_mem(mem, size, &f) : gguf_open(path, &opts, &f);
            tern_alloc_fail_after(-1);
            if (st == TERN_OK) {
                check_everything(f);
                gguf_close(f);
                break;
            }
            if (st != TERN_ERR_NOMEM) fail_msg("mode %d, fail after %ld: status %d: %s", mode, n, st, tern_last_error());
            assert_null(f);
        }
        assert_true(n > 3 && n < 1000);
    }

    /* The writer too: every failure is NOMEM, and nothing leaks. */
    long n;
    for (n = 0; n < 1000; n++) {
        tern_alloc_fail_after(n);
        struct gguf_writer *ww = NULL;
        enum tern_status st = gguf_writer_new(&ww);
        if (!st) st = gguf_writer_set_str(ww, "general.name", "x");
        const struct gguf_str strs[] = {{"a", 1}, {"bc", 2}};
        if (!st) st = gguf_writer_set_arr_str(ww, "s", strs, 2);
        uint64_t ne[1] = {12};
        if (!st) st = gguf_writer_add_tensor(ww, "t", TERN_DTYPE_F32, 1, ne, t_f32, 48);
        void *out = NULL;
        size_t out_size;
        if (!st) st = gguf_writer_write_mem(ww, &out, &out_size);
        tern_alloc_fail_after(-1);
        gguf_writer_free(ww);
        free(out);
        if (st == TERN_OK) break;
        if (st != TERN_ERR_NOMEM) fail_msg("writer, fail after %ld: status %d: %s", n, st, tern_last_error());
    }
    assert_true(n > 3 && n < 1000);
    free(mem);
}

/* ---- fuzz seeds ------------------------------------------------------------------------ */

static void write_bytes(const char *dir, const char *name, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(p, 1, n, fp) != n) {
        perror(path);
        exit(1);
    }
    fclose(fp);
    printf("%s: %zu bytes\n", path, n);
}

static void write_seed(const char *dir, const char *name, struct gguf_writer *w) {
    void *mem;
    size_t size;
    CHECK_OK(gguf_writer_write_mem(w, &mem, &size));
    write_bytes(dir, name, mem, size);
    free(mem);
    gguf_writer_free(w);
}

/* A real model shrunk to fuzzing size: every kv (arrays cut to 8 elements) and every
 * tensor name and type, each tensor one row of one block taken from the real data. */
static void write_shrunk(const char *dir, const char *rel, const char *name) {
    const char *path = th_shared_path(rel);
    struct gguf_file *f;
    if (!path || gguf_open(path, NULL, &f)) return;
    struct gguf_writer *w;
    CHECK_OK(gguf_writer_new(&w));
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        struct gguf_kv kv = *gguf_kv_at(f, i);
        if (kv.type == GGUF_TYPE_ARRAY && kv.v.arr.n > 8) kv.v.arr.n = 8;
        if (kv.type == GGUF_TYPE_STRING && kv.v.str.len > 200) kv.v.str.len = 200; /* chat template */
        CHECK_OK(gguf_writer_set_kv(w, &kv));
    }
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        const struct tern_dtype_info *info = tern_dtype_info(t->type);
        uint64_t ne[GGUF_MAX_DIMS] = {info->blck_size, 1, 1, 1};
        CHECK_OK(gguf_writer_add_tensor(w, t->name.ptr, t->type, t->n_dims, ne, t->data, info->type_size));
    }
    gguf_close(f);
    write_seed(dir, name, w);
}

/* A real file cut after its tensor infos and a little data (or at max bytes). */
static void write_prefix(const char *dir, const char *rel, const char *name, size_t max) {
    const char *path = th_shared_path(rel);
    size_t len;
    char *bytes = path ? th_read_file(path, &len) : NULL;
    if (!bytes) return;
    struct gguf_open_opts opts = {.no_data = true};
    struct gguf_file *f;
    size_t cut = max;
    if (!gguf_open(path, &opts, &f)) {
        cut = TERN_MIN((size_t)gguf_data_offset(f) + 256, max);
        gguf_close(f);
    }
    write_bytes(dir, name, bytes, TERN_MIN(cut, len));
    free(bytes);
}

static int write_seeds(const char *dir) {
    write_seed(dir, "seed-everything.gguf", writer_everything());
    struct gguf_writer *w;
    CHECK_OK(gguf_writer_new(&w));
    write_seed(dir, "seed-empty.gguf", w);

    CHECK_OK(gguf_writer_new(&w));
    CHECK_OK(gguf_writer_set_u32(w, "general.alignment", 64));
    CHECK_OK(gguf_writer_set_str(w, "general.architecture", "llama"));
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i;
    uint64_t ne_a[2] = {8, 8}, ne_b[3] = {2, 2, 2};
    CHECK_OK(gguf_writer_add_tensor(w, "token_embd.weight", TERN_DTYPE_F32, 2, ne_a, x, sizeof x));
    CHECK_OK(gguf_writer_add_tensor(w, "output_norm.weight", TERN_DTYPE_F32, 3, ne_b, x, 32));
    write_seed(dir, "seed-align64.gguf", w);

    /* Vocab-style: tokens, scores, types, merges, no tensors. */
    CHECK_OK(gguf_writer_new(&w));
    const struct gguf_str toks[] = {{"<unk>", 5}, {"a", 1}, {"b", 1}, {"ab", 2}, {"\xc4\xa0", 2}};
    const float scores[] = {0, -1, -2, -3, -4};
    const int32_t types[] = {2, 1, 1, 1, 1};
    const struct gguf_str merges[] = {{"a b", 3}};
    CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2"));
    CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 5));
    CHECK_OK(gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 5));
    CHECK_OK(gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 5));
    CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1));
    CHECK_OK(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0));
    CHECK_OK(gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false));
    write_seed(dir, "seed-vocab.gguf", w);

    /* One tensor of every type the dtype table knows, one block each. */
    CHECK_OK(gguf_writer_new(&w));
    uint8_t block[512];
    for (size_t i = 0; i < sizeof block; i++) block[i] = (uint8_t)(i * 13 + 1);
    for (uint32_t id = 0; id < TERN_DTYPE_COUNT; id++) {
        const struct tern_dtype_info *info = tern_dtype_info(id);
        if (!info) continue;
        char name[64];
        snprintf(name, sizeof name, "t.%s", info->name);
        uint64_t ne[1] = {info->blck_size};
        CHECK_OK(gguf_writer_add_tensor(w, name, (enum tern_dtype)id, 1, ne, block, info->type_size));
    }
    write_seed(dir, "seed-all-types.gguf", w);

    if (th_shared_dir()) {
        write_shrunk(dir, "models/tiny-qwen3-f32.gguf", "seed-shrunk-tiny-qwen3-f32.gguf");
        write_shrunk(dir, "models/tiny-qwen35-q4_k_m.gguf", "seed-shrunk-tiny-qwen35-q4_k_m.gguf");
        write_shrunk(dir, "models/tiny-qwen3-q4_0.gguf", "seed-shrunk-tiny-qwen3-q4_0.gguf");
        write_shrunk(dir, "models/stories260K.gguf", "seed-shrunk-stories260K.gguf");
        write_shrunk(dir, "conformance/tokenizer/ggml-vocab-llama-spm.gguf", "seed-shrunk-vocab-llama-spm.gguf");
        write_prefix(dir, "models/stories260K.gguf", "seed-prefix-stories260K.gguf", 60000);
        write_prefix(dir, "models/tiny-qwen35-f32.gguf", "seed-prefix-tiny-qwen35-f32.gguf", 32768);
        write_prefix(dir, "conformance/tokenizer/ggml-vocab-bert-bge.gguf", "seed-prefix-vocab-bert-bge.gguf", 16384);
    }
    return 0;
}

/* Two binaries from this file: test-gguf (self-contained) and test-gguf-shared (the
 * real files of the shared kit; it skips as a whole when the kit is absent).
 * `test-gguf write-seeds DIR` writes the fuzz seed corpus (tests/fuzz/corpus/gguf). */
int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "write-seeds")) return write_seeds(argv[2]);
    if (argc > 1 && !strcmp(argv[1], "shared")) {
        th_require_shared("models/tiny-qwen3-f32.gguf");
        const struct CMUnitTest shared[] = {
            cmocka_unit_test(test_shared_models),
            cmocka_unit_test(test_shared_all_files),
            cmocka_unit_test(test_shared_truncated),
        };
        return cmocka_run_group_tests(shared, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_mem_and_file),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_alignment_key),
        cmocka_unit_test(test_streamed_tensor),
        cmocka_unit_test(test_many_keys),
        cmocka_unit_test(test_malformed_table),
        cmocka_unit_test(test_truncated_every_byte),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_read_fits_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
