#!/usr/bin/env python3
"""Differential test of tern's template engine against Python jinja2 (a development
tool; needs python3-jinja2, not part of the test suite).

Generates random templates -- expressions over varied values (strings with Unicode,
numbers, lists, dicts, none, undefined), filters, tests, methods, slicing, statements,
and random whitespace-control layouts -- renders each with jinja2 configured as
transformers does and with `tern template`, and prints every difference.

    python3 src/template/difftest.py --tern build/tern --seed 1 -n 500

Known, accepted differences are skipped: Python object addresses in reprs, and
constant subscripts that jinja2 folds at compile time."""
import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import tempfile

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

VARS = {"x": "Hello, Wörld! ", "n": 7, "f": 2.5, "z": 0, "l": [3, 1, "a", None, True, [1, 2]],
        "d": {"b": 1, "a": [1, {"c": "x"}], "items": 5}, "s": "  a,b,,c\n d\t", "e": [], "ed": {}, "t": True,
        "no": None, "big": 10**15, "neg": -3, "fl": 30.0, "u8": "éΣς😀\u200bß",
        "msgs": [{"role": "user", "content": "hi"},
                 {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]}]}
STRS = ["''", "'a'", "'ab,c'", "\"x y\"", "'é'", "'\\n'", "'A'", "'1'", "'2.5'", "' pad '", "'{}'", "'%s'", "'a{0}b'", "'Σ'"]
NAMES = list(VARS) + ["undefined_var"]
FILTERS = [("length", []), ("upper", []), ("lower", []), ("trim", []), ("title", []), ("capitalize", []), ("string", []),
           ("list", []), ("first", []), ("last", []), ("default", ["'D'"]), ("default", ["'D'", "true"]), ("join", ["','"]),
           ("join", []), ("reverse", []), ("sort", []), ("unique", []), ("tojson", []), ("tojson", ["indent=2"]), ("int", []),
           ("float", []), ("abs", []), ("round", []), ("round", ["1"]), ("items", []), ("dictsort", []), ("sum", []),
           ("min", []), ("max", []), ("count", []), ("replace", ["'a'", "'b'"]), ("center", ["9"]), ("select", ["'odd'"]),
           ("reject", ["'none'"]), ("map", ["'string'"]), ("safe", []), ("escape", []), ("wordcount", []),
           ("truncate", ["5"]), ("batch", ["2"]), ("slice", ["2"]), ("indent", ["2"]), ("format", ["1"]), ("attr", ["'a'"]),
           ("selectattr", ["'role'", "'equalto'", "'user'"]), ("map", ["attribute='role'"]), ("striptags", [])]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
         "boolean", "true", "false", "odd", "even", "callable", "lower", "upper", "escaped", "divisibleby 2",
         "in [1,'a']", "eq 1", "sameas none", "gt 1", "lt 'b'"]
METHODS = [("strip", []), ("strip", ["'a '"]), ("lstrip", []), ("rstrip", ["'\\n'"]), ("split", []), ("split", ["','"]),
           ("split", ["',', 1"]), ("rsplit", ["','", "1"]), ("upper", []), ("lower", []), ("title", []),
           ("startswith", ["'H'"]), ("endswith", ["'! '"]), ("replace", ["'l'", "'L'"]), ("find", ["'o'"]),
           ("count", ["'l'"]), ("splitlines", []), ("capitalize", []), ("swapcase", []), ("isdigit", []), ("isalpha", []),
           ("zfill", ["6"]), ("center", ["12", "'*'"]), ("partition", ["','"]), ("format", ["1", "2"]),
           ("join", ["['a','b']"]), ("items", []), ("keys", []), ("values", []), ("get", ["'a'"]), ("get", ["'q'", "0"]),
           ("index", ["1"])]
WS = [" ", "  ", "\t", "\n", "\n\n", "a", "b ", " c\n", "\r\n", "x\t \n", " \u00a0 ", "\u3000"]


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def lit(self, d):
        r, R = self.r.random(), self.r
        if r < 0.2: return str(R.choice([0, 1, 2, -1, 7, 100, 3]))
        if r < 0.3: return R.choice(["1.5", "0.1", "2.0", "-0.5", "1e-7", "1e16"])
        if r < 0.55: return R.choice(STRS)
        if r < 0.6: return R.choice(["none", "true", "false"])
        if r < 0.7 and d < 3: return "[" + ", ".join(self.expr(d + 1) for _ in range(R.randint(0, 3))) + "]"
        if r < 0.75 and d < 3: return "(" + ", ".join(self.expr(d + 1) for _ in range(R.randint(0, 3))) + ",)"
        if r < 0.8 and d < 3:
            return "{" + ", ".join(R.choice(STRS) + ": " + self.expr(d + 1) for _ in range(R.randint(0, 2))) + "}"
        return R.choice(NAMES)

    def prim(self, d):
        return "(" + self.expr(d) + ")"

    def expr(self, d=0):
        R = self.r
        if d > 3: return self.lit(d)
        r = R.random()
        if r < 0.25: return self.lit(d)
        if r < 0.4: return "%s %s %s" % (self.expr(d + 1), R.choice(["+", "-", "*", "/", "//", "%", "~", "**"]), self.expr(d + 1))
        if r < 0.5:
            return "%s %s %s" % (self.expr(d + 1), R.choice(["==", "!=", "<", ">", "<=", ">=", "in", "not in"]), self.expr(d + 1))
        if r < 0.55: return "(%s %s %s)" % (self.expr(d + 1), R.choice(["and", "or"]), self.expr(d + 1))
        if r < 0.6: return "not %s" % self.expr(d + 1)
        if r < 0.7:
            f, a = R.choice(FILTERS)
            return "%s|%s%s" % (self.prim(d + 1), f, "(" + ", ".join(a) + ")" if a else "")
        if r < 0.77: return "%s is %s%s" % (self.prim(d + 1), R.choice(["", "not "]), R.choice(TESTS))
        if r < 0.85:
            m, a = R.choice(METHODS)
            return "%s.%s(%s)" % (self.prim(d + 1), m, ", ".join(a))
        if r < 0.92:
            p, k = self.prim(d + 1), R.random()
            if k < 0.4: return "%s[%s]" % (p, R.choice(["0", "1", "-1", "5", "'a'", "'b'", "'role'"]))
            if k < 0.7: return "%s[%s:%s]" % (p, R.choice(["", "1", "-2"]), R.choice(["", "3", "-1"]))
            if k < 0.85: return "%s[::%s]" % (p, R.choice(["-1", "2", "-2"]))
            return "%s.%s" % (p, R.choice(["a", "b", "role", "content", "items", "0", "upper", "x"]))
        return "(%s if %s else %s)" % (self.expr(d + 1), self.expr(d + 1), self.expr(d + 1))

    def stmt(self, d=0):
        R, r = self.r, self.r.random()
        if r < 0.45 or d > 2: return "{{ %s }}" % self.expr()
        if r < 0.6: return "{%% if %s %%}%s{%% else %%}%s{%% endif %%}" % (self.expr(), self.stmt(d + 1), self.stmt(d + 1))
        if r < 0.75:
            it = R.choice(["l", "d", "x", "e", "msgs", "range(3)", "[1,2]", "s.split(',')"])
            return "{%% for it in %s %%}[{{ it }}|{{ loop.index }}]%s{%% endfor %%}" % (it, self.stmt(d + 1))
        if r < 0.85: return "{%% set v = %s %%}{{ v }}" % self.expr()
        return "{%% macro m(a, b=2) %%}<{{ a }}{{ b }}>{%% endmacro %%}{{ m(%s) }}" % self.expr()

    def template(self):
        return "".join(self.stmt() for _ in range(self.r.randint(1, 3)))

    def tag(self):
        R = self.r
        k, l, r = R.random(), R.choice(["", "-", "+"]), R.choice(["", "-", "+"])
        nv = lambda s: s if s != "+" else ""
        if k < 0.3: return "{{%s 'v' %s}}" % (nv(l), nv(r))
        if k < 0.5: return "{#%s c %s#}" % (l, r)
        if k < 0.6:
            return "{%%%s raw %s%%}%s{%%%s endraw %s%%}" % (nv(l), nv(r), R.choice(["x", "  y \n", "{{ z }}"]),
                                                          R.choice(["", "-", "+"]), R.choice(["", "-", "+"]))
        if k < 0.8:
            body = "".join(R.choice(WS) for _ in range(R.randint(0, 3)))
            return "{%%%s if true %s%%}%s{%%%s endif %s%%}" % (l, r, body, R.choice(["", "-", "+"]), R.choice(["", "-", "+"]))
        return "{%%%s set q = 1 %s%%}" % (l, r)

    def layout(self):
        return "".join(self.r.choice(WS) if self.r.random() < 0.6 else self.tag() for _ in range(self.r.randint(1, 12)))


def reference_env():
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime(2026, 11, 29).strftime(fmt)
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", default="build/tern")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-n", type=int, default=300)
    args = ap.parse_args()
    import warnings
    warnings.simplefilter("ignore")
    env, gen = reference_env(), Gen(args.seed)
    tmp = tempfile.mkdtemp()
    tpath, vpath = os.path.join(tmp, "t.jinja"), os.path.join(tmp, "v.json")
    with open(vpath, "w") as f:
        json.dump(VARS, f)
    bad = 0
    for i in range(args.n):
        src = gen.template() if i % 3 else gen.layout()
        try:
            ref = ("ok", env.from_string(src).render(**VARS))
        except Exception as ex:
            ref = ("err", "%s: %s" % (type(ex).__name__, ex))
        with open(tpath, "w") as f:
            f.write(src)
        p = subprocess.run([args.tern, "template", "--template", tpath, "--vars", vpath, "--date", "2026-11-29"],
                           capture_output=True)
        mine = ("ok", p.stdout.decode()) if p.returncode == 0 else ("err", p.stderr.decode().strip())
        if ref == mine or (ref[0] == "err" and mine[0] == "err"):
            continue
        if ref[0] == "ok" and (" at 0x" in ref[1] or "<built-in method" in ref[1]):
            continue
        if ref[0] == "ok" and mine[0] == "err" and ("not subscriptable" in mine[1] or "'slice'" in mine[1]):
            continue
        bad += 1
        print("---", repr(src))
        print("  jinja2:", repr(ref[1])[:500])
        print("  tern:  ", repr(mine[1])[:500])
    print("%d differences in %d templates" % (bad, args.n))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
