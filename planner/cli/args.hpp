// Strict command-line parsing: every flag must be declared by the subcommand; unknown flags,
// missing values and bad numbers are InputErrors naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace fsdp {

class Args {
 public:
  // value_flags take one value ("--model 70b" or "--model=70b"); bool_flags take none.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& value_flags,
       const std::set<std::string>& bool_flags);
  bool has(const std::string& flag) const;
  std::optional<std::string> get(const std::string& flag) const;
  std::string get_or(const std::string& flag, const std::string& fallback) const;
  int64_t get_int_or(const std::string& flag, int64_t fallback) const;
  double get_double_or(const std::string& flag, double fallback) const;
  bool get_bool_or(const std::string& flag, bool fallback) const;  // "--x true|false" for value flags
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> bools_;
  std::vector<std::string> positional_;
};

}  // namespace fsdp
