#include "train/trainer.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <ostream>

#include "core/errors.hpp"
#include "dist/comm.hpp"
#include "dist/device.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_lock.hpp"
#include "io/data.hpp"
#include "model/transformer.hpp"
#include "shard/mesh.hpp"
#include "shard/sharded_model.hpp"
#include "simulate.hpp"
#include "train/mem_tracker.hpp"
#include "train/pipeline.hpp"

namespace fsdp::exec {

// torch.cuda.amp.GradScaler defaults (torch/amp/grad_scaler.py): init_scale 2^16,
// growth_factor 2, backoff_factor 0.5, growth_interval 2000.
constexpr double kInitLossScale = 65536.0;
constexpr double kScaleGrowth = 2.0;
constexpr double kScaleBackoff = 0.5;
constexpr int64_t kScaleGrowthInterval = 2000;

struct Trainer::Impl {
  PlanFile plan;
  RunConfig cfg;
  Comm& comm;
  std::string device = "cpu";
  int world = 1;  // data-parallel ranks the plan describes (world / (tp x pp))
  std::unique_ptr<ShardedModel> model;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<CheckpointLock> lock;  // rank 0, while it writes checkpoints
  double loss_scale = 1.0;
  int64_t good_steps = 0;
  int64_t start_step = 0;

  Impl(const PlanFile& p, const RunConfig& c, Comm& cm) : plan(p), cfg(c), comm(cm) {}

  // Notes and warnings go to stderr, once: rank 0's.
  std::ostream* notes() const { return comm.rank() == 0 ? &std::cerr : nullptr; }

  // Every rank's `mine` (int64 values), as rows [ranks, n]; through the device where the backend needs it (NCCL).
  at::Tensor gather(const at::Tensor& mine) {
    const int n = comm.size();
    at::Tensor all = at::zeros({n * mine.numel()}, at::kLong);
    if (device != "cpu") {
      at::Tensor md = mine.to(at::Device(device)), ad = all.to(at::Device(device));
      comm.world().all_gather(md, ad).wait();
      all = ad.cpu();
    } else {
      comm.world().all_gather(mine, all).wait();
    }
    return all.view({n, -1});
  }

  // Runs `check` here, then stops every rank together if any rank's check refused its input: that rank throws its
  // own InputError, the others one naming that rank, so no rank starts training beside one that refused.
  void check_on_every_rank(const std::function<void()>& check) {
    std::optional<InputError> refused;
    try {
      check();
    } catch (const InputError& e) {
      refused = e;
    }
    const at::Tensor all = gather(at::full({1}, refused ? 1 : 0, at::kLong));
    if (refused) throw *refused;
    for (int64_t r = 0; r < all.size(0); ++r)
      if (all[r][0].item<int64_t>() != 0)
        throw InputError("rank " + std::to_string(r) +
                         " refused its input before the first step (that rank's message says why)");
  }

  // The token file's ids, this rank's share of them (all of them where this process stands in for every rank).
  void check_data() {
    const int64_t n = data->num_tokens();
    const bool alone = comm.world().is_local();
    const int64_t parts = alone ? 1 : comm.size(), part = alone ? 0 : comm.rank();
    data->check_ids(n * part / parts, n * (part + 1) / parts, notes());
  }

  // What each rank can find wrong with its inputs before the first step.
  void check_inputs() {
    data = open_data(cfg.data, cfg.data_dtype, plan.model.vocab_size, plan.strategy.seq_len, cfg.seed);
    check_data();
    if (comm.rank() == 0 && !cfg.checkpoint_dir.empty()) {
      lock = std::make_unique<CheckpointLock>(cfg.checkpoint_dir, notes());
      check_free_space(cfg.checkpoint_dir, checkpoint_bytes(*model, comm.size()));
    }
  }
};

void check_plan_runnable(const PlanFile& plan) {
  const Strategy& s = plan.strategy;
  if (s.param_dtype == DType::Fp16 && plan.cluster.device == "cpu")
    throw InputError("fp16 compute is not supported on CPU by this LibTorch (no Half matmul); plan bf16 or fp32");
  if (s.micro_batch < 1 || s.seq_len < 1 || s.grad_accum < 1)
    throw InputError("plan strategy: micro_batch, seq_len and grad_accum must be >= 1");
  if (s.seq_len > plan.model.max_positions && plan.model.position_embedding == PositionEmbedding::Learned)
    throw InputError("plan strategy.seq_len exceeds the model's max_positions");
  check_trained_length(plan.model, s.seq_len, "plan strategy.seq_len");
  ShardedModel::check_supported(plan.model, s, static_cast<int>(plan.cluster.world_size()));
}

void check_run_config(const RunConfig& c) {
  // The newest checkpoint is never deleted: a run keeps at least it.
  if (c.keep_checkpoints < 1)
    throw InputError("--keep-checkpoints must be at least 1, got " + std::to_string(c.keep_checkpoints));
  token_element_bytes(c.data_dtype);  // a known element type, whether or not a file is read
  if (c.data == "synthetic" && c.data_dtype != "uint16")
    throw InputError("--data-dtype " + c.data_dtype +
                     " applies to a token file (--data FILE); synthetic data has none");
  // Files that must exist, checked before any rank starts (one message, not one per rank).
  if (c.data != "synthetic" && !std::ifstream(c.data)) throw InputError(c.data + ": cannot open token file (--data)");
  if (!c.init_from.empty() && !std::filesystem::exists(c.init_from))
    throw InputError(c.init_from + ": no such file or directory (--init-from)");
  if (!c.resume_dir.empty() && !std::filesystem::is_directory(c.resume_dir))
    throw InputError(c.resume_dir + ": no such checkpoint directory (--resume)");
  if (c.checkpoint_every > 0 && c.checkpoint_dir.empty())
    throw InputError("--checkpoint-every " + std::to_string(c.checkpoint_every) +
                     " needs --checkpoint-dir DIR (without it no checkpoint is written)");
  if (!c.checkpoint_dir.empty() && c.checkpoint_every <= 0)
    throw InputError("--checkpoint-dir " + c.checkpoint_dir +
                     " needs --checkpoint-every N >= 1 (without it no checkpoint is written)");
  if (!c.checkpoint_dir.empty() && c.emulate_world_size > 0)
    throw InputError("checkpoints cannot be written in --emulate-world-size rehearsal; drop --checkpoint-dir");
  if (c.resume_any && c.resume_dir.empty()) throw InputError("--resume-any needs --resume DIR");
}

Trainer::Trainer(const PlanFile& plan, const RunConfig& cfg, Comm& comm)
    : impl_(std::make_unique<Impl>(plan, cfg, comm)) {
  Impl& t = *impl_;
  const int64_t planned = plan.cluster.world_size();
  if (planned != comm.size())
    throw InputError("the plan is for world size " + std::to_string(planned) + " (" +
                     std::to_string(plan.cluster.nodes) + " nodes x " + std::to_string(plan.cluster.gpus_per_node) +
                     " per node) but this launch has world size " + std::to_string(comm.size()));
  t.device = select_device(plan.cluster.device, comm.local_rank());
  const Strategy& s = plan.strategy;
  check_plan_runnable(plan);
  check_run_config(cfg);
  t.loss_scale = s.param_dtype == DType::Fp16 ? kInitLossScale : 1.0;
  t.model = std::make_unique<ShardedModel>(plan.model, s, comm, MemTracker::instance(), t.device, cfg.seed);
  t.world = t.model->mesh().dp;
  comm.set_progress(0, "input checks");
  t.check_on_every_rank([&t] { t.check_inputs(); });
  if (!cfg.init_from.empty()) t.model->load_full_state(load_safetensors_weights(cfg.init_from, *t.model, t.notes()));
  if (!cfg.resume_dir.empty()) {
    ResumeState rs = load_checkpoint(cfg.resume_dir, comm, *t.model, plan, ResumeOptions{cfg.seed, cfg.resume_any});
    t.start_step = rs.step;
    t.loss_scale = rs.loss_scale > 0 ? rs.loss_scale : t.loss_scale;
    t.good_steps = rs.good_steps;
  }
}

Trainer::~Trainer() = default;
ShardedModel& Trainer::model() { return *impl_->model; }

RunResult Trainer::run(std::ostream* log) {
  Impl& t = *impl_;
  const Strategy& s = t.plan.strategy;
  const TrainingHyperparams& h = t.plan.training;
  OptimizerConfig oc;
  oc.kind = s.optimizer;
  oc.lr = h.lr;
  oc.beta1 = h.beta1;
  oc.beta2 = h.beta2;
  oc.eps = h.eps;
  oc.weight_decay = h.weight_decay;
  oc.momentum = h.momentum;
  const Mesh& mesh = t.model->mesh();
  const int rank = t.comm.rank();
  const int W = t.world;
  const int64_t b = s.micro_batch, K = s.grad_accum, T = s.seq_len;
  RunResult res;
  res.world_size = t.comm.size();
  res.emulated = t.comm.world().is_local() && t.comm.size() > 1;
  res.num_params = t.model->num_params();
  res.resumed_from = t.start_step;
  MemTracker& mem = MemTracker::instance();
  mem.reset_peak();  // the run's peak: from the built model on

  for (int64_t step = t.start_step + 1; step <= t.cfg.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    const double waited0 = Handle::blocked_seconds();
    t.comm.set_progress(step, "forward/backward");
    t.comm.trace().begin_step();
    // Data-parallel rank d of W reads rows (k*W + d)*b of micro-batch k: every tp rank and pipeline stage of a
    // data-parallel replica reads the same rows.
    std::vector<MicroBatch> batches;
    for (int64_t k = 0; k < K; ++k) {
      at::Tensor batch = t.data->rows(step, (k * W + mesh.dp_rank) * b, b);
      batches.push_back({batch.narrow(1, 0, T), batch.narrow(1, 1, T)});
    }
    mem.set_in_compute(true);
    // The micro-batches' losses summed on the device, read once per step (no host sync per micro-batch); on the
    // last pipeline stage only.
    at::Tensor loss_sum = run_micro_batches(*t.model, batches, t.loss_scale);
    mem.set_in_compute(false);
    const auto t_opt = std::chrono::steady_clock::now();
    t.comm.set_progress(step, "optimizer");
    mem.set_phase(to_string(Phase::GradientNorm));
    StepStat st;
    st.step = step;
    bool skip = false;
    if (s.param_dtype == DType::Fp16) {
      // Dynamic loss scaling (Micikevicius et al. 2018, arXiv:1710.03740; GradScaler semantics).
      if (t.model->grads_nonfinite()) {
        skip = true;
        t.loss_scale *= kScaleBackoff;
        t.good_steps = 0;
      } else {
        t.model->scale_grads(1.0 / t.loss_scale);
        if (++t.good_steps % kScaleGrowthInterval == 0) t.loss_scale *= kScaleGrowth;
      }
    }
    if (!skip) {
      st.grad_norm = t.model->clip_grad_norm(h.grad_clip);
      mem.set_phase(to_string(Phase::OptimizerStep));
      t.model->optimizer_step(oc, step);
    }
    st.skipped = skip;
    t.model->zero_grad();
    // Mean loss over the global batch: every data-parallel replica's micro-batches have the same token count. Its
    // loss is on the last pipeline stage, the same on every tp rank: one of them counts.
    const bool counts = mesh.last_stage() && mesh.tp_rank == 0;
    at::Tensor l = (loss_sum / static_cast<double>(K)).reshape({1}) * (counts ? 1.0 : 0.0);
    if (t.comm.size() > 1)
      t.comm.world().all_reduce_sum(l, CollectiveTag{Phase::LossAllReduce, GroupKind::Mesh, -1}).wait();
    t.comm.trace().end_step();
    // A local group (world 1 or rehearsal) did not sum anything.
    st.loss = l.item<double>() / (t.comm.world().is_local() ? 1.0 : static_cast<double>(W));
    auto t1 = std::chrono::steady_clock::now();
    st.time_s = std::chrono::duration<double>(t1 - t0).count();
    st.comm_wait_s = Handle::blocked_seconds() - waited0;
    st.optimizer_phase_s = std::chrono::duration<double>(t1 - t_opt).count();
    st.tokens_per_s = static_cast<double>(W * K * b * T) / st.time_s;
    res.steps.push_back(st);
    if (log && rank == 0 && (step % std::max<int64_t>(1, t.cfg.log_every) == 0 || step == t.cfg.steps)) {
      char line[256];
      std::snprintf(line, sizeof line, "step %lld  loss %.6f  tokens/s %.0f  step %.3f s  peak %.1f MiB%s\n",
                    static_cast<long long>(step), st.loss, st.tokens_per_s, st.time_s,
                    static_cast<double>(mem.peak()) / (1024.0 * 1024.0), skip ? "  (fp16 overflow: skipped)" : "");
      *log << line << std::flush;
    }
    if (!t.cfg.checkpoint_dir.empty() && t.cfg.checkpoint_every > 0 &&
        (step % t.cfg.checkpoint_every == 0 || step == t.cfg.steps)) {
      t.comm.set_progress(step, "checkpoint");
      CheckpointMeta meta;
      meta.step = step;
      meta.loss_scale = t.loss_scale;
      meta.good_steps = t.good_steps;
      meta.seed = t.cfg.seed;
      meta.data = t.data->describe();
      meta.plan_path = t.cfg.plan_path;
      save_checkpoint(t.cfg.checkpoint_dir, t.cfg.keep_checkpoints, meta, t.comm, *t.model, t.plan);
    }
  }

  // Memory: each rank's peak, gathered.
  at::Tensor mine = at::zeros({1 + static_cast<int64_t>(kNumMemoryCategories)}, at::kLong);
  mine[0] = mem.peak();
  auto bd = mem.peak_breakdown();
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i) mine[static_cast<int64_t>(i) + 1] = bd[i];
  at::Tensor all = t.gather(mine);
  if (res.emulated) all = all.narrow(0, 0, 1);  // only rank 0 really ran
  int best = 0;
  for (int r = 0; r < all.size(0); ++r) {
    res.peak_bytes_per_rank.push_back(all[r][0].item<int64_t>());
    if (res.peak_bytes_per_rank.back() > res.peak_bytes) {
      res.peak_bytes = res.peak_bytes_per_rank.back();
      best = r;
    }
  }
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    res.breakdown[i] = all[best][static_cast<int64_t>(i) + 1].item<int64_t>();
  res.peak_phase = mem.peak_phase();
  res.comm_upcast = t.model->comm_upcast();
  res.trace = t.comm.trace().entries();
  for (const UnitInfo& u : t.model->units()) res.unit_names.push_back(u.name);
  res.backend = t.comm.world().is_local() ? t.comm.world().name() : (t.device == "cpu" ? "gloo" : "nccl");
  res.loss_scale = s.param_dtype == DType::Fp16 ? t.loss_scale : 0;
  res.attention_planned = s.attention;
  res.attention_ran = executed_attention(s.attention);
  return res;
}

}  // namespace fsdp::exec
