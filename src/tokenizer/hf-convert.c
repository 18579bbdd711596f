/* Hugging Face tokenizer.json -> GGUF tokenizer metadata (byte-level BPE). The rules
 * follow llama.cpp's convert_hf_to_gguf.py (get_vocab_base, does_token_look_special)
 * and gguf-py's SpecialVocab, so that the result tokenizes as llama.cpp's own
 * conversions do. */
#include "tokenizer/hf-convert.h"

#include "tokenizer/tok-internal.h"
#include "util/log.h"
#include "util/mem.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pre-tokenizer regexes as tokenizer.json spells them. */
static const char re_qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *tern_hf_detect_pre(const char *regex, bool byte_level_use_regex) {
    if (regex) {
        if (!strcmp(regex, re_qwen2)) return "qwen2";
        if (!strcmp(regex, re_llama3)) return "llama-bpe";
        return NULL;
    }
    return byte_level_use_regex ? "gpt-2" : NULL;
}

struct conv {
    const char *path;     /* of the file being read, for messages */
    json_t *tok, *cfg;
    uint32_t n;           /* tokens */
    struct gguf_str *text;
    int32_t *type;
    char **owned;         /* texts we made ([PAD..], joined merges), freed at the end */
    size_t n_owned, owned_cap;
};

static enum tern_status fmt_err(const struct conv *c, const char *what) {
    return tern_errorf(TERN_ERR_FORMAT, "%s: %s", c->path, what);
}

static char *own(struct conv *c, char *s) {
    if (!s) return NULL;
    if (tok_grow((void **)&c->owned, &c->owned_cap, c->n_owned + 1, sizeof *c->owned)) {
        free(s);
        return NULL;
    }
    c->owned[c->n_owned++] = s;
    return s;
}

static json_t *load_json(const char *path) {
    json_error_t err;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &err);
    if (!j) tern_errorf(TERN_ERR_FORMAT, "%s:%d:%d: %s", path, err.line, err.column, err.text);
    return j;
}

/* Walks the pre-tokenizer: the Split regex (if any) and whether a ByteLevel step
 * splits with its own (GPT-2) regex. */
static void scan_pre(json_t *p, const char **regex, bool *byte_level, bool *bl_regex) {
    if (!json_is_object(p)) return;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(p, "pretokenizers");
        size_t i;
        json_t *e;
        json_array_foreach(arr, i, e) scan_pre(e, regex, byte_level, bl_regex);
    } else if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *r = json_string_value(json_object_get(pat, "Regex"));
        if (r && !*regex) *regex = r;
    } else if (!strcmp(type, "ByteLevel")) {
        *byte_level = true;
        json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) *bl_regex = true;
    }
}

/* convert_hf_to_gguf.py's does_token_look_special. */
static bool looks_special(const char *s) {
    size_t n = strlen(s);
    if (!strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") || !strcmp(s, "[@BOS@]")) return true;
    if (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>")) return true;
    if (n >= 8 && !strncmp(s, "<\xEF\xBD\x9C", 4) && !strcmp(s + n - 4, "\xEF\xBD\x9C>")) return true;
    if (n >= 8 && !strncmp(s, "<unused", 7) && s[n - 1] == '>') return true;
    return false;
}

static enum tern_status read_vocab(struct conv *c, const struct tern_hf_convert_opts *o) {
    json_t *model = json_object_get(c->tok, "model");
    if (!json_is_object(model)) return fmt_err(c, "no \"model\" object");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE"))
        return tern_errorf(TERN_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (only byte-level BPE)",
                           c->path, mtype);
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return fmt_err(c, "\"model.vocab\" is not an object");
    json_t *added = json_object_get(c->tok, "added_tokens");
    if (added && !json_is_array(added)) return fmt_err(c, "\"added_tokens\" is not an array");

    uint64_t n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= INT32_MAX - 1)
            return tern_errorf(TERN_ERR_FORMAT, "%s: model.vocab['%s'] is not a token id in 0..%d", c->path, key,
                               INT32_MAX - 2);
        if ((uint64_t)id + 1 > n) n = (uint64_t)id + 1;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX - 1 ||
            !json_is_string(json_object_get(v, "content")))
            return tern_errorf(TERN_ERR_FORMAT, "%s: added_tokens[%zu] needs an \"id\" and a \"content\"", c->path, i);
        if ((uint64_t)json_integer_value(id) + 1 > n) n = (uint64_t)json_integer_value(id) + 1;
    }
    if (!n) return fmt_err(c, "the vocabulary is empty");
    if (o->vocab_size) {
        if (o->vocab_size < n)
            return tern_errorf(TERN_ERR_INVALID, "vocab size %u is smaller than the %llu tokens of %s", o->vocab_size,
                               (unsigned long long)n, c->path);
        n = o->vocab_size;
    }
    c->n = (uint32_t)n;
    c->text = tern_calloc(n, sizeof *c->text);
    c->type = tern_calloc(n, sizeof *c->type);
    if (!c->text || !c->type) return tern_errorf(TERN_ERR_NOMEM, "no memory for %llu tokens", (unsigned long long)n);

    for (void *it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) {
        size_t id = (size_t)json_integer_value(json_object_iter_value(it));
        if (c->text[id].ptr)
            return tern_errorf(TERN_ERR_FORMAT, "%s: token id %zu appears twice in model.vocab", c->path, id);
        c->text[id] = (struct gguf_str){json_object_iter_key(it), json_object_iter_key_len(it)};
        c->type[id] = TERN_TOKEN_TYPE_NORMAL;
    }
    json_array_foreach(added, i, v) {
        size_t id = (size_t)json_integer_value(json_object_get(v, "id"));
        json_t *content = json_object_get(v, "content");
        const char *s = json_string_value(content);
        size_t len = json_string_length(content);
        bool special = json_is_true(json_object_get(v, "special")) || looks_special(s);
        if (special) {
            c->text[id] = (struct gguf_str){s, len};
            c->type[id] = TERN_TOKEN_TYPE_CONTROL;
        } else {
            /* User-defined tokens are matched in raw text: U+2581 stands for a space
             * there (as convert_hf_to_gguf.py does). */
            char *u = own(c, tern_malloc(len + 1));
            if (!u) return tern_errorf(TERN_ERR_NOMEM, "no memory");
            size_t k = 0;
            for (size_t j = 0; j < len;) {
                if (j + 3 <= len && !memcmp(s + j, "\xE2\x96\x81", 3)) {
                    u[k++] = ' ';
                    j += 3;
                } else {
                    u[k++] = s[j++];
                }
            }
            u[k] = 0;
            c->text[id] = (struct gguf_str){u, k};
            c->type[id] = TERN_TOKEN_TYPE_USER_DEFINED;
        }
    }
    for (uint32_t id = 0; id < c->n; id++) {
        if (c->text[id].ptr) continue;
        char buf[32];
        int k = snprintf(buf, sizeof buf, "[PAD%u]", id);
        char *s = own(c, tern_strdup(buf));
        if (!s) return tern_errorf(TERN_ERR_NOMEM, "no memory");
        c->text[id] = (struct gguf_str){s, (uint64_t)k};
        c->type[id] = TERN_TOKEN_TYPE_UNUSED;
    }
    return TERN_OK;
}

static enum tern_status write_merges(struct conv *c, struct gguf_writer *w) {
    json_t *merges = json_object_get(json_object_get(c->tok, "model"), "merges");
    if (!json_is_array(merges)) return fmt_err(c, "\"model.merges\" is not an array");
    size_t n = json_array_size(merges);
    struct gguf_str *m = tern_calloc(n ? n : 1, sizeof *m);
    if (!m) return tern_errorf(TERN_ERR_NOMEM, "no memory for %zu merges", n);
    enum tern_status st = TERN_OK;
    size_t i;
    json_t *e;
    json_array_foreach(merges, i, e) {
        if (json_is_string(e)) {
            /* "left right" */
            m[i] = (struct gguf_str){json_string_value(e), json_string_length(e)};
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            /* ["left", "right"] (newer tokenizers): joined with a space as GGUF has it */
            json_t *a = json_array_get(e, 0), *b = json_array_get(e, 1);
            size_t la = json_string_length(a), lb = json_string_length(b);
            char *s = own(c, tern_malloc(la + lb + 2));
            if (!s) {
                st = tern_errorf(TERN_ERR_NOMEM, "no memory");
                break;
            }
            memcpy(s, json_string_value(a), la);
            s[la] = ' ';
            memcpy(s + la + 1, json_string_value(b), lb);
            s[la + lb + 1] = 0;
            m[i] = (struct gguf_str){s, la + lb + 1};
        } else {
            st = tern_errorf(TERN_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", c->path, i);
            break;
        }
    }
    if (!st) st = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", m, n);
    free(m);
    return st;
}

static int32_t find_token(const struct conv *c, const char *s) {
    size_t len = strlen(s);
    for (uint32_t id = 0; id < c->n; id++)
        if (c->text[id].len == len && !memcmp(c->text[id].ptr, s, len)) return (int32_t)id;
    return -1;
}

/* A special token in tokenizer_config.json: null, "text" or {"content": "text", ...}. */
static enum tern_status config_token(struct conv *c, struct gguf_writer *w, const char *field, const char *key) {
    json_t *v = json_object_get(c->cfg, field);
    if (!v || json_is_null(v)) return TERN_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    const char *s = json_string_value(v);
    if (!s) return tern_errorf(TERN_ERR_FORMAT, "%s: \"%s\" is not a string or {\"content\": ...}", c->path, field);
    int32_t id = find_token(c, s);
    if (id < 0) {
        TERN_LOG_WARN("convert-tokenizer: %s '%s' is not in the vocabulary; not set", field, s);
        return TERN_OK;
    }
    return gguf_writer_set_u32(w, key, (uint32_t)id);
}

static enum tern_status write_config(struct conv *c, struct gguf_writer *w) {
    enum tern_status st;
    if ((st = config_token(c, w, "bos_token", "tokenizer.ggml.bos_token_id")) ||
        (st = config_token(c, w, "eos_token", "tokenizer.ggml.eos_token_id")) ||
        (st = config_token(c, w, "unk_token", "tokenizer.ggml.unknown_token_id")) ||
        (st = config_token(c, w, "pad_token", "tokenizer.ggml.padding_token_id")))
        return st;
    static const char *const flags[][2] = {{"add_bos_token", "tokenizer.ggml.add_bos_token"},
                                           {"add_eos_token", "tokenizer.ggml.add_eos_token"}};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(c->cfg, flags[i][0]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_boolean(v)) return tern_errorf(TERN_ERR_FORMAT, "%s: \"%s\" is not a boolean", c->path, flags[i][0]);
        if ((st = gguf_writer_set_bool(w, flags[i][1], json_is_true(v)))) return st;
    }
    json_t *tpl = json_object_get(c->cfg, "chat_template");
    if (json_is_string(tpl)) return gguf_writer_set_str(w, "tokenizer.chat_template", json_string_value(tpl));
    if (json_is_array(tpl)) {
        /* [{"name": ..., "template": ...}]: "default" is the chat template, the others
         * go to tokenizer.chat_template.<name> (as gguf-py writes them). */
        size_t i;
        json_t *e;
        json_array_foreach(tpl, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            const char *t = json_string_value(json_object_get(e, "template"));
            if (!name || !t)
                return tern_errorf(TERN_ERR_FORMAT, "%s: chat_template[%zu] needs \"name\" and \"template\"", c->path, i);
            char key[256];
            if (!strcmp(name, "default"))
                snprintf(key, sizeof key, "tokenizer.chat_template");
            else if ((size_t)snprintf(key, sizeof key, "tokenizer.chat_template.%s", name) >= sizeof key)
                return tern_errorf(TERN_ERR_FORMAT, "%s: chat template name '%.40s...' is too long", c->path, name);
            if ((st = gguf_writer_set_str(w, key, t))) return st;
        }
    } else if (tpl && !json_is_null(tpl)) {
        return tern_errorf(TERN_ERR_FORMAT, "%s: \"chat_template\" is neither a string nor a list", c->path);
    }
    return TERN_OK;
}

enum tern_status tern_hf_tokenizer_to_gguf(struct gguf_writer *w, const char *tokenizer_json,
                                           const char *config_json, struct tern_hf_convert_opts *opts) {
    struct tern_hf_convert_opts none = {0};
    struct tern_hf_convert_opts *o = opts ? opts : &none;
    struct conv c = {.path = tokenizer_json};
    enum tern_status st = TERN_OK;
    if (!w || !tokenizer_json) return tern_errorf(TERN_ERR_INVALID, "convert-tokenizer: NULL argument");
    if (!(c.tok = load_json(tokenizer_json))) return TERN_ERR_FORMAT;
    if (!json_is_object(c.tok)) {
        st = fmt_err(&c, "not a JSON object");
        goto done;
    }

    const char *regex = NULL;
    bool byte_level = false, bl_regex = false;
    scan_pre(json_object_get(c.tok, "pre_tokenizer"), &regex, &byte_level, &bl_regex);
    bool dec_bl = false, unused = false;
    const char *unused_re = NULL;
    scan_pre(json_object_get(c.tok, "decoder"), &unused_re, &dec_bl, &unused);
    if (!byte_level && !dec_bl) {
        st = tern_errorf(TERN_ERR_UNSUPPORTED,
                         "%s: not a byte-level BPE tokenizer (no ByteLevel pre-tokenizer or decoder); only those "
                         "can be converted",
                         c.path);
        goto done;
    }
    const char *pre = o->pre;
    if (!pre) pre = tern_hf_detect_pre(regex, bl_regex);
    if (!pre) {
        st = tern_errorf(TERN_ERR_UNSUPPORTED,
                         "%s: cannot tell the pre-tokenizer from its regex '%.200s'; name it (--pre qwen2, "
                         "llama-bpe, gpt-2, ...)",
                         c.path, regex ? regex : "(none)");
        goto done;
    }
    struct pretok check;
    struct pre_info info;
    if ((st = pretok_init(&check, pre, &info))) goto done;
    pretok_free(&check);
    o->pre_used = pre;

    if ((st = read_vocab(&c, o))) goto done;
    if ((st = gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2")) ||
        (st = gguf_writer_set_str(w, "tokenizer.ggml.pre", pre)) ||
        (st = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", c.text, c.n)) ||
        (st = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, c.type, c.n)) ||
        (st = write_merges(&c, w)))
        goto done;
    if (config_json) {
        c.path = config_json;
        if (!(c.cfg = load_json(config_json))) {
            st = TERN_ERR_FORMAT;
            goto done;
        }
        if (!json_is_object(c.cfg)) {
            st = fmt_err(&c, "not a JSON object");
            goto done;
        }
        st = write_config(&c, w);
    }
done:
    for (size_t i = 0; i < c.n_owned; i++) free(c.owned[i]);
    free(c.owned);
    free(c.text);
    free(c.type);
    json_decref(c.tok);
    json_decref(c.cfg);
    return st;
}
