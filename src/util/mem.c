#include "util/mem.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic long fail_after = -1;
static _Atomic unsigned long n_failed;

void tern_alloc_fail_after(long n) { atomic_store(&fail_after, n); }

unsigned long tern_alloc_failures(void) { return atomic_load(&n_failed); }

static bool should_fail(void) {
    long v = atomic_load(&fail_after);
    if (v < 0) return false;
    if (v == 0) return true;
    atomic_fetch_sub(&fail_after, 1);
    return false;
}

/* Counts a failed allocation (injected, too large or refused by the system). */
static void *counted(void *p) {
    if (!p) atomic_fetch_add(&n_failed, 1);
    return p;
}

void *tern_malloc(size_t size) {
    if (should_fail()) return counted(NULL);
    return counted(malloc(size ? size : 1));
}

void *tern_calloc(size_t n, size_t size) {
    size_t total;
    if (tern_mul_overflow(n, size, &total) || should_fail()) return counted(NULL);
    return counted(calloc(total ? n : 1, total ? size : 1));
}

void *tern_reallocarray(void *p, size_t n, size_t size) {
    size_t total;
    if (tern_mul_overflow(n, size, &total) || should_fail()) return counted(NULL);
    return counted(realloc(p, total ? total : 1));
}

void *tern_aligned_alloc(size_t size) {
    if (should_fail()) return counted(NULL);
    void *p = NULL;
    if (posix_memalign(&p, 64, size ? size : 64) != 0) return counted(NULL);
    return p;
}

void tern_aligned_free(void *p) { free(p); }

char *tern_strndup(const char *s, size_t n) {
    char *d = tern_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

char *tern_strdup(const char *s) { return tern_strndup(s, strlen(s)); }

void tern_json_alloc_init(void) { json_set_alloc_funcs(tern_malloc, free); }
