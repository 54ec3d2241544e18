// Small helpers to build inline SVG (and the HTML around it) as text: escaping, number formatting,
// axis ticks and scales, and an element builder. No dependencies; every string that comes from
// outside the program (model names, labels) goes through escape().
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fsdp::svg {

// Escapes text for HTML/XML content and double- or single-quoted attribute values: & < > " ' become
// entities; control characters other than tab and newline are dropped (they are not allowed in XML).
std::string escape(std::string_view s);

// Coordinates: fixed 2 decimals with trailing zeros removed ("12.5", "3", "-0.25").
std::string num(double v);
// Readable numbers: with a given count of decimals and thousands separators ("1,234.5").
std::string grouped(double v, int decimals = 0);

// "Nice" tick values (1, 2, 5 x 10^k steps) covering [lo, hi] with about `target` intervals.
std::vector<double> nice_ticks(double lo, double hi, int target);
// The smallest nice tick >= hi (the top of an axis starting at 0).
double nice_ceil(double hi, int target);
// Ticks at 1, 2, 3, 5 x 10^k within [lo, hi] (lo > 0) for a logarithmic axis.
std::vector<double> log_ticks(double lo, double hi);

struct LinearScale {
  double d0 = 0, d1 = 1;  // domain
  double r0 = 0, r1 = 1;  // range (pixels)
  double operator()(double v) const { return d1 == d0 ? r0 : r0 + (v - d0) / (d1 - d0) * (r1 - r0); }
};

struct LogScale {
  double d0 = 1, d1 = 10;  // domain, both > 0
  double r0 = 0, r1 = 1;
  double operator()(double v) const;
};

// Approximate rendered width of text in the report's sans-serif font (for layout only).
double text_width(std::string_view s, double font_px);

// Builds one <svg> element. Attribute values that are not numbers are escaped.
class Svg {
 public:
  Svg(double width, double height, std::string_view id, std::string_view label);
  // A rectangle; `tooltip` (if non-empty) becomes a <title> child, shown on hover.
  void rect(double x, double y, double w, double h, std::string_view fill, std::string_view tooltip = {},
            std::string_view cls = {});
  void line(double x1, double y1, double x2, double y2, std::string_view stroke, double width = 1,
            std::string_view dash = {}, std::string_view cls = {});
  // anchor: start, middle or end; cls: a CSS class of the report's stylesheet.
  void text(double x, double y, std::string_view s, std::string_view anchor = "start", std::string_view cls = {});
  // Text rotated 90 degrees counter-clockwise around (x, y), centred there (a vertical axis title).
  void vertical_text(double x, double y, std::string_view s, std::string_view cls = {});
  void circle(double cx, double cy, double r, std::string_view fill, std::string_view stroke,
              std::string_view tooltip = {}, std::string_view cls = {});
  void path(std::string_view d, std::string_view fill, std::string_view stroke, double width = 1,
            std::string_view cls = {});
  void open_group(std::string_view cls, std::string_view tooltip = {});
  void close_group();
  // Closes the element and returns the markup.
  std::string finish();

 private:
  std::string out_;
  int open_groups_ = 0;
};

}  // namespace fsdp::svg
