#include "core/duplicate_keys.hpp"

#include <cstddef>
#include <iterator>
#include <map>
#include <utility>
#include <vector>

#include "core/errors.hpp"

namespace fsdp {

namespace {

using json = nlohmann::json;

[[noreturn]] void duplicate_key(const std::string& source, int line, const std::string& path, int first_line) {
  throw InputError(source + ":" + std::to_string(line) + ": duplicate key '" + path + "' (first at line " +
                   std::to_string(first_line) + ")");
}

int yaml_line(const YAML::Node& n) {
  int line = n.Mark().line;  // 0-based; -1 for a node without a mark
  return line < 0 ? 1 : line + 1;
}

class YamlKeyWalk {
 public:
  explicit YamlKeyWalk(const std::string& source) : source_(source) {}

  void walk(const YAML::Node& node, const std::string& path) {
    if (!first_visit(node)) return;
    if (node.IsMap()) walk_map(node, path);
    if (node.IsSequence()) walk_sequence(node, path);
  }

 private:
  // Items are named like ConfigMap::get_list_of_maps names them: "key[i]".
  void walk_sequence(const YAML::Node& seq, const std::string& path) {
    size_t i = 0;
    for (auto it = seq.begin(); it != seq.end(); ++it, ++i) walk(*it, path + "[" + std::to_string(i) + "]");
  }

  void walk_map(const YAML::Node& map, const std::string& path) {
    std::map<std::string, int> first_line;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string key_path = join_key_path(path, it->first.Scalar());
      if (it->first.IsScalar()) {
        auto [first, fresh] = first_line.emplace(it->first.Scalar(), yaml_line(it->first));
        if (!fresh) duplicate_key(source_, yaml_line(it->first), key_path, first->second);
      }
      walk(it->second, key_path);
    }
  }

  // A YAML alias makes a collection reachable twice, or from inside itself (`a: &x [*x]` loads as a cycle in
  // yaml-cpp 0.7), so each collection is walked once; Node::is compares identity, the text position narrows the
  // candidates.
  bool first_visit(const YAML::Node& node) {
    if (!node.IsMap() && !node.IsSequence()) return true;
    std::vector<YAML::Node>& same_place = seen_[node.Mark().pos];
    for (const YAML::Node& n : same_place)
      if (n.is(node)) return false;
    same_place.push_back(node);
    return true;
  }

  const std::string& source_;
  std::map<int, std::vector<YAML::Node>> seen_;
};

// The line nlohmann's lexer has read up to. The lexer pulls one character at a time through
// iterator_input_adapter (nlohmann/json 3.11 detail/input/input_adapters.hpp) and, when the parser reports a key,
// has read exactly through the key's closing quote; the counter advances monotonically, so all lines cost one pass.
struct ReadLine {
  const char* read = nullptr;     // the last character handed to the lexer
  const char* counted = nullptr;  // newlines before this one are counted in `line`
  int line = 1;

  int current() {
    for (; counted < read; ++counted)
      if (*counted == '\n') ++line;
    return line;
  }
};

// A const char* that tells `ReadLine` which character the lexer took last.
class TrackedChars {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  TrackedChars(const char* p, ReadLine* read) : p_(p), read_(read) {}
  reference operator*() const {
    read_->read = p_;
    return *p_;
  }
  TrackedChars& operator++() {
    ++p_;
    return *this;
  }
  TrackedChars operator++(int) {
    TrackedChars before = *this;
    ++p_;
    return before;
  }
  bool operator==(const TrackedChars& o) const { return p_ == o.p_; }
  bool operator!=(const TrackedChars& o) const { return p_ != o.p_; }

 private:
  const char* p_;
  ReadLine* read_;
};

// The parser callback: one frame per open object or array, holding its path and, for an object, the line of
// each member name seen so far.
class JsonKeyCheck {
 public:
  JsonKeyCheck(const std::string& source, ReadLine& read) : source_(source), read_(read) {}

  bool on_event(json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        open(event == json::parse_event_t::array_start);
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        break;
      case json::parse_event_t::key:
        on_key(parsed.get_ref<const std::string&>());
        break;
      case json::parse_event_t::value:
        next_child_path();  // a scalar: counts as an array element
        break;
    }
    return true;  // keep every value
  }

 private:
  struct Frame {
    std::string path;
    bool array = false;
    size_t next_index = 0;            // arrays: the index of the next element
    std::string key;                  // objects: the member being read
    std::map<std::string, int> line;  // objects: the line of each member name
  };

  void open(bool array) {
    Frame f;
    f.path = next_child_path();
    f.array = array;
    frames_.push_back(std::move(f));
  }

  // The path of the value that starts now; an array's element index advances.
  std::string next_child_path() {
    if (frames_.empty()) return "";
    Frame& f = frames_.back();
    if (f.array) return f.path + "[" + std::to_string(f.next_index++) + "]";
    return join_key_path(f.path, f.key);
  }

  void on_key(const std::string& key) {
    Frame& f = frames_.back();
    const int line = read_.current();
    auto [first, fresh] = f.line.emplace(key, line);
    if (!fresh) duplicate_key(source_, line, join_key_path(f.path, key), first->second);
    f.key = key;
  }

  const std::string& source_;
  ReadLine& read_;
  std::vector<Frame> frames_;
};

}  // namespace

std::string join_key_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

void reject_duplicate_yaml_keys(const YAML::Node& root, const std::string& source) {
  YamlKeyWalk(source).walk(root, "");
}

json parse_json_unique_keys(const std::string& text, const std::string& source) {
  ReadLine read{text.data(), text.data()};
  JsonKeyCheck check(source, read);
  const char* end = text.data() + text.size();
  return json::parse(
      TrackedChars(text.data(), &read), TrackedChars(end, &read),
      [&check](int /*depth*/, json::parse_event_t event, json& parsed) { return check.on_event(event, parsed); });
}

}  // namespace fsdp
