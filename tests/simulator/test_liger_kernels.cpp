// Liger-Kernel (--kernels liger, runtime/kernel_library.hpp): its fused linear cross-entropy checked against the
// library's own A100 benchmark (linkedin/Liger-Kernel benchmark/data/all_benchmark_data.csv @ ead96b61,
// fused_linear_cross_entropy, liger 0.4.2, H 4096, V 128256, bf16, "full" = forward + backward, against its
// "huggingface" baseline: nn.Linear then nn.CrossEntropyLoss on the bf16 logits), nothing fitted to it; the patched
// step (no logits, the gradients in the forward, leaner norms, rotary and SwiGLU) against the unpatched one; the
// refusals of rule KernelLibrary; the model types it patches.
#include <doctest/doctest.h>

#include <string>

#include "compute/compute_cost.hpp"
#include "model/module_graph.hpp"
#include "runtime/kernel_library.hpp"
#include "sim_fixtures.hpp"
#include "simulate.hpp"

namespace {

using namespace fsdp;

// Qwen2.5-7B (qwen2-7b's shape) under ZeRO-3 on 8 A100s, one packed 8192-token sequence, full checkpointing: the
// plan of ms-swift's examples/train/liger/sft.sh.
Strategy zero3_8k(KernelLibrary k) {
  Strategy s = test::fsdp_full_ckpt(1, 8192);
  s.kind = StrategyKind::Zero3;
  s.reduce_dtype = DType::Bf16;
  s.grad_accum = 2;
  s.kernels = k;
  return s;
}

}  // namespace

TEST_CASE("liger: the fused linear cross-entropy against Liger-Kernel's A100 benchmark, and its baseline") {
  const HardwareProfile hw = test::hardware("a100-80gb");
  const int64_t h = 4096, v = 128256;
  struct Row {
    int64_t tokens;
    double liger_ms, hf_ms;  // measured, median of do_bench
  };
  const Row rows[] = {{4096, 121.43, 55.97}, {8192, 166.71, 111.45}, {16384, 277.12, 220.78}, {32768, 511.06, 452.47}};
  for (const Row& r : rows) {
    CAPTURE(r.tokens);
    // Liger: the chunks' GEMMs, then its kernels' traffic as the benchmarked version ran them. Today's
    // (push_fused_linear_loss_ops, @ ead96b61): the zeroed gradients, three passes over the bf16 logits (the
    // cross-entropy kernel's online-softmax read, then its read and in-place gradient write), the input gradient's
    // chunk copies, the backward's scaling of both gradients. 0.4.2's per chunk (src/liger_kernel/ops/
    // fused_linear_cross_entropy.py @ v0.4.2) upcasts the logits first, `logits_chunk.float()` (read 2, write 4
    // bytes an element), runs the same kernel's three passes on the fp32 copy (12), casts the gradient back,
    // `.to(dtype)` (read 4, write 2), and scales it into a new tensor, `logits_chunk * alpha` (read 2, write 2):
    // 28 bytes an element, 14 bf16 logits' worth, where today's kernel upcasts in its registers (3).
    const double bt = double(r.tokens), logits = bt * double(v) * 2.0, dx = bt * double(h) * 2.0,
                 dw = double(v) * double(h) * 2.0;
    constexpr double kLogitPassesToday = 3.0, kLogitPassesV042 = 3.0 + 6.0 + 3.0 + 2.0;
    auto liger_with = [&](double logit_passes) {
      return fused_linear_cross_entropy_time(hw, r.tokens, v, h, DType::Bf16).value +
             memory_bound_time(hw, Bytes(dx + dw + logit_passes * logits + 2.0 * dx + 2.0 * (dx + dw)), DType::Bf16)
                 .value;
    };
    const double liger = liger_with(kLogitPassesV042), liger_today = liger_with(kLogitPassesToday);
    // The baseline: the linear's three GEMMs and eager cross-entropy over the bf16 logits as the simulator prices it
    // (program/emit_loss.cpp, tests/simulator/test_cross_entropy_kernels.cpp): log_softmax's forward reads a row
    // three times and writes it, nll_loss's backward zeroes the gradient, log_softmax's backward reads it twice and
    // the output once and writes: nine logits-sized passes at the softmax kernels' rate.
    const double hf = 3.0 * matmul_time(hw, r.tokens, v, h, DType::Bf16).value +
                      9.0 * logits / hw.softmax_bandwidth(DType::Bf16).value;
    const double liger_err = 1e3 * liger / r.liger_ms - 1.0, hf_err = 1e3 * hf / r.hf_ms - 1.0;
    MESSAGE("BT " << r.tokens << ": chunk " << fused_linear_ce_chunk_rows(r.tokens, v, h) << " rows, liger 0.4.2 "
                  << 1e3 * liger << " ms (measured " << r.liger_ms << ", " << 100 * liger_err << "%), today's kernels "
                  << 1e3 * liger_today << " ms, baseline " << 1e3 * hf << " ms (measured " << r.hf_ms << ", "
                  << 100 * hf_err << "%)");
    // Measured 2026-12-05 against this table: the baseline -3.1..-5.6%, Liger 0.4.2 -11.4..+5.6% (-9.6..-24.0% when
    // priced with today's kernels, which the benchmark did not run). Gated at today's worst plus about 3 points.
    CHECK(std::abs(hf_err) < 0.08);
    CHECK(std::abs(liger_err) < 0.15);
    // Today's kernels move less: the same GEMMs, 11 logits' worth of traffic fewer.
    CHECK(liger_today < liger);
    // Its chunks: inc_factor ceil(V / H) = 32, so BT / 32 rows, as the benchmark's version computes them.
    CHECK(fused_linear_ce_chunk_rows(r.tokens, v, h) == r.tokens / 32);
  }
  // The chunk is a power of two (triton.next_power_of_2) of about BT / ceil(V / H) rows.
  CHECK(fused_linear_ce_chunk_rows(8192, 152064, 3584) == 256);  // inc_factor 43: ceil(8192 / 43) = 191 -> 256
  CHECK(fused_linear_ce_chunk_rows(1, 152064, 3584) == 1);
}

TEST_CASE("liger: the patched step keeps no logits and leaner layers; the loss's gradients move to its forward") {
  const ModuleGraph g(test::zoo("qwen2-7b"));
  const Prediction plain = test::predict_node(g, zero3_8k(KernelLibrary::None), "a100-80gb", "transformers-deepspeed");
  const Prediction liger = test::predict_node(g, zero3_8k(KernelLibrary::Liger), "a100-80gb", "transformers-deepspeed");
  // Unpatched, the peak is the loss's backward over the fp32 logits (8192 x 152064 x 4 bytes = 4.6 GiB each); patched,
  // a decoder layer's backward, some 11 GiB lower (ms-swift measured 54 and 42 GB for the two, examples/train/liger).
  CHECK(plain.memory.peak_phase.find("loss backward") != std::string::npos);
  CHECK(liger.memory.peak_phase.find("backward layers") != std::string::npos);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double saved = (plain.memory.device_total - liger.memory.device_total) / gib;
  CHECK(saved > 9.0);
  CHECK(saved < 14.0);
  // Faster: the loss's eager kernels over the fp32 logits and the layers' norms, rotary and SwiGLU passes go.
  CHECK(liger.time.step_s < plain.time.step_s);
  // The layer's saved tensors shrink by the SiLU output and the norms' fp32 copies.
  const RuntimeProfile rt = test::runtime("transformers-deepspeed");
  const RuntimeProfile patched = with_kernel_library(rt, KernelLibrary::Liger);
  CHECK(patched.loss_fused_linear);
  CHECK(patched.norm_single_kernel);
  CHECK_FALSE(patched.norm_saves_fp32_input);
  CHECK_FALSE(patched.pointwise_outputs_saved);
  CHECK(patched.glu_single_kernel);
  CHECK(patched.rotary_kernel == RotaryKernel::InPlace);
  CHECK_FALSE(patched.logits_kept_by_caller);
  const StepProgram p0 = test::program(g, zero3_8k(KernelLibrary::None), rt, 1, 8);
  const StepProgram p1 = test::program(g, zero3_8k(KernelLibrary::Liger), rt, 1, 8);
  CHECK_FALSE(p0.fused_linear_loss);
  CHECK(p1.fused_linear_loss);
  int fused = 0;
  for (const Op& op : p1.ops) {
    if (op.kind == OpKind::Loss) CHECK(op.head_fused_loss);
    if (op.kind == OpKind::LossBackward) CHECK(op.head_passes == 0);
    fused += op.head_fused_loss ? 1 : 0;
  }
  CHECK(fused == 2);  // one per micro-batch
  // KernelLibrary::None is the runtime itself.
  CHECK(with_kernel_library(rt, KernelLibrary::None).loss_fused_linear == rt.loss_fused_linear);
}

TEST_CASE("liger: refused where the runtime does not apply it or the model has no patch (rule KernelLibrary)") {
  const Strategy s = zero3_8k(KernelLibrary::Liger);
  const ModelSpec qwen = test::zoo("qwen2-7b");
  CHECK(test::refusal(s, qwen, "transformers-deepspeed").empty());
  CHECK(test::refusal(s, qwen, "deepspeed").empty());
  Strategy fsdp = s;
  fsdp.kind = StrategyKind::Fsdp;
  CHECK(test::refusal(fsdp, qwen, "pytorch").empty());
  CHECK(test::refusal(fsdp, qwen, "pytorch-fsdp1").empty());
  CHECK(test::refusal(fsdp, qwen, "torchtitan").find("does not apply Liger-Kernel") != std::string::npos);
  CHECK(test::refusal(fsdp, qwen, "pytorch-compile").find("runs.liger_kernel") != std::string::npos);
  CHECK(test::refusal(fsdp, qwen, "fsdp-run").find("--kernels") != std::string::npos);
  // DeepSeek-V2's model type has no entry in Liger's table; a shape without a model type names none.
  CHECK(test::refusal(s, test::zoo("deepseek-v2-lite"), "deepspeed").find("no patch for deepseek-v2-lite") !=
        std::string::npos);
  CHECK(test::refusal(s, test::zoo("tiny"), "deepspeed").find("names no Hugging Face model_type") != std::string::npos);
  // The types fsdp-plan reads that Liger patches, and two it does not.
  for (const char* t : {"llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "mixtral", "gemma2", "phi3"})
    CHECK(liger_patches(t));
  CHECK_FALSE(liger_patches("qwen2_moe"));
  CHECK_FALSE(liger_patches("internvl_chat"));
  // The shipped models carry their Hugging Face model_type.
  CHECK(test::zoo("llama3-8b").hf_model_type == "llama");
  CHECK(test::zoo("qwen2.5-vl-7b").hf_model_type == "qwen2_5_vl");
}
