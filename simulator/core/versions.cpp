#include "core/versions.hpp"

#include <cctype>
#include <charconv>
#include <system_error>

namespace fsdp {

namespace {

// Reads a non-negative decimal integer of at most `max_digits` digits at text[pos], advancing pos.
std::optional<int> read_number(const std::string& text, size_t& pos, size_t max_digits) {
  size_t end = pos;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end])) && end - pos < max_digits + 1) ++end;
  if (end == pos || end - pos > max_digits) return std::nullopt;
  int v = 0;
  auto [ptr, ec] = std::from_chars(text.data() + pos, text.data() + end, v);
  if (ec != std::errc() || ptr != text.data() + end) return std::nullopt;
  pos = end;
  return v;
}

// A release "M.m" or "M.m.p" (each part at most two digits, M > 0). `whole`: nothing may follow; otherwise what
// follows is ignored, a ".p" read where digits lead it ("2.8.0a0+5228986c39": 2.8.0).
struct Release {
  int major = 0, minor = 0;
  std::optional<int> patch;
};
std::optional<Release> read_release(const std::string& text, bool whole) {
  size_t pos = 0;
  const std::optional<int> ma = read_number(text, pos, 2);
  if (!ma || *ma == 0 || pos >= text.size() || text[pos] != '.') return std::nullopt;
  ++pos;
  const std::optional<int> mi = read_number(text, pos, 2);
  if (!mi) return std::nullopt;
  Release r{*ma, *mi, std::nullopt};
  if (pos >= text.size()) return r;
  if (!whole) {
    size_t at = pos + 1;
    if (text[pos] == '.') r.patch = read_number(text, at, 2);
    return r;
  }
  if (text[pos] != '.') return std::nullopt;
  ++pos;
  r.patch = read_number(text, pos, 2);
  if (!r.patch || pos != text.size()) return std::nullopt;
  return r;
}

}  // namespace

std::optional<ComputeCapability> parse_compute_capability(const std::string& text) {
  size_t pos = 0;
  if (text.empty() || text[0] == '0') return std::nullopt;  // "08.0": no leading zero
  const std::optional<int> major = read_number(text, pos, 2);
  if (!major || *major == 0 || pos >= text.size() || text[pos] != '.') return std::nullopt;
  ++pos;
  const std::optional<int> minor = read_number(text, pos, 1);
  if (!minor || pos != text.size()) return std::nullopt;
  return ComputeCapability{*major, *minor};
}

std::string to_string(const ComputeCapability& cc) { return std::to_string(cc.major) + "." + std::to_string(cc.minor); }

std::optional<TorchVersion> parse_torch_version(const std::string& text) {
  const std::optional<Release> r = read_release(text, true);
  if (!r) return std::nullopt;
  return TorchVersion{r->major, r->minor, r->patch.value_or(0), r->patch.has_value()};
}

std::optional<TorchVersion> parse_torch_version_prefix(const std::string& text) {
  const std::optional<Release> r = read_release(text, false);
  if (!r) return std::nullopt;
  return TorchVersion{r->major, r->minor, r->patch.value_or(0), r->patch.has_value()};
}

std::string to_string(const TorchVersion& v) {
  std::string s = std::to_string(v.major) + "." + std::to_string(v.minor);
  if (v.patch_known) s += "." + std::to_string(v.patch);
  return s;
}

std::optional<int> parse_cudnn_version(const std::string& text) {
  const std::optional<Release> r = read_release(text, true);
  if (!r) return std::nullopt;
  const int ma = r->major, mi = r->minor, patch = r->patch.value_or(0);
  // cuDNN 9's CUDNN_VERSION: CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL (cudnn_version.h); the
  // source compares against that form (8903 for 8.9.3 is cuDNN 8's *1000 + *100 form, below any 9.x).
  if (ma < 9) return ma * 1000 + mi * 100 + patch;
  return ma * 10000 + mi * 100 + patch;
}

}  // namespace fsdp
