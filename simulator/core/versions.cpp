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
  size_t pos = 0;
  TorchVersion v;
  const std::optional<int> ma = read_number(text, pos, 2);
  if (!ma || pos >= text.size() || text[pos] != '.') return std::nullopt;
  ++pos;
  const std::optional<int> mi = read_number(text, pos, 2);
  if (!mi) return std::nullopt;
  v.major = *ma;
  v.minor = *mi;
  v.patch_known = false;
  if (pos < text.size()) {
    if (text[pos] != '.') return std::nullopt;
    ++pos;
    const std::optional<int> pa = read_number(text, pos, 2);
    if (!pa || pos != text.size()) return std::nullopt;
    v.patch = *pa;
    v.patch_known = true;
  }
  if (v.major == 0) return std::nullopt;
  return v;
}

std::optional<TorchVersion> parse_torch_version_prefix(const std::string& text) {
  size_t pos = 0;
  const std::optional<int> ma = read_number(text, pos, 2);
  if (!ma || *ma == 0 || pos >= text.size() || text[pos] != '.') return std::nullopt;
  ++pos;
  const std::optional<int> mi = read_number(text, pos, 2);
  if (!mi) return std::nullopt;
  TorchVersion v{*ma, *mi, 0, false};
  if (pos < text.size() && text[pos] == '.') {
    size_t p2 = pos + 1;
    if (const std::optional<int> pa = read_number(text, p2, 2)) {
      v.patch = *pa;
      v.patch_known = true;
    }
  }
  return v;
}

std::string to_string(const TorchVersion& v) {
  std::string s = std::to_string(v.major) + "." + std::to_string(v.minor);
  if (v.patch_known) s += "." + std::to_string(v.patch);
  return s;
}

std::optional<int> parse_cudnn_version(const std::string& text) {
  size_t pos = 0;
  const std::optional<int> ma = read_number(text, pos, 2);
  if (!ma || *ma == 0 || pos >= text.size() || text[pos] != '.') return std::nullopt;
  ++pos;
  const std::optional<int> mi = read_number(text, pos, 2);
  if (!mi) return std::nullopt;
  int patch = 0;
  if (pos < text.size()) {
    if (text[pos] != '.') return std::nullopt;
    ++pos;
    const std::optional<int> pa = read_number(text, pos, 2);
    if (!pa || pos != text.size()) return std::nullopt;
    patch = *pa;
  }
  // cuDNN 9's CUDNN_VERSION: CUDNN_MAJOR * 10000 + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL (cudnn_version.h); the
  // source compares against that form (8903 for 8.9.3 is cuDNN 8's *1000 + *100 form, below any 9.x).
  if (*ma < 9) return *ma * 1000 + *mi * 100 + patch;
  return *ma * 10000 + *mi * 100 + patch;
}

}  // namespace fsdp
