// Single-process tests of the executor's pieces.
#include <c10/core/CPUAllocator.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/errors.hpp"
#include "dist/comm.hpp"
#include "dist/device.hpp"
#include "hardware/hardware_profile.hpp"
#include "io/data.hpp"
#include "io/safetensors.hpp"
#include "model/model_loader.hpp"
#include "model/module_graph.hpp"
#include "model/moe.hpp"
#include "model/transformer.hpp"
#include "runtime/runtime_profile.hpp"
#include "shard/sharded_model.hpp"
#include "test_common.hpp"
#include "train/mem_tracker.hpp"

namespace fsdp::exec::test {
namespace fs = std::filesystem;

TEST_CASE("attention core: causal softmax(QK^T/sqrt(d))V against an explicit loop") {
  at::manual_seed(1);
  const int64_t B = 2, H = 3, T = 5, D = 4;
  at::Tensor q = at::randn({B, H, T, D}), k = at::randn({B, H, T, D}), v = at::randn({B, H, T, D});
  at::Tensor got = attention_core(q, k, v, /*eager=*/true);
  auto qa = q.accessor<float, 4>(), ka = k.accessor<float, 4>(), va = v.accessor<float, 4>();
  auto ga = got.accessor<float, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> w(static_cast<std::size_t>(i + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {  // keys up to the query's own position only
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += qa[b][h][i][d] * ka[b][h][j][d];
          w[static_cast<std::size_t>(j)] = s / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, w[static_cast<std::size_t>(j)]);
        }
        for (auto& x : w) sum += (x = std::exp(x - mx));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += w[static_cast<std::size_t>(j)] / sum * va[b][h][j][d];
          CHECK(ga[b][h][i][d] == doctest::Approx(o).epsilon(1e-5));
        }
      }
}

TEST_CASE("model: parameters, names, deterministic initialisation, refusals") {
  ModelSpec s = load_model("tiny", FSDP_SOURCE_ROOT);
  auto defs = model_param_defs(s);
  int64_t n = 0;
  for (auto& d : defs) n += d.numel();
  const int64_t H = s.hidden_size;
  const int64_t per_layer = 2 * H + s.q_dim() * H + 2 * s.kv_dim() * H + H * s.q_dim() + 3 * s.ffn_size * H;
  CHECK(n == 2 * s.vocab_size * H + H + s.num_layers * per_layer);
  CHECK(defs.front().name == "model.embed_tokens.weight");
  CHECK(defs.back().name == "lm_head.weight");
  at::Tensor a = init_param(defs[3], 3, 42), b = init_param(defs[3], 3, 42), c = init_param(defs[3], 3, 43);
  CHECK(at::equal(a, b));
  CHECK(!at::equal(a, c));
  CHECK(a.std().item<double>() == doctest::Approx(0.02).epsilon(0.05));
  ModelSpec drop = s;
  drop.dropout = true;
  CHECK_THROWS_AS(check_model_supported(drop), InputError);
}

// Each refusal names its feature (issue M13: what fsdp-run cannot run stays refused, naming it).
TEST_CASE("model: q/k norms per head and MoE run; the parts fsdp-run does not build are refused by name") {
  const ModelSpec s = load_model("tiny", FSDP_SOURCE_ROOT);
  CHECK_NOTHROW(check_model_supported(load_model("tiny-qwen3", FSDP_SOURCE_ROOT)));
  CHECK_NOTHROW(check_model_supported(load_model("tiny-moe", FSDP_SOURCE_ROOT)));
  auto refused = [](const ModelSpec& m) {
    try {
      check_model_supported(m);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ModelSpec olmo2 = s;
  olmo2.qk_norm = QkNorm::Projection;
  CHECK(refused(olmo2).find("qk_norm: projection") != std::string::npos);
  ModelSpec v3 = load_model("tiny-moe", FSDP_SOURCE_ROOT);
  v3.moe->router_bias = true;
  CHECK(refused(v3).find("moe.router_bias") != std::string::npos);
  ModelSpec capped = v3;
  capped.moe->router_bias = false;
  capped.moe->capacity_factor = 1.25;
  CHECK(refused(capped).find("moe.capacity_factor") != std::string::npos);
  CHECK(refused(load_model("deepseek-v2-lite", FSDP_SOURCE_ROOT)).find("(mla)") != std::string::npos);
  CHECK(refused(load_model("mistral-7b", FSDP_SOURCE_ROOT)).find("sliding_window") != std::string::npos);
  CHECK(refused(load_model("llava-1.5-7b", FSDP_SOURCE_ROOT)).find("(vision)") != std::string::npos);
}

// The executor's parameter definitions are the simulator's module graph, layer by layer and at the root: the wrap
// units, their flat buffers and every memory category the two compare depend on it.
TEST_CASE("model: tiny-qwen3's and tiny-moe's parameters equal the module graph's, layer by layer") {
  for (const char* name : {"tiny", "tiny-qwen3", "tiny-moe", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b"}) {
    INFO(name);
    const ModelSpec spec = load_model(name, FSDP_SOURCE_ROOT);
    const ModuleGraph g(spec);
    std::vector<int64_t> per_layer(static_cast<std::size_t>(spec.num_layers));
    int64_t root = 0;
    for (const ParamDef& d : model_param_defs(spec))
      (d.layer < 0 ? root : per_layer[static_cast<std::size_t>(d.layer)]) += d.numel();
    int64_t layers = 0;
    for (int64_t l = 0; l < spec.num_layers; ++l) {
      CHECK(per_layer[static_cast<std::size_t>(l)] == g.params_under(g.layers()[static_cast<std::size_t>(l)]));
      layers += per_layer[static_cast<std::size_t>(l)];
    }
    CHECK(layers + root == g.total_params());
  }
  const auto defs = model_param_defs(load_model("tiny-moe", FSDP_SOURCE_ROOT));
  auto has = [&](const std::string& n) {
    return std::any_of(defs.begin(), defs.end(), [&](const ParamDef& d) { return d.name == n; });
  };
  CHECK(has("model.layers.0.mlp.gate.weight"));
  CHECK(has("model.layers.3.mlp.experts.7.down_proj.weight"));
  CHECK(has("model.layers.1.mlp.shared_expert.up_proj.weight"));
  CHECK(has("model.layers.1.mlp.shared_expert_gate.weight"));
  const auto q3 = model_param_defs(load_model("tiny-qwen3", FSDP_SOURCE_ROOT));
  CHECK(std::any_of(q3.begin(), q3.end(), [](const ParamDef& d) {
    return d.name == "model.layers.2.self_attn.k_norm.weight" && d.shape == std::vector<int64_t>{32};
  }));
}

// The MoE block against Hugging Face's per-token definition (Qwen2MoeSparseMoeBlock.forward): softmax over the
// router logits, the top-k probabilities (renormalised when norm_topk_prob), sum_j w_j expert_j(x), plus
// sigmoid(shared_expert_gate(x)) shared_expert(x), token by token.
TEST_CASE("MoE block: sorted dispatch equals the per-token definition; ties go to the lower expert") {
  for (bool mixtral : {false, true}) {
    INFO("mixtral-like " << mixtral);
    const ModelSpec s = small_moe_model(mixtral);
    const MoeSpec& m = *s.moe;
    std::vector<ParamDef> defs;
    moe_param_defs(s, "mlp", 1, defs);
    ParamMap p;
    for (std::size_t i = 0; i < defs.size(); ++i)
      p[defs[i].name] = init_param(defs[i], static_cast<int64_t>(i), 11) * 20.0;  // routing far from uniform
    at::manual_seed(3);
    const at::Tensor h = at::randn({2, 7, s.hidden_size});
    const at::Tensor got = moe_forward(s, p, "mlp", h, TpContext{});
    const at::Tensor x = h.reshape({-1, s.hidden_size});
    for (int64_t t = 0; t < x.size(0); ++t) {
      const at::Tensor xt = x.narrow(0, t, 1);
      const at::Tensor probs = at::softmax(at::linear(xt, p.at("mlp.gate.weight")), -1).squeeze(0);
      const auto [w, idx] = at::topk(probs, m.experts_per_token);
      const at::Tensor weights = mixtral ? w / w.sum() : w;
      at::Tensor want = at::zeros_like(xt);
      for (int64_t j = 0; j < m.experts_per_token; ++j)
        want = want + weights[j] * dense_mlp(s, p, "mlp.experts." + std::to_string(idx[j].item<int64_t>()), xt);
      if (!mixtral)
        want = want + at::sigmoid(at::linear(xt, p.at("mlp.shared_expert_gate.weight"))) *
                          dense_mlp(s, p, "mlp.shared_expert", xt);
      CHECK(rel_err(got.reshape({-1, s.hidden_size}).narrow(0, t, 1), want) < 1e-6);
    }
  }
  // Equal probabilities: the lower expert first, whatever the row's neighbours.
  const at::Tensor tied = at::tensor({0.1f, 0.3f, 0.3f, 0.2f, 0.3f, 0.4f, 0.4f, 0.1f}).view({2, 4});
  const at::Tensor top = top_k_experts(tied, 2);
  CHECK(top[0][0].item<int64_t>() == 1);
  CHECK(top[0][1].item<int64_t>() == 2);
  CHECK(top[1][0].item<int64_t>() == 1);
  CHECK(top[1][1].item<int64_t>() == 2);
  CHECK(at::equal(top_k_experts(tied.narrow(0, 1, 1), 2), top.narrow(0, 1, 1)));
}

TEST_CASE("model: one layer's forward is causal and the loss starts near log(vocab)") {
  ModelSpec s = small_model();
  auto defs = model_param_defs(s);
  ParamMap p;
  for (std::size_t i = 0; i < defs.size(); ++i) p[defs[i].name] = init_param(defs[i], static_cast<int64_t>(i), 5);
  at::Tensor tokens = at::randint(s.vocab_size, {2, 12}, at::kLong);
  at::Tensor x = embed_forward(s, p, tokens);
  ForwardOptions fo;
  at::Tensor y = layer_forward(s, p, 0, x, fo);
  // Changing the last token does not change earlier outputs.
  at::Tensor t2 = tokens.clone();
  t2.select(1, 11).fill_((tokens[0][11].item<int64_t>() + 1) % s.vocab_size);
  at::Tensor y2 = layer_forward(s, p, 0, embed_forward(s, p, t2), fo);
  CHECK(at::allclose(y.narrow(1, 0, 11), y2.narrow(1, 0, 11)));
  CHECK(!at::allclose(y.narrow(1, 11, 1), y2.narrow(1, 11, 1)));
  // Small random weights: the initial loss is close to the uniform-prediction entropy.
  at::Tensor loss = head_loss(s, p, y, tokens);
  CHECK(loss.item<double>() == doctest::Approx(std::log(static_cast<double>(s.vocab_size))).epsilon(0.02));
}

TEST_CASE("memory tracker: the counting CPU allocator sees allocations and frees") {
  MemTracker& m = MemTracker::instance();
  m.install_cpu();
  const int64_t before = m.current();
  m.reset_peak();
  {
    at::Tensor t = at::empty({1 << 20}, at::kFloat);
    CHECK(m.current() - before == 4 << 20);
    {
      at::Tensor u = at::empty({1 << 18}, at::kFloat);
      CHECK(m.peak() - before == (4 << 20) + (1 << 20));
    }
  }
  CHECK(m.current() == before);
  CHECK(m.peak() - before == (4 << 20) + (1 << 20));
  // raw_allocate (used by some kernels for scratch space) works through the wrapper.
  void* raw = c10::GetCPUAllocator()->raw_allocate(4096);
  CHECK(m.current() - before == 4096);
  c10::GetCPUAllocator()->raw_deallocate(raw);
  CHECK(m.current() == before);
}

TEST_CASE("safetensors: round trip, and a truncated file is refused") {
  const fs::path f = fs::temp_directory_path() / ("exec_st_" + std::to_string(::getpid()) + ".safetensors");
  std::map<std::string, at::Tensor> in{{"a", at::randn({3, 5})}, {"b", at::randn({7}).to(at::kBFloat16)}};
  write_safetensors(f.string(), in, {{"k", "v"}});
  {
    SafetensorsFile s(f.string());
    CHECK(at::equal(s.tensors().at("a"), in["a"]));
    CHECK(at::equal(s.tensors().at("b"), in["b"]));
    CHECK(s.metadata().at("k") == "v");
  }
  fs::resize_file(f, fs::file_size(f) - 4);
  CHECK_THROWS_AS(SafetensorsFile(f.string()), InputError);
  fs::remove(f);
}

TEST_CASE("data: rows are addressed by (step, global row); token files are checked") {
  auto syn = open_data("synthetic", "uint16", 100, 8, 1);
  at::Tensor all = syn->rows(3, 0, 4);
  CHECK(at::equal(syn->rows(3, 2, 2), all.narrow(0, 2, 2)));
  CHECK(!at::equal(syn->rows(4, 0, 4), all));
  CHECK(all.max().item<int64_t>() < 100);

  const fs::path f = fs::temp_directory_path() / ("exec_tok_" + std::to_string(::getpid()) + ".bin");
  std::vector<uint16_t> ids(1000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i % 97);
  {
    std::ofstream o(f, std::ios::binary);
    o.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 2));
  }
  auto tok = open_data(f.string(), "uint16", 100, 8, 1);
  at::Tensor r = tok->rows(0, 0, 3);
  for (int64_t i = 0; i < 3; ++i) {  // each row is a contiguous window of the file
    const int64_t first = r[i][0].item<int64_t>();
    for (int64_t t = 1; t <= 8; ++t) CHECK(r[i][t].item<int64_t>() == (first + t) % 97);
  }
  CHECK_THROWS_WITH_AS(open_data(f.string(), "uint32", 100, 8, 1)->rows(0, 0, 1), doctest::Contains("beyond"),
                       InputError);  // uint32 view of uint16 data: ids beyond the vocabulary
  auto small_vocab = open_data(f.string(), "uint16", 50, 8, 1);
  CHECK_THROWS_WITH_AS(small_vocab->rows(0, 0, 8), doctest::Contains("beyond the model's vocabulary"), InputError);
  {
    std::ofstream o(f, std::ios::binary | std::ios::app);
    o.put('x');  // odd size: not a whole number of uint16 ids
  }
  CHECK_THROWS_WITH_AS(open_data(f.string(), "uint16", 100, 8, 1), doctest::Contains("not a multiple"), InputError);
  fs::remove(f);
}

TEST_CASE("CPU ranks poll in their waits when each has a core: the executor's rule is the simulator's") {
  const int n = available_cpus();
  CHECK(cpu_busy_poll(1, 1));
  CHECK(cpu_busy_poll(n, 1));
  CHECK(!cpu_busy_poll(n + 1, 1));
  CHECK(!cpu_busy_poll(1, n + 1));
  // With fsdp-run's thread split (floor(cpus / ranks), at least 1) the executor polls exactly when the
  // simulator prices a plan's collectives with the polling factor.
  for (int ranks = 1; ranks <= 2 * n + 1; ++ranks) {
    INFO("ranks " << ranks << " on " << n << " CPUs");
    CHECK(cpu_busy_poll(ranks, std::max(1, n / ranks)) == fsdp::cpu_ranks_poll(n, ranks));
  }
}

#if defined(__GLIBC__)
TEST_CASE("host allocator: after configure_host_allocator, freed MiB-sized blocks are reused, not mmap'd again") {
  // glibc's default serves a block above its mmap threshold (128 KiB at first) with fresh pages; the policy
  // (dist/device.hpp) keeps blocks up to 32 MiB in the heap. mallinfo2's hblks counts the live mmap'd blocks.
  const std::string what = configure_host_allocator();
  INFO(what);
  CHECK(host_allocator_policy() == what);  // the report's query names what was done
  REQUIRE((std::getenv("GLIBC_TUNABLES") != nullptr || std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
           what == "glibc malloc: mmap threshold 32 MiB, trim threshold 1 GiB"));
  if (what.find("environment") != std::string::npos) return;  // the environment's settings were kept
  CHECK(configure_host_allocator() == what);                  // once per process
  const std::size_t before = mallinfo2().hblks;
  std::vector<void*> blocks;
  for (std::size_t mib : {1, 4, 16}) blocks.push_back(std::malloc(mib << 20));
  for (void* b : blocks) REQUIRE(b != nullptr);
  CHECK(mallinfo2().hblks == before);
  for (void* b : blocks) std::free(b);
  void* big = std::malloc(64 << 20);  // above the 32 MiB threshold: still its own mapping
  REQUIRE(big != nullptr);
  CHECK(mallinfo2().hblks == before + 1);
  std::free(big);
}
#endif

TEST_CASE("rendezvous environment: torchrun and Slurm variables") {
  auto clear = [] {
    for (const char* v :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
          "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"})
      ::unsetenv(v);
  };
  clear();
  CHECK(read_dist_env().world_size == 1);
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "8", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("MASTER_ADDR", "node7", 1);
  ::setenv("MASTER_PORT", "1234", 1);
  DistEnv e = read_dist_env();
  CHECK(e.rank == 3);
  CHECK(e.world_size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.master_addr == "node7");
  CHECK(e.master_port == 1234);
  CHECK(e.source == "torchrun");
  ::setenv("RANK", "8", 1);
  CHECK_THROWS_AS(read_dist_env(), InputError);
  clear();
  ::setenv("SLURM_PROCID", "5", 1);
  ::setenv("SLURM_NTASKS", "16", 1);
  ::setenv("SLURM_LOCALID", "1", 1);
  ::setenv("SLURM_NTASKS_PER_NODE", "4(x4)", 1);
  ::setenv("SLURM_JOB_NODELIST", "gpu[012-015]", 1);
  e = read_dist_env();
  CHECK(e.rank == 5);
  CHECK(e.world_size == 16);
  CHECK(e.local_world_size == 4);
  CHECK(e.master_addr == "gpu012");
  CHECK(e.source == "slurm");
  clear();
}

TEST_CASE("local group: world 1 collectives are identities; rehearsal stands in for absent ranks") {
  auto one = Comm::emulate(1);
  at::Tensor t = at::arange(6, at::kFloat);
  one->world().all_reduce_sum(t).wait();
  CHECK(at::equal(t, at::arange(6, at::kFloat)));
  auto four = Comm::emulate(4);
  at::Tensor full = at::zeros({8});
  four->world().all_gather(at::ones({2}), full).wait();
  CHECK(full.sum().item<double>() == 8.0);
  at::Tensor shard = at::zeros({2});
  four->world().reduce_scatter_sum(at::arange(8, at::kFloat), shard).wait();
  CHECK(at::equal(shard, at::arange(2, at::kFloat)));
}

TEST_CASE("fsdp-run's root unit stays gathered after forward, as its runtime profile tells the step program") {
  const RuntimeProfile rt = load_runtime("fsdp-run", FSDP_SOURCE_ROOT);
  CHECK(rt.root_reshard_after_forward == ShardedModel::kReshardsRoot);
}

}  // namespace fsdp::exec::test
