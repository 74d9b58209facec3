// The tests' main: as toy's own, it first gives OpenBLAS the kernels this CPU has when OpenBLAS
// fell back to older ones (core/blas_core.h), so tests run at the speed users see.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "toy/core/blas_core.h"

int main(int argc, char** argv) {
  toy::reexec_with_openblas_core(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
