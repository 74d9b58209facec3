// Functions shared by the CUDA kernels and the host: the per-element math of a kernel lives in
// a TOY_HD function, so nvcc compiles it into the kernel and the C++ compiler into a host test
// that checks it against the CPU backend on a machine without a GPU.
#pragma once

#if defined(__CUDACC__)
#define TOY_HD __host__ __device__ __forceinline__
#else
#define TOY_HD inline
#endif
