"""Regenerates jinja_cases.inc: Jinja snippets with the output transformers' Jinja
environment gives them (or that it raises), for jinja_test.cc.

    .venv/bin/python tests/unit/jinja/gen_jinja_cases.py > tests/unit/jinja/jinja_cases.inc
"""
import json

from transformers.utils.chat_template_utils import _compile_jinja_template

VARS = {
    "msgs": [{"role": "system", "content": " Sys\n"}, {"role": "user", "content": "Hi <b>"},
             {"role": "assistant", "content": "<think>r</think>\n\nYo", "reasoning_content": "r"}],
    "d": {"b": 2, "a": 1, "items": "key-not-method", "Z": None},
    "s": "  Hello, World!  ", "u": "naïve café 東京 😀", "n": 7, "f": 2.5, "t": True, "nil": None,
    "lst": [3, 1, 2], "words": ["b", "A", "a", "c"], "nested": {"x": [{"y": "deep"}]},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": [1.0, "é"]}}}],
}

CASES = [
    # output and literals
    "{{ 1 }} {{ 1.0 }} {{ -0.0 }} {{ 1e16 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }}",
    "{{ True }} {{ false }} {{ none }} {{ None }} {{ 'it''s' }} {{ \"a\" 'b' }}",
    "{{ [1, 'a', none, 1.5, {'k': \"it's\"}, (1,), ()] }}",
    "{{ {'a': 1, 2: [true]} }} {{ ('x', 'y') }}",
    "{{ 'a\\tb\\n' }}|{{ '\\x41\\u00e9\\U0001F600\\101\\q' }}",
    "{{ '\\x00\\x7f\\u200b\\xa0' | list }}",
    # arithmetic
    "{{ 2**3**2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7/2 }} {{ 6/3 }} {{ 2**-1 }}",
    "{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ -n }} {{ +f }} {{ -n|abs }}",
    "{{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'x' ~ 1 ~ none ~ undefined_v }}",
    "{{ true + 1 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == (1,) }} {{ {'a': 1} == {'a': 1} }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2.0 }} {{ 1 != 2 }}",
    "{{ 'a' in 'cat' }} {{ 1 not in [1] }} {{ 'a' in d }} {{ 'zz' in d }} {{ 2 in (1, 2) }}",
    "{{ 1 and 'x' }} {{ 0 and 'x' }} {{ 0 or 'y' }} {{ '' or [] }} {{ not 0 }} {{ not not 'a' }}",
    "{{ 'yes' if t else 'no' }} {{ 'yes' if nil else 'no' }} [{{ 'a' if false }}] {{ 1 if 0 else 2 if 0 else 3 }}",
    "{{ '%s-%d-%05.2f-%r-%x' % ('a', 3, 3.14159, 'q', 255) }} {{ '%(a)s' % {'a': 1} }} {{ '%s' % 5 }}",
    # subscripts and slices
    "{{ msgs[0].role }} {{ msgs[-1]['content'] }} {{ msgs[5] }}|{{ d.a }} {{ d['b'] }} {{ nested.x[0].y }} {{ lst.1 }}",
    "{{ lst[::-1] }} {{ lst[1:] }} {{ lst[:-1] }} {{ lst[::2] }} {{ lst[-100:100] }} {{ lst[5:] }}",
    "{{ u[::-1] }} {{ u[1] }} {{ u[-1] }} {{ u[2:7] }} {{ s[2:7] }}",
    "{{ d.items() | list }} {{ d['items'] }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('q', 'dflt') }} {{ d.get('q') }}",
    # undefined
    "[{{ missing }}] {{ missing is defined }} {{ missing is undefined }} {{ d.missing is defined }} {{ missing | default('D') }}",
    "{{ missing.attr }}", "{{ missing['x'] }}", "{{ missing + 1 }}", "{{ missing() }}", "{{ d.missing.deeper }}",
    "{% for x in missing %}x{% else %}empty{% endfor %} {{ missing | length }} {{ missing | list }}",
    "{{ missing == missing }} {{ 'a' in missing }} {{ missing ~ 'x' }}",
    # errors
    "{{ 'a' + 1 }}", "{{ none + 'a' }}", "{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ 'a' < 1 }}", "{{ [] | first | upper }}",
    "{{ raise_exception('custom failure') }}", "{{ 5() }}", "{{ range(100001) | length }}", "{{ 'x'.nosuch() }}",
    "{% set ns = 5 %}{% set ns.a = 1 %}", "{{ (1, 2) | tojson }}{{ missing | tojson }}",
    "{% set a, b = [1, 2, 3] %}", "{{ {} | dictsort | first }}{{ 1 | items | list }}",
    # statements
    "{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}|{% if false %}x{% endif %}",
    "{% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}:{{ m.role }};{% endfor %}",
    "{% for m in msgs %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ loop.nextitem.role if loop.nextitem is defined else '-' }} {{ loop.cycle('a', 'b') }};{% endfor %}",
    # one loop object per loop: kept past an iteration, it shows the latest one
    "{% set ns = namespace(l=none) %}{% for x in lst %}{% if loop.first %}{% set ns.l = loop %}{% endif %}{% endfor %}{{ ns.l.index }} {{ ns.l.last }} {{ ns.l.cycle('a', 'b', 'c') }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %} {% for k in d %}{{ k }}{% endfor %} {% for c in 'ab' %}[{{ c }}]{% endfor %}",
    "{% for x in lst if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %} {% for x in [] %}{% else %}empty{% endfor %}",
    "{% for x in lst %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for i in range(3) %}{% for j in range(i) %}{{ i }}{{ j }} {% endfor %}{% endfor %}",
    "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 5 %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}[{{ y }}]",
    "{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }} {{ ns.b }} {{ ns }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set (c, d2) = ['x', 'y'] %}{{ c }}{{ d2 }} {% set t = 1, 2 %}{{ t }}",
    "{% set block %}  inner {{ n }}  {% endset %}[{{ block }}] {% set up | upper | trim %} abc {% endset %}[{{ up }}]",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', punct='?') }} {{ greet(name='c') }}",
    "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}",
    "{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}",
    "{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}body {{ n }}{% endcall %}",
    "{% with a = 1, b = n %}{{ a + b }}{% endwith %}[{{ a }}]",
    "{% filter upper %}shout {{ n }}{% endfilter %}",
    "{% raw %}{{ not evaluated }} {% if %}{% endraw %}",
    "{# a comment #}x{#- trimmed -#}  y {#+ kept +#}z",
    "{% generation %}gen {{ n }}{% endgeneration %}",
    # whitespace control
    "  {% if true %}\n  x\n  {% endif %}\n  y\n",
    "a {%- if true -%} b {%- endif -%} c",
    "a {% if true +%} b {%+ endif %} c",
    "{{- ' x ' -}}   {{ 'y' }}  \n  {{- 'z' }}",
    "<ul>\n{% for x in lst %}\n    <li>{{ x }}</li>\n{% endfor %}\n</ul>\n",
    "line\n    {# comment #}\nnext\n\n",
    "\t{%- set q = 1 %}\n\t{{ q }}\n{%+ if true %}k{% endif %}",
    "{% raw -%}\n  raw  \n  {%- endraw %}|",
    "x\r\ny\rz\n",
    # filters
    "{{ s | trim }}|{{ 'xxaxx' | trim('x') }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello world-foo(bar' | title }}|{{ 'hELLO wOrld' | capitalize }}",
    "[{{ 'ab' | center(7) }}] [{{ 'ab' | center(6) }}] {{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }}",
    "{{ lst | join(', ') }} {{ lst | join }} {{ msgs | map(attribute='role') | join('/') }} {{ msgs | map(attribute='name', default='?') | list }}",
    "{{ lst | first }} {{ lst | last }} {{ 'abc' | first }} {{ lst | length }} {{ u | length }} {{ d | count }}",
    "{{ lst | sort }} {{ lst | sort(reverse=true) }} {{ words | sort }} {{ words | sort(case_sensitive=true) }} {{ msgs | sort(attribute='role') | map(attribute='role') | list }}",
    "{{ words | unique | list }} {{ words | unique(case_sensitive=true) | list }} {{ lst | reverse | list }} {{ 'abc' | reverse }}",
    "{{ d | dictsort }} {{ {'b': 1, 'A': 2, 'a': 3} | dictsort(by='value', reverse=true) }}",
    "{{ lst | min }} {{ lst | max }} {{ words | max }} {{ lst | sum }} {{ [1.5, 2] | sum(start=1) }}",
    "{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ [0, 1, '', 'a'] | select | list }}",
    "{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ msgs | rejectattr('reasoning_content') | list | length }}",
    "{{ msgs | selectattr('role', 'in', ['user', 'system']) | list | length }} {{ [1, 5, 10] | select('gt', 4) | list }} {{ ['a', 'b'] | map('upper') | list }}",
    "{{ 'x' | int }} {{ '3.7' | int }} {{ ' 12 ' | int }} {{ 3.9 | int }} {{ '0x1A' | int(base=16) }} {{ 'q' | int(5) }} {{ true | int }}",
    "{{ '1e3' | float }} {{ 'x' | float }} {{ 3 | float }} {{ ' -2.5 ' | float }}",
    "{{ 2.5 | round }} {{ 3.5 | round }} {{ 3.14159 | round(2) }} {{ 3 | round }} {{ 2.5 | round(0, 'floor') }} {{ 2.1 | round(0, 'ceil') }} {{ 2.675 | round(2) }}",
    "{{ -3 | abs }} {{ -2.5 | abs }} {{ n | string }} {{ nil | string }} {{ lst | string }} {{ 5 | safe }} {{ '<a href=\"x\">&\\'' | e }} {{ '<b>' | escape }}",
    "{{ 'a\\nb\\n' | indent(2) }}|{{ 'a\\n\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}|{{ 'a\\nb' | indent('> ') }}",
    "{{ 'hello world foo' | wordcount }} {{ 'a b-c d_e' | wordcount }} {{ '%s and %s' | format('x', 1) }} {{ 'long text here' | truncate(9) }}",
    "{{ missing | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ nil | default('d') }} {{ nil | d('d', boolean=true) }}",
    "{{ d | items | list }} {{ missing | items | list }} {{ 'ab' | list }} {{ d | list }} {{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ d | attr('a') }}",
    "{{ tools | tojson }}",
    "{{ tools[0] | tojson(indent=2) }}",
    "{{ d | tojson(sort_keys=true) }} {{ u | tojson }} {{ u | tojson(ensure_ascii=true) }} {{ 'a\"\\\\\\n\\t\\x01' | tojson }}",
    "{{ [1, 2] | tojson(separators=(',', ':')) }} {{ {'k': [1, {}], 'e': []} | tojson(indent=1) }} {{ 1e16 | tojson }} {{ nil | tojson }} {{ 1.0 | tojson }}",
    # tests
    "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ nil is none }} {{ n is number }} {{ t is number }} {{ f is float }} {{ n is integer }} {{ t is integer }}",
    "{{ s is string }} {{ d is mapping }} {{ lst is mapping }} {{ lst is iterable }} {{ s is iterable }} {{ n is iterable }} {{ d is sequence }} {{ n is sequence }} {{ missing is iterable }}",
    "{{ t is boolean }} {{ t is true }} {{ 1 is true }} {{ false is false }} {{ n is eq 7 }} {{ n is equalto 8 }} {{ n is ne 8 }} {{ n is lt 8 }} {{ n is ge 7 }} {{ 'a' is in 'abc' }}",
    "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ range is callable }} {{ n is not none }} {{ not n is none }} {{ lst is sameas lst }} {{ 'upper' is filter }} {{ 'odd' is test }}",
    # methods
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ '--a--'.strip('-') }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'abcba'.rstrip('ab') }}",
    "{{ '  a b  c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,,c'.split(',', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ ' a  b '.split(none, 1) }} {{ 'a\\nb\\r\\nc'.splitlines() }}",
    "{{ s.startswith('  H') }} {{ s.endswith('!  ') }} {{ 'abc'.startswith(('x', 'a')) }} {{ s.upper() }} {{ s.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}",
    "{{ 'a-b-c'.replace('-', '') }} {{ 'a-b-c'.replace('-', '+', 1) }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }}",
    "{{ ', '.join(['a', 'b']) }} {{ '{} + {} = {}'.format(1, 2, 3) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{x}!'.format(x='y') }} {{ '{:>5}|{:<4}|{:^5}|{:.2f}|{:05d}'.format('a', 'b', 'c', 3.14159, 42) }}",
    "{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ '  '.isspace() }} {{ 'x'.zfill(3) }} {{ 'ab'.ljust(4, '.') }}| {{ 'a=b=c'.partition('=') }} {{ 'prefix-x'.removeprefix('prefix-') }}",
    "{{ u.upper() }} {{ 'ÀÉÎ STRASSE' .lower() }} {{ 'straße'.upper() }} {{ u | length }} {{ u.split(' ') }} {{ u.find('東') }}",
    "{{ '\\u3000 x \\xa0'.strip() }}|{{ 'a\\u3000b'.split() }}",
    # globals
    "{{ range(5) | list }} {{ range(2, 8, 3) | list }} {{ range(5, 0, -2) | list }} {{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }} {{ namespace(v=1).v }}",
    "{% set j = joiner(', ') %}{% for x in lst %}{{ j() }}{{ x }}{% endfor %}",
    "{{ strftime_now('') }}|{{ (strftime_now('%Y') | int) > 2000 }}",
    # chat-template idioms
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{{ add_generation_prompt }}",
    "{% for m in msgs %}{% set content = m.content %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}[{{ content }}]{% endfor %}",
    "{%- for m in msgs[::-1] %}{%- set index = (msgs | length - 1) - loop.index0 %}{{ index }}{{ m.role[0] }}{% endfor %}",
    "{{ msgs[0]['content'] if msgs[0]['role'] == 'system' else '' }}|{{ (msgs | selectattr('role', 'eq', 'user') | first).content }}",
]


def main():
    env_vars = VARS
    out = ["// Generated by gen_jinja_cases.py from transformers' Jinja environment; do not edit.",
           "// kCases: {template, expected output or nullptr when Jinja raises}, rendered with kVarsJson.",
           "constexpr const char* kVarsJson = " + cpp_string(json.dumps(VARS, ensure_ascii=False)) + ";",
           "constexpr JinjaCase kCases[] = {"]
    for src in CASES:
        try:
            expected = _compile_jinja_template(src).render(**env_vars)
        except Exception:  # noqa: BLE001
            expected = None
        out.append("{" + cpp_string(src) + ", " + (cpp_string(expected) if expected is not None else "nullptr") + "},")
    out.append("};")
    print("\n".join(out))


def cpp_string(s):
    # A UTF-8 byte string literal with every non-printable / non-ASCII byte hex-escaped.
    b = s.encode("utf-8")
    parts, cur = [], ""
    for byte in b:
        c = chr(byte)
        if 32 <= byte < 127 and c not in '"\\?':
            cur += c
        else:
            cur += "\\x%02x" % byte
            parts.append(cur)
            cur = ""
    parts.append(cur)
    return " ".join('"' + p + '"' for p in parts if p != "") or '""'


if __name__ == "__main__":
    main()
