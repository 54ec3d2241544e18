#include "cli/args.hpp"

#include <charconv>
#include <cmath>

#include "core/errors.hpp"

namespace fsdp {

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& value_flags,
           const std::set<std::string>& bool_flags) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    std::string name = a, value;
    bool inline_value = false;
    if (auto eq = a.find('='); eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    if (bool_flags.count(name)) {
      if (inline_value) throw InputError(name + ": takes no value");
      bools_.insert(name);
      continue;
    }
    if (!value_flags.count(name)) throw InputError(name + ": unknown option (see --help)");
    if (!inline_value) {
      if (i + 1 >= argv.size()) throw InputError(name + ": needs a value");
      value = argv[++i];
    }
    if (values_.count(name)) throw InputError(name + ": given twice");
    values_[name] = value;
  }
}

bool Args::has(const std::string& flag) const { return values_.count(flag) || bools_.count(flag); }

std::optional<std::string> Args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& flag, const std::string& fallback) const {
  auto v = get(flag);
  return v ? *v : fallback;
}

int64_t Args::get_int_or(const std::string& flag, int64_t fallback) const {
  auto v = get(flag);
  if (!v) return fallback;
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (ec != std::errc() || p != v->data() + v->size())
    throw InputError(flag + ": expected an integer, got '" + *v + "'");
  return out;
}

double Args::get_double_or(const std::string& flag, double fallback) const {
  auto v = get(flag);
  if (!v) return fallback;
  double out = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (ec != std::errc() || p != v->data() + v->size() || !std::isfinite(out))
    throw InputError(flag + ": expected a number, got '" + *v + "'");
  return out;
}

bool Args::get_bool_or(const std::string& flag, bool fallback) const {
  auto v = get(flag);
  if (!v) return fallback;
  if (*v == "true") return true;
  if (*v == "false") return false;
  throw InputError(flag + ": expected true or false, got '" + *v + "'");
}

}  // namespace fsdp
