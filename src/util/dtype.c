#include "util/dtype.h"

#include <strings.h>

static const struct tern_dtype_info infos[TERN_DTYPE_COUNT] = {
    [TERN_DTYPE_F32] = {"F32", 1, 4, true},
    [TERN_DTYPE_F16] = {"F16", 1, 2, true},
    [TERN_DTYPE_Q4_0] = {"Q4_0", 32, 18, true},
    [TERN_DTYPE_Q4_1] = {"Q4_1", 32, 20, true},
    [TERN_DTYPE_Q5_0] = {"Q5_0", 32, 22, true},
    [TERN_DTYPE_Q5_1] = {"Q5_1", 32, 24, true},
    [TERN_DTYPE_Q8_0] = {"Q8_0", 32, 34, true},
    [TERN_DTYPE_Q8_1] = {"Q8_1", 32, 36, false},
    [TERN_DTYPE_Q2_K] = {"Q2_K", 256, 84, true},
    [TERN_DTYPE_Q3_K] = {"Q3_K", 256, 110, true},
    [TERN_DTYPE_Q4_K] = {"Q4_K", 256, 144, true},
    [TERN_DTYPE_Q5_K] = {"Q5_K", 256, 176, true},
    [TERN_DTYPE_Q6_K] = {"Q6_K", 256, 210, true},
    [TERN_DTYPE_Q8_K] = {"Q8_K", 256, 292, false},
    [TERN_DTYPE_IQ2_XXS] = {"IQ2_XXS", 256, 66, true},
    [TERN_DTYPE_IQ2_XS] = {"IQ2_XS", 256, 74, true},
    [TERN_DTYPE_IQ3_XXS] = {"IQ3_XXS", 256, 98, true},
    [TERN_DTYPE_IQ1_S] = {"IQ1_S", 256, 50, true},
    [TERN_DTYPE_IQ4_NL] = {"IQ4_NL", 32, 18, true},
    [TERN_DTYPE_IQ3_S] = {"IQ3_S", 256, 110, true},
    [TERN_DTYPE_IQ2_S] = {"IQ2_S", 256, 82, true},
    [TERN_DTYPE_IQ4_XS] = {"IQ4_XS", 256, 136, true},
    [TERN_DTYPE_I8] = {"I8", 1, 1, false},
    [TERN_DTYPE_I16] = {"I16", 1, 2, false},
    [TERN_DTYPE_I32] = {"I32", 1, 4, false},
    [TERN_DTYPE_I64] = {"I64", 1, 8, false},
    [TERN_DTYPE_F64] = {"F64", 1, 8, false},
    [TERN_DTYPE_IQ1_M] = {"IQ1_M", 256, 56, true},
    [TERN_DTYPE_BF16] = {"BF16", 1, 2, true},
    [TERN_DTYPE_TQ1_0] = {"TQ1_0", 256, 54, false},
    [TERN_DTYPE_TQ2_0] = {"TQ2_0", 256, 66, false},
    [TERN_DTYPE_MXFP4] = {"MXFP4", 32, 17, true},
};

const struct tern_dtype_info *tern_dtype_info(uint32_t id) {
    if (id >= TERN_DTYPE_COUNT || !infos[id].name) return NULL;
    return &infos[id];
}

const char *tern_dtype_name(uint32_t id) {
    const struct tern_dtype_info *i = tern_dtype_info(id);
    return i ? i->name : "unknown";
}

bool tern_dtype_from_name(const char *name, enum tern_dtype *out) {
    for (uint32_t i = 0; i < TERN_DTYPE_COUNT; i++) {
        if (infos[i].name && !strcasecmp(infos[i].name, name)) {
            *out = (enum tern_dtype)i;
            return true;
        }
    }
    return false;
}

bool tern_dtype_row_size(enum tern_dtype t, uint64_t n, uint64_t *bytes) {
    const struct tern_dtype_info *i = tern_dtype_info((uint32_t)t);
    if (!i || n % i->blck_size) return false;
    return !__builtin_mul_overflow(n / i->blck_size, (uint64_t)i->type_size, bytes);
}
