/* The architecture registry. A new architecture is a file arch-NAME.c defining a
 * `const struct tern_arch` (see model.h) plus one line in the table below. (An explicit
 * table rather than constructor registration: an object file nothing references would
 * be dropped when linking the static library.) */
#include "model/model.h"

#include <string.h>

static const struct tern_arch *const archs[] = {
    &tern_arch_llama,
    &tern_arch_qwen2,
    &tern_arch_qwen3,
    &tern_arch_qwen3moe,
    &tern_arch_qwen35,
    &tern_arch_qwen35moe,
    &tern_arch_qwen3next,
    &tern_arch_gptoss,
};

const struct tern_arch *tern_arch_find(const char *name) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(archs[i]->name, name)) return archs[i];
    return NULL;
}

const char *tern_arch_names(void) {
    static _Thread_local char names[256];
    size_t o = 0;
    names[0] = 0;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
        size_t n = strlen(archs[i]->name);
        if (o + n + 3 >= sizeof names) break;
        if (i) {
            memcpy(names + o, ", ", 2);
            o += 2;
        }
        memcpy(names + o, archs[i]->name, n);
        o += n;
        names[o] = 0;
    }
    return names;
}
