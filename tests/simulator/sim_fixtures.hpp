// Shared helpers for simulator tests: load zoo models, runtimes and hardware from the source tree.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/errors.hpp"
#include "memory/memory_walk.hpp"
#include "model/model_loader.hpp"
#include "program/step_program.hpp"
#include "runtime/runtime_profile.hpp"
#include "simulate.hpp"

namespace fsdp::test {

inline const std::string& root() {
  static const std::string r = FSDP_SOURCE_ROOT;
  return r;
}

inline ModelSpec zoo(const std::string& name) { return load_model(name, root()); }
inline RuntimeProfile runtime(const std::string& name) { return load_runtime(name, root()); }

// The shipped runtime profile `name`'s text.
inline std::string runtime_text(const std::string& name) {
  std::ifstream in(root() + "/configs/runtimes/" + name + ".yaml");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// `yaml` written to a scratch file (`tag` in its name) and loaded as a runtime profile: the loader's message, "" when
// it loads.
inline std::string runtime_load_error(const std::string& yaml, const std::string& tag) {
  const auto path =
      std::filesystem::temp_directory_path() / ("fsdp-runtime-" + std::to_string(getpid()) + "-" + tag + ".yaml");
  std::ofstream(path) << yaml;
  std::string what;
  try {
    load_runtime(path.string(), root());
  } catch (const InputError& e) {
    what = e.what();
  }
  std::filesystem::remove(path);
  return what;
}
inline HardwareProfile hardware(const std::string& name) { return load_hardware(name, root()); }

inline StepProgram program(const ModuleGraph& g, const Strategy& s, const RuntimeProfile& rt, int64_t nodes,
                           int64_t gpus_per_node) {
  ProgramInput in;
  in.graph = &g;
  in.cluster = Cluster{nodes, gpus_per_node};
  in.strategy = s;
  in.runtime = &rt;
  return emit_step_program(in);
}

// The first op of `kind` (micro-batch 0's) in the program of plan `s` on one node of 8 GPUs; throws where there is none
// (a test failure).
inline Op node_op(const ModuleGraph& g, const Strategy& s, const RuntimeProfile& rt, OpKind kind) {
  const StepProgram p = program(g, s, rt, 1, 8);
  for (const Op& op : p.ops)
    if (op.kind == kind) return op;
  throw std::logic_error("the step program has no op of the kind asked for");
}

inline double cat(const MemoryBreakdown& b, MemoryCategory c) { return b[static_cast<size_t>(c)]; }

// FSDP with every layer checkpointed, the runtime's flash attention, `micro_batch` sequences of `seq` tokens.
inline Strategy fsdp_full_ckpt(int64_t micro_batch, int64_t seq) {
  Strategy s;
  s.kind = StrategyKind::Fsdp;
  s.act_ckpt = ActCkpt::Full;
  s.micro_batch = micro_batch;
  s.seq_len = seq;
  s.attention = AttentionImpl::Flash;
  return s;
}

// The InputError `f` throws, its message; "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Why the capability table refuses `s` on runtime `runtime_name` over one node of 8 GPUs; "" when it accepts it.
inline std::string refusal(const Strategy& s, const ModelSpec& m, const std::string& runtime_name) {
  return error_of([&] { validate_strategy(s, m, Cluster{1, 8}, runtime(runtime_name).support); });
}

// `s` must be refused under runtime profile `runtime_name` with a reason that names `flag` and the runtime.
inline void check_refused(const Strategy& s, const ModelSpec& m, const std::string& runtime_name,
                          const std::string& flag) {
  const std::string why = refusal(s, m, runtime_name);
  CAPTURE(why);
  CHECK(why.find(flag) != std::string::npos);
  CHECK(why.find(runtime_name) != std::string::npos);
}

// `s` checked and simulated on one node of 8 `hw_name` GPUs with runtime profile `rt`.
inline Prediction predict_node(const ModuleGraph& g, const Strategy& s, const std::string& hw_name,
                               const RuntimeProfile& rt) {
  const HardwareProfile hw = hardware(hw_name);
  SimulationInput in;
  in.graph = &g;
  in.hardware = &hw;
  in.runtime = &rt;
  in.cluster = Cluster{1, 8};
  in.strategy = s;
  validate_strategy(s, g.spec(), in.cluster, rt.support);
  return simulate(in);
}

// The same with the shipped runtime `runtime_name`.
inline Prediction predict_node(const ModuleGraph& g, const Strategy& s, const std::string& hw_name,
                               const std::string& runtime_name) {
  return predict_node(g, s, hw_name, runtime(runtime_name));
}

// fsdp_full_ckpt's one 8192-token sequence with attention `a` over documents of `doc_len` tokens (0: one document).
inline Strategy fsdp_8k(AttentionImpl a, int64_t doc_len = 0) {
  Strategy s = fsdp_full_ckpt(1, 8192);
  s.attention = a;
  s.doc_len = doc_len;
  return s;
}

// Whether the capability table accepts a plan (validate_strategy throws its first violation): grid tests skip the
// plans it refuses.
inline bool valid_plan(const Strategy& s, const ModelSpec& m, const Cluster& c) {
  try {
    validate_strategy(s, m, c);
  } catch (const InputError&) {
    return false;
  }
  return true;
}

}  // namespace fsdp::test
