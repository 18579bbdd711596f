/* A bump allocator: many small allocations freed all at once.
 *
 * Memory comes in chunks that grow geometrically; nothing is freed individually.
 * An optional byte limit bounds the total (work driven by untrusted input, such as a
 * template render, cannot exhaust memory). Allocation failures return NULL and set
 * the thread's error message (TERN_ERR_NOMEM, or TERN_ERR_LIMIT naming the limit). */
#ifndef TERN_UTIL_ARENA_H
#define TERN_UTIL_ARENA_H

#include "util/status.h"

#include <stdbool.h>
#include <stddef.h>

struct tern_arena_chunk;

struct tern_arena {
    struct tern_arena_chunk *head; /* newest chunk first */
    char *top;                     /* next free byte of head */
    char *end;                     /* end of head */
    char *last;                    /* start of the most recent allocation (for _grow) */
    size_t last_size;              /* its size as requested */
    size_t total;                  /* bytes of all chunks */
    size_t limit;                  /* 0 = unlimited */
    size_t first_size;             /* size of the first chunk (0 = 4 KiB) */
    enum tern_status err;          /* why the last failed allocation failed (NOMEM or LIMIT) */
};

/* first_size: size of the first chunk (0 = 4 KiB); limit: cap on the bytes of all
 * chunks together (0 = unlimited). An initialised arena holds no memory yet. */
void tern_arena_init(struct tern_arena *a, size_t first_size, size_t limit);
/* 16-byte aligned; NULL (message set) when memory or the limit runs out. */
void *tern_arena_alloc(struct tern_arena *a, size_t size);
void *tern_arena_calloc(struct tern_arena *a, size_t n, size_t size);
/* Resizes p, which holds old_size bytes, to new_size bytes. When p is the most recent
 * allocation, old_size is its whole size and the chunk has room, it grows in place
 * (bytes before old_size never move, so other views of them stay valid); otherwise a
 * new block is allocated and old_size bytes copied. p may be NULL (old_size 0). */
void *tern_arena_grow(struct tern_arena *a, void *p, size_t old_size, size_t new_size);
/* True when p is the most recent allocation and exactly size bytes long, so that
 * tern_arena_grow may extend it in place. */
bool tern_arena_is_last(const struct tern_arena *a, const void *p, size_t size);
char *tern_arena_strndup(struct tern_arena *a, const char *s, size_t n);
/* Frees every chunk but the largest, which is kept for reuse. */
void tern_arena_reset(struct tern_arena *a);
void tern_arena_free(struct tern_arena *a);

#endif
