#include "train/pipeline.hpp"

#include <ATen/ATen.h>

#include <deque>

#include "dist/comm.hpp"
#include "program/pipeline_parallel.hpp"
#include "shard/mesh.hpp"
#include "shard/sharded_model.hpp"

namespace fsdp::exec {

namespace {

// The point-to-point side of one stage. A send's buffer lives in its handle until the wait; a stage waits for its
// previous send in a direction before the next (one buffer in flight each way) and for both at the end. When a
// stage both sends to and receives from the same neighbour, the lower stage sends first and the higher receives
// first, so that the pair's transfers meet on backends that run them in issue order on one channel (NCCL).
class StageLinks {
 public:
  StageLinks(ShardedModel& model, int64_t rows, int64_t seq)
      : model_(model), mesh_(model.mesh()), shape_like_(model.stage_input(rows, seq)) {}
  ~StageLinks() {
    try {
      finish();
    } catch (...) {  // unwinding from a failed collective: its diagnosis is on its way
    }
  }
  bool first() const { return mesh_.first_stage(); }
  bool last() const { return mesh_.last_stage(); }

  // Each transfer is recorded under the micro-batch `k` (0-based) whose activations or gradients it carries.
  at::Tensor recv_forward(int64_t k) {
    if (first()) return {};
    at::Tensor t = fresh();
    model_.trace_micro_batch(k);
    group().recv(t, mesh_.pp_rank - 1, tag(Phase::PipelineRecvActivations)).wait();
    return t.requires_grad_(true);
  }
  void send_forward(const at::Tensor& out, int64_t k) {
    if (last()) return;
    fwd_send_.wait();
    model_.trace_micro_batch(k);
    fwd_send_ = group().send(out.detach().contiguous(), mesh_.pp_rank + 1, tag(Phase::PipelineSendActivations));
  }
  at::Tensor recv_backward(int64_t k) {
    if (last()) return {};
    at::Tensor t = fresh();
    model_.trace_micro_batch(k);
    group().recv(t, mesh_.pp_rank + 1, tag(Phase::PipelineRecvGradients)).wait();
    return t;
  }
  void send_backward(const at::Tensor& grad, int64_t k) {
    if (first()) return;
    bwd_send_.wait();
    model_.trace_micro_batch(k);
    bwd_send_ = group().send(grad.contiguous(), mesh_.pp_rank - 1, tag(Phase::PipelineSendGradients));
  }
  // This stage is the lower of the pair: send micro-batch `sent`'s output, then receive micro-batch `grad_of`'s
  // gradient.
  at::Tensor send_forward_recv_backward(const at::Tensor& out, int64_t sent, int64_t grad_of) {
    send_forward(out, sent);
    return recv_backward(grad_of);
  }
  // This stage is the higher of the pair: the receive of micro-batch `next`'s input posted first, then the send of
  // micro-batch `sent`'s input gradient.
  at::Tensor send_backward_recv_forward(const at::Tensor& grad, int64_t sent, int64_t next) {
    if (first()) return {};
    at::Tensor t = fresh();
    model_.trace_micro_batch(next);
    Handle h = group().recv(t, mesh_.pp_rank - 1, tag(Phase::PipelineRecvActivations));
    send_backward(grad, sent);
    h.wait();
    return t.requires_grad_(true);
  }
  void finish() {
    fwd_send_.wait();
    bwd_send_.wait();
  }

 private:
  Group& group() { return *mesh_.pp_group; }
  at::Tensor fresh() const { return at::empty_like(shape_like_); }
  static CollectiveTag tag(Phase p) { return CollectiveTag{p, GroupKind::Pipeline, -1}; }
  ShardedModel& model_;
  const Mesh& mesh_;
  at::Tensor shape_like_;
  Handle fwd_send_, bwd_send_;
};

}  // namespace

at::Tensor run_micro_batches(ShardedModel& model, const std::vector<MicroBatch>& batches, double loss_scale) {
  const auto K = static_cast<int64_t>(batches.size());
  const double per_loss = loss_scale / static_cast<double>(K);  // the mean over micro-batches
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(model.device()));
  const Mesh& mesh = model.mesh();
  if (mesh.pp == 1) {
    for (int64_t k = 0; k < K; ++k) {
      const MicroBatch& mb = batches[static_cast<std::size_t>(k)];
      at::Tensor loss = model.forward_loss(mb.tokens, mb.targets);
      loss_sum = loss_sum + loss.detach().to(at::kDouble);
      model.backward(loss * per_loss, k == K - 1);
    }
    return loss_sum;
  }
  StageLinks links(model, batches.front().tokens.size(0), batches.front().tokens.size(1));
  struct InFlight {
    at::Tensor input, output;  // output: the loss on the last stage
  };
  std::deque<InFlight> alive;
  int64_t fwd = 0, bwd = 0;
  auto forward = [&](const at::Tensor& input) {
    const MicroBatch& mb = batches[static_cast<std::size_t>(fwd++)];
    at::Tensor out = model.forward_stage(mb.tokens, mb.targets, input);
    if (links.last()) loss_sum = loss_sum + out.detach().to(at::kDouble);
    alive.push_back({input, out});
    return out;
  };
  // The backward of the oldest micro-batch alive; returns the gradient of its input (undefined on the first stage).
  auto backward = [&](const at::Tensor& grad) {
    InFlight f = std::move(alive.front());
    alive.pop_front();
    const bool sync = ++bwd == K;
    if (links.last())
      model.backward_stage(f.output * per_loss, at::Tensor(), sync);
    else
      model.backward_stage(f.output, grad, sync);
    return links.first() ? at::Tensor() : f.input.grad();
  };
  // The schedule's warm-up, as the simulator orders a stage's passes (program/pipeline_parallel.hpp).
  const int64_t warmup = pipeline_warmup(mesh.schedule, mesh.pp, mesh.pp_rank, K);
  const int64_t steady = K - warmup;
  // `fwd` and `bwd` count the forwards and backwards run so far: the next forward is micro-batch fwd, the oldest
  // alive (the next backward) micro-batch bwd.
  for (int64_t i = 0; i < warmup; ++i) {
    at::Tensor out = forward(links.recv_forward(fwd));
    links.send_forward(out, fwd - 1);
  }
  at::Tensor input = steady > 0 ? links.recv_forward(fwd) : at::Tensor();
  for (int64_t i = 0; i < steady; ++i) {
    at::Tensor out = forward(input);
    const at::Tensor grad = links.send_forward_recv_backward(out, fwd - 1, bwd);
    const at::Tensor input_grad = backward(grad);
    if (i == steady - 1) {
      input = at::Tensor();
      links.send_backward(input_grad, bwd - 1);
    } else {
      input = links.send_backward_recv_forward(input_grad, bwd - 1, fwd);
    }
  }
  for (int64_t i = 0; i < warmup; ++i) {
    const at::Tensor input_grad = backward(links.recv_backward(bwd));
    links.send_backward(input_grad, bwd - 1);
  }
  links.finish();
  return loss_sum;
}

}  // namespace fsdp::exec
