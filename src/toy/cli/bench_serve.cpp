// `toy bench serve -m M --clients N [--json]`: serving throughput with continuous batching.
// Starts `toy serve` on a free loopback port (N slots), then N concurrent clients each stream
// one completion (a 64-token prompt of random ids, 128 generated tokens, end-of-text ignored);
// total generated tokens/s over the wall time and the median time to first token, against one
// client alone measured in the same run (the ratio is what batching buys: GEMVs become GEMMs).
// When llama-server is built (scripts/llama_peer.sh --server, or --peer PATH), the same
// clients run against `llama-server -m M -np N -c 4096` on the same file, alternating rounds.
// With --long-prompt L, each round also measures the stall a long prompt causes: N - 1
// clients stream while one more sends L prompt tokens; the longest gap between two tokens of
// a stream while that prompt is prefilled, with the prompt in chunks (--batch-size, the
// server's default) and whole (--batch-size 0), each on a fresh server (and on llama-server,
// when built, with its default batch sizes).
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "toy/cli/bench_util.h"
#include "toy/cli/commands.h"
#include "toy/cli/flags.h"
#include "toy/core/error.h"
#include "toy/core/rng.h"
#include "toy/core/runtime.h"
#include "toy/io/model_file.h"
#include "toy/serve/raw_http.h"

namespace toy::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct ServeBenchFlags {
  std::string model, peer, cache_type = "f32";
  int clients = 8, threads = 0, rounds = 3;
  int64_t prompt = 64, tokens = 128, long_prompt = 0, batch = 512;
  bool json = false, no_peer = false;
};

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  TOY_CHECK(port > 0, "[bench serve] no free loopback port");
  return port;
}

// A server process (toy serve or llama-server), stopped with SIGTERM when it goes.
class ServerProcess {
 public:
  ServerProcess(std::vector<std::string> argv, int port, const std::string& what) : port_(port), what_(what) {
    log_ = (fs::temp_directory_path() / fmt::format("toy_bench_serve_{}_{}.log", getpid(), port)).string();
    pid_ = fork();
    if (pid_ == 0) {
      FILE* f = std::fopen(log_.c_str(), "w");
      if (f) dup2(fileno(f), 1), dup2(fileno(f), 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    // Ready once /health answers 200 (llama-server answers 503 while it loads).
    for (int i = 0; i < 1200; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        throw Error(fmt::format("[bench serve] {} exited at start: {}", what_, tail_of_log()));
      }
      serve::RawHttp h(port_);
      if (!h.ok() || !h.send("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")) continue;
      if (serve::status_of(h.read_all(5)) == 200) return;
    }
    throw Error(fmt::format("[bench serve] {} did not become ready in 60 s: {}", what_, tail_of_log()));
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st = 0;
      for (int i = 0; i < 200 && waitpid(pid_, &st, WNOHANG) != pid_; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
    }
    std::remove(log_.c_str());
  }
  int port() const { return port_; }

 private:
  std::string tail_of_log() const {
    std::string s;
    if (FILE* f = std::fopen(log_.c_str(), "r")) {
      char buf[4096];
      while (size_t n = std::fread(buf, 1, sizeof buf, f)) s.append(buf, n);
      std::fclose(f);
    }
    return s.size() > 600 ? s.substr(s.size() - 600) : s;
  }
  pid_t pid_ = -1;
  int port_;
  std::string what_, log_;
};

struct StreamResult {
  double ttft_s = -1, seconds = 0;
  int64_t tokens = 0;
  std::string error;
};

// Starts a greedy streamed completion of `prompt` (end-of-text ignored); false if it cannot.
bool start_stream(serve::RawHttp& h, const std::vector<int32_t>& prompt, int64_t tokens, bool usage) {
  nlohmann::json body = {{"prompt", prompt}, {"max_tokens", tokens}, {"temperature", 0}, {"stream", true},
                         {"ignore_eos", true}};
  if (usage) body["stream_options"] = {{"include_usage", true}};
  return h.ok() && h.post("/v1/completions", body.dump());
}

// The pieces of text (each "text" field of a choice; `empty_too`: also those with no text, as
// llama-server sends for a token whose bytes it holds back) in `response` past `scanned`, which
// moves past them.
int64_t new_pieces(const std::string& response, size_t& scanned, bool empty_too = false) {
  int64_t n = 0;
  for (size_t at; (at = response.find("\"text\":\"", scanned)) != std::string::npos; scanned = at + 8)
    n += empty_too || response.compare(at, 10, "\"text\":\"\"") != 0;
  return n;
}

// One streamed completion; the first piece of text marks the time to first token.
StreamResult stream_once(int port, const std::vector<int32_t>& prompt, int64_t tokens) {
  StreamResult r;
  const auto t0 = Clock::now();
  serve::RawHttp h(port);
  if (!start_stream(h, prompt, tokens, true)) {
    r.error = "cannot connect";
    return r;
  }
  std::string response;
  int64_t chunks = 0;
  size_t scanned = 0;
  while (h.read_some(response, 100)) {
    if (Clock::now() - t0 > std::chrono::minutes(5)) break;
    const int64_t n = new_pieces(response, scanned);
    if (n > 0 && r.ttft_s < 0) r.ttft_s = std::chrono::duration<double>(Clock::now() - t0).count();
    chunks += n;
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (serve::status_of(response) != 200) {
    r.error = "HTTP " + std::to_string(serve::status_of(response)) + ": " + serve::body_of(response).substr(0, 300);
    return r;
  }
  // Tokens: the usage chunk's count when the server sends one, else one token per chunk.
  const std::string body_text = serve::body_of(response);
  const size_t u = body_text.rfind("\"completion_tokens\":");
  r.tokens = u != std::string::npos ? std::atoll(body_text.c_str() + u + 20) : chunks;
  return r;
}

struct RoundResult {
  double tokens_per_s = 0, ttft_ms_median = 0;
};

// `clients` concurrent streams, each of its own random prompt.
RoundResult run_round(int port, int clients, int64_t prompt_len, int64_t tokens, int32_t vocab, uint64_t seed) {
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(clients));
  uint64_t counter = 0;
  for (auto& p : prompts)
    for (int64_t i = 0; i < prompt_len; ++i) p.push_back(int32_t(philox4x32(seed, 7, counter++)[0] % uint32_t(vocab)));
  std::vector<StreamResult> res(static_cast<size_t>(clients));
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] { res[size_t(c)] = stream_once(port, prompts[size_t(c)], tokens); });
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  int64_t total = 0;
  std::vector<double> ttft;
  for (const StreamResult& r : res) {
    TOY_CHECK(r.error.empty(), "[bench serve] a client failed: {}", r.error);
    total += r.tokens;
    ttft.push_back(r.ttft_s * 1000);
  }
  std::sort(ttft.begin(), ttft.end());
  return {double(total) / wall, ttft[ttft.size() / 2]};
}

// A stream that notes when each token's event arrives (seconds after `origin`), until the
// stream ends or it has a piece from after `done_at` (set by another thread; negative: not
// yet), when it hangs up (the server cancels the job).
struct TimedStream {
  std::vector<double> at;
  std::string error;
  std::string ended_with;  // an error event that ended the stream (llama-server sends some)
};

TimedStream stream_timed(int port, const std::vector<int32_t>& prompt, int64_t tokens, Clock::time_point origin,
                         const std::atomic<double>& done_at, std::atomic<int>& started) {
  TimedStream r;
  serve::RawHttp h(port);
  if (!start_stream(h, prompt, tokens, false)) {
    r.error = "cannot connect";
    return r;
  }
  std::string response;
  size_t scanned = 0;
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - origin).count(); };
  const double t0 = since();
  while (h.read_some(response, 5) && since() - t0 < 600) {
    const int64_t n = new_pieces(response, scanned, true);  // (each token's event: the pace of decoding)
    if (n > 0 && r.at.empty()) ++started;
    r.at.insert(r.at.end(), size_t(n), since());  // (pieces read together arrived together)
    const double done = done_at.load();
    if (done >= 0 && !r.at.empty() && r.at.back() > done) break;
  }
  if (r.at.empty()) r.error = "no text: " + response.substr(0, 300);
  if (const size_t e = response.find("data: {\"error\""); e != std::string::npos)
    r.ended_with = response.substr(e + 6, response.find('\n', e) - e - 6).substr(0, 200);
  return r;
}

struct StallResult {
  double stall_ms = 0, long_prompt_ms = 0;
  std::string ended_with;  // a stream's error event, if one ended that way
  bool outlived = true;  // every stream had a token after the long prompt was done (else the stall is a lower bound)
};

// `clients` - 1 streams; once each has its first token, one more client sends `long_len`
// prompt tokens (one token generated). The stall: the longest gap between two tokens of a
// stream that overlaps the time that request took.
StallResult measure_stall(int port, int clients, int64_t prompt_len, int64_t long_len, int64_t stream_tokens,
                          int32_t vocab, uint64_t seed) {
  const int streams = std::max(1, clients - 1);
  uint64_t counter = 0;
  auto ids = [&](int64_t n) {
    std::vector<int32_t> p;
    for (int64_t i = 0; i < n; ++i) p.push_back(int32_t(philox4x32(seed, 11, counter++)[0] % uint32_t(vocab)));
    return p;
  };
  std::vector<std::vector<int32_t>> prompts;
  for (int c = 0; c < streams; ++c) prompts.push_back(ids(prompt_len));
  const std::vector<int32_t> long_prompt = ids(long_len);
  const Clock::time_point origin = Clock::now();
  std::atomic<double> done_at{-1.0};
  std::atomic<int> started{0};
  std::vector<TimedStream> res(static_cast<size_t>(streams));
  std::vector<std::thread> threads;
  for (int c = 0; c < streams; ++c)
    threads.emplace_back([&, c] {
      res[size_t(c)] = stream_timed(port, prompts[size_t(c)], stream_tokens, origin, done_at, started);
    });
  auto since = [&] { return std::chrono::duration<double>(Clock::now() - origin).count(); };
  while (started.load() < streams && since() < 300) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // (the streams in their stride)
  const double sent = since();
  const nlohmann::json body = {{"prompt", long_prompt}, {"max_tokens", 1}, {"temperature", 0}, {"ignore_eos", true}};
  serve::RawHttp h(port);
  const bool posted = h.ok() && h.post("/v1/completions", body.dump());
  const std::string response = posted ? h.read_all(600) : "";
  const double done = since();
  done_at = done;
  for (auto& t : threads) t.join();
  TOY_CHECK(serve::status_of(response) == 200, "[bench serve] the long prompt failed: {}",
            posted ? response.substr(0, 300) : "cannot connect");
  StallResult r;
  r.long_prompt_ms = (done - sent) * 1000;
  for (const TimedStream& s : res) {
    TOY_CHECK(s.error.empty(), "[bench serve] a stream failed: {}", s.error);
    for (size_t i = 1; i < s.at.size(); ++i)
      if (s.at[i] > sent && s.at[i - 1] < done) r.stall_ms = std::max(r.stall_ms, (s.at[i] - s.at[i - 1]) * 1000);
    r.outlived = r.outlived && s.at.back() > done;
    if (r.ended_with.empty()) r.ended_with = s.ended_with;
  }
  return r;
}

std::string find_llama_server(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* home = std::getenv("HOME");
  const char* dir = std::getenv("TOY_PEER_DIR");
  const std::string p = (dir ? std::string(dir) : std::string(home ? home : "") + "/.cache/toy/llama.cpp") +
                        "/build/bin/llama-server";
  return fs::exists(p) ? p : "";
}

int run_serve_bench(const ServeBenchFlags& f) {
  int32_t vocab = 0;
  {
    gguf::Reader r(f.model);
    vocab = int32_t(config_from_gguf(r).vocab);
  }
  const int threads = f.threads ? f.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  const std::string toy = fs::read_symlink("/proc/self/exe").string();
  const int64_t slot_ctx = 4096 / f.clients;  // llama-server -c 4096 -np N gives each slot 4096 / N
  TOY_CHECK(f.prompt + f.tokens + 1 <= slot_ctx, "[bench serve] {} + {} tokens do not fit a slot of {} (4096 / {} "
            "clients)", f.prompt, f.tokens, slot_ctx, f.clients);
  const std::string llama = f.no_peer ? "" : find_llama_server(f.peer);

  // Each round: toy serve (one client alone, then all together), then llama-server (all
  // together), each a fresh process on a fresh port, so drift hits both alike.
  std::vector<double> many, ttft, single, peer_many, peer_ttft, stall_chunked, stall_whole, long_chunked, long_whole;
  std::vector<double> peer_stall, peer_long;
  std::string peer_stream_error;  // an error event llama-server ended a stream with
  bool stall_bounded = false, peer_stall_bounded = false;  // a stream ended before the long prompt was done
  const std::vector<int32_t> warm = {1, 2, 3, 4};
  for (int round = 0; round < f.rounds; ++round) {
    const uint64_t seed = 1000 + uint64_t(round);
    {
      const int port = free_port();
      ServerProcess s({toy, "serve", "-m", f.model, "--port", std::to_string(port), "--parallel",
                       std::to_string(f.clients), "--ctx", std::to_string(slot_ctx), "--threads", std::to_string(threads),
                       "--cache-type", f.cache_type, "--batch-size", std::to_string(f.batch)},
                      port, "toy serve");
      stream_once(port, warm, 4);
      single.push_back(run_round(port, 1, f.prompt, f.tokens, vocab, seed).tokens_per_s);
      const RoundResult r = run_round(port, f.clients, f.prompt, f.tokens, vocab, seed + 100);
      many.push_back(r.tokens_per_s), ttft.push_back(r.ttft_ms_median);
    }
    if (!llama.empty()) {
      const int port = free_port();
      ServerProcess s({llama, "-m", f.model, "--host", "127.0.0.1", "--port", std::to_string(port), "-np",
                       std::to_string(f.clients), "-c", "4096", "-t", std::to_string(threads)},
                      port, "llama-server");
      stream_once(port, warm, 4);
      const RoundResult r = run_round(port, f.clients, f.prompt, f.tokens, vocab, seed + 100);
      peer_many.push_back(r.tokens_per_s), peer_ttft.push_back(r.ttft_ms_median);
    }
    // The stall a long prompt causes, chunked and whole (slots long enough for it).
    for (int64_t batch : {f.batch, int64_t(0)}) {
      if (f.long_prompt == 0) break;
      const int port = free_port();
      const int64_t ctx = std::max(f.long_prompt + 2, f.prompt + f.tokens + 1);
      ServerProcess s({toy, "serve", "-m", f.model, "--port", std::to_string(port), "--parallel",
                       std::to_string(f.clients), "--ctx", std::to_string(ctx), "--threads", std::to_string(threads),
                       "--cache-type", f.cache_type, "--batch-size", std::to_string(batch)},
                      port, "toy serve");
      stream_once(port, warm, 4);
      const StallResult r =
          measure_stall(port, f.clients, f.prompt, f.long_prompt, ctx - f.prompt - 1, vocab, seed + 200);
      (batch ? stall_chunked : stall_whole).push_back(r.stall_ms);
      (batch ? long_chunked : long_whole).push_back(r.long_prompt_ms);
      stall_bounded = stall_bounded || !r.outlived;
      TOY_CHECK(r.ended_with.empty(), "[bench serve] toy serve ended a stream with an error: {}", r.ended_with);
    }
    if (!llama.empty() && f.long_prompt > 0) {  // (its defaults: -b 2048 -ub 512)
      const int port = free_port();
      const int64_t ctx = std::max(f.long_prompt + 2, f.prompt + f.tokens + 1);
      ServerProcess s({llama, "-m", f.model, "--host", "127.0.0.1", "--port", std::to_string(port), "-np",
                       std::to_string(f.clients), "-c", std::to_string((ctx + 256) * f.clients), "-t",
                       std::to_string(threads)},  // (+256: it rounds a slot's context down)
                      port, "llama-server");
      stream_once(port, warm, 4);
      const StallResult r =
          measure_stall(port, f.clients, f.prompt, f.long_prompt, ctx - f.prompt - 1, vocab, seed + 200);
      peer_stall.push_back(r.stall_ms), peer_long.push_back(r.long_prompt_ms);
      peer_stall_bounded = peer_stall_bounded || !r.outlived;
      if (!r.ended_with.empty()) peer_stream_error = r.ended_with;
    }
    if (!f.json && f.long_prompt > 0)
      std::fprintf(stderr, "round %d/%d: a %lld-token prompt beside %d streams: longest gap %.0f ms in chunks, %.0f ms whole\n",
                   round + 1, f.rounds, static_cast<long long>(f.long_prompt), std::max(1, f.clients - 1),
                   stall_chunked.back(), stall_whole.back());
    if (!f.json)
      std::fprintf(stderr, "round %d/%d: toy %d clients %.1f tok/s, 1 client %.1f tok/s%s\n", round + 1, f.rounds,
                   f.clients, many.back(), single.back(),
                   peer_many.empty() ? "" : fmt::format("; llama-server {:.1f} tok/s", peer_many.back()).c_str());
  }
  nlohmann::json j = {{"clients", f.clients},
                      {"tokens_per_s", median(many)},
                      {"ttft_ms_median", median(ttft)},
                      {"single_client_tokens_per_s", median(single)},
                      {"ratio", median(many) / median(single)},
                      {"prompt_tokens", f.prompt},
                      {"generated_tokens", f.tokens},
                      {"rounds", f.rounds},
                      {"cache_type", f.cache_type},
                      {"batch_size", f.batch},
                      {"threads", threads},
                      {"model", f.model},
                      {"cpu", cpu_name()}};
  if (!peer_many.empty()) {
    j["llama_server_tokens_per_s"] = median(peer_many);
    j["llama_server_ttft_ms_median"] = median(peer_ttft);
    j["vs_llama_server"] = median(many) / median(peer_many);
  }
  if (f.long_prompt > 0) {
    j["long_prompt_tokens"] = f.long_prompt;
    j["stall_ms_chunked"] = median(stall_chunked);
    j["stall_ms_whole"] = median(stall_whole);
    j["stall_ratio"] = median(stall_chunked) > 0 ? nlohmann::json(median(stall_whole) / median(stall_chunked)) : nullptr;
    j["stall_lower_bound"] = stall_bounded;
    j["long_prompt_ms_chunked"] = median(long_chunked);
    j["long_prompt_ms_whole"] = median(long_whole);
    if (!peer_stall.empty()) {
      j["llama_server_stall_ms"] = median(peer_stall);
      j["llama_server_long_prompt_ms"] = median(peer_long);
      j["llama_server_stall_lower_bound"] = peer_stall_bounded;
      if (!peer_stream_error.empty()) j["llama_server_stream_error"] = peer_stream_error;
    }
  }
  if (f.json) {
    std::printf("%s\n", bench_line(j).c_str());
  } else {
    std::printf("toy serve, %s, %d threads, %s: medians of %d rounds\n", f.model.c_str(), threads, cpu_label().c_str(),
                f.rounds);
    std::printf("  %d clients: %.1f tok/s, time to first token %.0f ms (median)\n", f.clients, median(many),
                median(ttft));
    std::printf("  1 client:  %.1f tok/s   -> %.2fx with %d clients (target 3x at 8)\n", median(single),
                median(many) / median(single), f.clients);
    if (!peer_many.empty())
      std::printf("  llama-server -np %d -c 4096: %.1f tok/s, first token %.0f ms -> toy/llama-server %.2f (target 1.0)\n",
                  f.clients, median(peer_many), median(peer_ttft), median(many) / median(peer_many));
    else
      std::printf("  llama-server: not built (scripts/llama_peer.sh --server builds it)\n");
    if (f.long_prompt > 0)
      std::printf("  a %lld-token prompt beside %d streams: longest gap between their tokens %.0f ms with --batch-size "
                  "%lld, %.0f ms whole -> %.2fx shorter; the prompt took %.0f ms / %.0f ms\n",
                  static_cast<long long>(f.long_prompt), std::max(1, f.clients - 1), median(stall_chunked),
                  static_cast<long long>(f.batch), median(stall_whole),
                  median(stall_whole) / std::max(median(stall_chunked), 1e-9), median(long_chunked), median(long_whole));
    if (!peer_stall.empty())
      std::printf("  llama-server -np %d, the same prompt: longest gap %.0f ms%s; the prompt took %.0f ms\n", f.clients,
                  median(peer_stall), peer_stall_bounded ? " (a lower bound: a stream ended first)" : "",
                  median(peer_long));
    if (!peer_stream_error.empty()) std::printf("  (llama-server ended a stream with: %s)\n", peer_stream_error.c_str());
    if (stall_bounded)
      std::printf("  (a stream of toy's ended before the long prompt was done: its gaps are lower bounds; give a "
                  "longer --long-prompt)\n");
  }
  return 0;
}

}  // namespace

Run add_bench_serve_command(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("serve", "Serving throughput: N concurrent streaming clients vs one (and llama-server)");
  auto f = std::make_shared<ServeBenchFlags>();
  cmd->add_option("-m,--model", f->model, "Model file (GGUF)")->required();
  add_int(cmd, "--clients", f->clients, 1, 64, "Concurrent clients (default 8)");
  add_int(cmd, "--prompt", f->prompt, 1, 4096, "Prompt tokens per client (default 64)");
  add_int(cmd, "--tokens", f->tokens, 1, 4096, "Generated tokens per client (default 128)");
  add_int(cmd, "--long-prompt", f->long_prompt, 0, int64_t(1) << 20,
          "Also measure the stall a prompt of this many tokens causes the streams beside it, in chunks and whole "
          "(default 0: not measured)");
  add_int(cmd, "-b,--batch-size", f->batch, 1, int64_t(1) << 24, "toy serve's --batch-size (default 512)");
  add_int(cmd, "--rounds", f->rounds, 1, 100, "Rounds, alternating toy and llama-server; medians reported (default 3)");
  add_int(cmd, "--threads", f->threads, 1, kMaxThreads, "Threads of each server (default: all cores)")->default_str("");
  cmd->add_option("--peer", f->peer, "llama-server binary (default: the one scripts/llama_peer.sh --server builds)");
  cmd->add_option("--cache-type", f->cache_type, "toy's KV cache dtype: f32 (default) or f16 (llama-server's default)")
      ->check(CLI::IsMember({"f32", "f16"}));
  cmd->add_flag("--no-peer", f->no_peer, "Measure toy only");
  cmd->add_flag("--json", f->json, "One JSON object");
  return [f]() { return run_serve_bench(*f); };
}

}  // namespace toy::cli
