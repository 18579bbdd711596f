/* Conversion of Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json) to
 * GGUF tokenizer.* metadata, as llama.cpp's convert_hf_to_gguf.py writes it for
 * byte-level BPE models (Qwen2/Qwen3, Llama 3, GPT-2 and the like). */
#ifndef TERN_TOKENIZER_HF_CONVERT_H
#define TERN_TOKENIZER_HF_CONVERT_H

#include "gguf/gguf.h"
#include "tern.h"

#include <stdint.h>

struct tern_hf_convert_opts {
    /* tokenizer.ggml.pre; NULL: detected from the pre-tokenizer's regex (qwen2,
     * llama-bpe, gpt-2), an error if it cannot be. */
    const char *pre;
    /* Pad the vocabulary with "[PAD<id>]" UNUSED tokens up to this many (a model's
     * embedding often has more rows than the tokenizer has tokens); 0: no padding. */
    uint32_t vocab_size;
    /* Out: the pre-tokenizer written (opts->pre or a static string). */
    const char *pre_used;
};

/* Reads tokenizer_json (and config_json, which may be NULL) and adds to w:
 * tokenizer.ggml.model ("gpt2"), .pre, .tokens, .token_type (CONTROL for special added
 * tokens and ones that look special, USER_DEFINED for other added tokens, NORMAL
 * otherwise, UNUSED for padding), .merges, and from the config .bos/.eos/.padding/
 * .unknown_token_id, .add_bos_token/.add_eos_token and tokenizer.chat_template.
 * Errors name the file and the field. On error w may hold some of the keys. */
enum tern_status tern_hf_tokenizer_to_gguf(struct gguf_writer *w, const char *tokenizer_json,
                                           const char *config_json, struct tern_hf_convert_opts *opts);

/* The pre-tokenizer a tokenizer.json's regex stands for ("qwen2", "llama-bpe",
 * "gpt-2"), or NULL. */
const char *tern_hf_detect_pre(const char *regex, bool byte_level_use_regex);

#endif
