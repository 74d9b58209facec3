"""cuda-emu: builds the emulated GPU tests from the current tree and runs them.

Run through scripts/gpu-emulate.sh [GTEST_FILTER] (which documents the environment); the steps:

 1. Discovers the sources by glob: src/toy/backend/cuda/*.cu (kernels), *.cuh (their shared
    device code), glue_*.cpp (glue; one calling cuBLAS is left out), tests/gpu/test_cuda*.cpp
    and tests/gpu/*.h; converts them into BUILD/gen (convert.py).
 2. Compiles them with ninja into BUILD/obj, with the main build's flags (build/build.ninja,
    the toy_gpu_tests target, or toy_core_tests in a build without CUDA). A file that does not
    compile is reported and left out; the run then fails.
 3. Keeps the kernel and glue objects whose toy::cuda references are all defined by the
    others kept (a glue whose kernels did not build goes too), writes emulated_glue.cpp (the
    register_* functions of the glue kept; failing stand-ins for the kernels of the glue left
    out), links the test program against build/libtoy.a.
 4. Runs the tests, except the ones below that need what is not emulated; a test that crashes
    the program (an emulator abort: a deadlock, a bad shuffle) is counted failed and the run
    goes on with the tests after it. Prints the failures, the log's path and the summary
    "emulated GPU tests: N passed, M failed, K not emulated"; exits 1 on any failure or any
    file that did not build, 2 when it cannot build at all.
"""
import fcntl
import fnmatch
import glob
import os
import platform
import queue
import re
import shlex
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # (no __pycache__ in the tree)
import convert  # noqa: E402

# Tests that need what the emulator does not have: pattern -> why.
NOT_EMULATED = {
    'CudaMatmul.*': 'cuBLASLt matmuls',
    'Cuda.AGpuNumberOutOfRange*': 'counts the real GPUs',
}

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CUDA_SRC = os.path.join(ROOT, 'src/toy/backend/cuda')
MAIN_BUILD = os.path.join(ROOT, 'build')


class Fatal(Exception):
    pass


def log(msg):
    print(f'cuda-emu: {msg}', flush=True)


class BuildLock:
    """Held around each compile and test run when TOY_BUILD_LOCK names a lock file (machines
    whose cores are shared): flock(2) on it, the lock `flock FILE command` takes."""
    waited = 0.0

    def __enter__(self):
        path = os.environ.get('TOY_BUILD_LOCK')
        self.f = open(path, 'a') if path else None
        if self.f:
            t = time.time()
            fcntl.flock(self.f, fcntl.LOCK_EX)
            BuildLock.waited += time.time() - t
        return self

    def __exit__(self, *_):
        if self.f:
            self.f.close()  # (releases it)


def write_if_changed(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(path, 'w') as f:
        f.write(text)


def read(path):
    with open(path) as f:
        return f.read()


def stem(path):
    return os.path.splitext(os.path.basename(path))[0]


# ---- the main build's flags ----------------------------------------------------------------------

def ninja_blocks(text):
    """{first line of each `build ...` statement: {variable: value}} of a build.ninja."""
    blocks, cur = {}, None
    for line in text.splitlines():
        if line.startswith('build '):
            cur = blocks.setdefault(line, {})
        elif line.startswith('  ') and cur is not None and ' = ' in line:
            k, v = line.strip().split(' = ', 1)
            cur[k] = v
        elif not line.strip():
            cur = None
    return blocks


def main_build_flags():
    ninja_file = os.path.join(MAIN_BUILD, 'build.ninja')
    lib = os.path.join(MAIN_BUILD, 'libtoy.a')
    if not (os.path.isfile(ninja_file) and os.path.isfile(lib)):
        raise Fatal(f'no main build ({os.path.relpath(lib, ROOT)}): run scripts/build.sh first')
    blocks = ninja_blocks(read(ninja_file))
    for target in ('toy_gpu_tests', 'toy_core_tests'):
        compile_block = next((v for k, v in blocks.items() if re.search(rf': CXX_COMPILER__{target}_\w+ ', k)), None)
        link_key = next((k for k in blocks if re.search(rf': CXX_EXECUTABLE_LINKER__{target}_\w+ ', k)), None)
        if compile_block is not None and link_key is not None:
            break
    else:
        raise Fatal('build/build.ninja has neither toy_gpu_tests nor toy_core_tests: run scripts/build.sh first')
    rule = re.search(r': (CXX_COMPILER__\w+) ', next(k for k, v in blocks.items() if v is compile_block)).group(1)
    rules_file = os.path.join(MAIN_BUILD, 'CMakeFiles/rules.ninja')
    m = re.search(rf'rule {rule}\n(?:  .*\n)*?  command = (\S+)', read(rules_file)) if os.path.isfile(rules_file) else None
    if not m:
        raise Fatal(f'no compiler for {target} in build/CMakeFiles/rules.ninja: run scripts/build.sh first')
    cxx = m.group(1)
    link = blocks[link_key]
    libs = ' '.join(os.path.join(MAIN_BUILD, t) if t == 'libtoy.a' else t for t in link['LINK_LIBRARIES'].split())
    return {
        'cxx': cxx,
        'defines': compile_block.get('DEFINES', ''),
        'includes': compile_block.get('INCLUDES', ''),
        'flags': compile_block.get('FLAGS', ''),
        'link_flags': link.get('FLAGS', '') + ' ' + link.get('LINK_FLAGS', ''),
        'link_libs': link.get('LINK_PATH', '') + ' ' + libs,
        'lib': lib,
    }


def cuda_include(includes):
    if 'cuda' in includes and 'include' in includes:
        return ''
    for home in (os.environ.get('CUDA_HOME', ''), os.environ.get('CUDA_PATH', ''), '/usr/local/cuda'):
        if home and os.path.isfile(os.path.join(home, 'include/cuda_runtime.h')):
            return f'-isystem {home}/include'
    raise Fatal('the CUDA toolkit\'s headers (cuda_runtime.h, cuda_fp16.h, cuda_bf16.h) are needed: set CUDA_HOME')


def warn_if_library_is_stale(lib):
    built = os.path.getmtime(lib)
    newest, newest_path = built, None
    for path in glob.glob(os.path.join(ROOT, 'src/toy/**/*.[ch]*'), recursive=True):
        if path.startswith(CUDA_SRC + os.sep):
            continue
        t = os.path.getmtime(path)
        if t > newest:
            newest, newest_path = t, path
    if newest_path:
        log(f'warning: build/libtoy.a is older than {os.path.relpath(newest_path, ROOT)}; the tests link the '
            'older library (scripts/build.sh brings it up to date)')


# ---- the sources -------------------------------------------------------------------------------

def device_math_namespaces():
    """Namespaces of the shared host/device math (headers that test __CUDA_ARCH__): the kernel
    files rename them, so their device copies do not meet the host's inline functions at link."""
    names = set()
    for path in glob.glob(os.path.join(CUDA_SRC, '*.h')) + glob.glob(os.path.join(CUDA_SRC, '*.cuh')):
        text = read(path)
        if '__CUDA_ARCH__' in text:
            for full in re.findall(r'^\s*namespace\s+([\w:]+)\s*\{', text, re.M):
                names.add(full.split('::')[-1])
    return sorted(names - {'toy', 'cuda'})


class Sources:
    def __init__(self, gen):
        self.kernels = sorted(glob.glob(os.path.join(CUDA_SRC, '*.cu')))
        self.device_headers = sorted(glob.glob(os.path.join(CUDA_SRC, '*.cuh')))
        self.glue, self.cublas_glue = [], []
        for path in sorted(glob.glob(os.path.join(CUDA_SRC, 'glue_*.cpp'))):
            (self.cublas_glue if re.search('cublas', read(path), re.I) else self.glue).append(path)
        self.tests = sorted(glob.glob(os.path.join(ROOT, 'tests/gpu/test_cuda*.cpp')))
        self.test_headers = sorted(glob.glob(os.path.join(ROOT, 'tests/gpu/*.h')))
        self.gen = gen

    def convert(self):
        """Writes the converted files (only those that changed, for ninja); returns their paths."""
        g = self.gen
        wanted = {}
        for src in self.kernels:
            wanted[os.path.join(g, 'kernels', stem(src) + '.cpp')] = ('kernel', src)
        for src in self.device_headers:
            wanted[os.path.join(g, 'include/toy/backend/cuda', os.path.basename(src))] = ('kernel', src)
        for src in self.glue:
            wanted[os.path.join(g, 'glue', stem(src) + '.cpp')] = ('glue', src)
        for src in self.tests:
            wanted[os.path.join(g, 'tests', stem(src) + '.cpp')] = ('test', src)
        for src in self.test_headers:
            wanted[os.path.join(g, 'include/gpu', os.path.basename(src))] = ('test', src)
        for dst, (kind, src) in wanted.items():
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            convert.convert_file(kind, src, dst)
        for old in glob.glob(os.path.join(g, '**/*'), recursive=True):  # (sources since removed)
            if os.path.isfile(old) and old not in wanted and os.path.basename(old) != 'emulated_glue.cpp':
                os.remove(old)


# ---- the build -----------------------------------------------------------------------------------

def ninja_escape_path(p):
    return p.replace('$', '$$').replace(' ', '$ ').replace(':', '$:')


class Build:
    def __init__(self, out, flags, sources, contract):
        self.out, self.flags, self.src = out, flags, sources
        self.mode = 'contract-off' if contract == 'off' else 'contract-fast'
        self.obj = os.path.join(out, 'obj')
        self.kobj = os.path.join(self.obj, 'kernels-' + self.mode)
        self.binary = os.path.join(out, 'emu_tests' + ('' if self.mode == 'contract-fast' else '-' + self.mode))
        self.log_path = os.path.join(out, 'build.log')
        strip = lambda f: ' '.join(t for t in f.split() if not re.match(r'-(O\d|W|g$|g\d)', t))
        base = f"{strip(flags['flags'])} {flags['defines']}"
        gen_inc = f'-I{sources.gen}/include -I{HERE}'
        includes = f"{gen_inc} {flags['includes']} {cuda_include(flags['includes'])}"
        contraction = '-ffp-contract=off' if contract == 'off' else '-ffp-contract=fast'
        if platform.machine() in ('x86_64', 'AMD64'):
            contraction += ' -mno-fma' if contract == 'off' else ' -mfma'
        renames = ' '.join(f'-D{n}={n}_emu_device' for n in device_math_namespaces())
        self.kernel_flags = f'{base} {includes} -O2 -w {contraction} -include {HERE}/emu_cuda.h'
        self.kernel_renames = renames
        self.host_flags = f'{base} {includes} -O1 -w'
        self.objects = {}  # object -> (kind, source)
        for p in sources.kernels:
            self.objects[os.path.join(self.kobj, stem(p) + '.o')] = ('kernel', os.path.join(sources.gen, 'kernels', stem(p) + '.cpp'), p)
        for p in sources.glue:
            self.objects[os.path.join(self.obj, 'glue', stem(p) + '.o')] = ('host', os.path.join(sources.gen, 'glue', stem(p) + '.cpp'), p)
        for p in sources.tests:
            self.objects[os.path.join(self.obj, 'tests', stem(p) + '.o')] = ('host', os.path.join(sources.gen, 'tests', stem(p) + '.cpp'), p)
        self.runtime_obj = os.path.join(self.kobj, 'emu_runtime.o')
        self.harness_obj = os.path.join(self.obj, 'harness.o')
        self.glue_list_src = os.path.join(sources.gen, 'emulated_glue.cpp')
        self.glue_list_obj = os.path.join(self.obj, 'emulated_glue.o')

    def write_ninja(self, link_objects=None):
        e = ninja_escape_path
        lines = [
            '# Written by tools/cuda-emu/emulate.py at each run (scripts/gpu-emulate.sh): do not edit.',
            f"cxx = {self.flags['cxx']}",
            f'kernel_flags = {self.kernel_flags}',
            f'kernel_renames = {self.kernel_renames}',
            f'host_flags = {self.host_flags}',
            f"link_flags = {self.flags['link_flags']}",
            f"link_libs = {self.flags['link_libs']}",
            'rule kernel',
            '  command = rm -f $out && $cxx $kernel_flags $kernel_renames -MD -MF $out.d -c $in -o $out',
            '  depfile = $out.d',
            '  deps = gcc',
            '  description = kernel $in',
            'rule runtime',
            '  command = rm -f $out && $cxx $kernel_flags -MD -MF $out.d -c $in -o $out',
            '  depfile = $out.d',
            '  deps = gcc',
            '  description = emulator $in',
            'rule host',
            '  command = rm -f $out && $cxx $host_flags -MD -MF $out.d -c $in -o $out',
            '  depfile = $out.d',
            '  deps = gcc',
            '  description = host $in',
            'rule link',
            '  command = rm -f $out && $cxx $link_flags $in -o $out $link_libs',
            '  description = link $out',
        ]
        for obj, (kind, src, _) in self.objects.items():
            lines.append(f"build {e(obj)}: {'kernel' if kind == 'kernel' else 'host'} {e(src)}")
        lines.append(f'build {e(self.runtime_obj)}: runtime {e(os.path.join(HERE, "emu_runtime.cpp"))}')
        lines.append(f'build {e(self.harness_obj)}: host {e(os.path.join(HERE, "harness.cpp"))}')
        lines.append('build objects: phony ' + ' '.join(e(o) for o in [*self.objects, self.runtime_obj, self.harness_obj]))
        if link_objects is not None:
            lines.append(f'build {e(self.glue_list_obj)}: host {e(self.glue_list_src)}')
            objs = [*link_objects, self.runtime_obj, self.harness_obj, self.glue_list_obj]
            lines.append(f"build {e(self.binary)}: link {' '.join(e(o) for o in objs)} | {e(self.flags['lib'])}")
        lines.append('default objects')
        write_if_changed(os.path.join(self.out, 'build.ninja'), '\n'.join(lines) + '\n')

    def ninja(self, target, keep_going):
        jobs = os.environ.get('CUDA_EMU_JOBS') or str(os.cpu_count() or 2)
        cmd = ['ninja', '-C', self.out, '-j', jobs] + (['-k', '0'] if keep_going else []) + [target]
        with open(self.log_path, 'a') as logf, BuildLock():
            logf.write(f'\n==== {time.strftime("%H:%M:%S")} {shlex.join(cmd)}\n')
            logf.flush()
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            logf.write(p.stdout)
        return p.returncode, p.stdout


def first_error(ninja_output, obj):
    """The first compiler error line of `obj`'s failed step in ninja's output."""
    lines = ninja_output.splitlines()
    rel = os.path.basename(obj)
    for i, line in enumerate(lines):
        if line.startswith('FAILED:') and rel in line:
            for l in lines[i + 1:]:
                if l.startswith('[') or l.startswith('FAILED:'):
                    break
                if 'error' in l:
                    return l.strip()
    return ''


def symbols(obj, undefined):
    args = ['nm', '--format=just-symbols'] + (['--undefined-only'] if undefined else ['--defined-only'])
    out = subprocess.run(args + [obj], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    return set(out.split())


def linkable(candidates):
    """The candidates (kernel and glue objects) whose toy::cuda references the kept ones define."""
    kept = set(candidates)
    defined = {o: symbols(o, False) for o in kept}
    needs = {o: {s for s in symbols(o, True) if '3toy4cuda' in s} for o in kept}
    while True:
        have = set().union(*(defined[o] for o in kept)) if kept else set()
        drop = {o for o in kept if not needs[o] <= have}
        if not drop:
            return kept
        kept -= drop


def write_glue_list(path, glue_sources, refused):
    lines = ['// Written by tools/cuda-emu/emulate.py: the glue put on sim (see harness.cpp). Do not edit.',
             '#include "refused_kernel.h"', '#include "toy/backend/kernels.h"', '#include "toy/core/registry.h"',
             '', 'namespace toy::cuda {', '']
    functions = [f for src in glue_sources for f in convert.register_functions(read(src))]
    lines += [f'void {f}(Registry& r);' for f in functions]
    lines += ['', 'void register_emulated(Registry& r) {'] + [f'  {f}(r);' for f in functions] + ['}', '']
    lines += ['void register_refused([[maybe_unused]] Registry& r) {']
    lines += [f'  r.add<{sig}>("{name}", Device::SIM, &Refused<"{name}", {sig}>::call);' for sig, name in refused]
    lines += ['}', '', '}  // namespace toy::cuda', '']
    write_if_changed(path, '\n'.join(lines))


# ---- the tests -----------------------------------------------------------------------------------

def gtest_match(name, patterns):
    return any(fnmatch.fnmatchcase(name, p) for p in patterns.split(':') if p)


def filter_selects(name, user_filter):
    positive, _, negative = user_filter.partition('-')
    return gtest_match(name, positive or '*') and not gtest_match(name, negative)


def list_tests(binary):
    with BuildLock():
        p = subprocess.run([binary, '--gtest_list_tests'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise Fatal(f'the test program does not start:\n{p.stderr[-3000:]}')
    names, suite = [], ''
    for line in p.stdout.splitlines():
        if not line.strip() or line.startswith('cuda-emu'):
            continue
        if not line.startswith(' '):
            suite = line.split('#')[0].strip()
        else:
            names.append(suite + line.split('#')[0].strip())
    return names


def source_tests(path):
    return [f'{s}.{n}' for s, n in re.findall(r'^\s*TEST(?:_F|_P)?\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)', read(path), re.M)]


class Results:
    def __init__(self):
        self.passed, self.failed, self.skipped = [], [], []
        self.failure_text = {}


def run_program(cmd, logf, timeout, r):
    """One run of the test program, its output parsed into r as it comes. Returns the tests it
    finished, the test it was in when it ended (None when between tests), that test's output,
    whether it was killed for silence, and its exit status."""
    seen, current, buffer, timed_out = set(), None, [], False
    with BuildLock():
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                timed_out = True
                proc.kill()
                break
            if line is None:
                break
            logf.write(line)
            m = re.match(r'\[ RUN      \] (\S+)', line)
            if m:
                current, buffer = m.group(1), []
                continue
            m = re.match(r'\[ +(OK|FAILED|SKIPPED) +\] (\S+) \(', line)
            if m and m.group(2) == current:
                seen.add(current)
                {'OK': r.passed, 'FAILED': r.failed, 'SKIPPED': r.skipped}[m.group(1)].append(current)
                if m.group(1) == 'FAILED':
                    r.failure_text[current] = ''.join(buffer)
                current = None
                continue
            if current:
                buffer.append(line)
        proc.wait()
    return seen, current, buffer, timed_out, proc.returncode


def run_tests(binary, names, log_path, timeout):
    """Runs the named tests; after a crash (or a test silent for `timeout` s, killed), counts
    that test failed and runs the ones after it. Returns Results."""
    r = Results()
    remaining = list(names)
    with open(log_path, 'w') as logf:
        while remaining:
            cmd = [binary, '--gtest_filter=' + ':'.join(remaining), '--gtest_color=no']
            seen, current, buffer, timed_out, status = run_program(cmd, logf, timeout, r)
            if current is not None:  # it ended in the middle of a test
                seen.add(current)
                r.failed.append(current)
                why = f'no output for {timeout} s: killed\n' if timed_out else f'the program died (status {status})\n'
                r.failure_text[current] = ''.join(buffer[-40:]) + why
                logf.write(f'cuda-emu: {current}: {why}')
            elif status not in (0, 1) and not seen:
                raise Fatal(f'the test program died before its tests (status {status}); see {log_path}')
            remaining = [n for n in remaining if n not in seen]
            if remaining and current is None:  # it ended without reaching them
                for n in remaining:
                    r.failed.append(n)
                    r.failure_text[n] = 'did not run (the program ended before it)\n'
                break
    return r


# ---- main ----------------------------------------------------------------------------------------

def main():
    user_filter = sys.argv[1] if len(sys.argv) > 1 else '*'
    out = os.path.abspath(os.environ.get('CUDA_EMU_BUILD_DIR') or os.path.join(ROOT, 'build-emu'))
    os.makedirs(out, exist_ok=True)
    start = time.time()
    flags = main_build_flags()
    warn_if_library_is_stale(flags['lib'])
    sources = Sources(os.path.join(out, 'gen'))
    sources.convert()
    build = Build(out, flags, sources, os.environ.get('CUDA_EMU_CONTRACT', 'fast'))
    open(build.log_path, 'w').close()

    # 1. every object, going on past the ones that do not compile
    build.write_ninja()
    _, output = build.ninja('objects', keep_going=True)
    for must in (build.runtime_obj, build.harness_obj):
        if not os.path.exists(must):
            raise Fatal(f'the emulator itself does not compile ({os.path.basename(must)}); see {build.log_path}\n'
                        + first_error(output, must))
    broken = {}  # source -> why
    for obj, (_, _, src) in build.objects.items():
        if not os.path.exists(obj):
            broken[src] = 'does not compile: ' + (first_error(output, obj) or f'see {build.log_path}')

    # 2. the kernels and glue that link, the registrations, the program
    candidates = [o for o, (_, _, s) in build.objects.items()
                  if os.path.exists(o) and (s in sources.kernels or s in sources.glue)]
    kept = linkable(candidates + [build.runtime_obj])
    for obj in candidates:
        if obj not in kept:
            broken[build.objects[obj][2]] = 'needs launchers (toy::cuda functions) that did not build'
    glue_kept = [s for o, (_, _, s) in build.objects.items() if o in kept and s in sources.glue]
    refused = [k for s in sources.glue if s not in glue_kept for k in convert.registered_kernels(read(s))]
    write_glue_list(build.glue_list_src, glue_kept, refused)
    tests_kept = [o for o, (_, _, s) in build.objects.items() if s in sources.tests and os.path.exists(o)]
    build.write_ninja(link_objects=[o for o in candidates if o in kept] + tests_kept)
    rc, output = build.ninja(build.binary, keep_going=False)
    if rc != 0:
        tail = '\n'.join(l for l in output.splitlines() if 'error' in l or 'undefined' in l)[:3000]
        raise Fatal(f'the test program does not link; see {build.log_path}\n{tail}')
    built = time.time()

    # 3. the tests
    all_tests = list_tests(build.binary)
    selected = [n for n in all_tests if filter_selects(n, user_filter)]
    if not selected:
        raise Fatal(f'no test matches {user_filter!r}')
    not_emulated = [n for n in selected if any(fnmatch.fnmatchcase(n, p) for p in NOT_EMULATED)]
    to_run = [n for n in selected if n not in not_emulated]
    unbuilt_tests = [n for s in sources.tests if s in broken for n in source_tests(s) if filter_selects(n, user_filter)]
    test_log = os.path.join(out, 'test.log')
    log(f'built in {built - start - BuildLock.waited:.0f} s; running {len(to_run)} tests (log: {os.path.relpath(test_log, ROOT)})')
    timeout = int(os.environ.get('CUDA_EMU_TEST_TIMEOUT', '900'))
    results = run_tests(build.binary, to_run, test_log, timeout) if to_run else Results()

    for name in results.failed:
        print(f'\n---- FAILED {name}\n{results.failure_text.get(name, "").rstrip()}', flush=True)
    if results.failed:
        print(flush=True)
    for src, why in sorted(broken.items()):
        log(f'not emulated: {os.path.relpath(src, ROOT)} {why}')
    skipped = len(not_emulated) + len(unbuilt_tests) + len(results.skipped)
    on_purpose = [f'{p} ({why})' for p, why in NOT_EMULATED.items()]
    on_purpose += [f'{os.path.basename(g)} (calls cuBLAS: its kernels stay the CPU\'s on sim)' for g in sources.cublas_glue]
    log('not emulated on purpose: ' + ', '.join(on_purpose))
    waited = f' (and {BuildLock.waited:.0f} s waiting for {os.environ["TOY_BUILD_LOCK"]})' if BuildLock.waited >= 1 else ''
    log(f'done in {time.time() - start - BuildLock.waited:.0f} s{waited}')
    print(f'emulated GPU tests: {len(results.passed)} passed, {len(results.failed)} failed, {skipped} not emulated',
          flush=True)
    return 1 if results.failed or broken else 0


if __name__ == '__main__':
    try:
        sys.exit(main())
    except Fatal as e:
        print(f'cuda-emu: {e}', file=sys.stderr)
        sys.exit(2)
