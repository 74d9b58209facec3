#include "toy/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "toy/core/error.h"
#include "toy/core/machine.h"
#include "toy/core/text.h"

namespace toy {

const char* file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a folder";
    case S_IFIFO: return "a FIFO (named pipe)";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    default: return "not a regular file";
  }
}

int open_regular_file(const std::string& path, const char* who, uint64_t* bytes) {
  const std::string shown = printable(path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == EISDIR) fail("{} '{}' is a folder, not a file", who, shown);
    fail("{} cannot open '{}': {}", who, shown, std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("{} cannot stat '{}': {}", who, shown, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{} '{}' is {}, not a regular file: toy reads only regular files", who, shown, file_kind(st.st_mode));
  }
  // Blocking reads from here on (O_NONBLOCK only kept the open itself from waiting).
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (bytes) *bytes = uint64_t(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, const char* who, uint64_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, who, &size);
  if (size > max_bytes) {
    ::close(fd);
    fail("{} '{}' has {} ({} bytes): more than the {} this can hold", who, printable(path), format_bytes(double(size)),
         size, format_bytes(double(max_bytes)));
  }
  std::string out(size_t(size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail("{} error reading '{}': {}", who, printable(path), std::strerror(err));
    }
    if (n == 0) break;  // the file shrank while being read
    got += size_t(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

void check_output_file(const std::string& path, const char* who, bool allow_char_device) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // missing: it will be created
  TOY_CHECK(S_ISREG(st.st_mode) || (allow_char_device && S_ISCHR(st.st_mode)),
            "{} '{}' is {}: toy writes only regular files", who, printable(path), file_kind(st.st_mode));
}

FileIdentity file_identity(const std::string& path, const char* who) {
  FileIdentity id;
  id.path = path;
  const int fd = open_regular_file(path, who, &id.bytes);
  XXH3_state_t* st = XXH3_createState();
  TOY_CHECK(st != nullptr, "{} out of memory hashing '{}'", who, printable(path));
  XXH3_64bits_reset(st);
  std::vector<char> buf(size_t(1) << 20);
  uint64_t total = 0;
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      XXH3_freeState(st);
      fail("{} cannot read '{}': {}", who, printable(path), std::strerror(err));
    }
    if (n == 0) break;
    XXH3_64bits_update(st, buf.data(), size_t(n));
    total += uint64_t(n);
  }
  ::close(fd);
  id.hash = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  id.bytes = total;
  return id;
}

}  // namespace toy
