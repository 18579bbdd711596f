/* Tensor element types, numbered as GGUF (ggml) numbers them. This table is shared by
 * the GGUF reader (to validate sizes) and by the kernels (which compute with the types
 * marked supported). Block layouts live in kernels/quant.h. */
#ifndef TERN_UTIL_DTYPE_H
#define TERN_UTIL_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tern_dtype {
    TERN_DTYPE_F32 = 0,
    TERN_DTYPE_F16 = 1,
    TERN_DTYPE_Q4_0 = 2,
    TERN_DTYPE_Q4_1 = 3,
    TERN_DTYPE_Q5_0 = 6,
    TERN_DTYPE_Q5_1 = 7,
    TERN_DTYPE_Q8_0 = 8,
    TERN_DTYPE_Q8_1 = 9,
    TERN_DTYPE_Q2_K = 10,
    TERN_DTYPE_Q3_K = 11,
    TERN_DTYPE_Q4_K = 12,
    TERN_DTYPE_Q5_K = 13,
    TERN_DTYPE_Q6_K = 14,
    TERN_DTYPE_Q8_K = 15,
    TERN_DTYPE_IQ2_XXS = 16,
    TERN_DTYPE_IQ2_XS = 17,
    TERN_DTYPE_IQ3_XXS = 18,
    TERN_DTYPE_IQ1_S = 19,
    TERN_DTYPE_IQ4_NL = 20,
    TERN_DTYPE_IQ3_S = 21,
    TERN_DTYPE_IQ2_S = 22,
    TERN_DTYPE_IQ4_XS = 23,
    TERN_DTYPE_I8 = 24,
    TERN_DTYPE_I16 = 25,
    TERN_DTYPE_I32 = 26,
    TERN_DTYPE_I64 = 27,
    TERN_DTYPE_F64 = 28,
    TERN_DTYPE_IQ1_M = 29,
    TERN_DTYPE_BF16 = 30,
    TERN_DTYPE_TQ1_0 = 34,
    TERN_DTYPE_TQ2_0 = 35,
    TERN_DTYPE_MXFP4 = 39,
    TERN_DTYPE_COUNT = 40
};

struct tern_dtype_info {
    const char *name;   /* "Q4_K"; NULL for ids that are not a type */
    uint32_t blck_size; /* elements per block */
    uint32_t type_size; /* bytes per block */
    bool supported;     /* tern's kernels compute with it (dequant + dot) */
};

/* NULL when id is not a known type. */
const struct tern_dtype_info *tern_dtype_info(uint32_t id);
const char *tern_dtype_name(uint32_t id); /* "unknown" for unknown ids */
/* Parses "q4_k", "Q8_0", "f16" ... (case-insensitive). Returns false if unknown. */
bool tern_dtype_from_name(const char *name, enum tern_dtype *out);
/* Bytes of a row of n elements. false when n is not a multiple of the block size or
 * on overflow. */
bool tern_dtype_row_size(enum tern_dtype t, uint64_t n, uint64_t *bytes);

#endif
