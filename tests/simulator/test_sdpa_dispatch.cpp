// attention sdpa: the kernel PyTorch's SDPA dispatch chooses (simulator/compute/sdpa_dispatch.hpp, read from
// pytorch/pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp @ 001f694aef6f922b4fdf6d27d59162d27bf3df58),
// the memory each kernel keeps, its time against the flash curves, and the profile keys it reads.
#include <doctest/doctest.h>

#include "compute/compute_cost.hpp"
#include "compute/sdpa_dispatch.hpp"
#include "compute/unfused_attention.hpp"
#include "core/errors.hpp"
#include "hardware/hardware_profile.hpp"
#include "sim_fixtures.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

SdpaInputs inputs(DType dt, int64_t head_dim, const char* cc) {
  SdpaInputs in;
  in.dtype = dt;
  in.head_dim_qk = in.head_dim_v = head_dim;
  in.cc = *parse_compute_capability(cc);
  in.torch = parse_torch_version("2.8.0");
  return in;
}

SdpaKernel kernel(const SdpaInputs& in) { return select_sdpa_kernel(in).kernel; }

}  // namespace

TEST_CASE("sdpa dispatch: the backend select_sdp_backend returns") {
  // can_use_flash_attention: fp16/bf16, head dim <= 256, sm80..sm121, no mask.
  CHECK(kernel(inputs(DType::Bf16, 128, "8.0")) == SdpaKernel::Flash);
  CHECK(kernel(inputs(DType::Fp16, 64, "9.0")) == SdpaKernel::Flash);
  // A dense head dim that is not a multiple of 8 is padded for flash (attention.cpp pad_last_dim<8>), not refused.
  CHECK(kernel(inputs(DType::Bf16, 100, "8.0")) == SdpaKernel::Flash);
  // fp32: flash takes fp16/bf16 only; the memory-efficient kernel takes fp32 (sm80+: fp16, fp32, bf16).
  const SdpaChoice fp32 = select_sdpa_kernel(inputs(DType::Fp32, 128, "8.0"));
  CHECK(fp32.kernel == SdpaKernel::MemoryEfficient);
  CHECK(describe(fp32, DType::Fp32) == "sdpa -> memory-efficient (fp32)");
  // Head dim 512: above flash's 256; the memory-efficient kernel has no upper bound on CUDA, only alignment (8 for
  // fp16/bf16 on sm80+).
  CHECK(kernel(inputs(DType::Bf16, 512, "8.0")) == SdpaKernel::MemoryEfficient);
  // ... and a head dim above 256 that is not a multiple of 8 leaves only math.
  CHECK(kernel(inputs(DType::Bf16, 260, "8.0")) == SdpaKernel::Math);
  // sm75 (T4): below flash's sm80; the memory-efficient kernel runs fp16 and fp32 there, not bf16.
  CHECK(kernel(inputs(DType::Fp16, 128, "7.5")) == SdpaKernel::MemoryEfficient);
  CHECK(kernel(inputs(DType::Fp32, 64, "7.5")) == SdpaKernel::MemoryEfficient);
  CHECK(kernel(inputs(DType::Bf16, 128, "7.5")) == SdpaKernel::Math);
  // An attention mask (a sliding window): flash takes none, memory-efficient does.
  SdpaInputs masked = inputs(DType::Bf16, 128, "9.0");
  masked.arbitrary_mask = true;
  CHECK(kernel(masked) == SdpaKernel::MemoryEfficient);
  // Training with head dim in (192, 224] on sm86-89 is refused by flash (its backward): L40S, sm 8.9.
  CHECK(kernel(inputs(DType::Bf16, 200, "8.9")) == SdpaKernel::MemoryEfficient);
  CHECK(kernel(inputs(DType::Bf16, 128, "8.9")) == SdpaKernel::Flash);
  // q/k and v head dims differ (MLA 192/128): flash needs one head dim.
  SdpaInputs mla = inputs(DType::Bf16, 192, "8.0");
  mla.head_dim_v = 128;
  CHECK(kernel(mla) == SdpaKernel::MemoryEfficient);
}

TEST_CASE("sdpa dispatch: cuDNN first on sm90 where the torch release and the cuDNN runtime put it there") {
  SdpaInputs h = inputs(DType::Bf16, 128, "9.0");
  // 2.5.1 - 2.8: cuDNN is opt-in, last in the order (pytorch#138522): flash.
  CHECK(kernel(h) == SdpaKernel::Flash);
  // 2.5.0 put cuDNN first on H100.
  h.torch = parse_torch_version("2.5.0");
  CHECK(kernel(h) == SdpaKernel::Cudnn);
  h.torch = parse_torch_version("2.5.1");
  CHECK(kernel(h) == SdpaKernel::Flash);
  // 2.10+: cuDNN first on sm 9.0 / 10.0 when the runtime cuDNN is past 9.15.0.
  h.torch = parse_torch_version("2.11.0");
  h.cudnn = parse_cudnn_version("9.19");
  const SdpaChoice c = select_sdpa_kernel(h);
  CHECK(c.kernel == SdpaKernel::Cudnn);
  CHECK(describe(c, DType::Bf16).rfind("sdpa -> cudnn (", 0) == 0);
  h.cudnn = parse_cudnn_version("9.15.0");
  CHECK(kernel(h) == SdpaKernel::Flash);
  h.cudnn = parse_cudnn_version("9.15.1");
  CHECK(kernel(h) == SdpaKernel::Cudnn);
  // No cuDNN version stated: its priority is not assumed, and the note says so.
  h.cudnn.reset();
  const SdpaChoice unknown = select_sdpa_kernel(h);
  CHECK(unknown.kernel == SdpaKernel::Flash);
  REQUIRE(unknown.notes.size() == 1);
  CHECK(unknown.notes[0].find("cuDNN version not stated") != std::string::npos);
  // First in the order but refused (fp32; head dim 256 above its 128 before cuDNN 9.22.1): the next one runs.
  h.cudnn = parse_cudnn_version("9.19");
  SdpaInputs f = h;
  f.dtype = DType::Fp32;
  CHECK(kernel(f) == SdpaKernel::MemoryEfficient);
  SdpaInputs big = h;
  big.head_dim_qk = big.head_dim_v = 256;
  CHECK(kernel(big) == SdpaKernel::Flash);
  // cuDNN's priority is on sm90 / sm100 only: an A100 with the same stack runs flash, and needs no version.
  SdpaInputs a = inputs(DType::Bf16, 128, "8.0");
  a.torch.reset();
  const SdpaChoice a100 = select_sdpa_kernel(a);
  CHECK(a100.kernel == SdpaKernel::Flash);
  CHECK(a100.notes.empty());
}

TEST_CASE("sdpa dispatch: versions and compute capabilities are parsed strictly") {
  CHECK(parse_compute_capability("9.0")->major == 9);
  CHECK(parse_compute_capability("12.1")->minor == 1);
  for (const char* bad : {"9", "9.0.0", " 9.0", "9.0 ", "sm90", "9,0", "09.0", "0.9", "9.", ".0", "9.10", ""})
    CHECK_MESSAGE(!parse_compute_capability(bad), bad);
  CHECK(*parse_cudnn_version("9.19") == 91900);
  CHECK(*parse_cudnn_version("9.15.1") == 91501);
  CHECK(!parse_cudnn_version("nine"));
  CHECK(parse_torch_version("2.11.0")->minor == 11);
  CHECK(!parse_torch_version("2.11.0a0"));
  CHECK(!parse_torch_version("nightly"));
  CHECK(parse_torch_version_prefix("2.8.0a0+5228986c39")->minor == 8);
  CHECK(parse_torch_version_prefix("2.4.0.dev20240427+cu121")->patch == 0);
  CHECK(!parse_torch_version_prefix("nightly 2024-03"));
}

TEST_CASE("device.compute_capability: a bad value is refused, a CPU has none") {
  const std::string base = "base: a100-80gb\nname: x\ndevice:\n  compute_capability: ";
  CHECK(parse_hardware_text(base + "\"8.0\"\n", "x.yaml", root()).compute_capability.major == 8);
  for (const char* bad : {"\"8\"", "\"sm80\"", "\"8.0.0\"", "\"eight\""}) {
    CAPTURE(bad);
    try {
      parse_hardware_text(base + bad + "\n", "x.yaml", root());
      FAIL("accepted");
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).find("compute_capability") != std::string::npos);
      CHECK(std::string(e.what()).find("is not a compute capability") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(parse_hardware_text("base: cpu\nname: x\ndevice:\n  compute_capability: \"8.0\"\n", "x.yaml", root()),
                  InputError);
  // Every shipped GPU profile states it; the derived ones inherit it.
  CHECK(to_string(hardware("a100-80gb").compute_capability) == "8.0");
  CHECK(to_string(hardware("a100-40gb").compute_capability) == "8.0");
  CHECK(to_string(hardware("p4d-a100-40gb").compute_capability) == "8.0");
  CHECK(to_string(hardware("a800-80gb").compute_capability) == "8.0");
  CHECK(to_string(hardware("h100-80gb").compute_capability) == "9.0");
  CHECK(to_string(hardware("p5-h100-80gb").compute_capability) == "9.0");
  CHECK(to_string(hardware("h200-141gb").compute_capability) == "9.0");
  CHECK(to_string(hardware("l40s-48gb").compute_capability) == "8.9");
  CHECK(!hardware("cpu").compute_capability.known());
  // A kernel ratio that takes the flash curve above the peak is refused.
  CHECK_THROWS_AS(parse_hardware_text("base: a100-80gb\nname: x\ndevice:\n  sdpa_kernel_ratio:\n    memory_efficient: "
                                      "{forward: 1.5, backward: 1.0}\n",
                                      "x.yaml", root()),
                  InputError);
}

TEST_CASE("sdpa memory: math keeps eager attention's tensors, the fused kernels the output and log-sum-exp") {
  // The tiny zoo model (configs/models/tiny.yaml): hidden 256, 4 heads of 64, 2 kv heads, 4 layers. q width 256,
  // kv width 128. With the pytorch runtime's fp32 eager softmax (eager_softmax_fp32) in bf16, per token and layer:
  //  - math (eager): k and v expanded to q width (2 x 256 x 2 B), the fp32 probabilities (4 heads x seq x 4 B) and
  //    their bf16 cast (4 x seq x 2 B): 1024 + 24 seq bytes;
  //  - fused: k and v at kv width (2 x 128 x 2 B) and the fp32 log-sum-exp per head (4 x 4 B): 528 bytes;
  // q and the output are kept by both. At seq 512 math keeps 496 + 24 x 512 = 12784 bytes more per token and layer.
  ModuleGraph g(zoo("tiny"));
  RuntimeProfile rt = runtime("pytorch");
  Strategy s;
  s.attention = AttentionImpl::Sdpa;
  s.param_dtype = DType::Bf16;
  s.seq_len = 512;
  s.micro_batch = 1;
  // bf16 on sm 7.0 (V100): neither flash (sm80+) nor memory-efficient (bf16 needs sm80) -> math.
  HardwareProfile v100ish = hardware("a100-80gb");
  v100ish.compute_capability = ComputeCapability{7, 0};
  const std::optional<SdpaResolution> math = resolve_sdpa(g, v100ish, rt, s);
  REQUIRE(math);
  CHECK(math->global.kernel == SdpaKernel::Math);
  CHECK(math->description == "sdpa -> math (sm 7.0 outside flash's [8.0, 12.1])");
  const HardwareProfile a100 = hardware("a100-80gb");
  const std::optional<SdpaResolution> flash = resolve_sdpa(g, a100, rt, s);
  REQUIRE(flash);
  CHECK(flash->global.kernel == SdpaKernel::Flash);
  CHECK(flash->description == "sdpa -> flash");

  const ModuleId layer = g.layers()[0];
  const double math_tok = g.saved_bytes_per_token(layer, activation_query(s, rt, SdpaKernel::Math), ActCkpt::None);
  const double flash_tok = g.saved_bytes_per_token(layer, activation_query(s, rt, SdpaKernel::Flash), ActCkpt::None);
  CHECK(math_tok - flash_tok == doctest::Approx(12784.0));
  // Math saves exactly what eager attention saves; the memory-efficient and cuDNN kernels what flash saves.
  Strategy eager = s;
  eager.attention = AttentionImpl::Eager;
  CHECK(math_tok == doctest::Approx(g.saved_bytes_per_token(layer, activation_query(eager, rt), ActCkpt::None)));
  for (SdpaKernel k : {SdpaKernel::MemoryEfficient, SdpaKernel::Cudnn})
    CHECK(g.saved_bytes_per_token(layer, activation_query(s, rt, k), ActCkpt::None) == doctest::Approx(flash_tok));

  // Through simulate(): one micro-batch of 512 tokens over 4 layers keeps 512 x 4 x 12784 bytes more activations
  // (summed over the forward ops' allocations), and the report names the kernel.
  auto activations = [&](const HardwareProfile& hw) {
    StepProgram p;
    const Prediction pred = simulate(SimulationInput{&g, &hw, &rt, Cluster{1, 1}, s}, &p);
    double act = 0;
    for (const Op& op : p.ops)
      if (op.kind == OpKind::Forward && op.micro_batch == 0)
        for (const MemEvent& e : op.on_complete)
          if (e.category == MemoryCategory::Activations && e.bytes > 0) act += e.bytes;
    for (const Op& op : p.ops)
      if (op.kind == OpKind::Forward && op.micro_batch == 0)
        for (const MemEvent& e : op.on_issue)
          if (e.category == MemoryCategory::Activations && e.bytes > 0) act += e.bytes;
    return std::pair{act, pred.attention};
  };
  const auto [act_math, name_math] = activations(v100ish);
  const auto [act_flash, name_flash] = activations(a100);
  CHECK(act_math - act_flash == doctest::Approx(512.0 * 4.0 * 12784.0));
  CHECK(name_math == math->description);
  CHECK(name_flash == "sdpa -> flash");
}

TEST_CASE("sdpa time: the memory-efficient and cuDNN kernels at their ratio to the flash curves") {
  const HardwareProfile h100 = hardware("h100-80gb");
  REQUIRE(h100.sdpa_memory_efficient_ratio.given());
  REQUIRE(h100.sdpa_cudnn_ratio.given());
  // A compute-bound call (llama3-8b's shape at 8k tokens): its time scales as 1 / ratio.
  const AttentionShape a{1, 8192, 32, 8, 128, true};  // batch, seq, heads, kv heads, head dim, causal
  const double flash_f = attention_forward_time(h100, a, DType::Bf16).value;
  const double flash_b = attention_backward_time(h100, a, DType::Bf16).value;
  CHECK(attention_forward_time(h100, a, DType::Bf16, h100.sdpa_cudnn_ratio.forward).value ==
        doctest::Approx(flash_f / 1.61));
  CHECK(attention_backward_time(h100, a, DType::Bf16, h100.sdpa_cudnn_ratio.backward).value ==
        doctest::Approx(flash_b / 1.57));
  CHECK(attention_forward_time(h100, a, DType::Bf16, h100.sdpa_memory_efficient_ratio.forward).value ==
        doctest::Approx(flash_f / 0.549));

  // The step: sdpa on the pytorch runtime's torch 2.11 / cuDNN 9.19 runs cuDNN on an H100 and is faster than flash
  // by no more than the attention share allows; flash and eager keep their meaning.
  ModuleGraph g(zoo("llama3-8b"));
  RuntimeProfile rt = runtime("pytorch");
  Strategy s;
  s.seq_len = 8192;
  auto step = [&](AttentionImpl impl) {
    s.attention = impl;
    return simulate(SimulationInput{&g, &h100, &rt, Cluster{1, 8}, s});
  };
  const Prediction sdpa = step(AttentionImpl::Sdpa);
  const Prediction flash = step(AttentionImpl::Flash);
  CHECK(sdpa.attention.rfind("sdpa -> cudnn", 0) == 0);
  CHECK(flash.attention == "flash");
  CHECK(sdpa.time.compute_s < flash.time.compute_s);
  CHECK(sdpa.memory.peak_allocated == doctest::Approx(flash.memory.peak_allocated));
  // Without the stack's versions, the default order: flash, priced as flash.
  rt.torch_version.clear();
  rt.cudnn_version.clear();
  const Prediction plain = step(AttentionImpl::Sdpa);
  CHECK(plain.attention == "sdpa -> flash");
  CHECK(plain.time.step_s == doctest::Approx(flash.time.step_s));
  CHECK(plain.attention_notes.size() == 1);
}

TEST_CASE("sdpa time: the math kernel and eager attention are unfused attention, each with its own recipe") {
  // llama3-8b at 4k tokens, no checkpointing: every layer runs its attention forward and backward once per micro-batch,
  // so the step's compute moves by the layers x (unfused - flash) of one layer's attention, and by nothing else.
  HardwareProfile a100 = hardware("a100-80gb");
  ModuleGraph g(zoo("llama3-8b"));
  RuntimeProfile rt = runtime("pytorch");
  Strategy s;
  s.seq_len = 4096;
  s.micro_batch = 1;
  s.param_dtype = DType::Bf16;
  auto step = [&](AttentionImpl impl, const HardwareProfile& hw) {
    s.attention = impl;
    return simulate(SimulationInput{&g, &hw, &rt, Cluster{1, 8}, s});
  };
  const AttentionShape a{1, 4096, 32, 8, 128, true};  // batch, seq, heads, kv heads, head dim, causal
  const double flash_attn =
      attention_forward_time(a100, a, DType::Bf16).value + attention_backward_time(a100, a, DType::Bf16).value;
  const UnfusedAttentionRecipe eager = hf_eager_attention(DType::Bf16, rt.eager_softmax_fp32);
  const double eager_attn =
      unfused_attention_forward_time(a100, a, eager).value + unfused_attention_backward_time(a100, a, eager).value;
  CHECK(eager_attn > 1.5 * flash_attn);
  const Prediction flash = step(AttentionImpl::Flash, a100);
  const Prediction eager_step = step(AttentionImpl::Eager, a100);
  CHECK(eager_step.time.compute_s - flash.time.compute_s == doctest::Approx(32 * (eager_attn - flash_attn)));
  // sm 7.0: the dispatch runs math, which torch 2.11 upcasts to fp32: its GEMMs at the fp32 rate, slower still.
  HardwareProfile sm70 = a100;
  sm70.compute_capability = ComputeCapability{7, 0};
  const UnfusedAttentionRecipe math = sdpa_math_attention(DType::Bf16, parse_torch_version(rt.torch_version));
  REQUIRE(math.kernel_dtype == DType::Fp32);
  const double math_attn =
      unfused_attention_forward_time(sm70, a, math).value + unfused_attention_backward_time(sm70, a, math).value;
  CHECK(math_attn > eager_attn);
  const Prediction sdpa_math = step(AttentionImpl::Sdpa, sm70);
  REQUIRE(sdpa_math.attention.rfind("sdpa -> math", 0) == 0);
  CHECK(sdpa_math.time.compute_s - step(AttentionImpl::Flash, sm70).time.compute_s ==
        doctest::Approx(32 * (math_attn - flash_attn)));
}

TEST_CASE("sdpa: a CUDA profile without a compute capability, or without the ratio the kernel needs, is refused") {
  ModuleGraph g(zoo("tiny"));
  RuntimeProfile rt = runtime("pytorch");
  Strategy s;
  s.attention = AttentionImpl::Sdpa;
  s.seq_len = 512;
  HardwareProfile hw = hardware("a100-80gb");
  hw.compute_capability = ComputeCapability{};
  CHECK_THROWS_WITH_AS(resolve_sdpa(g, hw, rt, s), doctest::Contains("device.compute_capability"), InputError);
  hw = hardware("a100-80gb");
  hw.sdpa_memory_efficient_ratio = HardwareProfile::KernelRatio{};
  s.param_dtype = DType::Fp32;
  CHECK_THROWS_WITH_AS(resolve_sdpa(g, hw, rt, s), doctest::Contains("sdpa_kernel_ratio.memory_efficient"), InputError);
  // A CPU device keeps its CPU kernels, priced as before.
  CHECK(!resolve_sdpa(g, hardware("cpu"), rt, s));
  // flash and eager are not dispatched.
  s.attention = AttentionImpl::Flash;
  CHECK(!resolve_sdpa(g, hardware("a100-80gb"), rt, s));
}
