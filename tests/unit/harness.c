#include "harness.h"

#include "backend/vulkan/vulkan.h"
#include "model/mkmodel.h"
#include "tern.h"

#include <stdbool.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* TERN_REQUIRE_SHARED=1 (scripts/test.sh sets it when the kit is there): a missing kit
 * or file fails the test instead of skipping it, so that CI cannot pass on skips. */
bool th_shared_required(void) {
    const char *e = getenv("TERN_REQUIRE_SHARED");
    return e && *e && strcmp(e, "0") != 0;
}

static void missing(const char *what) {
    if (th_shared_required()) {
        printf("FAIL: %s, and TERN_REQUIRE_SHARED is set: the kit must be complete\n", what);
        fflush(stdout);
        exit(1);
    }
}

/* The kit's directory: $TERN_SHARED_DIR as the test runs (the user's), else the
 * configure-time path ctest passes as TERN_SHARED_DIR_DEFAULT, else ../shared. */
static const char *shared_dir_name(void) {
    const char *e = getenv("TERN_SHARED_DIR");
    if (!e || !*e) e = getenv("TERN_SHARED_DIR_DEFAULT");
    if (!e || !*e) e = "../shared";
    return e;
}

const char *th_shared_dir(void) {
    static char dir[4096];
    const char *e = shared_dir_name();
    struct stat st;
    if (stat(e, &st) != 0 || !S_ISDIR(st.st_mode)) {
        char what[4200];
        snprintf(what, sizeof what, "the shared data kit %s is absent", e);
        missing(what);
        return NULL;
    }
    snprintf(dir, sizeof dir, "%s", e);
    return dir;
}

const char *th_shared_path(const char *rel) {
    static char path[4096];
    const char *d = th_shared_dir();
    if (!d) return NULL;
    snprintf(path, sizeof path, "%s/%s", d, rel);
    return path;
}

bool th_have_shared(const char *rel) {
    const char *p = th_shared_path(rel ? rel : ".");
    struct stat st;
    if (p && stat(p, &st) == 0) return true;
    if (p) {
        char what[4200];
        snprintf(what, sizeof what, "%s is absent from the shared data kit", p);
        missing(what);
    }
    return false;
}

void th_require_shared(const char *rel) {
    const char *d = th_shared_dir();
    if (!d) {
        printf("SKIP: the shared data kit (../shared, or $TERN_SHARED_DIR) is absent; "
               "this test needs it\n");
        exit(77);
    }
    if (rel) {
        const char *p = th_shared_path(rel);
        struct stat st;
        if (stat(p, &st) != 0) {
            missing("a file of the kit is absent");
            printf("SKIP: %s is absent from the shared data kit\n", p);
            exit(77);
        }
    }
}

static char tmpdir_path[256];

static void rm_tmpdir(void) {
    if (tmpdir_path[0]) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir_path);
        if (system(cmd) != 0) { /* best effort */ }
    }
}

const char *th_tmpdir(void) {
    if (!tmpdir_path[0]) {
        snprintf(tmpdir_path, sizeof tmpdir_path, "/tmp/tern-test-XXXXXX");
        if (!mkdtemp(tmpdir_path)) {
            perror("mkdtemp");
            abort();
        }
        atexit(rm_tmpdir);
    }
    return tmpdir_path;
}

char *th_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    if (n < 0) {
        fclose(f);
        return NULL;
    }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return NULL;
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

const char *th_tern_bin(void) {
    const char *e = getenv("TERN_BIN");
    return e && *e ? e : "./tern";
}

const char *th_tiny_model(void) {
    static char path[512];
    if (path[0]) return path;
    char p[512];
    snprintf(p, sizeof p, "%s/tiny.gguf", th_tmpdir());
    struct tern_mkmodel_params mp;
    if (tern_mkmodel_preset("tiny-qwen3", &mp)) abort();
    mp.n_layer = 1;
    if (tern_mkmodel_write(&mp, p, NULL)) {
        fprintf(stderr, "th_tiny_model: %s\n", tern_last_error());
        abort();
    }
    memcpy(path, p, sizeof path);
    return path;
}

int th_vulkan_find(void) {
    struct tern_vk_device_info d[8];
    uint32_t n = 0;
    const char *why = NULL;
    if (!tern_vk_built()) why = "this build has no Vulkan backend (libvulkan-dev and glslc were absent)";
    else if (tern_vk_enumerate(d, 8, &n)) why = tern_last_error();
    else if (n == 0) why = "Vulkan lists no device";
    if (why) {
        const char *req = getenv("TERN_REQUIRE_VULKAN");
        if (req && !strcmp(req, "1")) {
            fprintf(stderr, "FAIL: TERN_REQUIRE_VULKAN=1 but there is no Vulkan device: %s\n", why);
            exit(1);
        }
        printf("SKIP: no Vulkan device: %s\n", why);
        return -1;
    }
    const char *e = getenv("TERN_VK_DEVICE");
    if (e && *e) return atoi(e);
    const int idx = tern_vk_pick_auto(d, n < 8 ? n : 8);
    return idx < 0 ? 0 : idx;
}

int th_vulkan_device(void) {
    const int idx = th_vulkan_find();
    if (idx < 0) exit(77);
    return idx;
}

int th_use_vulkan(struct tern_model *m, int dev, uint32_t n_chunk) {
    char name[32];
    snprintf(name, sizeof name, "vulkan:%d", dev);
    return tern_model_use_device(m, name, n_chunk);
}
