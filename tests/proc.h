// Running the toy program from a test as a user would: arguments (no shell), extra
// environment, an optional address-space limit, a timeout (a hang is a failure, never a stuck
// test), and stdout, stderr and the exit status kept apart.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace toy::test {

struct ProcResult {
  int status = -1;        // exit code when it exited
  int signal = 0;         // the signal that ended it, if any
  bool timed_out = false;
  std::string out, err;
};

struct ProcOptions {
  std::vector<std::string> env;  // "NAME=value", added to the environment
  double timeout_s = 120;
  uint64_t address_space = 0;    // RLIMIT_AS in bytes (0 = unlimited)
  std::string cwd;
  bool ignore_sighup = false;    // as under nohup
  std::string stdin_path;        // standard input (default /dev/null)
};

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// read_all, then the file removed: a child's captured stdout or stderr, once read, is not left
// behind in the temp folder (a suite run left ~100 such files).
inline std::string take_file(const std::string& path) {
  std::string text = read_all(path);
  std::remove(path.c_str());
  return text;
}

// Starts program `bin` with args; returns its pid (stdout/stderr go to the given files).
inline pid_t spawn_program(const std::string& program, const std::vector<std::string>& args, const ProcOptions& o,
                           const std::string& out_path, const std::string& err_path) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open(o.stdin_path.empty() ? "/dev/null" : o.stdin_path.c_str(), O_RDONLY);
    dup2(out, 1), dup2(err, 2), dup2(in, 0);
    setpgid(0, 0);
    // Whatever the test runner ignores (nohup, CI), toy starts with the default actions.
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
    if (o.ignore_sighup) signal(SIGHUP, SIG_IGN);
    for (const std::string& e : o.env) putenv(const_cast<char*>(e.c_str()));
    if (o.address_space) {
      rlimit rl{rlim_t(o.address_space), rlim_t(o.address_space)};
      setrlimit(RLIMIT_AS, &rl);
    }
    if (!o.cwd.empty() && chdir(o.cwd.c_str()) != 0) _exit(127);
    std::vector<char*> argv;
    std::string bin = program;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Starts toy with args; returns its pid (stdout/stderr go to the given files).
inline pid_t spawn_toy(const std::vector<std::string>& args, const ProcOptions& o, const std::string& out_path,
                       const std::string& err_path) {
  return spawn_program(TOY_BINARY, args, o, out_path, err_path);
}

// Waits for pid up to timeout_s (then kills it); fills status/signal/timed_out.
inline void wait_toy(pid_t pid, double timeout_s, ProcResult& r) {
  int st = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    const pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      r.timed_out = true;
      kill(-pid, SIGKILL);  // its process group: what it started too (mpirun's ranks)
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFEXITED(st)) r.status = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) r.signal = WTERMSIG(st);
}

inline ProcResult run_program(const std::string& program, const std::vector<std::string>& args,
                              const ProcOptions& o = {}) {
  static int counter = 0;
  const std::string base = (std::filesystem::path(::testing::TempDir()) /
                            ("toy_proc_" + std::to_string(getpid()) + "_" + std::to_string(counter++)))
                               .string();
  ProcResult r;
  const pid_t pid = spawn_program(program, args, o, base + ".out", base + ".err");
  wait_toy(pid, o.timeout_s, r);
  r.out = read_all(base + ".out");
  r.err = read_all(base + ".err");
  std::remove((base + ".out").c_str());
  std::remove((base + ".err").c_str());
  return r;
}

inline ProcResult run_toy(const std::vector<std::string>& args, const ProcOptions& o = {}) {
  return run_program(TOY_BINARY, args, o);
}

// Counts the "step" events a run has written to its events.jsonl so far.
inline size_t step_events(const std::string& events_path) {
  const std::string text = read_all(events_path);
  size_t n = 0;
  for (size_t p = text.find("\"event\":\"step\""); p != std::string::npos; p = text.find("\"event\":\"step\"", p + 1))
    ++n;
  return n;
}

// Runs toy with args until `events_path` holds more than `steps` step events (60 s at most),
// then sends it `sig` and waits for it to end (60 s at most, then SIGKILL: a hang fails the
// test, never blocks it). *seen gets the step events counted before the signal.
inline ProcResult interrupt_toy_after_steps(const std::vector<std::string>& args, const std::string& events_path,
                                            size_t steps, size_t* seen, int sig = SIGINT) {
  const std::string base = (std::filesystem::path(::testing::TempDir()) / ("toy_int_" + std::to_string(getpid())))
                               .string();
  ProcResult r;
  const pid_t pid = spawn_toy(args, ProcOptions{}, base + ".out", base + ".err");
  *seen = 0;
  for (int i = 0; i < 1200 && *seen <= steps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    *seen = step_events(events_path);
  }
  kill(pid, sig);
  wait_toy(pid, 60, r);
  r.out = take_file(base + ".out");
  r.err = take_file(base + ".err");
  return r;
}

// Printable summary for assertion messages.
inline std::string describe(const ProcResult& r) {
  return "exit " + std::to_string(r.status) + (r.signal ? " signal " + std::to_string(r.signal) : "") +
         (r.timed_out ? " (timed out)" : "") + "\nstderr: " + r.err + "\nstdout: " + r.out.substr(0, 2000);
}

// Whether this binary was built with AddressSanitizer (which reserves terabytes of address
// space, so address-space limits cannot be used under it).
inline bool under_asan() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

}  // namespace toy::test
