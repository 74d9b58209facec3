// Stop strings over streamed text: holds back generated text while it could still be the
// start of a stop string, and cuts the text where one appears (the stop string itself is not
// output). Shared by generate() and the server's slots.
#pragma once
#include <algorithm>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace toy {

class StopFilter {
 public:
  using Sink = std::function<void(const std::string&)>;
  StopFilter(std::vector<std::string> stop, Sink out) : stop_(std::move(stop)), out_(std::move(out)) {}
  // Adds text; returns true when a stop string was found (the text before it is output).
  bool push(std::string_view text) {
    pending_ += text;
    size_t cut = std::string::npos;
    for (const std::string& s : stop_)
      if (!s.empty()) cut = std::min(cut, pending_.find(s));
    if (cut != std::string::npos) {
      out_(pending_.substr(0, cut));
      pending_.clear();
      return true;
    }
    // Keep the longest tail that is a prefix of some stop string; output the rest.
    size_t keep = 0;
    for (const std::string& s : stop_)
      for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size()); k > keep; --k)
        if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
    if (pending_.size() > keep) {
      piece_.assign(pending_, 0, pending_.size() - keep);  // reuses piece_'s buffer: no allocation per token
      pending_.erase(0, pending_.size() - keep);
      out_(piece_);
    }
    return false;
  }
  // Outputs what is held back (the generation ended without a stop string).
  void flush() {
    if (!pending_.empty()) out_(pending_);
    pending_.clear();
  }

 private:
  std::vector<std::string> stop_;
  Sink out_;
  std::string pending_, piece_;
};

}  // namespace toy
