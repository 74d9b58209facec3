// Data-parallel training: N processes each hold the whole model and run their part of every
// step's micro-batches; this class makes their gradients, decisions and weights one.
//
//   shards     the trainable parameters split into N contiguous runs in parameter order,
//              balanced by element count; rank r owns run r: it reduces those gradients and,
//              under ZeRO-1 (zero = 1), alone keeps their AdamW moments and updates them, then
//              sends the new values to every rank. zero = 0: every rank gets every reduced
//              gradient and keeps full moments (the one-process optimizer everywhere).
//   buckets    ranges of about bucket_mb of the gradient arena, in reverse parameter order
//              (the order backward finishes them), never spanning two owners. A bucket is sent
//              to its owner as soon as the backward pass has finished all its gradients (the
//              gradient-ready callback), while the pass goes on with the layers below.
//   reduction  bit for bit the one process's: micro-batch m of rank r is the step's micro-batch
//              r + N*m, and the owner folds the contributions of each round of micro-batches in
//              rank order, starting as the engine's accumulation starts (a copy of the first
//              gradient, then additions), so the sum is the one process's fold over its
//              micro-batches in order. A parameter that got no gradient from a micro-batch is
//              flagged absent, as the one process would have left it.
//   records    each step the ranks exchange one record (their micro-batches' losses, tokens,
//              their owned gradients' squared norms, the stop and save requests): every rank
//              then sees the one process's losses and gradient norm and takes the same
//              decisions (refusing a non-finite step, the F16 loss scale, stopping, saving).
// Every wait is polled against timeout_s (Pending): a rank that does not answer ends the run
// with a message naming it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "toy/dist/comm.h"
#include "toy/nn/params.h"

namespace toy::dist {

struct DpOptions {
  int zero = 1;            // 1: AdamW's moments sharded (ZeRO-1); 0: full moments on every rank
  double bucket_mb = 8;    // gradient bucket size
  bool overlap = true;     // send buckets during backward (off: after it)
  double timeout_s = 300;  // any wait longer than this ends the run
};

struct Shard {
  int64_t first = 0, end = 0;  // trainable-parameter indices [first, end)
  int64_t begin = 0, stop = 0; // arena elements [begin, stop)
};

// What a step's record carries from each rank.
struct StepRecord {
  std::vector<float> losses;      // this rank's micro-batches', in its order
  int64_t units = 0;
  std::vector<float> square_norms;  // the owned gradients' (parameters with a gradient, in order)
  std::vector<float> task_reads;    // TrainTask::step_counts (summed over the ranks)
  bool stop = false;                // a stop was requested on this rank
  bool save = false;                // rank 0: a time-based save is due
};

class DataParallel {
 public:
  DataParallel(Comm& c, ParamStore& params, DpOptions o);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  int rank() const { return c_.rank(); }
  int size() const { return c_.size(); }
  const DpOptions& options() const { return o_; }
  const std::vector<Shard>& shards() const { return shards_; }
  const Shard& own() const { return shards_[size_t(rank())]; }
  // run_start's "shards": per rank its parameters and elements.
  nlohmann::json shards_json() const;
  int64_t bucket_count() const { return int64_t(buckets_.size()); }
  // The bytes of AdamW state this rank keeps (m and v).
  int64_t optimizer_bytes() const;

  // ---- a step ----
  void begin_step(int64_t step);
  void begin_micro();
  // The gradient-ready callback (BackwardOptions::on_grad_ready).
  void grad_ready(const Tensor& leaf);
  // After a micro-batch's backward: sends what is left, waits for the round and reduces it
  // on the owners; every rank's gradients are then cleared for the next micro-batch.
  void end_micro();
  // After the last micro-batch: the reduced gradients in the arena (the owned ones; all of
  // them with zero = 0), those of other owners undefined.
  void finish_gradients();
  // Exchanges the step's records (all ranks, in rank order).
  std::vector<StepRecord> exchange(const StepRecord& mine);
  // After AdamW updated the owned parameters (zero = 1): sends them to every rank and posts
  // the receives of the other owners' (a message per parameter, in forward order), and
  // returns. The next forward pass waits, through the kernel gate, only for the parameters
  // its kernels read, so the transfer overlaps it. --dp-overlap off: waits for all here.
  void share_values();
  // Waits until every shared value has arrived and every send has gone: before the optimizer
  // changes the values again, and before anything reads them outside a kernel (a checkpoint,
  // the best weights, the output files).
  void settle_values();
  // The kernel gate (core/kernel_gate.h), installed while this object lives: moves the
  // messages in flight along, and waits for the new values of the parameters the kernel's
  // tensors cover.
  void before_kernel(const Tensor* const* tensors, size_t n);
  double comm_seconds() const { return comm_s_; }
  double exposed_seconds() const { return exposed_s_; }

  // ---- checkpoints ----
  // Rank 0 gets every parameter's m and v (into its Param records, for the checkpoint
  // writer); restore() drops them again. A collective: every rank calls both.
  void gather_moments();
  void drop_gathered_moments();
  // Posts the next value sends as the window frees (every wait calls it: set_wait_hook).
  void pump_sends();

 private:
  struct Bucket {
    int owner = 0;
    int64_t first = 0, end = 0;  // trainable-parameter indices
    int64_t begin = 0, stop = 0; // arena elements
    int64_t ready = 0;           // parameters whose gradient of this pass is whole
    bool sent = false;
    std::vector<uint8_t> present;                 // this rank's flags
    std::vector<std::vector<uint8_t>> in_present; // the owner's: per rank
    std::vector<std::vector<float>> in_data;      // the owner's: per rank (its own unused)
  };
  void launch(Bucket& b);
  void reduce(Bucket& b);
  Tensor grad_of(int64_t trainable_index);
  int tag(int kind, int64_t index) const;

  // The shared values in flight.
  void wait_piece(int64_t k);
  void take_piece(int64_t k);
  void finish_values_if_done();

  Comm& c_;
  ParamStore& params_;
  DpOptions o_;
  std::vector<Param*> trainable_;
  std::vector<int64_t> offset_;  // arena offset of each trainable parameter
  std::unordered_map<const TensorImpl*, int64_t> index_of_;  // a leaf's trainable index
  std::vector<Shard> shards_;
  std::vector<Bucket> buckets_;  // in launch order (reverse parameter order)
  std::vector<int64_t> bucket_of_;  // per trainable parameter
  std::vector<float> sum_;          // the owned gradients folded so far this step
  std::vector<uint8_t> has_sum_;    // per owned parameter
  Pending pending_;
  int64_t step_ = 0;
  double comm_s_ = 0, exposed_s_ = 0;
  double round_start_ = -1;  // when the round's first bucket went (comm time)
  // Values: the others' arrive in staging_ (arena-sized; only their ranges are touched) and
  // are copied into the arena when a kernel needs them or at settle_values(), so a read that
  // bypassed the gate would see the last step's values on every run (a test's bit-for-bit
  // comparison catches it), not whatever the network had delivered.
  struct ValuePiece {
    int owner = 0;
    int64_t first = 0, end = 0;   // trainable-parameter indices
    int64_t begin = 0, stop = 0;  // arena elements
  };
  std::vector<ValuePiece> pieces_;      // in parameter order
  std::vector<int64_t> piece_begin_;    // their first elements (for the gate's search)
  std::unique_ptr<float[]> staging_;
  std::vector<Request> v_recv_;         // per piece
  std::vector<uint8_t> awaiting_;       // per piece: its new values are in flight
  int64_t awaiting_count_ = 0;
  std::vector<std::pair<int64_t, int>> send_queue_;  // (piece, rank) in sending order
  size_t send_next_ = 0;
  std::vector<Request> sending_;        // at most kSendWindow in flight, so they arrive in order
  bool values_pending_ = false;
  double values_start_ = 0, last_poll_ = 0;
  const void* values_storage_ = nullptr;  // the arena's values' storage (a parameter is a view of it)
  std::thread::id main_thread_;
};

// The run's DataParallel when one is active (for evaluations split over the ranks).
DataParallel* active();
void set_active(DataParallel* dp);

// Evaluation split over the ranks: rank r computes items r, r + N, ... (compute(i) for those;
// the others are NaN here), and every rank gets all items' values in order.
std::vector<double> share_items(int64_t n, const std::function<double(int64_t)>& compute, double timeout_s);

// The options and data each rank was started with, compared at the start of a run: throws,
// on every rank, naming the first rank and field that differ from rank 0's.
void agree_on_start(Comm& c, const nlohmann::json& mine, double timeout_s);

}  // namespace toy::dist
