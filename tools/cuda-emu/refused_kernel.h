// cuda-emu: a stand-in for a kernel whose glue or CUDA source did not build in the emulator
// (emulated_glue.cpp registers one for sim per kernel such glue registers for cuda). Called,
// it fails naming the kernel: the tests that use it fail instead of comparing the CPU kernel
// (left on sim otherwise) with itself.
#pragma once
#include <algorithm>
#include <cstddef>

#include "toy/core/error.h"

namespace toy::cuda {

template <size_t N>
struct KernelName {
  char text[N];
  constexpr KernelName(const char (&s)[N]) { std::copy_n(s, N, text); }
};

template <KernelName Name, class Fn>
struct Refused;

template <KernelName Name, class R, class... A>
struct Refused<Name, R(A...)> {
  static R call(A...) {
    fail("[cuda-emu] the {} kernel is not emulated: its glue or CUDA source did not build in the emulator "
         "(scripts/gpu-emulate.sh names the file; its errors are in build-emu/build.log)",
         Name.text);
  }
};

}  // namespace toy::cuda
