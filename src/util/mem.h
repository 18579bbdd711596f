/* Checked arithmetic and allocation helpers. Sizes from files and requests go through
 * these before anything is multiplied or allocated. */
#ifndef TERN_UTIL_MEM_H
#define TERN_UTIL_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* true on overflow (then *out is unspecified). */
static inline bool tern_mul_overflow(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool tern_add_overflow(size_t a, size_t b, size_t *out) {
    return __builtin_add_overflow(a, b, out);
}
static inline bool tern_mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool tern_add_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

/* malloc/calloc/realloc of n * size bytes; NULL on overflow or failure. The test
 * harness can make the N-th allocation fail (tern_alloc_fail_after) to exercise error
 * paths, as SQLite does. */
void *tern_malloc(size_t size);
void *tern_calloc(size_t n, size_t size);
void *tern_reallocarray(void *p, size_t n, size_t size);
/* 64-byte aligned; free with tern_aligned_free. */
void *tern_aligned_alloc(size_t size);
void tern_aligned_free(void *p);
char *tern_strdup(const char *s);
char *tern_strndup(const char *s, size_t n);

/* Fault injection for tests: after `n` more successful allocations, every allocation
 * through the functions above fails. n < 0 disables (the default). */
void tern_alloc_fail_after(long n);
/* How many allocations through the functions above have failed (injected or not) since
 * the start: a caller whose library reports failures vaguely (jansson's parser calls a
 * failed allocation a syntax error) compares it before and after. */
unsigned long tern_alloc_failures(void);

/* Routes jansson's allocations through tern_malloc (json_set_alloc_funcs), so that the
 * fault injection above reaches JSON parsing and building (request.c) like the rest.
 * Call once, before a second thread uses jansson (tern's main does; so do the tests that
 * inject faults). Values jansson allocated before stay valid: both allocators free with
 * free(). */
void tern_json_alloc_init(void);

#define TERN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TERN_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TERN_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
