// report.html: a self-contained page (no scripts, no external files) built from events.jsonl —
// SVG loss curves (training steps, periodic train/val estimates), the samples, the config.
#pragma once
#include <string>

namespace toy {

// Reads events_path and writes html_path (atomically). Throws toy::Error if unreadable.
void write_report(const std::string& events_path, const std::string& html_path);

}  // namespace toy
