// Checkpoints as `toy train --resume` reads them: format version, training options and state
// JSON, the model, AdamW moments and best weights, each validated before use.
#include "fuzz_common.h"
#include "toy/io/gguf.h"
#include "toy/train/run_state.h"

using namespace toy;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    gguf::Reader r("checkpoint.gguf", data, size);
    Run run;
    load_checkpoint(run, r, "fuzz-run");
    FUZZ_ASSERT(run.loop.step >= 0 && run.loop.step <= run.o.steps);
    FUZZ_ASSERT(run.model && run.opt && run.tok);
    for (const Tensor& p : run.model->params().values()) FUZZ_ASSERT(first_non_finite(p) < 0);
  } catch (const Error&) {
  }
  return 0;
}
