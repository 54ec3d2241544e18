#include "io/checkpoint.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "core/errors.hpp"
#include "dist/comm.hpp"
#include "io/safetensors.hpp"
#include "shard/sharded_model.hpp"

namespace fsdp::exec {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kCheckpointVersion = 1;

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

json read_manifest(const fs::path& dir) {
  const fs::path mp = dir / "manifest.json";
  std::ifstream in(mp);
  if (!in) throw InputError(mp.string() + ": missing (partial checkpoint?)");
  try {
    json j = json::parse(in);
    if (j.value("format", "") != "fsdp-run-checkpoint")
      throw InputError(mp.string() + ": not an fsdp-run checkpoint manifest");
    if (j.value("version", 0) > kCheckpointVersion)
      throw InputError(mp.string() + ": checkpoint version " + std::to_string(j.value("version", 0)) +
                       " is newer than this fsdp-run reads (" + std::to_string(kCheckpointVersion) + ")");
    return j;
  } catch (const json::exception& e) {
    throw InputError(mp.string() + ": malformed manifest: " + e.what());
  }
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

// The full (unpadded, numel) flat fp32 tensor of `state` of unit `u`, rebuilt from the rank files.
at::Tensor reconstruct(const json& m, const fs::path& dir, std::map<int, std::unique_ptr<SafetensorsFile>>& files,
                       int u, const std::string& state) {
  const json& unit = m.at("units").at(static_cast<std::size_t>(u));
  const int64_t numel = unit.at("numel").get<int64_t>();
  const bool sharded = state == "master" ? m.at("params_sharded").get<bool>() : m.at("optim_sharded").get<bool>();
  const int G = sharded ? m.at("shard_group_size").get<int>() : 1;
  const std::string key = "unit" + std::to_string(u) + "." + state;
  std::vector<at::Tensor> parts;
  for (int r = 0; r < G; ++r) {  // ranks 0..G-1 form the first shard group (world or HSDP's first)
    auto& f = files[r];
    if (!f) f = std::make_unique<SafetensorsFile>((dir / rank_file(r)).string());
    auto it = f->tensors().find(key);
    if (it == f->tensors().end()) throw InputError((dir / rank_file(r)).string() + ": missing tensor " + key);
    parts.push_back(it->second.reshape({-1}));
  }
  at::Tensor flat = parts.size() == 1 ? parts[0] : at::cat(parts);
  if (flat.numel() < numel) throw InputError(dir.string() + ": tensor " + key + " is shorter than the unit");
  return flat.narrow(0, 0, numel);
}

}  // namespace

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
  const uint64_t sum = write_safetensors((partial / rank_file(rank)).string(), model.local_state());
  at::Tensor mine = at::empty({1}, at::kLong);
  mine[0] = static_cast<int64_t>(sum);
  at::Tensor all = at::empty({comm.size()}, at::kLong);
  comm.world().all_gather(mine, all).wait();
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
    m["loss_scale"] = meta.loss_scale;
    m["good_steps"] = meta.good_steps;
    m["seed"] = meta.seed;
    m["data"] = {{"source", meta.data}, {"next_step", meta.step + 1}};
    m["rng"] = "stateless: data and initialisation derive from (seed, step, row)";
    m["plan_path"] = meta.plan_path;
    m["plan"] = write_plan_text(plan);
    json units = json::array();
    for (const auto& u : model.units()) {
      json ps = json::array();
      for (std::size_t i = 0; i < u.params.size(); ++i)
        ps.push_back({{"name", u.params[i]}, {"shape", u.shapes[i]}, {"offset", u.offsets[i]}});
      units.push_back({{"name", u.name}, {"numel", u.numel}, {"padded", u.padded}, {"shard", u.shard}, {"params", ps}});
    }
    m["units"] = units;
    if (const UnitInfo* a = model.adapters()) {
      json ps = json::array();
      for (std::size_t i = 0; i < a->params.size(); ++i)
        ps.push_back({{"name", a->params[i]}, {"shape", a->shapes[i]}, {"offset", a->offsets[i]}});
      m["adapters"] = {{"numel", a->numel}, {"params", ps}, {"tensor", "adapters.params"}, {"replicated", true}};
    }
    json files = json::array();
    for (int r = 0; r < comm.size(); ++r)
      files.push_back(
          {{"rank", r}, {"file", rank_file(r)}, {"checksum", hex(static_cast<uint64_t>(all[r].item<int64_t>()))}});
    m["files"] = files;
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

ResumeState load_checkpoint(const std::string& dir_s, Comm& comm, ShardedModel& model, const PlanFile& plan) {
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

  // The model must be the same, parameter by parameter (names and shapes); its wrap units, the strategy's
  // layout and the world size may differ (resharded below by parameter name).
  const auto& units = model.units();
  struct Where {
    int unit;
    int64_t offset, numel;
    std::vector<int64_t> shape;
  };
  std::map<std::string, Where> saved;
  for (std::size_t cu = 0; cu < m.at("units").size(); ++cu)
    for (const auto& p : m.at("units")[cu].at("params")) {
      auto shape = p.at("shape").get<std::vector<int64_t>>();
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      saved[p.at("name").get<std::string>()] = Where{static_cast<int>(cu), p.at("offset").get<int64_t>(), n, shape};
    }
  std::size_t expected = 0;
  bool same_units = m.at("units").size() == units.size();
  for (std::size_t u = 0; u < units.size(); ++u) {
    const UnitInfo& ui = units[u];
    expected += ui.params.size();
    for (std::size_t i = 0; i < ui.params.size(); ++i) {
      auto it = saved.find(ui.params[i]);
      if (it == saved.end())
        throw InputError(use.string() + ": checkpoint has no parameter " + ui.params[i] + " (model changed)");
      if (it->second.shape != ui.shapes[i])
        throw InputError(use.string() + ": parameter " + ui.params[i] +
                         " has another shape in the checkpoint (model changed)");
      same_units = same_units && it->second.unit == static_cast<int>(u) && it->second.offset == ui.offsets[i];
    }
    same_units = same_units && m.at("units")[u].at("numel").get<int64_t>() == ui.numel;
  }
  if (saved.size() != expected)
    throw InputError(use.string() + ": checkpoint holds " + std::to_string(saved.size()) +
                     " parameters, this plan's model " + std::to_string(expected) + " (model changed)");
  (void)plan;

  const ShardLayout lay = model.layout();
  const bool same = same_units && m.at("world_size").get<int>() == comm.size() &&
                    m.at("params_sharded").get<bool>() == lay.params_sharded &&
                    m.at("optim_sharded").get<bool>() == lay.optim_sharded &&
                    m.at("shard_group_size").get<int>() == lay.shard_group_size &&
                    !(comm.world().is_local() && comm.size() > 1);
  std::map<std::string, at::Tensor> state;
  std::map<int, std::unique_ptr<SafetensorsFile>> files;
  if (same) {
    files[comm.rank()] = std::make_unique<SafetensorsFile>((use / rank_file(comm.rank())).string());
    for (auto& [k, v] : files[comm.rank()]->tensors()) state[k] = v;
    model.load_local_state(state);
  } else {
    // Reshard: rebuild the checkpoint units' full flat tensors, lay every parameter's slice out in this plan's
    // units by name, and cut this rank's part.
    std::map<std::pair<int, std::string>, at::Tensor> full_of;
    for (auto& [name, dst] : model.local_state()) {
      if (name.rfind("adapters.", 0) == 0) {  // replicated on every rank: rank 0's copy
        auto& f0 = files[0];
        if (!f0) f0 = std::make_unique<SafetensorsFile>((use / rank_file(0)).string());
        auto it = f0->tensors().find(name);
        if (it == f0->tensors().end()) throw InputError((use / rank_file(0)).string() + ": missing tensor " + name);
        state[name] = it->second;
        continue;
      }
      const auto dot = name.find('.');
      const int u = std::stoi(name.substr(4, dot - 4));
      const std::string st = name.substr(dot + 1);
      const UnitInfo& ui = units[static_cast<std::size_t>(u)];
      at::Tensor padded = at::zeros({ui.padded}, at::kFloat);
      for (std::size_t i = 0; i < ui.params.size(); ++i) {
        const Where& w = saved.at(ui.params[i]);
        auto key = std::make_pair(w.unit, st);
        if (!full_of.count(key)) full_of[key] = reconstruct(m, use, files, w.unit, st);
        padded.narrow(0, ui.offsets[i], w.numel).copy_(full_of[key].narrow(0, w.offset, w.numel));
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
  std::map<int, std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, at::Tensor> params;
  for (std::size_t u = 0; u < m.at("units").size(); ++u) {
    at::Tensor full = reconstruct(m, dir, files, static_cast<int>(u), "master");
    for (const auto& p : m.at("units")[u].at("params")) {
      std::vector<int64_t> shape = p.at("shape").get<std::vector<int64_t>>();
      int64_t n = 1;
      for (auto s : shape) n *= s;
      params[p.at("name").get<std::string>()] = full.narrow(0, p.at("offset").get<int64_t>(), n).view(shape).clone();
    }
  }
  if (m.contains("adapters")) {  // LoRA adapters saved alongside, under their PEFT-style names
    files[0] = files[0] ? std::move(files[0]) : std::make_unique<SafetensorsFile>((dir / rank_file(0)).string());
    const at::Tensor flat = files[0]->tensors().at("adapters.params").reshape({-1});
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

std::map<std::string, at::Tensor> load_safetensors_weights(const std::string& path, const ShardedModel& model) {
  // The maps stay open for the process lifetime: the returned tensors alias them.
  static std::vector<std::unique_ptr<SafetensorsFile>> open_files;
  std::vector<std::string> paths;
  fs::path p(path);
  if (fs::is_directory(p)) {
    const fs::path index = p / "model.safetensors.index.json";
    if (fs::exists(index)) {
      std::ifstream in(index);
      json j;
      try {
        j = json::parse(in);
      } catch (const json::exception& e) {
        throw InputError(index.string() + ": malformed index: " + e.what());
      }
      std::vector<std::string> seen;
      for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) {
        std::string f = (p / it.value().get<std::string>()).string();
        if (std::find(seen.begin(), seen.end(), f) == seen.end()) seen.push_back(f);
      }
      paths = seen;
    } else if (fs::exists(p / "model.safetensors")) {
      paths.push_back((p / "model.safetensors").string());
    } else {
      throw InputError(path + ": neither model.safetensors.index.json nor model.safetensors found");
    }
  } else {
    paths.push_back(path);
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& f : paths) {
    open_files.push_back(std::make_unique<SafetensorsFile>(f));
    for (const auto& [k, v] : open_files.back()->tensors())
      out[k] = v.scalar_type() == at::kFloat ? v : v.to(at::kFloat);
  }
  (void)model;
  return out;
}

}  // namespace fsdp::exec
