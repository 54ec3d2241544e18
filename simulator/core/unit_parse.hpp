// Text -> quantity conversion, the one place unit suffixes are interpreted.
// Accepted forms (number, optional space, unit):
//   sizes:       B, KB, MB, GB, TB (decimal), KiB, MiB, GiB, TiB (binary)
//   bandwidths:  B/s, KB/s, MB/s, GB/s, TB/s, GiB/s, and bits: Gb/s, Mb/s, Tb/s
//   durations:   ns, us, ms, s
//   FLOP rates:  FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s
//   counts:      a bare number, or K, M, B (billion), T (trillion): decimal, as token counts are quoted ("15T")
// Each function returns std::nullopt when the text is not of its kind; the
// caller (config_map.cpp, the CLI) turns that into an InputError naming the key.
#pragma once

#include <optional>
#include <string_view>

#include "core/units.hpp"

namespace fsdp {

std::optional<Bytes> parse_bytes(std::string_view text);
std::optional<BytesPerSecond> parse_bandwidth(std::string_view text);
std::optional<Seconds> parse_duration(std::string_view text);
std::optional<FlopsPerSecond> parse_flops_rate(std::string_view text);
std::optional<double> parse_count(std::string_view text);

}  // namespace fsdp
