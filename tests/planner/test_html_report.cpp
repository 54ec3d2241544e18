// The HTML report (issue 9): structure of the page and its SVG charts, numbers consistent with the
// prediction and the trace, escaping of outside text, and the --html flags of the CLI.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "model/model_loader.hpp"
#include "report/html_report.hpp"
#include "report/identical_plans.hpp"
#include "report/plan_report.hpp"
#include "report/svg.hpp"
#include "report/trace_writer.hpp"

using namespace fsdp;

namespace {

const std::string kRoot = FSDP_SOURCE_ROOT;

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = hay.find(needle); pos != std::string::npos; pos = hay.find(needle, pos + needle.size())) ++n;
  return n;
}

// The markup between <tag id="id" ...> and its matching close (tags of that name do not nest in the report).
std::string element(const std::string& page, const std::string& tag, const std::string& id) {
  size_t a = page.find("<" + tag + " id=\"" + id + "\"");
  if (a == std::string::npos) return "";
  size_t b = page.find("</" + tag + ">", a);
  return b == std::string::npos ? "" : page.substr(a, b + tag.size() + 3 - a);
}

// Checks that every element is closed in order (void elements and "/>" excepted), and that no raw '<'
// or '>' is left in text or attribute values (everything from outside is escaped). Returns "" or why not.
std::string balance_error(const std::string& h) {
  static const std::set<std::string> kVoid{"meta", "br", "img", "input", "link", "hr"};
  std::vector<std::string> stack;
  size_t i = 0;
  while ((i = h.find_first_of("<>", i)) != std::string::npos) {
    if (h[i] == '>') return "stray '>' at " + std::to_string(i) + ": " + h.substr(i > 40 ? i - 40 : 0, 80);
    if (h.compare(i, 9, "<!DOCTYPE") == 0) {
      i = h.find('>', i) + 1;
      continue;
    }
    size_t end = i + 1;
    char quote = 0;
    for (; end < h.size(); ++end) {  // '>' ends the tag unless inside a quoted attribute value
      if (quote) {
        if (h[end] == quote) quote = 0;
        if (h[end] == '<') return "raw '<' in an attribute value at " + std::to_string(end);
      } else if (h[end] == '"' || h[end] == '\'') {
        quote = h[end];
      } else if (h[end] == '<') {
        return "'<' inside a tag at " + std::to_string(end);
      } else if (h[end] == '>') {
        break;
      }
    }
    if (end >= h.size()) return "unterminated tag at " + std::to_string(i);
    std::string tag = h.substr(i + 1, end - i - 1);
    bool closing = !tag.empty() && tag[0] == '/';
    bool self_closing = !tag.empty() && tag.back() == '/';
    std::string name = tag.substr(closing ? 1 : 0);
    name = name.substr(0, name.find_first_of(" \n/"));
    if (closing) {
      if (stack.empty() || stack.back() != name)
        return "</" + name + "> closes <" + (stack.empty() ? "nothing" : stack.back()) + "> at " + std::to_string(i);
      stack.pop_back();
    } else if (!self_closing && !kVoid.count(name)) {
      stack.push_back(name);
    }
    i = end + 1;
  }
  return stack.empty() ? "" : "<" + stack.back() + "> is never closed";
}

struct Rect {
  double x, y, w, h;
  std::string fill;
};

std::vector<Rect> rects_of_class(const std::string& svg, const std::string& cls) {
  std::vector<Rect> out;
  std::regex re(
      "<rect x=\"([-0-9.]+)\" y=\"([-0-9.]+)\" width=\"([-0-9.]+)\" height=\"([-0-9.]+)\" fill=\"([^\"]*)\" "
      "class=\"" +
      cls + "\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back({std::stod((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4]), (*it)[5]});
  return out;
}

std::vector<double> line_x_of_class(const std::string& svg, const std::string& cls) {
  std::vector<double> out;
  std::regex re("<line x1=\"([-0-9.]+)\" y1=\"[-0-9.]+\" x2=\"([-0-9.]+)\"[^>]*class=\"" + cls + "\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1]));
  return out;
}

// One real search, shared by the tests: llama2-7b on one node of a100-80gb (feasible and infeasible
// candidates, several families).
struct Fixture {
  ModelSpec model = load_model("llama2-7b", kRoot);
  ModuleGraph graph{model};
  HardwareProfile hw = load_hardware("a100-80gb", kRoot);
  RuntimeProfile rt = load_runtime("fsdp-run", kRoot);
  Cluster cluster{1, 8};
  SearchResult result;
  StepProgram program;
  Prediction prediction;

  Fixture() {
    SearchRequest req;
    req.graph = &graph;
    req.hardware = &hw;
    req.runtime = &rt;
    req.cluster = cluster;
    req.base.seq_len = 4096;
    req.global_batch_tokens = 4194304;
    result = search_plans(req);
    REQUIRE(!result.ranked.empty());
    prediction = simulate(SimulationInput{&graph, &hw, &rt, cluster, result.ranked.front().strategy}, &program);
  }

  HtmlReportInput input() const {
    HtmlReportInput in;
    in.model = &model;
    in.hardware = &hw;
    in.runtime = &rt;
    in.cluster = cluster;
    in.objective = "throughput";
    in.global_batch_tokens = 4194304;
    in.search = &result;
    in.chosen = &result.ranked.front().strategy;
    in.prediction = &prediction;
    in.program = &program;
    return in;
  }
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

std::string gib2(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / kGiB);
  return buf;
}

}  // namespace

TEST_CASE("svg: escape replaces every markup character and drops control characters") {
  CHECK(svg::escape("a<b>&\"c\"'d'") == "a&lt;b&gt;&amp;&quot;c&quot;&#39;d&#39;");
  CHECK(svg::escape("x\x01y\x1bz\tw\n") == "xyz\tw\n");
  CHECK(svg::escape("\xc2\xb5s \xe2\x86\x92") == "\xc2\xb5s \xe2\x86\x92");  // UTF-8 passes through
  CHECK(svg::escape("&amp;") == "&amp;amp;");                                // escaped once more, not trusted
}

TEST_CASE("svg: number formatting and axis ticks") {
  CHECK(svg::num(12.5) == "12.5");
  CHECK(svg::num(3.0) == "3");
  CHECK(svg::num(-0.001) == "0");
  CHECK(svg::num(1.005e3) == "1005");
  CHECK(svg::grouped(1234567.0) == "1,234,567");
  CHECK(svg::grouped(-1234.5, 1) == "-1,234.5");
  CHECK(svg::grouped(999.0) == "999");

  auto t = svg::nice_ticks(0, 76.3, 8);
  REQUIRE(t.size() >= 5);
  CHECK(t.front() == 0);
  CHECK(t.back() <= 76.3);
  CHECK(t.back() + (t[1] - t[0]) > 76.3);  // covers the range
  for (size_t i = 1; i < t.size(); ++i) CHECK(t[i] - t[i - 1] == doctest::Approx(10));
  CHECK(svg::nice_ceil(76.3, 8) == 80);
  CHECK(svg::nice_ceil(0.37, 4) == doctest::Approx(0.4));

  auto lt = svg::log_ticks(27, 1500);
  CHECK(lt == std::vector<double>{30, 50, 100, 200, 300, 500, 1000});
  svg::LogScale ls{10, 1000, 0, 200};
  CHECK(ls(100) == doctest::Approx(100));
  svg::LinearScale s{0, 80, 350, 950};
  CHECK(s(40) == doctest::Approx(650));
}

TEST_CASE("memory chart: segments are proportional to bytes; the capacity and budget lines sit at their values") {
  MemoryBar a;
  a.label = "plan a";
  a.bytes[static_cast<size_t>(MemoryCategory::ShardedParams)] = 10 * kGiB;
  a.bytes[static_cast<size_t>(MemoryCategory::Activations)] = 30 * kGiB;
  a.group = "g";
  MemoryBar b = a;
  b.label = "plan b";
  b.bytes[static_cast<size_t>(MemoryCategory::OptimizerStates)] = 20 * kGiB;
  std::string svg = memory_chart_svg({a, b}, 80 * kGiB, 76 * kGiB);
  CHECK(balance_error(svg) == "");
  CHECK(count(svg, "<svg id=\"memory-chart\"") == 1);
  auto segs = rects_of_class(svg, "seg");
  REQUIRE(segs.size() == 5);  // 2 + 3 non-zero categories
  // Bar a: params 10 GiB then activations 30 GiB, side by side on one row.
  CHECK(segs[1].w == doctest::Approx(3 * segs[0].w).epsilon(0.01));
  CHECK(segs[1].x == doctest::Approx(segs[0].x + segs[0].w).epsilon(0.001));
  CHECK(segs[0].y == segs[1].y);
  CHECK(segs[2].y > segs[0].y);  // bar b on the next row
  double px_per_gib = segs[0].w / 10;
  // Optimizer states (20 GiB) drawn between params and activations in bar b.
  CHECK(segs[3].w == doctest::Approx(20 * px_per_gib).epsilon(0.01));
  CHECK(segs[0].fill != segs[1].fill);
  // Capacity at 80 GiB, budget at 76 GiB, measured from the bars' common origin.
  auto cap = line_x_of_class(svg, "capacity");
  auto bud = line_x_of_class(svg, "budget");
  REQUIRE(cap.size() == 1);
  REQUIRE(bud.size() == 1);
  CHECK(cap[0] == doctest::Approx(segs[0].x + 80 * px_per_gib).epsilon(0.002));
  CHECK(bud[0] == doctest::Approx(segs[0].x + 76 * px_per_gib).epsilon(0.002));
  CHECK(svg.find(">40.0 GiB<") != std::string::npos);
  CHECK(svg.find(">60.0 GiB<") != std::string::npos);
  // Only the categories in use are in the legend.
  CHECK(svg.find(">optimizer_states<") != std::string::npos);
  CHECK(svg.find(">nccl<") == std::string::npos);
}

TEST_CASE("memory chart: a plan far beyond the capacity is clipped at the axis with its total written out") {
  MemoryBar big;
  big.label = "ddp";
  big.feasible = false;
  big.bytes[static_cast<size_t>(MemoryCategory::ShardedParams)] = 500 * kGiB;
  big.bytes[static_cast<size_t>(MemoryCategory::OptimizerStates)] = 600 * kGiB;
  MemoryBar small;
  small.label = "fsdp";
  small.bytes[static_cast<size_t>(MemoryCategory::ShardedParams)] = 40 * kGiB;
  std::string svg = memory_chart_svg({small, big}, 80 * kGiB, 0);
  auto segs = rects_of_class(svg, "seg");
  REQUIRE(segs.size() == 2);              // the optimizer segment starts beyond the axis: not drawn
  double axis_px = segs[0].w / 40 * 160;  // the axis reaches 2 x 80 GiB
  CHECK(segs[1].x + segs[1].w == doctest::Approx(segs[0].x + axis_px).epsilon(0.002));
  CHECK(svg.find("1100 GiB \xe2\x96\xb8") != std::string::npos);
  CHECK(count(svg, "class=\"break\"") == 1);
  CHECK(svg.find("class=\"bar infeasible\"") != std::string::npos);
  CHECK(line_x_of_class(svg, "budget").empty());  // no search budget given
}

TEST_CASE("timeline: one slice per op with a duration, the same events as the Chrome trace") {
  const Fixture& f = fixture();
  std::string svg = timeline_svg(f.program, f.prediction, f.hw.usable_device_memory.value);
  CHECK(balance_error(svg) == "");
  auto ops = rects_of_class(svg, "op");
  nlohmann::json trace = chrome_trace(f.program, f.prediction);
  size_t timed = 0;
  double t_end = 0;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["dur"].get<double>() > 0) {
      ++timed;
      t_end = std::max(t_end, (e["ts"].get<double>() + e["dur"].get<double>()) / 1e6);
    }
  REQUIRE(timed > 50);
  CHECK(ops.size() == timed);
  // Every slice is visible, the lanes are the streams used, and the last op ends at the right edge.
  double right = 0, left = 1e9;
  std::set<double> lanes;
  for (const auto& r : ops) {
    CHECK(r.w >= 0.6);
    right = std::max(right, r.x + r.w);
    left = std::min(left, r.x);
    lanes.insert(r.y);
  }
  std::set<Stream> streams;
  for (size_t i = 0; i < f.program.ops.size(); ++i)
    if (f.prediction.time.ops[i].end > f.prediction.time.ops[i].start) streams.insert(f.program.ops[i].stream);
  CHECK(lanes.size() == streams.size());
  CHECK(count(svg, "class=\"lane\"") >= streams.size());
  double sim_end = 0;
  for (const OpTiming& t : f.prediction.time.ops) sim_end = std::max(sim_end, t.end);
  CHECK(t_end == doctest::Approx(sim_end));
  auto lane_rects = rects_of_class(svg, "lane");
  REQUIRE(!lane_rects.empty());
  CHECK(left == doctest::Approx(lane_rects[0].x).epsilon(0.001));
  CHECK(right == doctest::Approx(lane_rects[0].x + lane_rects[0].w).epsilon(0.001));
  // Memory over time: a non-empty area; micro-batch boundaries labelled.
  CHECK(svg.find("class=\"memory\"") != std::string::npos);
  CHECK(svg.find("peak allocated " + std::string(gib2(f.prediction.memory.peak_allocated)).substr(0, 3)) !=
        std::string::npos);
  std::set<int> mbs;
  for (const Op& op : f.program.ops)
    if (op.stream == Stream::Compute) mbs.insert(op.micro_batch);
  CHECK(count(svg, ">micro-batch ") == mbs.size());
}

TEST_CASE("scatter: every evaluated candidate is a point, infeasible ones grey, the chosen one marked once") {
  const Fixture& f = fixture();
  const Strategy& chosen = f.result.ranked.front().strategy;
  std::string svg = scatter_svg(f.result, &chosen, f.hw.usable_device_memory.value);
  CHECK(balance_error(svg) == "");
  size_t infeasible = 0, feasible = 0;
  for (const auto& c : f.result.evaluated_sample) (c.feasible ? feasible : infeasible)++;
  REQUIRE(feasible > 0);
  REQUIRE(infeasible > 0);
  CHECK(count(svg, "class=\"pt\"") == f.result.evaluated_sample.size());
  CHECK(count(svg, "fill=\"#b9b9b9\" class=\"pt\"") == infeasible);
  CHECK(count(svg, "class=\"chosen-mark\"") == 1);
  CHECK(count(svg, "class=\"capacity\"") == 1);
  CHECK(svg.find("does not fit") != std::string::npos);
  // The legend counts feasible/evaluated per family, matching the search.
  for (const auto& [name, v] : f.result.families) {
    size_t fe = 0, ev = 0;
    for (const auto& c : f.result.evaluated_sample)
      if (to_string(c.strategy.kind) == name) {
        ++ev;
        fe += c.feasible ? 1 : 0;
      }
    if (ev == 0) continue;
    CHECK(svg.find(">" + name + " (" + std::to_string(fe) + "/" + std::to_string(ev) + ")<") != std::string::npos);
  }
}

TEST_CASE("page: self-contained, balanced, every section present, numbers as in the prediction") {
  const Fixture& f = fixture();
  std::string page = render_html_report(f.input());
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(balance_error(page) == "");
  // Nothing is fetched: no scripts, no external references, and a policy that forbids them.
  CHECK(page.find("<script") == std::string::npos);
  CHECK(page.find("http://") == std::string::npos);
  CHECK(page.find("https://") == std::string::npos);
  CHECK(page.find("src=") == std::string::npos);
  CHECK(page.find("default-src 'none'") != std::string::npos);
  for (const char* id : {"chosen", "memory", "timeline", "tradeoff", "plans", "verdicts"})
    CHECK_MESSAGE(element(page, "section", id) != "", id);
  for (const char* id : {"memory-chart", "timeline-chart", "scatter-chart"}) {
    std::string svg = element(page, "svg", id);
    CHECK_MESSAGE(svg.size() > 1000, id);
  }
  const Prediction& p = f.prediction;
  const Prediction& searched = f.result.ranked.front().prediction;
  // The re-simulated plan is the searched one.
  CHECK(p.memory.device_total == doctest::Approx(searched.memory.device_total));
  CHECK(p.time.step_s == doctest::Approx(searched.time.step_s));
  std::string chosen = element(page, "section", "chosen");
  CHECK(chosen.find(">" + gib2(p.memory.device_total) + " GiB<") != std::string::npos);
  CHECK(chosen.find(">" + svg::grouped(p.tokens_per_s_per_gpu) + "<") != std::string::npos);
  CHECK(chosen.find(svg::escape(one_line_strategy(f.result.ranked.front().strategy))) != std::string::npos);
  std::string table = element(page, "table", "chosen-memory");
  double sum = 0;
  for (size_t i = 0; i < kNumMemoryCategories; ++i) {
    sum += p.memory.breakdown[i];
    if (p.memory.breakdown[i] > 0)
      CHECK(table.find(std::string(kMemoryCategoryNames[i]) + "</td><td class=\"n\">" + gib2(p.memory.breakdown[i]) +
                       "</td>") != std::string::npos);
  }
  // The categories add up to the device total, so the bars, the cards and the table agree.
  CHECK(sum == doctest::Approx(p.memory.device_total).epsilon(1e-9));
  // Memory chart: top plans then one bar per family with a best (or smallest) candidate.
  std::string mem = element(page, "svg", "memory-chart");
  // Plans and families the runtime runs identically under two names are one bar (report/identical_plans.hpp).
  size_t families_with_best = 0;
  const auto family_rows = merge_families(f.result.families);
  for (const FamilyRow& row : family_rows) families_with_best += row.verdict->best ? 1 : 0;
  size_t top = merge_identical(f.result.ranked, 5).size();
  CHECK(count(mem, "<g class=\"bar") == top + families_with_best);
  CHECK(count(mem, "<g class=\"bar chosen\"") >= 1);
  char total[32];
  std::snprintf(total, sizeof total, ">%.1f GiB<", p.memory.device_total / kGiB);
  CHECK(mem.find(total) != std::string::npos);
  // Verdicts: one row per family, with the reason for those that do not fit.
  std::string verdicts = element(page, "table", "families");
  CHECK(count(verdicts, "<tr>") == family_rows.size() + 1);
  for (const FamilyRow& row : family_rows)
    if (!row.verdict->feasible)
      CHECK(verdicts.find(svg::escape(family_line(row.name, *row.verdict))) != std::string::npos);
  // Top plans: the first row is the chosen one.
  std::string plans = element(page, "table", "top-plans");
  CHECK(count(plans, "<tr class=\"chosen\">") >= 1);
  CHECK(plans.find("<tr class=\"chosen\">") < plans.find("<tr><td class=\"n\">2</td>"));
}

TEST_CASE("page: text from outside the program is escaped") {
  const Fixture& f = fixture();
  ModelSpec evil = f.model;
  evil.name = "<script>alert(\"x\")</script> & 'q'";
  HtmlReportInput in = f.input();
  in.model = &evil;
  in.notes = {"plan file </p><img src=x onerror=alert(1)>.yaml"};
  in.objective = "\"><b>";
  std::string page = render_html_report(in);
  CHECK(balance_error(page) == "");
  CHECK(page.find("<script") == std::string::npos);
  CHECK(page.find("<img") == std::string::npos);
  CHECK(page.find("<b>\"") == std::string::npos);
  CHECK(page.find("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;q&#39;") != std::string::npos);
  CHECK(page.find("&lt;/p&gt;&lt;img src=x onerror=alert(1)&gt;.yaml") != std::string::npos);
  CHECK(count(page, "<title>") >= 2);  // the page's and the charts' tooltips
}

TEST_CASE("page: when no plan fits, the families' smallest plans are drawn and nothing else is claimed") {
  const Fixture& f = fixture();
  SearchRequest req;
  req.graph = &f.graph;
  req.hardware = &f.hw;
  req.runtime = &f.rt;
  req.cluster = f.cluster;
  req.global_batch_tokens = 4194304;
  req.pins.strategy = StrategyKind::Ddp;  // 7B with Adam replicated: about 112 GB of model states
  req.pins.offload = Offload::None;
  req.pins.tp = 1;  // replicas of the whole model (tensor parallelism would split them)
  req.pins.pp = 1;
  SearchResult r = search_plans(req);
  REQUIRE(r.ranked.empty());
  HtmlReportInput in = f.input();
  in.search = &r;
  in.chosen = nullptr;
  in.prediction = nullptr;
  in.program = nullptr;
  std::string page = render_html_report(in);
  CHECK(balance_error(page) == "");
  CHECK(page.find("id=\"no-plan\"") != std::string::npos);
  CHECK(element(page, "section", "timeline") == "");
  CHECK(element(page, "section", "plans") == "");
  std::string mem = element(page, "svg", "memory-chart");
  CHECK(count(mem, "<g class=\"bar infeasible\"") == 1);
  CHECK(count(element(page, "svg", "scatter-chart"), "class=\"chosen-mark\"") == 0);
  CHECK(element(page, "table", "families").find("does not fit") != std::string::npos);
}

TEST_CASE("page: a single plan (show) draws its bar, the recorded one and its timeline, no search views") {
  const Fixture& f = fixture();
  HtmlReportInput in = f.input();
  in.search = nullptr;
  in.objective.clear();
  in.recorded_label = "recorded in plan.yaml";
  for (size_t i = 0; i < kNumMemoryCategories; ++i)
    in.recorded_breakdown.emplace_back(std::string(kMemoryCategoryNames[i]), f.prediction.memory.breakdown[i]);
  std::string page = render_html_report(in);
  CHECK(balance_error(page) == "");
  std::string mem = element(page, "svg", "memory-chart");
  CHECK(count(mem, "<g class=\"bar") == 2);
  CHECK(mem.find("recorded in plan.yaml") != std::string::npos);
  auto segs = rects_of_class(mem, "seg");
  REQUIRE(segs.size() % 2 == 0);
  for (size_t i = 0; i < segs.size() / 2; ++i)  // the same numbers draw the same bar
    CHECK(segs[i].w == doctest::Approx(segs[i + segs.size() / 2].w));
  CHECK(element(page, "svg", "timeline-chart") != "");
  CHECK(element(page, "section", "tradeoff") == "");
  CHECK(element(page, "section", "verdicts") == "");
}

TEST_CASE("cli: fsdp-plan --html and fsdp-plan show plan.yaml --html write the page") {
  const std::string base = "/tmp/fsdp_html_test_" + std::to_string(::getpid());
  auto r = test::run_cli("--model llama2-7b --nodes 1 --out " + base + ".yaml --html " + base + ".html");
  CAPTURE(r.err);
  REQUIRE(r.code == 0);
  std::string page = test::slurp(base + ".html");
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(balance_error(page) == "");
  CHECK(element(page, "svg", "timeline-chart") != "");
  CHECK(r.out.find("wrote " + base + ".html") != std::string::npos);

  auto s = test::run_cli("show " + base + ".yaml --html " + base + "-show.html");
  CAPTURE(s.err);
  REQUIRE(s.code == 0);
  std::string shown = test::slurp(base + "-show.html");
  CHECK(balance_error(shown) == "");
  CHECK(element(shown, "svg", "memory-chart").find("recorded in " + base + ".yaml") != std::string::npos);
  CHECK(element(shown, "svg", "timeline-chart") != "");

  test::refusal("--model llama2-7b --nodes 1 --no-out --html /nonexistent-dir/x.html", {"--html"});
  for (const char* suffix : {".yaml", ".html", "-show.html"}) std::remove((base + suffix).c_str());
}

TEST_CASE("comparison page: a predicted and a measured bar per category, the error of each, text escaped") {
  Comparison c;
  c.memory.push_back({"sharded_params", "bytes", 10 * kGiB, 8 * kGiB, true});
  c.memory.push_back({"activations", "bytes", 20 * kGiB, 21 * kGiB, true});
  c.memory.push_back({"fragmentation", "bytes", 5 * kGiB, 0, false});
  c.memory.push_back({"peak allocated", "bytes", 35 * kGiB, 30 * kGiB, true});
  c.time.push_back({"step time (median)", "s", 1.5, 1.6, true});
  std::string svg = comparison_chart_svg(c);
  CHECK(balance_error(svg) == "");
  auto pred = rects_of_class(svg, "pred");
  auto meas = rects_of_class(svg, "meas");
  REQUIRE(pred.size() == 4);
  REQUIRE(meas.size() == 3);  // fragmentation was not measured
  const double px_per_gib = pred[0].w / 10;
  CHECK(pred[1].w == doctest::Approx(20 * px_per_gib).epsilon(0.01));
  CHECK(meas[0].w == doctest::Approx(8 * px_per_gib).epsilon(0.01));
  CHECK(meas[2].w == doctest::Approx(30 * px_per_gib).epsilon(0.01));
  CHECK(pred[0].fill == "#4a90d9");                // the category's colour, as in the plan report
  CHECK(svg.find("+25.0%") != std::string::npos);  // (10 - 8) / 8
  CHECK(svg.find("-4.8%") != std::string::npos);   // (20 - 21) / 21
  CHECK(svg.find("not measured") != std::string::npos);

  const Fixture& f = fixture();
  PlanFile plan;
  plan.model_name = "llama2-7b";
  plan.model = f.model;
  plan.cluster.hardware = "a100-80gb";
  plan.cluster.nodes = 1;
  plan.cluster.gpus_per_node = 8;
  plan.strategy = f.result.ranked.front().strategy;
  std::string page = render_comparison_html(plan, c, "runs/<plan>.yaml", "runs/a&b.json");
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(balance_error(page) == "");
  CHECK(page.find("default-src 'none'") != std::string::npos);
  CHECK(page.find("runs/&lt;plan&gt;.yaml") != std::string::npos);
  CHECK(page.find("runs/a&amp;b.json") != std::string::npos);
  CHECK(count(element(page, "table", "compare-memory-table"), "<tr>") == c.memory.size() + 1);
  CHECK(element(page, "table", "compare-time-table").find("-6.3%") != std::string::npos);  // (1.5 - 1.6) / 1.6
}

TEST_CASE("page: the network between nodes and the priced clock are named as in the text report") {
  const Fixture& f = fixture();
  HtmlReportInput in = f.input();
  // One node: no network line; a100-80gb prices its datasheet clock, so no clocks line either.
  std::string one = render_html_report(in);
  CHECK(one.find("id=\"network-line\"") == std::string::npos);
  CHECK(one.find("id=\"clocks-line\"") == std::string::npos);
  in.cluster = Cluster{4, 8};
  const std::string four = render_html_report(in);
  CHECK(four.find("<p id=\"network-line\"><b>network</b> 8 x 200 Gb/s InfiniBand per node (200 Gb/s per GPU)</p>") !=
        std::string::npos);
  const HardwareProfile capped = parse_hardware_text(
      "base: h100-80gb\nname: capped\ndevice:\n  sustained_clock: \"1464 MHz\"\n", "capped.yaml", kRoot);
  in.hardware = &capped;
  CHECK(render_html_report(in).find("<p id=\"clocks-line\"><b>clocks</b> sustained 1464 MHz of 1830 MHz boost (0.8 x "
                                    "tensor-core peak)</p>") != std::string::npos);
}
