/* Tiny random-weight models for the engine tests, written with the GGUF writer, so the
 * exactness and state tests run without the shared kit. */
#ifndef TERN_TEST_MODEL_GEN_H
#define TERN_TEST_MODEL_GEN_H

#include "util/dtype.h"

#include <stdbool.h>
#include <stdint.h>

struct tgen {
    const char *arch; /* "llama", "qwen2", "qwen3" */
    uint32_t n_vocab, n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, n_ctx;
    enum tern_dtype wtype;    /* matmul weights and the embedding table */
    enum tern_dtype out_type; /* output.weight (0 = wtype) */
    bool tied;                /* no output.weight */
    float freq_base;
    const char *rope_scaling; /* NULL, "linear", "yarn" */
    float rope_factor;
    uint64_t seed;
    const char *skip_tensor;  /* leave this tensor out (validation tests) */
    const char *bad_tensor;   /* give this tensor a wrong row count */
};

/* Small defaults: 2 layers, n_embd 256, 4 heads / 2 kv heads of 64, ffn 256, vocab 256. */
void tgen_defaults(struct tgen *g, const char *arch, enum tern_dtype wtype);
/* Writes the model to path (a file under th_tmpdir()); returns 0 on success. */
int tgen_write(const struct tgen *g, const char *path);
/* A path in the test's temp dir named after the configuration. */
const char *tgen_path(const char *name);

#endif
