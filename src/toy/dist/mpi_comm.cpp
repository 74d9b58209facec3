// The MPI communicator (built when CMake finds MPI: TOY_MPI). Only the main thread calls MPI
// (MPI_THREAD_FUNNELED). Errors return instead of aborting (MPI_ERRORS_RETURN) so that a lost
// peer becomes a toy::Error naming it. Messages over 1 GiB go as several (MPI counts are int).
#include <mpi.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unordered_map>

#include <fmt/core.h>

#include "toy/dist/comm.h"

namespace toy::dist {

namespace {

constexpr size_t kMaxPiece = size_t(1) << 30;

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, size_t(len));
}

class MpiComm : public Comm {
 public:
  MpiComm() {
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
    // Every rank's host and process id: a waiting rank can tell a peer on its host has ended.
    Where me{};
    gethostname(me.host, sizeof me.host - 1);
    me.pid = int64_t(getpid());
    where_.resize(size_t(size_));
    MPI_Allgather(&me, int(sizeof me), MPI_BYTE, where_.data(), int(sizeof me), MPI_BYTE, MPI_COMM_WORLD);
  }
  bool peer_alive(int r) const override {
    if (r < 0 || r >= size_ || std::strncmp(where_[size_t(r)].host, where_[size_t(rank_)].host, sizeof me_host) != 0)
      return true;
    return ::kill(pid_t(where_[size_t(r)].pid), 0) == 0 || errno != ESRCH;
  }
  std::string describe_peer(int r) const override {
    if (r < 0 || r >= size_) return fmt::format("rank {}", r);
    return fmt::format("rank {} (process {} on {})", r, where_[size_t(r)].pid, where_[size_t(r)].host);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend() const override { return "mpi"; }

  Request isend(const void* data, size_t bytes, int to, int tag) override {
    return start(const_cast<void*>(data), bytes, to, tag, true);
  }
  Request irecv(void* data, size_t bytes, int from, int tag) override { return start(data, bytes, from, tag, false); }
  // (A probe runs OpenMPI's progress engine once: fragments go out and come in.)
  void progress() override {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
  }

  bool test(Request& r) override {
    auto it = live_.find(r.id);
    if (it == live_.end()) return true;
    std::vector<MPI_Request>& parts = it->second;
    int done = 0;
    std::vector<MPI_Status> st(parts.size());
    const int rc = MPI_Testall(int(parts.size()), parts.data(), &done, st.data());
    if (rc != MPI_SUCCESS) {
      live_.erase(it);
      fail("[dist] the connection to rank {} failed: {}", r.peer, mpi_error(rc));
    }
    if (!done) return false;
    live_.erase(it);
    return true;
  }

  [[noreturn]] void abort(int code) override {
    // MPI_Abort reaches the other ranks through the launcher; when the network to them is
    // gone it may never return: this process ends a few seconds later whatever it does.
    std::thread([code] {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      std::_Exit(code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  Request start(void* data, size_t bytes, int peer, int tag, bool send) {
    TOY_CHECK(peer >= 0 && peer < size_ && peer != rank_, "[dist] rank {} cannot message rank {} (of {})", rank_, peer,
              size_);
    std::vector<MPI_Request> parts;
    size_t at = 0;
    do {
      const size_t n = std::min(kMaxPiece, bytes - at);
      MPI_Request q;
      char* p = static_cast<char*>(data) + at;
      const int rc = send ? MPI_Isend(p, int(n), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &q)
                          : MPI_Irecv(p, int(n), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &q);
      if (rc != MPI_SUCCESS) fail("[dist] {} rank {} failed: {}", send ? "sending to" : "receiving from", peer,
                                  mpi_error(rc));
      parts.push_back(q);
      at += n;
    } while (at < bytes);
    const int64_t id = next_id_++;
    live_.emplace(id, std::move(parts));
    return Request{id, peer};
  }

  static constexpr size_t me_host = 64;
  struct Where {
    char host[me_host];
    int64_t pid;
  };
  std::vector<Where> where_;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  int64_t next_id_ = 0;
  std::unordered_map<int64_t, std::vector<MPI_Request>> live_;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(int* argc, char*** argv) {
  int provided = 0;
  const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) fail("[dist] MPI_Init failed: {}", mpi_error(rc));
  return std::make_unique<MpiComm>();
}

void finalize_mpi() {
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
}

}  // namespace toy::dist
