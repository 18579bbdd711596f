/* Chat templates: a Jinja interpreter that runs a model's own chat template.
 *
 * The reference is Python jinja2 as Hugging Face transformers configures it for
 * apply_chat_template: ImmutableSandboxedEnvironment(trim_blocks=True,
 * lstrip_blocks=True, extensions=[loopcontrols]), lenient Undefined, no autoescape,
 * keep_trailing_newline=False, plus the globals raise_exception(msg) and
 * strftime_now(fmt) and a tojson filter that is json.dumps(ensure_ascii=False).
 * Values follow Python semantics (str() printing, truthiness, ==, in, +, slicing,
 * string methods). docs/templates.md lists what is supported and where it differs.
 *
 * A compiled template is immutable: render it many times, from several threads at
 * once. Every render works in its own memory and is bounded by the limits in
 * tern_template_opts, so no input (template or variables) can crash it, loop forever
 * or exhaust memory: a limit that is hit is an error naming the limit. */
#ifndef TERN_TEMPLATE_H
#define TERN_TEMPLATE_H

#include "util/buf.h"
#include "util/status.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct tern_template;

/* Zero fields take the defaults below. */
struct tern_template_opts {
    size_t max_output;   /* bytes of output, and of any string built on the way (default 64 MiB) */
    uint32_t max_depth;  /* nested macro calls, nested data printed or compared (default 200) */
    uint64_t max_steps;  /* statements + expressions evaluated + items iterated (default 50M) */
    time_t (*clock)(void *user); /* NULL: time(NULL); strftime_now formats it as UTC */
    void *clock_user;
    size_t max_memory;   /* bytes of working memory per render (default 16 x max_output, >= 256 MiB) */
};

#define TERN_TEMPLATE_DEFAULT_MAX_OUTPUT ((size_t)64 << 20)
#define TERN_TEMPLATE_DEFAULT_MAX_DEPTH 200u
#define TERN_TEMPLATE_DEFAULT_MAX_STEPS 50000000ull

/* Parses src (len bytes, UTF-8; need not be NUL-terminated). On a syntax error returns
 * TERN_ERR_TEMPLATE with the message "line L:C: expected X, got Y" (or a similar
 * description of the problem) and *out is NULL. The source is copied. */
enum tern_status tern_template_compile(const char *src, size_t len, struct tern_template **out);

/* Renders t with vars, a JSON object whose keys become template variables (messages,
 * tools, add_generation_prompt, bos_token, eos_token, extra keywords). Object key order
 * is kept (tojson, items()); 30.0 stays a float. vars is only read; it may be NULL.
 * opts may be NULL (all defaults).
 *
 * On success the render is appended to out. On error out is unchanged and the status
 * is TERN_ERR_TEMPLATE (the template failed: the message names the variable or the
 * operation and the line, except that raise_exception(msg) gives exactly msg),
 * TERN_ERR_LIMIT (a limit of opts was hit; the message names it) or TERN_ERR_NOMEM. */
enum tern_status tern_template_render(const struct tern_template *t, const json_t *vars,
                                      const struct tern_template_opts *opts, struct tern_buf *out);

/* Byte ranges [start, end) of a render. */
struct tern_template_span {
    size_t start, end;
};
struct tern_template_spans {
    struct tern_template_span *v; /* malloc'd; tern_template_spans_free */
    size_t n, cap;
};
void tern_template_spans_free(struct tern_template_spans *s);

/* As tern_template_render, and appends to *spans (sorted, disjoint, offsets into out)
 * the ranges of the output whose bytes came from the string values of vars — message
 * contents, names, tool results, tool-call arguments, tools, extra keywords — as opposed
 * to the template's own literals. `trusted` (NULL-terminated, may be NULL) names
 * top-level variables whose string values are the caller's (bos_token): not marked.
 *
 * What is tracked: strings of vars printed directly, through attribute, item and slice
 * access, loops, set, namespaces and macro arguments; concatenation (+, ~, output
 * sums) and captured output (macros, call and set blocks, filter blocks) byte by byte;
 * a view of a string (slice, strip, trim, split pieces) keeps the marking of the bytes
 * it shows. A string computed from marked input by any other filter, method or
 * operator (replace, join, format, %, tojson, upper ...) is marked as a whole, and so
 * is the printed form of a container that holds marked strings. Not tracked: single
 * characters got by iterating over a string (`for ch in s`), which come out unmarked.
 * On error out and *spans are unchanged. */
enum tern_status tern_template_render_spans(const struct tern_template *t, const json_t *vars,
                                            const struct tern_template_opts *opts, const char *const *trusted,
                                            struct tern_buf *out, struct tern_template_spans *spans);

/* True when the template source reads the variable `name` anywhere (as jinja2's
 * meta.find_undeclared_variables would, approximately: any load of the name). */
int tern_template_uses(const struct tern_template *t, const char *name);

void tern_template_free(struct tern_template *t);

#endif
