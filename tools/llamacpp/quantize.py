#!/usr/bin/env python3
"""llama.cpp's own quantizer (llama_model_quantize in node-llama-cpp 3.21.1's prebuilt
libllama), for checking `toy quantize` tensor for tensor.

    python3 tools/llamacpp/quantize.py IN.gguf OUT.gguf FTYPE

FTYPE is llama.cpp's LLAMA_FTYPE number (1 F16, 2 Q4_0, 7 Q8_0, 8 Q5_0, 14 Q4_K_S, 15 Q4_K_M,
18 Q6_K, 32 BF16, ...). Default parameters otherwise (no imatrix, output tensor quantized), one
thread. Standard library only. The struct below mirrors llama_model_quantize_params in the
snapshot's include/llama.h.
"""
import ctypes
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class Params(ctypes.Structure):
    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int), ("output_tensor_type", ctypes.c_int),
                ("token_embedding_type", ctypes.c_int), ("allow_requantize", ctypes.c_bool),
                ("quantize_output_tensor", ctypes.c_bool), ("only_copy", ctypes.c_bool), ("pure", ctypes.c_bool),
                ("keep_split", ctypes.c_bool), ("dry_run", ctypes.c_bool), ("imatrix", ctypes.c_void_p),
                ("kv_overrides", ctypes.c_void_p), ("tt_overrides", ctypes.c_void_p),
                ("prune_layers", ctypes.c_void_p), ("max_buf_size", ctypes.c_size_t)]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    bins = glob.glob(os.path.join(HERE, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "*"))
    if not bins:
        sys.exit("quantize.py: node-llama-cpp's linux-x64 binaries not found: run npm ci in tools/llamacpp")
    d = bins[0]
    ctypes.CDLL(os.path.join(d, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(glob.glob(os.path.join(d, "libggml.*so"))[0], mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(glob.glob(os.path.join(d, "libllama.*so"))[0], mode=ctypes.RTLD_GLOBAL)
    lib.llama_model_quantize_default_params.restype = Params
    lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Params)]
    lib.llama_model_quantize.restype = ctypes.c_uint32
    lib.llama_backend_init()
    p = lib.llama_model_quantize_default_params()
    p.ftype = int(sys.argv[3])
    p.nthread = 1
    rc = lib.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p))
    sys.exit(0 if rc == 0 else "quantize.py: llama_model_quantize returned %d" % rc)


if __name__ == "__main__":
    main()
