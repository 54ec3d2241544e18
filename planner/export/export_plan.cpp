#include "export/export_plan.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.hpp"
#include "core/format.hpp"
#include "export/knob_table.hpp"
#include "report/plan_simulation.hpp"
#include "report/prediction_view.hpp"

namespace fsdp {

namespace {

namespace fs = std::filesystem;

Cluster cluster_of(const PlanFile& p) { return Cluster{p.cluster.nodes, p.cluster.gpus_per_node}; }

std::string prediction_text(const PlanFile& plan, const Strategy& s, const TargetSpec& spec,
                            const std::string& config_root) {
  PlanFile nearest = plan;
  nearest.strategy = s;
  nearest.runtime = spec.runtime;
  auto sim = simulate_plan(nearest, config_root);
  const Prediction& p = sim->prediction;
  return fmt("%.0f", p.tokens_per_s_per_gpu) + " tokens/s/GPU, " + format_gib(p.memory.device_total) + " GiB per GPU" +
         (p.fits ? "" : " (does not fit: " + format_gib(p.usable_bytes) + " GiB usable)") + " on runtime " +
         spec.runtime;
}

}  // namespace

ExportResult export_plan(const PlanFile& plan, const TargetSpec& target_spec, const std::string& config_root) {
  const TargetSpec spec = target_spec.for_model(plan.model_name);
  const Target& target = target_by_name(spec.target);
  const Cluster c = cluster_of(plan);
  // An HSDP group must leave replicas over the data-parallel ranks, or a target would write plain FSDP.
  const Strategy& st = plan.strategy;
  const int64_t dp = st.mesh.dp(c.world_size());
  if (st.kind == StrategyKind::Hsdp && (st.hsdp_group <= 0 || dp % st.hsdp_group != 0 || dp == st.hsdp_group))
    throw InputError("strategy.hsdp_group: " + std::to_string(st.hsdp_group) + " must divide the " +
                     std::to_string(dp) + " data-parallel ranks and leave more than one replica");
  const auto violations = inexpressible(spec, plan.strategy, c);
  if (!violations.empty()) {
    std::string msg =
        spec.target + " " + spec.version + " cannot express this plan (" + one_line_strategy(plan.strategy) + "):";
    for (const auto& v : violations) msg += "\n  " + v.message();
    const Strategy nearest = nearest_expressible(spec, plan.strategy, c);
    msg += "\nthe nearest plan " + spec.target + " runs: " + one_line_strategy(nearest) + " -> " +
           prediction_text(plan, nearest, spec, config_root) + "\n(plan it with fsdp-plan --target " + spec.target +
           " to search only what " + spec.target + " expresses)";
    throw InputError(msg);
  }
  target_model(spec, plan.model_name,
               plan.model_path);  // refuses a model the target cannot name, before writing anything
  ExportResult r = target.write(plan, spec);
  for (const WrittenFile& f : r.files)
    if (f.raw_text.empty()) check_against_table(f.keys, spec.file(f.name), spec.spec_path);
  return r;
}

std::vector<std::string> write_export(const ExportResult& r, const TargetSpec& spec, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw InputError("--out: cannot create directory '" + dir + "': " + ec.message());
  std::vector<std::string> written;
  auto put = [&](const std::string& name, const std::string& text, bool exec) {
    const fs::path path = fs::path(dir) / name;
    const std::string tmp = path.string() + ".tmp";
    {
      std::ofstream out(tmp);
      if (!out) throw InputError("--out: cannot write '" + path.string() + "'");
      out << text;
      if (!out) throw InputError("--out: failed writing '" + path.string() + "'");
    }
    fs::rename(tmp, path, ec);
    if (ec) throw InputError("--out: cannot rename into '" + path.string() + "'");
    if (exec) fs::permissions(path, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add, ec);
    written.push_back(path.string());
  };
  for (const WrittenFile& f : r.files)
    put(f.name, f.raw_text.empty() ? render_file(f, spec.file(f.name)) : f.raw_text, f.executable);
  std::string launch = shell_header(spec);
  for (const auto& n : r.notes) launch += "# " + n + "\n";
  launch += r.launch_command + "\n";
  put("launch.sh", launch, true);
  return written;
}

std::map<std::string, FlatDoc> read_export(const std::string& dir, const TargetSpec& spec) {
  std::map<std::string, FlatDoc> out;
  for (const FileTable& t : spec.files) {
    const fs::path path = fs::path(dir) / t.name;
    std::ifstream in(path);
    if (!in) throw InputError(path.string() + ": cannot open (" + spec.target + " " + spec.version + " writes it)");
    std::stringstream ss;
    ss << in.rdbuf();
    out[t.name] = parse_file(ss.str(), t, path.string());
  }
  return out;
}

Strategy import_export(const std::string& dir, const TargetSpec& spec, const ClusterShape& cluster) {
  return target_by_name(spec.target).read(dir, spec, cluster);
}

}  // namespace fsdp
