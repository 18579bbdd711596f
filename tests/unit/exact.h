/* Shared by the model tests that run the exactness matrix on a GGUF file and check how
 * a model file with one thing changed fails to load (test-qwen35, test-moe). */
#ifndef TERN_TEST_EXACT_H
#define TERN_TEST_EXACT_H

#include "tern.h"

#include <stddef.h>
#include <stdint.h>

/* The first n prompt ids of the kit's tiny-qwen35-f32 p400 reference (caller frees). */
int32_t *tx_prompt(size_t n);

/* Logits at every position and every state component hash are bit-identical for
 * chunkings 1, 7, 64, 512 and token by token, on 1, 2 and 3 threads (the prompt ids are
 * taken modulo the model's vocabulary). */
void tx_check_exact(const char *label, const char *path, enum tern_kv_type kv, size_t n);

/* One change to a model file of the kit. */
struct tx_mutation {
    const char *drop;    /* tensor left out */
    const char *reshape; /* tensor whose ne[0] becomes new_ne0 (data truncated) */
    uint64_t new_ne0;
    const char *key;     /* u32 metadata key to set (added when the file lacks it) */
    uint32_t key_val;
};

/* Writes a copy of the kit's model src_rel with one thing changed into the test's temp
 * dir under the name file; returns its path (static storage). */
const char *tx_mutated_model(const char *src_rel, const struct tx_mutation *mu, const char *file);
/* The mutated model fails to load with want, and the message holds every needle. */
void tx_expect_load_error(const char *src_rel, const struct tx_mutation *mu, enum tern_status want,
                          const char *const *needles);

#endif
