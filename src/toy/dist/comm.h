// The processes of a data-parallel run, as the trainers see them: a rank, a size, and
// point-to-point messages between host buffers that never block (isend/irecv return a
// request; Pending waits for a set of them by polling against a deadline, so a peer that
// died or a network that went away ends the run with a message instead of a hang). Every
// collective the trainers need (gathering a gradient bucket to its owner, broadcasting an
// owner's parameters, agreeing on a step's decisions) is a pattern of these messages, which
// also says, on a timeout, exactly which rank did not answer.
//   one process  the default (size 1: nothing is ever sent)
//   MPI          when toy is built with MPI (TOY_MPI) and started by mpirun (mpi_comm.cpp)
// A toy without MPI started by mpirun with more than one process refuses to run.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "toy/core/error.h"

namespace toy::dist {

// A message in flight (opaque to callers; owned by the Comm that made it).
struct Request {
  int64_t id = -1;
  int peer = -1;  // the rank it goes to or comes from
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const = 0;  // among the processes on this host
  virtual int local_size() const = 0;
  virtual std::string backend() const = 0;  // "none" | "mpi"
  // `bytes` from/into host memory; the buffer must live until the request completes.
  virtual Request isend(const void* data, size_t bytes, int to, int tag) = 0;
  virtual Request irecv(void* data, size_t bytes, int from, int tag) = 0;
  // Whether the request has completed (and then releases it); drives the transport.
  virtual bool test(Request& r) = 0;
  // Drives the transport once (every message in flight moves on) without completing any.
  virtual void progress() {}
  // Ends every process of the run at once (after a message was printed).
  [[noreturn]] virtual void abort(int code) = 0;
  // False when rank r is known to have ended (a process on this host that no longer exists);
  // true when it lives or cannot be checked from here (then only the timeout tells).
  virtual bool peer_alive(int /*r*/) const { return true; }
  // "rank 1 (process 1234 on host-a)".
  virtual std::string describe_peer(int r) const { return "rank " + std::to_string(r); }
};

// The process's communicator: MPI's world when init() found one, else one process.
Comm& world();
// Starts MPI when toy was built with it and runs under mpirun (before any thread starts);
// refuses, when built without MPI, a launch of several processes. Idempotent.
void init(int* argc, char*** argv);
// Shuts MPI down cleanly (at the end of main; nothing after it may communicate).
void finalize();
// Whether this toy was built with MPI.
bool built_with_mpi();
// The processes a launcher says this run has (OMPI_COMM_WORLD_SIZE, PMI_SIZE; 1 when none).
int launcher_world_size();

// A collective that did not complete in time: a peer died, hangs, or the network is gone.
class Timeout : public Error {
 public:
  Timeout(const std::string& what, std::vector<int> missing) : Error(what), missing_(std::move(missing)) {}
  const std::vector<int>& missing() const { return missing_; }

 private:
  std::vector<int> missing_;
};

// A set of requests waited for together. wait() polls them (yielding the CPU between polls)
// until all complete or `timeout_s` passes, then throws Timeout naming `what` and the ranks
// whose messages had not completed; a peer on this host whose process has ended is named
// at once (within 0.1 s), not after the timeout. poll() tests each once and forgets the
// completed ones (Comm::progress moves them along without testing each).
class Pending {
 public:
  explicit Pending(Comm& c) : c_(c) {}
  void add(Request r) { reqs_.push_back(r); }
  bool empty() const { return reqs_.empty(); }
  bool poll();  // true when every request completed
  // Returns the seconds spent waiting; `meanwhile` runs between polls (more sends to post).
  double wait(double timeout_s, const std::string& what, const std::function<void()>& meanwhile = {});

 private:
  Comm& c_;
  std::vector<Request> reqs_;
};

// Work every wait must keep doing while it polls (the data-parallel trainer's queue of value
// sends: a rank waiting in any collective still feeds the ranks waiting for its values, or
// the two would wait for each other). nullptr: none.
void set_wait_hook(void (*hook)());

// Sends `bytes` to every other rank and receives as much from each: all[r] is rank r's
// (this rank's own copied in). The small per-step and per-run agreements use it.
std::vector<std::vector<uint8_t>> allgather_bytes(Comm& c, const void* data, size_t bytes, int tag, double timeout_s,
                                                  const std::string& what);
// The same for records of different sizes (the sizes go first).
std::vector<std::string> allgather_strings(Comm& c, const std::string& s, int tag, double timeout_s,
                                           const std::string& what);

// The CPUs this process may run on (its affinity mask; the hardware's when unknown).
int affinity_cpus();

}  // namespace toy::dist
