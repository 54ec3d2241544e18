#include "report/svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/errors.hpp"

namespace fsdp::svg {

std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') break;  // not allowed in XML
        if (c == 0x7f) break;
        out += c;
    }
  }
  return out;
}

std::string num(double v) {
  if (!std::isfinite(v)) v = 0;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

std::string grouped(double v, int decimals) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", std::max(0, decimals), std::fabs(v));
  std::string s = buf;
  size_t dot = s.find('.');
  std::string int_part = s.substr(0, dot);
  std::string frac = dot == std::string::npos ? "" : s.substr(dot);
  std::string g;
  for (size_t i = 0; i < int_part.size(); ++i) {
    if (i > 0 && (int_part.size() - i) % 3 == 0) g += ',';
    g += int_part[i];
  }
  bool negative = v < 0 && s.find_first_not_of("0.") != std::string::npos;
  return (negative ? "-" : "") + g + frac;
}

namespace {

double nice_step(double span, int target) {
  FSDP_ASSERT(target > 0, "tick target must be positive");
  if (!(span > 0) || !std::isfinite(span)) return 1;
  double raw = span / target;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double f = raw / mag;
  double nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return nice * mag;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> t;
  if (!(hi > lo)) return {lo};
  double step = nice_step(hi - lo, target);
  double first = std::ceil(lo / step - 1e-9) * step;
  for (double v = first; v <= hi + step * 1e-9; v += step) t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}

double nice_ceil(double hi, int target) {
  if (!(hi > 0)) return 1;
  double step = nice_step(hi, target);
  return std::ceil(hi / step - 1e-9) * step;
}

std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;
  if (!(lo > 0) || !(hi > lo)) return t;
  for (double mag = std::pow(10.0, std::floor(std::log10(lo))); mag <= hi; mag *= 10)
    for (double m : {1.0, 2.0, 3.0, 5.0}) {
      double v = m * mag;
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
    }
  return t;
}

double LogScale::operator()(double v) const {
  double lv = std::log(std::max(v, 1e-300));
  double l0 = std::log(d0), l1 = std::log(d1);
  return l1 == l0 ? r0 : r0 + (lv - l0) / (l1 - l0) * (r1 - r0);
}

double text_width(std::string_view s, double font_px) {
  // Average advance of a proportional sans-serif face: about 0.55 em per character (UTF-8 continuation
  // bytes do not advance).
  double chars = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) chars += 1;
  return chars * font_px * 0.55;
}

Svg::Svg(double width, double height, std::string_view id, std::string_view label) {
  out_ = "<svg id=\"" + escape(id) + "\" class=\"chart\" width=\"" + num(width) + "\" height=\"" + num(height) +
         "\" viewBox=\"0 0 " + num(width) + " " + num(height) + "\" role=\"img\" aria-label=\"" + escape(label) +
         "\">\n";
}

namespace {

std::string cls_attr(std::string_view cls) { return cls.empty() ? "" : " class=\"" + escape(cls) + "\""; }

}  // namespace

void Svg::rect(double x, double y, double w, double h, std::string_view fill, std::string_view tooltip,
               std::string_view cls) {
  out_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(0.0, w)) + "\" height=\"" +
          num(std::max(0.0, h)) + "\" fill=\"" + escape(fill) + "\"" + cls_attr(cls);
  if (tooltip.empty()) {
    out_ += "/>\n";
  } else {
    out_ += "><title>" + escape(tooltip) + "</title></rect>\n";
  }
}

void Svg::line(double x1, double y1, double x2, double y2, std::string_view stroke, double width, std::string_view dash,
               std::string_view cls) {
  out_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) +
          "\" stroke=\"" + escape(stroke) + "\" stroke-width=\"" + num(width) + "\"";
  if (!dash.empty()) out_ += " stroke-dasharray=\"" + escape(dash) + "\"";
  out_ += cls_attr(cls) + "/>\n";
}

void Svg::text(double x, double y, std::string_view s, std::string_view anchor, std::string_view cls) {
  out_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"";
  if (anchor != "start") out_ += " text-anchor=\"" + escape(anchor) + "\"";
  out_ += cls_attr(cls) + ">" + escape(s) + "</text>\n";
}

void Svg::vertical_text(double x, double y, std::string_view s, std::string_view cls) {
  out_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"middle\" transform=\"rotate(-90 " + num(x) +
          " " + num(y) + ")\"" + cls_attr(cls) + ">" + escape(s) + "</text>\n";
}

void Svg::circle(double cx, double cy, double r, std::string_view fill, std::string_view stroke,
                 std::string_view tooltip, std::string_view cls) {
  out_ += "<circle cx=\"" + num(cx) + "\" cy=\"" + num(cy) + "\" r=\"" + num(r) + "\" fill=\"" + escape(fill) + "\"";
  if (!stroke.empty()) out_ += " stroke=\"" + escape(stroke) + "\"";
  out_ += cls_attr(cls);
  if (tooltip.empty()) {
    out_ += "/>\n";
  } else {
    out_ += "><title>" + escape(tooltip) + "</title></circle>\n";
  }
}

void Svg::path(std::string_view d, std::string_view fill, std::string_view stroke, double width, std::string_view cls) {
  out_ += "<path d=\"" + escape(d) + "\" fill=\"" + escape(fill) + "\" stroke=\"" + escape(stroke) +
          "\" stroke-width=\"" + num(width) + "\"" + cls_attr(cls) + "/>\n";
}

void Svg::open_group(std::string_view cls, std::string_view tooltip) {
  out_ += "<g" + cls_attr(cls) + ">";
  if (!tooltip.empty()) out_ += "<title>" + escape(tooltip) + "</title>";
  out_ += "\n";
  ++open_groups_;
}

void Svg::close_group() {
  FSDP_ASSERT(open_groups_ > 0, "close_group without open_group");
  out_ += "</g>\n";
  --open_groups_;
}

std::string Svg::finish() {
  while (open_groups_ > 0) close_group();
  out_ += "</svg>\n";
  return std::move(out_);
}

}  // namespace fsdp::svg
