"""cuda-emu: the source conversions (used by emulate.py; runnable alone for a look at one file).

    python3 tools/cuda-emu/convert.py kernel|glue|test IN OUT

kernel  a .cu or .cuh file of src/toy/backend/cuda into C++ for emu_cuda.h:
        `k<<<grid, block, shared, stream>>>(args)` -> `emu::Launch("k", grid, block, shared,
        stream).run(k, args)`; `#include <cub/...>` -> "cub_host_sort.h"; after each
        `__shared__` declaration, EMU_POISON_SHARED(name) for each variable it declares.
glue    a glue_*.cpp file registering on the sim device: Device::CUDA -> Device::SIM.
test    a tests/gpu file run on sim: Device::CUDA -> Device::SIM.

Every output starts with a #line naming the original file, and keeps its line numbers, so
compiler errors point at the real source.
"""
import re
import sys


def _launch_kernel_start(s, end):
    """Where the kernel expression ending at `end` starts (a name, maybe with ::, and template arguments)."""
    k = end
    if s[k - 1] == '>':
        depth = 0
        while True:
            k -= 1
            if s[k] == '>':
                depth += 1
            elif s[k] == '<':
                depth -= 1
                if depth == 0:
                    break
    while k > 0 and (s[k - 1].isalnum() or s[k - 1] in '_:'):
        k -= 1
    return k


def rewrite_launches(s):
    out, i = [], 0
    while True:
        j = s.find('<<<', i)
        if j < 0:
            out.append(s[i:])
            return ''.join(out)
        end = j
        while s[end - 1].isspace():
            end -= 1
        start = _launch_kernel_start(s, end)
        kernel = s[start:end]
        close = s.find('>>>', j)
        if close < 0:
            raise ValueError(f'a <<< without >>> near: {s[j:j + 60]!r}')
        config = s[j + 3:close]
        p = close + 3
        while s[p].isspace():
            p += 1
        if s[p] != '(':
            raise ValueError(f'a launch of {kernel} not followed by its arguments')
        q = p + 1
        while s[q].isspace():
            q += 1
        name = ' '.join(kernel.split())
        dropped_newlines = '\n' * (s.count('\n', end, j) + s.count('\n', close + 3, p))
        out.append(s[i:start])
        out.append(f'emu::Launch("{name}", {config}).run({kernel}' + ('' if s[q] == ')' else ', '))
        out.append(dropped_newlines)
        i = p + 1


def _top_level_split(text, sep=','):
    parts, depth, cur = [], 0, ''
    for c in text:
        if c in '[(<{':
            depth += 1
        elif c in '])>}':
            depth -= 1
        if c == sep and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += c
    parts.append(cur)
    return parts


def _declared_names(declaration):
    """The variables of `T a[N][M], b[K]` (the text after __shared__, without the semicolon)."""
    names = []
    for part in _top_level_split(declaration):
        part = re.sub(r'\[[^\]]*\]', '', part.split('=')[0]).strip()
        m = re.search(r'([A-Za-z_]\w*)\s*$', part)
        if m:
            names.append(m.group(1))
    return names


_SHARED = re.compile(r'^(\s*)(?:static\s+)?__shared__\s+([^;{}]*);', re.M)


def poison_shared(s):
    def add_poison(m):
        decl = m.group(2)
        calls = ''.join(f' EMU_POISON_SHARED({n});' for n in _declared_names(decl))
        return f'{m.group(1)}__shared__ {decl};{calls}'
    return _SHARED.sub(add_poison, s)


def convert_kernel(s):
    s = re.sub(r'#include\s*<cub/[^>]*>', '#include "cub_host_sort.h"', s)
    return poison_shared(rewrite_launches(s))


def to_sim(s):
    return re.sub(r'\bDevice::CUDA\b', 'Device::SIM', s)


CONVERSIONS = {'kernel': convert_kernel, 'glue': to_sim, 'test': to_sim}


def convert_file(kind, src, dst=None):
    """The converted text of `src` (written to `dst` when given and different from what is there)."""
    with open(src) as f:
        text = f.read()
    out = f'#line 1 "{src}"\n' + CONVERSIONS[kind](text)
    if dst is not None:
        try:
            with open(dst) as f:
                if f.read() == out:
                    return out
        except FileNotFoundError:
            pass
        with open(dst, 'w') as f:
            f.write(out)
    return out


# ---- what emulate.py reads from the sources ---------------------------------------------------

def register_functions(glue_text):
    """The `void register_X(Registry& r)` functions a glue file defines."""
    return re.findall(r'^void\s+(register_\w+)\s*\(\s*Registry\s*&', glue_text, re.M)


def registered_kernels(glue_text):
    """(signature type, kernel name) of each `r.add<Type>("name", Device::CUDA, ...)`."""
    return re.findall(r'\.add<\s*([\w:]+)\s*>\s*\(\s*"(\w+)"\s*,\s*Device::CUDA\b', glue_text)


def test_count(test_text):
    return len(re.findall(r'^\s*(?:TEST|TEST_F|TEST_P|TYPED_TEST)\s*\(', test_text, re.M))


if __name__ == '__main__':
    if len(sys.argv) != 4 or sys.argv[1] not in CONVERSIONS:
        sys.exit(__doc__)
    convert_file(sys.argv[1], sys.argv[2], sys.argv[3])
