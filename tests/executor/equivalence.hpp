// The equivalence checks of the multi-rank suite: train a plan in process, and compare a run with a reference run
// (losses, gradient norms, every gathered parameter).
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "dist/comm.hpp"
#include "shard/sharded_model.hpp"
#include "test_common.hpp"
#include "train/trainer.hpp"

namespace fsdp::exec::test {

struct Outcome {
  RunResult result;
  std::map<std::string, at::Tensor> params;
};

inline Outcome train(const PlanFile& plan, Comm& comm, int64_t steps = 5) {
  RunConfig cfg;
  cfg.steps = steps;
  cfg.seed = 7;
  Trainer t(plan, cfg, comm);
  Outcome o;
  o.result = t.run(nullptr);
  o.params = t.model().full_state_dict();
  return o;
}

// How far a run is from its reference: the largest relative difference (losses, gradient norms, each parameter's
// ||a - b|| / ||b||), and the largest absolute differences of a loss and of a parameter element.
struct Difference {
  double relative = 0, loss_abs = 0, param_abs = 0;
};

// Checks `got` against `ref` within `tol` (relative: losses, gradient norms, each parameter's ||a - b|| / ||b||).
inline Difference compare_runs(const Outcome& got, const Outcome& ref, const std::string& what, double tol = 1e-5) {
  INFO(what);
  REQUIRE(got.result.steps.size() == ref.result.steps.size());
  Difference d;
  for (std::size_t i = 0; i < ref.result.steps.size(); ++i) {
    const double l = got.result.steps[i].loss, r = ref.result.steps[i].loss;
    CHECK(std::abs(l - r) <= tol * std::abs(r));
    const double g = got.result.steps[i].grad_norm, rg = ref.result.steps[i].grad_norm;
    CHECK(std::abs(g - rg) <= tol * std::abs(rg));
    d.relative = std::max({d.relative, std::abs(l - r) / std::abs(r), std::abs(g - rg) / std::abs(rg)});
    d.loss_abs = std::max(d.loss_abs, std::abs(l - r));
  }
  REQUIRE(got.params.size() == ref.params.size());
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, t] : ref.params) {
    auto it = got.params.find(name);
    REQUIRE(it != got.params.end());
    REQUIRE(it->second.sizes() == t.sizes());
    const double e = rel_err(it->second, t);
    d.param_abs = std::max(d.param_abs, (it->second.to(at::kDouble) - t.to(at::kDouble)).abs().max().item<double>());
    if (e > worst) {
      worst = e;
      worst_name = name;
    }
  }
  INFO("worst parameter " << worst_name << " relative error " << worst);
  if (worst > tol) MESSAGE(what << ": worst parameter " << worst_name << " error " << worst);
  CHECK(worst <= tol);
  d.relative = std::max(d.relative, worst);
  return d;
}

inline double check_same(const Outcome& got, const Outcome& ref, const std::string& what, double tol = 1e-5) {
  return compare_runs(got, ref, what, tol).relative;
}

}  // namespace fsdp::exec::test
