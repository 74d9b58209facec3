// The one training loop behind `toy train`, `toy finetune` and `toy vision train` (and the
// step their benchmarks time). A kind of training is a TrainTask: it supplies each
// micro-batch's loss, runs its evaluations when they are due, and writes its checkpoint and
// outputs. The loop owns everything else:
//   the step    micro-batches (forward via the task, loss, backward scaled by 1/accum and by
//               the F16 loss scale), global-norm clipping, AdamW, zeroed gradients; a loss or
//               gradient that is not finite applies nothing (or, under F16 loss scaling,
//               skips the step and halves the scale);
//   the run     warmup + cosine schedule, events.jsonl and the progress line, the best
//               weights (copies of the trainable parameters), stop requests (signals,
//               stop_after) and periodic checkpoints (save_every steps, save_minutes), the
//               final checkpoint before the outputs.
// LoopOptions is the options core the three commands' options extend (their flags and JSON
// field names are those of the commands before; each adds its own).
#pragma once
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "toy/core/error.h"
#include "toy/core/rng.h"
#include "toy/dist/data_parallel.h"
#include "toy/nn/params.h"
#include "toy/obs/events.h"
#include "toy/obs/progress.h"
#include "toy/train/optimizer.h"
#include "toy/train/step_clock.h"

namespace toy {

namespace gguf {
class Reader;
class Writer;
}  // namespace gguf

// ---- the options core ---------------------------------------------------------------------------

struct LoopOptions {
  int64_t batch = 1, accum = 1;
  float lr = 1e-3f, min_lr = 1e-4f;  // min_lr NaN: lr / 10 (finetune's default)
  int64_t warmup = 0;
  float weight_decay = 0, beta1 = 0.9f, beta2 = 0.999f, clip = 1.0f;
  uint64_t seed = 1337;
  int64_t log_every = 10;
  int64_t stop_after = 0;    // stop (with a checkpoint) after this step; 0 = run to the end
  int64_t save_every = 0;    // a checkpoint every N steps (0 = off)
  double save_minutes = 10;  // and at least every M minutes of training (0 = off)
  float moe_aux_loss = 0;    // mixture of experts: the load-balancing loss's weight (0 = off)
  // Not saved with the run: they apply to one invocation.
  bool quiet = false;
  bool force = false;  // a new run may replace a run already in `out`
  Device device = Device::CPU;  // where the weights live and the steps compute (--device)
  // Data-parallel runs (mpirun -np N; see dist/data_parallel.h): per invocation, not saved.
  int zero = 1;               // --zero: 1 shards AdamW's moments over the ranks (ZeRO-1), 0 keeps them whole
  double dp_bucket_mb = 8;    // --dp-bucket-mb: gradient bucket size
  bool dp_overlap = true;     // --dp-overlap: send buckets while backward runs
  double dp_timeout = 300;    // --dp-timeout: seconds any wait for another rank may take

  // Throws toy::Error naming the first nonsense value; `who` ("[train]") starts the message.
  void validate_loop(const char* who) const;
  // The core's fields, under the names the commands' JSON always had.
  void loop_to_json(nlohmann::json& j) const;
  void loop_from_json(const nlohmann::json& j, const std::string& where);
  AdamWConfig adamw() const { return {beta1, beta2, 1e-8f, weight_decay}; }
  dist::DpOptions dp() const { return {zero, dp_bucket_mb, dp_overlap, dp_timeout}; }
};

// ---- the best weights ---------------------------------------------------------------------------

// A copy of every trainable parameter at the best evaluation so far; checkpoints store it as
// best.<parameter name>.
struct BestWeights {
  int64_t step = -1;  // -1: no evaluation kept yet
  double score = NAN, tiebreak = NAN;  // lower is better (vision: -accuracy, then loss)
  std::vector<Tensor> values;          // the trainable parameters', in order

  bool has() const { return step >= 0; }
  // Keeps the parameters' values when (score, tiebreak) beats the best so far (a score that
  // is not finite never does); returns whether it did.
  bool offer(const ParamStore& p, int64_t at_step, double score, double tiebreak = 0);
  // Moves the copies to device d (a resumed run's, read on the CPU).
  void move_to(Device d);
  // Exchanges the parameters' values and the best ones (twice: back as they were).
  void swap_with(ParamStore& p);
  void add_to(gguf::Writer& w, const ParamStore& p) const;
  // Loads best.<name> of every trainable parameter (shapes and finiteness checked).
  void load(const gguf::Reader& rd, const ParamStore& p, int64_t at_step, double score, double tiebreak,
            const char* who);
};

// ---- the state a run saves ----------------------------------------------------------------------

struct LoopState {
  int64_t step = 0;          // steps completed
  double seconds = 0;        // time spent in training steps (all sessions)
  int64_t units = 0;         // tokens or images trained on (all sessions)
  int64_t skipped_steps = 0; // F16: steps skipped for an inf/NaN gradient
  int64_t saved_step = -1;   // step of the last checkpoint written or loaded (-1: none)
  int64_t world_size = 1;    // the processes the run's steps were split over (checkpoints keep it)
  DynamicLossScale loss_scale{1.0f};
  BestWeights best;
};

// ---- the step -----------------------------------------------------------------------------------

// A step whose loss or gradient norm is NaN or infinite (nothing was applied).
class NonFiniteStep : public Error {
 public:
  using Error::Error;
};

// What one step did.
struct StepDone {
  int64_t step = 0;      // 1-based: the step just completed
  bool last = false;     // the run's final step
  double loss = 0;       // mean over the micro-batches
  double grad_norm = 0;  // global gradient norm before clipping
  float lr = 0;
  bool skipped = false;  // F16: the gradient overflowed; nothing applied, the scale halved
  int64_t units = 0;     // tokens or images trained on
  double seconds = 0;
  // Data-parallel: what the ranks agreed on in the step's record, and the step's
  // communication (seconds from sending to delivery; of those, seconds spent waiting).
  bool stop = false, save = false;
  double comm_s = 0, exposed_comm_s = 0;
};

// Which micro-batch a task is asked for: micro-batch `index` of the `count` of 0-based step
// `step`. What a micro-batch draws at random comes from generators addressed by (step, index)
// (Generator::for_micro_batch): the same numbers whichever process runs it, in any order.
struct MicroBatch {
  int64_t step = 0, index = 0, count = 1;
  // The step on the device (the loop's StepClock; null outside take_step): kernels that draw
  // for the micro-batch (dropout) read their counters' base there.
  const Tensor* device_step = nullptr;
  // The generator the micro-batch's kernels draw from (its dropout masks): gen addressed by
  // (step, index), with the step read on the device when there is one.
  Generator draws_from(const Generator& gen) const {
    return device_step ? gen.for_micro_batch(*device_step, index) : gen.for_micro_batch(step, index);
  }
};

class TrainTask {
 public:
  virtual ~TrainTask() = default;
  // The loss of micro-batch `mb` of the step being taken (the graph recorded for backward);
  // adds the tokens or images it trains on to `units`.
  virtual Tensor micro_loss(const MicroBatch& mb, int64_t& units) = 0;
  // Device values the task wants with the step's one read (after the last micro-batch's
  // backward: a training accuracy, say), each read as F32 and handed to read_back in order.
  virtual std::vector<Tensor> step_reads() { return {}; }
  virtual void read_back(const std::vector<std::vector<float>>& /*values*/) {}
  // Counts of the step the task keeps (after read_back: a training accuracy's correct
  // answers); data-parallel, every rank's are summed in rank order and handed back.
  virtual std::vector<float> step_counts() { return {}; }
  virtual void set_step_counts(const std::vector<float>& /*summed*/) {}
  // After each step, before its event is written: the task's own accounting and event fields.
  virtual void after_step(const StepDone& /*done*/, nlohmann::json& /*event*/) {}
  // What is due after the step (evaluations, samples); runs before stop checks and saves.
  virtual void cadence(const StepDone& /*done*/) {}
  // After the last step of a run that was not stopped: the closing evaluation; returns
  // whether it found better weights (they get a checkpoint of their own).
  virtual bool final_evaluation() { return false; }
  virtual void save_checkpoint() {}
  // The run's outputs (model files, their events and messages), after the final checkpoint.
  virtual void write_outputs(bool /*stopped*/) {}
};

struct StepSettings {
  const char* who = "[train]";
  int64_t step = 0;  // 0-based: the step being taken (micro-batches are addressed by it)
  int64_t accum = 1;
  double clip = 0;                 // 0 = off
  bool dynamic_loss_scale = false; // F16
  // Called as each trainable leaf's gradient of a backward pass is whole (BackwardOptions).
  std::function<void(const Tensor&)> on_grad_ready;
  // When set, AdamW advances its step and learning rate on the device (step_on_schedule, at
  // the step clock's position; the `lr` given to take_step is then what the host computed of
  // the same schedule, for logs).
  const LrSchedule* schedule = nullptr;
  // The run's step on the device (dropout counters, the schedule's position); take_step sets
  // it to `step` when it does not hold it and advances it after the step. Null: a clock of
  // the call's own.
  StepClock* clock = nullptr;
  // Data-parallel: this rank's part of the step (null: one process). The step's micro-batches
  // are then accum x ranks; stop/save are this rank's requests for the step's record.
  dist::DataParallel* dp = nullptr;
  bool stop_request = false, save_request = false;
};

// One optimizer step: `accum` micro-batches of the task, clipping, AdamW at lr, gradients
// zeroed. Throws NonFiniteStep (nothing applied, gradients zeroed) when a micro-batch's loss
// or the gradient norm is not finite, unless dynamic loss scaling skips the step instead.
StepDone take_step(TrainTask& task, ParamStore& params, AdamW& opt, DynamicLossScale& scale, const StepSettings& s,
                   float lr);

// ---- the loop -----------------------------------------------------------------------------------

struct LoopSetup {
  const char* who = "[train]";
  std::string dir;                 // the run folder (events.jsonl, report.html)
  bool resumed = false;
  std::FILE* progress = stdout;    // where the progress line goes
  const char* rate_unit = "tok/s"; // progress line
  const char* rate_field = "tokens_per_s";  // step and run_end events
  int64_t total_steps = 1;
  bool dynamic_loss_scale = false;
  std::string resume_command;      // "toy train --resume DIR": said when an output write fails
};

class TrainLoop {
 public:
  TrainLoop(LoopSetup setup, const LoopOptions& o, LoopState& state, ParamStore& params, AdamW& opt,
            TrainTask& task);
  ~TrainLoop();
  EventLog& events() { return events_; }
  // The run's data-parallel part (null: one process).
  dist::DataParallel* data_parallel() { return dp_.get(); }
  ProgressLine& progress() { return progress_; }
  // run_start's data-parallel fields: world_size, zero, shards.
  void add_run_start_fields(nlohmann::json& start) const;
  // Offers the current weights as the best (see BestWeights::offer) at the current step.
  bool offer_best(double score, double tiebreak = 0);
  // Called with each gradient as it is whole (data-parallel reduction hangs on it).
  void set_on_grad_ready(std::function<void(const Tensor&)> f) { on_grad_ready_ = std::move(f); }
  // Writes a checkpoint through the task and an event.
  void checkpoint(const char* reason);
  // Runs the steps left; returns whether the run stopped early (resumable). `end_fields`
  // adds the task's fields to run_end.
  bool run(const std::function<nlohmann::json()>& end_fields);
  double session_seconds() const;

 private:
  // Ends the run after an error at `step` (`where`: "at" the step, or "after" it, in its
  // evaluation or save), naming the files kept and, data-parallel, how to continue.
  [[noreturn]] void fail_step(const std::string& what, const char* where, int64_t step,
                              const std::function<nlohmann::json()>& end_fields);
  void end_events(bool stopped, const nlohmann::json& extra, const std::function<nlohmann::json()>& end_fields);
  [[noreturn]] void say_where_to_resume(const Error& e);

  LoopSetup setup_;
  const LoopOptions& o_;
  LoopState& st_;
  ParamStore& params_;
  AdamW& opt_;
  TrainTask& task_;
  ProgressLine progress_;
  EventLog events_;
  std::function<void(const Tensor&)> on_grad_ready_;
  std::chrono::steady_clock::time_point session_start_;
  std::unique_ptr<dist::DataParallel> dp_;
};

// Whether this process writes the run's files and speaks for it (rank 0 of a data-parallel
// run; always, alone).
bool writes_run_files();
// The type a --precision option names products in: f32 (mixed precision off), bf16 or f16.
DType precision_type(const std::string& precision);
// Refuses a data-parallel launch the options cannot run (a device other than the CPU).
void check_data_parallel(const LoopOptions& o, const char* who);
// The micro-batches per process that keep a resumed run's global batch (accum x the
// processes it was saved by) over this launch's processes; refuses when they do not divide it.
int64_t accum_for_world(int64_t saved_accum, int64_t saved_world, const char* who, const std::string& dir,
                        const char* command);

}  // namespace toy
