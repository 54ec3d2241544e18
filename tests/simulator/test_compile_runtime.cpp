// The torch.compile runtimes (configs/runtimes/pytorch-compile.yaml, pytorch-fsdp1-compile.yaml): profiles derived
// with `base:` from the eager ones, and what they change in one Llama layer, against numbers derived by hand for
// the Llama 3 8B shape of configs/models/llama3-8b.yaml (hidden h 4096, 32 query heads and 8 kv heads of 128, so
// q 4096 and kv 1024 wide, FFN f 14336; bf16 parameters under FSDP, so the residual stream is bf16 too).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/errors.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "program/layer_costs.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"
#include "sim_fixtures.hpp"

using namespace fsdp;

namespace {

constexpr double kH = 4096, kQ = 4096, kKv = 1024, kF = 14336, kHeads = 32;

LayerCost llama3_8b_layer(const std::string& runtime, int64_t micro_batch = 1) {
  const ModuleGraph g(load_model("llama3-8b", FSDP_SOURCE_ROOT));
  const RuntimeProfile rt = load_runtime(runtime, FSDP_SOURCE_ROOT);
  Strategy s;
  s.micro_batch = micro_batch;
  s.seq_len = 4096;
  const LayerCostInput in{&g, &s, &rt, activation_query(s, rt), 1.0};
  return layer_cost(in, g.layers().front(), ActCkpt::None);
}

// Writes `text` to NAME.yaml in a fresh directory of the temp directory and returns its path.
std::string write_runtime(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / "fsdp_compile_runtime_test";
  std::filesystem::create_directories(dir);
  const auto path = dir / (name + ".yaml");
  std::ofstream(path) << text;
  return path.string();
}

// The InputError message of loading `path` ("" when it loads).
std::string load_error(const std::string& path) {
  try {
    load_runtime(path, FSDP_SOURCE_ROOT);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("compile runtime: a derived profile is its base with the keys it gives") {
  const RuntimeProfile eager = load_runtime("pytorch", FSDP_SOURCE_ROOT);
  const RuntimeProfile compiled = load_runtime("pytorch-compile", FSDP_SOURCE_ROOT);
  CHECK(compiled.name == "pytorch-compile");
  CHECK(std::filesystem::path(compiled.base_source).filename() == "pytorch.yaml");
  CHECK(eager.base_source.empty());
  // The keys it gives.
  CHECK(eager.norm_saves_fp32_input);
  CHECK_FALSE(compiled.norm_saves_fp32_input);
  CHECK(eager.pointwise_outputs_saved);
  CHECK_FALSE(compiled.pointwise_outputs_saved);
  CHECK_FALSE(eager.fused_elementwise);
  CHECK(compiled.fused_elementwise);
  // Everything else is the base's.
  CHECK(compiled.fragmentation_fraction == eager.fragmentation_fraction);
  CHECK(compiled.context_memory.value == eager.context_memory.value);
  CHECK(compiled.logits_upcast_fp32 == eager.logits_upcast_fp32);
  CHECK(compiled.allgather_copy_out == eager.allgather_copy_out);
  CHECK(compiled.adamw_bytes_per_param == eager.adamw_bytes_per_param);

  const RuntimeProfile fsdp1 = load_runtime("pytorch-fsdp1", FSDP_SOURCE_ROOT);
  const RuntimeProfile fsdp1c = load_runtime("pytorch-fsdp1-compile", FSDP_SOURCE_ROOT);
  CHECK(fsdp1c.name == "pytorch-fsdp1-compile");
  CHECK(fsdp1c.allgather_copy_out == fsdp1.allgather_copy_out);  // FSDP1's flat-parameter views, not FSDP2's copy
  CHECK(fsdp1c.grads_in_reduce_dtype_before_reduce == fsdp1.grads_in_reduce_dtype_before_reduce);
  CHECK(fsdp1c.fused_elementwise);
  CHECK_FALSE(fsdp1c.pointwise_outputs_saved);
}

TEST_CASE("compile runtime: one Llama layer's saved bytes per token, eager against the min-cut partitioner") {
  // Eager (pytorch: HF LlamaRMSNorm keeps its fp32 input and the normalised bf16 tensor), per token in bytes:
  //   each norm: fp32 input 4h + rstd 4 + normalised 2h, and its output 2h (the next GEMMs' input): 8h + 4;
  //   attention (SDPA): q 2q, k 2kv, v 2kv, output 2q, log-sum-exp 4 x heads;
  //   gated MLP: gate 2f (SiLU's input), SiLU's output 2f and up 2f (the multiply's operands), product 2f.
  const double attention = 4 * kQ + 4 * kKv + 4 * kHeads;
  const double eager = 2 * (8 * kH + 4) + attention + 8 * kF;
  CHECK(eager == 200840);
  // Compiled (pytorch-compile): each norm keeps its bf16 input 2h and rstd 4, its output 2h as before; attention as
  // eager; the MLP keeps gate, up and the product (6f), SiLU's output recomputed from the gate.
  const double compiled = 2 * (4 * kH + 4) + attention + 6 * kF;
  CHECK(compiled == 139400);
  CHECK(llama3_8b_layer("pytorch").saved_bytes == doctest::Approx(eager));
  CHECK(llama3_8b_layer("pytorch-compile").saved_bytes == doctest::Approx(compiled));
  // The FSDP1 profiles' modules are the FSDP2 ones'.
  CHECK(llama3_8b_layer("pytorch-fsdp1").saved_bytes == doctest::Approx(eager));
  CHECK(llama3_8b_layer("pytorch-fsdp1-compile").saved_bytes == doctest::Approx(compiled));
}

TEST_CASE("compile runtime: one Llama layer's memory-bound bytes per token, eager kernels against fused ones") {
  // Eager, per token in bytes (program/layer_costs.cpp eager_elementwise_bytes): the two HF norms 32 per element
  // over 2h; rotary 7 r/w passes over q + kv; the attention layout one r/w pass over q + 2kv; SiLU and the gating
  // multiply 5f; two residual adds 3h each; all bf16 (2 bytes).
  const double eager = 2 * kH * 32 + 7 * 2 * (kQ + kKv) * 2 + 2 * (kQ + 2 * kKv) * 2 + 5 * kF * 2 + 2 * 3 * kH * 2;
  CHECK(eager == 622592);
  // Fused (fused_elementwise_bytes): each norm reads x and writes y (2h each); rotary reads q, k and writes them
  // (2 (q + kv)); the transposes are views, and with torch 2.11 and no mask Hugging Face hands SDPA the 8 kv heads
  // grouped (enable_gqa: nothing repeated; a runtime that repeats them, torchtitan's, below); SiLU(gate) * up reads 2f
  // and writes f; the residual adds 3h each, less the sum the post-attention norm would read back (h).
  const double fused = 2 * 2 * kH * 2 + 2 * (kQ + kKv) * 2 + 3 * kF * 2 + (2 * 3 * kH - kH) * 2;
  CHECK(fused == 180224);
  const LayerCost eager_layer = llama3_8b_layer("pytorch");
  const LayerCost fused_layer = llama3_8b_layer("pytorch-compile");
  CHECK(eager_layer.elementwise_bytes_per_token == doctest::Approx(eager));
  CHECK(fused_layer.elementwise_bytes_per_token == doctest::Approx(fused));
  // Backward: twice the forward.
  CHECK(eager_layer.elementwise_backward_bytes_per_token == doctest::Approx(2 * eager));
  CHECK(fused_layer.elementwise_backward_bytes_per_token == doctest::Approx(2 * fused));
}

TEST_CASE("torchtitan runtime: its complex rotary is three kernels, eager and compiled, backward as forward") {
  // torchtitan's apply_rotary_emb (model.py @ 9dec370): x.float() (read 2, write 4 bytes per element), the complex64
  // multiply by freqs_cis (read 4, write 4), type_as (read 4, write 2): 20 bytes per element of q and k, in place of
  // Hugging Face's 7 bf16 r/w passes (28). Inductor does not generate code for complex tensors, so the compiled
  // layer runs the same three kernels; their backward is the same three on the gradient, 20 bytes, not 40.
  const RuntimeProfile titan = load_runtime("torchtitan", FSDP_SOURCE_ROOT);
  const RuntimeProfile titan_compiled = load_runtime("torchtitan-compile", FSDP_SOURCE_ROOT);
  CHECK(titan.rotary_kernel == RotaryKernel::Complex);
  CHECK(titan_compiled.rotary_kernel == RotaryKernel::Complex);  // inherited from its base
  CHECK(load_runtime("pytorch", FSDP_SOURCE_ROOT).rotary_kernel != RotaryKernel::Complex);
  const double rotary = 20 * (kQ + kKv);
  CHECK(rotary == 102400);
  // Eager torchtitan: the pytorch eager layer with HF's rotary (28 per element) swapped for the complex one, and its
  // repeat_kv of the 8 kv heads to 32 before SDPA (model.py @ 9dec370: read kv, write q, for k and v: 2 (q + kv)),
  // whose backward (expand's, summing the q-wide gradients back) moves as much once.
  const double repeat = 2 * (kQ + kKv) * 2;
  const double eager = 622592 - 7 * 2 * (kQ + kKv) * 2 + rotary + repeat;
  CHECK(eager == 602112);
  const LayerCost eager_layer = llama3_8b_layer("torchtitan");
  CHECK(eager_layer.elementwise_bytes_per_token == doctest::Approx(eager));
  CHECK(eager_layer.elementwise_backward_bytes_per_token == doctest::Approx(2 * eager - rotary - repeat));
  // Compiled: the fused layer with the one-kernel rotary (4 per element) swapped for the three kernels, and the repeat
  // in one kernel: k written at q's width (q - kv more) and v copied (kv + q), 2q; its backward 2q once.
  const double fused = 180224 - 2 * (kQ + kKv) * 2 + rotary + 2 * kQ * 2;
  CHECK(fused == 278528);
  const LayerCost fused_layer = llama3_8b_layer("torchtitan-compile");
  CHECK(fused_layer.elementwise_bytes_per_token == doctest::Approx(fused));
  CHECK(fused_layer.elementwise_backward_bytes_per_token == doctest::Approx(2 * fused - rotary - 2 * kQ * 2));
}

TEST_CASE("torchtitan runtime: Qwen3's rotary at a9c5edc is Hugging Face's seven passes on an fp32 copy") {
  // CosSinRoPE.apply_rotary_emb (models/common/rope.py @ a9c5edc): x.float() (read 2, write 4 bytes per element), (x *
  // cos) + (rotate_half(x) * sin) as the eager rotary's 7 r/w passes at 4 bytes (56), type_as (read 4, write 2): 68
  // bytes per element of q and k, in place of the complex rotary's 20; backward twice the forward, as HF's.
  const RuntimeProfile qwen = load_runtime("torchtitan-2606-qwen3", FSDP_SOURCE_ROOT);
  CHECK(qwen.rotary_kernel == RotaryKernel::RotateHalfFp32);
  CHECK(qwen.rotary_kernel != RotaryKernel::Complex);
  CHECK(load_runtime("torchtitan-2510-qwen3", FSDP_SOURCE_ROOT).rotary_kernel != RotaryKernel::RotateHalfFp32);
  const double rotary = 68 * (kQ + kKv);
  CHECK(rotary == 348160);
  // The torchtitan eager layer (581632, above) with its complex rotary (102400) swapped for this one.
  const double eager = 581632 - 102400 + rotary;
  CHECK(eager == 827392);
  const LayerCost layer = llama3_8b_layer("torchtitan-2606-qwen3");
  CHECK(layer.elementwise_bytes_per_token == doctest::Approx(eager));
  CHECK(layer.elementwise_backward_bytes_per_token == doctest::Approx(2 * eager));
}

TEST_CASE("compile runtime: runtime profiles are parsed strictly, a derived one too") {
  const std::string compiled = std::string(FSDP_SOURCE_ROOT) + "/configs/runtimes/pytorch-compile.yaml";
  SUBCASE("a derived profile loads from a path, its base by name") {
    const std::string path = write_runtime("derived_ok", "base: pytorch\nname: derived-ok\n");
    CHECK(load_error(path) == "");
    CHECK(load_runtime(path, FSDP_SOURCE_ROOT).name == "derived-ok");
  }
  SUBCASE("an unknown key in a derived profile's mapping is refused with its file and dotted key") {
    const std::string path = write_runtime("bad_key", "base: pytorch\nname: bad\nmodules:\n  fused_pointwise: true\n");
    const std::string m = load_error(path);
    CHECK(contains(m, path));
    CHECK(contains(m, "unknown key 'modules.fused_pointwise'"));
  }
  SUBCASE("an unknown top-level key is refused") {
    const std::string path = write_runtime("bad_top", "base: pytorch\nname: bad\ninductor: true\n");
    CHECK(contains(load_error(path), "unknown key 'inductor'"));
  }
  SUBCASE("a wrong type is refused with its key") {
    const std::string path = write_runtime("bad_type", "base: pytorch\nname: bad\nmodules:\n  fused_elementwise: 3\n");
    CHECK(contains(load_error(path), "modules.fused_elementwise"));
  }
  SUBCASE("a profile written whole must give the new keys") {
    std::ifstream in(std::string(FSDP_SOURCE_ROOT) + "/configs/runtimes/pytorch.yaml");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string key = "  fused_elementwise: false\n";
    const auto pos = text.find(key);
    REQUIRE(pos != std::string::npos);
    const std::string path = write_runtime("missing_key", text.erase(pos, key.size()));
    const std::string m = load_error(path);
    CHECK(contains(m, path));
    CHECK(contains(m, "modules.fused_elementwise"));
    CHECK(contains(m, "missing"));
  }
  SUBCASE("an unknown base is refused, naming the shipped runtimes") {
    const std::string path = write_runtime("bad_base", "base: pytorch-jit\nname: bad\n");
    const std::string m = load_error(path);
    CHECK(contains(m, "unknown runtime 'pytorch-jit'"));
    CHECK(contains(m, "pytorch-compile"));
  }
  SUBCASE("bases that form a cycle are refused") {
    const std::string a = write_runtime("cycle_a", "base: cycle_b.yaml\nname: a\n");
    write_runtime("cycle_b", "base: cycle_a.yaml\nname: b\n");
    CHECK(contains(load_error(a), "the bases form a cycle"));
  }
  SUBCASE("an error in the base names the base and the derived file") {
    const std::string base = write_runtime("broken_base", "base: pytorch\nname: broken\nsharding:\n  turbo: true\n");
    const std::string path = write_runtime("on_broken", "base: broken_base.yaml\nname: derived\n");
    const std::string m = load_error(path);
    CHECK(contains(m, "sharding.turbo"));
    CHECK(contains(m, "the base of " + path));
  }
  CHECK(load_error(compiled) == "");
}

// nanotron's layer kernels (configs/runtimes/nanotron.yaml norm_kernel, rotary_kernel, attention_output_copy), on
// the same Llama 3 8B layer, per token in bytes, all bf16: two single-kernel norms read x and write y (2h each);
// q and k rotated in place (2 (q + kv)) after k and v are packed by a cat and a permuted copy (2 x 2 x 2kv); the
// per-head layout copy (2 (q + 2kv)); SiLU and the gating multiply (5f); two residual adds (3h each); with two
// sequences per micro-batch, the attention output's copy for o_proj (2q).
TEST_CASE("nanotron runtime: one Llama layer's memory-bound bytes per token, its Triton and flash-attn kernels") {
  const double one = (2 * 2 * kH + 2 * (kQ + kKv) + 8 * kKv + 2 * (kQ + 2 * kKv) + 5 * kF + 2 * 3 * kH) * 2;
  CHECK(one == 286720);
  CHECK(llama3_8b_layer("nanotron").elementwise_bytes_per_token == doctest::Approx(one));
  CHECK(llama3_8b_layer("nanotron", 2).elementwise_bytes_per_token == doctest::Approx(one + 2 * kQ * 2));
  // Backward: twice the forward, less a norm's 1 of 4 tensors (its Triton backward reads x and dy, writes dx) and the
  // rotary's: in place as forward (2 (q + kv)), and of the packing only SplitBackward's cat of dk and dv (2 x 2kv),
  // not twice the forward's 2 (q + kv) + 8 kv.
  const double back_saved = 2 * kH * 1 * 2 + (2 * (2 * (kQ + kKv) + 8 * kKv) - (2 * (kQ + kKv) + 4 * kKv)) * 2;
  CHECK(llama3_8b_layer("nanotron").elementwise_backward_bytes_per_token == doctest::Approx(2 * one - back_saved));
  // Eager PyTorch's backward stays twice its forward (the compiled one's repeat of k and v moves its 2q once: the
  // test case "one Llama layer's memory-bound bytes per token" above).
  CHECK(llama3_8b_layer("pytorch").elementwise_backward_bytes_per_token ==
        doctest::Approx(2 * llama3_8b_layer("pytorch").elementwise_bytes_per_token));
  // The eager defaults keep their count whatever the micro-batch (the copy is nanotron's sequence-first layout's).
  CHECK(llama3_8b_layer("pytorch", 2).elementwise_bytes_per_token == doctest::Approx(622592));
  // Each key alone, in a profile derived from pytorch (eager: 622592 above).
  auto layer_with = [](const std::string& name, const std::string& key) {
    const std::string path = write_runtime(name, "base: pytorch\nname: " + name + "\nmodules:\n  " + key + "\n");
    const ModuleGraph g(load_model("llama3-8b", FSDP_SOURCE_ROOT));
    const RuntimeProfile rt = load_runtime(path, FSDP_SOURCE_ROOT);
    Strategy s;
    s.micro_batch = 2;
    s.seq_len = 4096;
    const LayerCostInput in{&g, &s, &rt, activation_query(s, rt), 1.0};
    return layer_cost(in, g.layers().front(), ActCkpt::None).elementwise_bytes_per_token;
  };
  // pytorch's norm upcasts (32 bytes per element over 2h); one kernel reads x and writes y whatever it computes in.
  CHECK(layer_with("norm_only", "norm_kernel: single") == doctest::Approx(622592 - 2 * kH * 32 + 2 * kH * 2 * 2));
  CHECK(layer_with("rotary_only", "rotary_kernel: flash-attn-in-place") ==
        doctest::Approx(622592 - 7 * 2 * (kQ + kKv) * 2 + (2 * (kQ + kKv) + 8 * kKv) * 2));
  CHECK(layer_with("copy_only", "attention_output_copy: true") == doctest::Approx(622592 + 2 * kQ * 2));
}

// nanotron's loss (loss_kernels: vocab-parallel): the head's logits upcast to fp32 and Megatron's vocabulary-parallel
// cross-entropy, 2 + 4 + 8 x 4 bytes per logit forward and 2 x 4 + 4 + 2 backward; PyTorch's log_softmax + nll_loss
// (pytorch.yaml) 2 + 4 + 4 and 2 + 4 with nanotron's in-place backward.
TEST_CASE("nanotron runtime: the loss's memory-bound bytes per logit, vocab-parallel cross-entropy") {
  const ModuleGraph g(load_model("llama3-8b", FSDP_SOURCE_ROOT));
  Strategy s;
  s.micro_batch = 1;
  s.seq_len = 4096;
  const double logits = 4096.0 * 128256.0;  // configs/models/llama3-8b.yaml vocab_size
  auto loss_bytes = [&](const RuntimeProfile& rt, OpKind kind) {
    const StepProgram p = test::program(g, s, rt, 1, 1);
    for (const Op& op : p.ops)
      if (op.kind == kind) return op.elementwise_bytes;
    return -1.0;
  };
  const RuntimeProfile nanotron = load_runtime("nanotron", FSDP_SOURCE_ROOT);
  REQUIRE(nanotron.loss_vocab_parallel_kernels);
  CHECK(loss_bytes(nanotron, OpKind::Loss) == doctest::Approx(38 * logits));
  CHECK(loss_bytes(nanotron, OpKind::LossBackward) == doctest::Approx(14 * logits));
  RuntimeProfile log_softmax = nanotron;
  log_softmax.loss_vocab_parallel_kernels = false;
  CHECK(loss_bytes(log_softmax, OpKind::Loss) == doctest::Approx(10 * logits));
  CHECK(loss_bytes(log_softmax, OpKind::LossBackward) == doctest::Approx(6 * logits));
}

TEST_CASE("nanotron runtime: its kernel keys are parsed strictly") {
  for (const std::string key : {"norm_kernel: fused", "rotary_kernel: triton", "loss_kernels: fused",
                                "attention_output_copy: 2", "mha_qkv_copy_saved: yes please"}) {
    const std::string field = key.substr(0, key.find(':'));
    const std::string path = write_runtime("bad_" + field, "base: pytorch\nname: bad\nmodules:\n  " + key + "\n");
    CHECK(contains(load_error(path), "modules." + field));
  }
  const RuntimeProfile pytorch = load_runtime("pytorch", FSDP_SOURCE_ROOT);
  CHECK_FALSE(pytorch.norm_single_kernel);
  CHECK(pytorch.rotary_kernel != RotaryKernel::FlashAttnInPlace);
  CHECK_FALSE(pytorch.attention_output_copy);
  CHECK_FALSE(pytorch.loss_vocab_parallel_kernels);
  CHECK_FALSE(pytorch.mha_qkv_copy_saved);
  const RuntimeProfile nanotron = load_runtime("nanotron", FSDP_SOURCE_ROOT);
  CHECK(nanotron.norm_single_kernel);
  CHECK(nanotron.rotary_kernel == RotaryKernel::FlashAttnInPlace);
  CHECK(nanotron.attention_output_copy);
  CHECK(nanotron.mha_qkv_copy_saved);
}

// nanotron's multi-head layer (configs/runtimes/nanotron.yaml mha_qkv_copy_saved; llama.py CausalSelfAttention @
// 67c5ebb6, is_gqa false): q is a view of the one (3, batch, seq, heads, dim) copy of the qkv projection's output, and
// flash attention saves it, so k's and v's thirds of that copy stay beside the packed kv the kernel saves: 2 kv bf16
// elements a token more. A GQA layer (Llama 3 8B, 8 kv heads) copies q, k and v apart and keeps q's alone.
TEST_CASE("nanotron runtime: a multi-head layer's saved q keeps the whole qkv copy") {
  auto layer_bytes = [](const std::string& model, bool copy_saved, ActCkpt ckpt = ActCkpt::None) {
    const ModuleGraph g(load_model(model, FSDP_SOURCE_ROOT));
    RuntimeProfile rt = load_runtime("nanotron", FSDP_SOURCE_ROOT);
    rt.mha_qkv_copy_saved = copy_saved;
    Strategy s;
    s.seq_len = 4096;
    return g.saved_bytes_per_token(g.layers().front(), activation_query(s, rt), ckpt);
  };
  const std::string mha =
      std::string(FSDP_SOURCE_ROOT) + "/tests/accuracy/published/models/nanotron-1b-ultrascale.yaml";
  // The 1B: hidden 2048, 32 heads and 32 kv heads of 64; a layer keeps 24 hidden widths without the copy, 26 with it
  // (its input, the two norms' outputs, the post-attention residual, q, k, v, the attention output, and 4 x 4 of the
  // gated MLP's gate, up, SiLU and product; the log-sum-exp and the norms' statistics aside).
  CHECK(layer_bytes(mha, true) - layer_bytes(mha, false) == doctest::Approx(2 * 2048 * 2));
  CHECK(layer_bytes(mha, true) == doctest::Approx(26 * 2048 * 2).epsilon(0.01));
  CHECK(layer_bytes("llama3-8b", true) == doctest::Approx(layer_bytes("llama3-8b", false)));
  // Checkpointing the attention core (ours, Selective) keeps its inputs, the copy with them.
  CHECK(layer_bytes(mha, true, ActCkpt::Selective) - layer_bytes(mha, false, ActCkpt::Selective) ==
        doctest::Approx(2 * 2048 * 2));
}
