/* template: the Jinja engine feature by feature, its errors and its limits.
 *
 * The expected renders in render_cases were produced by Python jinja2 3.1 configured as
 * transformers configures it (see src/template/template.h), so each row checks one
 * behaviour against the reference. */
#include "harness.h"

#include "gguf/gguf.h"
#include "template/template.h"
#include "util/buf.h"
#include "util/mem.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static time_t pinned_clock(void *user) {
    (void)user;
    return (time_t)1795910400; /* 2026-11-29 00:00:00 UTC */
}

/* Renders src with vars (JSON text); returns the status, output in *out. */
static enum tern_status render(const char *src, const char *vars_json, const struct tern_template_opts *opts,
                               struct tern_buf *out) {
    struct tern_template *t;
    enum tern_status st = tern_template_compile(src, strlen(src), &t);
    if (st) return st;
    json_error_t err;
    json_t *vars = json_loads(vars_json ? vars_json : "{}", 0, &err);
    assert_non_null(vars);
    struct tern_template_opts o = {0};
    if (opts) o = *opts;
    if (!o.clock) o.clock = pinned_clock;
    st = tern_template_render(t, vars, &o, out);
    json_decref(vars);
    tern_template_free(t);
    return st;
}

struct render_case {
    const char *name, *src, *vars, *expected;
};

static const struct render_case render_cases[] = {
    {"ws_lstrip_trim",
     "  {% if true %}\n  x\n  {% endif %}\n  y",
     "{}",
     "  x\n  y"},
    {"ws_minus",
     "a  {%- if true -%}  b  {%- endif -%}  c",
     "{}",
     "abc"},
    {"ws_var_minus",
     "a \n {{- ' x ' -}} \n b",
     "{}",
     "a x b"},
    {"ws_comment",
     "a\n{# comment #}\nb\n  {#- c -#}  z",
     "{}",
     "a\nbz"},
    {"ws_raw",
     "{% raw %}{{ x }}{% if %}{% endraw %}|",
     "{}",
     "{{ x }}{% if %}|"},
    {"ws_raw_strip",
     "a  {%- raw -%}  {{ x }}  {%- endraw -%}  b",
     "{}",
     "a{{ x }}b"},
    {"ws_plus",
     "  {%+ if true %}x{% endif %}|{% if true +%}\nkept{% endif %}",
     "{}",
     "  x|\nkept"},
    {"ws_trailing_newline",
     "x\n",
     "{}",
     "x"},
    {"ws_crlf",
     "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n",
     "{}",
     "a\nb\nc"},
    {"ws_line_start_after_var",
     "{{ 'a' }}\n  {% if true %}b{% endif %}",
     "{}",
     "a\nb"},
    {"ws_block_in_line",
     "x {% if true %}y{% endif %} z\n  {% if true %}w{% endif %}",
     "{}",
     "x y z\nw"},
    {"ws_dict_braces",
     "{{ {'a': {'b': 1}} }}",
     "{}",
     "{'a': {'b': 1}}"},
    {"arith",
     "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 / 3 }} {{ 6 / 3 }}",
     "{}",
     "7 3 -4 -2 2 1024 3.5 0.3333333333333333 2.0"},
    {"arith_float",
     "{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ 2.0 ** 3 }} {{ true + true }} {{ -true }}",
     "{}",
     "3.0 0.5 0.5 8.0 2 -1"},
    {"floats",
     "{{ 30.0 }} {{ 1e-7 }} {{ 1e16 }} {{ 1e15 }} {{ 0.1 + 0.2 }} {{ 123456789.123 }} {{ 1.5e300 * 1e10 }} {{ -0.0 }} {{ 0.0001 }} {{ 0.00001 }} {{ x }}",
     "{\"x\": 30.0}",
     "30.0 1e-07 1e+16 1000000000000000.0 0.30000000000000004 123456789.123 inf -0.0 0.0001 1e-05 30.0"},
    {"pow_assoc",
     "{{ 2 ** 3 ** 2 }} {{ -2 ** 2 }}",
     "{}",
     "64 4"},
    {"strings",
     "{{ 'a' ~ 1 ~ none ~ true ~ x }}|{{ 'ab' * 3 }}|{{ 2 * 'c' }}|{{ 'x' + 'y' }}|{{ 'a' 'b' \"c\" }}",
     "{}",
     "a1NoneTrue|ababab|cc|xy|abc"},
    {"escapes",
     "{{ 'a\\tb\\n\\'\\\\|\\u00e9\\x41\\101|\\q' }}",
     "{}",
     "a\tb\n'\\|éAA|\\q"},
    {"escape_nonascii",
     "{{ '\\é' }}|{{ \"é\\\"\" }}",
     "{}",
     "\\xe9|é\""},
    {"compare",
     "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 == 1.0 }} {{ 1 == true }} {{ [1] == [1] }} {{ [1] == (1,) }} {{ {'a':1} == {'a':1} }} {{ none == none }} {{ 'a' != 'b' }} {{ 2 >= 2 }}",
     "{}",
     "True False True True True True True False True True True True"},
    {"contains",
     "{{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in {'k':1} }} {{ 3 not in [1] }} {{ '' in 'x' }} {{ 1.0 in [1] }}",
     "{}",
     "True True True True True True"},
    {"repr",
     "{{ [1, 'a', none, true, 1.0, {'k': (1,)}] }}|{{ {'a': \"it's\"} }}|{{ ('x',) }}|{{ () }}|{{ ['a\\nb', 'q\"', \"both'\\\"\"] }}|{{ [x] }}",
     "{\"x\": \"tab\\there é 😀 \342\200\213\\u0001\"}",
     "[1, 'a', None, True, 1.0, {'k': (1,)}]|{'a': \"it's\"}|('x',)|()|['a\\nb', 'q\"', 'both\\'\"']|['tab\\there é 😀 \\u200b\\x01']"},
    {"cond",
     "{{ 'y' if true else 'n' }}|{{ 'y' if false }}|{{ 'a' if 0 else 'b' if 1 else 'c' }}",
     "{}",
     "y||b"},
    {"andor",
     "{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' and 'z' }}| {{ none or [] }} {{ not 0 }} {{ not [] }} {{ not 'a' }}",
     "{}",
     "x y | [] True True False"},
    {"unary_filter",
     "{{ -1|abs }} {{ -(1)|abs }} {{ - 3 }}",
     "{}",
     "1 1 -3"},
    {"slicing",
     "{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ [1,2,3,4][::2] }} {{ [1,2,3][-1] }} {{ 'héllo'[1] }}|{{ [1,2,3][5] }}|{{ [1,2,3][-5:10] }} {{ 'abc'[1:] }} {{ [1,2,3][:-1] }} {{ 'héllo😀'[::-2] }} {{ x[1:] }}",
     "{\"x\": [1, 2, 3]}",
     "el olleh [1, 3] 3 é||[1, 2, 3] bc [1, 2] 😀lé [2, 3]"},
    {"unicode_len",
     "{{ 'héllo😀'|length }} {{ 'héllo😀'[-1] }} {{ x|length }}",
     "{\"x\": \"👨‍👩‍👧\"}",
     "6 😀 5"},
    {"dict_access",
     "{{ d.a }} {{ d['a'] }}|{{ d.missing }}|{{ d.get('missing', 5) }}|{{ d.get('a') }}|{{ d.get('zz') }}|{{ d['items'] }}|{{ d.items()|list }}",
     "{\"d\": {\"a\": 1, \"items\": 2}}",
     "1 1||5|1|None|2|[('a', 1), ('items', 2)]"},
    {"attr_fallback",
     "{{ x.0 }} {{ x[0] }} {{ s.upper() }} {{ s['upper']() }} {{ n.foo }}|{{ s.nope }}|",
     "{\"x\": [\"a\"], \"s\": \"q\", \"n\": null}",
     "a a Q Q ||"},
    {"for_loop",
     "{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
     "{}",
     "10TrueFalse332b;21FalseFalse321ac;32FalseTrue310b;"},
    {"for_else",
     "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in none_var %}x{% else %}undef{% endfor %}",
     "{}",
     "empty|undef"},
    {"for_filter",
     "{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }}{{ loop.last }};{% endfor %}",
     "{}",
     "11False;32False;53False;74False;95True;"},
    {"for_unpack",
     "{% for k, v in {'a':1,'b':2}.items() %}{{ k }}={{ v }};{% endfor %}{% for a, (b, c) in [(1, (2, 3))] %}{{ a }}{{ b }}{{ c }}{% endfor %}",
     "{}",
     "a=1;b=2;123"},
    {"for_dict",
     "{% for k in d %}{{ k }}{% endfor %}|{% for ch in 'hé' %}[{{ ch }}]{% endfor %}",
     "{\"d\": {\"b\": 1, \"a\": 2}}",
     "ba|[h][é]"},
    {"for_break",
     "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "{}",
     "0134"},
    {"scoping",
     "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};{% endfor %}{{ x }}",
     "{}",
     "110;120;1"},
    {"scoping_if",
     "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
     "{}",
     "5"},
    {"namespace",
     "{% set ns = namespace(n=0, s='') %}{% for i in range(3) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ ns['n'] }}",
     "{}",
     "3 012 3"},
    {"macro_args",
     "{% macro f(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ f(1) }}|{{ f(1, 3) }}|{{ f(1, c='y') }}|{{ f() }}|{{ f(b=9, a=8) }}",
     "{}",
     "12x|13x|12y|2x|89x"},
    {"macro_recursion",
     "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}",
     "{}",
     "120"},
    {"macro_varargs",
     "{% macro f(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, 3, k=4) }}",
     "{}",
     "1(2, 3){'k': 4}"},
    {"macro_scope",
     "{% macro f() %}{{ y }}{% endmacro %}{% for y in [1] %}[{{ f() }}]{% endfor %}{% set y = 3 %}{{ f() }}",
     "{}",
     "[]3"},
    {"macro_default_uses_param",
     "{% macro f(a, b=a * 2) %}{{ b }}{% endmacro %}{{ f(4) }}",
     "{}",
     "8"},
    {"macro_result_string",
     "{% macro f() %} x {% endmacro %}[{{ f()|trim }}]{{ f() == ' x ' }}{{ f()|length }}",
     "{}",
     "[x]True3"},
    {"call_block",
     "{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}inner{% endcall %}",
     "{}",
     "[inner]"},
    {"call_block_args",
     "{% macro m() %}{{ caller(1, 2) }}{% endmacro %}{% call(a, b) m() %}{{ a + b }}{% endcall %}",
     "{}",
     "3"},
    {"filter_block",
     "{% filter upper %}abc{{ 'd' }}{% endfilter %}",
     "{}",
     "ABCD"},
    {"set_block",
     "{% set x %}a{{ 1 }}b{% endset %}{{ x }}|{% set y | upper %}q{% endset %}{{ y }}",
     "{}",
     "a1b|Q"},
    {"with",
     "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}|",
     "{}",
     "3|"},
    {"recursive_loop",
     "{% for x in [1, [2, [3]], 4] recursive %}{% if x is iterable %}({{ loop(x) }}){% else %}{{ x }}@{{ loop.depth }}{% endif %}{% endfor %}",
     "{}",
     "1@1(2@2(3@3))4@1"},
    {"loop_cycle",
     "{% for i in range(4) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}|{% for i in [1,1,2] %}{{ loop.changed(i) }}{% endfor %}",
     "{}",
     "abca|TrueFalseTrue"},
    {"set_tuple",
     "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 3, 4 %}{{ t }}",
     "{}",
     "12(3, 4)"},
    {"loop_in_loop",
     "{% for a in [1,2] %}{% for b in [3,4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }};{% endfor %}",
     "{}",
     "113 214 1;123 224 2;"},
    {"f_default",
     "{{ x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') }} {{ x|d }}|{{ false|default('z', boolean=true) }}",
     "{}",
     "d  d None |z"},
    {"f_len_first_last",
     "{{ [1,2,3]|length }} {{ 'abc'|count }} {{ {'a':1}|length }} {{ x|length }} {{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ 'abc'|first }} {{ []|first }}|{{ 'ab'|list }} {{ {'k': 1}|list }}",
     "{}",
     "3 3 1 0 1 3 a |['a', 'b'] ['k']"},
    {"f_join",
     "{{ [1, 'a', none]|join(', ') }}|{{ ['a','b']|join }}|{{ users|join(',', attribute='name') }}",
     "{\"users\": [{\"name\": \"x\"}, {\"name\": \"y\"}]}",
     "1, a, None|ab|x,y"},
    {"f_reverse_sort",
     "{{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ ['b','A','c']|sort }} {{ ['b','A','c']|sort(case_sensitive=true) }} {{ 'abc'|reverse }} {{ [1,2]|reverse|list }} {{ users|sort(attribute='age')|map(attribute='name')|join }}",
     "{\"users\": [{\"name\": \"x\", \"age\": 3}, {\"name\": \"y\", \"age\": 1}, {\"name\": \"z\", \"age\": 3}]}",
     "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] ['A', 'b', 'c'] cba [2, 1] yxz"},
    {"f_unique_min_max_sum",
     "{{ [1,2,1,'a','A']|unique|list }} {{ [3,1,2]|min }} {{ [3,1,2]|max }} {{ ['b','A']|max }} {{ [1,2,3]|sum }} {{ users|sum(attribute='age') }} {{ []|max }}|",
     "{\"users\": [{\"age\": 3}, {\"age\": 4}]}",
     "[1, 2, 'a'] 1 3 b 6 7 |"},
    {"f_dictsort",
     "{{ {'b':1,'A':2,'c':0}|dictsort }} {{ {'b':1,'A':2}|dictsort(true) }} {{ {'b':1,'a':2}|dictsort(by='value') }} {{ {'b':1,'a':2}|dictsort(reverse=true) }}",
     "{}",
     "[('A', 2), ('b', 1), ('c', 0)] [('A', 2), ('b', 1)] [('b', 1), ('a', 2)] [('b', 1), ('a', 2)]"},
    {"f_map_select",
     "{{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3]|reject('equalto', 2)|list }} {{ users|selectattr('active')|map(attribute='name')|join(',') }} {{ ['a','b']|map('upper')|list }} {{ users|rejectattr('active')|list|length }} {{ users|selectattr('name', 'equalto', 'y')|first }} {{ [0, 1, '']|select|list }} {{ users|map(attribute='zz', default='D')|list }}",
     "{\"users\": [{\"name\": \"x\", \"active\": true}, {\"name\": \"y\", \"active\": false}]}",
     "[1, 3] [1, 3] x ['A', 'B'] 1 {'name': 'y', 'active': False} [1] ['D', 'D']"},
    {"f_tojson",
     "{{ {'a': [1, 2.5, none, true, 'é\"\\n\\u0001<>&\\'']}|tojson }}|{{ 'x'|tojson }}|{{ {'b':1,'a':2}|tojson(sort_keys=true) }}|{{ [1,{'a':2}]|tojson(separators=(',', ':')) }}|{{ x|tojson }}|{{ 'é😀'|tojson(ensure_ascii=true) }}",
     "{\"x\": {\"f\": 30.0, \"n\": null, \"l\": []}}",
     "{\"a\": [1, 2.5, null, true, \"é\\\"\\n\\u0001<>&'\"]}|\"x\"|{\"a\": 2, \"b\": 1}|[1,{\"a\":2}]|{\"f\": 30.0, \"n\": null, \"l\": []}|\"\\u00e9\\ud83d\\ude00\""},
    {"f_tojson_indent",
     "{{ {'a': {'b': [], 'c': [1, {'d': {}}]}, 'e': 'x'}|tojson(indent=2) }}|{{ [1]|tojson(indent=0) }}|{{ {'a':1}|tojson(indent='\\t') }}",
     "{}",
     "{\n  \"a\": {\n    \"b\": [],\n    \"c\": [\n      1,\n      {\n        \"d\": {}\n      }\n    ]\n  },\n  \"e\": \"x\"\n}|[\n1\n]|{\n\t\"a\": 1\n}"},
    {"f_strings",
     "{{ '  a b  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'hello WORLD'|title }}|{{ 'hello-world (x) [y]'|title }}|{{ 'aBC'|capitalize }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'ab'|center(6) }}|{{ 'a\\nb\\n'|indent(2) }}|{{ 'a\\n\\nb'|indent(2, true, true) }}|{{ 'one two three'|wordcount }}|{{ '<p>a  <b>b</b></p>'|striptags }}",
     "{}",
     "a b|a|Hello World|Hello-World (X) [Y]|Abc|bba|  ab  |a\n  b\n|  a\n  \n  b|3|a b"},
    {"f_truncate",
     "{{ 'hello world foo bar'|truncate(9) }}|{{ 'hello world foo bar'|truncate(9, true) }}|{{ 'hello'|truncate(3, leeway=0, end='') }}",
     "{}",
     "hello...|hello ...|hel"},
    {"f_numbers",
     "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '0x1A'|int(0, 16) }} {{ '1_000'|int }} {{ '3.5'|float }} {{ 'a'|float }} {{ 2|float }} {{ -3|abs }} {{ -2.5|abs }}",
     "{}",
     "42 4 0 7 3 26 1000 3.5 0.0 2.0 3 2.5"},
    {"f_round",
     "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 1.55|round(1, 'floor') }} {{ 1.51|round(1, 'ceil') }} {{ 42|round }} {{ 1234|round(-2) }} {{ 1250.0|round(-2) }}",
     "{}",
     "2.0 4.0 2.67 1.5 1.6 42 1200 1200.0"},
    {"f_escape_safe",
     "{{ '<a href=\"x\">&\\'</a>'|e }}|{{ '<b>'|safe|e }}|{{ '<b>'|forceescape }}|{{ ('<b>'|safe) + '<i>' }}|{{ 5|safe }}|{{ '<b>'|safe is escaped }}",
     "{}",
     "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt;|<b>|&lt;b&gt;|<b>&lt;i&gt;|5|True"},
    {"f_string_misc",
     "{{ 5|string }} {{ none|string }} {{ [1]|string }} {{ 'x'|upper }} {{ 'É'|lower }} {{ {'a':1}|items|list }} {{ x|items|list }}|{{ '%s=%d'|format('a', 3) }} {{ '%(k)s'|format(k=1) }}",
     "{}",
     "5 None [1] X é [('a', 1)] []|a=3 1"},
    {"f_batch_slice",
     "{{ [1,2,3,4,5]|batch(2)|list }} {{ [1,2,3]|batch(2, 'x')|list }} {{ [1,2,3,4,5]|slice(2)|list }} {{ [1,2,3,4]|slice(3, 0)|list }}",
     "{}",
     "[[1, 2], [3, 4], [5]] [[1, 2], [3, 'x']] [[1, 2, 3], [4, 5]] [[1, 2], [3, 0], [4, 0]]"},
    {"f_attr",
     "{{ d|attr('a') }} {{ s|attr('upper') is callable }}",
     "{\"d\": {\"a\": 1}, \"s\": \"x\"}",
     " True"},
    {"tests",
     "{{ x is defined }} {{ none is none }} {{ 1 is number }} {{ true is number }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is sequence }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is lower }} {{ 1 is in [1] }} {{ 2 is eq 2 }} {{ 1 is gt 0 }} {{ true is boolean }} {{ 1 is boolean }} {{ false is false }} {{ 0 is false }} {{ x is undefined }} {{ 1.0 is float }} {{ 1 is integer }} {{ true is integer }} {{ range is callable }} {{ 1 is not none }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ x is sequence }} {{ {} is sequence }} {{ 'a' is sameas 'a' }} {{ none is sameas none }} {{ 2 is lessthan 3 }} {{ 2 is ne 3 }} {{ 'AB' is upper }}",
     "{}",
     "False True True True True True True True False True True True True True True True True False True False True True True False True True True True True True True True True True True"},
    {"undefined",
     "{{ x }}|{{ x is defined }}|{% for i in x %}no{% endfor %}|{{ x|length }}|{{ x|list }}|{{ x == x }}|{{ 'a' in x }}|{{ x|default(1) }}|{{ x|trim }}|{{ x ~ 'a' }}|{{ x|string }}|{{ x|join }}|{{ x|items|list }}|{{ [x] }}|{{ x is iterable }}|{{ x != 1 }}",
     "{}",
     "|False||0|[]|True|False|1||a|||[]|[Undefined]|True|True"},
    {"tools_none",
     "{% if tools %}yes{% else %}no{% endif %}|{{ tools is none }}|{{ tools is defined }}",
     "{\"tools\": null}",
     "no|True|True"},
    {"str_methods",
     "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(none, 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ ' a b  c '.rsplit(none, 1) }}|{{ 'Hello'.startswith('He') }}|{{ 'Hello'.endswith(('x', 'lo')) }}|{{ 'hello world'.title() }}|{{ 'abc'.upper() }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'ab'.replace('', '-') }}|{{ 'abcabc'.find('c') }}|{{ 'abcabc'.rfind('c') }}|{{ 'héc'.find('c') }}|{{ 'abc'.count('') }}|{{ 'aaa'.count('a') }}|{{ '-'.join(['a','b']) }}|{{ 'a\\nb\\r\\nc\\x0b'.splitlines() }}|{{ 'ab'.center(7, '*') }}|{{ '42'.zfill(5) }}|{{ '-42'.zfill(5) }}|{{ 'a=b=c'.partition('=') }}|{{ 'a=b=c'.rpartition('=') }}|{{ 'ß'.upper() }}|{{ 'ΣΑΣ ΣΑΣ'.lower() }}|{{ 'ǅ'.lower() }}|{{ 'aBc'.swapcase() }}|{{ 'abc'.capitalize() }}|{{ 'a1'.isalnum() }}|{{ '12'.isdigit() }}|{{ ' '.isspace() }}|{{ 'Ab'.istitle() }}|{{ 'ab'.islower() }}|{{ 'prefix_x'.removeprefix('prefix_') }}|{{ 'a\\tb'.expandtabs(4) }}|{{ 'abc'.index('c') }}",
     "{}",
     "a b|a|axx|xxa|['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|['a,b', 'c']|[' a b', 'c']|True|True|Hello World|ABC|bXb|-a-b-|2|5|2|4|3|a-b|['a', 'b', 'c']|***ab**|00042|-0042|('a', '=', 'b=c')|('a=b', '=', 'c')|SS|σας σας|ǆ|AbC|Abc|True|True|True|True|True|x|a   b|2"},
    {"str_format",
     "{{ '{}-{}'.format(1, 'x') }}|{{ '{:>5}|{:<5}|{:^5}|{:05.2f}'.format('a', 'b', 'c', 3.14159) }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{name}!'.format(name='n') }}|{{ '{:,}'.format(1234567) }}|{{ '{:x} {:#o} {:b}'.format(255, 8, 5) }}|{{ '{!r}'.format('q') }}|{{ '{{}}'.format() }}|{{ '{:.1%}'.format(0.25) }}|{{ '{:+d}'.format(5) }}|{{ '{}'.format(none) }}|{{ '{:.3}'.format('abcdef') }}",
     "{}",
     "1-x|    a|b    |  c  |03.14|aba|n!|1,234,567|ff 0o10 101|'q'|{}|25.0%|+5|None|abc"},
    {"str_percent",
     "{{ '%s-%d-%05.1f-%x-%r' % ('a', 3, 2.25, 255, 'q') }}|{{ '%(a)s' % {'a': 1} }}|{{ '%s' % [1] }}|{{ '%%' % () }}|{{ '%5s|%-5s|' % ('a', 'b') }}|{{ '%.2s' % 'abc' }}|{{ '%c%c' % (97, 'b') }}|{{ '%i %u %X %e %g' % (1, 2, 255, 1.5, 0.0001) }}",
     "{}",
     "a-3-002.2-ff-'q'|1|[1]|%|    a|b    ||ab|ab|1 2 FF 1.500000e+00 0.0001"},
    {"dict_methods",
     "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.copy() }} {{ [1,2,1].count(1) }} {{ [1,2].index(2) }}",
     "{\"d\": {\"b\": 1, \"a\": [2]}}",
     "['b', 'a'] [1, [2]] [('b', 1), ('a', [2])] {'b': 1, 'a': [2]} 2 1"},
    {"globals",
     "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(3) }} {{ range(0, 10, 2) }} {{ dict(a=1) }} {{ namespace(a=1).a }} {{ range(3)|length }} {{ range(10)[2] }} {{ 3 in range(5) }} {{ range(2) == range(2) }} {{ dict({'x': 1}, y=2) }}",
     "{}",
     "[0, 1, 2] [1, 4, 7] [5, 3, 1] range(0, 3) range(0, 10, 2) {'a': 1} 1 3 2 True True {'x': 1, 'y': 2}"},
    {"strftime",
     "{{ strftime_now('%Y-%m-%d %H:%M:%S %a %b %d %j') }}|{{ strftime_now('%d %b %Y') }}",
     "{}",
     "2026-11-29 00:00:00 Sun Nov 29 333|29 Nov 2026"},
    {"json_input_order",
     "{% for k, v in d|items %}{{ k }}{% endfor %}|{{ d|tojson }}|{{ d }}",
     "{\"d\": {\"z\": 1, \"a\": 2.0, \"m\": [true, null, \"x\"]}}",
     "zam|{\"z\": 1, \"a\": 2.0, \"m\": [true, null, \"x\"]}|{'z': 1, 'a': 2.0, 'm': [True, None, 'x']}"},
    {"bool_int_print",
     "{{ true }} {{ false }} {{ none }} {{ 1 }} {{ -5 }} {{ 9007199254740993 }} {{ 1.0 }}",
     "{}",
     "True False None 1 -5 9007199254740993 1.0"},
    {"int_float_json",
     "{{ x }} {{ y }} {{ x|tojson }} {{ y|tojson }} {{ z }} {{ z|tojson }}",
     "{\"x\": 30.0, \"y\": 30, \"z\": 1e-07}",
     "30.0 30 30.0 30 1e-07 1e-07"},
    {"tool_pattern",
     "{% for tool_call in calls %}{% if tool_call.function %}{% set tool_call = tool_call.function %}{% endif %}{{ tool_call.name }}:{{ tool_call.arguments|tojson }};{% endfor %}",
     "{\"calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1}}}, {\"name\": \"g\", \"arguments\": \"s\"}]}",
     "f:{\"a\": 1};g:\"s\";"},
    {"slice_empty",
     "{{ s[-2:3] }}|{{ s[5:1] }}|{{ [1,2,3][2:1] }}|{{ 'héllo'[4:1] }}|{{ s[::-3] }}",
     "{\"s\": \"abcdef\"}",
     "||[]||fc"},
    {"generators",
     "{{ x|select('odd') is iterable }} {{ x|select('odd') is sequence }} {% if e|select %}T{% endif %} {{ (n|map('upper') and 'lazy') }} {% set g = x|map('string') %}{{ g|list }}{{ g|list }} {{ x|select('odd')|first }} {{ n|unique|items is defined }} {{ x|map('string')|join('-') }}",
     "{\"x\": [1, 2, 3], \"e\": [], \"n\": 5}",
     "True False T lazy ['1', '2', '3'][] 1 True 1-2-3"},
    {"views",
     "{{ d.items() }} {{ d.keys() }} {{ d.values()|list }} {{ d.items()|length }} {{ d.keys() is sequence }} {{ d.items()[0] }}| {{ 'a' in d.keys() }} {% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %} {{ d.keys() == d.keys() }} {{ d.items()|list }}",
     "{\"d\": {\"a\": 1, \"b\": 2}}",
     "dict_items([('a', 1), ('b', 2)]) dict_keys(['a', 'b']) [1, 2] 2 False | True a1b2 True [('a', 1), ('b', 2)]"},
    {"reverse_iter",
     "{{ [1,2]|reverse is sequence }} {{ ([1,2]|reverse)|list }} {{ 'ab'|reverse }} {{ (x|map('string')|reverse)|list }} {{ d|reverse|list }}",
     "{\"x\": [1, 2], \"d\": {\"a\": 1, \"b\": 2}}",
     "False [2, 1] ba ['2', '1'] ['b', 'a']"},
    {"percent_misc",
     "{{ 'abc' % [] }}|{{ 'abc' % x }}|{{ '%s' % x }}|{{ '%s' % [1] }}",
     "{}",
     "abc|abc||[1]"},
    {"undefined_callable",
     "{{ x is callable }} {{ none[0] is callable }} {{ 'a' is callable }}",
     "{}",
     "True True False"},

};

static void test_render_cases(void **state) {
    (void)state;
    int failed = 0;
    for (size_t i = 0; i < TERN_ARRAY_LEN(render_cases); i++) {
        const struct render_case *rc = &render_cases[i];
        struct tern_buf out = TERN_BUF_INIT;
        enum tern_status st = render(rc->src, rc->vars, NULL, &out);
        const char *got = st ? tern_last_error() : (out.data ? out.data : "");
        if (st || strcmp(got, rc->expected) != 0) {
            fprintf(stderr, "case %s:\n  expected: %s\n  got:      %s\n", rc->name, rc->expected, got);
            failed++;
        }
        tern_buf_free(&out);
    }
    assert_int_equal(failed, 0);
}

/* ---- runtime errors ----------------------------------------------------------------- */

struct error_case {
    const char *src, *vars, *message; /* message: a substring of the error */
};

/* Each fails in jinja2 too (TypeError, UndefinedError, ZeroDivisionError ...). */
static const struct error_case error_cases[] = {
    {"{{ 'a' + none }}", "{}", "can only concatenate str (not \"NoneType\") to str"},
    {"{{ x + 'a' }}", "{\"x\": null}", "unsupported operand type(s) for +: 'NoneType' and 'str'"},
    {"{{ 'a' + x }}", "{\"x\": {}}", "can only concatenate str (not \"dict\") to str"},
    {"{{ x.y }}", "{}", "'x' is undefined"},
    {"{{ foo() }}", "{}", "'foo' is undefined"},
    {"{{ messages[0].role }}", "{\"messages\": []}", "list object has no element 0"},
    {"{{ messages[0]['role'] }}", "{\"messages\": []}", "list object has no element 0"},
    {"{{ d.a.b.c }}", "{\"d\": {\"a\": {}}}", "'dict object' has no attribute 'b'"},
    {"{{ x.split('a') }}", "{\"x\": null}", "'None' has no attribute 'split'"},
    {"{% for k in 'a'|items %}{% endfor %}", "{}", "Can only get item pairs from a mapping."},
    {"{{ 'a' in x }}", "{\"x\": null}", "argument of type 'NoneType' is not iterable"},
    {"{{ 1 in 'abc' }}", "{}", "'in <string>' requires string as left operand, not int"},
    {"{{ 1 / 0 }}", "{}", "division by zero"},
    {"{{ 1 % 0 }}", "{}", "integer division or modulo by zero"},
    {"{{ 'a' < 1 }}", "{}", "'<' not supported between instances of 'str' and 'int'"},
    {"{% for x in 5 %}{% endfor %}", "{}", "'int' object is not iterable"},
    {"{% for x in y %}{% endfor %}", "{\"y\": null}", "'NoneType' object is not iterable"},
    {"{{ 'x'() }}", "{}", "'str' object is not callable"},
    {"{{ 1|nofilter }}", "{}", "no filter named 'nofilter'"},
    {"{{ 1 is notatest }}", "{}", "no test named 'notatest'"},
    {"{% set ns = 1 %}{% set ns.a = 1 %}", "{}", "cannot assign attribute on non-namespace object"},
    {"{{ [1].append(2) }}", "{}", "not allowed"},
    {"{% set d = {} %}{{ d.update({'a': 1}) }}", "{}", "not allowed"},
    {"{{ x|tojson }}", "{}", "Object of type Undefined is not JSON serializable"},
    {"{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", "{}", "macro 'f' takes not more than 1 argument(s)"},
    {"{% macro f(a) %}{% endmacro %}{{ f(b=2) }}", "{}", "macro 'f' takes no keyword argument 'b'"},
    {"{% macro f(a) %}{{ a.b }}{% endmacro %}{{ f() }}", "{}", "parameter 'a' was not provided"},
    {"{{ range(1000000)|length }}", "{}", "Range too big"},
    {"{{ range(1, 5, 0) }}", "{}", "range() arg 3 must not be zero"},
    {"{% for a, b in [[1, 2, 3]] %}{% endfor %}", "{}", "too many values to unpack (expected 2)"},
    {"{% set a, b, c = [1, 2] %}", "{}", "not enough values to unpack (expected 3, got 2)"},
    {"{{ 'a'.split('') }}", "{}", "empty separator"},
    {"{{ ','.join([1]) }}", "{}", "sequence item 0: expected str instance, int found"},
    {"{{ -'a' }}", "{}", "bad operand type for unary -: 'str'"},
    {"{{ x + 1 }}", "{}", "'x' is undefined"},
    {"{{ x < 1 }}", "{}", "'x' is undefined"},
    {"{{ '%s %s' % ('a',) }}", "{}", "not enough arguments for format string"},
    {"{{ '%s' % ('a', 'b') }}", "{}", "not all arguments converted during string formatting"},
    {"{{ 'abc'.index('z') }}", "{}", "substring not found"},
    {"{% for x in [1] %}{{ loop.previtem.a }}{% endfor %}", "{}", "there is no previous item"},
    {"{{ [1]|dictsort }}", "{}", "'list' object has no attribute 'items'"},
    {"{{ {[1]: 2} }}", "{}", "unhashable type: 'list'"},
    {"{{ n[1:] }}", "{\"n\": 5}", "'int' object is not subscriptable"},
    {"{{ d[1:] }}", "{\"d\": {}}", "unhashable type: 'slice'"},
    {"{{ x|select('odd')|length }}", "{\"x\": [1]}", "object of type 'generator' has no len()"},
    {"{% for i in n|map('upper') %}{% endfor %}", "{\"n\": 5}", "'int' object is not iterable"},
    {"{{ 1 is true 2 }}", "{}", "test 'true' takes no arguments"},
    {"{{ 5|indent }}", "{}", "unsupported operand type(s) for +=: 'int' and 'str'"},
    {"{{ 5|truncate }}", "{}", "object of type 'int' has no len()"},
    {"{{ x|select|last }}", "{\"x\": [1]}", "not reversible"},
    /* Python integers are unbounded; here they are 64-bit and overflow is an error */
    {"{{ 9223372036854775807 + 1 }}", "{}", "integer overflow"},
};

static void test_runtime_errors(void **state) {
    (void)state;
    for (size_t i = 0; i < TERN_ARRAY_LEN(error_cases); i++) {
        const struct error_case *ec = &error_cases[i];
        struct tern_buf out = TERN_BUF_INIT;
        enum tern_status st = render(ec->src, ec->vars, NULL, &out);
        if (st != TERN_ERR_TEMPLATE || !strstr(tern_last_error(), ec->message)) {
            fprintf(stderr, "template %s: status %d, message '%s', want '%s'\n", ec->src, st, tern_last_error(),
                    ec->message);
            fail();
        }
        /* runtime errors say where */
        assert_true(strncmp(tern_last_error(), "line 1:", 7) == 0);
        assert_int_equal(out.len, 0);
        tern_buf_free(&out);
    }
}

/* The error names the place: line and column of the failing expression. */
static void test_runtime_error_location(void **state) {
    (void)state;
    struct tern_buf out = TERN_BUF_INIT;
    assert_int_equal(render("ok\n{% for m in messages %}\n  {{ m.content + 1 }}\n{% endfor %}",
                            "{\"messages\": [{\"content\": \"x\"}]}", NULL, &out),
                     TERN_ERR_TEMPLATE);
    assert_string_equal(tern_last_error(), "line 3:16: can only concatenate str (not \"int\") to str");
    tern_buf_free(&out);
}

/* raise_exception(msg) fails with exactly msg (no location), and nothing is output;
 * text already in the output buffer is kept. */
static void test_raise_exception(void **state) {
    (void)state;
    struct tern_buf out = TERN_BUF_INIT;
    assert_int_equal(tern_buf_puts(&out, "prefix"), TERN_OK);
    assert_int_equal(render("a lot of output\n{{ raise_exception('Conversation roles must alternate ' ~ n) }}",
                            "{\"n\": 2}", NULL, &out),
                     TERN_ERR_TEMPLATE);
    assert_string_equal(tern_last_error(), "Conversation roles must alternate 2");
    assert_int_equal(out.len, 6);
    assert_string_equal(out.data, "prefix");
    /* inside a macro inside a loop */
    assert_int_equal(render("{% macro f(x) %}{% if x > 1 %}{{ raise_exception('too big: ' ~ x) }}{% endif %}{% endmacro %}"
                            "{% for i in range(5) %}{{ f(i) }}{% endfor %}",
                            "{}", NULL, &out),
                     TERN_ERR_TEMPLATE);
    assert_string_equal(tern_last_error(), "too big: 2");
    assert_string_equal(out.data, "prefix");
    tern_buf_free(&out);
}

/* ---- syntax errors ------------------------------------------------------------------ */

struct syntax_case {
    const char *src, *message; /* the exact message */
};

static const struct syntax_case syntax_cases[] = {
    {"{% if x %}", "line 1:11: expected 'elif', 'else' or 'endif', got end of template"},
    {"{{ 1 + }}", "line 1:8: expected an expression, got '}}'"},
    {"{% for x y %}{% endfor %}", "line 1:10: expected 'in', got 'y'"},
    {"{% endif %}", "line 1:4: unexpected 'endif' (no block is open)"},
    {"{% foo %}", "line 1:4: unknown tag 'foo'"},
    {"{{ 'abc }}", "line 1:4: unterminated string literal"},
    {"{{ x", "line 1:1: tag is never closed: expected '}}', got end of template"},
    {"{# x", "line 1:1: comment is never closed: expected '#}'"},
    {"line1\n  {{ (1 }}", "line 2:9: expected ')', got '}'"},
    {"{% break %}", "line 1:4: 'break' outside of a loop"},
    {"{% for x in y %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}", "line 1:35: 'break' outside of a loop"},
    {"{% macro f(a=1, b) %}{% endmacro %}", "line 1:17: non-default argument 'b' follows default argument"},
    {"{% for x in y %}{% else %}{% endif %}", "line 1:30: unexpected 'endif'"},
    {"{% set %}", "line 1:8: expected a variable name, got '%}'"},
    {"{{ x. }}", "line 1:7: expected an attribute name or number after '.', got '}}'"},
    {"{{ f(a=1, 2) }}", "line 1:11: positional argument follows keyword argument"},
    {"{% include 'x' %}", "line 1:4: tag 'include' is not supported"},
    {"{{ x | }}", "line 1:8: expected a name, got '}}'"},
    {"{% raw %}abc", "line 1:1: missing end of raw directive: expected '{% endraw %}'"},
    {"{% for x in y %}{% endfor x %}", "line 1:27: expected '%}', got 'x'"},
    {"{{ {'a' 1} }}", "line 1:9: expected ':', got an integer"},
    {"{% set true = 1 %}", "line 1:8: cannot assign to constant 'true'"},
    {"{{ 1 ! 2 }}", "line 1:6: unexpected character '!'"},
    {"{{ 'é' ~ ) }}", "line 1:10: unexpected ')'"},
    {"{{ 'a\\N{DASH}' }}", "line 1:6: \\N{...} escapes are not supported in string literals"},
    {"{{ '\\x4' }}", "line 1:5: truncated \\xXX escape in string literal"},
    {"{{ 99999999999999999999 }}", "line 1:4: integer literal too large"},
    {"ab\xff", "line 1:3: template is not valid UTF-8 (byte offset 2)"},
};

static void test_syntax_errors(void **state) {
    (void)state;
    for (size_t i = 0; i < TERN_ARRAY_LEN(syntax_cases); i++) {
        struct tern_template *t = (struct tern_template *)1;
        enum tern_status st = tern_template_compile(syntax_cases[i].src, strlen(syntax_cases[i].src), &t);
        if (st != TERN_ERR_TEMPLATE || strcmp(tern_last_error(), syntax_cases[i].message) != 0) {
            fprintf(stderr, "template %s: status %d, message '%s', want '%s'\n", syntax_cases[i].src, st,
                    tern_last_error(), syntax_cases[i].message);
            fail();
        }
        assert_null(t);
    }
}

/* Nesting beyond the parser's limits is a syntax error, not a stack overflow. */
static void test_syntax_nesting_limits(void **state) {
    (void)state;
    struct tern_buf src = TERN_BUF_INIT;
    struct tern_template *t;
    /* ((((...)))) */
    tern_buf_puts(&src, "{{ ");
    for (int i = 0; i < 2000; i++) tern_buf_putc(&src, '(');
    tern_buf_putc(&src, '1');
    for (int i = 0; i < 2000; i++) tern_buf_putc(&src, ')');
    tern_buf_puts(&src, " }}");
    assert_int_equal(tern_template_compile(src.data, src.len, &t), TERN_ERR_TEMPLATE);
    assert_non_null(strstr(tern_last_error(), "too deeply"));
    /* {% if %}{% if %}... */
    tern_buf_clear(&src);
    for (int i = 0; i < 5000; i++) tern_buf_puts(&src, "{% if x %}");
    assert_int_equal(tern_template_compile(src.data, src.len, &t), TERN_ERR_TEMPLATE);
    assert_non_null(strstr(tern_last_error(), "too deeply"));
    /* a + a + a ... with 100000 terms: a deep tree built without recursion */
    tern_buf_clear(&src);
    tern_buf_puts(&src, "{{ 1");
    for (int i = 0; i < 100000; i++) tern_buf_puts(&src, " + 1");
    tern_buf_puts(&src, " }}");
    assert_int_equal(tern_template_compile(src.data, src.len, &t), TERN_ERR_TEMPLATE);
    assert_non_null(strstr(tern_last_error(), "too deeply"));
    /* - - - - x and not not not x */
    tern_buf_clear(&src);
    tern_buf_puts(&src, "{{ ");
    for (int i = 0; i < 10000; i++) tern_buf_puts(&src, "not ");
    tern_buf_puts(&src, "x }}");
    assert_int_equal(tern_template_compile(src.data, src.len, &t), TERN_ERR_TEMPLATE);
    /* but 200 terms are fine, and render */
    tern_buf_clear(&src);
    tern_buf_puts(&src, "{{ 0");
    for (int i = 0; i < 200; i++) tern_buf_puts(&src, " + 1");
    tern_buf_puts(&src, " }}");
    struct tern_buf out = TERN_BUF_INIT;
    assert_int_equal(render(src.data, "{}", NULL, &out), TERN_OK);
    assert_string_equal(out.data, "200");
    tern_buf_free(&out);
    tern_buf_free(&src);
}

/* ---- limits ------------------------------------------------------------------------- */

static void test_limit_output(void **state) {
    (void)state;
    struct tern_buf out = TERN_BUF_INIT;
    struct tern_template_opts o = {0};
    o.max_output = 1000;
    /* output */
    assert_int_equal(render("{% for i in range(200) %}0123456789{% endfor %}", "{}", &o, &out), TERN_ERR_LIMIT);
    assert_non_null(strstr(tern_last_error(), "max_output (1000 bytes)"));
    assert_int_equal(out.len, 0);
    /* a string built in memory, never output */
    assert_int_equal(render("{% set s = 'x' * 5000 %}", "{}", &o, &out), TERN_ERR_LIMIT);
    assert_non_null(strstr(tern_last_error(), "max_output"));
    /* doubling a string */
    assert_int_equal(render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                            "{}", &o, &out),
                     TERN_ERR_LIMIT);
    /* macro output (captured) */
    assert_int_equal(render("{% macro m() %}{% for i in range(200) %}0123456789{% endfor %}{% endmacro %}{% set x = m() %}",
                            "{}", &o, &out),
                     TERN_ERR_LIMIT);
    /* exactly at the limit is fine */
    assert_int_equal(render("{% for i in range(100) %}0123456789{% endfor %}", "{}", &o, &out), TERN_OK);
    assert_int_equal(out.len, 1000);
    tern_buf_free(&out);
}

static void test_limit_steps(void **state) {
    (void)state;
    struct tern_buf out = TERN_BUF_INIT;
    struct tern_template_opts o = {0};
    o.max_steps = 100000;
    /* 100000^3 iterations would run for hours */
    assert_int_equal(render("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                            "{% endfor %}{% endfor %}{% endfor %}",
                            "{}", &o, &out),
                     TERN_ERR_LIMIT);
    assert_non_null(strstr(tern_last_error(), "max_steps (100000)"));
    /* cheap-looking operations on a huge string cost in proportion to its size */
    assert_int_equal(render("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s[-1] }}{{ 'y' in s }}{% endfor %}",
                            "{}", &o, &out),
                     TERN_ERR_LIMIT);
    assert_int_equal(render("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% set t = s.upper() %}{% endfor %}",
                            "{}", &o, &out),
                     TERN_ERR_LIMIT);
    /* exponential macro recursion */
    assert_int_equal(render("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}", "{}",
                            &o, &out),
                     TERN_ERR_LIMIT);
    assert_int_equal(out.len, 0);
    tern_buf_free(&out);
}

static void test_limit_depth(void **state) {
    (void)state;
    struct tern_buf out = TERN_BUF_INIT;
    struct tern_template_opts o = {0};
    o.max_depth = 50;
    /* infinite recursion */
    assert_int_equal(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "{}", &o, &out), TERN_ERR_LIMIT);
    assert_non_null(strstr(tern_last_error(), "max_depth (50)"));
    /* mutual recursion with the default limit */
    assert_int_equal(render("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}", "{}",
                            NULL, &out),
                     TERN_ERR_LIMIT);
    /* data nested deeper than max_depth: printing, tojson and == */
    const char *nest = "{% set ns = namespace(x=1) %}{% for i in range(100) %}{% set ns.x = [ns.x] %}{% endfor %}";
    char src[512];
    snprintf(src, sizeof src, "%s{{ ns.x }}", nest);
    assert_int_equal(render(src, "{}", &o, &out), TERN_ERR_LIMIT);
    snprintf(src, sizeof src, "%s{{ ns.x|tojson }}", nest);
    assert_int_equal(render(src, "{}", &o, &out), TERN_ERR_LIMIT);
    snprintf(src, sizeof src, "%s{{ ns.x == ns.x[0] }}", nest);
    assert_int_equal(render(src, "{}", &o, &out), TERN_ERR_LIMIT);
    /* deeply nested input JSON */
    char vars[4096];
    size_t k = (size_t)snprintf(vars, sizeof vars, "{\"x\": ");
    for (int i = 0; i < 1000; i++) vars[k++] = '[';
    for (int i = 0; i < 1000; i++) vars[k++] = ']';
    vars[k++] = '}';
    vars[k] = 0;
    assert_int_equal(render("{{ x|tojson }}", vars, &o, &out), TERN_ERR_LIMIT);
    assert_int_equal(out.len, 0);
    /* a huge max_depth does not let data recursion overflow the C stack */
    struct tern_template_opts deep = {0};
    deep.max_depth = 100000000;
    const char *deep_nest = "{% set ns = namespace(x=1) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}";
    snprintf(src, sizeof src, "%s{{ ns.x }}", deep_nest);
    assert_int_equal(render(src, "{}", &deep, &out), TERN_ERR_LIMIT);
    assert_non_null(strstr(tern_last_error(), "stack"));
    snprintf(src, sizeof src, "%s{{ ns.x == ns.x[0] }}", deep_nest);
    assert_int_equal(render(src, "{}", &deep, &out), TERN_ERR_LIMIT);
    snprintf(src, sizeof src, "{%% macro f() %%}{{ f() }}{%% endmacro %%}{{ f() }}");
    assert_int_equal(render(src, "{}", &deep, &out), TERN_ERR_LIMIT);
    assert_non_null(strstr(tern_last_error(), "stack"));
    /* within the limit */
    assert_int_equal(render("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(20) }}", "{}", &o,
                            &out),
                     TERN_OK);
    assert_string_equal(out.data, "01234567891011121314151617181920");
    tern_buf_free(&out);
}

static void test_limit_memory(void **state) {
    (void)state;
    struct tern_buf out = TERN_BUF_INIT;
    struct tern_template_opts o = {0};
    o.max_memory = 1 << 20;
    /* many distinct strings: each iteration keeps a new 1 KB string alive */
    assert_int_equal(render("{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = ns.l + ['x' * 1000 ~ i] %}"
                            "{% endfor %}{{ ns.l|length }}",
                            "{}", &o, &out),
                     TERN_ERR_LIMIT);
    assert_non_null(strstr(tern_last_error(), "memory limit"));
    assert_int_equal(out.len, 0);
    tern_buf_free(&out);
}

/* ---- API ---------------------------------------------------------------------------- */

/* Compile once, render many times with different variables. */
static void test_compile_once_render_many(void **state) {
    (void)state;
    const char *src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ bos_token }}";
    struct tern_template *t;
    assert_int_equal(tern_template_compile(src, strlen(src), &t), TERN_OK);
    struct tern_buf out = TERN_BUF_INIT;
    for (int i = 0; i < 50; i++) {
        json_t *vars = json_pack("{s:[{s:s,s:i}],s:s}", "messages", "role", "user", "content", i, "bos_token", "<s>");
        tern_buf_clear(&out);
        assert_int_equal(tern_template_render(t, vars, NULL, &out), TERN_OK);
        char want[64];
        snprintf(want, sizeof want, "<user>%d<s>", i);
        assert_string_equal(out.data, want);
        json_decref(vars);
    }
    /* no variables at all */
    tern_buf_clear(&out);
    assert_int_equal(tern_template_render(t, NULL, NULL, &out), TERN_OK);
    assert_string_equal(out.data, "");
    /* variables must be an object */
    json_t *arr = json_array();
    assert_int_equal(tern_template_render(t, arr, NULL, &out), TERN_ERR_INVALID);
    json_decref(arr);
    tern_buf_free(&out);
    tern_template_free(t);
    tern_template_free(NULL);
}

struct thread_arg {
    const struct tern_template *t;
    json_t *vars;
    char *result;
    enum tern_status st;
};

static void *render_thread(void *p) {
    struct thread_arg *a = p;
    struct tern_buf out = TERN_BUF_INIT;
    for (int i = 0; i < 20 && a->st == TERN_OK; i++) {
        tern_buf_clear(&out);
        a->st = tern_template_render(a->t, a->vars, NULL, &out);
    }
    a->result = tern_buf_detach(&out, NULL);
    return NULL;
}

/* A compiled template is immutable: threads render it at the same time. */
static void test_concurrent_renders(void **state) {
    (void)state;
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.v %}{{ m.v }},"
                      "{% endfor %}{{ ns.n }}|{{ {'b': 1, 'a': 2}|dictsort|tojson }}";
    struct tern_template *t;
    assert_int_equal(tern_template_compile(src, strlen(src), &t), TERN_OK);
    struct thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i].t = t;
        args[i].vars = json_pack("{s:[{s:i},{s:i}]}", "messages", "v", i, "v", 10 * i);
        args[i].result = NULL;
        args[i].st = TERN_OK;
        assert_int_equal(pthread_create(&th[i], NULL, render_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].st, TERN_OK);
        char want[128];
        snprintf(want, sizeof want, "%d,%d,%d|[[\"a\", 2], [\"b\", 1]]", i, 10 * i, 11 * i);
        assert_string_equal(args[i].result, want);
        free(args[i].result);
        json_decref(args[i].vars);
    }
    tern_template_free(t);
}

static void test_uses_variable(void **state) {
    (void)state;
    const char *src = "{% set x = 1 %}{% if enable_thinking is defined %}{{ tools }}{% endif %}";
    struct tern_template *t;
    assert_int_equal(tern_template_compile(src, strlen(src), &t), TERN_OK);
    assert_true(tern_template_uses(t, "enable_thinking"));
    assert_true(tern_template_uses(t, "tools"));
    assert_false(tern_template_uses(t, "messages"));
    assert_false(tern_template_uses(t, "x")); /* assigned, never read */
    tern_template_free(t);
}

/* Thousands of names: symbols are hashed at compile time and large scopes are indexed,
 * including loop scopes that are emptied on every iteration. */
static void test_many_names(void **state) {
    (void)state;
    struct tern_buf src = TERN_BUF_INIT, out = TERN_BUF_INIT;
    tern_buf_puts(&src, "{% for i in range(3) %}");
    for (int i = 0; i < 5000; i++) tern_buf_printf(&src, "{%% set v%d = %d + i %%}", i, i);
    tern_buf_puts(&src, "{{ v0 + v4999 }},{% endfor %}{{ v1 is defined }}");
    for (int i = 0; i < 5000; i++) tern_buf_printf(&src, "{%% set w%d = %d %%}", i, i);
    tern_buf_puts(&src, "{{ w17 + w4321 }}");
    assert_int_equal(render(src.data, "{}", NULL, &out), TERN_OK);
    assert_string_equal(out.data, "4999,5001,5003,False4338");
    tern_buf_free(&src);
    tern_buf_free(&out);
}

/* Sources need not be NUL-terminated; a trailing newline is dropped, CRLF becomes LF. */
static void test_source_handling(void **state) {
    (void)state;
    char buf[] = {'a', '\r', '\n', 'b', '\n', 'X'};
    struct tern_template *t;
    assert_int_equal(tern_template_compile(buf, 5, &t), TERN_OK);
    struct tern_buf out = TERN_BUF_INIT;
    assert_int_equal(tern_template_render(t, NULL, NULL, &out), TERN_OK);
    assert_string_equal(out.data, "a\nb");
    tern_template_free(t);
    assert_int_equal(tern_template_compile("", 0, &t), TERN_OK);
    tern_buf_clear(&out);
    assert_int_equal(tern_template_render(t, NULL, NULL, &out), TERN_OK);
    assert_int_equal(out.len, 0);
    tern_template_free(t);
    tern_buf_free(&out);
}

/* JSON values keep their types and order; strings with NUL bytes survive. */
static void test_json_values(void **state) {
    (void)state;
    json_t *vars = json_object();
    json_object_set_new(vars, "s", json_stringn("a\0b", 3));
    json_object_set_new(vars, "f", json_real(30.0));
    json_object_set_new(vars, "i", json_integer(30));
    struct tern_template *t;
    const char *src = "{{ s|length }} {{ f }} {{ i }} {{ s|tojson }} {{ f is float }} {{ i is integer }}";
    assert_int_equal(tern_template_compile(src, strlen(src), &t), TERN_OK);
    struct tern_buf out = TERN_BUF_INIT;
    assert_int_equal(tern_template_render(t, vars, NULL, &out), TERN_OK);
    const char want[] = "3 30.0 30 \"a\\u0000b\" True True";
    assert_int_equal(out.len, sizeof want - 1);
    assert_memory_equal(out.data, want, sizeof want - 1);
    tern_buf_free(&out);
    tern_template_free(t);
    json_decref(vars);
}

/* Every allocation of compile and render may fail: the call fails cleanly (status,
 * no output, no leak), it never crashes. */
static void test_allocation_failures(void **state) {
    (void)state;
    const char *src = "{% macro m(x) %}[{{ x|upper }}]{% endmacro %}{% set ns = namespace(a=[]) %}"
                      "{% for k, v in d|dictsort %}{% set ns.a = ns.a + [k] %}{{ m(k) }}{{ v|tojson }}{% endfor %}"
                      "{{ ns.a|join(',') }}{{ 'a b c'.split() }}";
    json_t *vars = json_pack("{s:{s:[i,i],s:{s:s}}}", "d", "b", 1, 2, "a", "k", "v");
    int failures = 0, successes = 0;
    for (long n = 0; n < 400; n++) {
        struct tern_template *t = NULL;
        struct tern_buf out = TERN_BUF_INIT;
        tern_alloc_fail_after(n);
        enum tern_status st = tern_template_compile(src, strlen(src), &t);
        if (st == TERN_OK) st = tern_template_render(t, vars, NULL, &out);
        tern_alloc_fail_after(-1);
        if (st == TERN_OK) {
            successes++;
            assert_string_equal(out.data, "[A]{\"k\": \"v\"}[B][1, 2]a,b['a', 'b', 'c']");
        } else {
            failures++;
            assert_int_equal(st, TERN_ERR_NOMEM);
            assert_int_equal(out.len, 0);
        }
        tern_buf_free(&out);
        tern_template_free(t);
    }
    assert_true(failures > 5);
    assert_true(successes > 0);
    json_decref(vars);
}

/* ---- the CLI ------------------------------------------------------------------------ */

static int run_cli(const char *args, char *out, size_t size) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s template %s 2>&1", th_tern_bin(), args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = 0;
    int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_cli(void **state) {
    (void)state;
    char tpl[512], vars[512], bad[512], args[2048], out[4096];
    const char *dir = th_tmpdir();
    snprintf(tpl, sizeof tpl, "%s/t.jinja", dir);
    snprintf(vars, sizeof vars, "%s/v.json", dir);
    snprintf(bad, sizeof bad, "%s/bad.jinja", dir);
    write_file(tpl, "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{{ strftime_now('%d %b %Y') }}\n");
    write_file(vars, "{\"messages\": [{\"role\": \"user\", \"content\": \"hé\"}]}");
    write_file(bad, "{{ raise_exception('no ' ~ messages|length) }}");
    snprintf(args, sizeof args, "--template %s --vars %s --date 2026-11-29", tpl, vars);
    assert_int_equal(run_cli(args, out, sizeof out), 0);
    assert_string_equal(out, "user: hé\n29 Nov 2026"); /* exactly the render: no newline added */
    snprintf(args, sizeof args, "--template %s --vars %s", bad, vars);
    assert_int_equal(run_cli(args, out, sizeof out), 1);
    assert_string_equal(out, "tern template: no 1\n");
    snprintf(args, sizeof args, "--template %s --vars %s --date 2026-13-01", tpl, vars);
    assert_int_equal(run_cli(args, out, sizeof out), 2);
    assert_int_equal(run_cli("--vars x.json", out, sizeof out), 2);

    /* --model: the template and the special tokens come from the GGUF; --vars wins */
    char model[512];
    snprintf(model, sizeof model, "%s/m.gguf", dir);
    struct gguf_writer *w;
    assert_int_equal(gguf_writer_new(&w), TERN_OK);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.chat_template",
                                         "{{ bos_token }}|{{ eos_token }}|{{ messages|length }}\n"),
                     TERN_OK);
    struct gguf_str toks[3] = {{"<s>", 3}, {"</s>", 4}, {"a", 1}};
    assert_int_equal(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3), TERN_OK);
    assert_int_equal(gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0), TERN_OK);
    assert_int_equal(gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 1), TERN_OK);
    assert_int_equal(gguf_writer_write(w, model), TERN_OK);
    gguf_writer_free(w);
    snprintf(args, sizeof args, "--model %s --vars %s", model, vars);
    assert_int_equal(run_cli(args, out, sizeof out), 0);
    assert_string_equal(out, "<s>|</s>|1");
    write_file(vars, "{\"messages\": [], \"eos_token\": \"<|im_end|>\"}");
    assert_int_equal(run_cli(args, out, sizeof out), 0);
    assert_string_equal(out, "<s>|<|im_end|>|0");
    assert_int_equal(run_cli("--help", out, sizeof out), 0);
    assert_non_null(strstr(out, "usage: tern template"));
}

/* ---- marks (tern_template_render_spans) ------------------------------------------ */

struct mark_case {
    const char *src, *vars, *expected; /* expected: the render with marked bytes in [[ ]] */
};

static const struct mark_case mark_cases[] = {
    {"{{ '<|s|>' + m + '<|e|>' }}", "{\"m\":\"hi\"}", "<|s|>[[hi]]<|e|>"},
    {"{% set x = '<|s|>' ~ m ~ '!' %}{{ x }}", "{\"m\":\"hi\"}", "<|s|>[[hi]]!"},
    {"{% set x = '<|s|>' + m + '<|e|>' %}{{ x }}", "{\"m\":\"hi\"}", "<|s|>[[hi]]<|e|>"},
    {"{% macro f(a) %} <|s|>{{ a }}<|e|> {% endmacro %}{{ f(m) | trim }}", "{\"m\":\"hi\"}", "<|s|>[[hi]]<|e|>"},
    {"{% set c %}<|s|>{{ m }}{% endset %}{{ c }}", "{\"m\":\"hi\"}", "<|s|>[[hi]]"},
    {"{{ bos_token }}{{ m }}{{ eos_token }}", "{\"m\":\"hi\",\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}",
     "<s>[[hi]]</s>"},
    {"{{ m.split('|')[1] }}", "{\"m\":\"a|b|c\"}", "[[b]]"},
    {"{{ m[1:] }}", "{\"m\":\"hello\"}", "[[ello]]"},
    {"{{ m.strip() }}", "{\"m\":\"  hi \"}", "[[hi]]"},
    {"{{ m | upper }}", "{\"m\":\"hi\"}", "[[HI]]"},
    {"{{ m | replace('h', '<|s|>') }}", "{\"m\":\"hi\"}", "[[<|s|>i]]"},
    {"{{ d | tojson }}", "{\"d\":{\"k\":\"v\"}}", "[[{\"k\": \"v\"}]]"},
    {"{% for k, v in d.items() %}<{{ k }}>{{ v }}{% endfor %}", "{\"d\":{\"k\":\"v\"}}", "<[[k]]>[[v]]"},
    {"{% set ns = namespace(s='') %}{% for x in l %}{% set ns.s = ns.s + '<|s|>' + x %}{% endfor %}{{ ns.s }}",
     "{\"l\":[\"a\",\"b\"]}", "<|s|>[[a]]<|s|>[[b]]"},
    {"{{ l }}", "{\"l\":[\"a\",\"b\"]}", "[[['a', 'b']]]"},
    {"{{ 'yes' if m else 'no' }}|{{ m | length }}|{{ m ~ 1 }}", "{\"m\":\"hi\"}", "yes|2|[[hi]]1"},
    {"{{ m }}", "{\"m\":\"<|s|>x\"}", "[[<|s|>x]]"},
    {"{% for m in msgs %}<|s|>{{ m.role }}\n{{ m.content }}<|e|>{% endfor %}",
     "{\"msgs\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}]}",
     "<|s|>[[user]]\n[[a]]<|e|><|s|>[[assistant]]\n[[b]]<|e|>"},
    {"<|s|>{{ '' }}{{ m }}{{ '' }}<|e|>", "{\"m\":\"\"}", "<|s|><|e|>"},
};

static void test_marks(void **state) {
    (void)state;
    static const char *const trusted[] = {"bos_token", "eos_token", NULL};
    for (size_t i = 0; i < TERN_ARRAY_LEN(mark_cases); i++) {
        const struct mark_case *mc = &mark_cases[i];
        struct tern_template *t;
        assert_int_equal(tern_template_compile(mc->src, strlen(mc->src), &t), TERN_OK);
        json_t *vars = json_loads(mc->vars, 0, NULL);
        assert_non_null(vars);
        struct tern_buf out = TERN_BUF_INIT, shown = TERN_BUF_INIT;
        tern_buf_puts(&out, "pre"); /* spans are offsets into out, whatever it held */
        struct tern_template_spans sp = {0};
        if (tern_template_render_spans(t, vars, NULL, trusted, &out, &sp)) fail_msg("case %zu: %s", i, tern_last_error());
        size_t at = 3;
        for (size_t k = 0; k < sp.n; k++) {
            assert_true(sp.v[k].start >= at && sp.v[k].end <= out.len);
            tern_buf_append(&shown, out.data + at, sp.v[k].start - at);
            tern_buf_puts(&shown, "[[");
            tern_buf_append(&shown, out.data + sp.v[k].start, sp.v[k].end - sp.v[k].start);
            tern_buf_puts(&shown, "]]");
            at = sp.v[k].end;
        }
        tern_buf_append(&shown, out.data + at, out.len - at);
        tern_buf_puts(&shown, "");
        if (strcmp(shown.data, mc->expected)) fail_msg("case %zu (%s): got '%s', want '%s'", i, mc->src, shown.data, mc->expected);
        tern_template_spans_free(&sp);
        tern_buf_free(&out);
        tern_buf_free(&shown);
        json_decref(vars);
        tern_template_free(t);
    }
    /* a failed render leaves the spans as they were */
    struct tern_template *t;
    const char *src = "{{ m }}{{ raise_exception('no') }}";
    assert_int_equal(tern_template_compile(src, strlen(src), &t), TERN_OK);
    json_t *vars = json_loads("{\"m\":\"hi\"}", 0, NULL);
    struct tern_buf out = TERN_BUF_INIT;
    struct tern_template_spans sp = {0};
    assert_int_equal(tern_template_render_spans(t, vars, NULL, NULL, &out, &sp), TERN_ERR_TEMPLATE);
    assert_int_equal(sp.n, 0);
    assert_int_equal(out.len, 0);
    tern_template_spans_free(&sp);
    tern_buf_free(&out);
    json_decref(vars);
    tern_template_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_cases),
        cmocka_unit_test(test_marks),
        cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_runtime_error_location),
        cmocka_unit_test(test_raise_exception),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_syntax_nesting_limits),
        cmocka_unit_test(test_limit_output),
        cmocka_unit_test(test_limit_steps),
        cmocka_unit_test(test_limit_depth),
        cmocka_unit_test(test_limit_memory),
        cmocka_unit_test(test_compile_once_render_many),
        cmocka_unit_test(test_concurrent_renders),
        cmocka_unit_test(test_uses_variable),
        cmocka_unit_test(test_many_names),
        cmocka_unit_test(test_source_handling),
        cmocka_unit_test(test_json_values),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
