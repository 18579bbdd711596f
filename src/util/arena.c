#include "util/arena.h"

#include "util/mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN 16

struct tern_arena_chunk {
    struct tern_arena_chunk *next;
    size_t size; /* usable bytes after the header */
    _Alignas(ARENA_ALIGN) char data[];
};

void tern_arena_init(struct tern_arena *a, size_t first_size, size_t limit) {
    memset(a, 0, sizeof *a);
    a->first_size = first_size ? first_size : 4096;
    a->limit = limit;
}

static size_t align_up(size_t n) { return (n + (ARENA_ALIGN - 1)) & ~(size_t)(ARENA_ALIGN - 1); }

static bool new_chunk(struct tern_arena *a, size_t need) {
    size_t size = a->head ? a->head->size * 2 : a->first_size;
    if (size < need) size = need;
    size = align_up(size);
    size_t bytes;
    if (tern_add_overflow(size, sizeof(struct tern_arena_chunk), &bytes)) {
        a->err = tern_errorf(TERN_ERR_NOMEM, "arena allocation of %zu bytes overflows", need);
        return false;
    }
    if (a->limit) {
        /* Near the limit, fall back to the smallest chunk that fits. */
        if (a->total + bytes > a->limit && need < size) {
            size = align_up(need);
            bytes = size + sizeof(struct tern_arena_chunk);
        }
        if (a->total > a->limit || bytes > a->limit - a->total) {
            a->err = tern_errorf(TERN_ERR_LIMIT, "memory limit of %zu bytes exceeded (%zu in use, %zu more wanted)",
                        a->limit, a->total, need);
            return false;
        }
    }
    struct tern_arena_chunk *c = tern_malloc(bytes);
    if (!c) {
        a->err = tern_errorf(TERN_ERR_NOMEM, "cannot allocate an arena chunk of %zu bytes", bytes);
        return false;
    }
    c->size = size;
    c->next = a->head;
    a->head = c;
    a->top = c->data;
    a->end = c->data + size;
    a->last = NULL;
    a->total += bytes;
    return true;
}

void *tern_arena_alloc(struct tern_arena *a, size_t size) {
    size_t n = align_up(size ? size : 1);
    if (n < size) {
        a->err = tern_errorf(TERN_ERR_NOMEM, "arena allocation of %zu bytes overflows", size);
        return NULL;
    }
    if (!a->head || (size_t)(a->end - a->top) < n) {
        if (!new_chunk(a, n)) return NULL;
    }
    char *p = a->top;
    a->top += n;
    a->last = p;
    a->last_size = size;
    return p;
}

void *tern_arena_calloc(struct tern_arena *a, size_t n, size_t size) {
    size_t bytes;
    if (tern_mul_overflow(n, size, &bytes)) {
        a->err = tern_errorf(TERN_ERR_NOMEM, "arena allocation of %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    void *p = tern_arena_alloc(a, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

bool tern_arena_is_last(const struct tern_arena *a, const void *p, size_t size) {
    return p && p == a->last && size == a->last_size;
}

void *tern_arena_grow(struct tern_arena *a, void *p, size_t old_size, size_t new_size) {
    if (p && p == a->last && old_size == a->last_size) {
        size_t n = align_up(new_size ? new_size : 1);
        if (n >= new_size && (size_t)(a->end - (char *)p) >= n) {
            a->top = (char *)p + n;
            a->last_size = new_size;
            return p;
        }
    }
    void *q = tern_arena_alloc(a, new_size);
    if (!q) return NULL;
    if (p && old_size) memcpy(q, p, old_size < new_size ? old_size : new_size);
    return q;
}

char *tern_arena_strndup(struct tern_arena *a, const char *s, size_t n) {
    size_t bytes;
    if (tern_add_overflow(n, 1, &bytes)) {
        a->err = tern_errorf(TERN_ERR_NOMEM, "arena string of %zu bytes overflows", n);
        return NULL;
    }
    char *p = tern_arena_alloc(a, bytes);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void tern_arena_reset(struct tern_arena *a) {
    struct tern_arena_chunk *keep = NULL, *c = a->head;
    while (c) {
        struct tern_arena_chunk *next = c->next;
        if (!keep || c->size > keep->size) {
            if (keep) free(keep);
            keep = c;
        } else {
            free(c);
        }
        c = next;
    }
    a->head = keep;
    a->last = NULL;
    if (keep) {
        keep->next = NULL;
        a->top = keep->data;
        a->end = keep->data + keep->size;
        a->total = keep->size + sizeof(struct tern_arena_chunk);
    } else {
        a->top = a->end = NULL;
        a->total = 0;
    }
}

void tern_arena_free(struct tern_arena *a) {
    if (!a) return;
    struct tern_arena_chunk *c = a->head;
    while (c) {
        struct tern_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->top = a->end = a->last = NULL;
    a->total = 0;
}
