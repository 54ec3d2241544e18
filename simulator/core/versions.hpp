// Versions and device generations, as configuration files write them: a CUDA device's compute capability (hardware
// profiles), the torch and cuDNN releases a runtime runs (runtime profiles, published rows). Strict parsers: a form
// they do not know is nullopt, for the loader to refuse with its file and key. Used by PyTorch's SDPA dispatch
// (compute/sdpa_dispatch.hpp).
#pragma once

#include <optional>
#include <string>

namespace fsdp {

// A CUDA device's compute capability (cudaDeviceProp major.minor; `device.compute_capability: "9.0"`).
struct ComputeCapability {
  int major = 0;
  int minor = 0;
  bool known() const { return major > 0; }
  bool at_least(int ma, int mi) const { return major > ma || (major == ma && minor >= mi); }
  bool at_most(int ma, int mi) const { return major < ma || (major == ma && minor <= mi); }
};

// "8.0", "9.0", "12.1": one or two digits, a dot, one digit (the form NVIDIA's CUDA GPUs page lists). nullopt for
// anything else ("9", "9.0.0", " 9.0", "sm90").
std::optional<ComputeCapability> parse_compute_capability(const std::string& text);
std::string to_string(const ComputeCapability& cc);  // "9.0"

// A torch release, major.minor.patch; `patch_known` is false for "2.5" (a release line, not a release).
struct TorchVersion {
  int major = 0, minor = 0, patch = 0;
  bool patch_known = true;
  bool at_least(int ma, int mi) const { return major > ma || (major == ma && minor >= mi); }
};
// Strict: "2.11", "2.11.0" (runtime profiles). nullopt otherwise.
std::optional<TorchVersion> parse_torch_version(const std::string& text);
// Lenient, for versions quoted by publications: the leading major.minor[.patch] of "2.8.0a0+5228986c39" or
// "2.4.0.dev20240427+cu121"; nullopt where none leads ("nightly", "").
std::optional<TorchVersion> parse_torch_version_prefix(const std::string& text);
std::string to_string(const TorchVersion& v);

// cuDNN's runtime version as cudnnGetVersion() reports it from 9.0 on: major*10000 + minor*100 + patch (the form
// sdp_utils.cpp compares, e.g. `cudnn_version > 91500`). "9.19" -> 91900, "9.15.1" -> 91501; nullopt otherwise.
std::optional<int> parse_cudnn_version(const std::string& text);

}  // namespace fsdp
