// A toy built without MPI (TOY_MPI=OFF: CI's sanitizer build) started by a launcher as
// several processes refuses before it writes anything: each would train alone into one folder.
#include <gtest/gtest.h>

#include <filesystem>

#include "proc.h"
#include "toy/dist/comm.h"

namespace fs = std::filesystem;
using toy::test::describe;
using toy::test::ProcOptions;
using toy::test::ProcResult;
using toy::test::run_toy;

// (Runs in every build: only a toy built without MPI has this refusal to show.)
TEST(DataParallelRefusal, AToyWithoutMpiStartedAsSeveralProcessesRefuses) {
  if (toy::dist::built_with_mpi()) GTEST_SKIP() << "this toy has MPI (the TOY_MPI=OFF build checks the refusal)";
  ProcOptions o;
  o.env = {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1"};
  const std::string dir = (fs::path(::testing::TempDir()) / ("toy_nompi_" + std::to_string(getpid()))).string();
  ProcResult r = run_toy({"train", "--out", dir, "--steps", "1", "--layers", "1", "--dim", "32", "--heads", "2"}, o);
  EXPECT_EQ(r.status, 1) << describe(r);
  EXPECT_NE(r.err.find("toy was built without MPI: the 2 processes would each train alone into the same folder"),
            std::string::npos)
      << describe(r);
  EXPECT_FALSE(fs::exists(dir));
}
