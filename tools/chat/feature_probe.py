#!/usr/bin/env python3
"""Probes toy's Jinja engine feature by feature against Python's jinja2 set up as Hugging Face
does (render_reference.make_env): each case is rendered by both, and the ones that differ are
printed. A developer tool beside the committed tests (tests/chat/test_jinja.cpp pins what it
finds); both raising counts as agreement.

    tools/chat/feature_probe.py [path/to/toy]      (default build/toy)
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from render_reference import make_env  # noqa: E402

cases = {
 "recursive": "{% for m in [{'n':1,'kids':[{'n':2,'kids':[]}]}] recursive %}{{ m.n }}{{ loop.depth }}[{{ loop(m.kids) }}]{% endfor %}",
 "cycle": "{% for m in messages %}{{ loop.cycle('a','b') }}{{ loop.previtem is defined }}{{ loop.nextitem is defined }}{% endfor %}",
 "changed": "{% for m in messages %}{{ loop.changed(m.role) }}{% endfor %}",
 "wordwrap": "{{ messages[0].content | wordwrap(8) }}",
 "pprint": "{{ messages | pprint }}",
 "xmlattr": "<a{{ {'x': 'y'} | xmlattr }}>",
 "urlencode": "{{ 'a b&c' | urlencode }}",
 "filesize": "{{ 123456 | filesizeformat }}",
 "set_tuple": "{% set a, b = 1, 2 %}{{ a }}{{ b }}",
 "ternary_none": "{{ none if true }}|{{ 'x' if false }}",
 "with": "{% with x = 3 %}{{ x }}{% endwith %}",
 "format_pct": "{{ '%s-%d' % ('a', 3) }}",
 "str_format": "{{ '{}:{}'.format('a', 1) }}",
 "dict_literal_update": "{% set d = {'a':1} %}{{ d.items() | list }}",
 "slice_step": "{{ messages[::-1] | map(attribute='role') | join(',') }}",
 "string_methods": "{{ 'Hello'.lower().title().center(9, '*') }}{{ 'a,b'.split(',') }}{{ ' x '.lstrip() }}{{ 'abc'.rjust(5) }}{{ 'ab'.zfill(4) }}",
 "in_dict": "{{ 'role' in messages[0] }}{{ messages[0].get('x', 'dflt') }}",
 "namespace_loop": "{% set ns = namespace(c=0) %}{% for m in messages %}{% set ns.c = ns.c + 1 %}{% endfor %}{{ ns.c }}",
 "math": "{{ 7 // 2 }}{{ 7 % 3 }}{{ 2 ** 10 }}{{ -7 // 2 }}{{ 7 / 2 }}",
 "list_methods": "{% set l = [3,1,2] %}{{ l | sort | list }}{{ l.index(1) }}{{ l.count(3) }}",
 "tojson_sort": "{{ {'b':1,'a':[1,2]} | tojson(indent=2) }}",
 "call_block": "{% macro w(x) %}<{{ caller(x) }}>{% endmacro %}{% call(v) w(5) %}v={{ v }}{% endcall %}",
 "filter_block": "{% filter upper %}abc{% endfilter %}",
 "raw": "{% raw %}{{ x }}{% endraw %}",
 "is_tests": "{{ 3 is divisibleby 3 }}{{ 'a' is lower }}{{ none is none }}{{ [] is iterable }}",
 "selectattr_eq": "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
 "groupby": "{% for g in messages | groupby('role') %}{{ g.grouper }}{{ g.list | length }}{% endfor %}",
 "batch": "{{ [1,2,3] | batch(2) | list }}",
 "max_attr": "{{ messages | map(attribute='content') | map('length') | max }}",
 "round": "{{ 2.567 | round(2) }}{{ 2.5 | round(0, 'floor') }}",
 "int_conv": "{{ '42' | int + 1 }}{{ '3.5' | float }}",
 "truncate": "{{ messages[0].content | truncate(9) }}",
 "replace_count": "{{ 'aaa' | replace('a', 'b', 2) }}",
 "strftime": "{{ strftime_now('%Y') | length }}",
 "loop_vars": "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{% endfor %}",
 "for_if": "{% for m in messages if m.role == 'user' %}{{ m.content }}{% else %}none{% endfor %}",
 "dict_iter": "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}",
 "string_iter": "{% for c in 'abc' %}{{ c }}-{% endfor %}",
 "escape_str": "{{ '\\n' | length }}{{ \"it's\" }}",
 "concat": "{{ [1] + [2] }}{{ 'a' ~ 1 ~ none }}",
 "unpack_for": "{% for a, b in [[1,2],[3,4]] %}{{ a+b }}{% endfor %}",
 "attr_default": "{{ messages[0].nothing | default('d', true) }}{{ undefined_var is not defined }}",
 "trans_whitespace": "  {%- if true -%}  x  {%- endif -%}  \n{%+ if true %} y{% endif %}",
}
cases.update({
 "fs1": "{{ 1 | filesizeformat }}|{{ 999 | filesizeformat }}|{{ 1000 | filesizeformat }}|{{ 1048576 | filesizeformat(true) }}|{{ '2500000' | filesizeformat }}|{{ 1e30 | filesizeformat }}|{{ 1.5 | filesizeformat }}",
 "url2": "{{ {'a b': 'c/d', 'x': 3} | urlencode }}|{{ [('k', 'v w')] | urlencode }}|{{ 'é/ ~' | urlencode }}|{{ 42 | urlencode }}",
 "xml2": "<a{{ {'class': 'x<y', 'n': none, 'k': 3} | xmlattr }}>|{{ {'a': 1} | xmlattr(false) }}|{{ {} | xmlattr }}",
 "xmlbad": "{{ {'a b': 1} | xmlattr }}",
})

MESSAGES = [{"role": "user", "content": "hi there, how are you"}, {"role": "assistant", "content": "fine"}]


def main():
    toy = sys.argv[1] if len(sys.argv) > 1 else "build/toy"
    env = make_env(datetime.datetime(2026, 3, 14, 9, 26, 53))
    differ = 0
    with tempfile.TemporaryDirectory() as d:
        conv = os.path.join(d, "conv.json")
        with open(conv, "w") as f:
            json.dump({"messages": MESSAGES, "now": "2026-03-14T09:26:53"}, f)
        for name, src in cases.items():
            try:
                want = env.from_string(src).render(messages=MESSAGES, add_generation_prompt=True)
            except Exception as e:  # noqa: BLE001 (any refusal)
                want = None
            path = os.path.join(d, "t.jinja")
            with open(path, "w") as f:
                f.write(src)
            r = subprocess.run([toy, "template", path, conv], capture_output=True, text=True)
            got = r.stdout if r.returncode == 0 else None
            if got != want:
                differ += 1
                print(f"{name}: jinja2 {want!r}\n    toy {got if got is not None else r.stderr.strip()!r}")
    print(f"{differ} of {len(cases)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
