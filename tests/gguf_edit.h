// Making damaged or hostile GGUF files from good ones, for the tests of what toy refuses:
// copy every key and tensor of a file through an edit function, then write the result.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "toy/io/gguf.h"
#include "toy/ops/ops.h"

namespace toy::test {

struct GgufContents {
  std::vector<std::pair<std::string, gguf::Value>> kv;
  std::vector<std::pair<std::string, Tensor>> tensors;  // contiguous copies, safe to edit

  gguf::Value* find(const std::string& key) {
    for (auto& [k, v] : kv)
      if (k == key) return &v;
    return nullptr;
  }
  Tensor* tensor(const std::string& name) {
    for (auto& [n, t] : tensors)
      if (n == name) return &t;
    return nullptr;
  }
};

inline GgufContents read_gguf(const std::string& path) {
  gguf::Reader r(path);
  GgufContents c;
  c.kv = r.metadata();
  for (const gguf::TensorInfo& ti : r.tensors()) c.tensors.emplace_back(ti.name, contiguous_copy(r.tensor(ti.name)));
  return c;
}

inline void write_gguf(const std::string& path, const GgufContents& c) {
  gguf::Writer w;
  for (const auto& [k, v] : c.kv) w.set(k, v);
  for (const auto& [n, t] : c.tensors) w.add_tensor(n, t);
  w.write(path);
}

// Rewrites path in place through edit.
inline void edit_gguf(const std::string& path, const std::function<void(GgufContents&)>& edit) {
  GgufContents c = read_gguf(path);
  edit(c);
  write_gguf(path, c);
}

}  // namespace toy::test
