// toy::Error — the one exception type for everything a caller can get wrong.
// Messages name the op or place, what was expected and what was found:
//   [matmul] inner dims differ: a [4, 64, 768] vs b [512, 768]
#pragma once
#include <fmt/core.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace toy {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace toy

// TOY_CHECK(cond, "[op] fmt", args...) throws toy::Error when cond is false.
#define TOY_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) ::toy::fail(__VA_ARGS__);   \
  } while (0)
