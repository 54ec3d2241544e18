#include "report/html_report.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "core/errors.hpp"
#include "core/format.hpp"
#include "report/identical_plans.hpp"
#include "report/plan_report.hpp"
#include "report/svg.hpp"

namespace fsdp {

namespace {

using svg::escape;

constexpr double kChartWidth = 1040;
constexpr double kFontPx = 12;

std::string gib(double bytes, const char* f = "%.1f") { return fmt(f, bytes / kGiB); }

// Category colours: parameters in blues, gradients in oranges, optimizer green, activations purple,
// working memory pink, communication teal/brown, fixed overheads greys.
constexpr std::array<const char*, kNumMemoryCategories> kCategoryColors{
    "#4a90d9",  // sharded_params
    "#9cc5ef",  // unsharded_params
    "#1f4e8c",  // master_params
    "#f6b26b",  // unsharded_grads
    "#e06c1a",  // sharded_grads
    "#3f9e4d",  // optimizer_states
    "#8e6cc0",  // activations
    "#e48bbf",  // transient
    "#2bb3c0",  // comm_buffers
    "#9b7b45",  // nccl
    "#8c8c8c",  // workspace
    "#d4d4d4",  // fragmentation
};

const char* kind_color(OpKind k) {
  switch (k) {
    case OpKind::Forward:
      return "#4a90d9";
    case OpKind::Backward:
      return "#e0822a";
    case OpKind::Loss:
      return "#d64545";
    case OpKind::LossBackward:
      return "#9e2a2a";
    case OpKind::OptimizerStep:
      return "#3f9e4d";
    case OpKind::HostOptimizerStep:
      return "#86c98f";
    case OpKind::Gather:
      return "#2bb3c0";
    case OpKind::ReduceScatter:
      return "#c9a227";
    case OpKind::AllReduce:
      return "#a35fb5";
    case OpKind::ParamAllGather:
      return "#7aa6a8";
    case OpKind::CopyToHost:
      return "#8c8c8c";
    case OpKind::CopyToDevice:
      return "#b5b5b5";
    case OpKind::Reshard:
      return "#cccccc";
    case OpKind::GradNorm:
      return "#5f8f3a";
    case OpKind::ScalarAllReduce:
      return "#c77fd6";
    case OpKind::TpCollective:
      return "#1f6f8b";
    case OpKind::PipelineTransfer:
      return "#b0413e";
    case OpKind::EpAllToAll:
      return "#6b8e23";
  }
  return "#999999";
}

constexpr std::array<const char*, 8> kFamilyColors{"#4a90d9", "#e0822a", "#3f9e4d", "#d64545",
                                                   "#8e6cc0", "#9b7b45", "#e48bbf", "#2bb3c0"};

const char* stream_label(Stream s) {
  switch (s) {
    case Stream::Compute:
      return "compute";
    case Stream::AllGather:
      return "all-gather";
    case Stream::ReduceScatter:
      return "reduce";
    case Stream::HostToDevice:
      return "host \u2192 device";
    case Stream::DeviceToHost:
      return "device \u2192 host";
    case Stream::Host:
      return "host CPU";
    case Stream::TensorParallel:
      return "tensor parallel";
    case Stream::Pipeline:
      return "pipeline p2p";
    case Stream::ExpertParallel:
      return "expert all-to-all";
    case Stream::kCount:
      break;
  }
  return "?";
}

double total_of(const MemoryBreakdown& b) {
  double t = 0;
  for (double v : b) t += v;
  return t;
}

std::string kind_name(const Strategy& s) {
  std::string k = to_string(s.kind);
  if (s.kind == StrategyKind::Hsdp) k += ":" + std::to_string(s.hsdp_group);
  return k;
}

// A compact label for a chart row or table cell (the full one_line_strategy goes in the tooltip);
// `with_kind` false leaves out the strategy name (a row already headed by its family).
std::string short_strategy(const Strategy& s, bool with_kind = true) {
  std::vector<std::string> parts;
  if (with_kind) parts.push_back(kind_name(s));
  if (!with_kind && s.kind == StrategyKind::Hsdp) parts.push_back("group " + std::to_string(s.hsdp_group));
  if (shards_params(s.kind)) parts.push_back(to_string(s.wrap) + (s.reshard_after_forward ? "" : " no-reshard"));
  parts.push_back("ckpt " + act_ckpt_name(s));
  if (s.offload != Offload::None) parts.push_back(std::string("offload ") + to_string(s.offload));
  parts.push_back(std::string(to_string(s.param_dtype)) + "/" + to_string(s.reduce_dtype));
  if (s.float8 != Float8Recipe::None)
    parts.push_back(std::string("float8 ") + to_string(s.float8) + (s.float8_all_gather ? " all-gather" : ""));
  parts.push_back(std::to_string(s.micro_batch) + "\u00d7" + std::to_string(s.grad_accum));
  std::string o;
  for (const auto& p : parts) o += (o.empty() ? "" : " \u00b7 ") + p;
  return o;
}

// Shortens `label` to fit `max_px`, ending it with an ellipsis when cut (UTF-8 aware).
std::string fit_label(std::string label, double max_px) {
  if (svg::text_width(label, kFontPx) <= max_px) return label;
  while (!label.empty() && svg::text_width(label + "\u2026", kFontPx) > max_px) {
    label.pop_back();
    while (!label.empty() && (static_cast<unsigned char>(label.back()) & 0xC0) == 0x80) label.pop_back();
    if (!label.empty() && (static_cast<unsigned char>(label.back()) & 0x80) != 0) label.pop_back();
  }
  while (!label.empty() && (label.back() == ' ')) label.pop_back();
  return label + "\u2026";
}

bool same_strategy(const Strategy& a, const Strategy& b) { return one_line_strategy(a) == one_line_strategy(b); }

std::string time_text(double s) {
  if (s >= 100) return fmt("%.1f s", s);
  if (s >= 1) return fmt("%.2f s", s);
  if (s >= 1e-3) return fmt("%.2f ms", s * 1e3);
  return fmt("%.1f \u00b5s", s * 1e6);
}

std::string bytes_text(double b) {
  if (b >= kGiB) return gib(b, "%.2f") + " GiB";
  if (b >= 1024.0 * 1024.0) return fmt("%.1f MiB", b / (1024.0 * 1024.0));
  return fmt("%.0f KiB", b / 1024.0);
}

std::string breakdown_tooltip(const std::string& head, const MemoryBreakdown& b) {
  std::string t = head;
  double total = total_of(b);
  for (size_t i = 0; i < kNumMemoryCategories; ++i)
    if (b[i] > 0)
      t += "\n" + std::string(kMemoryCategoryNames[i]) + ": " + gib(b[i], "%.2f") + " GiB (" +
           fmt("%.0f", total > 0 ? b[i] / total * 100 : 0) + "%)";
  return t;
}

// Lays out legend entries (swatch + text) left to right, wrapping at `width`; returns the height used.
struct LegendItem {
  std::string text;
  std::string color;
  std::string shape = "rect";  // rect, circle, ring, line, dash
};

double draw_legend(svg::Svg& g, const std::vector<LegendItem>& items, double x0, double y0, double width) {
  double x = x0, y = y0;
  constexpr double kRow = 18, kSwatch = 12, kGap = 18;
  for (const auto& it : items) {
    double w = kSwatch + 6 + svg::text_width(it.text, kFontPx) + kGap;
    if (x > x0 && x + w > x0 + width) {
      x = x0;
      y += kRow;
    }
    if (it.shape == "circle") {
      g.circle(x + kSwatch / 2, y + kSwatch / 2, 4.5, it.color, "");
    } else if (it.shape == "ring") {
      g.circle(x + kSwatch / 2, y + kSwatch / 2, 5, "none", it.color, "", "ring");
    } else if (it.shape == "line" || it.shape == "dash") {
      g.line(x, y + kSwatch / 2, x + kSwatch, y + kSwatch / 2, it.color, 2, it.shape == "dash" ? "4 3" : "");
    } else {
      g.rect(x, y, kSwatch, kSwatch, it.color, "", "swatch");
    }
    g.text(x + kSwatch + 6, y + kSwatch - 1.5, it.text, "start", "lbl");
    x += w;
  }
  return y + kRow - y0;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Memory: one stacked bar per plan, the usable memory (and the search's budget) as vertical lines.

std::string memory_chart_svg(const std::vector<MemoryBar>& bars, double usable_bytes, double budget_bytes) {
  constexpr double kLeft = 350, kRight = 90, kBar = 20, kGap = 7, kHeader = 24, kAxis = 46;
  std::array<bool, kNumMemoryCategories> used{};
  double max_total = 0;
  for (const auto& b : bars) {
    for (size_t i = 0; i < kNumMemoryCategories; ++i) used[i] = used[i] || b.bytes[i] > 0;
    max_total = std::max(max_total, total_of(b.bytes));
  }
  std::vector<LegendItem> legend;
  for (size_t i = 0; i < kNumMemoryCategories; ++i)
    if (used[i]) legend.push_back({std::string(kMemoryCategoryNames[i]), kCategoryColors[i]});
  if (usable_bytes > 0) legend.push_back({"usable " + gib(usable_bytes, "%.0f") + " GiB", "#c0392b", "line"});
  if (budget_bytes > 0 && budget_bytes < usable_bytes)
    legend.push_back({"budget " + gib(budget_bytes, "%.0f") + " GiB (headroom kept free)", "#c0392b", "dash"});

  // Layout: legend, then groups of bars, then the axis.
  svg::Svg probe(kChartWidth, 10, "probe", "");
  double legend_h = draw_legend(probe, legend, 0, 0, kChartWidth - 20);
  double rows_h = 0;
  std::string last_group;
  for (const auto& b : bars) {
    if (b.group != last_group) rows_h += kHeader;
    last_group = b.group;
    rows_h += kBar + kGap;
  }
  const double top = 10 + legend_h + 12;
  const double height = top + rows_h + kAxis;
  const double plot_x0 = kLeft, plot_x1 = kChartWidth - kRight;
  // The axis reaches the usable memory with a margin, and at most twice it: a plan that needs far more
  // is drawn clipped, with its total written out.
  double axis_max = std::max(usable_bytes * 1.08, std::min(max_total, usable_bytes > 0 ? 2 * usable_bytes : max_total));
  axis_max = svg::nice_ceil(std::max(axis_max, 1.0) / kGiB, 8) * kGiB;
  svg::LinearScale x{0, axis_max, plot_x0, plot_x1};

  svg::Svg g(kChartWidth, height, "memory-chart", "Per-GPU memory by category");
  draw_legend(g, legend, 10, 10, kChartWidth - 20);
  // Grid and ticks.
  const double plot_y0 = top, plot_y1 = top + rows_h;
  for (double t : svg::nice_ticks(0, axis_max / kGiB, 8)) {
    double px = x(t * kGiB);
    g.line(px, plot_y0, px, plot_y1, "#e6e6e6", 1, "", "grid");
    g.text(px, plot_y1 + 16, svg::num(t), "middle", "axis");
  }
  g.text((plot_x0 + plot_x1) / 2, plot_y1 + 36,
         "GiB per GPU at the peak (device total: allocated + fragmentation + NCCL + CUDA context)", "middle", "axis");
  double y = top;
  last_group.clear();
  for (const auto& b : bars) {
    if (b.group != last_group) {
      g.text(10, y + 16, b.group, "start", "grp");
      y += kHeader;
      last_group = b.group;
    }
    const double total = total_of(b.bytes);
    g.open_group(std::string("bar") + (b.feasible ? "" : " infeasible") + (b.chosen ? " chosen" : ""),
                 breakdown_tooltip(b.tooltip.empty() ? b.label : b.tooltip, b.bytes));
    const std::string label = fit_label(b.label, kLeft - 22);
    g.text(kLeft - 10, y + kBar / 2 + 4, label, "end", b.chosen ? "lbl-b" : b.feasible ? "lbl" : "lbl bad");
    double acc = 0;
    for (size_t i = 0; i < kNumMemoryCategories; ++i) {
      double v = b.bytes[i];
      if (v <= 0) continue;
      double a = std::min(acc, axis_max), e = std::min(acc + v, axis_max);
      acc += v;
      if (e <= a) continue;
      g.rect(x(a), y, x(e) - x(a), kBar, kCategoryColors[i],
             std::string(kMemoryCategoryNames[i]) + ": " + gib(v, "%.2f") + " GiB", "seg");
    }
    bool clipped = total > axis_max;
    double end_x = x(std::min(total, axis_max));
    if (clipped) {
      // A break mark: the bar goes on beyond the axis.
      g.path("M" + svg::num(end_x - 9) + " " + svg::num(y - 2) + " l6 " + svg::num(kBar + 4) + " M" +
                 svg::num(end_x - 4) + " " + svg::num(y - 2) + " l6 " + svg::num(kBar + 4),
             "none", "#ffffff", 2.5, "break");
    }
    g.text(end_x + 6, y + kBar / 2 + 4,
           gib(total, total >= 100 * kGiB ? "%.0f" : "%.1f") + " GiB" + (clipped ? " \u25b8" : ""), "start",
           b.feasible ? "val" : "val bad");
    g.close_group();
    y += kBar + kGap;
  }
  if (usable_bytes > 0) {
    g.line(x(usable_bytes), plot_y0 - 6, x(usable_bytes), plot_y1, "#c0392b", 2, "", "capacity");
  }
  if (budget_bytes > 0 && budget_bytes < usable_bytes)
    g.line(x(budget_bytes), plot_y0 - 6, x(budget_bytes), plot_y1, "#c0392b", 1.5, "5 4", "budget");
  g.line(plot_x0, plot_y0, plot_x0, plot_y1, "#888888", 1);
  return g.finish();
}

// ---------------------------------------------------------------------------------------------------
// Timeline: one lane per stream, one slice per op, then allocated memory over time. Same events as
// chrome_trace(): each op at its simulated [start, end), memory samples at their op's start.

std::string timeline_svg(const StepProgram& program, const Prediction& p, double usable_bytes) {
  const auto& timing = p.time.ops;
  const size_t n = std::min(program.ops.size(), timing.size());
  double t_end = 0;
  std::array<bool, static_cast<size_t>(Stream::kCount)> lane_used{};
  std::set<OpKind> kinds;
  lane_used[static_cast<size_t>(Stream::Compute)] = true;
  for (size_t i = 0; i < n; ++i) {
    t_end = std::max(t_end, timing[i].end);
    if (timing[i].end > timing[i].start) {
      lane_used[static_cast<size_t>(program.ops[i].stream)] = true;
      kinds.insert(program.ops[i].kind);
    }
  }
  const bool seconds_axis = t_end >= 2;
  const double unit = seconds_axis ? 1.0 : 1e-3;
  const char* unit_name = seconds_axis ? "s" : "ms";

  std::vector<LegendItem> legend;
  for (OpKind k : kinds) legend.push_back({to_string(k), kind_color(k)});
  legend.push_back({"allocated memory", "#c8b8e6"});
  svg::Svg probe(kChartWidth, 10, "probe", "");
  const double legend_h = draw_legend(probe, legend, 0, 0, kChartWidth - 20);

  constexpr double kLeft = 120, kRight = 24, kLane = 26, kLaneGap = 6, kMark = 20, kMemH = 150, kAxis = 40;
  int lanes = 0;
  for (bool u : lane_used) lanes += u ? 1 : 0;
  const double x0 = kLeft, x1 = kChartWidth - kRight;
  const double lanes_top = 10 + legend_h + 10 + kMark;
  const double lanes_bottom = lanes_top + lanes * (kLane + kLaneGap);
  const double mem_top = lanes_bottom + 34, mem_bottom = mem_top + kMemH;
  const double height = mem_bottom + kAxis;
  svg::LinearScale x{0, t_end > 0 ? t_end : 1, x0, x1};

  svg::Svg g(kChartWidth, height, "timeline-chart", "Step timeline by stream, and memory over time");
  draw_legend(g, legend, 10, 10, kChartWidth - 20);

  // Time grid over lanes and memory.
  const auto ticks = svg::nice_ticks(0, (t_end > 0 ? t_end : 1) / unit, 10);
  for (double t : ticks) {
    double px = x(t * unit);
    g.line(px, lanes_top - 4, px, mem_bottom, "#ececec", 1, "", "grid");
    g.text(px, mem_bottom + 16, svg::num(t), "middle", "axis");
  }
  g.text((x0 + x1) / 2, mem_bottom + 34, std::string("time within the step (") + unit_name + ")", "middle", "axis");

  // Micro-batch boundaries: the first compute op of each micro-batch.
  std::map<int, double> mb_start;
  for (size_t i = 0; i < n; ++i)
    if (program.ops[i].stream == Stream::Compute && !mb_start.count(program.ops[i].micro_batch))
      mb_start[program.ops[i].micro_batch] = timing[i].start;
  for (const auto& [mb, t] : mb_start) {
    double px = x(t);
    g.line(px, lanes_top - kMark + 2, px, mem_bottom, "#b0b0b0", 1, "3 3", "mb");
    g.text(px + 4, lanes_top - kMark + 12, "micro-batch " + std::to_string(mb + 1), "start", "axis");
  }

  // Lanes.
  std::array<double, static_cast<size_t>(Stream::kCount)> lane_y{};
  double ly = lanes_top;
  for (size_t s = 0; s < lane_used.size(); ++s) {
    if (!lane_used[s]) continue;
    lane_y[s] = ly;
    g.rect(x0, ly, x1 - x0, kLane, "#f4f5f7", "", "lane");
    g.text(x0 - 10, ly + kLane / 2 + 4, stream_label(static_cast<Stream>(s)), "end", "lbl");
    ly += kLane + kLaneGap;
  }
  g.open_group("slices");
  for (size_t i = 0; i < n; ++i) {
    const Op& op = program.ops[i];
    double dur = timing[i].end - timing[i].start;
    if (!(dur > 0)) continue;
    std::string tip = op_phase(program, op) + "\n" + time_text(dur) + " at " + time_text(timing[i].start);
    if (op.comm_bytes > 0) tip += "\n" + bytes_text(op.comm_bytes) + " " + to_string(op.kind);
    if (op.copy_bytes > 0) tip += "\n" + bytes_text(op.copy_bytes) + " copied";
    if (op.matmul_flops > 0) tip += "\n" + fmt("%.3g", op.matmul_flops + op.attention_flops) + " FLOPs";
    double px = x(timing[i].start), w = std::max(0.6, x(timing[i].end) - px);
    g.rect(px, lane_y[static_cast<size_t>(op.stream)] + 2, w, kLane - 4, kind_color(op.kind), tip, "op");
  }
  g.close_group();

  // Memory over time: a step area of allocated bytes.
  std::vector<std::pair<double, double>> mem;
  for (const MemorySample& s : p.memory.samples) {
    if (s.op < 0 || static_cast<size_t>(s.op) >= timing.size()) continue;
    mem.emplace_back(timing[static_cast<size_t>(s.op)].start, s.allocated);
  }
  std::stable_sort(mem.begin(), mem.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  double mem_max = p.memory.peak_allocated;
  for (const auto& m : mem) mem_max = std::max(mem_max, m.second);
  const bool usable_on_scale = usable_bytes > 0 && usable_bytes <= 2.5 * std::max(mem_max, 1.0);
  double y_top = std::max(mem_max, usable_on_scale ? usable_bytes : 0.0) * 1.05;
  y_top = svg::nice_ceil(std::max(y_top, 1.0) / kGiB, 4) * kGiB;
  svg::LinearScale y{0, y_top, mem_bottom, mem_top};
  for (double t : svg::nice_ticks(0, y_top / kGiB, 4)) {
    g.line(x0, y(t * kGiB), x1, y(t * kGiB), "#ececec", 1, "", "grid");
    g.text(x0 - 6, y(t * kGiB) + 4, svg::num(t), "end", "axis");
  }
  g.text(10, mem_top - 10, "allocated GiB", "start", "lbl");
  if (!mem.empty()) {
    std::string d = "M" + svg::num(x(mem.front().first)) + " " + svg::num(y(0));
    for (size_t i = 0; i < mem.size(); ++i) {
      d += " L" + svg::num(x(mem[i].first)) + " " + svg::num(y(i == 0 ? 0 : mem[i - 1].second));
      d += " L" + svg::num(x(mem[i].first)) + " " + svg::num(y(mem[i].second));
    }
    d += " L" + svg::num(x(t_end)) + " " + svg::num(y(mem.back().second)) + " L" + svg::num(x(t_end)) + " " +
         svg::num(y(0)) + " Z";
    g.path(d, "#c8b8e6", "#6a4aa0", 1, "memory");
  }
  if (p.memory.peak_allocated > 0) {
    double py = y(p.memory.peak_allocated);
    g.line(x0, py, x1, py, "#5e3f94", 1, "2 3", "peak");
    g.text(x1 - 4, py - 4, "peak allocated " + gib(p.memory.peak_allocated, "%.1f") + " GiB", "end", "lbl halo");
  }
  if (usable_on_scale) {
    double uy = y(usable_bytes);
    g.line(x0, uy, x1, uy, "#c0392b", 2, "", "capacity");
    g.text(x1 - 4, uy - 4, "usable " + gib(usable_bytes, "%.0f") + " GiB", "end", "lbl bad halo");
  } else if (usable_bytes > 0) {
    g.text(x1 - 4, mem_top - 10, "usable " + gib(usable_bytes, "%.0f") + " GiB is off this scale", "end", "axis");
  }
  g.line(x0, mem_bottom, x1, mem_bottom, "#888888", 1);
  return g.finish();
}

// ---------------------------------------------------------------------------------------------------
// Scatter: every evaluated candidate, peak memory against tokens/s/GPU.

std::string scatter_svg(const SearchResult& r, const Strategy* chosen, double usable_bytes) {
  constexpr double kLeft = 74, kRight = 200, kTop = 30, kBottom = 52, kHeight = 450;
  const double x0 = kLeft, x1 = kChartWidth - kRight, y0 = kTop, y1 = kHeight - kBottom;
  double mem_lo = 0, mem_hi = 0, tps_hi = 0;
  bool any = false;
  for (const auto& c : r.evaluated_sample) {
    double m = c.prediction.memory.device_total;
    if (!(m > 0)) continue;
    mem_lo = any ? std::min(mem_lo, m) : m;
    mem_hi = any ? std::max(mem_hi, m) : m;
    tps_hi = std::max(tps_hi, c.prediction.tokens_per_s_per_gpu);
    any = true;
  }
  if (usable_bytes > 0) {
    mem_lo = any ? std::min(mem_lo, usable_bytes) : usable_bytes;
    mem_hi = std::max(mem_hi, usable_bytes);
  }
  if (!(mem_lo > 0)) mem_lo = kGiB;
  if (!(mem_hi > mem_lo)) mem_hi = mem_lo * 2;
  // A logarithmic memory axis when the candidates span more than 4x (a replicated 70B model needs ten
  // times what a sharded one does), a linear one otherwise.
  const bool log_x = mem_hi / mem_lo > 4;
  double lo_g = mem_lo / kGiB * 0.9, hi_g = mem_hi / kGiB * 1.1;
  std::vector<double> xticks;
  svg::LinearScale lin{0, 1, x0, x1};
  svg::LogScale lg{1, 10, x0, x1};
  if (log_x) {
    xticks = svg::log_ticks(lo_g, hi_g);
    lg = svg::LogScale{lo_g, hi_g, x0, x1};
  } else {
    lo_g = 0;
    hi_g = svg::nice_ceil(hi_g, 8);
    xticks = svg::nice_ticks(0, hi_g, 8);
    lin = svg::LinearScale{0, hi_g, x0, x1};
  }
  auto x = [&](double bytes) { return log_x ? lg(bytes / kGiB) : lin(bytes / kGiB); };
  double y_hi = svg::nice_ceil(std::max(tps_hi * 1.05, 1.0), 6);
  svg::LinearScale y{0, y_hi, y1, y0};

  svg::Svg g(kChartWidth, kHeight, "scatter-chart", "Every evaluated plan: peak memory against throughput");
  // Region beyond the budget: does not fit.
  const double limit = r.budget_bytes > 0 ? r.budget_bytes : usable_bytes;
  if (limit > 0 && x(limit) < x1) {
    g.rect(x(limit), y0, x1 - x(limit), y1 - y0, "#fbecea", "", "nofit");
    if (x1 - x(limit) > 120) g.text(x1 - 6, y0 + 14, "does not fit \u2192", "end", "lbl bad");
  }
  for (double t : xticks) {
    g.line(x(t * kGiB), y0, x(t * kGiB), y1, "#ececec", 1, "", "grid");
    g.text(x(t * kGiB), y1 + 16, svg::num(t), "middle", "axis");
  }
  for (double t : svg::nice_ticks(0, y_hi, 6)) {
    g.line(x0, y(t), x1, y(t), "#ececec", 1, "", "grid");
    g.text(x0 - 6, y(t) + 4, svg::grouped(t), "end", "axis");
  }
  g.text((x0 + x1) / 2, y1 + 38, std::string("peak memory per GPU, GiB (device total") + (log_x ? ", log scale)" : ")"),
         "middle", "axis");
  g.vertical_text(18, (y0 + y1) / 2, "tokens/s per GPU", "axis");

  // Families in a fixed order (the verdict map's), each with its colour.
  std::map<std::string, size_t> family_index;
  for (const auto& [name, v] : r.families) family_index.emplace(name, family_index.size());
  for (const auto& c : r.evaluated_sample) family_index.emplace(to_string(c.strategy.kind), family_index.size());
  auto family_color = [&](const Strategy& s) {
    return kFamilyColors[family_index.at(to_string(s.kind)) % kFamilyColors.size()];
  };
  std::map<std::string, std::pair<int, int>> counts;  // family -> (feasible, evaluated)
  auto tooltip = [&](const Candidate& c) {
    const Prediction& p = c.prediction;
    std::string t = one_line_strategy(c.strategy) + "\n" + gib(p.memory.device_total, "%.2f") + " GiB per GPU, " +
                    svg::grouped(p.tokens_per_s_per_gpu) + " tokens/s/GPU, step " + time_text(p.time.step_s);
    if (!c.feasible) t += "\ndoes not fit: " + c.infeasible_reason;
    return t;
  };
  const Candidate* chosen_c = nullptr;
  g.open_group("points infeasible");
  for (const auto& c : r.evaluated_sample) {
    auto& cnt = counts[to_string(c.strategy.kind)];
    cnt.second++;
    if (c.feasible) {
      cnt.first++;
      continue;
    }
    if (!(c.prediction.memory.device_total > 0)) continue;
    g.circle(x(c.prediction.memory.device_total), y(c.prediction.tokens_per_s_per_gpu), 3.2, "#b9b9b9", "", tooltip(c),
             "pt");
  }
  g.close_group();
  g.open_group("points feasible");
  for (const auto& c : r.evaluated_sample) {
    if (!c.feasible) continue;
    if (chosen && !chosen_c && same_strategy(c.strategy, *chosen)) chosen_c = &c;
    g.circle(x(c.prediction.memory.device_total), y(c.prediction.tokens_per_s_per_gpu), 3.6, family_color(c.strategy),
             "", tooltip(c), "pt");
  }
  g.close_group();
  if (usable_bytes > 0 && x(usable_bytes) <= x1) {
    g.line(x(usable_bytes), y0, x(usable_bytes), y1, "#c0392b", 2, "", "capacity");
    g.text(x(usable_bytes), y0 - 8, "usable " + gib(usable_bytes, "%.0f") + " GiB", "middle", "lbl bad");
  }
  if (r.budget_bytes > 0 && r.budget_bytes < usable_bytes)
    g.line(x(r.budget_bytes), y0, x(r.budget_bytes), y1, "#c0392b", 1.5, "5 4", "budget");
  if (chosen_c) {
    double cx = x(chosen_c->prediction.memory.device_total), cy = y(chosen_c->prediction.tokens_per_s_per_gpu);
    g.circle(cx, cy, 9, "none", "#111111", "chosen: " + tooltip(*chosen_c), "chosen-mark");
    double lx = cx - 60, ly = std::max(y0 + 12, cy - 26);
    g.line(cx - 7, cy - 7, lx + 44, ly + 4, "#111111", 1);
    g.text(lx + 40, ly, "chosen", "end", "lbl-b halo");
  }
  g.line(x0, y1, x1, y1, "#888888", 1);
  g.line(x0, y0, x0, y1, "#888888", 1);

  // Legend on the right.
  std::vector<LegendItem> legend;
  for (const auto& [name, idx] : family_index) {
    auto it = counts.find(name);
    if (it == counts.end()) continue;
    legend.push_back({name + " (" + std::to_string(it->second.first) + "/" + std::to_string(it->second.second) + ")",
                      kFamilyColors[idx % kFamilyColors.size()], "circle"});
  }
  legend.push_back({"does not fit", "#b9b9b9", "circle"});
  if (chosen_c) legend.push_back({"chosen plan", "#111111", "ring"});
  double ly = y0;
  g.text(x1 + 20, ly + 10, "family (feasible/evaluated)", "start", "axis");
  ly += 20;
  for (const auto& it : legend) {
    draw_legend(g, {it}, x1 + 20, ly, kRight - 24);
    ly += 20;
  }
  return g.finish();
}

// ---------------------------------------------------------------------------------------------------
// The page.

namespace {

constexpr const char* kStyle = R"css(
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f3f4f7; color: #1d1f24;
  font: 14px/1.45 "DejaVu Sans", "Liberation Sans", Arial, Helvetica, sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 22px 18px 40px; }
header h1 { font-size: 22px; margin: 0 0 6px; }
header p { margin: 2px 0; color: #444; }
header .muted, .muted { color: #6b6f78; }
section { background: #fff; border-radius: 8px; box-shadow: 0 1px 3px rgba(0,0,0,.08); margin: 16px 0;
  padding: 14px 18px 16px; }
section h2 { font-size: 17px; margin: 0 0 4px; }
section p.caption { margin: 2px 0 10px; color: #555; font-size: 13px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 10px 0 12px; }
.card { flex: 1 1 150px; border: 1px solid #e3e5ea; border-radius: 6px; padding: 8px 12px; }
.card .k { font-size: 12px; color: #6b6f78; }
.card .v { font-size: 20px; font-weight: 600; }
.card .s { font-size: 12px; color: #6b6f78; }
.ok { color: #1e7d32; } .bad { color: #c0392b; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 4px 7px; border-bottom: 1px solid #eceef2; vertical-align: top; }
th { color: #555; font-weight: 600; background: #fafbfc; }
td.nw { white-space: nowrap; }
.card .v.small { font-size: 15px; line-height: 1.3; padding-top: 3px; }
.scroll { overflow-x: auto; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.chosen td { background: #eef6ee; font-weight: 600; }
.two { display: grid; grid-template-columns: 1fr 1fr; gap: 18px; }
code { font: 12px "DejaVu Sans Mono", monospace; background: #f3f4f7; padding: 1px 4px; border-radius: 3px; }
svg.chart { display: block; max-width: 100%; height: auto; margin-top: 6px; }
svg.chart text { font-family: "DejaVu Sans", "Liberation Sans", Arial, sans-serif; }
svg .lbl { font-size: 12px; fill: #30333a; }
svg .lbl-b { font-size: 12px; fill: #111; font-weight: 700; }
svg .val { font-size: 12px; fill: #30333a; }
svg .val, svg .halo { paint-order: stroke; stroke: #fff; stroke-width: 3px; stroke-linejoin: round; }
svg .grp { font-size: 12px; fill: #6b6f78; font-weight: 700; text-transform: uppercase; letter-spacing: .04em; }
svg .axis { font-size: 11px; fill: #6b6f78; }
svg .bad { fill: #c0392b; }
svg .infeasible .seg { opacity: .55; }
svg .pt { fill-opacity: .75; }
svg .ring, svg .chosen-mark { stroke-width: 2.5; }
footer { color: #8a8e97; font-size: 12px; text-align: center; margin-top: 18px; }
)css";

std::string td(const std::string& s, bool numeric = false) {
  return std::string(numeric ? "<td class=\"n\">" : "<td>") + escape(s) + "</td>";
}
std::string th(const std::string& s, bool numeric = false) {
  return std::string(numeric ? "<th class=\"n\">" : "<th>") + escape(s) + "</th>";
}

std::string card(const std::string& k, const std::string& v, const std::string& sub, const std::string& cls = "") {
  // Long values (a phase name) in a smaller face.
  std::string vcls = cls;
  if (svg::text_width(v, 20) > 170) vcls += vcls.empty() ? "small" : " small";
  return "<div class=\"card\"><div class=\"k\">" + escape(k) + "</div><div class=\"v" +
         (vcls.empty() ? "" : " " + vcls) + "\">" + escape(v) + "</div><div class=\"s\">" + escape(sub) +
         "</div></div>\n";
}

std::string plans_table(const std::vector<Candidate>& ranked, int top, const Strategy* chosen) {
  std::string h = "<table id=\"top-plans\"><thead><tr>" + th("#") + th("strategy") + th("wrap") + th("reshard") +
                  th("ckpt") + th("offload") + th("dtypes") + th("mb \u00d7 acc", true) + th("peak GiB", true) +
                  th("free", true) + th("exposed", true) + th("step", true) + th("MFU", true) + th("tok/s/GPU", true) +
                  "</tr></thead><tbody>\n";
  const std::vector<PlanRow> rows = merge_identical(ranked, static_cast<size_t>(std::max(top, 0)));
  for (size_t i = 0; i < rows.size(); ++i) {
    const Strategy& s = rows[i].plan->strategy;
    const Prediction& p = rows[i].plan->prediction;
    std::string names = rows[i].name_text();
    if (s.kind == StrategyKind::Hsdp) names += ":" + std::to_string(s.hsdp_group);
    bool is_chosen = chosen && same_strategy(s, *chosen);
    double headroom = p.usable_bytes > 0 ? (p.usable_bytes - p.memory.device_total) / p.usable_bytes * 100 : 0;
    double exposed = p.time.step_s > 0 ? p.time.exposed_comm_s / p.time.step_s * 100 : 0;
    h += std::string(is_chosen ? "<tr class=\"chosen\">" : "<tr>") + td(std::to_string(i + 1), true) + td(names) +
         td(shards_params(s.kind) ? to_string(s.wrap) : "-") +
         td(shards_params(s.kind) ? (s.reshard_after_forward ? "yes" : "no") : "-") + td(act_ckpt_name(s)) +
         td(to_string(s.offload)) + td(std::string(to_string(s.param_dtype)) + "/" + to_string(s.reduce_dtype)) +
         td(std::to_string(s.micro_batch) + " \u00d7 " + std::to_string(s.grad_accum), true) +
         td(gib(p.memory.device_total, "%.2f"), true) + td(fmt("%.1f%%", headroom), true) +
         td(fmt("%.1f%%", exposed), true) + td(time_text(p.time.step_s), true) + td(fmt("%.1f%%", p.mfu * 100), true) +
         td(svg::grouped(p.tokens_per_s_per_gpu), true) + "</tr>\n";
  }
  return h + "</tbody></table>\n";
}

std::string families_table(const SearchResult& r) {
  std::string h = "<table id=\"families\"><thead><tr>" + th("family") + th("verdict") + th("best plan (or smallest)") +
                  th("peak GiB", true) + th("tok/s/GPU", true) + th("why it does not fit") + "</tr></thead><tbody>\n";
  for (const FamilyRow& f : merge_families(r.families)) {
    const std::string& name = f.name;
    const FamilyVerdict& v = *f.verdict;
    std::string verdict = v.feasible ? "fits" : v.best ? "does not fit" : "not applicable";
    std::string cls = v.feasible ? "ok" : "bad";
    h += "<tr><td class=\"nw\">" + escape(name) + "</td><td class=\"nw " + cls + "\">" +
         escape((v.feasible ? "\u2713 " : "\u2717 ") + verdict) + "</td>";
    if (v.best) {
      const Prediction& p = v.best->prediction;
      h += td(short_strategy(v.best->strategy, false)) + td(gib(p.memory.device_total, "%.1f"), true) +
           td(svg::grouped(p.tokens_per_s_per_gpu), true);
    } else {
      h += td("-") + td("-", true) + td("-", true);
    }
    h += td(v.feasible ? "" : family_line(name, v)) + "</tr>\n";
  }
  return h + "</tbody></table>\n";
}

std::string breakdown_table(const Prediction& p) {
  std::string h = "<table id=\"chosen-memory\"><thead><tr>" + th("category") + th("GiB at the peak", true) +
                  th("share", true) + "</tr></thead><tbody>\n";
  double total = total_of(p.memory.breakdown);
  for (size_t i = 0; i < kNumMemoryCategories; ++i) {
    double v = p.memory.breakdown[i];
    if (v <= 0) continue;
    h += "<tr><td><svg width=\"10\" height=\"10\" class=\"sw\"><rect width=\"10\" height=\"10\" fill=\"" +
         std::string(kCategoryColors[i]) + "\"/></svg> " + escape(std::string(kMemoryCategoryNames[i])) + "</td>" +
         td(gib(v, "%.2f"), true) + td(fmt("%.1f%%", total > 0 ? v / total * 100 : 0), true) + "</tr>\n";
  }
  h += "<tr><td><b>device total</b></td>" + td(gib(p.memory.device_total, "%.2f"), true) + td("", true) + "</tr>\n";
  return h + "</tbody></table>\n";
}

std::string knobs_table(const Strategy& s) {
  std::vector<std::pair<std::string, std::string>> rows{
      {"strategy", kind_name(s)},
      {"wrap", shards_params(s.kind) ? to_string(s.wrap) : "-"},
      {"reshard after forward", shards_params(s.kind) ? (s.reshard_after_forward ? "yes" : "no") : "-"},
      {"activation checkpointing", act_ckpt_name(s)},
      {"offload", to_string(s.offload)},
      {"param / reduce / master dtype",
       std::string(to_string(s.param_dtype)) + " / " + to_string(s.reduce_dtype) + " / " + to_string(s.master_dtype)},
      {"micro-batch \u00d7 accumulation", std::to_string(s.micro_batch) + " \u00d7 " + std::to_string(s.grad_accum)},
      {"sequence length", std::to_string(s.seq_len)},
      {"optimizer, method", std::string(to_string(s.optimizer)) + ", " + to_string(s.method)},
      {"attention", to_string(s.attention)},
  };
  std::string h = "<table id=\"chosen-knobs\"><tbody>\n";
  for (const auto& [k, v] : rows) h += "<tr><th>" + escape(k) + "</th>" + td(v) + "</tr>\n";
  return h + "</tbody></table>\n";
}

std::string page_open(const std::string& title) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  // Nothing may be loaded from anywhere: the page is complete as it is.
  h += "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n";
  h += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  h += "<meta name=\"generator\" content=\"fsdp-plan\">\n";
  h += "<title>" + escape(title) + "</title>\n<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n<main>\n";
  return h;
}

std::string page_close() {
  return "<footer>Generated by fsdp-plan. Self-contained: no scripts, nothing loaded from the network.</footer>\n"
         "</main>\n</body>\n</html>\n";
}

void write_page(const std::string& path, const std::string& page) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw InputError("--html: cannot write '" + path + "'");
  out << page;
  if (!out) throw InputError("--html: failed writing '" + path + "'");
}

MemoryBar bar_of(const Candidate& c, std::string label, std::string group, const Strategy* chosen) {
  MemoryBar b;
  b.label = std::move(label);
  b.tooltip = one_line_strategy(c.strategy) + (c.feasible ? "" : "\ndoes not fit: " + c.infeasible_reason);
  b.bytes = c.prediction.memory.breakdown;
  b.feasible = c.feasible;
  b.chosen = chosen && same_strategy(c.strategy, *chosen);
  b.group = std::move(group);
  return b;
}

}  // namespace

std::string render_html_report(const HtmlReportInput& in) {
  FSDP_ASSERT(in.model && in.hardware && in.runtime, "html report needs model, hardware and runtime");
  const ModelSpec& m = *in.model;
  const double usable = in.hardware->usable_device_memory.value;
  const Prediction* p = in.prediction;
  std::string cluster_text = std::to_string(in.cluster.nodes) + " \u00d7 " + std::to_string(in.cluster.gpus_per_node) +
                             " " + in.hardware->name;
  std::string title = "fsdp-plan: " + m.name + " on " + cluster_text;
  std::string h = page_open(title);

  // Header: model, cluster, search.
  int64_t params = p ? p->params : ModuleGraph(m).total_params();
  h += "<header>\n<h1>" + escape(title) + "</h1>\n";
  h += "<p id=\"model-line\"><b>model</b> " + escape(m.name) + ": " + fmt("%.2fB", static_cast<double>(params) / kGB) +
       " parameters, " + std::to_string(m.num_layers) + " layers, hidden " + std::to_string(m.hidden_size) +
       ", heads " + std::to_string(m.num_heads) + "/" + std::to_string(m.num_kv_heads) + ", vocab " +
       std::to_string(m.vocab_size) + "</p>\n";
  h += "<p id=\"cluster-line\"><b>cluster</b> " + escape(cluster_text) + " = " +
       std::to_string(in.cluster.world_size()) + " GPUs (" + escape(in.hardware->device_kind) + "), " +
       gib(usable, "%.2f") + " GiB usable each; runtime " + escape(in.runtime->name) +
       (in.objective.empty() ? "" : "; objective " + escape(in.objective)) + "</p>\n";
  // The links between nodes and the clock the profile prices, as the text report shows them (docs/hardware.md).
  if (!in.hardware->device_is_host() && in.cluster.nodes > 1)
    h += "<p id=\"network-line\"><b>network</b> " + escape(network_summary(*in.hardware)) + "</p>\n";
  if (const std::string clocks = clock_summary(*in.hardware); !clocks.empty())
    h += "<p id=\"clocks-line\"><b>clocks</b> " + escape(clocks) + "</p>\n";
  if (in.search) {
    const SearchResult& r = *in.search;
    h += "<p class=\"muted\" id=\"search-line\">searched " + svg::grouped(static_cast<double>(r.evaluated)) +
         " configurations (" + svg::grouped(static_cast<double>(r.feasible)) + " feasible, " +
         svg::grouped(static_cast<double>(r.pruned)) + " pruned by proven bounds) in " + fmt("%.3f", r.seconds) +
         " s; memory budget " + gib(r.budget_bytes, "%.2f") + " GiB per GPU" +
         (in.global_batch_tokens > 0 ? "; global batch " + svg::grouped(in.global_batch_tokens) + " tokens" : "") +
         "</p>\n";
  }
  for (const auto& note : in.notes) h += "<p class=\"muted note\">" + escape(note) + "</p>\n";
  h += "</header>\n";

  // The chosen plan.
  h += "<section id=\"chosen\">\n<h2>" + std::string(in.search ? "Chosen plan" : "Plan") + "</h2>\n";
  if (p && in.chosen) {
    const Strategy& s = *in.chosen;
    double headroom = usable > 0 ? (usable - p->memory.device_total) / usable * 100 : 0;
    h += "<p class=\"caption\"><code>" + escape(one_line_strategy(s)) + "</code></p>\n<div class=\"cards\">\n";
    h +=
        card("peak memory per GPU", gib(p->memory.device_total, "%.2f") + " GiB",
             "of " + gib(usable, "%.0f") + " GiB usable, " + fmt("%.1f%%", headroom) + " free", p->fits ? "ok" : "bad");
    h += card("step time", time_text(p->time.step_s),
              "compute " + time_text(p->time.compute_s) + ", exposed comm " + time_text(p->time.exposed_comm_s));
    h += card("tokens/s per GPU", svg::grouped(p->tokens_per_s_per_gpu),
              svg::grouped(p->tokens_per_s_per_gpu * static_cast<double>(in.cluster.world_size())) +
                  " tokens/s in all, " + svg::grouped(p->tokens_per_step) + " per step");
    h += card("MFU", fmt("%.1f%%", p->mfu * 100), "model FLOPs / peak " + std::string(to_string(s.param_dtype)));
    h += card("memory peak in", p->memory.peak_phase,
              "allocated " + gib(p->memory.peak_allocated, "%.2f") + " GiB, reserved " +
                  gib(p->memory.reserved_peak, "%.2f") + " GiB");
    h += "</div>\n<div class=\"two\">\n<div>" + knobs_table(s) + "</div>\n<div>" + breakdown_table(*p) +
         "</div>\n</div>\n";
  } else {
    h += "<p class=\"bad\" id=\"no-plan\"><b>No plan fits.</b> Each strategy family's smallest configuration is "
         "drawn below with what it needs. Try more nodes (--nodes auto finds the fewest), a shorter --seq, or "
         "--offload params.</p>\n";
  }
  h += "</section>\n";

  // Memory chart.
  std::vector<MemoryBar> bars;
  if (in.search) {
    const SearchResult& r = *in.search;
    const std::vector<PlanRow> rows = merge_identical(r.ranked, static_cast<size_t>(std::max(in.top_n, 0)));
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::string label = rows[i].names.size() > 1
                                    ? rows[i].name_text() + " " + short_strategy(rows[i].plan->strategy, false)
                                    : short_strategy(rows[i].plan->strategy);
      bars.push_back(bar_of(*rows[i].plan, "#" + std::to_string(i + 1) + "  " + label, "top plans", in.chosen));
    }
    for (const FamilyRow& f : merge_families(r.families))
      if (f.verdict->best)
        bars.push_back(bar_of(
            *f.verdict->best,
            f.name + (f.verdict->feasible ? ": " : " \u2717 ") + short_strategy(f.verdict->best->strategy, false),
            "best of each strategy family (or its smallest, if none fits)", in.chosen));
  } else if (p && in.chosen) {
    MemoryBar b;
    b.label = "re-simulated: " + short_strategy(*in.chosen);
    b.tooltip = one_line_strategy(*in.chosen);
    b.bytes = p->memory.breakdown;
    b.feasible = p->fits;
    b.chosen = true;
    b.group = "this plan";
    bars.push_back(b);
  }
  if (!in.recorded_breakdown.empty()) {
    MemoryBar b;
    b.label = in.recorded_label.empty() ? "recorded prediction" : in.recorded_label;
    for (const auto& [name, bytes] : in.recorded_breakdown)
      if (auto c = memory_category_from_string(name)) b.bytes[static_cast<size_t>(*c)] = bytes;
    b.feasible = total_of(b.bytes) <= usable || usable <= 0;
    b.group = "this plan";
    bars.push_back(b);
  }
  if (!bars.empty()) {
    h += "<section id=\"memory\">\n<h2>Memory per GPU by category</h2>\n<p class=\"caption\">At each plan's peak. "
         "The red line is the GPU's usable memory";
    if (in.search && in.search->budget_bytes < usable) h += ", the dashed one the search's budget (headroom kept free)";
    h += ". Hover a bar for the numbers.</p>\n" +
         memory_chart_svg(bars, usable, in.search ? in.search->budget_bytes : 0) + "</section>\n";
  }

  // Timeline.
  if (p && in.program && !p->time.ops.empty()) {
    const StepProgram& prog = *in.program;
    h += "<section id=\"timeline\">\n<h2>Step timeline of the " + std::string(in.search ? "chosen " : "") +
         "plan</h2>\n<p class=\"caption\">One simulated step on one rank: one lane per stream, one slice per "
         "operation of the step program (the same events as <code>--trace</code>), and the allocated memory "
         "over time below.";
    const int64_t K = in.chosen ? in.chosen->grad_accum : 1;
    if (K > prog.layout.micro_batches_emitted) {
      h += " Of the " + std::to_string(K) + " micro-batches, 1, 2 and " + std::to_string(K) +
           " are drawn; micro-batches 3 to " + std::to_string(K - 1) +
           " repeat micro-batch 2 and are not drawn, so the whole step takes " + escape(time_text(p->time.step_s)) +
           ".";
    }
    h += " Hover a slice for the operation.</p>\n" + timeline_svg(prog, *p, usable) + "</section>\n";
  }

  // Scatter, top plans and verdicts.
  if (in.search) {
    const SearchResult& r = *in.search;
    h += "<section id=\"tradeoff\">\n<h2>Every evaluated plan</h2>\n<p class=\"caption\">" +
         svg::grouped(static_cast<double>(r.evaluated_sample.size())) +
         " configurations: peak memory per GPU against throughput, coloured by strategy family; grey ones do not "
         "fit. Hover a point for its configuration.</p>\n" +
         scatter_svg(r, in.chosen, usable) + "</section>\n";
    if (!r.ranked.empty())
      h += "<section id=\"plans\">\n<h2>Top plans</h2>\n<p class=\"caption\">Peak = device total per GPU, "
           "free = headroom to the usable memory, exposed = communication not hidden behind compute (share of the "
           "step).</p>\n<div class=\"scroll\">" +
           plans_table(r.ranked, std::max(in.top_n, 10), in.chosen) + "</div></section>\n";
    h += "<section id=\"verdicts\">\n<h2>Strategy families</h2>\n<p class=\"caption\">Each family's best plan, or "
         "why none fits, in numbers.</p>\n<div class=\"scroll\">" +
         families_table(r) + "</div></section>\n";
  }
  return h + page_close();
}

void write_html_report(const std::string& path, const HtmlReportInput& in) { write_page(path, render_html_report(in)); }

// ---------------------------------------------------------------------------------------------------
// Predicted against measured.

std::string comparison_chart_svg(const Comparison& c) {
  constexpr double kLeft = 170, kRight = 150, kPair = 13, kRowGap = 12, kAxis = 46;
  double max_v = 0;
  for (const auto& r : c.memory) max_v = std::max({max_v, r.predicted, r.has_measured ? r.measured : 0.0});
  std::vector<LegendItem> legend{{"predicted (category colour)", "#4a90d9"}, {"measured", "#555b66"}};
  const double top = 10 + 18 + 12;
  const double rows_h = static_cast<double>(c.memory.size()) * (2 * kPair + kRowGap) + 8;
  const double height = top + rows_h + kAxis;
  const double x0 = kLeft, x1 = kChartWidth - kRight;
  const double axis_max = svg::nice_ceil(std::max(max_v, 1.0) / kGiB, 8) * kGiB;
  svg::LinearScale x{0, axis_max, x0, x1};
  svg::Svg g(kChartWidth, height, "comparison-chart", "Predicted against measured memory by category");
  draw_legend(g, legend, 10, 10, kChartWidth - 20);
  const double y_end = top + rows_h;
  for (double t : svg::nice_ticks(0, axis_max / kGiB, 8)) {
    g.line(x(t * kGiB), top, x(t * kGiB), y_end, "#ececec", 1, "", "grid");
    g.text(x(t * kGiB), y_end + 16, svg::num(t), "middle", "axis");
  }
  g.text((x0 + x1) / 2, y_end + 36, "GiB per GPU", "middle", "axis");
  double y = top;
  for (const auto& r : c.memory) {
    auto cat = memory_category_from_string(r.name);
    const char* color = cat ? kCategoryColors[static_cast<size_t>(*cat)] : "#1d1f24";  // the peak: black
    if (!cat) {
      g.line(10, y - kRowGap / 2, x1, y - kRowGap / 2, "#c9ccd2", 1);
      y += 4;
    }
    std::string tip = r.name + "\npredicted " + gib(r.predicted, "%.3f") + " GiB";
    if (r.has_measured)
      tip += "\nmeasured " + gib(r.measured, "%.3f") + " GiB (" + fmt("%+.1f%%", r.error() * 100) + ")";
    g.open_group(cat ? "pair" : "pair total", tip);
    g.text(kLeft - 10, y + kPair + 4, r.name, "end", cat ? "lbl" : "lbl-b");
    g.rect(x0, y, x(r.predicted) - x0, kPair - 2, color, "", "pred");
    if (r.has_measured) g.rect(x0, y + kPair, x(r.measured) - x0, kPair - 2, "#555b66", "", "meas");
    std::string err = r.has_measured ? (r.measured != 0 ? fmt("%+.1f%%", r.error() * 100) : "-") : "not measured";
    const bool off = r.has_measured && std::fabs(r.error()) > 0.10;
    g.text(std::max(x(r.predicted), r.has_measured ? x(r.measured) : x0) + 8, y + kPair + 4,
           gib(r.predicted, "%.2f") + (r.has_measured ? " vs " + gib(r.measured, "%.2f") : "") + " GiB  " + err,
           "start", off ? "val bad" : "val");
    g.close_group();
    y += 2 * kPair + kRowGap;
  }
  g.line(x0, top, x0, y_end, "#888888", 1);
  return g.finish();
}

std::string render_comparison_html(const PlanFile& plan, const Comparison& c, const std::string& plan_path,
                                   const std::string& report_path) {
  const std::string cluster_text = std::to_string(plan.cluster.nodes) + " \u00d7 " +
                                   std::to_string(plan.cluster.gpus_per_node) + " " + plan.cluster.hardware;
  const std::string title = "fsdp-plan compare: " + plan.model_name + " on " + cluster_text;
  std::string h = page_open(title);
  h += "<header>\n<h1>" + escape(title) + "</h1>\n";
  h += "<p><b>plan</b> " + escape(plan_path) + ": <code>" + escape(one_line_strategy(plan.strategy)) + "</code></p>\n";
  h += "<p><b>measured</b> " + escape(report_path) + "; runtime " + escape(plan.runtime) + "</p>\n</header>\n";
  h += "<section id=\"compare-memory\">\n<h2>Memory per GPU: predicted against measured</h2>\n<p class=\"caption\">"
       "Each category at the predicted and at the measured peak; errors beyond 10% in red. Hover a pair for the "
       "numbers.</p>\n" +
       comparison_chart_svg(c) + "</section>\n";
  auto rows = [&](const std::vector<ComparisonRow>& v, const char* id, const char* what) {
    std::string t = std::string("<table id=\"") + id + "\"><thead><tr>" + th(what) + th("predicted", true) +
                    th("measured", true) + th("error", true) + "</tr></thead><tbody>\n";
    for (const auto& r : v) {
      auto value = [&](double x) {
        if (r.unit == "bytes") return gib(x, "%.3f") + " GiB";
        if (r.unit == "s") return time_text(x);
        return svg::grouped(x) + " " + r.unit;
      };
      const bool off = r.has_measured && std::fabs(r.error()) > 0.10;
      t += "<tr>" + td(r.name) + td(value(r.predicted), true) +
           td(r.has_measured ? value(r.measured) : "not measured", true) + "<td class=\"n" +
           std::string(off ? " bad" : "") + "\">" +
           escape(r.has_measured && r.measured != 0 ? fmt("%+.1f%%", r.error() * 100) : "-") + "</td></tr>\n";
    }
    return t + "</tbody></table>\n";
  };
  h += "<section id=\"compare-table\">\n<h2>In numbers</h2>\n<div class=\"two\">\n<div>" +
       rows(c.memory, "compare-memory-table", "memory") + "</div>\n<div>" + rows(c.time, "compare-time-table", "time") +
       "</div>\n</div>\n</section>\n";
  return h + page_close();
}

void write_comparison_html(const std::string& path, const PlanFile& plan, const Comparison& c,
                           const std::string& plan_path, const std::string& report_path) {
  write_page(path, render_comparison_html(plan, c, plan_path, report_path));
}

}  // namespace fsdp
