#include "toy/dist/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <unordered_map>

#include <fmt/core.h>

#include "toy/autograd/grad_mode.h"
#include "toy/core/kernel_gate.h"
#include "toy/ops/ops.h"

namespace toy::dist {

namespace {

using Clock = std::chrono::steady_clock;
double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// Message kinds (the tag's high bits; MPI promises tags up to 32767).
enum Kind : int { kHeader = 1, kData, kRecord, kValues, kGrads, kMoments, kItems, kStart };

// A value piece's size, in elements (256 KB).
constexpr int64_t kPieceElements = 65536;
// Sends of values in flight at once: few enough that they arrive in the order sent (the
// forward pass's), enough to keep the link busy.
constexpr size_t kSendWindow = 2;
// The kernel gate drives the transport at most this often.
constexpr double kPollEvery = 50e-6;

DataParallel* g_active = nullptr;
DataParallel* g_gated = nullptr;  // the one whose kernel gate is installed

void gate_kernel(const Tensor* const* tensors, size_t n) {
  if (g_gated) g_gated->before_kernel(tensors, n);
}
void keep_sending() {
  if (g_gated) g_gated->pump_sends();
}

// Flattens j into "a.b.c" -> value text, in key order.
void flatten(const nlohmann::json& j, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    return;
  }
  out.emplace_back(prefix, j.dump());
}

}  // namespace

DataParallel* active() { return g_active; }
void set_active(DataParallel* dp) { g_active = dp; }

int DataParallel::tag(int kind, int64_t index) const { return kind * 2048 + int(index % 2048); }

DataParallel::DataParallel(Comm& c, ParamStore& params, DpOptions o) : c_(c), params_(params), o_(o), pending_(c) {
  TOY_CHECK(o_.zero == 0 || o_.zero == 1, "[dist] --zero must be 0 or 1, got {}", o_.zero);
  TOY_CHECK(std::isfinite(o_.bucket_mb) && o_.bucket_mb > 0 && o_.bucket_mb <= 4096,
            "[dist] --dp-bucket-mb must be in (0, 4096], got {}", o_.bucket_mb);
  TOY_CHECK(std::isfinite(o_.timeout_s) && o_.timeout_s >= 1 && o_.timeout_s <= 86400,
            "[dist] --dp-timeout must be in 1..86400 seconds, got {}", o_.timeout_s);
  params_.pack();
  for (Param& p : params_.all()) {
    if (p.arena_offset < 0) continue;
    index_of_[p.value.impl()] = int64_t(trainable_.size());
    trainable_.push_back(&p);
    offset_.push_back(p.arena_offset);
  }
  TOY_CHECK(params_.device() == Device::CPU || trainable_.empty(),
            "[dist] data-parallel training runs on the CPU here (the parameters are on {})", name(params_.device()));
  const int n = size();
  const int64_t total = params_.arena() ? params_.arena()->numel() : 0;
  // Contiguous runs balanced by elements: a parameter goes to the shard its middle falls in.
  shards_.assign(size_t(n), Shard{});
  std::vector<int> owner(trainable_.size());
  int64_t at = 0;
  int last = 0;
  for (size_t i = 0; i < trainable_.size(); ++i) {
    const int64_t ne = trainable_[i]->value.numel();
    const double mid = double(at) + double(ne) / 2;
    int r = total > 0 ? int(std::min<double>(n - 1, std::floor(mid * n / double(total)))) : 0;
    r = std::max(r, last);
    owner[i] = last = r;
    at += ne;
  }
  for (int r = 0, i = 0; r < n; ++r) {
    Shard& s = shards_[size_t(r)];
    s.first = i;
    while (size_t(i) < trainable_.size() && owner[size_t(i)] == r) ++i;
    s.end = i;
    s.begin = s.first < int64_t(trainable_.size()) ? offset_[size_t(s.first)] : total;
    s.stop = s.end < int64_t(trainable_.size()) ? offset_[size_t(s.end)] : total;
  }
  // Buckets in reverse parameter order, one owner each, at most bucket_mb (a larger parameter
  // alone) and at most an eighth of the largest shard (at least 256 KB): the bucket holding
  // the first layers is sent only when backward has finished all of it, so a small model with
  // few large buckets would send most of its gradients after backward.
  int64_t largest = 0;
  for (const Shard& s : shards_) largest = std::max(largest, s.stop - s.begin);
  const int64_t limit = std::max<int64_t>(
      1, std::min<int64_t>(int64_t(o_.bucket_mb * 1024 * 1024 / 4), std::max<int64_t>(kPieceElements, largest / 8)));
  bucket_of_.assign(trainable_.size(), -1);
  for (int64_t i = int64_t(trainable_.size()) - 1; i >= 0; --i) {
    const int64_t ne = trainable_[size_t(i)]->value.numel();
    Bucket* b = buckets_.empty() ? nullptr : &buckets_.back();
    if (!b || b->owner != owner[size_t(i)] || (b->stop - b->begin) + ne > limit) {
      buckets_.push_back(Bucket{});
      b = &buckets_.back();
      b->owner = owner[size_t(i)];
      b->end = i + 1;
      b->stop = offset_[size_t(i)] + ne;
    }
    b->first = i;
    b->begin = offset_[size_t(i)];
    bucket_of_[size_t(i)] = int64_t(buckets_.size()) - 1;
  }
  for (Bucket& b : buckets_) {
    b.present.assign(size_t(b.end - b.first), 0);
    if (b.owner != rank()) continue;
    b.in_present.assign(size_t(n), std::vector<uint8_t>(size_t(b.end - b.first)));
    b.in_data.assign(size_t(n), {});
    for (int r = 0; r < n; ++r)
      if (r != rank()) b.in_data[size_t(r)].resize(size_t(b.stop - b.begin));
  }
  sum_.assign(size_t(own().stop - own().begin), 0.0f);
  has_sum_.assign(size_t(own().end - own().first), 0);
  // ZeRO-1: AdamW's moments only for the owned parameters.
  if (o_.zero == 1) params_.set_moment_range(own().begin, own().stop);
  // Value pieces: runs of one owner's parameters in order, a few hundred KB each (a larger
  // parameter alone): small enough that the next forward pass can start on the first ones,
  // large enough that the messages' round trips do not add up.
  for (int64_t i = 0; i < int64_t(trainable_.size()); ++i) {
    const int64_t ne = trainable_[size_t(i)]->value.numel();
    ValuePiece* v = pieces_.empty() ? nullptr : &pieces_.back();
    if (!v || v->owner != owner[size_t(i)] || (v->stop - v->begin) + ne > kPieceElements) {
      pieces_.push_back(ValuePiece{owner[size_t(i)], i, i, offset_[size_t(i)], offset_[size_t(i)]});
      v = &pieces_.back();
    }
    v->end = i + 1;
    v->stop = offset_[size_t(i)] + ne;
  }
  for (const ValuePiece& v : pieces_) piece_begin_.push_back(v.begin);
  v_recv_.assign(pieces_.size(), Request{});
  awaiting_.assign(pieces_.size(), 0);
  main_thread_ = std::this_thread::get_id();
  TOY_CHECK(g_gated == nullptr, "[dist] two data-parallel runs in one process");
  g_gated = this;
  set_kernel_gate(&gate_kernel);
  set_wait_hook(&keep_sending);
}

DataParallel::~DataParallel() {
  set_kernel_gate(nullptr);
  set_wait_hook(nullptr);
  g_gated = nullptr;
  // Values still in flight when a run ends by an error: the receive buffer must outlive them
  // (the process is about to end).
  if (values_pending_) (void)staging_.release();
}

nlohmann::json DataParallel::shards_json() const {
  nlohmann::json a = nlohmann::json::array();
  for (size_t r = 0; r < shards_.size(); ++r) {
    const Shard& s = shards_[r];
    a.push_back({{"rank", r},
                 {"params", s.end - s.first},
                 {"first", s.first < s.end ? trainable_[size_t(s.first)]->name : ""},
                 {"last", s.first < s.end ? trainable_[size_t(s.end - 1)]->name : ""},
                 {"elements", s.stop - s.begin}});
  }
  return a;
}

int64_t DataParallel::optimizer_bytes() const {
  const ParamArena* a = params_.arena();
  return a ? 4 * (a->m.numel() + a->v.numel()) : 0;
}

Tensor DataParallel::grad_of(int64_t i) {
  Param& p = *trainable_[size_t(i)];
  Tensor g = p.value.grad(), home = p.value.grad_home();
  if (g.defined() && !g.is_same(home)) {  // set by hand: bring it home (as AdamW does)
    NoGradGuard ng;
    copy_(home, g);
    p.value.set_grad(home);
    return home;
  }
  return g;
}

// ---- a step -------------------------------------------------------------------------------------

void DataParallel::begin_step(int64_t step) {
  step_ = step;
  comm_s_ = exposed_s_ = 0;
  std::fill(has_sum_.begin(), has_sum_.end(), 0);
}

void DataParallel::begin_micro() {
  round_start_ = -1;
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    b.ready = 0;
    b.sent = false;
    if (b.owner != rank()) continue;
    // The owner's receives are posted first, so contributions land in place as they come.
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      pending_.add(c_.irecv(b.in_present[size_t(r)].data(), b.in_present[size_t(r)].size(), r, tag(kHeader, int64_t(bi))));
      pending_.add(c_.irecv(b.in_data[size_t(r)].data(), b.in_data[size_t(r)].size() * 4, r, tag(kData, int64_t(bi))));
    }
  }
}

void DataParallel::grad_ready(const Tensor& leaf) {
  if (!o_.overlap) return;
  if (auto it = index_of_.find(leaf.impl()); it != index_of_.end()) {
    Bucket& b = buckets_[size_t(bucket_of_[size_t(it->second)])];
    if (++b.ready == b.end - b.first) launch(b);
  }
  // (The messages move on through the kernel gate between the backward pass's kernels.)
}

void DataParallel::launch(Bucket& b) {
  if (b.sent) return;
  b.sent = true;
  if (round_start_ < 0) round_start_ = now_s();
  if (b.owner == rank()) return;  // its own contribution stays in its arena
  for (int64_t i = b.first; i < b.end; ++i) b.present[size_t(i - b.first)] = grad_of(i).defined() ? 1 : 0;
  const int64_t bi = &b - buckets_.data();
  pending_.add(c_.isend(b.present.data(), b.present.size(), b.owner, tag(kHeader, bi)));
  const float* g = params_.arena()->grads.data<float>() + b.begin;
  pending_.add(c_.isend(g, size_t(b.stop - b.begin) * 4, b.owner, tag(kData, bi)));
}

void DataParallel::end_micro() {
  if (round_start_ < 0) round_start_ = now_s();
  for (Bucket& b : buckets_) launch(b);
  const double t0 = now_s();
  exposed_s_ += pending_.wait(o_.timeout_s, fmt::format("step {}: reducing gradients", step_ + 1));
  comm_s_ += now_s() - std::min(round_start_, t0);
  for (Bucket& b : buckets_)
    if (b.owner == rank()) reduce(b);
  params_.zero_grad();
}

void DataParallel::reduce(Bucket& b) {
  const Shard& me = own();
  const float* own_grads = params_.arena()->grads.data<float>();
  for (int64_t i = b.first; i < b.end; ++i) {
    const int64_t ne = trainable_[size_t(i)]->value.numel();
    float* s = sum_.data() + (offset_[size_t(i)] - me.begin);
    uint8_t& has = has_sum_[size_t(i - me.first)];
    for (int r = 0; r < size(); ++r) {
      const float* c;
      if (r == rank()) {
        if (!grad_of(i).defined()) continue;
        c = own_grads + offset_[size_t(i)];
      } else {
        if (!b.in_present[size_t(r)][size_t(i - b.first)]) continue;
        c = b.in_data[size_t(r)].data() + (offset_[size_t(i)] - b.begin);
      }
      // As the engine accumulates a leaf's gradient: the first one copied, the next added.
      if (!has) {
        std::memcpy(s, c, size_t(ne) * 4);
        has = 1;
      } else {
        for (int64_t j = 0; j < ne; ++j) s[j] += c[j];
      }
    }
  }
}

void DataParallel::finish_gradients() {
  NoGradGuard ng;
  const Shard& me = own();
  float* grads = params_.arena()->grads.data<float>();
  if (me.stop > me.begin) std::memcpy(grads + me.begin, sum_.data(), size_t(me.stop - me.begin) * 4);
  auto mark = [&](int64_t i, bool present) {
    Param& p = *trainable_[size_t(i)];
    if (present) p.value.set_grad(p.value.grad_home());
  };
  for (int64_t i = me.first; i < me.end; ++i) mark(i, has_sum_[size_t(i - me.first)]);
  if (o_.zero == 1) return;
  // zero = 0: every owner's reduced gradients to every rank.
  const double t0 = now_s();
  std::vector<std::vector<uint8_t>> flags(static_cast<size_t>(size()));
  Pending p(c_);
  for (int r = 0; r < size(); ++r) {
    const Shard& s = shards_[size_t(r)];
    if (r == rank()) {
      for (int q = 0; q < size(); ++q) {
        if (q == rank()) continue;
        p.add(c_.isend(has_sum_.data(), has_sum_.size(), q, tag(kHeader, 0)));
        p.add(c_.isend(grads + s.begin, size_t(s.stop - s.begin) * 4, q, tag(kGrads, 0)));
      }
      continue;
    }
    flags[size_t(r)].resize(size_t(s.end - s.first));
    p.add(c_.irecv(flags[size_t(r)].data(), flags[size_t(r)].size(), r, tag(kHeader, 0)));
    p.add(c_.irecv(grads + s.begin, size_t(s.stop - s.begin) * 4, r, tag(kGrads, 0)));
  }
  exposed_s_ += p.wait(o_.timeout_s, fmt::format("step {}: sharing the reduced gradients", step_ + 1));
  comm_s_ += now_s() - t0;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    const Shard& s = shards_[size_t(r)];
    for (int64_t i = s.first; i < s.end; ++i) mark(i, flags[size_t(r)][size_t(i - s.first)]);
  }
}

std::vector<StepRecord> DataParallel::exchange(const StepRecord& mine) {
  // Layout: 4 int64 (counts, units, flags) then the floats.
  const int64_t head[4] = {int64_t(mine.losses.size()), int64_t(mine.square_norms.size()),
                           int64_t(mine.task_reads.size()), mine.units};
  const int64_t flags = (mine.stop ? 1 : 0) | (mine.save ? 2 : 0);
  std::string bytes(sizeof head + sizeof flags, '\0');
  std::memcpy(bytes.data(), head, sizeof head);
  std::memcpy(bytes.data() + sizeof head, &flags, sizeof flags);
  for (const std::vector<float>* v : {&mine.losses, &mine.square_norms, &mine.task_reads})
    bytes.append(reinterpret_cast<const char*>(v->data()), v->size() * 4);
  const double t0 = now_s();
  const auto all = allgather_strings(c_, bytes, tag(kRecord, 2 * step_), o_.timeout_s,
                                     fmt::format("step {}: exchanging the step's losses and norms", step_ + 1));
  const double waited = now_s() - t0;
  exposed_s_ += waited, comm_s_ += waited;
  std::vector<StepRecord> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string& b = all[r];
    TOY_CHECK(b.size() >= sizeof head + sizeof flags, "[dist] rank {} sent a damaged step record", r);
    int64_t h[4], f = 0;
    std::memcpy(h, b.data(), sizeof h);
    std::memcpy(&f, b.data() + sizeof h, sizeof f);
    TOY_CHECK(h[0] >= 0 && h[1] >= 0 && h[2] >= 0 &&
                  b.size() == sizeof h + sizeof f + size_t(h[0] + h[1] + h[2]) * 4,
              "[dist] rank {} sent a damaged step record", r);
    const float* x = reinterpret_cast<const float*>(b.data() + sizeof h + sizeof f);
    StepRecord& s = out[r];
    s.losses.assign(x, x + h[0]);
    s.square_norms.assign(x + h[0], x + h[0] + h[1]);
    s.task_reads.assign(x + h[0] + h[1], x + h[0] + h[1] + h[2]);
    s.units = h[3];
    s.stop = f & 1, s.save = f & 2;
  }
  return out;
}

// ---- sharing the updated values ----------------------------------------------------------------

void DataParallel::share_values() {
  if (o_.zero == 0) return;  // every rank updated every parameter itself
  TOY_CHECK(!values_pending_, "[dist] the last step's values were still being shared");
  values_start_ = now_s();
  const ParamArena& a = *params_.arena();
  values_storage_ = a.values.storage().get();
  if (!staging_) staging_.reset(new float[size_t(std::max<int64_t>(1, a.numel()))]);
  send_queue_.clear(), send_next_ = 0;
  // Receives first, every other owner's pieces; sends in parameter order, each to every rank
  // in turn (the order the forward pass reads them).
  for (int64_t k = 0; k < int64_t(pieces_.size()); ++k) {
    const ValuePiece& v = pieces_[size_t(k)];
    if (v.owner == rank()) {
      for (int q = 0; q < size(); ++q)
        if (q != rank()) send_queue_.emplace_back(k, q);
      continue;
    }
    v_recv_[size_t(k)] = c_.irecv(staging_.get() + v.begin, size_t(v.stop - v.begin) * 4, v.owner, tag(kValues, k));
    awaiting_[size_t(k)] = 1;
    ++awaiting_count_;
  }
  values_pending_ = true;
  pump_sends();
  if (!o_.overlap) settle_values();
}

void DataParallel::pump_sends() {
  size_t kept = 0;
  for (Request& r : sending_)
    if (!c_.test(r)) sending_[kept++] = r;
  sending_.resize(kept);
  if (send_next_ >= send_queue_.size()) return;
  const float* values = params_.arena()->values.data<float>();
  const size_t window = o_.overlap ? kSendWindow : send_queue_.size();
  while (sending_.size() < window && send_next_ < send_queue_.size()) {
    const auto [k, q] = send_queue_[send_next_++];
    const ValuePiece& v = pieces_[size_t(k)];
    sending_.push_back(c_.isend(values + v.begin, size_t(v.stop - v.begin) * 4, q, tag(kValues, k)));
  }
}

void DataParallel::take_piece(int64_t k) {
  const ValuePiece& v = pieces_[size_t(k)];
  std::memcpy(params_.arena()->values.data<float>() + v.begin, staging_.get() + v.begin,
              size_t(v.stop - v.begin) * 4);
  awaiting_[size_t(k)] = 0;
  --awaiting_count_;
}

void DataParallel::finish_values_if_done() {
  if (!values_pending_ || awaiting_count_ > 0 || !sending_.empty() || send_next_ < send_queue_.size()) return;
  values_pending_ = false;
  comm_s_ += now_s() - values_start_;
}

void DataParallel::wait_piece(int64_t k) {
  const ValuePiece& v = pieces_[size_t(k)];
  Pending p(c_);
  p.add(v_recv_[size_t(k)]);
  exposed_s_ += p.wait(o_.timeout_s, fmt::format("step {}: receiving the updated {}{}", step_ + 1,
                                                 trainable_[size_t(v.first)]->name, v.end - v.first > 1 ? " .." : ""));
  take_piece(k);
}

void DataParallel::settle_values() {
  if (!values_pending_) return;
  for (int64_t k = 0; k < int64_t(pieces_.size()); ++k)
    if (awaiting_[size_t(k)]) wait_piece(k);
  const double t0 = now_s();
  while (!sending_.empty() || send_next_ < send_queue_.size()) {
    Pending p(c_);
    for (const Request& r : sending_) p.add(r);
    sending_.clear();
    p.wait(o_.timeout_s, fmt::format("step {}: sending the updated parameters", step_ + 1));
    pump_sends();
  }
  exposed_s_ += now_s() - t0;
  finish_values_if_done();
}

void DataParallel::before_kernel(const Tensor* const* tensors, size_t n) {
  if (!o_.overlap || (!values_pending_ && pending_.empty())) return;
  if (std::this_thread::get_id() != main_thread_) {
    // (Only the main thread may call MPI.) A kernel started elsewhere must not read a value
    // still in flight.
    for (size_t k = 0; k < n; ++k)
      TOY_CHECK(!values_pending_ || !tensors[k] || tensors[k]->storage().get() != values_storage_,
                "[dist] a kernel on another thread read the parameters while their new values were arriving");
    return;
  }
  const double t = now_s();
  if (t - last_poll_ >= kPollEvery) {
    last_poll_ = t;
    c_.progress();
    if (values_pending_) pump_sends(), finish_values_if_done();
  }
  if (!values_pending_) return;
  for (size_t a = 0; a < n; ++a) {
    const Tensor* x = tensors[a];
    if (!x || !x->defined() || x->storage().get() != values_storage_ || x->numel() == 0) continue;
    // The elements the view covers: [offset, offset + the largest index reached].
    int64_t lo = x->offset(), hi = x->offset();
    for (int d = 0; d < x->ndim(); ++d) {
      const int64_t span = (x->size(d) - 1) * x->stride(d);
      (span < 0 ? lo : hi) += span;
    }
    // The pieces overlapping [lo, hi]: the last starting at or before lo, onwards.
    auto first = std::upper_bound(piece_begin_.begin(), piece_begin_.end(), lo);
    int64_t k = std::max<int64_t>(0, int64_t(first - piece_begin_.begin()) - 1);
    for (; k < int64_t(pieces_.size()) && pieces_[size_t(k)].begin <= hi; ++k)
      if (awaiting_[size_t(k)]) wait_piece(k);
  }
  finish_values_if_done();
}

// ---- checkpoints --------------------------------------------------------------------------------

void DataParallel::gather_moments() {
  if (o_.zero == 0 || size() == 1) return;
  const ParamArena& a = *params_.arena();
  Pending p(c_);
  std::vector<Tensor> keep;
  if (rank() == 0) {
    // Full-size m and v for the parameters others own, for the checkpoint writer.
    for (int r = 1; r < size(); ++r) {
      const Shard& s = shards_[size_t(r)];
      for (int64_t i = s.first; i < s.end; ++i) {
        Param& q = *trainable_[size_t(i)];
        q.m = zeros(q.value.shape());
        q.v = zeros(q.value.shape());
        p.add(c_.irecv(q.m.data<float>(), size_t(q.m.numel()) * 4, r, tag(kMoments, 2 * i)));
        p.add(c_.irecv(q.v.data<float>(), size_t(q.v.numel()) * 4, r, tag(kMoments, 2 * i + 1)));
      }
    }
  } else {
    const Shard& s = own();
    for (int64_t i = s.first; i < s.end; ++i) {
      const int64_t at = offset_[size_t(i)] - s.begin, ne = trainable_[size_t(i)]->value.numel();
      p.add(c_.isend(a.m.data<float>() + at, size_t(ne) * 4, 0, tag(kMoments, 2 * i)));
      p.add(c_.isend(a.v.data<float>() + at, size_t(ne) * 4, 0, tag(kMoments, 2 * i + 1)));
    }
  }
  p.wait(o_.timeout_s, "gathering the optimizer state for the checkpoint");
}

void DataParallel::drop_gathered_moments() {
  if (o_.zero == 0 || size() == 1 || rank() != 0) return;
  for (int r = 1; r < size(); ++r)
    for (int64_t i = shards_[size_t(r)].first; i < shards_[size_t(r)].end; ++i) {
      trainable_[size_t(i)]->m = Tensor();
      trainable_[size_t(i)]->v = Tensor();
    }
}

// ---- evaluations and the start --------------------------------------------------------------------

std::vector<double> share_items(int64_t n, const std::function<double(int64_t)>& compute, double timeout_s) {
  DataParallel* dp = active();
  std::vector<double> v(size_t(n), NAN);
  if (!dp || dp->size() == 1) {
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = compute(i);
    return v;
  }
  const int N = dp->size(), me = dp->rank();
  for (int64_t i = me; i < n; i += N) v[size_t(i)] = compute(i);
  static int64_t round = 0;
  const auto all = allgather_bytes(world(), v.data(), v.size() * sizeof(double), kItems * 2048 + int(round++ % 2048),
                                   timeout_s, "sharing the evaluation");
  for (int64_t i = 0; i < n; ++i) std::memcpy(&v[size_t(i)], all[size_t(i % N)].data() + i * 8, 8);
  return v;
}

void agree_on_start(Comm& c, const nlohmann::json& mine, double timeout_s) {
  if (c.size() == 1) return;
  const auto all = allgather_strings(c, mine.dump(), kStart * 2048, timeout_s, "agreeing on the run's options");
  std::vector<std::pair<std::string, std::string>> first;
  flatten(nlohmann::json::parse(all[0]), "", first);
  for (size_t r = 1; r < all.size(); ++r) {
    std::vector<std::pair<std::string, std::string>> other;
    flatten(nlohmann::json::parse(all[r]), "", other);
    for (size_t k = 0; k < std::max(first.size(), other.size()); ++k) {
      const auto miss = std::pair<std::string, std::string>{"", "(none)"};
      const auto& a = k < first.size() ? first[k] : miss;
      const auto& b = k < other.size() ? other[k] : miss;
      if (a == b) continue;
      const std::string field = a.first.empty() ? b.first : a.first;
      fail("[dist] rank {} was started with {} = {}, rank 0 with {}: every process of a run must be given the same "
           "options and data", r, field, b.first == field ? b.second : "(none)", a.first == field ? a.second : "(none)");
    }
  }
}

}  // namespace toy::dist
