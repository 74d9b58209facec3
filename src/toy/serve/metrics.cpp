#include "toy/serve/metrics.h"

#include <fmt/format.h>

namespace toy::serve {

namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value,
            const char* labels = "") {
  out += fmt::format("# HELP toy:{} {}\n# TYPE toy:{} {}\ntoy:{}{} {}\n", name, help, name, type, name, labels, value);
}

}  // namespace

std::string prometheus_text(const EngineMetrics& m, const RequestCounts& r, int slots) {
  std::string out;
  metric(out, "prompt_tokens_total", "counter", "Prompt tokens computed (a cached prefix is not).", double(m.prompt_tokens));
  metric(out, "prompt_seconds_total", "counter", "Seconds spent computing prompts.", m.prompt_seconds);
  metric(out, "tokens_predicted_total", "counter", "Tokens generated.", double(m.predicted_tokens));
  metric(out, "tokens_predicted_seconds_total", "counter", "Seconds spent in batched decode steps.", m.decode_seconds);
  metric(out, "n_decode_total", "counter", "Batched decode steps.", double(m.decode_steps));
  metric(out, "n_busy_slots_per_decode", "gauge", "Slots a decode step carried, on average.",
         m.decode_steps ? double(m.busy_slot_steps) / double(m.decode_steps) : 0.0);
  metric(out, "prompt_tokens_seconds", "gauge", "Prompt tokens per second, over all prompts so far.",
         m.prompt_seconds > 0 ? double(m.prompt_tokens) / m.prompt_seconds : 0.0);
  metric(out, "predicted_tokens_seconds", "gauge", "Generated tokens per second of decoding, over all so far.",
         m.decode_seconds > 0 ? double(m.predicted_tokens) / m.decode_seconds : 0.0);
  metric(out, "requests_processing", "gauge", "Requests decoding now.", double(m.processing));
  metric(out, "requests_deferred", "gauge", "Requests waiting for a slot.", double(m.waiting));
  metric(out, "slots_total", "gauge", "Slots (requests that can decode together).", double(slots));
  out += "# HELP toy:requests_total Completion requests received, by endpoint.\n# TYPE toy:requests_total counter\n";
  out += fmt::format("toy:requests_total{{endpoint=\"chat\"}} {}\n", r.chat.load());
  out += fmt::format("toy:requests_total{{endpoint=\"completions\"}} {}\n", r.completions.load());
  metric(out, "requests_rejected_total", "counter", "Completion requests answered with an error before generating.",
         double(r.rejected.load()));
  out += "# HELP toy:requests_finished_total Requests that ended, by how.\n# TYPE toy:requests_finished_total counter\n";
  for (const auto& [reason, n] : {std::pair{"stop", m.finished_stop}, std::pair{"length", m.finished_length},
                                  std::pair{"cancelled", m.finished_cancelled}, std::pair{"error", m.finished_error}})
    out += fmt::format("toy:requests_finished_total{{reason=\"{}\"}} {}\n", reason, n);
  return out;
}

}  // namespace toy::serve
