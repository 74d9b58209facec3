#!/usr/bin/python3
"""ggml quantization reference fixture: tests/fixtures/ggml_quant_blocks.bin

Quantizes seeded float32 rows with ggml's own reference quantizers and dequantizers, taken
from the prebuilt libggml-base.so that the npm package node-llama-cpp ships (llama.cpp as
pinned by node-llama-cpp 3.21.1), so toy's block codecs (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) can be checked byte for byte against ggml.

Regenerate (any python3 >= 3.8; standard library only, no numpy needed):

    (cd tools/llamacpp && npm ci)
    python3 tools/llamacpp/make_quant_fixture.py            # writes tests/fixtures/ggml_quant_blocks.bin
    python3 tools/llamacpp/make_quant_fixture.py --out F    # elsewhere

The library is found under tools/llamacpp/node_modules/@node-llama-cpp/*/bins/*/libggml-base.so
(linux-x64 preferred), or set TOY_GGML_BASE_LIB=/path/to/libggml-base.so. The output is
deterministic: each case draws its values from random.Random(seed) with a fixed seed.

ggml functions used (all exported by libggml-base.so):
    void   quantize_row_<t>_ref(const float *x, block_<t> *y, int64_t k)
    void   dequantize_row_<t>(const block_<t> *x, float *y, int64_t k)
    size_t ggml_quantize_chunk(enum ggml_type, const float *src, void *dst, int64_t start,
                               int64_t nrows, int64_t n_per_row, const float *imatrix)
           (cross-check only: with imatrix = NULL it must give the same bytes as *_ref)
    bool   ggml_validate_row_data(enum ggml_type, const void *data, size_t nbytes)
    int64_t ggml_blck_size(enum ggml_type); size_t ggml_type_size(enum ggml_type)

File format (all little-endian):
    header:  8 bytes magic b"GGQBLK01", u32 n_cases
    n_cases times:
        u32      type       ggml type id: Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
                            Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14
        u32      n          number of values (a multiple of 256, so of every block size)
        char[16] name       case name, ASCII, NUL-padded (e.g. "gauss", "zero", "neg")
        f32[n]   input      the values given to quantize_row_<t>_ref
        u8[n / B * S]       the blocks quantize_row_<t>_ref wrote, (B, S) = block values, bytes:
                            Q8_0 (32, 34), Q4_0 (32, 18), Q4_1 (32, 20), Q5_0 (32, 22),
                            Q5_1 (32, 24), Q2_K (256, 84), Q3_K (256, 110), Q4_K (256, 144),
                            Q5_K (256, 176), Q6_K (256, 210)
        f32[n]   output     dequantize_row_<t> of those blocks
Block layouts (ggml-common.h): q8_0 {f16 d; i8 qs[32]}, q4_0 {f16 d; u8 qs[16]},
q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}, q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}.

Cases per type (n): gauss (512), small (512, values ~1e-3), large (512, ~1e3), neg (512, all
negative), pos (512, all positive with an offset, so Q4_K mins clamp to 0), subblk (1024,
magnitude and offset drawn per 16 values over 2.5 decades, so that the 6-bit Q4_K scales and
mins cover 0..63, including >= 16 in sub-blocks 4..7 whose high bits are packed into
scales[0..7], and Q6_K scales of both signs), outlier (512, a few spikes), zero (256, all 0),
tiny (256, ~1e-7, where the f16 scales underflow). The script asserts that, over each type,
every 4-bit (Q4_0, Q4_1, Q4_K) / 5-bit (Q5_0, Q5_1, Q5_K) / 6-bit (Q6_K) code value
occurs in every position class, Q8_0 codes reach
+-127, and the Q4_K high scale/min bits are exercised, and that the file stays under 600 KB.
"""
import argparse
import ctypes
import glob
import hashlib
import math
import os
import random
import struct
import sys
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "ggml_quant_blocks.bin")
MAGIC = b"GGQBLK01"

# name -> (ggml type id, block values, block bytes)
TYPES = {
    "q8_0": (8, 32, 34),
    "q4_0": (2, 32, 18),
    "q4_K": (12, 256, 144),
    "q6_K": (14, 256, 210),
    "q4_1": (3, 32, 20),
    "q5_0": (6, 32, 22),
    "q5_1": (7, 32, 24),
    "q2_K": (10, 256, 84),
    "q3_K": (11, 256, 110),
    "q5_K": (13, 256, 176),
}


def find_lib():
    env = os.environ.get("TOY_GGML_BASE_LIB")
    if env:
        return env
    base = os.path.join(HERE, "node_modules", "@node-llama-cpp")
    prefer = glob.glob(os.path.join(base, "linux-x64", "bins", "*", "libggml-base.so"))
    found = prefer or sorted(glob.glob(os.path.join(base, "*", "bins", "*", "libggml-base.so")))
    if not found:
        sys.exit("make_quant_fixture.py: libggml-base.so not found under %s; "
                 "run `npm ci` in tools/llamacpp or set TOY_GGML_BASE_LIB" % base)
    return found[0]


def load_ggml(path):
    lib = ctypes.CDLL(path)
    i64, vp, fp = ctypes.c_int64, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)
    for t in TYPES:
        q = getattr(lib, "quantize_row_%s_ref" % t)
        q.argtypes, q.restype = [fp, vp, i64], None
        d = getattr(lib, "dequantize_row_%s" % t)
        d.argtypes, d.restype = [vp, fp, i64], None
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, fp, vp, i64, i64, i64, fp]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_validate_row_data.argtypes = [ctypes.c_int, vp, ctypes.c_size_t]
    lib.ggml_validate_row_data.restype = ctypes.c_bool
    lib.ggml_blck_size.argtypes, lib.ggml_blck_size.restype = [ctypes.c_int], i64
    lib.ggml_type_size.argtypes, lib.ggml_type_size.restype = [ctypes.c_int], ctypes.c_size_t
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    return lib


def f32_ptr(a):
    addr, _ = a.buffer_info()
    return ctypes.cast(addr, ctypes.POINTER(ctypes.c_float))


def quantize(lib, tname, values):
    tid, blk, nbytes = TYPES[tname]
    n = len(values)
    x = array("f", values)
    size = n // blk * nbytes
    y = ctypes.create_string_buffer(size)
    getattr(lib, "quantize_row_%s_ref" % tname)(f32_ptr(x), y, n)
    blocks = y.raw
    # cross-checks: ggml_quantize_chunk (imatrix NULL) gives the same bytes, and ggml accepts them
    y2 = ctypes.create_string_buffer(size)
    got = lib.ggml_quantize_chunk(tid, f32_ptr(x), y2, 0, 1, n, None)
    assert got == size and y2.raw == blocks, "%s: ggml_quantize_chunk != quantize_row_ref" % tname
    assert lib.ggml_validate_row_data(tid, y, size), "%s: ggml_validate_row_data failed" % tname
    out = array("f", bytes(4 * n))
    getattr(lib, "dequantize_row_%s" % tname)(y, f32_ptr(out), n)
    return x, blocks, out


# ---- seeded inputs ---------------------------------------------------------------------------

def gen_case(kind, n, seed):
    r = random.Random(seed)
    g = r.gauss
    if kind == "gauss":
        return [g(0.0, 1.0) for _ in range(n)]
    if kind == "small":
        return [g(0.0, 1e-3) for _ in range(n)]
    if kind == "large":
        return [g(0.0, 1e3) for _ in range(n)]
    if kind == "neg":
        return [-(abs(g(0.0, 2.0)) + 0.25) for _ in range(n)]
    if kind == "pos":
        return [r.uniform(1.0, 3.0) for _ in range(n)]
    if kind == "subblk":
        v = []
        for _ in range(n // 16):
            mag = 10.0 ** r.uniform(-2.0, 0.5)
            off = r.uniform(-1.0, 1.0) * mag
            v += [off + mag * g(0.0, 1.0) for _ in range(16)]
        return v
    if kind == "outlier":
        v = [g(0.0, 0.1) for _ in range(n)]
        for _ in range(max(1, n // 100)):
            v[r.randrange(n)] = r.choice((-1.0, 1.0)) * r.uniform(5.0, 50.0)
        return v
    if kind == "zero":
        return [0.0] * n
    if kind == "tiny":
        return [g(0.0, 1e-7) for _ in range(n)]
    raise ValueError(kind)


CASES = [("gauss", 512), ("small", 512), ("large", 512), ("neg", 512), ("pos", 512),
         ("subblk", 1024), ("outlier", 512), ("zero", 256), ("tiny", 256)]


# ---- coverage checks (decode the block bytes independently of ggml) ---------------------------

def coverage(tname, all_blocks):
    _, _, nbytes = TYPES[tname]
    cov = {}
    if tname == "q8_0":
        codes = set()
        for b in all_blocks:
            for o in range(0, len(b), nbytes):
                codes.update(struct.unpack_from("<32b", b, o + 2))
        cov["min_code"], cov["max_code"] = min(codes), max(codes)
        cov["distinct_codes"] = len(codes)
        assert cov["min_code"] <= -127 and cov["max_code"] >= 127 and len(codes) >= 250, cov
    elif tname == "q4_0":
        lo, hi = set(), set()
        for b in all_blocks:
            for o in range(0, len(b), nbytes):
                for q in b[o + 2:o + 18]:
                    lo.add(q & 15)
                    hi.add(q >> 4)
        cov["low_nibbles"], cov["high_nibbles"] = len(lo), len(hi)
        assert len(lo) == 16 and len(hi) == 16, cov
    elif tname == "q4_K":
        lo, hi, sc_hi, mn_hi, sc_all, mn_all = set(), set(), 0, 0, set(), set()
        for b in all_blocks:
            for o in range(0, len(b), nbytes):
                s = b[o + 4:o + 16]
                for j in range(8):
                    if j < 4:
                        sc, mn = s[j] & 63, s[j + 4] & 63
                    else:
                        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4)
                        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
                        sc_hi += sc >= 16
                        mn_hi += mn >= 16
                    sc_all.add(sc)
                    mn_all.add(mn)
                for q in b[o + 16:o + 144]:
                    lo.add(q & 15)
                    hi.add(q >> 4)
        cov.update(low_nibbles=len(lo), high_nibbles=len(hi), scales_ge16_in_sub4to7=sc_hi,
                   mins_ge16_in_sub4to7=mn_hi, distinct_scales=len(sc_all),
                   distinct_mins=len(mn_all), max_scale=max(sc_all), max_min=max(mn_all))
        assert len(lo) == 16 and len(hi) == 16 and sc_hi > 0 and mn_hi > 0, cov
        assert max(sc_all) == 63 and max(mn_all) == 63 and 0 in mn_all, cov
    elif tname == "q6_K":
        q6, scales = set(), set()
        for b in all_blocks:
            for o in range(0, len(b), nbytes):
                ql, qh = b[o:o + 128], b[o + 128:o + 192]
                scales.update(struct.unpack_from("<16b", b, o + 192))
                # dequantize_row_q6_K's unpacking, per 128-value half
                for h in range(2):
                    L, H = ql[64 * h:64 * h + 64], qh[32 * h:32 * h + 32]
                    for l in range(32):
                        q6.add((L[l] & 15) | (((H[l] >> 0) & 3) << 4))
                        q6.add((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4))
                        q6.add((L[l] >> 4) | (((H[l] >> 4) & 3) << 4))
                        q6.add((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4))
        cov.update(distinct_q6=len(q6), min_scale=min(scales), max_scale=max(scales),
                   negative_scales=sum(1 for s in scales if s < 0))
        assert len(q6) == 64 and min(scales) < 0 < max(scales), cov
    elif tname in ("q4_1",):
        lo, hi = set(), set()
        for b in all_blocks:
            for o in range(0, len(b), nbytes):
                for q in b[o + 4:o + 20]:
                    lo.add(q & 15)
                    hi.add(q >> 4)
        cov["low_nibbles"], cov["high_nibbles"] = len(lo), len(hi)
        assert len(lo) == 16 and len(hi) == 16, cov
    elif tname in ("q5_0", "q5_1"):
        off = 2 if tname == "q5_0" else 4
        first, second = set(), set()
        for b in all_blocks:
            for o in range(0, len(b), nbytes):
                qh = struct.unpack_from("<I", b, o + off)[0]
                qs = b[o + off + 4:o + off + 20]
                for j in range(16):
                    first.add((qs[j] & 15) | (((qh >> j) & 1) << 4))
                    second.add((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4))
        cov["first_half_codes"], cov["second_half_codes"] = len(first), len(second)
        assert len(first) == 32 and len(second) == 32, cov
    elif tname == "q5_K":
        codes = set()
        for b in all_blocks:
            for o in range(0, len(b), nbytes):
                qh, ql = b[o + 16:o + 48], b[o + 48:o + 176]
                for c in range(4):
                    for l in range(32):
                        codes.add((c, 0, (ql[32 * c + l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4)))
                        codes.add((c, 1, (ql[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)))
        cov["codes_per_position_class"] = len(codes)
        assert len(codes) >= 4 * 2 * 30, cov  # every fifth bit of qh, nearly every code
    elif tname in ("q2_K", "q3_K"):
        # decode-only in toy: coverage of the scale bytes is what matters
        sc = set()
        for b in all_blocks:
            for o in range(0, len(b), nbytes):
                sc.update(b[o:o + 16] if tname == "q2_K" else b[o + 96:o + 108])
        cov["distinct_scale_bytes"] = len(sc)
        assert len(sc) >= 64, cov
    return cov


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()

    path = find_lib()
    lib = load_ggml(path)
    print("ggml: %s" % (os.path.relpath(path, REPO) if path.startswith(REPO) else path))

    out = bytearray(MAGIC)
    out += struct.pack("<I", len(TYPES) * len(CASES))
    for ti, (tname, (tid, blk, nbytes)) in enumerate(TYPES.items()):
        assert lib.ggml_blck_size(tid) == blk and lib.ggml_type_size(tid) == nbytes, tname
        assert not lib.ggml_quantize_requires_imatrix(tid), tname
        blocks_all = []
        errs = []
        for ci, (kind, n) in enumerate(CASES):
            assert n % 256 == 0
            vals = gen_case(kind, n, seed=1000 * (ti + 1) + ci)
            x, blocks, deq = quantize(lib, tname, vals)
            blocks_all.append(blocks)
            amax = max(abs(v) for v in x) or 1.0
            errs.append("%s %.3g" % (kind, max(abs(a - b) for a, b in zip(x, deq)) / amax))
            assert all(math.isfinite(v) for v in deq), (tname, kind)
            out += struct.pack("<II16s", tid, n, kind.encode("ascii"))
            out += x.tobytes() + blocks + deq.tobytes()
        print("%-5s (ggml type %d): max|x - deq| / max|x| per case: %s\n      coverage %s"
              % (tname, tid, ", ".join(errs), coverage(tname, blocks_all)))

    assert sys.byteorder == "little"
    assert len(out) < 600 * 1024, len(out)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(out)
    print("wrote %s: %d bytes, sha256 %s" % (args.out, len(out), hashlib.sha256(out).hexdigest()))


if __name__ == "__main__":
    main()
