// A raw loopback HTTP/1.1 client: reads a stream as it arrives (toy bench serve's time to
// first token), and plays the clients a library will not (the tests' slow readers, clients
// that leave mid-stream, broken requests).
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

namespace toy::serve {

class RawHttp {
 public:
  explicit RawHttp(int port, int recv_buffer = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (recv_buffer > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &recv_buffer, sizeof recv_buffer);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~RawHttp() { close(); }
  RawHttp(const RawHttp&) = delete;
  RawHttp& operator=(const RawHttp&) = delete;
  bool ok() const { return ok_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  bool send(const std::string& data) {
    size_t at = 0;
    while (at < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + at, data.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += size_t(n);
    }
    return true;
  }
  // A POST with a JSON body (Connection: close, so the answer ends with the connection).
  bool post(const std::string& path, const std::string& body, const std::string& extra_headers = "") {
    return send("POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n" +
                extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }
  // Appends what arrives within timeout_ms to `into`; false at the end of the stream (or error).
  bool read_some(std::string& into, int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return true;  // nothing yet
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    into.append(buf, size_t(n));
    return true;
  }
  // Everything until the server closes the connection (at most timeout_s).
  std::string read_all(double timeout_s = 60) {
    std::string out;
    const auto t0 = std::chrono::steady_clock::now();
    while (read_some(out, 100))
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) break;
    return out;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

// The status code of a raw response ("HTTP/1.1 200 OK..."), or 0.
inline int status_of(const std::string& response) {
  if (response.size() < 12 || response.rfind("HTTP/1.", 0) != 0) return 0;
  return std::atoi(response.c_str() + 9);
}

// The body of a raw response, de-chunked when it was sent chunked.
inline std::string body_of(const std::string& response) {
  const size_t head = response.find("\r\n\r\n");
  if (head == std::string::npos) return "";
  std::string body = response.substr(head + 4);
  if (response.substr(0, head).find("Transfer-Encoding: chunked") == std::string::npos) return body;
  std::string out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t eol = body.find("\r\n", at);
    if (eol == std::string::npos) break;
    const size_t n = std::stoul(body.substr(at, eol - at), nullptr, 16);
    if (n == 0 || eol + 2 + n > body.size()) {
      if (n) out += body.substr(eol + 2);
      break;
    }
    out += body.substr(eol + 2, n);
    at = eol + 2 + n + 2;
  }
  return out;
}

}  // namespace toy::serve
