// The planner's reading of PyTorch's SDPA dispatch on CUDA. Every rule cites where it was read; "the source" is
// pytorch/pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp @ 001f694aef6f922b4fdf6d27d59162d27bf3df58
// unless another commit or pull request is named.
#include "compute/sdpa_dispatch.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/errors.hpp"

namespace fsdp {

namespace {

bool is_half(DType d) { return d == DType::Bf16 || d == DType::Fp16; }

// --- priority order ---
// The default order is flash, memory-efficient, math, cuDNN (aten/src/ATen/Context.h sdp_priority_order; the
// source's select_sdp_backend comment: "1. Flash Attention 2. Mem Efficient Attention 3. Math fallback"). Math is
// enabled by default, so cuDNN, after it, is never reached. priority_order moves cuDNN first when
// check_prefer_cudnn_attention() holds, and which releases do that changed:
//  - 2.5.0 put cuDNN first "on H100 w/ new enough CuDNN (we ship a 9.1 version in OSS)"; 2.5.1 made it opt-in
//    again, last in the order (pytorch/pytorch#138522, "[SDPA-CUDNN] Make CuDNN Attention Opt in", cherry-picked
//    onto release/2.5 after the 2.5 bugs; the 2.5 release blog: "enabled by default for all users of SDPA on H100
//    or newer GPUs"): compute capability 9.0 and newer.
//  - 2.9 put it first again on SM 9.0 and SM 10.0 (pytorch/pytorch#162073, "[cuDNN][SDPA] Enable cuDNN SDPA by
//    default for SM 9.0, SM 10.0", "for 2.9"; that version of check_prefer_cudnn_attention: major 9 or 10, minor 0,
//    built against cuDNN 9.9 or later).
//  - from 2.10 the source's check_prefer_cudnn_attention also asks the runtime cuDNN for more than 9.15.0
//    (`cudnn_version > 91500`, "cuDNN 9.15.1 required for seq_len not divisible by 128 fix", pytorch/pytorch#169849)
//    on major 9 or 10 with minor 0 or 3 (huggingface/transformers#48163, closing comment: that code "is already in
//    2.10. What changes at 2.11 is the bundled cuDNN crossing the threshold").
// A version not stated prefers nothing it cannot check, and says so in the notes.
bool cudnn_first(const SdpaInputs& in, std::vector<std::string>& notes, std::string& why) {
  const ComputeCapability& cc = in.cc;
  // No release of the list above moves cuDNN first below compute capability 9.0: the version does not matter there.
  if (cc.major < 9) return false;
  if (!in.torch) {
    notes.push_back("torch version not stated: the default order (flash, memory-efficient, math) assumed");
    return false;
  }
  const TorchVersion& t = *in.torch;
  const std::string tv = "torch " + to_string(t);
  if (t.major == 2 && t.minor == 5) {
    if (!t.patch_known)
      notes.push_back(tv + " without a patch release: 2.5.1 or later assumed (cuDNN opt-in, pytorch#138522)");
    if (t.patch_known && t.patch == 0 && cc.major >= 9) {
      why = "cuDNN first on sm " + to_string(cc) + ": torch 2.5.0";
      return true;
    }
    return false;
  }
  if (t.major == 2 && t.minor == 9) {
    if (!((cc.major == 9 || cc.major == 10) && cc.minor == 0)) return false;
    if (!in.cudnn) {
      notes.push_back(tv + ": cuDNN version not stated, its priority (built against cuDNN >= 9.9) not assumed");
      return false;
    }
    if (*in.cudnn < 90900) return false;
    why = "cuDNN first on sm " + to_string(cc) + ": " + tv;
    return true;
  }
  if (t.at_least(2, 10)) {
    if (!((cc.major == 9 || cc.major == 10) && (cc.minor == 0 || cc.minor == 3))) return false;
    if (!in.cudnn) {
      notes.push_back(tv + ": cuDNN version not stated, its priority (needs cuDNN > 9.15.0) not assumed");
      return false;
    }
    if (*in.cudnn <= 91500) return false;
    why = "cuDNN first on sm " + to_string(cc) + ": " + tv + ", cuDNN > 9.15.0";
    return true;
  }
  return false;
}

// --- can_use_flash_attention (the source) ---
// Returns "" when flash runs, else the first constraint that fails.
std::string flash_refusal(const SdpaInputs& in) {
  const ComputeCapability& cc = in.cc;
  // check_flash_attention_hardware_support: "Flash attention only supports gpu architectures in the range [sm80,
  // sm121]".
  if (!(cc.at_least(8, 0) && cc.at_most(12, 1))) return "sm " + to_string(cc) + " outside flash's [8.0, 12.1]";
  // check_for_attn_mask: flash takes no attn_mask.
  if (in.arbitrary_mask) return "an attention mask (flash takes none)";
  // check_head_dim_size_flash: q, k, v share their last dimension, at most 256 ("less than or equal to 256"). A
  // dense input need not be a multiple of 8: the flash path pads it (pytorch/pytorch
  // aten/src/ATen/native/transformers/attention.cpp @ bc8cb28010a6b27e1817d38e1c1e0ac59b34477e,
  // pad_last_dim<8, false>); only nested inputs are refused for it (check_head_dim_size_flash_nested).
  if (in.head_dim_qk != in.head_dim_v) return "q/k head dim differs from v's (flash needs one head dim)";
  if (in.head_dim_qk > 256) return "head dim " + std::to_string(in.head_dim_qk) + " > 256";
  // check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120: training on sm 8.6-8.9 and 12.0-12.1
  // supports head dim <= 192, or > 224 without dropout.
  const bool small_smem = (cc.at_least(8, 6) && cc.at_most(8, 9)) || (cc.at_least(12, 0) && cc.at_most(12, 1));
  if (in.requires_grad && small_smem) {
    const bool ok = in.head_dim_qk <= 192 || (in.dropout_p == 0 && in.head_dim_qk > 224);
    if (!ok) return "training with head dim " + std::to_string(in.head_dim_qk) + " on sm " + to_string(cc);
  }
  // check_dtypes_flash_attention (check_dtypes_low_precision on sm80+): fp16 and bf16.
  if (!is_half(in.dtype)) return std::string(to_string(in.dtype)) + " (flash needs fp16/bf16)";
  // check_flash_causal_non_square_seqlens: is_causal needs seq_q == seq_k, which a training step has.
  return "";
}

// --- can_use_mem_efficient_attention (the source) ---
std::string efficient_refusal(const SdpaInputs& in) {
  const ComputeCapability& cc = in.cc;
  // check_mem_efficient_hardware_support: [sm50, sm121].
  if (!(cc.at_least(5, 0) && cc.at_most(12, 1)))
    return "sm " + to_string(cc) + " outside memory-efficient's [5.0, 12.1]";
  // check_head_dim_size_mem_efficient: q and k share their last dimension, and q's and v's are multiples of
  // minimum_gemm_alignment: tensor cores on sm80+ (and on sm7x for fp16/bf16) give 128 bits / element bits (8 for
  // fp16/bf16, 4 for fp32), sm80+ at least 4; otherwise 1. No upper bound on CUDA.
  const bool half = is_half(in.dtype);
  const bool tensor_cores = cc.major >= 8 || (cc.major >= 7 && half);
  int64_t align = cc.major >= 8 ? 4 : 1;
  if (tensor_cores) align = std::max<int64_t>(align, half ? 8 : 4);
  if (in.head_dim_qk % align != 0 || in.head_dim_v % align != 0)
    return "head dim not a multiple of " + std::to_string(align);
  // The dtypes: fp16, fp32 and bf16 on sm80+; fp16 and fp32 below.
  if (in.dtype == DType::Bf16 && cc.major < 8) return "bf16 on sm " + to_string(cc) + " (needs sm80+)";
  // check_data_ptr_alignment_mem_efficient: the views of q, k and v a projection yields start at aligned offsets.
  return "";
}

// --- can_use_cudnn_attention (the source) ---
std::string cudnn_refusal(const SdpaInputs& in) {
  const ComputeCapability& cc = in.cc;
  // "cuDNN version too old to use cuDNN Attention (< v9.0.0)".
  if (in.cudnn && *in.cudnn < 90000) return "cuDNN older than 9.0";
  // Dropout is refused on cuDNN 9.11 - 9.13 (cudnn_version > 91100 && < 91400).
  if (in.dropout_p > 0 && in.cudnn && *in.cudnn > 91100 && *in.cudnn < 91400) return "dropout on cuDNN 9.11-9.13";
  // check_dtypes_low_precision: fp16 and bf16 on sm80+.
  if (!is_half(in.dtype)) return std::string(to_string(in.dtype)) + " (cuDNN attention needs fp16/bf16)";
  // check_cudnn_hardware_support: [sm80, sm121].
  if (!(cc.at_least(8, 0) && cc.at_most(12, 1))) return "sm " + to_string(cc) + " outside cuDNN's [8.0, 12.1]";
  // check_cudnn_dropout: "cuDNN dropout probability resolution is limited to 1/16".
  if (in.dropout_p * 16.0 != std::floor(in.dropout_p * 16.0)) return "dropout not a multiple of 1/16";
  // check_cudnn_tensor_shapes: head dims at most 128; 256 on sm 9.0 / 10.x with cuDNN > 9.22 (and a cuDNN frontend
  // of 1.24 or later, kMinCuDNNFrontendVersionForD256, assumed with it), except sm 10.7 up to cuDNN 9.25; 192/128
  // (q/k 192, v 128) there from cuDNN 9.11; both multiples of 8.
  const bool sm90_10x = (cc.major == 9 && cc.minor == 0) || cc.major == 10;
  const bool sm107_old = cc.major == 10 && cc.minor == 7 && in.cudnn && *in.cudnn <= 92500;
  const bool d256 = sm90_10x && !sm107_old && in.cudnn && *in.cudnn > 92200;
  int64_t limit = 128;
  if (d256)
    limit = 256;
  else if (sm90_10x && in.cudnn && *in.cudnn >= 91100 && in.head_dim_qk == 192 && in.head_dim_v == 128)
    limit = 192;
  if (in.head_dim_qk > limit || in.head_dim_v > limit) return "head dim above cuDNN's " + std::to_string(limit);
  if (in.head_dim_qk % 8 != 0 || in.head_dim_v % 8 != 0) return "head dim not a multiple of 8";
  // check_cudnn_d256_bprop_head_dim: where d256 is supported, the backward takes (<=128, <=128), (192, 128) or
  // (256, 256).
  if (d256 && in.requires_grad) {
    const bool ok = (in.head_dim_qk <= 128 && in.head_dim_v <= 128) ||
                    (in.head_dim_qk == 192 && in.head_dim_v == 128) || (in.head_dim_qk == 256 && in.head_dim_v == 256);
    if (!ok) return "no cuDNN backward for these head dims";
  }
  // check_cudnn_layout: q, k, v as (batch, heads, seq, dim) views of (batch, seq, heads, dim) projections (Hugging
  // Face's transpose(1, 2)) have the unpacked layout it accepts; check_cudnn_deterministic: deterministic
  // algorithms are off by default.
  return "";
}

}  // namespace

const char* to_string(SdpaKernel k) {
  switch (k) {
    case SdpaKernel::Flash:
      return "flash";
    case SdpaKernel::MemoryEfficient:
      return "memory-efficient";
    case SdpaKernel::Cudnn:
      return "cudnn";
    case SdpaKernel::Math:
      return "math";
  }
  return "?";
}

SdpaChoice select_sdpa_kernel(const SdpaInputs& in) {
  FSDP_ASSERT(in.cc.known(), "select_sdpa_kernel needs the device's compute capability");
  FSDP_ASSERT(in.head_dim_qk > 0 && in.head_dim_v > 0, "select_sdpa_kernel needs the head dims");
  SdpaChoice c;
  std::string first_why;
  const bool prefer_cudnn = cudnn_first(in, c.notes, first_why);
  std::string refused;  // why each backend tried before the chosen one was refused
  auto refuse = [&](const char* name, const std::string& why) {
    refused += (refused.empty() ? "" : "; ") + std::string(name) + " refused: " + why;
  };
  if (prefer_cudnn) {
    const std::string r = cudnn_refusal(in);
    if (r.empty()) {
      c.kernel = SdpaKernel::Cudnn;
      c.reason = first_why;
      return c;
    }
    refuse("cudnn", r);
  }
  if (const std::string r = flash_refusal(in); r.empty()) {
    c.kernel = SdpaKernel::Flash;
    c.reason = refused.empty() ? "flash first in the order and eligible" : refused;
    return c;
  } else {
    refuse("flash", r);
  }
  if (const std::string r = efficient_refusal(in); r.empty()) {
    c.kernel = SdpaKernel::MemoryEfficient;
    c.reason = refused;
    return c;
  } else {
    refuse("memory-efficient", r);
  }
  // Math is enabled by default and takes anything (select_sdp_backend: `case SDPBackend::math`).
  c.kernel = SdpaKernel::Math;
  c.reason = refused;
  return c;
}

std::string describe(const SdpaChoice& c, DType dtype) {
  std::string s = std::string("sdpa -> ") + to_string(c.kernel);
  if (c.kernel == SdpaKernel::Flash) return s;
  if (c.kernel == SdpaKernel::Cudnn) return s + " (" + c.reason + ")";
  // The first refusal names what sent it past flash; the dtype alone when that is the reason.
  const std::string dt = to_string(dtype);
  const size_t flash_at = c.reason.find("flash refused: ");
  std::string why = flash_at == std::string::npos ? c.reason : c.reason.substr(flash_at + 15);
  const size_t end = why.find(';');
  if (end != std::string::npos) why = why.substr(0, end);
  if (why.rfind(dt + " (", 0) == 0) why = dt;
  return s + " (" + why + ")";
}

}  // namespace fsdp
