#include "toy/serve/connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <system_error>

namespace toy::serve {

Connection*& current_connection() {
  thread_local Connection* c = nullptr;
  return c;
}

bool wait_socket(int fd, short events, Clock::duration d) {
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::max(d, Clock::duration::zero())).count();
  pollfd p{fd, events, 0};
  int r;
  do r = ::poll(&p, 1, int(std::min<int64_t>(ms + 1, INT_MAX)));
  while (r < 0 && errno == EINTR);
  return r > 0 && (p.revents & (events | POLLHUP | POLLERR));
}

bool peer_gone(int fd) {
  pollfd p{fd, short(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP)) return true;  // reset, or closed both ways
  char c;
  const ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r > 0) return false;  // bytes still to read (a pipelined request): not gone yet
  return r == 0 || (p.revents & POLLRDHUP);
}

void linger_close(int fd) {
  ::shutdown(fd, SHUT_WR);
  char b[4096];
  const auto end = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < end && wait_socket(fd, POLLIN, std::chrono::milliseconds(200)) &&
         ::recv(fd, b, sizeof b, MSG_DONTWAIT) > 0) {
  }
  ::close(fd);
}

ConnectionStream::ConnectionStream(Connection& c, Clock::duration idle, Clock::duration total, Clock::duration write,
                                   size_t max_request_bytes)
    : c_(c), idle_(idle), total_(total), write_(write), max_request_(max_request_bytes) {}

bool ConnectionStream::next_request(Clock::duration keep_alive, const std::function<bool()>& stopping) {
  for (const auto until = Clock::now() + keep_alive; at_ == len_;) {
    if (stopping() || Clock::now() >= until) return false;
    if (wait_socket(c_.sock, POLLIN, std::min<Clock::duration>(std::chrono::milliseconds(100), until - Clock::now()))) {
      if (peer_gone(c_.sock)) return false;
      break;
    }
  }
  deadline_ = Clock::now() + total_;
  head_ = request_ = written_ = 0;
  match_ = 0;
  in_head_ = true;
  return true;
}

bool ConnectionStream::is_readable() const {
  if (at_ < len_) return true;
  const auto now = Clock::now();
  return now < deadline_ && wait_socket(c_.sock, POLLIN, std::min(idle_, deadline_ - now));
}

bool ConnectionStream::is_writable() const {
  // (A client that is gone makes the write itself fail; one that only closed its sending side
  // may still read the answer.)
  return wait_socket(c_.sock, POLLOUT, write_);
}

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  if (at_ == len_) {
    const auto now = Clock::now();
    if (now >= deadline_ || !wait_socket(c_.sock, POLLIN, std::min(idle_, deadline_ - now))) {
      c_.timed_out = true;
      return -1;
    }
    ssize_t r;
    do r = ::recv(c_.sock, buf_, sizeof buf_, 0);
    while (r < 0 && errno == EINTR);
    if (r <= 0) return r;
    at_ = 0, len_ = size_t(r);
  }
  size_t n = std::min(size, len_ - at_);
  if (in_head_) {  // up to the blank line that ends the headers: at most kMaxHead bytes
    size_t i = 0;
    while (i < n && in_head_) {
      const char ch = buf_[at_ + i++];
      match_ = ch == "\r\n\r\n"[match_] ? match_ + 1 : ch == '\r' ? 1 : 0;
      in_head_ = match_ < 4;
    }
    n = i;
    head_ += n;
    if (head_ > kMaxHead) {
      c_.head_too_large = true;
      return -1;
    }
  }
  request_ += n;
  if (request_ > max_request_) return -1;  // (a chunked body past the limit: its length is not stated)
  std::memcpy(ptr, buf_ + at_, n);
  at_ += n;
  return ssize_t(n);
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  if (!is_writable()) return -1;
  ssize_t r;
  do r = ::send(c_.sock, ptr, size, MSG_NOSIGNAL);
  while (r < 0 && errno == EINTR);
  if (r > 0) written_ += size_t(r);
  return r;
}

namespace {
void address_of(int sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  const int r = peer ? ::getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len)
                     : ::getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len);
  if (r != 0) return;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0)
    ip = host, port = std::atoi(serv);
}
}  // namespace

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const { address_of(c_.sock, true, ip, port); }
void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const { address_of(c_.sock, false, ip, port); }

ElasticPool::~ElasticPool() { shutdown(); }

void ElasticPool::enqueue(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.push_back(std::move(fn));
  if (jobs_.size() > idle_ && threads_.size() < max_) {
    try {
      threads_.emplace_back([this] { work(); });
      return;
    } catch (const std::system_error&) {
      // no thread to be had: the job waits for an idle one
    }
  }
  cv_.notify_one();
}

void ElasticPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ElasticPool::work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    ++idle_;
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    --idle_;
    if (jobs_.empty()) return;  // stopping, nothing left
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace toy::serve
