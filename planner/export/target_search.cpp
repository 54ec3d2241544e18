#include "export/target_search.hpp"

#include <algorithm>

#include "core/errors.hpp"
#include "export/knob_table.hpp"

namespace fsdp {

namespace {

const KnobRule* plain_rule(const TargetSpec& spec, const std::string& knob) {
  for (const KnobRule& r : spec.capabilities)
    if (r.knob == knob && r.kinds.empty()) return &r;
  return nullptr;
}

std::string values_text(const KnobRule& r) {
  std::string out;
  for (const auto& v : r.values) out += (out.empty() ? "" : ", ") + v;
  return out;
}

std::string who(const TargetSpec& spec) { return spec.target + " " + spec.version; }

// `flag`: the flag the user gave, where another than the knob's own pins it (--reduce-dtype for dtypes).
[[noreturn]] void refuse(const TargetSpec& spec, const Knob& k, const std::string& value, const KnobRule& r,
                         const char* flag = nullptr) {
  throw InputError(std::string(flag ? flag : k.flag) + ": " + who(spec) + " cannot express " + k.name + " " + value +
                   ": " + r.why + " (it expresses " + values_text(r) + "; " + r.source.text() + ")");
}

const std::vector<StrategyKind> kAllKinds{StrategyKind::Ddp,        StrategyKind::NoShard, StrategyKind::Zero1,
                                          StrategyKind::Zero2,      StrategyKind::Fsdp,    StrategyKind::Zero3,
                                          StrategyKind::FsdpGradOp, StrategyKind::Hsdp};

bool applies_to_some_kind(const Knob& k, Strategy s) {
  for (StrategyKind kind : kAllKinds) {
    s.kind = kind;
    if (k.applies(s)) return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> restrict_search(const TargetSpec& spec, const std::function<bool(const std::string&)>& given,
                                         SearchRequest& req) {
  std::vector<std::string> notes;
  const Cluster c = req.cluster;
  Strategy& base = req.base;
  // A vision-language model is planned with what the target trains of its vision side where --train-vision is not
  // given: the rule's first value, the target's default (ms-swift freezes the tower and the aligner,
  // TunerArguments freeze_vit and freeze_aligner; the others write no frozen module).
  if (const KnobRule* r = plain_rule(spec, "train_vision");
      r && !given("--train-vision") && req.graph != nullptr && req.graph->spec().vision && !r->values.empty()) {
    VisionTraining t{};
    if (parse_vision_training(r->values.front(), t) && t != base.train_vision) {
      base.train_vision = t;
      notes.push_back("train_vision " + r->values.front() + ", " + spec.target +
                      "'s default (--train-vision sets another): " + r->why);
    }
  }
  // Knobs the search does not enumerate: the base strategy's value must be one the target runs.
  for (const Knob& k : knob_table()) {
    if (k.searched) continue;
    const KnobRule* r = plain_rule(spec, k.name);
    if (!r) continue;
    // A knob that applies to some of the kinds the search tries (prefetch, buckets, grad_sync) is judged as if it
    // applied; one that applies to none (LoRA modules without an adapter, TP switches without TP) is not.
    if (!applies_to_some_kind(k, base)) continue;
    const std::string v = k.value(base, c);
    if (rule_admits(*r, v)) continue;
    if (given(k.flag)) refuse(spec, k, v, *r);
    const std::string to = nearest_value(*r, v);
    if (!k.set(base, to, c))
      throw InputError(spec.spec_path + ": capabilities." + k.name + ": '" + to + "' is not a value fsdp-plan can set");
    notes.push_back(std::string("pinned ") + k.name + " " + to + " (not " + v + "): " + r->why);
  }
  // Knobs the search enumerates: a pin must be expressible; a single expressible value becomes a pin.
  auto check_pin = [&](const char* knob, const Strategy& probe) {
    const Knob* k = find_knob(knob);
    const KnobRule* r = spec.rule(knob, probe.kind);
    if (r && k->applies(probe) && !rule_admits(*r, k->value(probe, c))) refuse(spec, *k, k->value(probe, c), *r);
  };
  Strategy probe = base;
  if (req.pins.strategy) {
    probe.kind = *req.pins.strategy;
    if (probe.kind == StrategyKind::Hsdp && req.pins.hsdp_group) probe.hsdp_group = *req.pins.hsdp_group;
    check_pin("strategy", probe);
    if (req.pins.hsdp_group) check_pin("hsdp_group", probe);
  }
  // The mesh degrees: a pinned tp or pp the target cannot write is refused before the search, as the other pins.
  if (req.pins.tp) {
    probe.mesh.tp = *req.pins.tp;
    check_pin("tp", probe);
  }
  if (req.pins.pp) {
    probe.mesh.pp = *req.pins.pp;
    check_pin("pp", probe);
  }
  if (req.pins.ep) {
    probe.mesh.ep = *req.pins.ep;
    check_pin("ep", probe);
  }
  if (req.pins.wrap) check_pin("wrap", probe);
  if (req.pins.reshard_after_forward) check_pin("reshard_after_forward", probe);
  if (req.pins.act_ckpt) check_pin("act_ckpt", probe);
  if (req.pins.offload) check_pin("offload", probe);
  if (req.pins.param_dtype || req.pins.reduce_dtype || given("--master-dtype")) {
    if (req.pins.param_dtype) probe.param_dtype = *req.pins.param_dtype;
    if (req.pins.reduce_dtype) probe.reduce_dtype = *req.pins.reduce_dtype;
    // The dtype pins may leave one free: then some triple the target expresses must have the pinned one (the
    // filter judges each searched triple), else no plan could be written.
    if (req.pins.param_dtype && req.pins.reduce_dtype) {
      check_pin("dtypes", probe);
    } else if (const KnobRule* r = spec.rule("dtypes", probe.kind)) {
      // Each triple read by the dtypes knob's own setter (param/reduce/master).
      const Knob& dtypes = *find_knob("dtypes");
      const bool some = std::any_of(r->values.begin(), r->values.end(), [&](const std::string& v) {
        Strategy t;
        return dtypes.set(t, v, c) && (!req.pins.param_dtype || t.param_dtype == *req.pins.param_dtype) &&
               (!req.pins.reduce_dtype || t.reduce_dtype == *req.pins.reduce_dtype);
      });
      const std::string param = req.pins.param_dtype ? to_string(*req.pins.param_dtype) : "*";
      const std::string reduce = req.pins.reduce_dtype ? to_string(*req.pins.reduce_dtype) : "*";
      if (!some)
        refuse(spec, dtypes, param + "/" + reduce + "/*", *r,
               req.pins.param_dtype ? "--param-dtype" : "--reduce-dtype");
    }
  }
  if (const KnobRule* r = plain_rule(spec, "strategy"); r && !req.pins.strategy) {
    std::vector<std::string> excluded;
    for (StrategyKind k : kAllKinds)
      if (!rule_admits(*r, to_string(k))) excluded.push_back(to_string(k));
    if (r->values.size() == 1) {
      StrategyKind k{};
      parse_strategy_kind(r->values.front(), k);
      req.pins.strategy = k;
    }
    if (!excluded.empty()) {
      std::string ex;
      for (const auto& e : excluded) ex += (ex.empty() ? "" : ", ") + e;
      notes.push_back("strategies " + values_text(*r) + " only (not " + ex + "): " + r->why);
    }
  }
  if (const KnobRule* r = plain_rule(spec, "wrap"); r && !req.pins.wrap && r->values.size() == 1) {
    WrapPolicy w;
    if (parse_wrap(r->values.front(), w)) {
      req.pins.wrap = w;
      notes.push_back("pinned wrap " + r->values.front() + ": " + r->why);
    }
  }
  if (const KnobRule* r = plain_rule(spec, "dtypes")) {
    // The master dtype is the base strategy's (the search enumerates param and reduce dtypes only): the user's
    // --master-dtype if some expressible triple has it, else the master of the target's first (preferred) triple.
    auto master_of = [](const std::string& v) { return v.substr(v.rfind('/') + 1); };
    const std::string current = to_string(base.master_dtype);
    bool admitted = false;
    for (const auto& v : r->values) admitted = admitted || master_of(v) == current;
    if (given("--master-dtype") && !admitted)
      refuse(spec, *find_knob("dtypes"), find_knob("dtypes")->value(base, c), *r);
    const std::string preferred = master_of(r->values.front());
    DType d{};
    if (!given("--master-dtype") && preferred != current && parse_dtype(preferred, d)) {
      base.master_dtype = d;
      notes.push_back("pinned master dtype " + preferred + " (not " + current + "): " + r->why);
    }
    if (!(notes.size() && notes.back().rfind("pinned master dtype", 0) == 0))
      notes.push_back("precision (param/reduce/master) " + values_text(*r) + " only: " + r->why);
  }
  if (const KnobRule* r = plain_rule(spec, "act_ckpt"); r && !req.pins.act_ckpt)
    notes.push_back("act_ckpt " + values_text(*r) + " only: " + r->why);
  if (const KnobRule* r = plain_rule(spec, "offload"); r && !req.pins.offload)
    notes.push_back("offload " + values_text(*r) + " only: " + r->why);
  const TargetSpec* sp = &spec;
  const SearchRequest* rq = &req;
  req.accept = [sp, rq](const Strategy& s) { return inexpressible(*sp, s, rq->cluster).empty(); };
  return notes;
}

void explain_excluded_families(const TargetSpec& spec, SearchResult& r) {
  const KnobRule* rule = plain_rule(spec, "strategy");
  if (!rule) return;
  for (StrategyKind k : kAllKinds) {
    const std::string name = to_string(k);
    if (rule_admits(*rule, name) || r.families.count(name)) continue;
    FamilyVerdict v;
    v.reason = spec.target + " " + spec.version + " cannot run it (it runs " + values_text(*rule) + ")";
    r.families[name] = v;
  }
}

}  // namespace fsdp
