#include "sluice/runtime/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "sluice/common/check.h"
#include "sluice/common/enum_names.h"
#include "sluice/common/file_util.h"

namespace sluice::runtime {
namespace {

constexpr std::string_view kCommandLine = "command line";

bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// Dotted segments of [A-Za-z0-9_-]: such keys never need quoting in YAML.
bool IsValidKey(std::string_view key) {
  if (key.empty() || key.front() == '.' || key.back() == '.') return false;
  for (size_t i = 0; i < key.size(); ++i) {
    if (key[i] == '.' ? key[i + 1] == '.' : !IsKeyChar(key[i])) return false;
  }
  return true;
}

std::string Join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

std::string LastSegment(const std::string& key) {
  const size_t dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

// Shortest text that parses back to exactly `value`, always recognisably a
// float to YAML 1.1 readers too (PyYAML wants a '.' in "1.0e-05").
std::string FormatDouble(double value) {
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  SLUICE_CHECK(ec == std::errc());
  std::string text(buffer, end);
  if (text.find('.') == std::string::npos) {
    const size_t exponent = text.find('e');
    text.insert(exponent == std::string::npos ? text.size() : exponent, ".0");
  }
  return text;
}

// A YAML double-quoted scalar.
std::string Quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          static constexpr char kHex[] = "0123456789abcdef";
          out += "\\x";
          out += kHex[static_cast<unsigned char>(c) >> 4];
          out += kHex[static_cast<unsigned char>(c) & 0xf];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// A scalar as written in YAML or on the command line.
struct Scalar {
  std::string text;
  bool quoted = false;  // quoted (or tagged !!str): a string, whatever it looks like
};

// "a map", "a sequence", ... for messages.
std::string KindName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "map";
    case YAML::NodeType::Sequence:
      return "sequence";
    case YAML::NodeType::Scalar:
      return "scalar";
    default:
      return "null";
  }
}

// What a key accepts, in words: "an integer in [1, 64]", "one of a, b".
std::string Allowed(const ConfigKey& k) {
  switch (k.type) {
    case ConfigType::kInt:
      if (k.int_min == std::numeric_limits<int64_t>::min() && k.int_max == std::numeric_limits<int64_t>::max()) {
        return "any integer";
      }
      return "an integer in [" + std::to_string(k.int_min) + ", " + std::to_string(k.int_max) + "]";
    case ConfigType::kDouble:
      if (std::isinf(k.double_min) && std::isinf(k.double_max)) return "any number";
      return "a number in [" + FormatDouble(k.double_min) + ", " + FormatDouble(k.double_max) + "]";
    case ConfigType::kBool:
      return "true or false";
    case ConfigType::kString:
      return "any string";
    case ConfigType::kEnum:
      return "one of " + Join(k.allowed, ", ");
    case ConfigType::kMap:
      return "a map (in YAML, nested; on the command line, a JSON object)";
  }
  return "";
}

// A map key's value: YAML nested under it, as JSON (scalars typed as the
// header says). InvalidArgument past kMaxMapDepth levels or for a key that
// is not a scalar.
constexpr int kMaxMapDepth = 32;
Result<nlohmann::ordered_json> YamlToJson(const YAML::Node& node, int depth) {
  if (depth > kMaxMapDepth) return Status::InvalidArgument("nested deeper than " + std::to_string(kMaxMapDepth));
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (!it->first.IsScalar()) return Status::InvalidArgument("a map's keys must be scalars");
        SLUICE_ASSIGN_OR_RETURN(out[it->first.Scalar()], YamlToJson(it->second, depth + 1));
      }
      return out;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const YAML::Node& item : node) {
        SLUICE_ASSIGN_OR_RETURN(nlohmann::ordered_json v, YamlToJson(item, depth + 1));
        out.push_back(std::move(v));
      }
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      const std::string& tag = node.Tag();
      using J = nlohmann::ordered_json;
      if (tag == "!" || (tag.size() >= 4 && tag.compare(tag.size() - 4, 4, ":str") == 0)) return J(text);
      if (text == "~" || text == "null" || text == "Null" || text == "NULL") return J();
      std::string lower = text;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) { return std::tolower(c); });
      if (lower == "true" || lower == "false") return J(lower == "true");
      const J number = J::parse(text, nullptr, /*allow_exceptions=*/false);
      if (number.is_number()) return number;
      return J(text);
    }
    default:
      return nlohmann::ordered_json();
  }
}

// The value as ToYaml writes it.
std::string FormatValue(const ConfigValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&value)) return FormatDouble(*d);
  if (const auto* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  return Quote(std::get<std::string>(value));
}

std::string Shown(const Scalar& s) { return (s.quoted ? "the quoted string '" : "'") + s.text + "'"; }

// The problem with `s` as a value for `k`, as the error message's tail.
Result<ConfigValue> ParseValue(const ConfigKey& k, const Scalar& s) {
  auto wrong_type = [&] { return Status::InvalidArgument("expected " + Allowed(k) + ", got " + Shown(s)); };
  auto out_of_range = [&] { return Status::InvalidArgument(s.text + " is out of range; allowed: " + Allowed(k)); };
  // Numbers: an optional sign (from_chars takes only '-'), then the body.
  std::string_view body = s.text;
  const bool negative = !body.empty() && body.front() == '-';
  if (!body.empty() && (body.front() == '+' || body.front() == '-')) body.remove_prefix(1);
  switch (k.type) {
    case ConfigType::kInt: {
      if (s.quoted || body.empty() ||
          !std::all_of(body.begin(), body.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return wrong_type();
      }
      const std::string digits = (negative ? "-" : "") + std::string(body);
      int64_t v = 0;
      auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (ec != std::errc() || end != digits.data() + digits.size()) return out_of_range();
      if (v < k.int_min || v > k.int_max) return out_of_range();
      return ConfigValue{v};
    }
    case ConfigType::kDouble: {
      if (s.quoted) return wrong_type();
      double v = 0;
      std::string lower(body);
      std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) { return std::tolower(c); });
      if (lower == ".inf") {
        v = negative ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
      } else {
        // from_chars alone would also take "nan", "inf" and hex floats.
        const bool plain = std::all_of(body.begin(), body.end(), [](char c) {
          return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
        });
        const bool has_digit = std::any_of(body.begin(), body.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!plain || !has_digit || body.front() == '+' || body.front() == '-') return wrong_type();
        const std::string number = (negative ? "-" : "") + std::string(body);
        auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
        if (ec == std::errc::result_out_of_range) return out_of_range();
        if (ec != std::errc() || end != number.data() + number.size()) return wrong_type();
      }
      if (!(v >= k.double_min && v <= k.double_max)) return out_of_range();
      return ConfigValue{v};
    }
    case ConfigType::kBool: {
      std::string lower = s.text;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) { return std::tolower(c); });
      if (s.quoted || (lower != "true" && lower != "false")) return wrong_type();
      return ConfigValue{lower == "true"};
    }
    case ConfigType::kString:
      return ConfigValue{s.text};
    case ConfigType::kEnum:
      if (std::find(k.allowed.begin(), k.allowed.end(), s.text) == k.allowed.end()) {
        return Status::InvalidArgument("'" + s.text + "' is not allowed; allowed: " + Allowed(k));
      }
      return ConfigValue{s.text};
    case ConfigType::kMap: {
      // JSON object text (a command-line value, or ToYaml's quoted form).
      const nlohmann::ordered_json j = nlohmann::ordered_json::parse(s.text, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        return Status::InvalidArgument("expected " + Allowed(k) + ", got " + Shown(s) +
                                       (j.is_discarded() ? " (not JSON)" : " (JSON, not an object)"));
      }
      return ConfigValue{j.dump()};
    }
  }
  return wrong_type();
}

// Applies a YAML document and then overrides on top of the schema defaults.
class Resolver {
 public:
  explicit Resolver(const ConfigSchema& schema) : schema_(schema) {
    for (const ConfigKey& k : schema.keys()) values_.push_back(k.def);
  }

  Status ApplyYaml(const std::string& text, const std::string& origin) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      std::string where = origin;
      if (!e.mark.is_null()) where += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
      return Status::InvalidArgument(where + ": YAML syntax error: " + e.msg);
    }
    if (root.IsNull()) return Status::Ok();  // an empty file: all defaults
    if (!root.IsMap()) {
      return Status::InvalidArgument(origin + ": the top level must be a map of config keys, got a " + KindName(root));
    }
    return ApplyMap("", root, origin);
  }

  Status ApplyOverride(const std::string& text) {
    const std::string where = std::string(kCommandLine) + " '" + text + "'";
    const size_t eq = text.find('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument(where + ": an override must be key=value, e.g. trainer.lr=1e-5");
    }
    const std::string key = text.substr(0, eq);
    std::string raw = text.substr(eq + 1);
    if (key.empty()) return Status::InvalidArgument(where + ": the key before '=' is empty");
    const ConfigKey* k = schema_.Find(key);
    if (k == nullptr) return NotAKey(key, where);
    Scalar scalar{raw, false};
    if (raw.size() >= 2 && (raw.front() == '"' || raw.front() == '\'') && raw.back() == raw.front()) {
      scalar = Scalar{raw.substr(1, raw.size() - 2), true};
    } else if (!raw.empty() && (raw.front() == '[' || raw.front() == '{') && k->type != ConfigType::kMap) {
      return Bad(where, *k,
                 "expected a scalar (" + Allowed(*k) + "), got a " + (raw.front() == '[' ? "sequence" : "map"));
    }
    return Assign(*k, scalar, where);
  }

  std::vector<ConfigValue> TakeValues() && { return std::move(values_); }

 private:
  static std::string At(const std::string& origin, const YAML::Mark& mark) {
    return mark.is_null() ? origin : origin + ":" + std::to_string(mark.line + 1);
  }

  static Status Bad(const std::string& where, const ConfigKey& k, const std::string& problem) {
    return Status::InvalidArgument(where + ": config key '" + k.key + "': " + problem);
  }

  Status ApplyMap(const std::string& prefix, const YAML::Node& map, const std::string& origin) {
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string where = At(origin, it->first.Mark());
      if (!it->first.IsScalar()) {
        return Status::InvalidArgument(where + ": config keys must be names, got a " + KindName(it->first));
      }
      const std::string key = prefix.empty() ? it->first.Scalar() : prefix + "." + it->first.Scalar();
      SLUICE_RETURN_IF_ERROR(ApplyNode(key, it->second, origin, where));
    }
    return Status::Ok();
  }

  Status ApplyNode(const std::string& key, const YAML::Node& node, const std::string& origin,
                   const std::string& where) {
    const ConfigKey* k = schema_.Find(key);
    if (k == nullptr) {
      if (schema_.IsSection(key) && node.IsMap()) return ApplyMap(key, node, origin);
      if (schema_.IsSection(key) && node.IsNull()) return Status::Ok();  // "trainer:" with nothing under it
      return NotAKey(key, where);
    }
    if (k->type == ConfigType::kMap && (node.IsMap() || node.IsNull())) {
      auto [first, inserted] = file_sites_.emplace(key, where);
      if (!inserted) return Bad(where, *k, "is set twice in the file (first at " + first->second + ")");
      Result<nlohmann::ordered_json> j = node.IsNull() ? nlohmann::ordered_json::object() : YamlToJson(node, 0);
      if (!j.ok()) return Bad(where, *k, j.status().message());
      values_[k - schema_.keys().data()] = j->dump();
      return Status::Ok();
    }
    if (node.IsMap() || node.IsSequence()) {
      return Bad(where, *k, "expected a scalar (" + Allowed(*k) + "), got a " + KindName(node));
    }
    if (!node.IsScalar()) {
      return Bad(
          where, *k,
          "no value given; expected " + Allowed(*k) + (k->type == ConfigType::kString ? " (\"\" for empty)" : ""));
    }
    auto [first, inserted] = file_sites_.emplace(key, where);
    if (!inserted) return Bad(where, *k, "is set twice in the file (first at " + first->second + ")");
    const std::string& tag = node.Tag();
    const bool quoted = tag == "!" || (tag.size() >= 4 && tag.compare(tag.size() - 4, 4, ":str") == 0);
    return Assign(*k, Scalar{node.Scalar(), quoted}, where);
  }

  Status Assign(const ConfigKey& k, const Scalar& scalar, const std::string& where) {
    Result<ConfigValue> value = ParseValue(k, scalar);
    if (!value.ok()) return Bad(where, k, value.status().message());
    values_[&k - schema_.keys().data()] = std::move(value).value();
    return Status::Ok();
  }

  // `key` is not a declared key: either a section used as a value or unknown.
  Status NotAKey(const std::string& key, const std::string& where) const {
    if (schema_.IsSection(key)) {
      return Status::InvalidArgument(where + ": config key '" + key +
                                     "' is a section, not a value; set its keys: " + KeysUnder(key));
    }
    return Status::InvalidArgument(where + ": unknown config key '" + key + "'" + Suggestion(key));
  }

  std::string KeysUnder(const std::string& section) const {
    std::vector<std::string> keys;
    for (const ConfigKey& k : schema_.keys()) {
      if (k.key.size() > section.size() && k.key.compare(0, section.size(), section) == 0 &&
          k.key[section.size()] == '.') {
        keys.push_back(k.key);
      }
    }
    constexpr size_t kMaxListed = 12;
    if (keys.size() > kMaxListed) {
      keys.resize(kMaxListed);
      keys.push_back("...");
    }
    return Join(keys, ", ");
  }

  // " (did you mean 'x'?)" when a declared key is close, else a list of
  // what exists where the key was heading.
  std::string Suggestion(const std::string& key) const {
    const ConfigKey* best = nullptr;
    size_t best_distance = std::numeric_limits<size_t>::max();
    std::vector<std::string> same_leaf;
    for (const ConfigKey& k : schema_.keys()) {
      const size_t d = EditDistance(key, k.key);
      if (d < best_distance) best = &k, best_distance = d;
      if (LastSegment(k.key) == LastSegment(key)) same_leaf.push_back(k.key);
    }
    if (best != nullptr && best_distance <= std::max<size_t>(2, key.size() / 3)) {
      return " (did you mean '" + best->key + "'?)";
    }
    if (same_leaf.size() == 1) return " (did you mean '" + same_leaf.front() + "'?)";
    for (size_t dot = key.rfind('.'); dot != std::string::npos && dot > 0; dot = key.rfind('.', dot - 1)) {
      const std::string section = key.substr(0, dot);
      if (schema_.IsSection(section)) return " (keys under '" + section + "': " + KeysUnder(section) + ")";
    }
    std::vector<std::string> top;
    for (const ConfigKey& k : schema_.keys()) {
      std::string name = k.key.substr(0, k.key.find('.'));
      if (std::find(top.begin(), top.end(), name) == top.end()) top.push_back(std::move(name));
    }
    return " (top-level names: " + Join(top, ", ") + ")";
  }

  const ConfigSchema& schema_;
  std::vector<ConfigValue> values_;                // parallel to schema_.keys()
  std::map<std::string, std::string> file_sites_;  // key -> where the YAML set it
};

}  // namespace

std::string_view ConfigTypeName(ConfigType type) {
  static constexpr const char* kNames[] = {"int", "double", "bool", "string", "enum", "map"};
  static_assert(std::size(kNames) == static_cast<size_t>(ConfigType::kMap) + 1);
  return EnumName(kNames, type);
}

// ---------------------------------------------------------------------------
// ConfigSchema

namespace {

ConfigKey MakeKey(std::string key, ConfigType type, ConfigValue def) {
  ConfigKey k;
  k.key = std::move(key);
  k.type = type;
  k.def = std::move(def);
  return k;
}

}  // namespace

void ConfigSchema::Add(ConfigKey k) {
  const std::string& key = k.key;
  SLUICE_CHECK(IsValidKey(key)) << "config key '" << key << "' must be dotted segments of [A-Za-z0-9_-]";
  SLUICE_CHECK(index_.count(key) == 0) << "config key '" << key << "' is declared twice";
  SLUICE_CHECK(!IsSection(key)) << "config key '" << key << "' is already a section of other keys";
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
    SLUICE_CHECK(index_.count(key.substr(0, dot)) == 0)
        << "config key '" << key << "' would be inside the key '" << key.substr(0, dot) << "'";
  }
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) {
    ++sections_[key.substr(0, dot)];
  }
  index_[key] = keys_.size();
  keys_.push_back(std::move(k));
}

void ConfigSchema::AddInt(std::string key, int64_t def, int64_t min, int64_t max, std::string help) {
  SLUICE_CHECK(min <= def && def <= max) << "config key '" << key << "': default " << def << " is outside [" << min
                                         << ", " << max << "]";
  ConfigKey k = MakeKey(std::move(key), ConfigType::kInt, def);
  k.int_min = min;
  k.int_max = max;
  k.help = std::move(help);
  Add(std::move(k));
}

void ConfigSchema::AddDouble(std::string key, double def, double min, double max, std::string help) {
  SLUICE_CHECK(min <= def && def <= max) << "config key '" << key << "': default " << def << " is outside [" << min
                                         << ", " << max << "]";
  ConfigKey k = MakeKey(std::move(key), ConfigType::kDouble, def);
  k.double_min = min;
  k.double_max = max;
  k.help = std::move(help);
  Add(std::move(k));
}

void ConfigSchema::AddBool(std::string key, bool def, std::string help) {
  ConfigKey k = MakeKey(std::move(key), ConfigType::kBool, def);
  k.help = std::move(help);
  Add(std::move(k));
}

void ConfigSchema::AddString(std::string key, std::string def, std::string help) {
  ConfigKey k = MakeKey(std::move(key), ConfigType::kString, std::move(def));
  k.help = std::move(help);
  Add(std::move(k));
}

void ConfigSchema::AddEnum(std::string key, std::string def, std::vector<std::string> allowed, std::string help) {
  SLUICE_CHECK(std::find(allowed.begin(), allowed.end(), def) != allowed.end())
      << "config key '" << key << "': default '" << def << "' is not among the allowed values";
  ConfigKey k = MakeKey(std::move(key), ConfigType::kEnum, std::move(def));
  k.allowed = std::move(allowed);
  k.help = std::move(help);
  Add(std::move(k));
}

void ConfigSchema::AddMap(std::string key, std::string help) {
  ConfigKey k = MakeKey(std::move(key), ConfigType::kMap, std::string("{}"));
  k.help = std::move(help);
  Add(std::move(k));
}

const ConfigKey* ConfigSchema::Find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &keys_[it->second];
}

std::string ConfigSchema::Document() const {
  auto cell = [](const std::string& text) {
    std::string out;
    for (char c : text) {
      if (c == '|') {
        out += "\\|";
      } else {
        out += c == '\n' ? ' ' : c;
      }
    }
    return out;
  };
  std::string out = "| key | type | default | allowed | help |\n|---|---|---|---|---|\n";
  for (const ConfigKey& k : keys_) {
    out += "| `" + k.key + "` | " + std::string(ConfigTypeName(k.type)) + " | `" + cell(FormatValue(k.def)) + "` | " +
           cell(Allowed(k)) + " | " + cell(k.help) + " |\n";
  }
  return out;
}

// ---------------------------------------------------------------------------
// Config

Result<Config> Config::Resolve(const ConfigSchema& schema, const std::string* yaml_text, const std::string& origin,
                               const std::vector<std::string>& overrides) {
  Resolver resolver(schema);
  if (yaml_text != nullptr) SLUICE_RETURN_IF_ERROR(resolver.ApplyYaml(*yaml_text, origin));
  for (const std::string& override_text : overrides) SLUICE_RETURN_IF_ERROR(resolver.ApplyOverride(override_text));
  return Config(std::make_shared<const ConfigSchema>(schema), std::move(resolver).TakeValues());
}

Result<Config> Config::Load(const ConfigSchema& schema, const std::string& yaml_path,
                            const std::vector<std::string>& overrides) {
  if (yaml_path.empty()) return Resolve(schema, nullptr, "", overrides);
  std::error_code ec;
  if (!std::filesystem::exists(yaml_path, ec)) {
    return Status::NotFound("config file '" + yaml_path + "' does not exist");
  }
  if (std::filesystem::is_directory(yaml_path, ec)) {
    return Status::InvalidArgument("config file '" + yaml_path + "' is a directory, not a YAML file");
  }
  Result<std::string> contents = ReadFileToString(yaml_path);
  if (!contents.ok()) return contents.status().WithContext("config file '" + yaml_path + "'");
  return Resolve(schema, &*contents, yaml_path, overrides);
}

Result<Config> Config::FromYamlText(const ConfigSchema& schema, const std::string& text,
                                    const std::vector<std::string>& overrides) {
  return Resolve(schema, &text, "YAML text", overrides);
}

const ConfigValue& Config::Get(const std::string& key, ConfigType type) const {
  const ConfigKey* k = schema_->Find(key);
  SLUICE_CHECK(k != nullptr) << "config key '" << key << "' was never declared";
  const bool matches =
      k->type == type || (type == ConfigType::kString && (k->type == ConfigType::kEnum || k->type == ConfigType::kMap));
  SLUICE_CHECK(matches) << "config key '" << key << "' is declared as " << ConfigTypeName(k->type) << ", read as "
                        << ConfigTypeName(type);
  return values_[k - schema_->keys().data()];
}

int64_t Config::GetInt(const std::string& key) const { return std::get<int64_t>(Get(key, ConfigType::kInt)); }
double Config::GetDouble(const std::string& key) const { return std::get<double>(Get(key, ConfigType::kDouble)); }
bool Config::GetBool(const std::string& key) const { return std::get<bool>(Get(key, ConfigType::kBool)); }
std::string Config::GetString(const std::string& key) const {
  return std::get<std::string>(Get(key, ConfigType::kString));
}

std::string Config::ToYaml() const {
  // Rebuild the nesting from the dotted keys; sections appear where their
  // first key was declared.
  struct Node {
    std::string name;
    const ConfigValue* value = nullptr;  // leaves only
    std::vector<Node> children;
  };
  Node root;
  for (size_t i = 0; i < values_.size(); ++i) {
    const std::string& key = schema_->keys()[i].key;
    Node* node = &root;
    size_t start = 0;
    for (;;) {
      const size_t dot = key.find('.', start);
      const std::string name = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      auto it = std::find_if(node->children.begin(), node->children.end(),
                             [&](const Node& child) { return child.name == name; });
      if (it == node->children.end()) {
        node->children.emplace_back().name = name;
        it = node->children.end() - 1;
      }
      node = &*it;
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    node->value = &values_[i];
  }
  std::string out;
  auto emit = [&out](auto& self, const Node& node, size_t depth) -> void {
    for (const Node& child : node.children) {
      out += std::string(2 * depth, ' ') + child.name + ":";
      if (child.value != nullptr) {
        out += ' ';
        out += FormatValue(*child.value);
        out += '\n';
      } else {
        out += "\n";
        self(self, child, depth + 1);
      }
    }
  };
  emit(emit, root, 0);
  return out;
}

}  // namespace sluice::runtime
