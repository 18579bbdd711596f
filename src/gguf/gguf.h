/* GGUF files: a validating reader (v2 and v3, mmap) and a writer (v3).
 *
 * The reader trusts nothing in the file: every count, string length, dimension,
 * element count x type size and offset + size is checked for overflow and against the
 * file size before it is used, and errors name the field or tensor and the numbers.
 * After a successful open every pointer handed out (strings, arrays, tensor data) is
 * valid until gguf_close(). */
#ifndef TERN_GGUF_H
#define TERN_GGUF_H

#include "util/dtype.h"
#include "util/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
};

const char *gguf_type_name(enum gguf_type t);
/* Bytes of one scalar of type t; 0 for STRING, ARRAY and invalid types. */
size_t gguf_type_size(enum gguf_type t);

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

/* A string: NUL-terminated copy (ptr[len] == 0); may contain inner NUL bytes.
 * Zero-length arrays have a non-NULL data/strs pointer. */
struct gguf_str {
    const char *ptr;
    uint64_t len;
};

struct gguf_kv {
    struct gguf_str key;
    enum gguf_type type;
    union {
        uint64_t u64;  /* UINT8/16/32/64 */
        int64_t i64;   /* INT8/16/32/64 */
        double f64;    /* FLOAT32/64 */
        bool b;        /* BOOL */
        struct gguf_str str;
        struct {
            enum gguf_type type; /* element type (never ARRAY: nested arrays are refused) */
            uint64_t n;
            const void *data;            /* numeric elements, packed, 8-byte aligned (a copy) */
            const struct gguf_str *strs; /* STRING elements */
        } arr;
    } v;
};

struct gguf_tensor {
    struct gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the row length (contiguous); unused dims = 1 */
    enum tern_dtype type;
    uint64_t offset;            /* from the start of the data section */
    uint64_t n_elements;
    uint64_t size;              /* bytes */
    const void *data;           /* into the mapping (or the owned copy) */
};

struct gguf_file;

struct gguf_open_opts {
    bool no_mmap;  /* read the whole file into memory instead of mapping it */
    bool mlock;    /* mlock the mapping */
    bool no_data;  /* metadata only: tensor data need not be present (vocab files are fine either way) */
};

/* Opens and validates a file. On error *out is NULL and the message names the problem
 * (prefixed with the path). opts may be NULL (mmap, no mlock, data required). A failed
 * mlock is logged as a warning, not an error. With no_data, a tensor whose bytes lie
 * past the end of the file has data == NULL instead of failing the open. */
enum tern_status gguf_open(const char *path, const struct gguf_open_opts *opts, struct gguf_file **out);
/* The weights-in-memory default of the server: true when reading the file at path into
 * memory (no_mmap) leaves at least as much memory available as the file takes, i.e. its
 * size is at most half of MemAvailable (/proc/meminfo). Read weights are anonymous
 * memory with 2 MiB pages where the kernel grants them: decode runs faster from them than
 * from a mapping, and page-cache reclaim (DAMON on the project's VMs) cannot evict them
 * under a running model. A larger file is better mapped (it may not fit at all). size and
 * avail (either may be NULL) receive the two figures; false, with both 0, when the file
 * or /proc/meminfo cannot be read. */
bool gguf_read_fits_memory(const char *path, uint64_t *size, uint64_t *avail);
/* Same from a memory buffer (not copied: it must outlive the gguf_file). */
enum tern_status gguf_open_mem(const void *data, size_t size, struct gguf_file **out);
void gguf_close(struct gguf_file *f);

uint32_t gguf_version(const struct gguf_file *f);
uint32_t gguf_alignment(const struct gguf_file *f);
uint64_t gguf_data_offset(const struct gguf_file *f);
uint64_t gguf_file_size(const struct gguf_file *f);
const char *gguf_path(const struct gguf_file *f); /* "" for memory files */

uint64_t gguf_n_kv(const struct gguf_file *f);
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, uint64_t i);
const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);

/* Typed getters. Integer getters accept any integer type whose value fits (and bool
 * for nothing); they return TERN_ERR_FORMAT naming the key when the type or value does
 * not fit, and TERN_ERR_INVALID ("key not found") when absent — callers with a default
 * check gguf_find_kv first or use the _or variants. */
enum tern_status gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
enum tern_status gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out);
enum tern_status gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out);
enum tern_status gguf_get_f32(const struct gguf_file *f, const char *key, float *out); /* ints accepted */
enum tern_status gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
enum tern_status gguf_get_str(const struct gguf_file *f, const char *key, const struct gguf_str **out);
/* Absent -> *out = def and TERN_OK; present with a wrong type -> TERN_ERR_FORMAT. */
enum tern_status gguf_get_u32_or(const struct gguf_file *f, const char *key, uint32_t def, uint32_t *out);
enum tern_status gguf_get_f32_or(const struct gguf_file *f, const char *key, float def, float *out);
enum tern_status gguf_get_bool_or(const struct gguf_file *f, const char *key, bool def, bool *out);
/* An array of the given element type. An integer elem accepts an array of any integer
 * type (read it through gguf_arr_get_i64), a float elem f32 or f64 (gguf_arr_get_f64);
 * check kv->v.arr.type before reading v.arr.data through a typed pointer. */
enum tern_status gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_type elem,
                              const struct gguf_kv **out);
int64_t gguf_arr_get_i64(const struct gguf_kv *kv, uint64_t i);   /* integer arrays (u64 wraps) */
double gguf_arr_get_f64(const struct gguf_kv *kv, uint64_t i);    /* float/int arrays */

uint64_t gguf_n_tensors(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, uint64_t i);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *f, const char *name);

/* ---- writer (v3) ---------------------------------------------------------------- */

struct gguf_writer;

enum tern_status gguf_writer_new(struct gguf_writer **out);
void gguf_writer_free(struct gguf_writer *w);
/* Metadata, in insertion order. Keys must be unique (TERN_ERR_INVALID otherwise). */
enum tern_status gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
enum tern_status gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
enum tern_status gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
enum tern_status gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
enum tern_status gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
enum tern_status gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v);
/* Generic: a kv of any type (scalar, string or array), e.g. copied verbatim from
 * another file; the key is kv->key. */
enum tern_status gguf_writer_set_kv(struct gguf_writer *w, const struct gguf_kv *kv);
/* Arrays: numeric (elements packed little-endian, elem a numeric type) or strings. */
enum tern_status gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_type elem,
                                     const void *data, uint64_t n);
enum tern_status gguf_writer_set_arr_str(struct gguf_writer *w, const char *key,
                                         const struct gguf_str *strs, uint64_t n);
/* A tensor; data (size bytes, which must match type and shape) is copied. */
enum tern_status gguf_writer_add_tensor(struct gguf_writer *w, const char *name, enum tern_dtype type,
                                        uint32_t n_dims, const uint64_t *ne, const void *data, uint64_t size);
/* A tensor whose data is produced while the file is written, so that a large model
 * never has to sit in memory in full. fill is called during each gguf_writer_write /
 * _write_mem, for consecutive row ranges [row0, row0 + n_rows) in ascending order
 * (tensors in the order they were added), with dst sized n_rows * row bytes; a "row" is
 * ne[0] elements, and there are ne[1] * ne[2] * ne[3] of them. A non-OK return aborts
 * the write with that status (the callback sets the message). */
typedef enum tern_status (*gguf_fill_fn)(void *user, uint64_t row0, uint64_t n_rows, void *dst);
enum tern_status gguf_writer_add_tensor_cb(struct gguf_writer *w, const char *name, enum tern_dtype type,
                                           uint32_t n_dims, const uint64_t *ne, gguf_fill_fn fill, void *user);
/* Writes the file (alignment from "general.alignment" if set, else 32). Writes to a
 * temporary name and renames, so a failed write leaves no partial file. */
enum tern_status gguf_writer_write(struct gguf_writer *w, const char *path);
/* Same into memory (caller frees *data). */
enum tern_status gguf_writer_write_mem(struct gguf_writer *w, void **data, size_t *size);

#endif
