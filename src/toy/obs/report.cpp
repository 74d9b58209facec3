#include "toy/obs/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "toy/core/error.h"

namespace toy {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

struct Series {
  std::string label, color;
  std::vector<std::pair<double, double>> pts;
  bool dots = false;
};

// A line chart of the series on shared axes.
std::string svg_chart(const std::vector<Series>& series, const std::string& ylabel, const std::string& xlabel = "step") {
  const double W = 760, H = 360, L = 60, R = 20, T = 20, B = 45;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series)
    for (auto [x, y] : s.pts) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (x0 > x1) return "<p>(no data yet)</p>";
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto Y = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  std::string o = fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
                              "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fff\" stroke=\"#ccc\"/>\n", L, T,
                   W - L - R, H - T - B);
  for (int i = 0; i <= 5; ++i) {
    const double yv = y0 + (y1 - y0) * i / 5, xv = x0 + (x1 - x0) * i / 5;
    o += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#eee\"/>", L, Y(yv), W - R, Y(yv));
    o += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.3f}</text>\n", L - 5, Y(yv) + 4, yv);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.0f}</text>\n", X(xv), H - B + 16, xv);
  }
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>", (L + W - R) / 2, H - 8, esc(xlabel));
  o += fmt::format("<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">{}</text>\n",
                   (T + H - B) / 2, (T + H - B) / 2, esc(ylabel));
  int li = 0;
  for (const auto& s : series) {
    if (std::none_of(s.pts.begin(), s.pts.end(), [](auto p) { return std::isfinite(p.second); })) continue;
    std::string pts;
    for (auto [x, y] : s.pts)
      if (std::isfinite(y)) pts += fmt::format("{:.1f},{:.1f} ", X(x), Y(y));
    o += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n", s.color, pts);
    if (s.dots)
      for (auto [x, y] : s.pts)
        if (std::isfinite(y)) o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>", X(x), Y(y), s.color);
    o += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                     W - R - 150, T + 12 + 16 * li, s.color, W - R - 132, T + 16 + 16 * li, esc(s.label));
    ++li;
  }
  return o + "</svg>\n";
}

void flatten(const nlohmann::json& j, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
  } else {
    out.emplace_back(prefix, j.is_string() ? j.get<std::string>() : j.dump());
  }
}

// A number field of an event, NaN when absent or not a number (NaN and inf are written as
// null by the JSON library).
double number(const nlohmann::json& e, const char* key) {
  auto it = e.find(key);
  return it != e.end() && it->is_number() ? it->get<double>() : NAN;
}
// toy vision train's sections: accuracy by epoch, the confusion matrix, misclassified images.
std::string vision_sections(const std::vector<nlohmann::json>& epochs, const nlohmann::json& confusion,
                            const nlohmann::json& wrong) {
  Series tr{"train (augmented batches)", "#1f77b4", {}, true}, val{"validation", "#2ca02c", {}, true},
      te{"test", "#d62728", {}, true};
  Series trl{"train", "#1f77b4", {}, true}, tel{"test", "#d62728", {}, true};
  for (const auto& e : epochs) {
    const double x = e.value("epoch", 0.0);
    tr.pts.emplace_back(x, 100 * number(e, "train_accuracy"));
    val.pts.emplace_back(x, 100 * number(e, "val_accuracy"));
    te.pts.emplace_back(x, 100 * number(e, "test_accuracy"));
    trl.pts.emplace_back(x, number(e, "train_loss"));
    tel.pts.emplace_back(x, number(e, "test_loss"));
  }
  std::string h = "<h2>Accuracy by epoch</h2>\n" + svg_chart({tr, val, te}, "accuracy (%)", "epoch");
  h += "<h2>Loss by epoch</h2>\n" + svg_chart({trl, tel}, "cross-entropy", "epoch");
  if (confusion.is_object() && confusion.contains("matrix")) {
    const auto& m = confusion["matrix"];
    const auto& names = confusion["classes"];
    int64_t peak = 1;
    for (const auto& row : m)
      for (const auto& v : row) peak = std::max<int64_t>(peak, v.get<int64_t>());
    h += fmt::format("<h2>Confusion matrix (test set, {} weights: {:.2f}% accuracy)</h2>\n<p>Rows: true class; "
                     "columns: predicted.</p>\n<table><tr><td></td>",
                     esc(confusion.value("model", "")), 100 * number(confusion, "accuracy"));
    for (size_t c = 0; c < names.size(); ++c) h += fmt::format("<td><b>{}</b></td>", c);
    h += "<td>accuracy</td></tr>\n";
    for (size_t r = 0; r < m.size(); ++r) {
      h += fmt::format("<tr><td><b>{}</b> {}</td>", r, esc(names[r].get<std::string>()));
      int64_t total = 0;
      for (const auto& v : m[r]) total += v.get<int64_t>();
      for (size_t c = 0; c < m[r].size(); ++c) {
        const int64_t v = m[r][c].get<int64_t>();
        const double a = double(v) / double(peak);
        const std::string bg = r == c ? fmt::format("rgba(44,160,44,{:.2f})", 0.15 + 0.85 * a)
                                      : fmt::format("rgba(214,39,40,{:.2f})", std::min(1.0, 4 * a));
        h += fmt::format("<td style=\"background:{};text-align:right\">{}</td>", bg, v);
      }
      h += fmt::format("<td>{:.1f}%</td></tr>\n", total ? 100.0 * double(m[r][r].get<int64_t>()) / double(total) : 0.0);
    }
    h += "</table>\n";
  }
  if (wrong.is_object() && wrong.contains("images")) {
    h += fmt::format("<h2>Misclassified test images</h2>\n<p>{} of the test images are misclassified; the {} most "
                     "confident mistakes:</p>\n<div style=\"display:flex;flex-wrap:wrap;gap:8px\">",
                     wrong.value("count", int64_t(0)), wrong["images"].size());
    for (const auto& im : wrong["images"])
      h += fmt::format("<figure style=\"margin:0;width:96px;font-size:11px\"><img width=\"96\" height=\"96\" "
                       "style=\"image-rendering:pixelated;border:1px solid #ccc\" src=\"data:image/png;base64,{}\">"
                       "<figcaption>#{}: {}<br>as <b>{}</b> ({:.0f}%)</figcaption></figure>",
                       im.value("png", ""), im.value("index", int64_t(0)), esc(im.value("label", "")),
                       esc(im.value("predicted", "")), 100 * number(im, "prob"));
    h += "</div>\n";
  }
  return h;
}

}  // namespace

void write_report(const std::string& events_path, const std::string& html_path) {
  std::ifstream in(events_path);
  TOY_CHECK(in.good(), "[report] cannot read '{}'", events_path);
  Series train{"train loss (per step)", "#9ab", {}, false}, est_train{"train estimate", "#1f77b4", {}, true},
      est_val{"validation", "#d62728", {}, true};
  nlohmann::json start, end, models;
  std::vector<std::pair<int64_t, std::string>> samples;
  std::vector<nlohmann::json> epochs;
  nlohmann::json confusion, wrong;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json e;
    try {
      e = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;  // a torn last line after a crash
    }
    const std::string ev = e.value("event", "");
    if (ev == "run_start" && start.is_null()) start = e;
    if (ev == "step") train.pts.emplace_back(e.value("step", 0.0), number(e, "loss"));
    if (ev == "eval") {
      est_train.pts.emplace_back(e.value("step", 0.0), number(e, "train_loss"));
      est_val.pts.emplace_back(e.value("step", 0.0), number(e, "val_loss"));
    }
    if (ev == "sample") samples.emplace_back(e.value("step", int64_t(0)), e.value("text", ""));
    if (ev == "run_end") end = e;
    if (ev == "epoch") epochs.push_back(e);
    if (ev == "confusion") confusion = e;
    if (ev == "misclassified") wrong = e;
    if (ev == "models") models = e;
  }
  const std::string command = start.is_object() ? start.value("command", "") : "";
  const bool vision = command == "vision";
  const std::string title = command == "finetune" ? "toy finetune report"
                            : vision              ? "toy vision report"
                                                  : "toy run report";
  std::string h = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + title + "</title>\n<style>"
                  "body{font-family:sans-serif;max-width:820px;margin:2em auto;color:#222}"
                  "table{border-collapse:collapse}td{border:1px solid #ddd;padding:2px 8px;font-size:13px}"
                  "pre{background:#f6f6f6;padding:8px;white-space:pre-wrap}</style></head><body>\n";
  h += "<h1>" + title + "</h1>\n";
  if (!end.is_null() && vision)
    h += fmt::format("<p>{} epochs ({} steps) in {:.1f} s, {:.0f} images/s. Final train loss {:.4f}, test accuracy "
                     "{:.2f}%{}.</p>\n",
                     end.value("epochs", 0), end.value("steps", 0), end.value("seconds", 0.0),
                     end.value("images_per_s", 0.0), number(end, "train_loss"), 100 * number(end, "test_accuracy"),
                     end.value("stopped", false) ? " (stopped early; resumable)" : "");
  else if (!end.is_null())
    h += fmt::format("<p>{} steps in {:.1f} s, {:.0f} tokens/s. Final train loss {:.4f}, validation loss {:.4f}{}.</p>\n",
                     end.value("steps", 0), end.value("seconds", 0.0), end.value("tokens_per_s", 0.0),
                     number(end, "train_loss"), number(end, "val_loss"),
                     end.value("stopped", false) ? " (stopped early; resumable)" : "");
  if (!models.is_null()) {
    const bool best = models.value("model_gguf", "") == "best";
    const int64_t best_step = models.value("best_step", int64_t(-1)), last_step = models.value("last_step", int64_t(0));
    // toy train keeps the other weights in a companion model file; toy finetune in its checkpoint.
    const std::string other = models.contains("companion") ? "<code>" + esc(models.value("companion", "")) + "</code>"
                                                           : std::string("<code>checkpoint.gguf</code>");
    if (vision)
      h += fmt::format("<p><code>model.gguf</code> holds the {} weights{}; {} holds the {}.</p>\n",
                       best ? "best validation-accuracy" : "last step's",
                       best_step >= 0 ? fmt::format(" (best: epoch {}, validation accuracy {:.2f}%)",
                                                    models.value("best_epoch", int64_t(-1)),
                                                    100 * number(models, "best_val_accuracy"))
                                      : std::string(),
                       other, best ? "last step's" : "best validation weights");
    else if (best)
      h += fmt::format("<p><code>model.gguf</code> holds the best validation weights (step {}, validation loss {:.4f}); "
                       "{} holds the last step's (step {}).</p>\n",
                       best_step, number(models, "best_val_loss"), other, last_step);
    else if (best_step >= 0 && models.contains("companion"))
      h += fmt::format("<p><code>model.gguf</code> holds the last step's weights (step {}); {} the best validation "
                       "weights (step {}, validation loss {:.4f}).</p>\n",
                       last_step, other, best_step, number(models, "best_val_loss"));
    else if (best_step >= 0)
      h += fmt::format("<p><code>model.gguf</code> holds the last step's weights (step {}), which had the best "
                       "validation loss ({:.4f}).</p>\n", last_step, number(models, "best_val_loss"));
    else
      h += "<p><code>model.gguf</code> holds the last step's weights (no validation estimate was made).</p>\n";
    if (models.value("adapter", false))
      h += "<p><code>adapter.gguf</code> holds the same LoRA adapter unmerged, for llama.cpp's <code>--lora</code>."
           "</p>\n";
  }
  h += "<h2>Loss</h2>\n" + svg_chart({train, est_train, est_val}, vision ? "training loss (per step)" : "cross-entropy (nats/token)");
  if (vision) h += vision_sections(epochs, confusion, wrong);
  if (!samples.empty() || (!vision && title == "toy run report")) {  // (toy finetune draws none)
    h += "<h2>Samples</h2>\n";
    for (const auto& [step, text] : samples) h += fmt::format("<p>step {}</p><pre>{}</pre>\n", step, esc(text));
    if (samples.empty()) h += "<p>(none)</p>\n";
  }
  h += "<h2>Configuration</h2>\n<table>\n";
  std::vector<std::pair<std::string, std::string>> rows;
  if (!start.is_null()) {
    nlohmann::json c = start;
    c.erase("event");
    flatten(c, "", rows);
  }
  for (const auto& [k, v] : rows) h += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", esc(k), esc(v));
  h += "</table>\n</body></html>\n";
  const std::string tmp = html_path + ".tmp";
  {
    std::ofstream o(tmp);
    o << h;
    TOY_CHECK(o.good(), "[report] cannot write '{}'", tmp);
  }
  std::filesystem::rename(tmp, html_path);
}

}  // namespace toy
