// The host's issue time of an eager runtime on a GPU (runtime section host_issue, RuntimeProfile HostIssue): what each
// op charges (timeline.hpp host_issue_seconds), the timeline's host-bound ops (an op ends no earlier than the host
// has issued it, the host running ahead of the device), the section's strict parsing and its scope.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.hpp"
#include "sim_fixtures.hpp"
#include "timeline/timeline.hpp"

using namespace fsdp;
using namespace fsdp::test;

namespace {

const ModuleGraph& llama8b() {
  static const ModuleGraph g(zoo("llama3-8b"));
  return g;
}

// Llama 3 8B (32 decoder layers) under DDP with tp 2 and sequence parallelism on one node of two GPUs (dp 1), one
// sequence of 4096 tokens per micro-batch.
Strategy tp2(int64_t grad_accum, int64_t tp = 2) {
  Strategy s;
  s.kind = StrategyKind::Ddp;
  s.seq_len = 4096;
  s.micro_batch = 1;
  s.grad_accum = grad_accum;
  s.mesh.tp = tp;
  s.mesh.sequence_parallel = tp > 1;
  return s;
}

// nanotron's profile with a host issue time far above any op's device time: 1 s per layer forward, 2 s per layer
// backward, 0.5 s and 1 s for the embedding + head + loss.
RuntimeProfile slow_host(bool tensor_parallel_only) {
  RuntimeProfile rt = runtime("nanotron");
  rt.host_issue.layer_forward = Seconds{1.0};
  rt.host_issue.layer_backward = Seconds{2.0};
  rt.host_issue.head_forward = Seconds{0.5};
  rt.host_issue.head_backward = Seconds{1.0};
  rt.host_issue.tensor_parallel_only = tensor_parallel_only;
  return rt;
}

RuntimeProfile no_host_issue() {
  RuntimeProfile rt = runtime("nanotron");
  rt.host_issue = HostIssue{};
  return rt;
}

TimelineResult run(const RuntimeProfile& rt, const Strategy& s, const std::string& hw_name = "h100-80gb") {
  const HardwareProfile hw = hardware(hw_name);
  const Cluster c{1, 2};
  const StepProgram p = program(llama8b(), s, rt, 1, 2);
  return run_timeline(p, hw, c, s);
}

// The end of the last op the host charges (the backward of layer 0) in a timeline of program p.
double last_charged_end(const StepProgram& p, const TimelineResult& r, const Strategy& s) {
  double end = 0;
  for (size_t i = 0; i < p.ops.size(); ++i)
    if (host_issue_seconds(p.ops[i], p, s) > 0) end = std::max(end, r.ops[i].end);
  return end;
}

// The nanotron profile with `text` appended, written to a scratch file; the loader's message ("" when it loads).
std::string load_error_with(const std::string& text) {
  const std::string body = runtime_text("nanotron");
  const size_t at = body.find("\nhost_issue:");
  REQUIRE(at != std::string::npos);
  return runtime_load_error(body.substr(0, at + 1) + text, "host-issue");
}

}  // namespace

TEST_CASE("host issue: nanotron's profile, the section parsed strictly") {
  const RuntimeProfile rt = runtime("nanotron");
  // configs/runtimes/nanotron.yaml: 4.39 ms per decoder layer forward + backward, split 1 : 2; 3.27 ms for the head.
  CHECK(rt.host_issue.layer_forward.value == doctest::Approx(1.463e-3));
  CHECK(rt.host_issue.layer_backward.value == doctest::Approx(2.925e-3));
  CHECK(rt.host_issue.head_forward.value + rt.host_issue.head_backward.value == doctest::Approx(3.27e-3));
  CHECK(rt.host_issue.tensor_parallel_only);
  // The other runtimes say nothing: no host issue time.
  for (const char* name : {"pytorch", "torchtitan", "fsdp-run", "deepspeed"}) CHECK(runtime(name).host_issue.empty());
  const std::string whole =
      "host_issue:\n  layer_forward: \"1 ms\"\n  layer_backward: \"2 ms\"\n  head_forward: \"1 ms\"\n"
      "  head_backward: \"1 ms\"\n  scope: all\n";
  CHECK(load_error_with(whole).empty());
  CHECK(load_error_with(whole + "  per_op: \"30 us\"\n").find("per_op") != std::string::npos);
  std::string bad_scope = whole;
  bad_scope.replace(bad_scope.find("scope: all"), 10, "scope: some");
  CHECK(load_error_with(bad_scope).find("scope") != std::string::npos);
  std::string no_unit = whole;
  no_unit.replace(no_unit.find("\"2 ms\""), 6, "2");
  CHECK(load_error_with(no_unit).find("layer_backward") != std::string::npos);
  // A profile written whole gives every key of the section.
  std::string missing = whole;
  missing.erase(missing.find("  head_backward"), std::string("  head_backward: \"1 ms\"\n").size());
  CHECK(load_error_with(missing).find("head_backward") != std::string::npos);
}

TEST_CASE("host issue: what each op charges, per layer and pass") {
  const RuntimeProfile rt = slow_host(true);
  const Strategy s = tp2(1);
  const StepProgram p = program(llama8b(), s, rt, 1, 2);
  double forward = 0, backward = 0, head = 0, others = 0;
  for (const Op& op : p.ops) {
    const double h = host_issue_seconds(op, p, s);
    if (op.kind == OpKind::Forward) forward += h;
    if (op.kind == OpKind::Backward) backward += h;
    if (op.kind == OpKind::Loss || op.kind == OpKind::LossBackward) head += h;
    if (op.stream != Stream::Compute) others += h;
  }
  // 32 layers: 32 x 1 s forward, 32 x 2 s backward; the head 0.5 + 1 s; collectives nothing.
  CHECK(forward == doctest::Approx(32.0));
  CHECK(backward == doctest::Approx(64.0));
  CHECK(head == doctest::Approx(1.5));
  CHECK(others == 0);
  // Full checkpointing issues each layer's forward again in its backward: 32 x (2 + 1) s.
  Strategy ckpt = s;
  ckpt.act_ckpt = ActCkpt::Full;
  const StepProgram pc = program(llama8b(), ckpt, rt, 1, 2);
  double backward_ckpt = 0;
  for (const Op& op : pc.ops)
    if (op.kind == OpKind::Backward) backward_ckpt += host_issue_seconds(op, pc, ckpt);
  CHECK(backward_ckpt == doctest::Approx(96.0));
}

TEST_CASE("host issue: a host slower than the device paces the step, the device waiting in compute") {
  // One micro-batch: the host issues 32 x (1 + 2) + 0.5 + 1 = 97.5 s of passes; the device's ops take milliseconds,
  // so the last backward (layer 0's) ends when the host has issued it, at 97.5 s, and what follows it (the embedding's
  // backward, the tp collectives, the optimizer) takes what it took without the host's time.
  const Strategy s1 = tp2(1);
  const RuntimeProfile slow = slow_host(true), none = no_host_issue();
  const StepProgram p_slow = program(llama8b(), s1, slow, 1, 2), p_none = program(llama8b(), s1, none, 1, 2);
  const HardwareProfile hw = hardware("h100-80gb");
  const TimelineResult a = run_timeline(p_slow, hw, Cluster{1, 2}, s1);
  const TimelineResult b = run_timeline(p_none, hw, Cluster{1, 2}, s1);
  CHECK(last_charged_end(p_slow, a, s1) == doctest::Approx(97.5));
  // p_none charges nothing: its last backward of a layer is found with the slow profile's charges.
  double b_last = 0;
  for (size_t i = 0; i < p_none.ops.size(); ++i)
    if (host_issue_seconds(p_slow.ops[i], p_slow, s1) > 0) b_last = std::max(b_last, b.ops[i].end);
  REQUIRE(b_last > 0);
  REQUIRE(b_last < 1.0);
  CHECK(a.step_s - 97.5 == doctest::Approx(b.step_s - b_last).epsilon(1e-9));
  // The wait is compute time, not exposed communication: the exposed comm is what it was.
  CHECK(a.host_wait_s == doctest::Approx(a.step_s - b.step_s).epsilon(1e-9));
  CHECK(a.compute_s - b.compute_s == doctest::Approx(a.host_wait_s).epsilon(1e-9));
  CHECK(a.exposed_comm_s == doctest::Approx(b.exposed_comm_s).epsilon(1e-9));
  CHECK(b.host_wait_s == 0);
  // Each further micro-batch costs the host's 97.5 s (the representative middle one repeated): 8 against 1, 7 x.
  const TimelineResult a8 = run(slow, tp2(8));
  CHECK(a8.step_s - a.step_s == doctest::Approx(7 * 97.5).epsilon(1e-6));
}

TEST_CASE("host issue: a host faster than the device hides under it; scope and CPU devices charge nothing") {
  // nanotron's own 4.4 ms a layer under an 8B layer's device time at 2 x 4096 tokens and tp 2 (about 10 ms forward
  // and backward on an H100): the host runs ahead, only the step's first passes may wait for it.
  Strategy two = tp2(4);
  two.micro_batch = 2;
  const TimelineResult real = run(runtime("nanotron"), two), none = run(no_host_issue(), two);
  CHECK(real.step_s - none.step_s < 2e-3);
  CHECK(real.step_s >= none.step_s);
  // Scope tensor-parallel: a tp 1 mesh is charged nothing; scope all charges it.
  const Strategy dp1 = tp2(1, 1);
  const TimelineResult tp_only = run(slow_host(true), dp1), base = run(no_host_issue(), dp1);
  CHECK(tp_only.step_s == doctest::Approx(base.step_s).epsilon(1e-12));
  CHECK(run(slow_host(false), dp1).step_s > base.step_s + 90.0);
  // A CPU device: the host's time is its compute (HostOverhead), the runtime's issue time not added.
  const TimelineResult cpu_slow = run(slow_host(true), tp2(1), "cpu"), cpu_none = run(no_host_issue(), tp2(1), "cpu");
  CHECK(cpu_slow.step_s == doctest::Approx(cpu_none.step_s).epsilon(1e-12));
}
