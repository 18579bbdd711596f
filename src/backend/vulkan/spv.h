/* The compute shaders (shaders/NAME.comp), compiled to SPIR-V by glslc at build time and
 * embedded by cmake/embed-spv.cmake as tern_spv_NAME (size in bytes: tern_spv_NAME_size). */
#ifndef TERN_BACKEND_VULKAN_SPV_H
#define TERN_BACKEND_VULKAN_SPV_H

#include <stddef.h>
#include <stdint.h>

extern const uint32_t tern_spv_matmul[], tern_spv_rmsnorm[], tern_spv_rows[], tern_spv_rope[], tern_spv_attention[],
    tern_spv_kvstore[], tern_spv_dnconv[], tern_spv_dnheads[], tern_spv_split[], tern_spv_moe[];
extern const size_t tern_spv_matmul_size, tern_spv_rmsnorm_size, tern_spv_rows_size, tern_spv_rope_size,
    tern_spv_attention_size, tern_spv_kvstore_size, tern_spv_dnconv_size, tern_spv_dnheads_size,
    tern_spv_split_size, tern_spv_moe_size;

#endif
