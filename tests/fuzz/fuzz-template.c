/* Fuzz target: compile the input as a chat template and render it with a fixed set of
 * variables (messages with tool calls, tools, special tokens, odd values), under small
 * limits. Checks that a failed render leaves no output and that rendering is
 * deterministic (a second render gives the same bytes). */
#include "template/template.h"
#include "util/buf.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char VARS[] =
    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"enable_thinking\": false,"
    " \"messages\": ["
    "  {\"role\": \"system\", \"content\": \"You are helpful.\"},"
    "  {\"role\": \"user\", \"content\": \"Hi \\u00e9\\u4e2d\\ud83d\\ude00 <b>&</b> {{ x }}\\r\\n\\ttab\"},"
    "  {\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nok\", \"reasoning_content\": \"why\","
    "   \"tool_calls\": [{\"id\": \"call00001\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    "   \"arguments\": {\"city\": \"Paris\", \"n\": 30.0, \"deep\": {\"a\": [1, 2, {\"b\": null}]}, \"ok\": false}}}]},"
    "  {\"role\": \"tool\", \"tool_call_id\": \"call00001\", \"content\": \"sunny\"},"
    "  {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}}]},"
    "  {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part\"}, {\"type\": \"image\"}]}"
    " ],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather.\","
    "   \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"enum\": [\"a\", \"b\"]},"
    "   \"days\": {\"type\": \"integer\", \"default\": 3}}, \"required\": [\"city\"]}}}],"
    " \"n\": 3, \"f\": 1e-7, \"big\": 9223372036854775807, \"neg\": -1, \"empty\": [], \"none\": null, \"s\": \"a,b,,c\"}";

static time_t fixed_clock(void *user) {
    (void)user;
    return (time_t)1795910400;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *vars;
    if (!vars) {
        vars = json_loads(VARS, 0, NULL);
        if (!vars) abort();
    }
    struct tern_template *t;
    if (tern_template_compile((const char *)data, size, &t) != TERN_OK) return 0;
    struct tern_template_opts o = {0};
    o.max_output = 1 << 20;
    o.max_steps = 200000;
    o.max_depth = 64;
    o.max_memory = 64 << 20;
    o.clock = fixed_clock;
    struct tern_buf a = TERN_BUF_INIT, b = TERN_BUF_INIT;
    enum tern_status st = tern_template_render(t, vars, &o, &a);
    if (st != TERN_OK && a.len != 0) abort(); /* a failed render leaves nothing */
    if (st == TERN_OK && size < 4096) {
        enum tern_status st2 = tern_template_render(t, vars, &o, &b);
        if (st2 != TERN_OK || a.len != b.len || (a.len && memcmp(a.data, b.data, a.len) != 0)) abort();
        /* marking the variables' bytes never changes the render; its spans are sorted,
         * disjoint and inside it */
        static const char *const trusted[] = {"bos_token", NULL};
        struct tern_template_spans sp = {0};
        tern_buf_clear(&b);
        st2 = tern_template_render_spans(t, vars, &o, trusted, &b, &sp);
        if (st2 != TERN_OK || a.len != b.len || (a.len && memcmp(a.data, b.data, a.len) != 0)) abort();
        for (size_t i = 0; i < sp.n; i++)
            if (sp.v[i].start >= sp.v[i].end || sp.v[i].end > b.len || (i && sp.v[i].start <= sp.v[i - 1].end)) abort();
        tern_template_spans_free(&sp);
    }
    tern_buf_free(&a);
    tern_buf_free(&b);
    tern_template_free(t);
    return 0;
}
