/* The Vulkan device layer (backend/vulkan/vulkan.h): the loader opened at run time, device
 * enumeration, buffers, and the compute pipelines built from the embedded SPIR-V
 * (the .comp files in shaders/, compiled by glslc at build time and embedded). */
#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include "backend/vulkan/vulkan.h"
#include "backend/vulkan/spv.h"
#include "kernels/quant.h"

#include "util/testhook.h"
#include "util/log.h"
#include "util/mem.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool tern_vk_built(void) { return true; }

/* ---- the loader ------------------------------------------------------------------- */

#define VK_GLOBAL_FNS(X) X(vkCreateInstance) X(vkEnumerateInstanceVersion)
#define VK_INSTANCE_FNS(X)                                                                                           \
    X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties)                               \
    X(vkGetPhysicalDeviceProperties2) X(vkGetPhysicalDeviceMemoryProperties) X(vkGetPhysicalDeviceFeatures2)           \
    X(vkGetPhysicalDeviceQueueFamilyProperties) X(vkEnumerateDeviceExtensionProperties) X(vkCreateDevice)             \
    X(vkGetDeviceProcAddr)
#define VK_DEVICE_FNS(X)                                                                                             \
    X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer) X(vkGetBufferMemoryRequirements)       \
    X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory) X(vkMapMemory) X(vkUnmapMemory)                          \
    X(vkCreateShaderModule) X(vkDestroyShaderModule) X(vkCreateDescriptorSetLayout) X(vkDestroyDescriptorSetLayout)    \
    X(vkCreatePipelineLayout) X(vkDestroyPipelineLayout) X(vkCreateComputePipelines) X(vkDestroyPipeline)              \
    X(vkCreateDescriptorPool) X(vkDestroyDescriptorPool) X(vkAllocateDescriptorSets) X(vkUpdateDescriptorSets)         \
    X(vkResetDescriptorPool) X(vkCreateCommandPool) X(vkDestroyCommandPool) X(vkAllocateCommandBuffers)                \
    X(vkBeginCommandBuffer) X(vkEndCommandBuffer) X(vkResetCommandBuffer) X(vkCmdBindPipeline)                         \
    X(vkCmdBindDescriptorSets) X(vkCmdPushConstants) X(vkCmdDispatch) X(vkCmdCopyBuffer) X(vkCmdPipelineBarrier)       \
    X(vkQueueSubmit) X(vkCreateFence) X(vkDestroyFence) X(vkWaitForFences) X(vkResetFences)

#define VK_DECL(f) static PFN_##f p_##f;
VK_GLOBAL_FNS(VK_DECL)
VK_INSTANCE_FNS(VK_DECL)
#undef VK_DECL

static pthread_once_t loader_once = PTHREAD_ONCE_INIT;
static void *loader_lib;
static PFN_vkGetInstanceProcAddr p_vkGetInstanceProcAddr;
static VkInstance instance;
static enum tern_status loader_status = TERN_OK;
static char loader_error[512];

#define INSTALL_HINT "install the Vulkan loader and a driver: apt-get install libvulkan1 mesa-vulkan-drivers"

static void load_instance(void) {
    const char *lib = getenv("TERN_VULKAN_LOADER");
    loader_lib = dlopen(lib && *lib ? lib : "libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!loader_lib) {
        snprintf(loader_error, sizeof loader_error, "vulkan: no Vulkan loader (%s): %s", dlerror(), INSTALL_HINT);
        loader_status = TERN_ERR_UNSUPPORTED;
        return;
    }
    p_vkGetInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(loader_lib, "vkGetInstanceProcAddr");
    if (!p_vkGetInstanceProcAddr) {
        snprintf(loader_error, sizeof loader_error, "vulkan: the loader has no vkGetInstanceProcAddr");
        loader_status = TERN_ERR_UNSUPPORTED;
        return;
    }
#define VK_LOAD_GLOBAL(f) p_##f = (PFN_##f)p_vkGetInstanceProcAddr(NULL, #f);
    VK_GLOBAL_FNS(VK_LOAD_GLOBAL)
#undef VK_LOAD_GLOBAL
    uint32_t api = VK_API_VERSION_1_0;
    if (p_vkEnumerateInstanceVersion) p_vkEnumerateInstanceVersion(&api);
    if (api < VK_API_VERSION_1_1) {
        snprintf(loader_error, sizeof loader_error, "vulkan: the loader offers Vulkan %u.%u; 1.1 is needed",
                 VK_API_VERSION_MAJOR(api), VK_API_VERSION_MINOR(api));
        loader_status = TERN_ERR_UNSUPPORTED;
        return;
    }
    const VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                                   .pApplicationName = "tern",
                                   .apiVersion = VK_API_VERSION_1_1};
    const VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkResult r = p_vkCreateInstance ? p_vkCreateInstance(&ci, NULL, &instance) : VK_ERROR_INITIALIZATION_FAILED;
    if (r != VK_SUCCESS) {
        snprintf(loader_error, sizeof loader_error, "vulkan: vkCreateInstance failed (VkResult %d): %s", (int)r,
                 INSTALL_HINT);
        loader_status = TERN_ERR_UNSUPPORTED;
        return;
    }
#define VK_LOAD_INSTANCE(f) p_##f = (PFN_##f)p_vkGetInstanceProcAddr(instance, #f);
    VK_INSTANCE_FNS(VK_LOAD_INSTANCE)
#undef VK_LOAD_INSTANCE
}

static enum tern_status loader_init(void) {
    pthread_once(&loader_once, load_instance);
    if (loader_status) return tern_errorf(loader_status, "%s", loader_error);
    return TERN_OK;
}

/* ---- devices ---------------------------------------------------------------------- */

#define MAX_DEVICES 16

static const char *type_name(VkPhysicalDeviceType t) {
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "cpu";
    default: return "other";
    }
}

static bool has_extension(VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    if (p_vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0) return false;
    VkExtensionProperties *e = tern_calloc(n, sizeof *e);
    if (!e) return false;
    bool found = false;
    if (p_vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = !strcmp(e[i].extensionName, name);
    free(e);
    return found;
}

static void describe(VkPhysicalDevice pd, struct tern_vk_device_info *d) {
    memset(d, 0, sizeof *d);
    VkPhysicalDeviceSubgroupProperties sub = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sub};
    p_vkGetPhysicalDeviceProperties2(pd, &p2);
    snprintf(d->name, sizeof d->name, "%s", p2.properties.deviceName);
    d->type = type_name(p2.properties.deviceType);
    d->vendor_id = p2.properties.vendorID;
    d->device_id = p2.properties.deviceID;
    d->api_version = p2.properties.apiVersion;
    d->subgroup_size = sub.subgroupSize;
    d->shared_bytes = p2.properties.limits.maxComputeSharedMemorySize;
    VkPhysicalDeviceMemoryProperties mp;
    p_vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t i = 0; i < mp.memoryHeapCount; i++)
        if (mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) d->device_local_bytes += mp.memoryHeaps[i].size;
    d->coopmat = has_extension(pd, "VK_KHR_cooperative_matrix") || has_extension(pd, "VK_NV_cooperative_matrix");
    VkPhysicalDeviceShaderFloat16Int8Features f16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f16};
    if (d->api_version >= VK_API_VERSION_1_2 || has_extension(pd, "VK_KHR_shader_float16_int8")) {
        p_vkGetPhysicalDeviceFeatures2(pd, &f2);
        d->fp16 = f16.shaderFloat16;
    }
}

static enum tern_status physical_devices(VkPhysicalDevice *pds, uint32_t *n) {
    enum tern_status st = loader_init();
    if (st) return st;
    *n = MAX_DEVICES;
    VkResult r = p_vkEnumeratePhysicalDevices(instance, n, pds);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "vulkan: vkEnumeratePhysicalDevices failed (VkResult %d)", (int)r);
    return TERN_OK;
}

enum tern_status tern_vk_enumerate(struct tern_vk_device_info *out, uint32_t cap, uint32_t *n) {
    *n = 0;
    VkPhysicalDevice pds[MAX_DEVICES];
    uint32_t np;
    enum tern_status st = physical_devices(pds, &np);
    if (st) return st;
    if (np == 0)
        return tern_errorf(TERN_ERR_UNSUPPORTED, "vulkan: the loader sees no device: %s", INSTALL_HINT);
    for (uint32_t i = 0; i < np && i < cap; i++) describe(pds[i], &out[i]);
    *n = np;
    return TERN_OK;
}

int tern_vk_pick_auto(const struct tern_vk_device_info *devs, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(devs[i].type, "discrete")) return (int)i;
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(devs[i].type, "integrated")) return (int)i;
    return -1;
}

/* ---- an open device --------------------------------------------------------------- */

#define VK_DECL(f) PFN_##f f;
struct vk_fns {
    VK_DEVICE_FNS(VK_DECL)
};
#undef VK_DECL

/* One matmul pipeline per weight type (the shader's WTYPE specialization constant). */
static const enum tern_dtype matmul_types[] = {
    TERN_DTYPE_F32,  TERN_DTYPE_F16,  TERN_DTYPE_BF16, TERN_DTYPE_Q4_0,   TERN_DTYPE_Q4_1,   TERN_DTYPE_Q5_0, TERN_DTYPE_Q5_1,
    TERN_DTYPE_Q8_0, TERN_DTYPE_Q4_K, TERN_DTYPE_Q5_K, TERN_DTYPE_Q6_K, TERN_DTYPE_IQ4_NL, TERN_DTYPE_IQ4_XS,
    TERN_DTYPE_MXFP4,
    TERN_DTYPE_Q2_K, TERN_DTYPE_Q3_K, TERN_DTYPE_IQ2_XXS, TERN_DTYPE_IQ2_XS, TERN_DTYPE_IQ2_S, TERN_DTYPE_IQ3_XXS,
    TERN_DTYPE_IQ3_S, TERN_DTYPE_IQ1_S, TERN_DTYPE_IQ1_M};
#define N_MATMUL ((int)(sizeof matmul_types / sizeof matmul_types[0]))
/* Tokens per workgroup of the matmul (matmul.comp's TT, a specialization constant): 8, or 1
 * for a dispatch of one token (and the experts' matmul of at most TERN_VK_MOE_ONE_SLOT
 * slots, whose tiles are single slots). The tile never changes a bit of an output. */
#define MATMUL_TILE ((uint32_t)TERN_VK_MATMUL_TILE)

/* Every pipeline: a shader, its specialization constants. Matmuls come first (plain, then
 * the experts' indexed ones, with tiles of MATMUL_TILE; then both again with tiles of one:
 * matmul_pipe_at); the rows operations are contiguous in rows.comp's OP order. */
enum {
    PIPE_RMSNORM = 4 * N_MATMUL, PIPE_ADD, PIPE_SWIGLU, PIPE_SIGMOID_MUL, PIPE_ADD_BIAS, PIPE_SWIGLU_OAI, PIPE_ROPE,
    PIPE_ATTN_F32, PIPE_ATTN_F16, PIPE_KVSTORE_F32, PIPE_KVSTORE_F16, PIPE_DNCONV, PIPE_DNHEADS, PIPE_SPLIT,
    PIPE_MOE_ROUTE, PIPE_MOE_COMBINE, PIPE_MOE_GROUP, PIPE_MOE_BIAS, N_PIPES
};
#define N_MODULES 10 /* matmul, rmsnorm, rows, rope, attention, kvstore, dnconv, dnheads, split, moe */
#define N_BINDINGS 8
#define PUSH_BYTES 64 /* of the 128 every device offers */

struct tern_vk {
    struct tern_vk_device_info info;
    VkPhysicalDevice pd;
    VkDevice dev;
    struct vk_fns f;
    VkQueue queue;
    uint32_t queue_family;
    VkPhysicalDeviceMemoryProperties mem;
    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkDescriptorSetLayout dsl;  /* N_BINDINGS storage buffers */
    VkPipelineLayout layout;    /* dsl + PUSH_BYTES of push constants */
    /* the sets of one recording: pools of MAX_SETS, one more made when the ones there are
     * full (a step over many sessions' rows records thousands of dispatches), all reset
     * at the next tern_vk_begin */
    VkDescriptorPool *dpools;
    uint32_t n_pools, cur_pool, n_sets;
    VkShaderModule modules[N_MODULES];
    VkPipeline pipes[N_PIPES];
    bool recording;             /* inside tern_vk_begin / tern_vk_end */
    bool lost;
    /* tests: $TERN_TEST_VK_LOSE_AFTER=N makes the device "lost" at its (N+1)-th submit, so
     * that the engine's and the server's handling of a lost device can be exercised */
    long lose_after, n_submits;
    uint32_t matmul_lanes; /* matmul.comp's LANES: invocations per weight row */
    uint64_t submits; /* every submit (tern_vk_submits) */
    /* the I-quant grid codes (matmul.comp binding 5): IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
     * IQ3_S, IQ1_S, two 16-bit codes per word, at the word offsets matmul.comp names */
    struct tern_vk_buf *iq_codes;
    /* attention's page partials when a dispatch is split over its pages (attention.comp's
     * binding 5, ATTN_PART_BYTES) */
    struct tern_vk_buf *attn_part;
    bool attn_split; /* whether tern_vk_attention splits a dispatch of few workgroups */
};

struct tern_vk_buf {
    struct tern_vk *vk;
    VkBuffer buf;
    VkDeviceMemory mem;
    size_t bytes;
    void *map; /* when host-visible */
};

static enum tern_status vk_fail(struct tern_vk *vk, VkResult r, const char *what) {
    if (r == VK_ERROR_DEVICE_LOST) {
        if (vk) vk->lost = true;
        return tern_errorf(TERN_ERR_IO, "vulkan: device lost during %s", what);
    }
    if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY)
        return tern_errorf(TERN_ERR_NOMEM, "vulkan: out of %s memory during %s",
                           r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "device" : "host", what);
    return tern_errorf(TERN_ERR_IO, "vulkan: %s failed (VkResult %d)", what, (int)r);
}

#define MAX_SETS 1024

/* One more descriptor pool of MAX_SETS sets. */
static enum tern_status add_pool(struct tern_vk *vk) {
    VkDescriptorPool *p = realloc(vk->dpools, (vk->n_pools + 1) * sizeof *p);
    if (!p) return tern_errorf(TERN_ERR_NOMEM, "vulkan: out of memory");
    vk->dpools = p;
    const VkDescriptorPoolSize ps = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, N_BINDINGS * MAX_SETS};
    const VkDescriptorPoolCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                            .maxSets = MAX_SETS,
                                            .poolSizeCount = 1,
                                            .pPoolSizes = &ps};
    VkResult r = vk->f.vkCreateDescriptorPool(vk->dev, &pci, NULL, &vk->dpools[vk->n_pools]);
    if (r) return vk_fail(vk, r, "a descriptor pool");
    vk->n_pools++;
    return TERN_OK;
}

/* matmul.comp's invocations per workgroup: 128 (4 rows of 32 lanes on a GPU), 64 rows of
 * one lane on a CPU device (the first shader's workgroup, which lavapipe ran fastest). */
static uint32_t matmul_wg(const struct tern_vk *vk) { return vk->matmul_lanes == 1 ? 64 : 128; }

/* attention.comp's shared memory: each query's scores and lane partials (ATTN_QMAX of
 * them) and STAGE words of staged cache rows, 16 KiB where the device has room (every GPU
 * of the last decade has 32 KiB or more), else what the device's limit leaves, in whole
 * rows of 256 F32 elements (at least one: Vulkan guarantees 16 KiB). */
#define ATTN_QMAX 8
/* The page partials' room: one decode token of 64 heads of 128 over 32K positions (128 pages
 * of (128 + 2) floats), or 8 tokens over 4K. A dispatch that needs more folds in the shader. */
#define ATTN_PART_BYTES ((size_t)8 << 20)
/* Workgroups below which a dispatch spanning several pages is split over them: a GPU has
 * tens of compute units, and a decode step has one per KV head (and head tile) alone. */
#define ATTN_SPLIT_BELOW 64
static uint32_t attn_stage_words(const struct tern_vk *vk) {
    const uint32_t fixed = ATTN_QMAX * (256 + 64) * 4, want = 16384;
    const uint32_t lim = vk->info.shared_bytes;
    uint32_t b = lim >= fixed + want ? want : lim > fixed + 1024 ? (lim - fixed) & ~1023u : 1024;
    return b / 4;
}

/* Pipeline i (its module and specialisation), made once. */
static enum tern_status make_pipe(struct tern_vk *vk, int i) {
    if (vk->pipes[i]) return TERN_OK;
    VkResult r;
    int mod;
    uint32_t spec_val[5] = {0, 0, 0, 0, 0};
    if (i < 4 * N_MATMUL)
        mod = 0, spec_val[0] = (uint32_t)matmul_types[i % N_MATMUL], spec_val[1] = (i / N_MATMUL) & 1,
        spec_val[2] = vk->matmul_lanes, spec_val[3] = matmul_wg(vk), spec_val[4] = i < 2 * N_MATMUL ? MATMUL_TILE : 1;
    else if (i == PIPE_RMSNORM) mod = 1;
    else if (i == PIPE_ROPE) mod = 3;
    else if (i == PIPE_ATTN_F32 || i == PIPE_ATTN_F16)
        mod = 4, spec_val[0] = i == PIPE_ATTN_F16, spec_val[1] = attn_stage_words(vk);
    else if (i == PIPE_KVSTORE_F32 || i == PIPE_KVSTORE_F16) mod = 5, spec_val[0] = i == PIPE_KVSTORE_F16;
    else if (i == PIPE_DNCONV) mod = 6;
    else if (i == PIPE_DNHEADS) mod = 7;
    else if (i == PIPE_SPLIT) mod = 8;
    else if (i >= PIPE_MOE_ROUTE && i <= PIPE_MOE_BIAS) mod = 9, spec_val[0] = (uint32_t)(i - PIPE_MOE_ROUTE);
    else mod = 2, spec_val[0] = (uint32_t)(i - PIPE_ADD); /* rows.comp: add, swiglu, sigmoid-mul, bias, swiglu-oai */
    const VkSpecializationMapEntry me[5] = {{0, 0, sizeof(uint32_t)},
                                            {1, sizeof(uint32_t), sizeof(uint32_t)},
                                            {2, 2 * sizeof(uint32_t), sizeof(uint32_t)},
                                            {3, 3 * sizeof(uint32_t), sizeof(uint32_t)},
                                            {4, 4 * sizeof(uint32_t), sizeof(uint32_t)}};
    const uint32_t n_spec = i < 4 * N_MATMUL ? 5 : i == PIPE_ATTN_F32 || i == PIPE_ATTN_F16 ? 2 : 1;
    const VkSpecializationInfo spec = {n_spec, me, n_spec * sizeof(uint32_t), spec_val};
    const VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = vk->modules[mod],
                  .pName = "main",
                  .pSpecializationInfo =
                      (i == PIPE_RMSNORM || i == PIPE_ROPE || (i >= PIPE_DNCONV && i <= PIPE_SPLIT)) ? NULL : &spec},
        .layout = vk->layout};
    if ((r = vk->f.vkCreateComputePipelines(vk->dev, VK_NULL_HANDLE, 1, &ci, NULL, &vk->pipes[i])))
        return vk_fail(vk, r, "a compute pipeline");
    return TERN_OK;
}

static enum tern_status make_pipelines(struct tern_vk *vk) {
    VkResult r;
    VkDescriptorSetLayoutBinding b[N_BINDINGS];
    for (uint32_t i = 0; i < N_BINDINGS; i++)
        b[i] = (VkDescriptorSetLayoutBinding){i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, NULL};
    const VkDescriptorSetLayoutCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                                 .bindingCount = N_BINDINGS,
                                                 .pBindings = b};
    if ((r = vk->f.vkCreateDescriptorSetLayout(vk->dev, &dci, NULL, &vk->dsl))) return vk_fail(vk, r, "a descriptor layout");
    const VkPushConstantRange pc = {VK_SHADER_STAGE_COMPUTE_BIT, 0, PUSH_BYTES};
    const VkPipelineLayoutCreateInfo lci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                            .setLayoutCount = 1,
                                            .pSetLayouts = &vk->dsl,
                                            .pushConstantRangeCount = 1,
                                            .pPushConstantRanges = &pc};
    if ((r = vk->f.vkCreatePipelineLayout(vk->dev, &lci, NULL, &vk->layout))) return vk_fail(vk, r, "a pipeline layout");
    enum tern_status st = add_pool(vk);
    if (st) return st;
    const struct {
        const uint32_t *code;
        size_t size;
    } mods[N_MODULES] = {{tern_spv_matmul, tern_spv_matmul_size},       {tern_spv_rmsnorm, tern_spv_rmsnorm_size},
                         {tern_spv_rows, tern_spv_rows_size},           {tern_spv_rope, tern_spv_rope_size},
                         {tern_spv_attention, tern_spv_attention_size}, {tern_spv_kvstore, tern_spv_kvstore_size},
                         {tern_spv_dnconv, tern_spv_dnconv_size},       {tern_spv_dnheads, tern_spv_dnheads_size},
                         {tern_spv_split, tern_spv_split_size},         {tern_spv_moe, tern_spv_moe_size}};
    for (int i = 0; i < N_MODULES; i++) {
        const VkShaderModuleCreateInfo sci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                              .codeSize = mods[i].size,
                                              .pCode = mods[i].code};
        if ((r = vk->f.vkCreateShaderModule(vk->dev, &sci, NULL, &vk->modules[i]))) return vk_fail(vk, r, "a shader module");
    }
    /* the matmul's pipelines (four per weight type) wait for their first use or
     * tern_vk_matmul_prepare: specialising the large matmul shader for every type a model
     * does not have cost lavapipe 1.4 s per device open */
    for (int i = 4 * N_MATMUL; i < N_PIPES; i++)
        if ((st = make_pipe(vk, i))) return st;
    return TERN_OK;
}

/* The grid codes of the I-quants, packed as matmul.comp reads them (binding 5). */
static enum tern_status upload_iq_codes(struct tern_vk *vk) {
    static const struct {
        const uint16_t *codes;
        size_t n;
    } lists[] = {{tern_iq2xxs_codes, 256}, {tern_iq2xs_codes, 512}, {tern_iq2s_codes, 1024},
                 {tern_iq3xxs_codes, 256}, {tern_iq3s_codes, 512}, {tern_iq1s_codes, 2048}};
    uint32_t words[2304];
    size_t o = 0;
    for (size_t l = 0; l < TERN_ARRAY_LEN(lists); l++)
        for (size_t i = 0; i < lists[l].n; i += 2) words[o++] = lists[l].codes[i] | ((uint32_t)lists[l].codes[i + 1] << 16);
    TERN_ASSERT(o == TERN_ARRAY_LEN(words));
    enum tern_status st = tern_vk_buf_new(vk, sizeof words, &vk->iq_codes);
    if (!st) st = tern_vk_upload(vk->iq_codes, 0, words, sizeof words);
    return st;
}

enum tern_status tern_vk_open(int index, struct tern_vk **out) {
    *out = NULL;
    VkPhysicalDevice pds[MAX_DEVICES];
    uint32_t np;
    enum tern_status st = physical_devices(pds, &np);
    if (st) return st;
    if (index < 0 || (uint32_t)index >= np || index >= MAX_DEVICES)
        return tern_errorf(TERN_ERR_INVALID, "vulkan: no device %d (the loader sees %u)", index, np);
    struct tern_vk *vk = tern_calloc(1, sizeof *vk);
    if (!vk) return tern_errorf(TERN_ERR_NOMEM, "vulkan: out of memory");
    vk->pd = pds[index];
    const char *lose = tern_test_hook("TERN_TEST_VK_LOSE_AFTER");
    if (lose && *lose) vk->lose_after = strtol(lose, NULL, 10);
    describe(vk->pd, &vk->info);
    /* tests: $TERN_TEST_VK_DEVICE_BYTES=N makes the device report N bytes of device-local
     * memory, so that the engine's handling of a full device can be exercised on one with
     * plenty (what tern_gpu counts against it is refused before anything is allocated) */
    const char *cap = tern_test_hook("TERN_TEST_VK_DEVICE_BYTES");
    if (cap && *cap) vk->info.device_local_bytes = strtoull(cap, NULL, 10);
    /* A GPU reads a weight row with 32 invocations side by side (coalesced) and sums them in
     * a tree; a CPU device (lavapipe) runs a workgroup's invocations on one thread, where the
     * tree's barriers cost more than the row, so there one invocation takes the whole row.
     * Each is a fixed order of its own (the device's bits do not depend on the dispatch).
     * Tests: $TERN_TEST_VK_MATMUL_LANES=1|2|4|8|16|32 picks it (at least 4 rows a
     * workgroup, as matmul_check's row limit counts). */
    vk->matmul_lanes = strcmp(vk->info.type, "cpu") ? 32 : 1;
    const char *lanes = tern_test_hook("TERN_TEST_VK_MATMUL_LANES");
    if (lanes && *lanes) {
        const long l = strtol(lanes, NULL, 10);
        if (l >= 1 && l <= 32 && !(l & (l - 1))) vk->matmul_lanes = (uint32_t)l;
    }
    /* Attention split over pages where a dispatch has few workgroups: a GPU's compute units
     * sit idle otherwise; lavapipe runs workgroups on a few threads and showed no gain
     * (decode at 4,000 positions: 11.3-17.4 t/s split, 13.0-14.1 not, in the noise), so
     * there it is for tests (tern_vk_set_attention_split). */
    vk->attn_split = strcmp(vk->info.type, "cpu") != 0;
    p_vkGetPhysicalDeviceMemoryProperties(vk->pd, &vk->mem);

    uint32_t nq = 0;
    p_vkGetPhysicalDeviceQueueFamilyProperties(vk->pd, &nq, NULL);
    VkQueueFamilyProperties qf[32];
    if (nq > 32) nq = 32;
    p_vkGetPhysicalDeviceQueueFamilyProperties(vk->pd, &nq, qf);
    vk->queue_family = UINT32_MAX;
    for (uint32_t i = 0; i < nq; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
            vk->queue_family = i;
            break;
        }
    if (vk->queue_family == UINT32_MAX) {
        tern_vk_close(vk);
        return tern_errorf(TERN_ERR_UNSUPPORTED, "vulkan: device '%s' has no compute queue", vk->info.name);
    }
    const float prio = 1.0f;
    const VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                         .queueFamilyIndex = vk->queue_family,
                                         .queueCount = 1,
                                         .pQueuePriorities = &prio};
    const VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                                    .queueCreateInfoCount = 1,
                                    .pQueueCreateInfos = &qci};
    VkResult r = p_vkCreateDevice(vk->pd, &dci, NULL, &vk->dev);
    if (r) {
        st = vk_fail(NULL, r, "vkCreateDevice");
        tern_vk_close(vk);
        return st;
    }
#define VK_LOAD_DEVICE(fn) vk->f.fn = (PFN_##fn)p_vkGetDeviceProcAddr(vk->dev, #fn);
    VK_DEVICE_FNS(VK_LOAD_DEVICE)
#undef VK_LOAD_DEVICE
    vk->f.vkGetDeviceQueue(vk->dev, vk->queue_family, 0, &vk->queue);
    const VkCommandPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                         .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                         .queueFamilyIndex = vk->queue_family};
    const VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    if ((r = vk->f.vkCreateCommandPool(vk->dev, &cpi, NULL, &vk->cmd_pool)) ||
        (r = vk->f.vkCreateFence(vk->dev, &fci, NULL, &vk->fence))) {
        st = vk_fail(vk, r, "device set-up");
        tern_vk_close(vk);
        return st;
    }
    const VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                             .commandPool = vk->cmd_pool,
                                             .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                             .commandBufferCount = 1};
    if ((r = vk->f.vkAllocateCommandBuffers(vk->dev, &cai, &vk->cmd))) {
        st = vk_fail(vk, r, "a command buffer");
        tern_vk_close(vk);
        return st;
    }
    if ((st = make_pipelines(vk)) || (st = upload_iq_codes(vk)) ||
        (st = tern_vk_buf_new(vk, ATTN_PART_BYTES, &vk->attn_part))) {
        tern_vk_close(vk);
        return st;
    }
    TERN_LOG_DEBUG("vulkan: opened '%s' (%s, subgroup %u)", vk->info.name, vk->info.type, vk->info.subgroup_size);
    *out = vk;
    return TERN_OK;
}

void tern_vk_close(struct tern_vk *vk) {
    if (!vk) return;
    tern_vk_buf_free(vk->iq_codes);
    tern_vk_buf_free(vk->attn_part);
    vk->iq_codes = vk->attn_part = NULL;
    if (vk->dev) {
        for (int i = 0; i < N_PIPES; i++)
            if (vk->pipes[i]) vk->f.vkDestroyPipeline(vk->dev, vk->pipes[i], NULL);
        for (int i = 0; i < N_MODULES; i++)
            if (vk->modules[i]) vk->f.vkDestroyShaderModule(vk->dev, vk->modules[i], NULL);
        for (uint32_t i = 0; i < vk->n_pools; i++) vk->f.vkDestroyDescriptorPool(vk->dev, vk->dpools[i], NULL);
        if (vk->layout) vk->f.vkDestroyPipelineLayout(vk->dev, vk->layout, NULL);
        if (vk->dsl) vk->f.vkDestroyDescriptorSetLayout(vk->dev, vk->dsl, NULL);
        if (vk->fence) vk->f.vkDestroyFence(vk->dev, vk->fence, NULL);
        if (vk->cmd_pool) vk->f.vkDestroyCommandPool(vk->dev, vk->cmd_pool, NULL);
        vk->f.vkDestroyDevice(vk->dev, NULL);
    }
    free(vk->dpools);
    free(vk);
}

const struct tern_vk_device_info *tern_vk_info(const struct tern_vk *vk) { return &vk->info; }

/* ---- buffers ---------------------------------------------------------------------- */

static int32_t find_memory(const struct tern_vk *vk, uint32_t bits, VkMemoryPropertyFlags want) {
    for (uint32_t i = 0; i < vk->mem.memoryTypeCount; i++)
        if ((bits & (1u << i)) && (vk->mem.memoryTypes[i].propertyFlags & want) == want) return (int32_t)i;
    return -1;
}

/* A buffer in memory with the wanted properties (prefer[0], else prefer[1] ...). */
static enum tern_status buf_alloc(struct tern_vk *vk, size_t bytes, VkBufferUsageFlags usage,
                                  const VkMemoryPropertyFlags *prefer, int n_prefer, struct tern_vk_buf **out) {
    *out = NULL;
    if (bytes == 0) bytes = 4;
    struct tern_vk_buf *b = tern_calloc(1, sizeof *b);
    if (!b) return tern_errorf(TERN_ERR_NOMEM, "vulkan: out of memory");
    b->vk = vk;
    b->bytes = bytes;
    /* whole 32-bit words: the shaders read weights a word at a time */
    const VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                                    .size = (bytes + 3) & ~(size_t)3,
                                    .usage = usage,
                                    .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = vk->f.vkCreateBuffer(vk->dev, &bci, NULL, &b->buf);
    if (r) {
        free(b);
        return vk_fail(vk, r, "vkCreateBuffer");
    }
    VkMemoryRequirements req;
    vk->f.vkGetBufferMemoryRequirements(vk->dev, b->buf, &req);
    int32_t type = -1;
    VkMemoryPropertyFlags got = 0;
    for (int i = 0; i < n_prefer && type < 0; i++) {
        type = find_memory(vk, req.memoryTypeBits, prefer[i]);
        got = prefer[i];
    }
    if (type < 0) {
        tern_vk_buf_free(b);
        return tern_errorf(TERN_ERR_UNSUPPORTED, "vulkan: no suitable memory type for a %zu-byte buffer", bytes);
    }
    const VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                      .allocationSize = req.size,
                                      .memoryTypeIndex = (uint32_t)type};
    if ((r = vk->f.vkAllocateMemory(vk->dev, &mai, NULL, &b->mem)) ||
        (r = vk->f.vkBindBufferMemory(vk->dev, b->buf, b->mem, 0))) {
        tern_vk_buf_free(b);
        return vk_fail(vk, r, "allocating device memory");
    }
    if (got & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
        if ((r = vk->f.vkMapMemory(vk->dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map))) {
            tern_vk_buf_free(b);
            return vk_fail(vk, r, "vkMapMemory");
        }
    }
    *out = b;
    return TERN_OK;
}

enum tern_status tern_vk_buf_new(struct tern_vk *vk, size_t bytes, struct tern_vk_buf **out) {
    const VkMemoryPropertyFlags prefer[] = {
        VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
        VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT,
    };
    return buf_alloc(vk, bytes,
                     VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                         VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                     prefer, 2, out);
}

void tern_vk_buf_free(struct tern_vk_buf *b) {
    if (!b) return;
    struct tern_vk *vk = b->vk;
    if (b->map) vk->f.vkUnmapMemory(vk->dev, b->mem);
    if (b->buf) vk->f.vkDestroyBuffer(vk->dev, b->buf, NULL);
    if (b->mem) vk->f.vkFreeMemory(vk->dev, b->mem, NULL);
    free(b);
}

size_t tern_vk_buf_bytes(const struct tern_vk_buf *b) { return b->bytes; }
uint64_t tern_vk_submits(const struct tern_vk *vk) { return vk->submits; }

/* Records one command into the context's buffer, submits it and waits. */
static enum tern_status submit_begin(struct tern_vk *vk) {
    if (vk->lost) return tern_errorf(TERN_ERR_IO, "vulkan: the device '%s' was lost", vk->info.name);
    if (vk->lose_after > 0 && ++vk->n_submits > vk->lose_after) {
        vk->lost = true;
        return tern_errorf(TERN_ERR_IO, "vulkan: device lost (TERN_TEST_VK_LOSE_AFTER=%ld submits)", vk->lose_after);
    }
    const VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                         .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    VkResult r = vk->f.vkResetCommandBuffer(vk->cmd, 0);
    if (!r) r = vk->f.vkBeginCommandBuffer(vk->cmd, &bi);
    return r ? vk_fail(vk, r, "recording commands") : TERN_OK;
}

static enum tern_status submit_wait(struct tern_vk *vk, const char *what) {
    VkResult r = vk->f.vkEndCommandBuffer(vk->cmd);
    const VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &vk->cmd};
    if (!r) r = vk->f.vkQueueSubmit(vk->queue, 1, &si, vk->fence);
    if (!r) vk->submits++;
    if (!r) r = vk->f.vkWaitForFences(vk->dev, 1, &vk->fence, VK_TRUE, UINT64_MAX);
    if (!r) r = vk->f.vkResetFences(vk->dev, 1, &vk->fence);
    return r ? vk_fail(vk, r, what) : TERN_OK;
}

/* Copies between a device buffer and host memory through a staging buffer. */
static enum tern_status staged_copy(struct tern_vk_buf *b, size_t off, void *host, size_t bytes, bool up) {
    struct tern_vk *vk = b->vk;
    const VkMemoryPropertyFlags prefer[] = {VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT};
    struct tern_vk_buf *s;
    enum tern_status st = buf_alloc(vk, bytes, VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                                    prefer, 1, &s);
    if (st) return st;
    if (up) memcpy(s->map, host, bytes);
    if (!(st = submit_begin(vk))) {
        const VkBufferCopy c = {up ? 0 : off, up ? off : 0, bytes};
        vk->f.vkCmdCopyBuffer(vk->cmd, up ? s->buf : b->buf, up ? b->buf : s->buf, 1, &c);
        st = submit_wait(vk, up ? "an upload" : "a download");
    }
    if (!st && !up) memcpy(host, s->map, bytes);
    tern_vk_buf_free(s);
    return st;
}

enum tern_status tern_vk_upload(struct tern_vk_buf *b, size_t off, const void *src, size_t bytes) {
    if (off > b->bytes || bytes > b->bytes - off)
        return tern_errorf(TERN_ERR_RANGE, "vulkan: upload of %zu bytes at %zu overruns a %zu-byte buffer", bytes, off,
                           b->bytes);
    if (!bytes) return TERN_OK;
    if (b->map) {
        memcpy((char *)b->map + off, src, bytes);
        return TERN_OK;
    }
    return staged_copy(b, off, (void *)src, bytes, true);
}

enum tern_status tern_vk_download(struct tern_vk_buf *b, size_t off, void *dst, size_t bytes) {
    if (off > b->bytes || bytes > b->bytes - off)
        return tern_errorf(TERN_ERR_RANGE, "vulkan: download of %zu bytes at %zu overruns a %zu-byte buffer", bytes,
                           off, b->bytes);
    if (!bytes) return TERN_OK;
    if (b->map) {
        memcpy(dst, (const char *)b->map + off, bytes);
        return TERN_OK;
    }
    return staged_copy(b, off, dst, bytes, false);
}

/* Device-to-device copies of n_rows rows, one copy command of n_rows regions. The barrier
 * before it makes the compute writes and copies recorded earlier visible to the transfer;
 * the one after makes its writes visible to later dispatches and copies (record() puts
 * only compute-to-compute barriers). */
enum tern_status tern_vk_copy_rows(struct tern_vk *vk, const struct tern_vk_buf *src, size_t src_off,
                                   size_t src_stride, struct tern_vk_buf *dst, size_t dst_off, size_t dst_stride,
                                   size_t row_bytes, size_t n_rows) {
    if (!row_bytes || !n_rows) return TERN_OK;
    /* the spans from the first row's start to the last row's end */
    size_t s_last, d_last;
    if (tern_mul_overflow(src_stride, n_rows - 1, &s_last) || tern_mul_overflow(dst_stride, n_rows - 1, &d_last) ||
        src_off > src->bytes || s_last > src->bytes - src_off || row_bytes > src->bytes - src_off - s_last ||
        dst_off > dst->bytes || d_last > dst->bytes - dst_off || row_bytes > dst->bytes - dst_off - d_last)
        return tern_errorf(TERN_ERR_RANGE,
                           "vulkan: a copy of %zu rows of %zu bytes from %zu of a %zu-byte buffer to %zu of a %zu-byte "
                           "one overruns",
                           n_rows, row_bytes, src_off, src->bytes, dst_off, dst->bytes);
    const size_t s_end = src_off + s_last + row_bytes, d_end = dst_off + d_last + row_bytes;
    if (src == dst && src_off < d_end && dst_off < s_end)
        return tern_errorf(TERN_ERR_INVALID, "vulkan: a copy within one buffer of overlapping ranges");
    VkBufferCopy one, *c = n_rows == 1 ? &one : malloc(n_rows * sizeof *c);
    if (!c) return tern_errorf(TERN_ERR_NOMEM, "vulkan: out of memory for %zu copy regions", n_rows);
    for (size_t i = 0; i < n_rows; i++) c[i] = (VkBufferCopy){src_off + i * src_stride, dst_off + i * dst_stride, row_bytes};
    const bool own = !vk->recording;
    enum tern_status st;
    if (own && (st = tern_vk_begin(vk))) {
        if (c != &one) free(c);
        return st;
    }
    const VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    const VkAccessFlags acc = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                              VK_ACCESS_TRANSFER_WRITE_BIT;
    const VkMemoryBarrier before = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                    .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                                    .dstAccessMask = acc};
    vk->f.vkCmdPipelineBarrier(vk->cmd, stages, stages, 0, 1, &before, 0, NULL, 0, NULL);
    vk->f.vkCmdCopyBuffer(vk->cmd, src->buf, dst->buf, (uint32_t)n_rows, c);
    const VkMemoryBarrier after = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                   .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                                   .dstAccessMask = acc};
    vk->f.vkCmdPipelineBarrier(vk->cmd, stages, stages, 0, 1, &after, 0, NULL, 0, NULL);
    if (c != &one) free(c);
    return own ? tern_vk_end(vk) : TERN_OK;
}

enum tern_status tern_vk_copy(struct tern_vk *vk, const struct tern_vk_buf *src, size_t src_off, struct tern_vk_buf *dst,
                              size_t dst_off, size_t bytes) {
    return tern_vk_copy_rows(vk, src, src_off, bytes, dst, dst_off, bytes, bytes, 1);
}

/* ---- recording ------------------------------------------------------------------- */

enum tern_status tern_vk_begin(struct tern_vk *vk) {
    if (vk->recording) return tern_errorf(TERN_ERR_STATE, "vulkan: tern_vk_begin inside a recording");
    for (uint32_t i = 0; i <= vk->cur_pool && i < vk->n_pools; i++) {
        VkResult r = vk->f.vkResetDescriptorPool(vk->dev, vk->dpools[i], 0);
        if (r) return vk_fail(vk, r, "resetting descriptors");
    }
    vk->cur_pool = 0;
    vk->n_sets = 0;
    enum tern_status st = submit_begin(vk);
    if (!st) vk->recording = true;
    return st;
}

enum tern_status tern_vk_end(struct tern_vk *vk) {
    if (!vk->recording) return tern_errorf(TERN_ERR_STATE, "vulkan: tern_vk_end without tern_vk_begin");
    vk->recording = false;
    return submit_wait(vk, "the recorded operations");
}

/* Records one dispatch of pipeline pipe over bufs (n of them, the rest bound to bufs[0])
 * with push constants, followed by a barrier so that the next operation sees its
 * writes. Outside a recording it runs at once (begin, record, end). */
static enum tern_status record(struct tern_vk *vk, int pipe, const struct tern_vk_buf *const *bufs, int n,
                               const void *push, size_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz) {
    const bool own = !vk->recording;
    enum tern_status st;
    if ((st = make_pipe(vk, pipe))) {
        vk->recording = false;
        return st;
    }
    if (own && (st = tern_vk_begin(vk))) return st;
    if (vk->n_sets == MAX_SETS) {
        /* a full pool: the next (made when there is none), the recording goes on */
        if (vk->cur_pool + 1 == vk->n_pools && (st = add_pool(vk))) {
            vk->recording = false;
            return st;
        }
        vk->cur_pool++;
        vk->n_sets = 0;
    }
    VkDescriptorSet set;
    const VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                            .descriptorPool = vk->dpools[vk->cur_pool],
                                            .descriptorSetCount = 1,
                                            .pSetLayouts = &vk->dsl};
    VkResult r = vk->f.vkAllocateDescriptorSets(vk->dev, &ai, &set);
    if (r) {
        vk->recording = false;
        return vk_fail(vk, r, "a descriptor set");
    }
    vk->n_sets++;
    VkDescriptorBufferInfo bi[N_BINDINGS];
    VkWriteDescriptorSet wr[N_BINDINGS];
    for (int i = 0; i < N_BINDINGS; i++) {
        bi[i] = (VkDescriptorBufferInfo){(i < n ? bufs[i] : bufs[0])->buf, 0, VK_WHOLE_SIZE};
        wr[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                                       .dstSet = set,
                                       .dstBinding = (uint32_t)i,
                                       .descriptorCount = 1,
                                       .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                       .pBufferInfo = &bi[i]};
    }
    vk->f.vkUpdateDescriptorSets(vk->dev, N_BINDINGS, wr, 0, NULL);
    TERN_ASSERT(push_bytes <= PUSH_BYTES);
    uint8_t pc[PUSH_BYTES] = {0};
    memcpy(pc, push, push_bytes);
    vk->f.vkCmdBindPipeline(vk->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, vk->pipes[pipe]);
    vk->f.vkCmdBindDescriptorSets(vk->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, vk->layout, 0, 1, &set, 0, NULL);
    vk->f.vkCmdPushConstants(vk->cmd, vk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, PUSH_BYTES, pc);
    vk->f.vkCmdDispatch(vk->cmd, gx, gy, gz);
    const VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                                .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
    vk->f.vkCmdPipelineBarrier(vk->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0,
                               1, &mb, 0, NULL, 0, NULL);
    return own ? tern_vk_end(vk) : TERN_OK;
}

/* ---- kernels ---------------------------------------------------------------------- */

/* Workgroups along x before the row index carries into z (matmul.comp's GX). */
#define MATMUL_GX 1024u

uint32_t tern_vk_matmul_lanes(const struct tern_vk *vk) { return vk->matmul_lanes; }

void tern_vk_set_attention_split(struct tern_vk *vk, bool on) { vk->attn_split = on; }

/* The x and z sizes of a matmul dispatch over n rows (matmul_wg / lanes rows per
 * workgroup). */
static void matmul_groups(const struct tern_vk *vk, size_t n, uint32_t *gx, uint32_t *gz) {
    const size_t rows = matmul_wg(vk) / vk->matmul_lanes, g = (n + rows - 1) / rows;
    *gx = (uint32_t)(g < MATMUL_GX ? g : MATMUL_GX);
    *gz = (uint32_t)((g + MATMUL_GX - 1) / MATMUL_GX);
}

static int matmul_pipe(enum tern_dtype wtype) {
    for (int i = 0; i < N_MATMUL; i++)
        if (matmul_types[i] == wtype) return i;
    return -1;
}

/* The pipeline of matmul_pipe's type index t, plain or indexed, with tiles of `tile` tokens
 * or slots (MATMUL_TILE or 1). */
static int matmul_pipe_at(int t, bool indexed, uint32_t tile) {
    return t + (indexed ? N_MATMUL : 0) + (tile == 1 ? 2 * N_MATMUL : 0);
}

bool tern_vk_matmul_supported(enum tern_dtype wtype) { return matmul_pipe(wtype) >= 0; }

enum tern_status tern_vk_matmul_prepare(struct tern_vk *vk, enum tern_dtype wtype, bool indexed) {
    const int t = matmul_pipe(wtype);
    if (t < 0) return tern_errorf(TERN_ERR_UNSUPPORTED, "vulkan: no matmul for %s", tern_dtype_name((uint32_t)wtype));
    enum tern_status st = make_pipe(vk, matmul_pipe_at(t, indexed, MATMUL_TILE));
    return st ? st : make_pipe(vk, matmul_pipe_at(t, indexed, 1));
}

static enum tern_status check_rows(const char *op, const struct tern_vk_buf *b, size_t n_tok, size_t n);

/* The checks of both matmuls; *rb gets the row bytes. */
static enum tern_status matmul_check(enum tern_dtype wtype, size_t k, size_t n, size_t n_tok, uint64_t *rb) {
    if (matmul_pipe(wtype) < 0)
        return tern_errorf(TERN_ERR_INVALID,
                           "vulkan: matmul of %s weights is not implemented (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
                           "Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, Q2_K, Q3_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)",
                           tern_dtype_name((uint32_t)wtype));
    if (!tern_dtype_row_size(wtype, k, rb))
        return tern_errorf(TERN_ERR_INVALID, "vulkan: rows of %zu do not fit %s blocks", k, tern_dtype_name((uint32_t)wtype));
    if (k > UINT32_MAX / 64 || n > (size_t)4 * MATMUL_GX * 65535 || n_tok > 65535 || *rb > UINT32_MAX)
        return tern_errorf(TERN_ERR_RANGE, "vulkan: matmul shape k %zu, n %zu, %zu tokens is too large", k, n, n_tok);
    return TERN_OK;
}

enum tern_status tern_vk_matmul_id(struct tern_vk *vk, enum tern_dtype wtype, const struct tern_vk_buf *w,
                                   size_t expert_stride, size_t n_expert, size_t k, size_t n,
                                   const struct tern_vk_buf *ids, const struct tern_vk_buf *order,
                                   const struct tern_vk_buf *x, size_t x_div, size_t n_slots, struct tern_vk_buf *y) {
    uint64_t rb;
    enum tern_status st = matmul_check(wtype, k, n, n_slots, &rb);
    if (st) return st;
    size_t wbytes;
    if (x_div == 0 || n_expert == 0 || n_expert > 1024 || tern_mul_overflow(expert_stride, n_expert, &wbytes) ||
        wbytes > UINT32_MAX || expert_stride < rb * n)
        return tern_errorf(TERN_ERR_RANGE,
                           "vulkan: expert matmul of %zu experts %zu bytes apart (%zu rows of %llu bytes each, "
                           "at most 1024 experts and 4 GiB)",
                           n_expert, expert_stride, n, (unsigned long long)rb);
    if (w->bytes < wbytes || ids->bytes < n_slots * sizeof(uint32_t) ||
        order->bytes < tern_vk_moe_order_words(n_slots, n_expert) * sizeof(uint32_t) ||
        x->bytes < (n_slots + x_div - 1) / x_div * k * sizeof(float) || y->bytes < n_slots * n * sizeof(float))
        return tern_errorf(TERN_ERR_RANGE, "vulkan: expert matmul buffers too small for k %zu, n %zu, %zu slots", k, n,
                           n_slots);
    if (n == 0 || n_slots == 0) return TERN_OK;
    const uint32_t pc[7] = {(uint32_t)k,     (uint32_t)n,             (uint32_t)n_slots, (uint32_t)rb,
                            (uint32_t)x_div, (uint32_t)expert_stride, (uint32_t)n_expert};
    const struct tern_vk_buf *bufs[6] = {w, x, y, ids, order, vk->iq_codes};
    uint32_t gx, gz;
    matmul_groups(vk, n, &gx, &gz);
    const uint32_t tile = (uint32_t)tern_vk_moe_tile(n_slots);
    return record(vk, matmul_pipe_at(matmul_pipe(wtype), true, tile), bufs, 6, pc, sizeof pc, gx,
                  (uint32_t)tern_vk_moe_max_tiles(n_slots, n_expert), gz);
}

/* moe.comp's push constants */
struct moe_pc {
    uint32_t n_tok, n_expert, n_used, norm_topk;
    float scale;
    uint32_t n, shared_, softmax_weight, tile;
};

enum tern_status tern_vk_moe_route(struct tern_vk *vk, struct tern_vk_buf *logits, struct tern_vk_buf *ids,
                                   struct tern_vk_buf *wts, size_t n_tok, size_t n_expert, size_t n_used,
                                   bool norm_topk, float scale, bool softmax_weight) {
    enum tern_status st;
    if (n_expert == 0 || n_expert > 1024 || n_used == 0 || n_used > n_expert)
        return tern_errorf(TERN_ERR_INVALID, "vulkan: routing to %zu of %zu experts (at most 1024)", n_used, n_expert);
    if ((st = check_rows("moe router logits", logits, n_tok, n_expert)) ||
        (st = check_rows("moe expert ids", ids, n_tok, n_used)) || (st = check_rows("moe weights", wts, n_tok, n_used)))
        return st;
    if (!n_tok) return TERN_OK;
    const struct moe_pc pc = {(uint32_t)n_tok, (uint32_t)n_expert, (uint32_t)n_used, norm_topk, scale, 0, 0,
                              softmax_weight, 0};
    const struct tern_vk_buf *bufs[3] = {logits, ids, wts};
    return record(vk, PIPE_MOE_ROUTE, bufs, 3, &pc, sizeof pc, (uint32_t)((n_tok + 63) / 64), 1, 1);
}

enum tern_status tern_vk_moe_group(struct tern_vk *vk, const struct tern_vk_buf *ids, struct tern_vk_buf *order,
                                   size_t n_slots, size_t n_expert) {
    enum tern_status st;
    if (n_expert == 0 || n_expert > 1024)
        return tern_errorf(TERN_ERR_INVALID, "vulkan: grouping the slots of %zu experts (at most 1024)", n_expert);
    if ((st = check_rows("moe expert ids", ids, n_slots, 1)) ||
        (st = check_rows("moe slot order", order, tern_vk_moe_order_words(n_slots, n_expert), 1)))
        return st;
    if (!n_slots) return TERN_OK;
    const struct moe_pc pc = {(uint32_t)n_slots, (uint32_t)n_expert, 1, 0, 1.0f, 0, 0, 0,
                              (uint32_t)tern_vk_moe_tile(n_slots)};
    const struct tern_vk_buf *bufs[7] = {order, ids, order, order, order, order, order};
    return record(vk, PIPE_MOE_GROUP, bufs, 7, &pc, sizeof pc, 1, 1, 1);
}

enum tern_status tern_vk_moe_combine(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *d,
                                     const struct tern_vk_buf *wts, size_t n_tok, size_t n, size_t n_used,
                                     const struct tern_vk_buf *sd, const struct tern_vk_buf *sw) {
    enum tern_status st;
    if (n_used == 0 || (!sd) != (!sw))
        return tern_errorf(TERN_ERR_INVALID, "vulkan: moe combine of %zu experts (the shared expert needs both its "
                                             "output and its gate)", n_used);
    if ((st = check_rows("moe output", y, n_tok, n)) || (st = check_rows("moe expert outputs", d, n_tok * n_used, n)) ||
        (st = check_rows("moe weights", wts, n_tok, n_used)) || (sd && (st = check_rows("moe shared output", sd, n_tok, n))) ||
        (sw && (st = check_rows("moe shared gate", sw, n_tok, 1))))
        return st;
    if (!n_tok || !n) return TERN_OK;
    const struct moe_pc pc = {(uint32_t)n_tok, 0, (uint32_t)n_used, 0, 1.0f, (uint32_t)n, sd != NULL, 0, 0};
    const struct tern_vk_buf *bufs[6] = {y, wts, wts, sd ? sd : y, sw ? sw : y, d};
    return record(vk, PIPE_MOE_COMBINE, bufs, 6, &pc, sizeof pc, (uint32_t)((n + 63) / 64), (uint32_t)n_tok, 1);
}

enum tern_status tern_vk_moe_expert_bias(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *ids,
                                         const struct tern_vk_buf *bias, size_t n_slots, size_t n, size_t n_expert) {
    enum tern_status st;
    if (n_expert == 0 || n_slots > 65535)
        return tern_errorf(TERN_ERR_INVALID, "vulkan: expert biases of %zu slots over %zu experts (at most 65535 slots)",
                           n_slots, n_expert);
    if ((st = check_rows("moe expert bias rows", y, n_slots, n)) || (st = check_rows("moe expert ids", ids, n_slots, 1)) ||
        (st = check_rows("moe expert biases", bias, n_expert, n)))
        return st;
    if (!n_slots || !n) return TERN_OK;
    const struct moe_pc pc = {(uint32_t)n_slots, (uint32_t)n_expert, 1, 0, 1.0f, (uint32_t)n, 0, 0, 0};
    const struct tern_vk_buf *bufs[8] = {y, ids, y, y, y, y, y, bias};
    return record(vk, PIPE_MOE_BIAS, bufs, 8, &pc, sizeof pc, (uint32_t)((n + 63) / 64), (uint32_t)n_slots, 1);
}

enum tern_status tern_vk_matmul(struct tern_vk *vk, enum tern_dtype wtype, const struct tern_vk_buf *w,
                                size_t k, size_t n, const struct tern_vk_buf *x, size_t n_tok,
                                struct tern_vk_buf *y) {
    uint64_t rb;
    enum tern_status st = matmul_check(wtype, k, n, n_tok, &rb);
    if (st) return st;
    if (w->bytes < rb * n || x->bytes < n_tok * k * sizeof(float) || y->bytes < n_tok * n * sizeof(float))
        return tern_errorf(TERN_ERR_RANGE, "vulkan: matmul buffers too small for k %zu, n %zu, %zu tokens", k, n, n_tok);
    if (n == 0 || n_tok == 0) return TERN_OK;
    const uint32_t pc[4] = {(uint32_t)k, (uint32_t)n, (uint32_t)n_tok, (uint32_t)rb};
    const struct tern_vk_buf *bufs[6] = {w, x, y, w, w, vk->iq_codes}; /* 3, 4: unused here */
    /* matmul.comp: a workgroup per matmul_wg / lanes rows and tile of MATMUL_TILE tokens (a
     * single token: the one-token pipeline) */
    const uint32_t tile = n_tok == 1 ? 1 : MATMUL_TILE;
    uint32_t gx, gz;
    matmul_groups(vk, n, &gx, &gz);
    return record(vk, matmul_pipe_at(matmul_pipe(wtype), false, tile), bufs, 6, pc, sizeof pc, gx,
                  (uint32_t)((n_tok + tile - 1) / tile), gz);
}

static enum tern_status check_rows(const char *op, const struct tern_vk_buf *b, size_t n_tok, size_t n) {
    size_t need;
    if (tern_mul_overflow(n_tok, n, &need) || need > UINT32_MAX || n_tok > 65535 ||
        b->bytes < need * sizeof(float))
        return tern_errorf(TERN_ERR_RANGE, "vulkan: %s of %zu rows of %zu does not fit a %zu-byte buffer", op, n_tok, n,
                           b->bytes);
    return TERN_OK;
}

enum tern_status tern_vk_rmsnorm(struct tern_vk *vk, const struct tern_vk_buf *x, const struct tern_vk_buf *w,
                                 struct tern_vk_buf *y, size_t n_tok, size_t n, float eps) {
    enum tern_status st;
    if ((st = check_rows("rmsnorm", x, n_tok, n)) || (st = check_rows("rmsnorm", y, n_tok, n)) ||
        (w && (st = check_rows("rmsnorm weights", w, 1, n))))
        return st;
    if (!n_tok || !n) return TERN_OK;
    struct {
        uint32_t n, n_tok;
        float eps;
        uint32_t has_w;
    } pc = {(uint32_t)n, (uint32_t)n_tok, eps, w != NULL};
    const struct tern_vk_buf *bufs[3] = {x, w ? w : x, y};
    return record(vk, PIPE_RMSNORM, bufs, 3, &pc, sizeof pc, (uint32_t)n_tok, 1, 1);
}

static enum tern_status rows_op(struct tern_vk *vk, int pipe, const char *op, struct tern_vk_buf *a,
                                const struct tern_vk_buf *b, size_t n_tok, size_t n) {
    enum tern_status st;
    if ((st = check_rows(op, a, n_tok, n)) || (st = check_rows(op, b, n_tok, n))) return st;
    const uint32_t count = (uint32_t)(n_tok * n);
    if (!count) return TERN_OK;
    const uint32_t groups = (count + 255) / 256, pc[2] = {count, (uint32_t)n};
    const struct tern_vk_buf *bufs[2] = {a, b};
    return record(vk, pipe, bufs, 2, pc, sizeof pc, groups < 65535 ? groups : 65535, (groups + 65534) / 65535, 1);
}

enum tern_status tern_vk_add(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *x, size_t n_tok,
                             size_t n) {
    return rows_op(vk, PIPE_ADD, "add", y, x, n_tok, n);
}
enum tern_status tern_vk_swiglu(struct tern_vk *vk, struct tern_vk_buf *g, const struct tern_vk_buf *u, size_t n_tok,
                                size_t n) {
    return rows_op(vk, PIPE_SWIGLU, "swiglu", g, u, n_tok, n);
}
enum tern_status tern_vk_swiglu_oai(struct tern_vk *vk, struct tern_vk_buf *g, const struct tern_vk_buf *u,
                                    size_t n_tok, size_t n) {
    return rows_op(vk, PIPE_SWIGLU_OAI, "swiglu-oai", g, u, n_tok, n);
}
enum tern_status tern_vk_sigmoid_mul(struct tern_vk *vk, struct tern_vk_buf *x, const struct tern_vk_buf *gate,
                                     size_t n_tok, size_t n) {
    return rows_op(vk, PIPE_SIGMOID_MUL, "sigmoid-mul", x, gate, n_tok, n);
}

enum tern_status tern_vk_add_bias(struct tern_vk *vk, struct tern_vk_buf *y, const struct tern_vk_buf *bias,
                                  size_t n_tok, size_t n) {
    enum tern_status st;
    if ((st = check_rows("bias", bias, 1, n)) || (st = check_rows("bias", y, n_tok, n))) return st;
    const uint32_t count = (uint32_t)(n_tok * n);
    if (!count) return TERN_OK;
    const uint32_t groups = (count + 255) / 256, pc[2] = {count, (uint32_t)n};
    const struct tern_vk_buf *bufs[2] = {y, bias};
    return record(vk, PIPE_ADD_BIAS, bufs, 2, pc, sizeof pc, groups < 65535 ? groups : 65535, (groups + 65534) / 65535,
                  1);
}

enum tern_status tern_vk_rope(struct tern_vk *vk, struct tern_vk_buf *x, size_t row_stride, size_t n_head,
                              size_t head_dim, size_t n_rot, const struct tern_vk_buf *cs, size_t n_tok, bool neox) {
    enum tern_status st;
    if (n_rot % 2 || n_rot > head_dim || row_stride < n_head * head_dim)
        return tern_errorf(TERN_ERR_INVALID, "vulkan: rope of %zu dims over heads of %zu in rows of %zu", n_rot, head_dim,
                           row_stride);
    if ((st = check_rows("rope", x, n_tok, row_stride)) || (st = check_rows("rope angles", cs, n_tok, n_rot))) return st;
    if (!n_tok || !n_rot || !n_head) return TERN_OK;
    const uint32_t pc[6] = {(uint32_t)n_head, (uint32_t)head_dim, (uint32_t)n_rot, (uint32_t)n_tok, neox,
                            (uint32_t)row_stride};
    const struct tern_vk_buf *bufs[2] = {x, cs};
    return record(vk, PIPE_ROPE, bufs, 2, pc, sizeof pc, (uint32_t)((n_rot / 2 + 63) / 64), (uint32_t)n_head,
                  (uint32_t)n_tok);
}

/* Bytes of the cache pages that hold positions [0, n) of n_kv_head heads of head_dim. */
static size_t kv_pages_bytes(size_t n, size_t n_kv_head, size_t head_dim, size_t es) {
    return (n + TERN_VK_KV_PAGE - 1) / TERN_VK_KV_PAGE * TERN_VK_KV_PAGE * n_kv_head * head_dim * es;
}

enum tern_status tern_vk_kv_store(struct tern_vk *vk, const struct tern_vk_buf *x, size_t row_stride,
                                  struct tern_vk_buf *cache, size_t n_kv_head, size_t head_dim, size_t pos0,
                                  size_t row0, size_t n_tok, bool f16) {
    enum tern_status st;
    const size_t es = f16 ? 2 : 4;
    if ((f16 && head_dim % 2) || row_stride < n_kv_head * head_dim || pos0 + n_tok > UINT32_MAX)
        return tern_errorf(TERN_ERR_INVALID, "vulkan: kv store of %zu rows at %zu (%zu heads of %zu)", n_tok, pos0,
                           n_kv_head, head_dim);
    if ((st = check_rows("kv store", x, row0 + n_tok, row_stride))) return st;
    if (cache->bytes < kv_pages_bytes(pos0 + n_tok, n_kv_head, head_dim, es))
        return tern_errorf(TERN_ERR_RANGE, "vulkan: a %zu-byte cache has no page for position %zu", cache->bytes,
                           pos0 + n_tok - 1);
    if (!n_tok || !n_kv_head) return TERN_OK;
    const uint32_t pc[7] = {(uint32_t)head_dim,  0, (uint32_t)row_stride, (uint32_t)pos0,
                            (uint32_t)n_kv_head, (uint32_t)n_tok, (uint32_t)row0};
    const struct tern_vk_buf *bufs[2] = {x, cache};
    const size_t width = f16 ? head_dim / 2 : head_dim;
    return record(vk, f16 ? PIPE_KVSTORE_F16 : PIPE_KVSTORE_F32, bufs, 2, pc, sizeof pc, (uint32_t)((width + 63) / 64),
                  (uint32_t)n_kv_head, (uint32_t)n_tok);
}

enum tern_status tern_vk_attention_tile(struct tern_vk *vk, const struct tern_vk_buf *q, size_t q_stride,
                                        const struct tern_vk_buf *kc, const struct tern_vk_buf *vc,
                                        struct tern_vk_buf *out, size_t out_stride, size_t row0, size_t n_tok,
                                        size_t pos0, size_t n_head, size_t n_kv_head, size_t head_dim, float scale,
                                        bool f16, size_t window, const struct tern_vk_buf *sinks, size_t qh,
                                        size_t qt, int split) {
    enum tern_status st;
    if (qh == 0 || qt == 0 || qh * qt > ATTN_QMAX)
        return tern_errorf(TERN_ERR_INVALID, "vulkan: an attention tile of %zu heads x %zu tokens (at most %d)", qh,
                           qt, ATTN_QMAX);
    if (head_dim == 0 || head_dim > 256 || (f16 && head_dim % 2) || n_kv_head == 0 || n_head % n_kv_head ||
        q_stride < n_head * head_dim || out_stride < n_head * head_dim || pos0 + n_tok > UINT32_MAX ||
        window > UINT32_MAX)
        return tern_errorf(TERN_ERR_INVALID,
                           "vulkan: attention of %zu heads (%zu kv heads of %zu, at most 256) at %zu+%zu", n_head,
                           n_kv_head, head_dim, pos0, n_tok);
    if ((st = check_rows("attention queries", q, row0 + n_tok, q_stride)) ||
        (st = check_rows("attention output", out, row0 + n_tok, out_stride)) ||
        (sinks && (st = check_rows("attention sinks", sinks, 1, n_head))))
        return st;
    const size_t need = kv_pages_bytes(pos0 + n_tok, n_kv_head, head_dim, f16 ? 2 : 4);
    if (kc->bytes < need || vc->bytes < need)
        return tern_errorf(TERN_ERR_RANGE, "vulkan: the caches have no page for position %zu", pos0 + n_tok - 1);
    if (!n_tok) return TERN_OK;
    const size_t group = n_head / n_kv_head;
    if (qh > group) qh = group;
    /* the pages the dispatch's queries see: from its first token's first key to its last */
    const size_t key0 = window && pos0 + 1 > window ? pos0 + 1 - window : 0;
    const size_t page0 = key0 / 256, npages = (pos0 + n_tok - 1) / 256 + 1 - page0;
    const size_t gx = (n_tok + qt - 1) / qt, gy = n_kv_head * ((group + qh - 1) / qh);
    const bool fits = n_tok * n_head * npages * (head_dim + 2) * sizeof(float) <= vk->attn_part->bytes;
    if (split > 0 && !fits)
        return tern_errorf(TERN_ERR_RANGE, "vulkan: attention of %zu tokens over %zu pages does not fit its partials",
                           n_tok, npages);
    if (split < 0) split = vk->attn_split && npages > 1 && fits && gx * gy < ATTN_SPLIT_BELOW;
    struct {
        uint32_t head_dim, n_kv, q_stride, out_stride, pos0, group;
        float scale;
        uint32_t n_tok, row0, window, sinks, qh, qt, split, page0, npages;
    } pc = {(uint32_t)head_dim, (uint32_t)n_kv_head, (uint32_t)q_stride, (uint32_t)out_stride, (uint32_t)pos0,
            (uint32_t)group,    scale,  (uint32_t)n_tok, (uint32_t)row0,  (uint32_t)window,
            sinks != NULL,      (uint32_t)qh, (uint32_t)qt, split != 0, (uint32_t)page0, (uint32_t)npages};
    const struct tern_vk_buf *bufs[6] = {q, kc, vc, out, sinks ? sinks : q, vk->attn_part};
    const int pipe = f16 ? PIPE_ATTN_F16 : PIPE_ATTN_F32;
    if (!split) return record(vk, pipe, bufs, 6, &pc, sizeof pc, (uint32_t)gx, (uint32_t)gy, 1);
    /* a workgroup per tile and page writes the partials, then one per token and head folds
     * them in page order; recorded together (the caller's recording, or one of their own) */
    const bool own = !vk->recording;
    if (own && (st = tern_vk_begin(vk))) return st;
    if (!(st = record(vk, pipe, bufs, 6, &pc, sizeof pc, (uint32_t)gx, (uint32_t)gy, (uint32_t)npages))) {
        pc.split = 2;
        st = record(vk, pipe, bufs, 6, &pc, sizeof pc, (uint32_t)n_tok, (uint32_t)n_head, 1);
    }
    return own && !st ? tern_vk_end(vk) : st; /* a failed record() ended the recording */
}

/* The tile: the whole group of query heads that read one KV head's rows (up to
 * ATTN_QMAX), times as many tokens as fit beside them. */
enum tern_status tern_vk_attention(struct tern_vk *vk, const struct tern_vk_buf *q, size_t q_stride,
                                   const struct tern_vk_buf *kc, const struct tern_vk_buf *vc, struct tern_vk_buf *out,
                                   size_t out_stride, size_t row0, size_t n_tok, size_t pos0, size_t n_head,
                                   size_t n_kv_head, size_t head_dim, float scale, bool f16, size_t window,
                                   const struct tern_vk_buf *sinks) {
    const size_t group = n_kv_head && n_head % n_kv_head == 0 ? n_head / n_kv_head : 1;
    const size_t qh = group < ATTN_QMAX ? group : ATTN_QMAX, qt = ATTN_QMAX / qh;
    return tern_vk_attention_tile(vk, q, q_stride, kc, vc, out, out_stride, row0, n_tok, pos0, n_head, n_kv_head,
                                  head_dim, scale, f16, window, sinks, qh, qt < n_tok ? qt : n_tok ? n_tok : 1, -1);
}

enum tern_status tern_vk_deltanet_conv(struct tern_vk *vk, struct tern_vk_buf *window,
                                             const struct tern_vk_buf *conv_wt, const struct tern_vk_buf *x, size_t ldx,
                                             struct tern_vk_buf *y, size_t ldy, size_t C, size_t n_conv, size_t row0,
                                             size_t n_tok, struct tern_vk_buf *trail, size_t slot0) {
    enum tern_status st;
    if (n_conv < 2 || ldx < C || ldy < C)
        return tern_errorf(TERN_ERR_INVALID, "vulkan: DeltaNet conv of %zu taps over %zu channels (rows of %zu, %zu)",
                           n_conv, C, ldx, ldy);
    if ((st = check_rows("DeltaNet conv window", window, n_conv - 1, C)) ||
        (st = check_rows("DeltaNet conv weights", conv_wt, n_conv, C)) ||
        (st = check_rows("DeltaNet conv input", x, row0 + n_tok, ldx)) ||
        (st = check_rows("DeltaNet conv output", y, row0 + n_tok, ldy)) ||
        (trail && (st = check_rows("DeltaNet conv trail", trail, (slot0 + n_tok) * (n_conv - 1), C))))
        return st;
    if (!n_tok || !C) return TERN_OK;
    const uint32_t pc[8] = {(uint32_t)C,   (uint32_t)n_conv, (uint32_t)ldx, (uint32_t)ldy,
                            (uint32_t)n_tok, (uint32_t)row0, trail != NULL, (uint32_t)slot0};
    const struct tern_vk_buf *bufs[5] = {window, conv_wt, x, y, trail ? trail : window};
    return record(vk, PIPE_DNCONV, bufs, 5, pc, sizeof pc, (uint32_t)((C + 63) / 64), 1, 1);
}

enum tern_status tern_vk_deltanet_heads(struct tern_vk *vk, struct tern_vk_buf *state, const struct tern_vk_buf *qkv,
                                              const struct tern_vk_buf *z, const struct tern_vk_buf *beta,
                                              const struct tern_vk_buf *alpha, struct tern_vk_buf *out,
                                              const struct tern_vk_buf *params, size_t n_k, bool k_grouped, size_t n_v, size_t d_k,
                                              size_t d_v, float eps, size_t row0, size_t n_tok, struct tern_vk_buf *trail,
                                              size_t slot0) {
    enum tern_status st;
    if (!n_k || !n_v || n_v % n_k || d_k == 0 || d_k > 256 || d_v == 0 || d_v > 256)
        return tern_errorf(TERN_ERR_INVALID, "vulkan: DeltaNet of %zu k-heads, %zu v-heads, heads of %zu/%zu (at most 256)",
                           n_k, n_v, d_k, d_v);
    const size_t C = 2 * n_k * d_k + n_v * d_v, rows = row0 + n_tok;
    if ((st = check_rows("DeltaNet state", state, n_v * d_k, d_v)) || (st = check_rows("DeltaNet qkv", qkv, rows, C)) ||
        (st = check_rows("DeltaNet z", z, rows, n_v * d_v)) || (st = check_rows("DeltaNet beta", beta, rows, n_v)) ||
        (st = check_rows("DeltaNet alpha", alpha, rows, n_v)) ||
        (st = check_rows("DeltaNet output", out, rows, n_v * d_v)) ||
        (st = check_rows("DeltaNet parameters", params, 1, 2 * n_v + d_v)) ||
        (trail && (st = check_rows("DeltaNet state trail", trail, (slot0 + n_tok) * n_v * d_k, d_v))))
        return st;
    if (!n_tok) return TERN_OK;
    struct {
        uint32_t n_k, n_v, d_k, d_v;
        float eps;
        uint32_t n_tok, row0, tr, tr_slot, k_grouped;
    } pc = {(uint32_t)n_k, (uint32_t)n_v, (uint32_t)d_k, (uint32_t)d_v, eps, (uint32_t)n_tok, (uint32_t)row0,
            trail != NULL, (uint32_t)slot0, k_grouped};
    const struct tern_vk_buf *bufs[8] = {state, qkv, z, beta, alpha, out, params, trail ? trail : state};
    return record(vk, PIPE_DNHEADS, bufs, 8, &pc, sizeof pc, (uint32_t)n_v, 1, 1);
}

enum tern_status tern_vk_split_heads(struct tern_vk *vk, const struct tern_vk_buf *ab, struct tern_vk_buf *a,
                                     struct tern_vk_buf *b, size_t n_tok, size_t n_head, size_t head_dim) {
    enum tern_status st;
    if ((st = check_rows("split", ab, n_tok, 2 * n_head * head_dim)) || (st = check_rows("split", a, n_tok, n_head * head_dim)) ||
        (st = check_rows("split", b, n_tok, n_head * head_dim)))
        return st;
    const uint32_t count = (uint32_t)(n_tok * n_head * head_dim);
    if (!count) return TERN_OK;
    const uint32_t pc[3] = {(uint32_t)n_head, (uint32_t)head_dim, (uint32_t)n_tok}, groups = (count + 255) / 256;
    const struct tern_vk_buf *bufs[3] = {ab, a, b};
    return record(vk, PIPE_SPLIT, bufs, 3, pc, sizeof pc, groups < 65535 ? groups : 65535, (groups + 65534) / 65535, 1);
}
