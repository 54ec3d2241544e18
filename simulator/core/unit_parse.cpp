#include "core/unit_parse.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <string>
#include <utility>

namespace fsdp {
namespace {

struct Split {
  double number;
  std::string_view unit;
};

std::optional<Split> split_number_unit(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || !std::isfinite(v)) return std::nullopt;
  std::string_view unit(ptr, static_cast<size_t>(text.data() + text.size() - ptr));
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  if (unit.empty()) return std::nullopt;  // a bare number has no unit: refuse it
  return Split{v, unit};
}

template <size_t N>
std::optional<double> scale(std::string_view text, const std::array<std::pair<std::string_view, double>, N>& table) {
  auto s = split_number_unit(text);
  if (!s) return std::nullopt;
  for (const auto& [name, factor] : table)
    if (s->unit == name) return s->number * factor;
  return std::nullopt;
}

}  // namespace

std::optional<Bytes> parse_bytes(std::string_view text) {
  static constexpr std::array<std::pair<std::string_view, double>, 9> kTable{{
      {"B", 1.0},
      {"KB", kKB},
      {"MB", kMB},
      {"GB", kGB},
      {"TB", kGB * kKB},
      {"KiB", kKiB},
      {"MiB", kMiB},
      {"GiB", kGiB},
      {"TiB", kGiB * kKiB},
  }};
  auto v = scale(text, kTable);
  if (!v) return std::nullopt;
  return Bytes(*v);
}

std::optional<BytesPerSecond> parse_bandwidth(std::string_view text) {
  constexpr double kBitsPerByte = 8.0;
  static constexpr std::array<std::pair<std::string_view, double>, 10> kTable{{
      {"B/s", 1.0},
      {"KB/s", kKB},
      {"MB/s", kMB},
      {"GB/s", kGB},
      {"TB/s", kGB * kKB},
      {"GiB/s", kGiB},
      {"Mb/s", kMB / kBitsPerByte},
      {"Gb/s", kGB / kBitsPerByte},
      {"Tb/s", kGB * kKB / kBitsPerByte},
      {"MiB/s", kMiB},
  }};
  auto v = scale(text, kTable);
  if (!v) return std::nullopt;
  return BytesPerSecond(*v);
}

std::optional<Seconds> parse_duration(std::string_view text) {
  static constexpr std::array<std::pair<std::string_view, double>, 4> kTable{{
      {"ns", kNano},
      {"us", kMicro},
      {"ms", 1e-3},
      {"s", 1.0},
  }};
  auto v = scale(text, kTable);
  if (!v) return std::nullopt;
  return Seconds(*v);
}

std::optional<FlopsPerSecond> parse_flops_rate(std::string_view text) {
  static constexpr std::array<std::pair<std::string_view, double>, 4> kTable{{
      {"FLOP/s", 1.0},
      {"GFLOP/s", kGB},
      {"TFLOP/s", kTera},
      {"PFLOP/s", kTera * kKB},
  }};
  auto v = scale(text, kTable);
  if (!v) return std::nullopt;
  return FlopsPerSecond(*v);
}

std::optional<double> parse_count(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  double bare = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), bare);
  if (ec == std::errc() && ptr == text.data() + text.size() && std::isfinite(bare)) return bare;
  static constexpr std::array<std::pair<std::string_view, double>, 4> kTable{{
      {"K", kKB},
      {"M", kMB},
      {"B", kGB},
      {"T", kTera},
  }};
  return scale(text, kTable);
}

}  // namespace fsdp
