#include "io/checkpoint.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <vector>

#include "core/duplicate_keys.hpp"
#include "core/errors.hpp"
#include "dist/comm.hpp"
#include "io/safetensors.hpp"
#include "shard/sharded_model.hpp"

namespace fsdp::exec {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// 2: the manifest carries its own checksum (manifest_checksum) and the run's identity (run.seed, run.plan_hash).
constexpr int kCheckpointVersion = 2;

std::string step_name(int64_t step) {
  char b[32];
  std::snprintf(b, sizeof b, "step-%08lld", static_cast<long long>(step));
  return b;
}
std::string rank_file(int rank) {
  char b[48];
  std::snprintf(b, sizeof b, "rank-%05d.safetensors", rank);
  return b;
}
std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error(tmp.string() + ": cannot create");
    out << text;
  }
  fsync_path(tmp);
  fs::rename(tmp, path);
}

std::string text_hash(const std::string& text) { return hex(fnv1a64(text.data(), text.size())); }

// The manifest's own checksum: FNV-1a 64 of its compact JSON without the checksum member (nlohmann::json keeps
// members sorted, so the text is the same for the same content however the file is laid out).
std::string manifest_checksum(json m) {
  m.erase("manifest_checksum");
  return text_hash(m.dump());
}

json read_manifest(const fs::path& dir) {
  const fs::path mp = dir / "manifest.json";
  std::ifstream in(mp, std::ios::binary);
  if (!in) throw InputError(mp.string() + ": missing (partial checkpoint?)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json j;
  try {
    j = parse_json_unique_keys(text, mp.string());
  } catch (const json::exception&) {
    throw InputError(mp.string() + ": malformed manifest (not JSON)");
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != "fsdp-run-checkpoint")
    throw InputError(mp.string() + ": not an fsdp-run checkpoint manifest");
  const int version = j.contains("version") && j["version"].is_number_integer() ? j["version"].get<int>() : 0;
  if (version > kCheckpointVersion)
    throw InputError(mp.string() + ": checkpoint version " + std::to_string(version) +
                     " is newer than this fsdp-run reads (" + std::to_string(kCheckpointVersion) + ")");
  if (!j.contains("manifest_checksum"))
    throw InputError(mp.string() + ": no manifest_checksum (checkpoint version " + std::to_string(version) +
                     "; version " + std::to_string(kCheckpointVersion) +
                     " manifests carry their own checksum and the run's identity)");
  if (j["manifest_checksum"] != manifest_checksum(j))
    throw InputError(mp.string() + ": manifest checksum mismatch (the manifest was changed after it was written)");
  return j;
}

// The first line where two identity texts differ.
std::string first_difference(const std::string& saved, const std::string& ours) {
  std::istringstream a(saved), b(ours);
  std::string la, lb;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, la)), more_b = static_cast<bool>(std::getline(b, lb));
    if (!more_a && !more_b) return "";
    if (la != lb || more_a != more_b) {
      auto trim = [](const std::string& l) { return l.substr(std::min(l.find_first_not_of(' '), l.size())); };
      return "'" + trim(la) + "' in the checkpoint, '" + trim(lb) + "' here";
    }
  }
}

// What differs between the checkpoint's plan and this one, in the words of plan_identity where the saved plan
// can be read, else by hash.
std::string plan_difference(const json& m, const PlanFile& plan) {
  const std::string by_hash = "plan_hash " + m.at("run").at("plan_hash").get<std::string>() + " in the checkpoint, " +
                              plan_hash(plan) + " here";
  try {
    const std::string d = first_difference(
        plan_identity(parse_plan_text(m.at("plan").get<std::string>(), "the checkpoint's plan")), plan_identity(plan));
    return d.empty() ? by_hash : "plan " + d;
  } catch (const std::exception&) {
    return by_hash;
  }
}

// The checkpoint must be of this run (same seed, same plan identity) unless --resume-any.
void check_same_run(const json& m, const fs::path& dir, const PlanFile& plan, const ResumeOptions& opts, bool log) {
  const json& run = m.at("run");
  std::string diffs;
  const uint64_t seed = run.at("seed").get<uint64_t>();
  if (seed != opts.seed)
    diffs = "seed " + std::to_string(seed) + " in the checkpoint, " + std::to_string(opts.seed) + " here";
  if (run.at("plan_hash").get<std::string>() != plan_hash(plan))
    diffs += (diffs.empty() ? "" : "; ") + plan_difference(m, plan);
  if (diffs.empty()) return;
  const std::string what = (dir / "manifest.json").string() + ": the checkpoint is of another run (" + diffs + ")";
  if (!opts.any_run) throw InputError(what + "; --resume-any continues it anyway");
  if (log) std::cerr << "fsdp-run: note: " << what << "; continuing it as asked (--resume-any)\n";
}

// Empty string when every file named by the manifest exists with its checksum, else the problem.
std::string verify(const fs::path& dir) {
  json m;
  try {
    m = read_manifest(dir);
  } catch (const InputError& e) {
    return e.what();
  }
  for (const auto& f : m.at("files")) {
    const fs::path p = dir / f.at("file").get<std::string>();
    if (!fs::exists(p)) return p.string() + ": missing";
    if (hex(file_checksum(p.string())) != f.at("checksum").get<std::string>())
      return p.string() + ": checksum mismatch (corrupt shard)";
  }
  return "";
}

std::vector<fs::path> step_dirs(const fs::path& root) {
  std::vector<fs::path> v;
  if (!fs::is_directory(root)) return v;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.size() == 13 && n.rfind("step-", 0) == 0 &&
        std::all_of(n.begin() + 5, n.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      v.push_back(e.path());
  }
  std::sort(v.begin(), v.end());
  return v;
}

// A rank's units as its checkpoint file records them (its `layout` metadata): each unit's sizes and parameters,
// with every parameter's whole shape and tensor-parallel slice (model/tensor_parallel.hpp), and the rank's mesh
// coordinates.
json layout_json(ShardedModel& model) {
  const ShardLayout lay = model.layout();
  json units = json::array();
  for (const auto& u : model.units()) {
    json ps = json::array();
    for (std::size_t i = 0; i < u.params.size(); ++i)
      ps.push_back({{"name", u.params[i]},
                    {"shape", u.shapes[i]},
                    {"offset", u.offsets[i]},
                    {"full_shape", u.full_shapes[i]},
                    {"tp_dim", u.tp_dims[i]},
                    {"tp_start", u.tp_starts[i]}});
    units.push_back({{"name", u.name}, {"numel", u.numel}, {"padded", u.padded}, {"shard", u.shard}, {"params", ps}});
  }
  return {{"tp_rank", lay.tp_rank}, {"pp_rank", lay.pp_rank}, {"dp_rank", lay.dp_rank}, {"units", units}};
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The parameters of a checkpoint, whole, whatever mesh, strategy and wrap wrote it: each rebuilt from the unit
// shards of the first shard group of every (pipeline stage, tensor-parallel rank) that holds a slice of it. A
// checkpoint without a mesh (written by data-parallel plans before it had one) is one stage and one tp rank, its
// units the manifest's.
class CheckpointParams {
 public:
  struct Piece {
    int pp = 0, tp = 0, unit = 0;
    int64_t offset = 0;
    std::vector<int64_t> shape, full_shape;
    int tp_dim = -1;
    int64_t tp_start = 0;
  };

  CheckpointParams(const json& m, const fs::path& dir) : m_(m), dir_(dir) {
    world_ = m.at("world_size").get<int>();
    if (m.contains("mesh")) {
      tp_ = m.at("mesh").at("tp").get<int>();
      pp_ = m.at("mesh").at("pp").get<int>();
    }
    dp_ = world_ / (tp_ * pp_);
    for (int s = 0; s < pp_; ++s)
      for (int t = 0; t < tp_; ++t) {
        const json& units = layout(s, t).at("units");
        for (std::size_t u = 0; u < units.size(); ++u)
          for (const auto& p : units[u].at("params")) {
            Piece piece;
            piece.pp = s;
            piece.tp = t;
            piece.unit = static_cast<int>(u);
            piece.offset = p.at("offset").get<int64_t>();
            piece.shape = p.at("shape").get<std::vector<int64_t>>();
            piece.full_shape = p.contains("full_shape") ? p.at("full_shape").get<std::vector<int64_t>>() : piece.shape;
            piece.tp_dim = p.value("tp_dim", -1);
            piece.tp_start = p.value("tp_start", int64_t{0});
            pieces_[p.at("name").get<std::string>()].push_back(std::move(piece));
          }
      }
  }

  // Every parameter: its pieces (one per tp rank holding a slice of it).
  const std::map<std::string, std::vector<Piece>>& pieces() const { return pieces_; }
  const std::vector<int64_t>& full_shape(const std::string& name) const { return pieces_.at(name).front().full_shape; }
  // The units of the rank at (stage, dp index, tp rank): what its file's metadata records.
  const json& layout(int pp, int tp) {
    auto& l = layouts_[{pp, tp}];
    if (l.is_null()) {
      if (!m_.contains("mesh")) {
        l = {{"units", m_.at("units")}};
      } else {
        const int r = rank_of(pp, 0, tp);
        const auto& meta = file(r).metadata();
        auto it = meta.find("layout");
        if (it == meta.end()) throw InputError((dir_ / rank_file(r)).string() + ": no layout metadata");
        l = parse_json_unique_keys(it->second, (dir_ / rank_file(r)).string() + " layout");
      }
    }
    return l;
  }
  // The whole fp32 parameter `name`'s `state` (master, exp_avg, exp_avg_sq, momentum).
  at::Tensor whole(const std::string& name, const std::string& state) {
    const std::vector<Piece>& ps = pieces_.at(name);
    at::Tensor full = at::zeros(ps.front().full_shape, at::kFloat);
    for (const Piece& p : ps) {
      at::Tensor local = unit_flat(p.pp, p.tp, p.unit, state).narrow(0, p.offset, numel_of(p.shape)).view(p.shape);
      if (p.tp_dim < 0) return local.clone();
      full.narrow(p.tp_dim, p.tp_start, p.shape[static_cast<std::size_t>(p.tp_dim)]).copy_(local);
    }
    return full;
  }

 private:
  int rank_of(int pp, int dp, int tp) const { return (pp * dp_ + dp) * tp_ + tp; }
  SafetensorsFile& file(int r) {
    auto& f = files_[r];
    if (!f) f = std::make_unique<SafetensorsFile>((dir_ / rank_file(r)).string());
    return *f;
  }
  // The unit's flat state (numel, unpadded) from the shards of the first shard group (dp indices 0..G-1: the
  // world's, or HSDP's first group) of its stage and tp rank.
  at::Tensor unit_flat(int pp, int tp, int u, const std::string& state) {
    auto key = std::make_tuple(pp, tp, u, state);
    auto it = flats_.find(key);
    if (it != flats_.end()) return it->second;
    const json& unit = layout(pp, tp).at("units").at(static_cast<std::size_t>(u));
    const int64_t numel = unit.at("numel").get<int64_t>();
    const bool sharded = state == "master" ? m_.at("params_sharded").get<bool>() : m_.at("optim_sharded").get<bool>();
    const int G = sharded ? m_.at("shard_group_size").get<int>() : 1;
    const std::string name = "unit" + std::to_string(u) + "." + state;
    std::vector<at::Tensor> parts;
    for (int d = 0; d < G; ++d) {
      const int r = rank_of(pp, d, tp);
      auto t = file(r).tensors().find(name);
      if (t == file(r).tensors().end()) throw InputError((dir_ / rank_file(r)).string() + ": missing tensor " + name);
      parts.push_back(t->second.reshape({-1}));
    }
    at::Tensor flat = parts.size() == 1 ? parts[0] : at::cat(parts);
    if (flat.numel() < numel) throw InputError(dir_.string() + ": tensor " + name + " is shorter than the unit");
    return flats_[key] = flat.narrow(0, 0, numel);
  }

  const json& m_;
  fs::path dir_;
  int world_ = 1, tp_ = 1, pp_ = 1, dp_ = 1;
  std::map<int, std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::pair<int, int>, json> layouts_;
  std::map<std::tuple<int, int, int, std::string>, at::Tensor> flats_;
  std::map<std::string, std::vector<Piece>> pieces_;
};

// --init-from's files: one, or those of a directory's index (its weight_map: tensor name -> file).
struct WeightFiles {
  std::vector<std::string> files;
  std::string index;                         // the index file, or empty
  std::map<std::string, std::string> where;  // the index's weight_map, with the directory prefixed
};

json read_index(const fs::path& index) {
  std::ifstream in(index, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json j;
  try {
    j = parse_json_unique_keys(text, index.string());
  } catch (const json::exception&) {
    throw InputError(index.string() + ": malformed index (not JSON)");
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw InputError(index.string() + ": no weight_map object (tensor name -> file)");
  return j;
}

WeightFiles weight_files(const std::string& path) {
  const fs::path p(path);
  if (!fs::is_directory(p)) return WeightFiles{{path}, "", {}};
  const fs::path index = p / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    if (!fs::exists(p / "model.safetensors"))
      throw InputError(path + ": neither model.safetensors.index.json nor model.safetensors found");
    return WeightFiles{{(p / "model.safetensors").string()}, "", {}};
  }
  WeightFiles w;
  w.index = index.string();
  const json j = read_index(index);
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) throw InputError(w.index + ": weight_map." + it.key() + " is not a file name");
    const std::string f = (p / it.value().get<std::string>()).string();
    w.where[it.key()] = f;
    if (std::find(w.files.begin(), w.files.end(), f) == w.files.end()) w.files.push_back(f);
  }
  if (w.files.empty()) throw InputError(w.index + ": the weight_map names no tensor");
  return w;
}

struct FoundTensor {
  std::string file;
  at::Tensor tensor;
};

// Every tensor of the files, by name: a name in two files, or not in the file the index names, is refused.
std::map<std::string, FoundTensor> tensors_in(const WeightFiles& w) {
  // The maps stay open for the process lifetime: the returned tensors alias them.
  static std::vector<std::unique_ptr<SafetensorsFile>> open_files;
  std::map<std::string, FoundTensor> found;
  for (const std::string& f : w.files) {
    open_files.push_back(std::make_unique<SafetensorsFile>(f));
    for (const auto& [name, t] : open_files.back()->tensors()) {
      auto [it, fresh] = found.emplace(name, FoundTensor{f, t});
      if (!fresh) throw InputError(f + ": tensor " + name + " is in " + it->second.file + " too");
    }
  }
  for (const auto& [name, f] : w.where) {
    auto it = found.find(name);
    if (it == found.end() || it->second.file != f)
      throw InputError(w.index + ": the weight_map puts tensor " + name + " in " + f + ", which does not hold it");
  }
  return found;
}

struct ExpectedParam {
  std::vector<int64_t> shape;
  bool required = true;
};

// The model's parameters by name; LoRA adapters are optional (base-only weights keep the adapters' init).
std::map<std::string, ExpectedParam> model_parameters(const ShardedModel& model) {
  std::map<std::string, ExpectedParam> out;
  for (const UnitInfo& u : model.units())
    for (std::size_t i = 0; i < u.params.size(); ++i) out[u.params[i]] = ExpectedParam{u.full_shapes[i], true};
  if (const UnitInfo* a = model.adapters())
    for (std::size_t i = 0; i < a->params.size(); ++i) out[a->params[i]] = ExpectedParam{a->shapes[i], false};
  return out;
}

// A parameter from a file: a floating dtype (an integer tensor is no weight, whatever its bytes), the model's
// shape; fp32, as the masters are.
at::Tensor as_parameter(const FoundTensor& f, const std::string& name, const std::vector<int64_t>& shape) {
  const at::Tensor& t = f.tensor;
  if (!at::isFloatingType(t.scalar_type()))
    throw InputError(f.file + ": tensor " + name + " has dtype " + safetensors_dtype(t.scalar_type()) +
                     "; a parameter needs a floating dtype (F32, BF16, F16 or F64)");
  if (t.sizes() != at::IntArrayRef(shape))
    throw InputError(f.file + ": tensor " + name + " has shape " + c10::str(t.sizes()) + ", the model's parameter " +
                     c10::str(at::IntArrayRef(shape)));
  return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
}

// Tensors that are no parameter of the model are listed, not refused: Hugging Face checkpoints carry some (the
// rotary `inv_freq` buffers of older Llama exports, the head of a model saved untied and loaded tied), and a file
// of another model is refused anyway by its missing or misshapen parameters.
void note_not_loaded(const std::map<std::string, FoundTensor>& found, const std::map<std::string, at::Tensor>& used,
                     const std::string& listing, std::ostream* notes) {
  constexpr std::size_t kListed = 20;
  std::vector<std::string> extra;
  for (const auto& [name, f] : found)
    if (!used.count(name)) extra.push_back(name);
  if (extra.empty() || notes == nullptr) return;
  *notes << "fsdp-run: warning: " << listing << ": " << extra.size()
         << " tensor(s) are not parameters of this model and are not loaded:";
  for (std::size_t i = 0; i < extra.size() && i < kListed; ++i) *notes << " " << extra[i];
  if (extra.size() > kListed) *notes << " (and " << extra.size() - kListed << " more)";
  *notes << "\n";
}

}  // namespace

void check_read_back(const at::Tensor& sums, const std::string& partial_dir, int64_t step) {
  const fs::path partial(partial_dir);
  auto s = sums.accessor<int64_t, 2>();
  for (int64_t r = 0; r < sums.size(0); ++r)
    if (s[r][0] != s[r][1])
      throw std::runtime_error((partial / rank_file(static_cast<int>(r))).string() + ": reads back with checksum " +
                               hex(static_cast<uint64_t>(s[r][1])) + " but was written with " +
                               hex(static_cast<uint64_t>(s[r][0])) + "; step " + std::to_string(step) +
                               " is not published (the previous steps are kept)");
}

std::string plan_identity(const PlanFile& p) {
  PlanFile id;
  id.model = p.model;
  id.training = p.training;
  const Strategy& s = p.strategy;
  Strategy& t = id.strategy;
  t.param_dtype = s.param_dtype;
  t.reduce_dtype = s.reduce_dtype;
  t.master_dtype = s.master_dtype;
  t.seq_len = s.seq_len;
  // The rows of one step: the data-parallel replicas' (world / (tp x pp)).
  t.micro_batch = s.micro_batch * s.grad_accum * s.mesh.dp(p.cluster.world_size());
  t.grad_accum = 1;
  t.optimizer = s.optimizer;
  t.method = s.method;
  t.lora = s.lora;
  return write_plan_text(id);
}

std::string plan_hash(const PlanFile& plan) { return text_hash(plan_identity(plan)); }

int64_t checkpoint_bytes(ShardedModel& model, int world_size) {
  constexpr int64_t kHeaderAllowance = 1 << 16;  // a rank file's header, generously; the manifest
  int64_t bytes = kHeaderAllowance;
  for (const auto& [name, t] : model.local_state()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes * world_size + kHeaderAllowance;
}

void check_free_space(const std::string& dir, int64_t bytes) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0)
    throw InputError(dir + ": cannot query the free space: " + std::strerror(errno));
  const auto avail = static_cast<int64_t>(std::min<unsigned long long>(
      static_cast<unsigned long long>(st.f_bavail) * st.f_frsize, static_cast<unsigned long long>(INT64_MAX)));
  constexpr double kMiB = 1024.0 * 1024.0;
  if (avail < bytes) {
    char b[160];
    std::snprintf(b, sizeof b, ": %.1f MiB free, one checkpoint of this run takes %.1f MiB", avail / kMiB,
                  bytes / kMiB);
    throw InputError(dir + b + " (free space for it, or write checkpoints elsewhere)");
  }
}

void save_checkpoint(const std::string& root_s, int keep_last, const CheckpointMeta& meta, Comm& comm,
                     ShardedModel& model, const PlanFile& plan) {
  if (comm.world().is_local() && comm.size() > 1)
    throw InputError("checkpoints cannot be written in --emulate-world-size rehearsal");
  const fs::path root(root_s);
  const fs::path final_dir = root / step_name(meta.step);
  const fs::path partial = root / (step_name(meta.step) + ".partial");
  const int rank = comm.rank();
  if (rank == 0) {
    fs::create_directories(root);
    fs::remove_all(partial);  // leftovers of an interrupted save are never used
    fs::create_directories(partial);
  }
  comm.world().barrier();
  // Each rank reads its file back before the step is published (issue M11): a file that another process changed,
  // or a disk that returns other bytes, keeps the step unpublished instead of publishing a corrupt one.
  const std::string mine_path = (partial / rank_file(rank)).string();
  at::Tensor mine = at::empty({2}, at::kLong);
  mine[0] =
      static_cast<int64_t>(write_safetensors(mine_path, model.local_state(), {{"layout", layout_json(model).dump()}}));
  mine[1] = static_cast<int64_t>(file_checksum(mine_path));
  at::Tensor all = at::empty({2 * comm.size()}, at::kLong);
  comm.world().all_gather(mine, all).wait();
  all = all.view({comm.size(), 2});
  check_read_back(all, partial.string(), meta.step);
  if (rank == 0) {
    const ShardLayout lay = model.layout();
    json m;
    m["format"] = "fsdp-run-checkpoint";
    m["version"] = kCheckpointVersion;
    m["step"] = meta.step;
    m["world_size"] = comm.size();
    m["strategy"] = to_string(plan.strategy.kind);
    m["wrap"] = to_string(plan.strategy.wrap);
    m["params_sharded"] = lay.params_sharded;
    m["optim_sharded"] = lay.optim_sharded;
    m["shard_group_size"] = lay.shard_group_size;
    m["mesh"] = {{"tp", lay.tp}, {"pp", lay.pp}, {"dp", lay.dp}};
    m["loss_scale"] = meta.loss_scale;
    m["good_steps"] = meta.good_steps;
    m["run"] = {{"seed", meta.seed}, {"plan_hash", plan_hash(plan)}};
    m["data"] = {{"source", meta.data}, {"next_step", meta.step + 1}};
    m["rng"] = "stateless: data and initialisation derive from (seed, step, row)";
    m["plan_path"] = meta.plan_path;
    m["plan"] = write_plan_text(plan);
    m["units"] = layout_json(model).at("units");  // rank 0's; each rank's file records its own (`layout`)
    if (const UnitInfo* a = model.adapters()) {
      json ps = json::array();
      for (std::size_t i = 0; i < a->params.size(); ++i)
        ps.push_back({{"name", a->params[i]}, {"shape", a->shapes[i]}, {"offset", a->offsets[i]}});
      m["adapters"] = {{"numel", a->numel}, {"params", ps}, {"tensor", "adapters.params"}, {"replicated", true}};
    }
    json files = json::array();
    for (int r = 0; r < comm.size(); ++r)
      files.push_back(
          {{"rank", r}, {"file", rank_file(r)}, {"checksum", hex(static_cast<uint64_t>(all[r][0].item<int64_t>()))}});
    m["files"] = files;
    m["manifest_checksum"] = manifest_checksum(m);
    write_text_atomic(partial / "manifest.json", m.dump(1));
    fsync_path(partial);
    if (fs::exists(final_dir)) {
      // Never overwrite in place: keep the older copy under another name.
      fs::rename(final_dir, root / (step_name(meta.step) + ".superseded"));
    }
    fs::rename(partial, final_dir);
    fsync_path(root);
    auto dirs = step_dirs(root);
    for (std::size_t i = 0; keep_last > 0 && i + static_cast<std::size_t>(keep_last) < dirs.size(); ++i)
      fs::remove_all(dirs[i]);
  }
  comm.world().barrier();
}

ResumeState load_checkpoint(const std::string& dir_s, Comm& comm, ShardedModel& model, const PlanFile& plan,
                            const ResumeOptions& opts) {
  fs::path dir(dir_s);
  const bool is_step = fs::exists(dir / "manifest.json") || dir.filename().string().rfind("step-", 0) == 0;
  std::vector<fs::path> candidates = is_step ? std::vector<fs::path>{dir} : step_dirs(dir);
  if (candidates.empty()) throw InputError(dir_s + ": no checkpoint (no step-* directory with a manifest)");
  // Rank 0 verifies every file's checksum and picks the newest good step; the choice is broadcast.
  at::Tensor pick = at::full({1}, -1, at::kLong);
  if (comm.rank() == 0) {
    for (int64_t i = static_cast<int64_t>(candidates.size()) - 1; i >= 0; --i) {
      const std::string problem = verify(candidates[static_cast<std::size_t>(i)]);
      if (problem.empty()) {
        pick[0] = i;
        break;
      }
      std::cerr << "fsdp-run: checkpoint " << candidates[static_cast<std::size_t>(i)].string()
                << " is unusable: " << problem;
      if (is_step) {
        auto older = step_dirs(dir.parent_path());
        std::string prev;
        for (auto& o : older)
          if (o.filename() < dir.filename() && verify(o).empty()) prev = o.string();
        std::cerr << (prev.empty() ? "; no older good checkpoint" : "; the previous good one is " + prev) << "\n";
      } else {
        std::cerr << (i > 0 ? "; trying the previous one" : "") << "\n";
      }
    }
  }
  comm.world().broadcast(pick, 0);
  const int64_t idx = pick[0].item<int64_t>();
  if (idx < 0) throw InputError(dir_s + ": no usable checkpoint (corrupt or partial; see the message above)");
  const fs::path use = candidates[static_cast<std::size_t>(idx)];
  const json m = read_manifest(use);
  check_same_run(m, use, plan, opts, comm.rank() == 0);

  // The model must be the same, parameter by parameter (names and whole shapes); its wrap units, the strategy's
  // layout, the mesh and the world size may differ (resharded below by parameter name).
  CheckpointParams saved(m, use);
  const auto& units = model.units();
  for (const UnitInfo& ui : units)
    for (std::size_t i = 0; i < ui.params.size(); ++i) {
      if (!saved.pieces().count(ui.params[i]))
        throw InputError(use.string() + ": checkpoint has no parameter " + ui.params[i] + " (model changed)");
      if (saved.full_shape(ui.params[i]) != ui.full_shapes[i])
        throw InputError(use.string() + ": parameter " + ui.params[i] +
                         " has another shape in the checkpoint (model changed)");
    }
  if (static_cast<int64_t>(saved.pieces().size()) != model.model_param_count())
    throw InputError(use.string() + ": checkpoint holds " + std::to_string(saved.pieces().size()) +
                     " parameters, this plan's model " + std::to_string(model.model_param_count()) +
                     " (model changed)");

  const ShardLayout lay = model.layout();
  const json mesh = m.contains("mesh") ? m.at("mesh") : json{{"tp", 1}, {"pp", 1}, {"dp", m.at("world_size")}};
  const bool same =
      m.at("world_size").get<int>() == comm.size() && mesh == json{{"tp", lay.tp}, {"pp", lay.pp}, {"dp", lay.dp}} &&
      m.at("params_sharded").get<bool>() == lay.params_sharded &&
      m.at("optim_sharded").get<bool>() == lay.optim_sharded &&
      m.at("shard_group_size").get<int>() == lay.shard_group_size && !(comm.world().is_local() && comm.size() > 1) &&
      saved.layout(lay.pp_rank, lay.tp_rank).at("units") == layout_json(model).at("units");
  std::map<std::string, at::Tensor> state;
  std::unique_ptr<SafetensorsFile> own, first;
  if (same) {
    own = std::make_unique<SafetensorsFile>((use / rank_file(comm.rank())).string());
    for (auto& [k, v] : own->tensors()) state[k] = v;
    model.load_local_state(state);
  } else {
    // Reshard: every parameter of this rank's units rebuilt whole from the checkpoint's pieces, its
    // tensor-parallel slice laid out in this plan's units by name, and this rank's part cut.
    for (auto& [name, dst] : model.local_state()) {
      if (name.rfind("adapters.", 0) == 0) {  // replicated on every rank: rank 0's copy
        if (!first) first = std::make_unique<SafetensorsFile>((use / rank_file(0)).string());
        auto it = first->tensors().find(name);
        if (it == first->tensors().end()) throw InputError((use / rank_file(0)).string() + ": missing tensor " + name);
        state[name] = it->second;
        continue;
      }
      const auto dot = name.find('.');
      const int u = std::stoi(name.substr(4, dot - 4));
      const std::string st = name.substr(dot + 1);
      const UnitInfo& ui = units[static_cast<std::size_t>(u)];
      at::Tensor padded = at::zeros({ui.padded}, at::kFloat);
      for (std::size_t i = 0; i < ui.params.size(); ++i) {
        at::Tensor whole = saved.whole(ui.params[i], st);
        if (ui.tp_dims[i] >= 0)
          whole = whole.narrow(ui.tp_dims[i], ui.tp_starts[i], ui.shapes[i][static_cast<std::size_t>(ui.tp_dims[i])]);
        padded.narrow(0, ui.offsets[i], numel_of(ui.shapes[i])).copy_(whole.reshape({-1}));
      }
      const bool sharded = st == "master" ? lay.params_sharded : lay.optim_sharded;
      state[name] = sharded ? padded.narrow(0, static_cast<int64_t>(lay.shard_rank) * ui.shard, ui.shard) : padded;
    }
    model.load_local_state(state);
  }
  ResumeState rs;
  rs.step = m.at("step").get<int64_t>();
  rs.loss_scale = m.value("loss_scale", 0.0);
  rs.good_steps = m.value("good_steps", 0);
  rs.dir = use.string();
  return rs;
}

int64_t export_checkpoint(const std::string& ckpt, const std::string& out) {
  fs::path dir(ckpt);
  if (!fs::exists(dir / "manifest.json")) {
    auto dirs = step_dirs(dir);
    if (dirs.empty()) throw InputError(ckpt + ": no checkpoint");
    dir = dirs.back();
  }
  const std::string problem = verify(dir);
  if (!problem.empty()) throw InputError("cannot export " + dir.string() + ": " + problem);
  const json m = read_manifest(dir);
  std::map<std::string, at::Tensor> params;
  CheckpointParams saved(m, dir);
  for (const auto& [name, pieces] : saved.pieces()) params[name] = saved.whole(name, "master");
  std::unique_ptr<SafetensorsFile> first;
  if (m.contains("adapters")) {  // LoRA adapters saved alongside, under their PEFT-style names
    first = std::make_unique<SafetensorsFile>((dir / rank_file(0)).string());
    const at::Tensor flat = first->tensors().at("adapters.params").reshape({-1});
    for (const auto& p : m.at("adapters").at("params")) {
      std::vector<int64_t> shape = p.at("shape").get<std::vector<int64_t>>();
      int64_t n = 1;
      for (auto s : shape) n *= s;
      params[p.at("name").get<std::string>()] = flat.narrow(0, p.at("offset").get<int64_t>(), n).view(shape).clone();
    }
  }
  write_safetensors(out, params, {{"format", "pt"}, {"source", "fsdp-run export of " + dir.string()}});
  return static_cast<int64_t>(params.size());
}

std::map<std::string, at::Tensor> load_safetensors_weights(const std::string& path, const ShardedModel& model,
                                                           std::ostream* notes) {
  const WeightFiles w = weight_files(path);
  const std::map<std::string, FoundTensor> found = tensors_in(w);
  const std::string listing = w.index.empty() ? w.files.front() : w.index;
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, want] : model_parameters(model)) {
    auto it = found.find(name);
    if (it != found.end())
      out[name] = as_parameter(it->second, name, want.shape);
    else if (want.required)
      throw InputError(listing + ": no tensor " + name + " (a parameter of the model, shape " +
                       c10::str(at::IntArrayRef(want.shape)) + ")");
  }
  note_not_loaded(found, out, listing, notes);
  return out;
}

}  // namespace fsdp::exec
