// The connection side of toy serve's HTTP front, in place of cpp-httplib 0.11's own (compiled
// into Debian's libcpp-httplib, so its limits cannot be changed by a define):
//   - ConnectionStream reads a request under one deadline for its request line, headers and
//     body, with no silence longer than an idle bound, and headers capped in size: a client
//     trickling a byte at a time (slowloris) is dropped with 408 instead of holding a thread
//     for as long as it keeps trickling, and 100 KB of headers get 431 at once.
//   - ElasticPool starts a thread per connection as needed, up to a cap, so slow clients hold
//     only their own threads and never starve the others of one.
//   - The connection a handler serves is known to it (current_connection()): a non-streaming
//     request whose client has gone cancels its job.
#pragma once
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace toy::serve {

using Clock = std::chrono::steady_clock;

struct Connection {
  int sock = -1;                // -1: no socket (process_raw)
  bool close_after = false;     // answer this request, then close
  bool head_too_large = false;  // the request line and headers passed kMaxHead
  bool timed_out = false;       // the request did not arrive within its deadline
};

// The connection the calling thread's handler serves (nullptr outside one).
Connection*& current_connection();

inline constexpr size_t kMaxHead = 32 << 10;  // request line + headers, bytes

// Waits up to d for the socket to be ready for `events` (POLLIN / POLLOUT).
bool wait_socket(int fd, short events, Clock::duration d);
// The client closed (or reset) its connection, with nothing left to read from it (a client
// that closed only its sending side after its request counts as gone too, as nginx takes it).
bool peer_gone(int fd);
// Closes after sending FIN and draining what the client still sends (briefly), so unread input
// does not turn the close into a reset that destroys the answer.
void linger_close(int fd);

class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(Connection& c, Clock::duration idle, Clock::duration total, Clock::duration write,
                   size_t max_request_bytes);
  // Waits up to keep_alive for the next request's first byte (false: none came, or stopping()).
  bool next_request(Clock::duration keep_alive, const std::function<bool()>& stopping);
  size_t written() const { return written_; }

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return c_.sock; }

 private:
  Connection& c_;
  Clock::duration idle_, total_, write_;
  size_t max_request_;
  Clock::time_point deadline_{};
  char buf_[4096];
  size_t at_ = 0, len_ = 0, head_ = 0, request_ = 0, written_ = 0;
  int match_ = 0;  // how much of "\r\n\r\n" the head has ended with
  bool in_head_ = true;
};

// Threads started as connections need them, up to `max` at once; idle ones take new work.
class ElasticPool final : public httplib::TaskQueue {
 public:
  explicit ElasticPool(size_t max) : max_(max) {}
  ~ElasticPool() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

 private:
  void work();
  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

}  // namespace toy::serve
