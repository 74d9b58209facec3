#include "toy/train/loop.h"

#include "toy/core/device_access.h"

#include <filesystem>

#include <fmt/core.h>

#include "toy/autograd/backward.h"
#include "toy/autograd/grad_mode.h"
#include "toy/core/json_fields.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"
#include "toy/obs/report.h"
#include "toy/ops/ops.h"
#include "toy/train/run_state.h"
#include "toy/train/trainer.h"

namespace fs = std::filesystem;

namespace toy {

// ---- the options core ---------------------------------------------------------------------------

void LoopOptions::validate_loop(const char* who) const {
  TOY_CHECK(batch > 0 && batch <= 1 << 20, "{} --batch must be in 1..1048576, got {}", who, batch);
  TOY_CHECK(accum > 0 && accum <= 1 << 16, "{} --accum must be in 1..65536, got {}", who, accum);
  TOY_CHECK(std::isfinite(lr) && lr > 0, "{} --lr must be positive, got {}", who, lr);
  TOY_CHECK(std::isnan(min_lr) || (min_lr >= 0 && min_lr <= lr), "{} --min-lr must be in [0, lr], got {}", who,
            min_lr);
  TOY_CHECK(warmup >= 0, "{} --warmup must be >= 0, got {}", who, warmup);
  TOY_CHECK(std::isfinite(weight_decay) && weight_decay >= 0, "{} --wd must not be negative, got {}", who,
            weight_decay);
  TOY_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "{} --beta1/--beta2 must be in [0, 1), got {} and {}",
            who, beta1, beta2);
  TOY_CHECK(std::isfinite(clip) && clip >= 0, "{} --clip must be >= 0 (0 = off), got {}", who, clip);
  TOY_CHECK(log_every > 0, "{} --log-every must be >= 1, got {}", who, log_every);
  TOY_CHECK(stop_after >= 0, "{} --stop-after must be >= 0, got {}", who, stop_after);
  TOY_CHECK(save_every >= 0, "{} --save-every must be >= 0 (0 = off), got {}", who, save_every);
  TOY_CHECK(std::isfinite(moe_aux_loss) && moe_aux_loss >= 0 && moe_aux_loss <= 100,
            "{} --moe-aux-loss must be in [0, 100], got {}", who, moe_aux_loss);
  TOY_CHECK(std::isfinite(save_minutes) && save_minutes >= 0 && save_minutes <= 1e6,
            "{} --save-minutes must be in [0, 1e6] (0 = off), got {}", who, save_minutes);
  TOY_CHECK(zero == 0 || zero == 1, "{} --zero must be 0 or 1, got {}", who, zero);
  TOY_CHECK(std::isfinite(dp_bucket_mb) && dp_bucket_mb > 0 && dp_bucket_mb <= 4096,
            "{} --dp-bucket-mb must be in (0, 4096], got {}", who, dp_bucket_mb);
  TOY_CHECK(std::isfinite(dp_timeout) && dp_timeout >= 1 && dp_timeout <= 86400,
            "{} --dp-timeout must be in 1..86400 seconds, got {}", who, dp_timeout);
}

void LoopOptions::loop_to_json(nlohmann::json& j) const {
  j["batch"] = batch;
  j["accum"] = accum;
  j["lr"] = json_float(lr);
  j["min_lr"] = json_float(std::isnan(min_lr) ? lr / 10 : min_lr);
  j["warmup"] = warmup;
  j["weight_decay"] = json_float(weight_decay);
  j["beta1"] = json_float(beta1);
  j["beta2"] = json_float(beta2);
  j["clip"] = json_float(clip);
  j["seed"] = seed;
  j["log_every"] = log_every;
  j["stop_after"] = stop_after;
  j["save_every"] = save_every;
  j["save_minutes"] = save_minutes;
  j["moe_aux_loss"] = json_float(moe_aux_loss);  // (runs saved before it load without: 0)
}

void LoopOptions::loop_from_json(const nlohmann::json& j, const std::string& where) {
  using namespace json_fields;
  batch = get_int(j, "batch", where);
  accum = get_int(j, "accum", where);
  lr = get_float(j, "lr", where);
  min_lr = get_float(j, "min_lr", where);
  warmup = get_int(j, "warmup", where);
  weight_decay = get_float(j, "weight_decay", where);
  beta1 = get_float(j, "beta1", where);
  beta2 = get_float(j, "beta2", where);
  clip = get_float(j, "clip", where);
  seed = get_uint(j, "seed", where);
  log_every = get_int(j, "log_every", where);
  stop_after = get_int(j, "stop_after", where);
  save_every = get_int(j, "save_every", where);
  save_minutes = get_double(j, "save_minutes", where);
  moe_aux_loss = j.contains("moe_aux_loss") ? get_float(j, "moe_aux_loss", where) : 0.0f;
}

// ---- the best weights ---------------------------------------------------------------------------

bool BestWeights::offer(const ParamStore& p, int64_t at_step, double s, double t) {
  if (!std::isfinite(s)) return false;
  if (has() && !(s < score || (s == score && t < tiebreak))) return false;
  NoGradGuard ng;
  size_t i = 0;
  for (const Param& q : p.all()) {
    if (!q.trainable) continue;
    if (values.size() <= i) values.push_back(empty(q.value.shape(), q.value.dtype(), q.value.device()));
    copy_(values[i++], q.value.detach());
  }
  step = at_step, score = s, tiebreak = t;
  return true;
}

void BestWeights::move_to(Device d) {
  for (Tensor& v : values) v = transfer(v, d);
}

void BestWeights::swap_with(ParamStore& p) {
  NoGradGuard ng;
  size_t i = 0;
  for (Param& q : p.all()) {
    if (!q.trainable) continue;
    Tensor now = contiguous_copy(q.value.detach());
    copy_(q.value, values[i]);
    values[i++] = now;
  }
}

void BestWeights::add_to(gguf::Writer& w, const ParamStore& p) const {
  if (!has()) return;
  size_t i = 0;
  for (const Param& q : p.all())
    if (q.trainable) w.add_tensor("best." + q.name, values[i++]);
}

void BestWeights::load(const gguf::Reader& rd, const ParamStore& p, int64_t at_step, double s, double t,
                       const char* who) {
  values.clear();
  step = at_step, score = s, tiebreak = t;
  if (!has()) return;
  for (const Param& q : p.all()) {
    if (!q.trainable) continue;
    Tensor host = zeros(q.value.shape());
    load_checked(rd, "best." + q.name, host, false, who);
    values.push_back(transfer(host, q.value.device()));
  }
}

// ---- the step -----------------------------------------------------------------------------------

StepDone take_step(TrainTask& task, ParamStore& params, AdamW& opt, DynamicLossScale& loss_scale,
                   const StepSettings& s, float lr) {
  // A non-finite loss or gradient stops the step before the update: the weights and the
  // optimizer state stay those of the last good step.
  auto refuse = [&](const std::string& what) {
    params.zero_grad();
    throw NonFiniteStep(fmt::format("{} {}: the step was not applied (try a lower --lr or --clip)", s.who, what));
  };
  dist::DataParallel* dp = s.dp;
  // Data-parallel: this rank runs micro-batches rank, rank + N, ... of the step's accum x N.
  const int64_t ranks = dp ? dp->size() : 1, me = dp ? dp->rank() : 0, global = s.accum * ranks;
  StepDone d;
  d.lr = lr;
  BackwardOptions bo;
  bo.on_grad_ready = s.on_grad_ready;
  if (dp) {
    dp->begin_step(s.step);
    bo.on_grad_ready = [dp, user = s.on_grad_ready](const Tensor& t) {
      dp->grad_ready(t);
      if (user) user(t);
    };
  }
  // The micro-batches' losses stay on the device until the step's one read, with the
  // gradients' squared norms. (A loss that is not finite gives gradients that are not either:
  // nothing is applied whichever is found first.)
  std::vector<Tensor> reads;
  StepClock own_clock;
  StepClock& clock = s.clock ? *s.clock : own_clock;
  const Tensor& device_step = clock.at(s.step, params.device());
  int64_t units = 0;
  for (int64_t micro = 0; micro < s.accum; ++micro) {
    if (dp) dp->begin_micro();
    Tensor loss = task.micro_loss(MicroBatch{s.step, me + ranks * micro, global, &device_step}, units);
    Tensor l = reshape(loss.detach(), Shape{1});
    reads.push_back(l.dtype() == DType::F32 ? l : cast(l, DType::F32));
    const float k = loss_scale.scale() / float(global);
    backward(k == 1.0f ? loss : scale(loss, k), Tensor(), bo);
    if (dp) dp->end_micro();
  }
  if (dp) dp->finish_gradients();
  if (s.dynamic_loss_scale) scale_grads(params, 1.0f / loss_scale.scale());
  // One read: the micro-batches' losses, the gradients' squared norms, then the task's values.
  const Tensor norms = grad_square_norms(params);
  const size_t n_norms = norms.defined() ? size_t(norms.numel()) : 0;
  if (norms.defined()) reads.push_back(norms);
  std::vector<int64_t> extra_sizes;
  for (const Tensor& t : task.step_reads()) {
    extra_sizes.push_back(t.numel());
    Tensor flat = reshape(t.detach(), Shape{t.numel()});
    reads.push_back(flat.dtype() == DType::F32 ? flat : cast(flat, DType::F32));
  }
  const std::vector<float> read = (reads.size() == 1 ? reads[0] : concat(reads, 0)).to_f32_vector();  // the read
  if (!extra_sizes.empty()) {
    std::vector<std::vector<float>> extra;
    auto at = read.begin() + ptrdiff_t(size_t(s.accum) + n_norms);
    for (int64_t n : extra_sizes) extra.emplace_back(at, at + ptrdiff_t(n)), at += ptrdiff_t(n);
    task.read_back(extra);
  }
  // The step's losses in micro-batch order and its gradients' squared norms in parameter
  // order: this rank's, or (data-parallel) every rank's from the step's record.
  std::vector<float> losses(read.begin(), read.begin() + s.accum);
  std::vector<float> square_norms(read.begin() + s.accum, read.begin() + ptrdiff_t(size_t(s.accum) + n_norms));
  if (dp) {
    dist::StepRecord mine;
    mine.losses = losses;
    mine.units = units;
    if (dp->options().zero == 1) mine.square_norms = square_norms;  // (zero 0: every rank has them all)
    mine.stop = s.stop_request, mine.save = s.save_request && me == 0;
    mine.task_reads = task.step_counts();
    const std::vector<dist::StepRecord> all = dp->exchange(mine);
    std::vector<float> counts(mine.task_reads.size(), 0.0f);
    for (const dist::StepRecord& rec : all) {
      TOY_CHECK(rec.task_reads.size() == counts.size(), "[dist] the ranks' step records disagree");
      for (size_t i = 0; i < counts.size(); ++i) counts[i] += rec.task_reads[i];
    }
    if (!counts.empty()) task.set_step_counts(counts);
    losses.assign(size_t(global), 0.0f);
    units = 0;
    if (dp->options().zero == 1) square_norms.clear();
    for (int64_t r = 0; r < ranks; ++r) {
      const dist::StepRecord& rec = all[size_t(r)];
      TOY_CHECK(int64_t(rec.losses.size()) == s.accum, "[dist] rank {} ran {} micro-batches, this rank {}", r,
                rec.losses.size(), s.accum);
      for (int64_t m = 0; m < s.accum; ++m) losses[size_t(r + ranks * m)] = rec.losses[size_t(m)];
      units += rec.units;
      if (dp->options().zero == 1) square_norms.insert(square_norms.end(), rec.square_norms.begin(), rec.square_norms.end());
      d.stop = d.stop || rec.stop;
      d.save = d.save || rec.save;
    }
  }
  d.units += units;
  double loss_sum = 0;
  for (int64_t micro = 0; micro < global; ++micro) {
    const double l = losses[size_t(micro)];
    if (!std::isfinite(l))
      refuse(fmt::format("the loss became {}{}", l, global > 1 ? fmt::format(" in micro-batch {}", micro + 1) : ""));
    loss_sum += l;
  }
  d.grad_norm = clip_grad_norm_from(params, square_norms, s.clip);
  if (s.dynamic_loss_scale && !loss_scale.update(std::isfinite(d.grad_norm))) d.skipped = true;
  if (!d.skipped && !std::isfinite(d.grad_norm)) refuse(fmt::format("the gradient norm became {}", d.grad_norm));
  if (!d.skipped) {
    if (dp) dp->settle_values();  // (the last step's sends must be gone before the values change)
    if (s.schedule)
      opt.step_on_schedule(*s.schedule, device_step);
    else
      opt.step(lr);
    if (dp) dp->share_values();
  }
  params.zero_grad();
  clock.advance();
  d.loss = loss_sum / double(global);
  if (dp) d.comm_s = dp->comm_seconds(), d.exposed_comm_s = dp->exposed_seconds();
  return d;
}

// ---- the loop -----------------------------------------------------------------------------------

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

TrainLoop::TrainLoop(LoopSetup setup, const LoopOptions& o, LoopState& state, ParamStore& params, AdamW& opt,
                     TrainTask& task)
    : setup_(std::move(setup)),
      o_(o),
      st_(state),
      params_(params),
      opt_(opt),
      task_(task),
      progress_(setup_.progress, o.quiet || !writes_run_files(), o.log_every),
      events_(writes_run_files() ? (fs::path(setup_.dir) / "events.jsonl").string() : std::string(), setup_.resumed),
      session_start_(Clock::now()) {
  if (dist::world().size() > 1) {
    dp_ = std::make_unique<dist::DataParallel>(dist::world(), params_, o.dp());
    dist::set_active(dp_.get());
  }
  st_.world_size = dist::world().size();
}

TrainLoop::~TrainLoop() {
  if (dp_ && dist::active() == dp_.get()) dist::set_active(nullptr);
}

bool writes_run_files() { return dist::world().rank() == 0; }

DType precision_type(const std::string& precision) {
  if (precision == "bf16") return DType::BF16;
  if (precision == "f16") return DType::F16;
  TOY_CHECK(precision == "f32", "[train] --precision must be f32, bf16 or f16, got '{}'", printable(precision));
  return DType::F32;
}

void check_data_parallel(const LoopOptions& o, const char* who) {
  const int n = dist::world().size();
  if (n == 1) return;
  TOY_CHECK(is_host(o.device), "{} data-parallel training ({} processes) runs on the CPU in this toy; --device {} "
            "is not supported with mpirun yet", who, n, name(o.device));
}

int64_t accum_for_world(int64_t saved_accum, int64_t saved_world, const char* who, const std::string& dir,
                        const char* command) {
  const int64_t n = dist::world().size(), global = saved_accum * saved_world;
  if (n == saved_world) return saved_accum;
  TOY_CHECK(global % n == 0, "{} the run in '{}' takes {} micro-batches per step ({} processes x --accum {}): {} "
            "processes cannot share them evenly; resume it with a number of processes that divides {} ({} --resume)",
            who, printable(dir), global, saved_world, saved_accum, n, global, command);
  return global / n;
}

void TrainLoop::add_run_start_fields(nlohmann::json& start) const {
  start["world_size"] = dist::world().size();
  start["zero"] = dp_ ? o_.zero : 0;
  if (!dp_) return;
  nlohmann::json shards = dp_->shards_json();
  const int64_t total = params_.arena() ? params_.arena()->numel() : 0;
  for (nlohmann::json& s : shards)
    s["optimizer_bytes"] = 8 * (o_.zero == 1 ? s["elements"].get<int64_t>() : total);
  start["shards"] = shards;
  start["dp"] = {{"bucket_mb", o_.dp_bucket_mb}, {"overlap", o_.dp_overlap}, {"timeout_s", o_.dp_timeout},
                 {"buckets", dp_->bucket_count()}, {"backend", dist::world().backend()}};
}

double TrainLoop::session_seconds() const { return since(session_start_); }

bool TrainLoop::offer_best(double score, double tiebreak) {
  if (dp_) dp_->settle_values();  // (the copy reads the values outside a kernel)
  return st_.best.offer(params_, st_.step, score, tiebreak);
}

void TrainLoop::checkpoint(const char* reason) {
  if (dp_) {
    dp_->settle_values();
    // Rank 0 writes it with every rank's optimizer state (the one-process layout).
    dp_->gather_moments();
    try {
      if (writes_run_files()) task_.save_checkpoint();
    } catch (...) {
      dp_->drop_gathered_moments();
      throw;
    }
    dp_->drop_gathered_moments();
  } else {
    task_.save_checkpoint();
  }
  st_.saved_step = st_.step;
  events_.emit("checkpoint", {{"step", st_.step}, {"reason", reason}});
}

void TrainLoop::end_events(bool stopped, const nlohmann::json& extra,
                           const std::function<nlohmann::json()>& end_fields) {
  nlohmann::json e = {{"steps", st_.step},
                      {"seconds", st_.seconds},
                      {setup_.rate_field, double(st_.units) / std::max(st_.seconds, 1e-9)},
                      {"stopped", stopped}};
  if (end_fields) e.update(end_fields());
  e.update(extra);
  events_.emit("run_end", e);
  if (!writes_run_files()) return;
  write_report((fs::path(setup_.dir) / "events.jsonl").string(), (fs::path(setup_.dir) / "report.html").string());
}

// Nothing of a failed step was applied (a failure after it, in an evaluation's or a save's
// exchange with the other ranks or a save's write, replaced no file either: writes are
// atomic), and nothing is written from here on: the files of the run stay those of the last
// good save.
void TrainLoop::fail_step(const std::string& what, const char* where, int64_t step,
                          const std::function<nlohmann::json()>& end_fields) {
  const std::string kept = st_.saved_step >= 0
                               ? fmt::format("the checkpoint of step {} and the model files are kept; no file was "
                                             "replaced", st_.saved_step)
                               : std::string("no checkpoint had been written yet");
  std::string msg = fmt::format("{} ({} step {}); {}", what, where, step, kept);
  // Data-parallel: how to go on (any number of processes that divides the global batch).
  if (dp_ && st_.saved_step >= 0 && !setup_.resume_command.empty())
    msg += fmt::format("; continue with mpirun -np {} {} (or another number of processes that divides the {} "
                       "micro-batches of a step)", dp_->size(), setup_.resume_command, o_.accum * dp_->size());
  events_.emit("error", {{"step", step}, {"message", msg}});
  end_events(false, {{"error", msg}}, end_fields);
  fail("{}", msg);
}

// A write that fails after the last step (a full disk) names the checkpoint the run can
// resume from: an earlier one is whole whatever happened to this write (writes replace files
// atomically).
void TrainLoop::say_where_to_resume(const Error& e) {
  const fs::path ck = fs::path(setup_.dir) / "checkpoint.gguf";
  std::error_code ec;
  if (setup_.resume_command.empty() || !fs::exists(ck, ec)) throw e;
  throw Error(fmt::format("{}; the run's last checkpoint, '{}', is whole: once the cause is fixed (a full disk: free "
                          "space), continue with {}", e.what(), printable(ck.string()), setup_.resume_command));
}

bool TrainLoop::run(const std::function<nlohmann::json()>& end_fields) {
  StepSettings ss;
  ss.who = setup_.who;
  ss.accum = o_.accum;
  ss.clip = o_.clip;
  ss.dynamic_loss_scale = setup_.dynamic_loss_scale;
  ss.on_grad_ready = on_grad_ready_;
  const int64_t end_step = setup_.total_steps;
  const float min_lr = std::isnan(o_.min_lr) ? o_.lr / 10 : o_.min_lr;
  const LrSchedule schedule{o_.warmup, end_step, o_.lr, min_lr};
  ss.schedule = &schedule;
  StepClock clock;
  ss.clock = &clock;
  bool stopped = false;
  auto last_save = Clock::now();
  // A stop requested during set-up still stops the run (after its first step); the request
  // is cleared once honoured.
  while (st_.step < end_step) {
    const auto t0 = Clock::now();
    const float lr = cosine_lr(st_.step, schedule);
    const float scale_used = st_.loss_scale.scale();
    StepDone d;
    int64_t reads_before = 0;
    try {
      ss.step = st_.step;
      ss.dp = dp_.get();
      // (Data-parallel: the step's record carries this rank's stop request and rank 0's clock.)
      ss.stop_request = stop_requested();
      ss.save_request = o_.save_minutes > 0 && since(last_save) >= o_.save_minutes * 60;
      reads_before = device_traffic().reads;
      d = take_step(task_, params_, opt_, st_.loss_scale, ss, lr);
    } catch (const Error& e) {
      fail_step(e.what(), "at", st_.step + 1, end_fields);
    }
    d.step = ++st_.step;
    d.last = st_.step == end_step;
    d.seconds = since(t0);
    st_.seconds += d.seconds;
    st_.units += d.units;
    if (d.skipped) {
      ++st_.skipped_steps;
      events_.emit("skipped_step", {{"step", d.step}, {"loss_scale", scale_used},
                                    {"grad_norm", d.grad_norm}});
    }
    nlohmann::json ev = {{"step", d.step}, {"loss", d.loss}, {"lr", json_float(lr)}, {"grad_norm", d.grad_norm},
                         {setup_.rate_field, double(d.units) / std::max(d.seconds, 1e-9)}};
    // On a device: how many times the step read it back (one, for the losses, the gradient
    // norms and what the task asked for; step_reads).
    if (!is_host(o_.device)) ev["device_reads"] = device_traffic().reads - reads_before;
    if (dp_) ev.update({{"comm_s", d.comm_s}, {"exposed_comm_s", d.exposed_comm_s}});
    task_.after_step(d, ev);
    events_.emit("step", ev);
    const double rate = double(st_.units) / std::max(st_.seconds, 1e-9);
    const double eta = double(end_step - st_.step) * st_.seconds / double(std::max<int64_t>(1, st_.step));
    progress_.step(st_.step, end_step, d.loss, lr, rate, eta, setup_.rate_unit);
    try {
      task_.cadence(d);
    } catch (const Error& e) {
      fail_step(e.what(), "after", st_.step, end_fields);
    }
    // Data-parallel: every rank decides from the step's record (a stop any rank was asked for;
    // rank 0's clock for timed saves), so all stop or save at the same step.
    const bool stop_now = dp_ ? d.stop : stop_requested();
    if (!d.last && (stop_now || (o_.stop_after > 0 && st_.step >= o_.stop_after))) {
      stopped = true;
      clear_stop_request();
      break;
    }
    const bool timed_save = dp_ ? d.save : o_.save_minutes > 0 && since(last_save) >= o_.save_minutes * 60;
    const bool periodic = (o_.save_every > 0 && st_.step % o_.save_every == 0) || timed_save;
    if (!d.last && periodic) {
      try {
        checkpoint("periodic");
      } catch (const Error& e) {
        fail_step(e.what(), "after", st_.step, end_fields);
      }
      last_save = Clock::now();
    }
  }
  // The trained weights first: nothing after the last step may lose them.
  try {
    checkpoint(stopped ? "stop" : "end");
  } catch (const Error& e) {
    say_where_to_resume(e);
  }
  if (!stopped && task_.final_evaluation()) checkpoint("best");
  try {
    if (writes_run_files()) task_.write_outputs(stopped);
  } catch (const Error& e) {
    say_where_to_resume(e);
  }
  end_events(stopped, {{"session_seconds", session_seconds()}}, end_fields);
  return stopped;
}

}  // namespace toy
