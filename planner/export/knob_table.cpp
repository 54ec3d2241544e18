#include "export/knob_table.hpp"

#include <algorithm>
#include <charconv>
#include <map>

#include "core/errors.hpp"

namespace fsdp {

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : sep) + x;
  return out;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : text + sep) {
    if (ch == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  return out;
}

namespace {

bool always(const Strategy&) { return true; }
bool is_hsdp(const Strategy& s) { return s.kind == StrategyKind::Hsdp; }
bool sharded(const Strategy& s) { return shards_params(s.kind); }
// FSDP2's reshard_after_forward / FSDP1's FULL_SHARD vs SHARD_GRAD_OP: the kinds whose search tries both.
bool reshard_applies(const Strategy& s) {
  return s.kind == StrategyKind::Fsdp || s.kind == StrategyKind::Zero3 || s.kind == StrategyKind::Hsdp;
}
bool adapted(const Strategy& s) { return s.method != Method::Full; }
bool is_ddp(const Strategy& s) { return s.kind == StrategyKind::Ddp; }
bool tensor_parallel(const Strategy& s) { return s.mesh.tp > 1; }
bool pipelined(const Strategy& s) { return s.mesh.pp > 1; }

bool set_flag(bool& out, const std::string& v) {
  if (v != "true" && v != "false") return false;
  out = v == "true";
  return true;
}

bool parse_count(const std::string& v, int64_t& out) {
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc() && p == v.data() + v.size() && out >= 0;
}

std::string dtypes_value(const Strategy& s, const Cluster&) {
  return std::string(to_string(s.param_dtype)) + "/" + to_string(s.reduce_dtype) + "/" + to_string(s.master_dtype);
}

bool set_dtypes(Strategy& s, const std::string& v, const Cluster&) {
  const auto parts = split(v, '/');
  return parts.size() == 3 && parse_dtype(parts[0], s.param_dtype) && parse_dtype(parts[1], s.reduce_dtype) &&
         parse_dtype(parts[2], s.master_dtype);
}

bool set_kind(Strategy& s, const std::string& v, const Cluster& c) {
  if (!parse_strategy_kind(v, s.kind)) return false;
  if (s.kind == StrategyKind::Hsdp && s.hsdp_group <= 0) s.hsdp_group = c.gpus_per_node;
  if (s.kind != StrategyKind::Hsdp) s.hsdp_group = 0;
  // As the search builds each kind's plans (plan_search.cpp): replicated kinds compute one decoder layer per unit
  // and have no resharding, SHARD_GRAD_OP keeps the parameters after forward.
  if (!shards_params(s.kind)) s.wrap = WrapPolicy{};
  if (!shards_params(s.kind)) s.reshard_after_forward = true;
  if (s.kind == StrategyKind::FsdpGradOp) s.reshard_after_forward = false;
  return true;
}

// Float8 linears as one value: the recipe, and "+all-gather" when FSDP gathers the weights in float8.
std::string float8_value(const Strategy& s, const Cluster&) {
  return std::string(to_string(s.float8)) + (s.float8_all_gather ? "+all-gather" : "");
}

bool set_float8(Strategy& s, const std::string& v, const Cluster&) {
  const std::string suffix = "+all-gather";
  const bool all_gather = v.size() > suffix.size() && v.compare(v.size() - suffix.size(), suffix.size(), suffix) == 0;
  if (!parse_float8(all_gather ? v.substr(0, v.size() - suffix.size()) : v, s.float8)) return false;
  s.float8_all_gather = all_gather;
  return true;
}

bool set_lora_targets(Strategy& s, const std::string& v, const Cluster&) {
  s.lora.target_modules = split(v, ',');
  return !s.lora.target_modules.empty();
}

const std::vector<Knob> kKnobs{
    {"strategy", "--strategy", true, always,
     [](const Strategy& s, const Cluster&) { return std::string(to_string(s.kind)); }, set_kind},
    // "node": a shard group of one node's GPUs (FSDP1 HYBRID_SHARD shards within a node).
    {"hsdp_group", "--hsdp-group", true, is_hsdp,
     [](const Strategy& s, const Cluster& c) {
       return s.hsdp_group == c.gpus_per_node ? std::string("node") : std::to_string(s.hsdp_group);
     },
     [](Strategy& s, const std::string& v, const Cluster& c) {
       if (v == "node") {
         s.hsdp_group = c.gpus_per_node;
         return true;
       }
       return parse_count(v, s.hsdp_group) && s.hsdp_group > 0;
     }},
    {"wrap", "--wrap", true, sharded, [](const Strategy& s, const Cluster&) { return to_string(s.wrap); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_wrap(v, s.wrap); }},
    {"reshard_after_forward", "--reshard-after-forward", true, reshard_applies,
     [](const Strategy& s, const Cluster&) { return std::string(s.reshard_after_forward ? "true" : "false"); },
     [](Strategy& s, const std::string& v, const Cluster&) {
       if (v != "true" && v != "false") return false;
       s.reshard_after_forward = v == "true";
       return true;
     }},
    {"act_ckpt", "--act-ckpt", true, always, [](const Strategy& s, const Cluster&) { return act_ckpt_name(s); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_act_ckpt(v, s); }},
    {"offload", "--offload", true, always,
     [](const Strategy& s, const Cluster&) { return std::string(to_string(s.offload)); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_offload(v, s.offload); }},
    // param / reduce / master dtypes as one value: a target's precision settings fix them together.
    {"dtypes", "--param-dtype", true, always, dtypes_value, set_dtypes},
    {"grad_sync", "--grad-sync", false, grad_sync_applies,
     [](const Strategy& s, const Cluster&) { return std::string(to_string(s.grad_sync)); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_grad_sync(v, s.grad_sync); }},
    {"forward_prefetch", "--forward-prefetch", false, sharded,
     [](const Strategy& s, const Cluster&) { return std::to_string(s.forward_prefetch); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_count(v, s.forward_prefetch); }},
    {"backward_prefetch", "--backward-prefetch", false, sharded,
     [](const Strategy& s, const Cluster&) { return std::to_string(s.backward_prefetch); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_count(v, s.backward_prefetch); }},
    {"ddp_bucket_mb", "--ddp-bucket-mb", false, is_ddp,
     [](const Strategy& s, const Cluster&) { return std::to_string(s.ddp_bucket_mb); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_count(v, s.ddp_bucket_mb); }},
    {"method", "--method", false, always,
     [](const Strategy& s, const Cluster&) { return std::string(to_string(s.method)); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_method(v, s.method); }},
    {"lora_targets", "--lora-targets", false, adapted,
     [](const Strategy& s, const Cluster&) { return join(s.lora.target_modules, ","); }, set_lora_targets},
    {"optimizer", "--optimizer", false, always,
     [](const Strategy& s, const Cluster&) { return std::string(to_string(s.optimizer)); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_optimizer(v, s.optimizer); }},
    {"attention", "--attention", false, always,
     [](const Strategy& s, const Cluster&) { return std::string(to_string(s.attention)); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_attention(v, s.attention); }},
    {"float8", "--float8", false, always, float8_value, set_float8},
    // Liger-Kernel's patches of the Hugging Face model (Strategy::kernels): checked where the plan patches them in.
    {"kernels", "--kernels", false, [](const Strategy& s) { return s.kernels != KernelLibrary::None; },
     [](const Strategy& s, const Cluster&) { return std::string(to_string(s.kernels)); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_kernel_library(v, s.kernels); }},
    // A vision-language model's frozen vision parts (Strategy::train_vision): a target expresses them where its
    // launch config names what trains; checked where a part is frozen (`all` is every model's).
    {"train_vision", "--train-vision", false, [](const Strategy& s) { return s.train_vision != VisionTraining::All; },
     [](const Strategy& s, const Cluster&) { return std::string(to_string(s.train_vision)); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_vision_training(v, s.train_vision); }},
    // The mesh beyond data parallelism (strategy/mesh.hpp).
    {"tp", "--tp", true, always, [](const Strategy& s, const Cluster&) { return std::to_string(s.mesh.tp); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_count(v, s.mesh.tp) && s.mesh.tp > 0; }},
    {"sequence_parallel", "--sequence-parallel", false, tensor_parallel,
     [](const Strategy& s, const Cluster&) { return std::string(s.mesh.sequence_parallel ? "true" : "false"); },
     [](Strategy& s, const std::string& v, const Cluster&) { return set_flag(s.mesh.sequence_parallel, v); }},
    {"async_tp", "--async-tp", false, tensor_parallel,
     [](const Strategy& s, const Cluster&) { return std::string(s.mesh.async_tp ? "true" : "false"); },
     [](Strategy& s, const std::string& v, const Cluster&) { return set_flag(s.mesh.async_tp, v); }},
    {"pp", "--pp", true, always, [](const Strategy& s, const Cluster&) { return std::to_string(s.mesh.pp); },
     [](Strategy& s, const std::string& v, const Cluster&) {
       if (!parse_count(v, s.mesh.pp) || s.mesh.pp <= 0) return false;
       if (s.mesh.pp == 1) s.mesh.pp_virtual_stages = 1;
       return true;
     }},
    {"ep", "--ep", true, always, [](const Strategy& s, const Cluster&) { return std::to_string(s.mesh.ep); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_count(v, s.mesh.ep) && s.mesh.ep > 0; }},
    // Packed documents attended one by one (Strategy::doc_len): checked where the plan packs them.
    {"doc_len", "--doc-len", false, [](const Strategy& s) { return s.doc_len > 0; },
     [](const Strategy& s, const Cluster&) { return std::to_string(s.doc_len); },
     [](Strategy& s, const std::string& v, const Cluster&) { return parse_count(v, s.doc_len) && s.doc_len >= 0; }},
    {"pp_schedule", "--pp-schedule", false, pipelined,
     [](const Strategy& s, const Cluster&) { return std::string(to_string(s.mesh.pp_schedule)); },
     [](Strategy& s, const std::string& v, const Cluster&) {
       if (!parse_pipeline_schedule(v, s.mesh.pp_schedule)) return false;
       if (s.mesh.pp_schedule != PipelineSchedule::Interleaved1F1B) s.mesh.pp_virtual_stages = 1;
       return true;
     }},
};

bool lora_targets_admitted(const KnobRule& rule, const std::string& value) {
  const auto modules = split(value, ',');
  for (const auto& m : modules)
    if (std::find(rule.values.begin(), rule.values.end(), m) == rule.values.end()) return false;
  for (const auto& group : rule.together) {
    const auto n = std::count_if(group.begin(), group.end(), [&](const std::string& g) {
      return std::find(modules.begin(), modules.end(), g) != modules.end();
    });
    if (n != 0 && n != static_cast<long>(group.size())) return false;
  }
  return !modules.empty();
}

// The nearest admitted module list: the admitted modules kept, a partly adapted group completed.
std::string nearest_lora_targets(const KnobRule& rule, const std::string& value) {
  std::vector<std::string> kept;
  for (const auto& m : split(value, ','))
    if (std::find(rule.values.begin(), rule.values.end(), m) != rule.values.end()) kept.push_back(m);
  for (const auto& group : rule.together) {
    const bool any = std::any_of(group.begin(), group.end(), [&](const std::string& g) {
      return std::find(kept.begin(), kept.end(), g) != kept.end();
    });
    if (any)
      for (const auto& g : group)
        if (std::find(kept.begin(), kept.end(), g) == kept.end()) kept.push_back(g);
  }
  if (kept.empty()) kept.push_back(rule.values.front());
  return join(kept, ",");
}

}  // namespace

const std::vector<Knob>& knob_table() { return kKnobs; }

const std::vector<std::string>& knob_samples(const std::string& knob) {
  static const std::map<std::string, std::vector<std::string>> samples{
      {"strategy", {"ddp", "no-shard", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "hsdp"}},
      {"hsdp_group", {"node", "4"}},
      {"wrap", {"layer", "every:2", "size:100000000", "model"}},
      {"reshard_after_forward", {"true", "false"}},
      {"act_ckpt", {"none", "full", "selective", "selective-op", "every:2", "fraction:0.5"}},
      {"offload", {"none", "optimizer", "params"}},
      {"dtypes", {"bf16/fp32/fp32", "bf16/bf16/fp32", "bf16/bf16/bf16", "fp32/fp32/fp32"}},
      {"grad_sync", {"every-micro-batch", "last-micro-batch"}},
      {"forward_prefetch", {"0", "1", "2"}},
      {"backward_prefetch", {"0", "1", "2"}},
      {"ddp_bucket_mb", {"25", "100"}},
      {"method", {"full", "lora", "qlora"}},
      {"lora_targets", {"q_proj,v_proj", "q_proj,k_proj,v_proj,o_proj", "q_proj,gate_proj", "q_proj,fc1"}},
      {"optimizer", {"adamw", "sgd"}},
      {"attention", {"flash", "sdpa", "eager"}},
      {"float8", {"none", "tensorwise", "tensorwise+all-gather", "rowwise"}},
      {"kernels", {"none", "liger"}},
      {"train_vision", {"all", "projector", "none"}},
      {"tp", {"1", "2", "8"}},
      {"sequence_parallel", {"true", "false"}},
      {"async_tp", {"true", "false"}},
      {"pp", {"1", "2", "4"}},
      {"pp_schedule", {"gpipe", "1f1b", "interleaved-1f1b"}},
      {"ep", {"1", "2", "8"}},
      {"doc_len", {"0", "512"}},
  };
  auto it = samples.find(knob);
  FSDP_ASSERT(it != samples.end(), "knob " + knob + " has no samples");
  return it->second;
}

std::string sample_label(const std::string& knob, const std::string& sample) {
  if (sample == "any") return "any";
  if (sample.rfind("every:", 0) == 0) return "every:N";
  if (sample.rfind("fraction:", 0) == 0) return "fraction:P";
  if (sample.rfind("size:", 0) == 0) return "size:N";
  if (knob == "hsdp_group" && sample != "node") return "other";
  if (knob == "ddp_bucket_mb" && sample != "25") return "other";
  if ((knob == "tp" || knob == "pp" || knob == "ep") && sample != "1") return "> 1";
  if (knob == "doc_len" && sample != "0") return "> 0";
  return sample;
}

const Knob* find_knob(const std::string& name) {
  for (const Knob& k : kKnobs)
    if (name == k.name) return &k;
  return nullptr;
}

bool rule_admits(const KnobRule& rule, const std::string& value) {
  if (rule.knob == "lora_targets") return lora_targets_admitted(rule, value);
  for (const std::string& v : rule.values) {
    if (v == value || v == "any") return true;
    if ((v == "every:N" && value.rfind("every:", 0) == 0) || (v == "size:N" && value.rfind("size:", 0) == 0) ||
        (v == "fraction:P" && value.rfind("fraction:", 0) == 0))
      return true;
  }
  return false;
}

std::string nearest_value(const KnobRule& rule, const std::string& value) {
  if (rule.knob == "lora_targets") return nearest_lora_targets(rule, value);
  auto it = rule.nearest.find(value);
  if (it == rule.nearest.end() && value.find(':') != std::string::npos)
    it = rule.nearest.find(value.substr(0, value.find(':')) + ":N");
  return it != rule.nearest.end() ? it->second : rule.values.front();
}

std::string KnobViolation::message() const {
  return knob + " " + value + ": " + rule->why + " (expresses " + join(rule->values, ", ") + "; " +
         rule->source.text() + ")";
}

std::vector<KnobViolation> inexpressible(const TargetSpec& spec, const Strategy& s, const Cluster& c) {
  std::vector<KnobViolation> out;
  for (const Knob& k : kKnobs) {
    const KnobRule* rule = spec.rule(k.name, s.kind);
    if (!rule || !k.applies(s)) continue;
    const std::string v = k.value(s, c);
    if (!rule_admits(*rule, v)) out.push_back({k.name, v, rule});
  }
  return out;
}

Strategy nearest_expressible(const TargetSpec& spec, Strategy s, const Cluster& c) {
  constexpr int kMaxPasses = 8;  // a kind change can make one more knob apply; no chain is longer than the table
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    const auto violations = inexpressible(spec, s, c);
    if (violations.empty()) return s;
    for (const KnobViolation& v : violations) {
      const Knob* k = find_knob(v.knob);
      const std::string to = nearest_value(*v.rule, v.value);
      if (!k->set(s, to, c))
        throw InputError(spec.spec_path + ": capabilities." + v.knob + ": nearest value '" + to +
                         "' is not a value fsdp-plan can set");
    }
  }
  FSDP_ASSERT(false, "nearest_expressible did not converge for " + spec.target + " " + spec.version);
  return s;
}

}  // namespace fsdp
