// `toy inspect FILE.gguf`: what a GGUF file holds — its metadata (long arrays summarized,
// strings escaped) and a table of its tensors (name, type, shape, bytes).
#include <cstdio>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/cli/commands.h"
#include "toy/core/machine.h"
#include "toy/core/text.h"
#include "toy/io/gguf.h"

namespace toy::cli {

namespace {

std::string scalar(const gguf::Value& v, size_t i, bool array) {
  const gguf::Type t = array ? v.elem : v.type;
  switch (t) {
    case gguf::Type::STRING: return "\"" + printable(array ? v.as[i] : v.s, 120) + "\"";
    case gguf::Type::F32: return fmt::format("{}", float(array ? v.af[i] : v.f));  // shortest form of the float
    case gguf::Type::F64: return fmt::format("{}", array ? v.af[i] : v.f);
    case gguf::Type::BOOL: return (array ? v.au[i] : v.u) ? "true" : "false";
    case gguf::Type::I8: case gguf::Type::I16: case gguf::Type::I32: case gguf::Type::I64:
      return fmt::format("{}", array ? v.ai[i] : v.i);
    default: return fmt::format("{}", array ? v.au[i] : v.u);
  }
}

size_t array_size(const gguf::Value& v) {
  switch (v.elem) {
    case gguf::Type::STRING: return v.as.size();
    case gguf::Type::F32: case gguf::Type::F64: return v.af.size();
    case gguf::Type::I8: case gguf::Type::I16: case gguf::Type::I32: case gguf::Type::I64: return v.ai.size();
    default: return v.au.size();
  }
}

std::string describe_value(const gguf::Value& v) {
  if (v.type != gguf::Type::ARRAY) return scalar(v, 0, false);
  const size_t n = array_size(v);
  std::string s = fmt::format("[{} x {}] [", gguf::type_name(v.elem), n);
  for (size_t i = 0; i < n && i < 8; ++i) s += (i ? ", " : "") + scalar(v, i, true);
  return s + (n > 8 ? ", ...]" : "]");
}

}  // namespace

Run add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Print a GGUF file's metadata and tensor table");
  auto path = std::make_shared<std::string>();
  cmd->add_option("file", *path, "The GGUF file")->required();
  return [path]() {
    gguf::Reader r(*path);
    std::printf("%s: GGUF v%u, %zu metadata keys, %zu tensors\n", printable(*path).c_str(), r.version(),
                r.metadata().size(), r.tensors().size());
    for (const auto& [key, v] : r.metadata())
      std::printf("  %-44s %s\n", printable(key, 80).c_str(), describe_value(v).c_str());
    std::printf("\n  %-44s %-6s %-22s %s\n", "tensor", "type", "shape", "bytes");
    size_t total = 0;
    for (const gguf::TensorInfo& t : r.tensors()) {
      total += t.bytes;
      std::printf("  %-44s %-6s %-22s %zu\n", printable(t.name, 80).c_str(), std::string(name(t.dtype)).c_str(),
                  t.shape.str().c_str(), t.bytes);
    }
    std::printf("  %zu tensors, %s\n", r.tensors().size(), format_bytes(double(total)).c_str());
    return 0;
  };
}

}  // namespace toy::cli
