#include "program/step_trace.hpp"

#include <algorithm>
#include <cstdio>

#include "core/errors.hpp"
#include "program/pipeline_parallel.hpp"
#include "program/step_program.hpp"

namespace fsdp {

bool operator==(const TraceEntry& a, const TraceEntry& b) {
  if (a.collective != b.collective || a.phase != b.phase || a.unit != b.unit || a.micro_batch != b.micro_batch)
    return false;
  if (!a.is_collective()) return true;
  return a.group == b.group && a.group_size == b.group_size && a.dtype == b.dtype && a.bytes == b.bytes;
}

namespace {

// The unit ops a runtime observes: its hooks around a unit's forward and backward, the reshard after
// forward, and the loss ops.
bool is_unit_op(const Op& op) {
  switch (op.phase) {
    case Phase::Forward:
    case Phase::Free:
    case Phase::Backward:
    case Phase::PostBackward:
    case Phase::HeadLossForward:
    case Phase::LossBackward:
      return op.stream == Stream::Compute;
    default:
      return false;
  }
}

TraceEntry entry_of(const StepProgram& p, const Op& op) {
  TraceEntry e;
  e.collective = op.collective;
  e.phase = op.phase;
  e.unit = phase_has_unit(op.phase) ? op.unit : -1;
  e.micro_batch = is_step_phase(op.phase) ? -1 : op.micro_batch;
  if (op.collective != CollectiveKind::None) {
    e.group = op.group;
    e.group_size = p.layout.group_size(op.group);
    e.dtype = op.comm_dtype;
    e.bytes = static_cast<int64_t>(op.comm_bytes);
  }
  return e;
}

// Ops that stand for several calls of one pass (Op::comm_calls): a unit's tensor-parallel collectives of one
// direction, one op per kind (program/tensor_parallel.hpp), issued in turn as the runtime issues them.
bool same_pass(const Op& a, const Op& b) {
  return a.kind == OpKind::TpCollective && b.kind == OpKind::TpCollective && a.unit == b.unit &&
         a.micro_batch == b.micro_batch && a.phase == b.phase && a.tp_head == b.tp_head;
}

// A micro-batch's ops up to its forward's end (the activations sent on, or the loss computed) belong to its forward
// pass; the rest (the gradient received, the backward, the reductions) to its backward pass.
bool forward_pass_phase(Phase ph) {
  switch (ph) {
    case Phase::FwdAllGather:
    case Phase::Forward:
    case Phase::Free:
    case Phase::HeadLossForward:
    case Phase::TpForwardCollectives:
    case Phase::TpLossAllReduce:
    case Phase::PipelineRecvActivations:
    case Phase::PipelineSendActivations:
      return true;
    default:
      return false;
  }
}

// The program's op indices in the order the stage's pipeline schedule runs its passes. The program emits each
// micro-batch's forward and backward one after the other; a stage runs them as its schedule says: GPipe every
// forward, then every backward; 1F1B (Narayanan et al. 2021, PipeDream-Flush; torch.distributed.pipelining
// Schedule1F1B, fsdp-run's run_micro_batches) pp - stage - 1 forwards, then one forward and one backward in turn,
// then the remaining backwards. The step's own ops (no micro-batch) keep their place before the first pass or after
// the last. Interleaved 1F1B and a single stage keep the program's order.
std::vector<size_t> schedule_order(const StepProgram& p) {
  std::vector<size_t> order(p.ops.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const StepLayout& l = p.layout;
  if (!pipeline_orders_passes(l.pp_schedule, l.pp)) return order;
  int K = 0;
  for (const Op& op : p.ops)
    if (!is_step_phase(op.phase)) K = std::max(K, op.micro_batch + 1);
  if (K == 0) return order;
  // Each emitted micro-batch's two passes, and the step's ops before the first pass and after it.
  std::vector<std::vector<size_t>> fwd(static_cast<size_t>(K)), bwd(static_cast<size_t>(K));
  std::vector<size_t> before, after;
  bool started = false;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    if (is_step_phase(op.phase)) {
      (started ? after : before).push_back(i);
      continue;
    }
    started = true;
    (forward_pass_phase(op.phase) ? fwd : bwd)[static_cast<size_t>(op.micro_batch)].push_back(i);
  }
  const int warmup = static_cast<int>(pipeline_warmup(l.pp_schedule, l.pp, l.stage, K));
  std::vector<std::pair<bool, int>> passes;  // (forward, micro-batch) in the schedule's order
  for (int k = 0; k < warmup; ++k) passes.push_back({true, k});
  for (int k = warmup; k < K; ++k) {
    passes.push_back({true, k});
    passes.push_back({false, k - warmup});
  }
  for (int k = K - warmup; k < K; ++k) passes.push_back({false, k});
  order = before;
  for (const auto& [forward, k] : passes) {
    const std::vector<size_t>& ops = (forward ? fwd : bwd)[static_cast<size_t>(k)];
    order.insert(order.end(), ops.begin(), ops.end());
  }
  order.insert(order.end(), after.begin(), after.end());
  return order;
}

}  // namespace

std::vector<TraceEntry> program_trace(const StepProgram& p) {
  std::vector<TraceEntry> out;
  const std::vector<size_t> order = schedule_order(p);
  for (size_t j = 0; j < order.size(); ++j) {
    const size_t i = order[j];
    const Op& op = p.ops[i];
    const bool collective = op.collective != CollectiveKind::None;
    if (!collective && !is_unit_op(op)) continue;
    if (!collective) {
      const TraceEntry e = entry_of(p, op);
      if (!out.empty() && out.back() == e) continue;  // one unit's backward emitted layer by layer
      out.push_back(e);
      continue;
    }
    // One entry per call. The ops of one pass take turns, a call each: a layer's collectives alternate between
    // the blocks' kinds (with sequence parallelism the attention's gather, its reduce-scatter, the MLP's gather,
    // its reduce-scatter: Korthikanti et al. 2022 Fig. 5; fsdp-run's GatherSeq / ScatterSeq), and a checkpointed
    // layer's recomputed forward issues the same pattern before its backward's.
    size_t end = j + 1;
    while (end < order.size() && same_pass(op, p.ops[order[end]])) ++end;
    std::vector<int> left;
    for (size_t k = j; k < end; ++k) left.push_back(std::max(1, p.ops[order[k]].comm_calls));
    for (bool any = true; any;) {
      any = false;
      for (size_t k = j; k < end; ++k) {
        if (left[k - j] == 0) continue;
        --left[k - j];
        out.push_back(entry_of(p, p.ops[order[k]]));
        any = true;
      }
    }
    j = end - 1;
  }
  return out;
}

std::vector<int> emitted_micro_batches(int64_t grad_accum) {
  FSDP_ASSERT(grad_accum >= 1, "grad_accum >= 1");
  const int K = static_cast<int>(grad_accum);
  std::vector<int> m{0};
  if (K >= 3) m.push_back(1);
  if (K >= 2) m.push_back(K - 1);
  return m;
}

std::string describe(const TraceEntry& e, const std::vector<std::string>& unit_names) {
  std::string s = e.is_collective() ? std::string(to_string(e.collective)) : std::string("op");
  if (e.is_collective()) {
    char b[96];
    std::snprintf(b, sizeof b, " %s[%lld] %s %lld B", to_string(e.group), static_cast<long long>(e.group_size),
                  to_string(e.dtype), static_cast<long long>(e.bytes));
    s += b;
  }
  s += std::string(" ") + to_string(e.phase);
  if (e.unit >= 0)
    s += " " + (static_cast<size_t>(e.unit) < unit_names.size() ? unit_names[static_cast<size_t>(e.unit)]
                                                                : "unit " + std::to_string(e.unit));
  if (e.micro_batch >= 0) s += " (micro-batch " + std::to_string(e.micro_batch + 1) + ")";
  return s;
}

nlohmann::json trace_entry_json(const TraceEntry& e) {
  nlohmann::json j{{"phase", to_string(e.phase)}, {"unit", e.unit}, {"micro_batch", e.micro_batch}};
  if (e.is_collective()) {
    j["collective"] = to_string(e.collective);
    j["group"] = to_string(e.group);
    j["group_size"] = e.group_size;
    j["dtype"] = to_string(e.dtype);
    j["bytes"] = e.bytes;
  }
  return j;
}

TraceEntry trace_entry_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where + ": a trace entry is not an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    static const char* kKeys[] = {"phase", "unit",       "micro_batch", "collective",
                                  "group", "group_size", "dtype",       "bytes"};
    bool known = false;
    for (const char* k : kKeys) known = known || it.key() == k;
    if (!known) throw InputError(where + ": unknown key '" + it.key() + "' in a trace entry");
  }
  auto str = [&](const char* key) {
    if (!j.contains(key) || !j.at(key).is_string())
      throw InputError(where + ": trace entry key '" + key + "' is missing or not a string");
    return j.at(key).get<std::string>();
  };
  auto integer = [&](const char* key) {
    if (!j.contains(key) || !j.at(key).is_number_integer())
      throw InputError(where + ": trace entry key '" + key + "' is missing or not an integer");
    return j.at(key).get<int64_t>();
  };
  auto bad = [&](const char* key, const std::string& v) {
    return InputError(where + ": trace entry key '" + key + "' has the unknown value '" + v + "'");
  };
  TraceEntry e;
  const std::string phase = str("phase");
  auto ph = phase_from_string(phase);
  if (!ph) throw bad("phase", phase);
  e.phase = *ph;
  e.unit = static_cast<int>(integer("unit"));
  e.micro_batch = static_cast<int>(integer("micro_batch"));
  if (!j.contains("collective")) return e;
  const std::string c = str("collective");
  auto ck = collective_kind_from_string(c);
  if (!ck || *ck == CollectiveKind::None) throw bad("collective", c);
  e.collective = *ck;
  const std::string g = str("group");
  auto gk = group_kind_from_string(g);
  if (!gk) throw bad("group", g);
  e.group = *gk;
  const std::string d = str("dtype");
  auto wt = wire_type_from_string(d);
  if (!wt) throw bad("dtype", d);
  e.dtype = *wt;
  e.group_size = integer("group_size");
  e.bytes = integer("bytes");
  return e;
}

}  // namespace fsdp
