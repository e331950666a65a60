// Renders the run report as a readable text summary and a self-contained HTML page with
// inline SVG bar charts (no scripts, no external assets).
#include <cstdio>
#include <string>

#include "core/error.h"
#include "curate/pipeline.h"

namespace loom::curate {

static std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

static std::string pct(int64_t part, int64_t whole) {
  return whole > 0 ? fmt("%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole))
                   : "-";
}

// Says whether every input byte is in a kept document, a rejected one (with its reason) or a
// non-document record, or which input was lost and why.
static std::string accounting_headline(const Json& r) {
  auto& out = r.at("output");
  int64_t errors = r.at("errors").at("count").as_int();
  int64_t unread = out.contains("unread_bytes") ? out.at("unread_bytes").as_int() : 0;
  if (!out.at("all_docs_accounted").as_bool())
    return " (WARNING: documents unaccounted for: read but neither kept nor rejected)";
  int64_t cut = out.contains("stream_errors") ? out.at("stream_errors").as_int() : 0;
  if (cut > 0 || unread > 0)
    return cat(" (WARNING: input lost: ", cut, cut == 1 ? " file" : " files", " cut short by ",
               cut == 1 ? "a stream error" : "stream errors", ", ", unread,
               " bytes unread; see input errors below; all that was read is kept or rejected)");
  if (errors > 0)
    return cat(" (every input byte accounted for: ", errors,
               " input errors, each a document rejected with its reason)");
  return " (every input document accounted for)";
}

std::string report_text(const Json& r) {
  std::string s;
  auto& out = r.at("output");
  auto& run = r.at("run");
  s += cat("loom curate report: ", out.at("dir").as_string(), "\n");
  s += cat("input: ", r.at("input").at("shards").as_int(), " shards (",
           r.at("input").at("format").as_string(), "), ",
           fmt("%.2f", static_cast<double>(r.at("input").at("bytes").as_int()) / 1e6), " MB\n");
  s += cat("kept ", out.at("kept_docs").as_int(), ", rejected ", out.at("rejected_docs").as_int(),
           accounting_headline(r), "\n");
  s += cat("this run: ", fmt("%.2f", run.at("seconds").as_double()), " s, ",
           fmt("%.0f", run.at("docs_per_s").as_double()), " docs/s, ",
           fmt("%.2f", run.at("mb_per_s").as_double()), " MB/s, ", run.at("workers").as_int(),
           " workers, ", run.at("shards_processed").as_int(), " shards processed\n");
  if (run.contains("cpu_seconds"))
    s += cat("per core: ", fmt("%.2f", run.at("mb_per_cpu_second").as_double()), " MB/s (",
             fmt("%.2f", run.at("cpu_seconds").as_double()), " CPU seconds)\n");
  s += "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-22s %10s %10s %8s %12s %12s\n", "stage", "docs in",
                "docs out", "kept", "MB in", "MB out");
  s += line;
  for (auto& st : r.at("stages").as_array()) {
    int64_t din = st.at("docs_in").as_int(), dout = st.at("docs_out").as_int();
    std::snprintf(line, sizeof line, "%-22s %10lld %10lld %8s %12.3f %12.3f\n",
                  st.at("name").as_string().c_str(), static_cast<long long>(din),
                  static_cast<long long>(dout), pct(dout, din).c_str(),
                  static_cast<double>(st.at("bytes_in").as_int()) / 1e6,
                  static_cast<double>(st.at("bytes_out").as_int()) / 1e6);
    s += line;
  }
  if (r.contains("timing")) {
    std::snprintf(line, sizeof line, "\n%-22s %10s %10s   (worker seconds; MB/s of its input)\n",
                  "time", "seconds", "MB/s");
    s += line;
    for (auto& t : r.at("timing").as_array()) {
      std::snprintf(line, sizeof line, "%-22s %10.3f %10.1f\n", t.at("name").as_string().c_str(),
                    t.at("seconds").as_double(), t.at("mb_per_s").as_double());
      s += line;
    }
  }
  for (auto& st : r.at("stages").as_array()) {
    auto& reasons = st.at("reasons").as_object();
    auto& counters = st.at("counters").as_object();
    auto& hist = st.at("histograms").as_object();
    if (reasons.empty() && counters.empty() && hist.empty()) continue;
    s += cat("\n[", st.at("name").as_string(), "]\n");
    for (auto& [k, v] : reasons)
      s += cat("  rejected ", k, ": ", v.as_int(), " (", pct(v.as_int(), st.at("docs_in").as_int()),
               ")\n");
    for (auto& [k, v] : counters) s += cat("  ", k, ": ", v.as_int(), "\n");
    for (auto& [k, h] : hist)
      s += cat("  score ", k, ": mean ", fmt("%.4g", h.at("mean").as_double()), " over ",
               h.at("count").as_int(), " docs\n");
  }
  auto& errs = r.at("errors");
  if (errs.at("count").as_int() > 0) {
    s += cat("\ninput errors: ", errs.at("count").as_int(), "\n");
    size_t n = 0;
    for (auto& e : errs.at("first").as_array()) {
      if (++n > 20) break;
      s += cat("  ", e.at("where").as_string(), ": ", e.at("message").as_string(), "\n");
    }
  }
  return s;
}

static std::string esc(const std::string& in) {
  std::string o;
  for (char c : in) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

static std::string svg_bars(const std::vector<std::pair<std::string, double>>& bars, int w, int h) {
  double mx = 0;
  for (auto& b : bars) mx = std::max(mx, b.second);
  std::string s =
      cat("<svg width='", w, "' height='", h + 16, "' xmlns='http://www.w3.org/2000/svg'>");
  double bw = bars.empty() ? 0 : static_cast<double>(w) / static_cast<double>(bars.size());
  for (size_t i = 0; i < bars.size(); ++i) {
    double bh = mx > 0 ? bars[i].second / mx * h : 0;
    s += cat("<rect x='", fmt("%.1f", bw * static_cast<double>(i) + 1), "' y='",
             fmt("%.1f", h - bh), "' width='", fmt("%.1f", std::max(1.0, bw - 2)), "' height='",
             fmt("%.1f", bh), "' fill='#4a78b5'><title>", esc(bars[i].first), ": ",
             fmt("%.0f", bars[i].second), "</title></rect>");
  }
  if (!bars.empty()) {
    s += cat("<text x='0' y='", h + 12, "' font-size='10'>", esc(bars.front().first), "</text>");
    s += cat("<text x='", w, "' y='", h + 12, "' font-size='10' text-anchor='end'>",
             esc(bars.back().first), "</text>");
  }
  return s + "</svg>";
}

std::string report_html(const Json& r) {
  std::string s =
      "<!doctype html><html><head><meta charset='utf-8'><title>loom curate report</title>"
      "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
      "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child{text-align:left}"
      ".h{display:inline-block;margin:0 1em 1em 0;vertical-align:top}</style></head><body>";
  s += "<h1>loom curate report</h1><pre>" + esc(report_text(r)) + "</pre>";
  s += "<h2>Documents kept per stage</h2>";
  std::vector<std::pair<std::string, double>> flow;
  for (auto& st : r.at("stages").as_array())
    flow.push_back({st.at("name").as_string(), static_cast<double>(st.at("docs_out").as_int())});
  s += svg_bars(flow, 600, 120);
  for (auto& st : r.at("stages").as_array()) {
    auto& reasons = st.at("reasons").as_object();
    auto& hist = st.at("histograms").as_object();
    if (reasons.empty() && hist.empty()) continue;
    s += "<h2>" + esc(st.at("name").as_string()) + "</h2>";
    if (!reasons.empty()) {
      s += "<table><tr><th>reason</th><th>documents</th></tr>";
      for (auto& [k, v] : reasons)
        s += cat("<tr><td>", esc(k), "</td><td>", v.as_int(), "</td></tr>");
      s += "</table>";
    }
    for (auto& [k, h] : hist) {
      std::vector<std::pair<std::string, double>> bars;
      double lo = h.at("lo").as_double(), hi = h.at("hi").as_double();
      auto& bins = h.at("bins").as_array();
      for (size_t i = 0; i < bins.size(); ++i)
        bars.push_back({fmt("%.3g", lo + (hi - lo) * static_cast<double>(i) /
                                             static_cast<double>(bins.size())),
                        static_cast<double>(bins[i].as_int())});
      s += "<div class='h'><b>" + esc(k) + "</b> (mean " + fmt("%.4g", h.at("mean").as_double()) +
           ")<br>" + svg_bars(bars, 300, 80) + "</div>";
    }
  }
  return s + "</body></html>\n";
}

}  // namespace loom::curate
