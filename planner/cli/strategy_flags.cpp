#include "cli/strategy_flags.hpp"

#include <algorithm>
#include <iostream>

#include "core/errors.hpp"
#include "model/model_loader.hpp"

namespace fsdp {

const std::set<std::string>& strategy_value_flags() {
  static const std::set<std::string> flags{"--strategy",
                                           "--hsdp-group",
                                           "--wrap",
                                           "--reshard-after-forward",
                                           "--act-ckpt",
                                           "--offload",
                                           "--param-dtype",
                                           "--reduce-dtype",
                                           "--master-dtype",
                                           "--micro-batch",
                                           "--seq",
                                           "--doc-len",
                                           "--grad-accum",
                                           "--optimizer",
                                           "--method",
                                           "--lora-rank",
                                           "--lora-targets",
                                           "--attention",
                                           "--kernels",
                                           "--forward-prefetch",
                                           "--backward-prefetch",
                                           "--ddp-bucket-mb",
                                           "--grad-sync",
                                           "--float8",
                                           "--float8-all-gather",
                                           "--tp",
                                           "--sequence-parallel",
                                           "--async-tp",
                                           "--pp",
                                           "--pp-schedule",
                                           "--pp-virtual-stages",
                                           "--ep",
                                           "--train-vision"};
  return flags;
}

std::string strategy_flags_help(const std::string& indent, size_t width) {
  std::string out, line = indent + "strategy:";
  for (const std::string& f : strategy_value_flags()) {
    if (line.size() + 1 + f.size() + 2 > width) {
      out += line + "\n";
      line = indent + "         ";
    }
    line += " " + f + " V";
  }
  return out + line + "\n";
}

namespace {

template <typename E>
void enum_flag(const Args& a, const std::string& flag, bool (*parse)(const std::string&, E&), E& out,
               const std::string& allowed) {
  if (auto v = a.get(flag))
    if (!parse(*v, out)) throw InputError(flag + ": '" + *v + "' is not one of: " + allowed);
}

int64_t positive(const Args& a, const std::string& flag, int64_t fallback) {
  int64_t v = a.get_int_or(flag, fallback);
  if (v <= 0) throw InputError(flag + ": must be at least 1, got " + std::to_string(v));
  return v;
}

}  // namespace

void check_grad_sync_runtime(const Strategy& s, const RuntimeProfile& rt) {
  if (s.grad_sync == GradSync::LastMicroBatch && rt.name == "fsdp-run")
    throw InputError(
        "--grad-sync last-micro-batch: fsdp-run reduces sharded gradients after every micro-batch (it "
        "does not run no_sync yet); plan it for --runtime pytorch, pytorch-fsdp1 or torchtitan");
}

void apply_default_seq(const Args& args, const ModelSpec& m, Strategy& s) {
  if (args.has("--seq")) return;
  const int64_t image_tokens = m.vision ? std::max<int64_t>(0, m.vision->image_tokens) : 0;
  const int64_t text_positions = m.max_positions - image_tokens;
  if (text_positions >= s.seq_len || text_positions <= 0) return;
  s.seq_len = text_positions;
  std::cerr << "note: " << m.name << " has " << m.max_positions
            << (m.position_embedding == PositionEmbedding::Learned ? " learned positions" : " positions")
            << (image_tokens > 0 ? " (" + std::to_string(image_tokens) + " of them for the image tokens)" : "")
            << "; planning with --seq " << text_positions << "\n";
}

void apply_runtime_defaults(const Args& args, const RuntimeProfile& rt, Strategy& s) {
  if (!args.has("--sequence-parallel") && !rt.support.sequence_parallel) s.mesh.sequence_parallel = false;
}

void apply_strategy_flags(const Args& a, Strategy& s) {
  enum_flag(a, "--strategy", parse_strategy_kind, s.kind,
            "no-shard, ddp, zero1, zero2, zero3, fsdp, fsdp-grad-op, hsdp");
  s.hsdp_group = a.get_int_or("--hsdp-group", s.hsdp_group);
  if (auto v = a.get("--wrap"))
    if (!parse_wrap(*v, s.wrap))
      throw InputError(
          "--wrap: '" + *v +
          "' is not one of: layer, every:K, size:N (a unit of at least N parameters: 100000000 or 100M), model");
  s.reshard_after_forward = a.get_bool_or("--reshard-after-forward", s.reshard_after_forward);
  if (auto v = a.get("--act-ckpt"))
    if (!parse_act_ckpt(*v, s)) throw InputError("--act-ckpt: '" + *v + "' is not one of: " + kActCkptNames);
  enum_flag(a, "--offload", parse_offload, s.offload, "none, optimizer, params");
  enum_flag(a, "--param-dtype", parse_dtype, s.param_dtype, "fp32, bf16, fp16");
  enum_flag(a, "--reduce-dtype", parse_dtype, s.reduce_dtype, "fp32, bf16, fp16");
  enum_flag(a, "--master-dtype", parse_dtype, s.master_dtype, "fp32, bf16, fp16");
  s.micro_batch = positive(a, "--micro-batch", s.micro_batch);
  s.seq_len = positive(a, "--seq", s.seq_len);
  if (a.has("--doc-len")) s.doc_len = positive(a, "--doc-len", s.doc_len);
  s.grad_accum = positive(a, "--grad-accum", s.grad_accum);
  enum_flag(a, "--optimizer", parse_optimizer, s.optimizer, "adamw, sgd");
  enum_flag(a, "--method", parse_method, s.method, "full, lora, qlora");
  s.lora.rank = a.get_int_or("--lora-rank", s.lora.rank);
  if (auto v = a.get("--lora-targets")) {
    s.lora.target_modules.clear();
    std::string cur;
    for (char ch : *v + ",") {
      if (ch == ',') {
        if (!cur.empty()) s.lora.target_modules.push_back(cur);
        cur.clear();
      } else {
        cur += ch;
      }
    }
  }
  if (s.method != Method::Full && s.lora.target_modules.empty())
    s.lora.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
  enum_flag(a, "--attention", parse_attention, s.attention, "flash, flash3, flex, sdpa, eager");
  enum_flag(a, "--kernels", parse_kernel_library, s.kernels, kKernelLibraryNames);
  s.forward_prefetch = a.get_int_or("--forward-prefetch", s.forward_prefetch);
  s.backward_prefetch = a.get_int_or("--backward-prefetch", s.backward_prefetch);
  s.ddp_bucket_mb = positive(a, "--ddp-bucket-mb", s.ddp_bucket_mb);
  enum_flag(a, "--grad-sync", parse_grad_sync, s.grad_sync, "every-micro-batch, last-micro-batch");
  enum_flag(a, "--float8", parse_float8, s.float8, kFloat8Names);
  s.float8_all_gather = a.get_bool_or("--float8-all-gather", s.float8_all_gather);
  enum_flag(a, "--train-vision", parse_vision_training, s.train_vision, kVisionTrainingNames);
  s.mesh.tp = positive(a, "--tp", s.mesh.tp);
  s.mesh.sequence_parallel = a.get_bool_or("--sequence-parallel", s.mesh.sequence_parallel);
  s.mesh.async_tp = a.get_bool_or("--async-tp", s.mesh.async_tp);
  s.mesh.pp = positive(a, "--pp", s.mesh.pp);
  enum_flag(a, "--pp-schedule", parse_pipeline_schedule, s.mesh.pp_schedule, kPipelineScheduleNames);
  s.mesh.pp_virtual_stages = positive(a, "--pp-virtual-stages", s.mesh.pp_virtual_stages);
  s.mesh.ep = positive(a, "--ep", s.mesh.ep);
  if (s.kind == StrategyKind::Hsdp && s.hsdp_group == 0 && !a.has("--hsdp-group"))
    throw InputError("--hsdp-group: --strategy hsdp needs a shard-group size");
}

void apply_image_tokens_flag(const Args& args, ModelSpec& m) {
  if (!args.has("--image-tokens")) return;
  const int64_t n = args.get_int_or("--image-tokens", 0);
  if (n <= 0) throw InputError("--image-tokens: must be at least 1, got " + std::to_string(n));
  if (!m.vision) throw InputError("--image-tokens: " + m.name + " has no vision tower");
  m.vision->image_tokens = n;
  validate_model(m, "--image-tokens");
}

}  // namespace fsdp
