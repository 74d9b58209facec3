#include "toy/dist/comm.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/core.h>

#include "toy/core/text.h"

namespace toy::dist {

namespace {

// One process: the rank is 0 of 1 and nothing is ever sent.
class LocalComm : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend() const override { return "none"; }
  Request isend(const void*, size_t, int to, int) override { fail("[dist] one process: no rank {} to send to", to); }
  Request irecv(void*, size_t, int from, int) override { fail("[dist] one process: no rank {} to receive from", from); }
  bool test(Request&) override { return true; }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

std::unique_ptr<Comm>& world_slot() {
  static std::unique_ptr<Comm> w;
  return w;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end && *end == 0 && n > 0 && n < 1 << 20) ? int(n) : 0;
}

}  // namespace

#ifdef TOY_HAVE_MPI
std::unique_ptr<Comm> make_mpi_comm(int* argc, char*** argv);  // mpi_comm.cpp
void finalize_mpi();
bool built_with_mpi() { return true; }
#else
bool built_with_mpi() { return false; }
#endif

int launcher_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"})
    if (int n = env_int(v)) return n;
  return 1;
}

void init(int* argc, char*** argv) {
  std::unique_ptr<Comm>& w = world_slot();
  if (w) return;
  const int launched = launcher_world_size();
#ifdef TOY_HAVE_MPI
  if (launched > 1 || std::getenv("OMPI_COMM_WORLD_RANK")) {
    w = make_mpi_comm(argc, argv);
    return;
  }
#else
  (void)argc, (void)argv;
  TOY_CHECK(launched <= 1, "toy was built without MPI: the {} processes would each train alone into the same folder "
            "(install libopenmpi-dev and build again: scripts/build.sh finds it)", launched);
#endif
  w = std::make_unique<LocalComm>();
}

void finalize() {
#ifdef TOY_HAVE_MPI
  if (world_slot() && world_slot()->backend() == "mpi") finalize_mpi();
#endif
}

Comm& world() {
  std::unique_ptr<Comm>& w = world_slot();
  if (!w) w = std::make_unique<LocalComm>();  // (a library user that never called init)
  return *w;
}

// ---- waiting ------------------------------------------------------------------------------------

namespace {
void (*g_wait_hook)() = nullptr;
}

void set_wait_hook(void (*hook)()) { g_wait_hook = hook; }

bool Pending::poll() {
  size_t kept = 0;
  for (Request& r : reqs_)
    if (!c_.test(r)) reqs_[kept++] = r;
  reqs_.resize(kept);
  return reqs_.empty();
}

double Pending::wait(double timeout_s, const std::string& what, const std::function<void()>& meanwhile) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  int64_t spins = 0;
  double next_check = 0.1;
  auto missing = [&] {
    std::vector<int> m;
    for (const Request& r : reqs_)
      if (std::find(m.begin(), m.end(), r.peer) == m.end()) m.push_back(r.peer);
    std::sort(m.begin(), m.end());
    return m;
  };
  while (!poll()) {
    if (meanwhile) meanwhile();
    if (g_wait_hook) g_wait_hook();
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (waited > next_check) {  // a peer on this host that has ended: say so now
      next_check = waited + 0.1;
      for (int m : missing())
        if (!c_.peer_alive(m))
          throw Timeout(fmt::format("[dist] {}: {} has ended (killed or crashed)", what, c_.describe_peer(m)), {m});
    }
    if (waited > timeout_s) {
      const std::vector<int> gone = missing();
      std::string ranks;
      for (int m : gone) ranks += (ranks.empty() ? "" : ", ") + c_.describe_peer(m);
      throw Timeout(fmt::format("[dist] {}: no answer from {} in {:.0f} s (--dp-timeout): a process hangs or the "
                                "network between the hosts is down", what, ranks, timeout_s),
                    gone);
    }
    // Yield the core first (the peer may be computing on it), then sleep in short naps: a
    // waiting rank must not take CPU time from the ranks it waits for.
    if (++spins < 200) {
      sched_yield();
    } else {
      const timespec nap{0, spins < 2000 ? 20'000 : 200'000};
      nanosleep(&nap, nullptr);
    }
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<std::vector<uint8_t>> allgather_bytes(Comm& c, const void* data, size_t bytes, int tag, double timeout_s,
                                                  const std::string& what) {
  const int n = c.size(), me = c.rank();
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(n), std::vector<uint8_t>(bytes));
  if (bytes) std::memcpy(all[size_t(me)].data(), data, bytes);
  Pending p(c);
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    p.add(c.irecv(all[size_t(r)].data(), bytes, r, tag));
    p.add(c.isend(data, bytes, r, tag));
  }
  p.wait(timeout_s, what);
  return all;
}

std::vector<std::string> allgather_strings(Comm& c, const std::string& s, int tag, double timeout_s,
                                           const std::string& what) {
  const uint64_t len = s.size();
  const auto lens = allgather_bytes(c, &len, sizeof len, tag, timeout_s, what);
  const int n = c.size(), me = c.rank();
  std::vector<std::string> all(static_cast<size_t>(n));
  Pending p(c);
  for (int r = 0; r < n; ++r) {
    uint64_t l = 0;
    std::memcpy(&l, lens[size_t(r)].data(), sizeof l);
    TOY_CHECK(l < (uint64_t(1) << 32), "[dist] {}: rank {} sent a record of {} bytes", what, r, l);
    all[size_t(r)].resize(size_t(l));
    if (r == me) {
      all[size_t(r)] = s;
      continue;
    }
    p.add(c.irecv(all[size_t(r)].data(), size_t(l), r, tag + 1));
    p.add(c.isend(s.data(), s.size(), r, tag + 1));
  }
  p.wait(timeout_s, what);
  return all;
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace toy::dist
