// Issue M11: every input fsdp-run reads is validated before the first step. Safetensors headers (--init-from and
// checkpoint shards), the weights against the model, token files against the vocabulary, the checkpoint
// directory's lock and free space, the run identity a checkpoint carries, flags that contradict each other.
#include "test_common.hpp"
// (torch and doctest first: test_common.hpp)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.hpp"
#include "dist/comm.hpp"
#include "io/checkpoint.hpp"
#include "io/checkpoint_lock.hpp"
#include "io/data.hpp"
#include "io/safetensors.hpp"
#include "safetensors_edit.hpp"
#include "shard/sharded_model.hpp"
#include "train/trainer.hpp"

namespace fsdp::exec::test {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A scratch directory of its own per test, removed at the end.
struct Scratch {
  fs::path dir;
  explicit Scratch(const std::string& name)
      : dir(fs::temp_directory_path() / ("exec_io_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string operator/(const std::string& n) const { return (dir / n).string(); }
};

// The message of the InputError `f` throws ("" if it throws none).
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::string f32_bytes(int n) { return std::string(static_cast<std::size_t>(4 * n), '\0'); }

RunConfig no_steps() {
  RunConfig c;
  c.steps = 0;
  return c;
}

// A one-rank trainer of the small model: its ShardedModel is what --init-from loads into.
struct SmallModel {
  std::unique_ptr<Comm> comm = Comm::emulate(1);
  Trainer trainer;
  SmallModel() : trainer(small_plan(StrategyKind::Fsdp, "layer", 1), no_steps(), *comm) {}
  ShardedModel& model() { return trainer.model(); }
};

}  // namespace

TEST_CASE("safetensors header: a JSON object of known keys, no name twice, each error naming the file") {
  Scratch s("header");
  const std::string f = s / "w.safetensors";
  auto refused = [&](const std::string& header, const std::string& data) {
    write_raw_safetensors(f, header, data);
    return refusal([&] { SafetensorsFile file(f); });
  };
  const std::string a = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  CHECK(refused("{" + a + "}", f32_bytes(2)).empty());

  std::string m = refused("[1, 2]", "");
  CHECK(m.find(f) == 0);
  CHECK(m.find("is a JSON array, not an object") != std::string::npos);
  m = refused("{\"a\": garbage", "");
  CHECK(m.find(f) == 0);
  CHECK(m.find("not valid JSON") != std::string::npos);
  CHECK(m.find("[json.exception") == std::string::npos);  // our words, not the JSON library's
  m = refused(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "stride": [1]}})", f32_bytes(2));
  CHECK(m.find("tensor a: unknown key 'stride'") != std::string::npos);
  m = refused(R"({"a": {"dtype": "F32", "shape": [2]}})", f32_bytes(2));
  CHECK(m.find("tensor a: no data_offsets") != std::string::npos);
  m = refused("{" + a + ", " + a + "}", f32_bytes(2));
  CHECK(m.find(f) == 0);
  CHECK(m.find("duplicate key 'a'") != std::string::npos);
  m = refused(R"({"__metadata__": {"format": 1}, )" + a + "}", f32_bytes(2));
  CHECK(m.find("__metadata__.format is not a string") != std::string::npos);
  m = refused(R"({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", f32_bytes(2));
  CHECK(m.find("tensor a: unsupported dtype \"Q4\"") != std::string::npos);
  m = refused(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", f32_bytes(2));
  CHECK(m.find("tensor a: shape [-2] holds -2, not a size") != std::string::npos);
  m = refused(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", f32_bytes(2));
  CHECK(m.find("is not [begin, end]") != std::string::npos);

  // A header length beyond the format's limit, and beyond the file.
  {
    std::ofstream o(f, std::ios::binary | std::ios::trunc);
    const std::string len("\xff\xff\xff\xff\x00\x00\x00\x00", 8);
    o << len << "{}";
  }
  CHECK(refusal([&] { SafetensorsFile file(f); }).find("exceeds the format's limit") != std::string::npos);
  write_raw_safetensors(f, "{}", "");
  fs::resize_file(f, 9);
  CHECK(refusal([&] { SafetensorsFile file(f); }).find("truncated safetensors header") != std::string::npos);
}

TEST_CASE("safetensors data: dtype x shape is the data_offsets' length; tensors tile the buffer exactly") {
  Scratch s("tiling");
  const std::string f = s / "w.safetensors";
  auto refused = [&](const std::string& header, const std::string& data) {
    write_raw_safetensors(f, header, data);
    return refusal([&] { SafetensorsFile file(f); });
  };
  // Three F32 values labelled F16: 6 bytes by their dtype, 12 by their offsets.
  std::string m = refused(R"({"a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 12]}})", f32_bytes(3));
  CHECK(m.find(f + ": tensor a: dtype F16 x shape [3] is 6 bytes, but its data_offsets [0, 12) hold 12") == 0);
  m = refused(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
              f32_bytes(3));
  CHECK(m.find("tensor b's data_offsets [4, 12) overlap tensor a's [0, 8)") != std::string::npos);
  m = refused(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                  "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
              f32_bytes(3));
  CHECK(m.find("data bytes [4, 8) belong to no tensor") != std::string::npos);
  m = refused(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", f32_bytes(2));
  CHECK(m.find("4 bytes after the last tensor's data belong to no tensor") != std::string::npos);
  m = refused(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", f32_bytes(1));
  CHECK(m.find("tensor a ends at data byte 8 but the file holds 4 data bytes (truncated file?)") != std::string::npos);
  m = refused(R"({"a": {"dtype": "F64", "shape": [4611686018427387904, 4], "data_offsets": [0, 8]}})", f32_bytes(2));
  CHECK(m.find("overflows") != std::string::npos);
  // Zero-size tensors take no bytes anywhere in the tiling.
  CHECK(refused(R"({"e": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
                    "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                f32_bytes(1))
            .empty());
}

TEST_CASE("--init-from weights: every parameter, floating, of the model's shape; extra tensors listed") {
  Scratch s("weights");
  SmallModel sm;
  const std::map<std::string, at::Tensor> params = sm.model().full_state_dict();
  const std::string f = s / "model.safetensors";
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  auto load = [&](std::ostream* notes = nullptr) { return load_safetensors_weights(f, sm.model(), notes); };

  write_safetensors(f, params);
  std::ostringstream notes;
  CHECK(load(&notes).size() == params.size());
  CHECK(notes.str().empty());

  // The issue's garbage: a float tensor labelled I32 has the right byte length, and is no weight.
  edit_safetensors_header(f, [&](json& h) { h[q]["dtype"] = "I32"; });
  CHECK(refusal([&] { load(); }) ==
        f + ": tensor " + q + " has dtype I32; a parameter needs a floating dtype (F32, BF16, F16 or F64)");

  std::map<std::string, at::Tensor> missing = params;
  missing.erase(q);
  write_safetensors(f, missing);
  CHECK(refusal([&] { load(); }).find(f + ": no tensor " + q + " (a parameter of the model, shape [66, 66])") == 0);

  std::map<std::string, at::Tensor> misshapen = params;
  misshapen[q] = misshapen[q].reshape({33, 132});
  write_safetensors(f, misshapen);
  CHECK(refusal([&] { load(); }) == f + ": tensor " + q + " has shape [33, 132], the model's parameter [66, 66]");

  // Tensors the model has no parameter for are loaded nowhere, and listed (not refused: see note_not_loaded).
  std::map<std::string, at::Tensor> extra = params;
  extra["model.layers.0.self_attn.rotary_emb.inv_freq"] = at::ones({11});
  write_safetensors(f, extra);
  notes.str("");
  CHECK(load(&notes).count("model.layers.0.self_attn.rotary_emb.inv_freq") == 0);
  CHECK(notes.str().find("1 tensor(s) are not parameters of this model and are not loaded: "
                         "model.layers.0.self_attn.rotary_emb.inv_freq") != std::string::npos);
  CHECK(notes.str().find(f) != std::string::npos);
}

TEST_CASE("--init-from a sharded directory: a tensor in two files, or not where the index says, is refused") {
  Scratch s("index");
  SmallModel sm;
  const std::map<std::string, at::Tensor> params = sm.model().full_state_dict();
  std::map<std::string, at::Tensor> first, second;
  json weight_map;
  for (const auto& [name, t] : params) {
    const bool in_first = name.find("layers") == std::string::npos;
    (in_first ? first : second)[name] = t;
    weight_map[name] = in_first ? "a.safetensors" : "b.safetensors";
  }
  write_safetensors(s / "a.safetensors", first);
  write_safetensors(s / "b.safetensors", second);
  auto write_index = [&](const json& map) {
    std::ofstream(s / "model.safetensors.index.json") << json{{"metadata", json::object()}, {"weight_map", map}};
  };
  write_index(weight_map);
  CHECK(load_safetensors_weights(s.dir.string(), sm.model(), nullptr).size() == params.size());

  json wrong = weight_map;
  wrong["lm_head.weight"] = "b.safetensors";
  write_index(wrong);
  CHECK(refusal([&] { load_safetensors_weights(s.dir.string(), sm.model(), nullptr); }) ==
        s / "model.safetensors.index.json" + ": the weight_map puts tensor lm_head.weight in " + s / "b.safetensors" +
            ", which does not hold it");

  write_index(weight_map);
  second["lm_head.weight"] = params.at("lm_head.weight");
  write_safetensors(s / "b.safetensors", second);
  CHECK(refusal([&] { load_safetensors_weights(s.dir.string(), sm.model(), nullptr); }) ==
        s / "b.safetensors" + ": tensor lm_head.weight is in " + s / "a.safetensors" + " too");

  std::ofstream(s / "model.safetensors.index.json") << R"({"weight_map": {"x": "a.safetensors"}, "weight_map": {}})";
  CHECK(refusal([&] {
          load_safetensors_weights(s.dir.string(), sm.model(), nullptr);
        }).find("duplicate key 'weight_map'") != std::string::npos);
}

TEST_CASE("token files: every id is checked against the vocabulary, the first bad one named with its position") {
  Scratch s("tokens");
  const std::string f = s / "tokens.bin";
  std::vector<uint16_t> ids(1000, 7);
  ids[999] = 300;  // the last id: a window rarely covers it
  std::ofstream(f, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), 2000);
  auto data = open_data(f, "uint16", 251, 8, 1);
  CHECK(data->num_tokens() == 1000);
  CHECK_NOTHROW(data->check_ids(0, 999, nullptr));  // a rank's share without the bad id
  CHECK(refusal([&] { data->check_ids(500, 1000, nullptr); }) ==
        f + ": token id 300 at position 999 (byte 1998) is beyond the model's vocabulary (251 ids)");
  CHECK(open_data("synthetic", "uint16", 251, 8, 1)->num_tokens() == 0);

  // Over 1 GiB, the scan notes its progress every GiB. (A sparse file: its zeros are valid ids.)
  const std::string big = s / "big.bin";
  const int64_t tokens = (int64_t{1} << 29) + 4096;  // 1 GiB + 8 KiB of uint16 ids
  {
    std::ofstream(big, std::ios::binary).put('\0');
    fs::resize_file(big, static_cast<uintmax_t>(2 * tokens));
    std::fstream o(big, std::ios::in | std::ios::out | std::ios::binary);
    o.seekp(2 * (tokens - 1));
    const uint16_t bad = 60000;
    o.write(reinterpret_cast<const char*>(&bad), 2);
  }
  auto large = open_data(big, "uint16", 251, 8, 1);
  std::ostringstream progress;
  const std::string m = refusal([&] { large->check_ids(0, tokens, &progress); });
  CHECK(m.find("token id 60000 at position " + std::to_string(tokens - 1)) != std::string::npos);
  CHECK(progress.str().find("fsdp-run: checked the token ids of " + big + ": 1.0 of 1.0 GiB") != std::string::npos);
}

TEST_CASE("checkpoint lock: one run per directory, the owner named; a stale lock is taken over with a note") {
  Scratch s("lock");
  const std::string dir = s / "ck";
  const std::string lock_file = dir + "/" + CheckpointLock::kFileName;
  const LockOwner me = this_process();
  {
    std::ostringstream notes;
    CheckpointLock held(dir, &notes);
    CHECK(fs::exists(lock_file));
    CHECK(notes.str().empty());
    // A second run (here: a second lock of this process, which is alive) is refused, naming the owner.
    const std::string m = refusal([&] { CheckpointLock again(dir, nullptr); });
    CHECK(m.find(lock_file + ": the checkpoint directory is in use by the fsdp-run pid " + std::to_string(me.pid) +
                 " on host " + me.host) == 0);
    CHECK(m.find("still running") != std::string::npos);
  }
  CHECK(!fs::exists(lock_file));  // released with its owner

  auto write_lock = [&](const LockOwner& o) {
    std::ofstream(lock_file) << json{
        {"host", o.host}, {"pid", o.pid}, {"boot_id", o.boot_id}, {"start_ticks", o.start_ticks}, {"since", o.since}};
  };
  // The owner died: a pid that no longer runs.
  const pid_t child = ::fork();
  if (child == 0) std::_Exit(0);
  ::waitpid(child, nullptr, 0);
  LockOwner dead = me;
  dead.pid = child;
  CHECK(owner_is_gone(dead));
  write_lock(dead);
  {
    std::ostringstream notes;
    CheckpointLock taken(dir, &notes);
    CHECK(notes.str().find("was left by the fsdp-run pid " + std::to_string(child)) != std::string::npos);
    CHECK(notes.str().find("no longer runs; taking it over") != std::string::npos);
    std::ifstream in(lock_file);
    CHECK(json::parse(in).at("pid").get<int64_t>() == me.pid);
  }
  // A pid that runs again, but as another process (another start time), and a lock from before a reboot: stale.
  LockOwner reused = me;
  reused.start_ticks = me.start_ticks + 1;
  CHECK(owner_is_gone(reused));
  LockOwner rebooted = me;
  rebooted.boot_id = "another-boot";
  CHECK((me.boot_id.empty() || owner_is_gone(rebooted)));
  CHECK(!owner_is_gone(me));
  // Another host's owner cannot be checked from here: refused, named.
  LockOwner remote = dead;
  remote.host = "elsewhere";
  CHECK(!owner_is_gone(remote));
  write_lock(remote);
  CHECK(refusal([&] {
          CheckpointLock other(dir, nullptr);
        }).find("pid " + std::to_string(child) + " on host elsewhere") != std::string::npos);
  std::ofstream(lock_file) << "not json";
  CHECK(refusal([&] { CheckpointLock other(dir, nullptr); }).find("not a lock file of fsdp-run") != std::string::npos);
}

TEST_CASE("checkpoint directory: unwritable or without room for one checkpoint, refused at start") {
  Scratch s("room");
  // /proc is a directory in which nobody, root included, can create a file.
  CHECK(refusal([] { CheckpointLock l("/proc", nullptr); }).find("/proc: the checkpoint directory is not writable") ==
        0);
  std::ofstream(s / "plain") << "x";
  CHECK(refusal([&] { CheckpointLock l(s / "plain/ck", nullptr); }).find("cannot create the checkpoint directory") !=
        std::string::npos);
  CHECK_NOTHROW(check_free_space(s.dir.string(), 1));
  const std::string m = refusal([&] { check_free_space(s.dir.string(), int64_t{1} << 62); });
  CHECK(m.find(s.dir.string() + ": ") == 0);
  CHECK(m.find("MiB free, one checkpoint of this run takes 4398046511104.0 MiB") != std::string::npos);
  SmallModel sm;
  // Master (4 bytes) and two Adam states (8 bytes) per parameter, one rank file.
  CHECK(checkpoint_bytes(sm.model(), 1) >= 12 * sm.model().num_params());
  CHECK(checkpoint_bytes(sm.model(), 1) < 12 * sm.model().num_params() + (1 << 20));
}

TEST_CASE(
    "checkpoint publishing: the manifest carries its own checksum and the run; unverified steps stay unpublished") {
  Scratch s("publish");
  const std::string ck = s / "ck";
  const PlanFile p = small_plan(StrategyKind::Fsdp, "layer", 1);
  RunConfig c;
  c.steps = 2;
  c.seed = 7;
  c.checkpoint_dir = ck;
  c.checkpoint_every = 1;
  {
    auto solo = Comm::emulate(1);
    Trainer t(p, c, *solo);
    CHECK(fs::exists(ck + "/" + CheckpointLock::kFileName));  // taken before the first step
    t.run(nullptr);
  }
  CHECK(!fs::exists(ck + "/" + CheckpointLock::kFileName));
  std::ifstream in(ck + "/step-00000002/manifest.json");
  const json m = json::parse(in);
  CHECK(m.at("version") == 2);
  CHECK(m.at("run").at("seed") == 7);
  CHECK(m.at("run").at("plan_hash") == plan_hash(p));
  CHECK(m.at("manifest_checksum").get<std::string>().size() == 16);
  // Rank 1's file read back with another checksum than it was written with: the step is not published.
  const at::Tensor sums = at::tensor(std::vector<int64_t>{11, 11, 5, 6}).view({2, 2});
  CHECK_THROWS_WITH(check_read_back(sums, "ck/step-00000003.partial", 3),
                    "ck/step-00000003.partial/rank-00001.safetensors: reads back with checksum 0000000000000006 but "
                    "was written with 0000000000000005; step 3 is not published (the previous steps are kept)");
  CHECK_NOTHROW(check_read_back(sums.narrow(0, 0, 1), "ck/step-00000003.partial", 3));
}

TEST_CASE("run identity: the plan's trajectory, not its layout") {
  const PlanFile fsdp2 = small_plan(StrategyKind::Fsdp, "layer", 2, 2);
  PlanFile solo = small_plan(StrategyKind::NoShard, "every:2", 1, 4);  // one rank, the same 4 rows a step
  solo.strategy.act_ckpt = ActCkpt::Full;
  CHECK(plan_hash(fsdp2) == plan_hash(solo));
  PlanFile lr = fsdp2;
  lr.training.lr *= 2;
  CHECK(plan_hash(lr) != plan_hash(fsdp2));
  PlanFile rows = fsdp2;
  rows.strategy.grad_accum = 2;
  CHECK(plan_hash(rows) != plan_hash(fsdp2));
  PlanFile model = fsdp2;
  model.model.ffn_size += 1;
  CHECK(plan_hash(model) != plan_hash(fsdp2));
}

TEST_CASE("flags that contradict each other are refused before any rank starts") {
  RunConfig c;
  c.checkpoint_every = 2;
  CHECK(refusal([&] { check_run_config(c); }) ==
        "--checkpoint-every 2 needs --checkpoint-dir DIR (without it no checkpoint is written)");
  c.checkpoint_dir = "ck";
  CHECK_NOTHROW(check_run_config(c));
  c.checkpoint_every = 0;
  CHECK(refusal([&] { check_run_config(c); }).find("--checkpoint-dir ck needs --checkpoint-every N") == 0);
  c.checkpoint_every = 2;
  c.emulate_world_size = 8;
  CHECK(refusal([&] { check_run_config(c); }).find("--emulate-world-size") != std::string::npos);
  RunConfig any;
  any.resume_any = true;
  CHECK(refusal([&] { check_run_config(any); }) == "--resume-any needs --resume DIR");
  // Values no run can use, and files that are not there: refused once, by the launcher, before any rank starts.
  RunConfig keep;
  keep.keep_checkpoints = 0;
  CHECK(refusal([&] { check_run_config(keep); }) == "--keep-checkpoints must be at least 1, got 0");
  RunConfig dtype;
  dtype.data_dtype = "int8";
  CHECK(refusal([&] { check_run_config(dtype); }) == "--data-dtype: 'int8' is not one of: uint16, uint32");
  dtype.data_dtype = "uint32";
  CHECK(refusal([&] { check_run_config(dtype); }).find("applies to a token file (--data FILE)") != std::string::npos);
  RunConfig files;
  files.data = "/nonexistent/tokens.bin";
  CHECK(refusal([&] { check_run_config(files); }) == "/nonexistent/tokens.bin: cannot open token file (--data)");
  files.data = "synthetic";
  files.init_from = "/nonexistent/w.safetensors";
  CHECK(refusal([&] { check_run_config(files); }).find("/nonexistent/w.safetensors: no such file") == 0);
  files.init_from.clear();
  files.resume_dir = "/nonexistent/ck";
  CHECK(refusal([&] { check_run_config(files); }).find("/nonexistent/ck: no such checkpoint directory") == 0);
}

}  // namespace fsdp::exec::test
