// GET /metrics: what the server has done, in Prometheus's text format, named as llama-server's
// --metrics names them with the prefix toy: (a dashboard made for one reads the other after a
// rename): prompt and generated token totals and rates, decode steps, slots busy, requests
// processing and waiting, requests received and how they ended.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

#include "toy/serve/engine.h"

namespace toy::serve {

// Requests the HTTP side received (engine totals are in EngineMetrics).
struct RequestCounts {
  std::atomic<int64_t> chat{0}, completions{0}, rejected{0};  // rejected: answered 4xx/5xx before generating
};

std::string prometheus_text(const EngineMetrics& m, const RequestCounts& r, int slots);

}  // namespace toy::serve
