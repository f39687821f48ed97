// Schema-checked configuration: a YAML file plus `key=value` command-line
// overrides with dotted keys, as verl / Hydra users expect:
//
//   sluice train --config=run.yaml trainer.lr=1e-5 rollout.temperature=0.8
//
// Every key is declared once in a ConfigSchema with its type, default, allowed
// values and help. Values are resolved in three layers, later ones winning:
// the schema defaults, then the YAML file, then the overrides in the order
// given. Nested YAML maps become dotted keys, so
//
//   trainer:
//     lr: 1.0e-5
//
// and `trainer.lr: 1.0e-5` (a dotted key written directly) set the same key.
// A key set twice within one YAML file is an error; on the command line the
// last override wins.
//
// Value syntax (YAML scalars and override values alike):
//   int     decimal integer with optional sign: 42, -3, +7. Not 1.5, 1e3, 0x10.
//   double  decimal or scientific notation: 0.5, 1e-5, 3, -.25, and .inf /
//           -.inf (where the range allows). Not NaN, not hex floats.
//   bool    true or false (any letter case). Not yes/no/on/off/1/0.
//   string  any scalar, taken as written; quote it ("...") to keep
//           leading/trailing spaces or a leading '[' or '{'.
//   enum    a string that must be one of the declared values.
//   map     a nested map of any depth: in YAML, a map under the key (its
//           scalars typed as JSON: null/~, true/false, integers, numbers,
//           else strings; quoted ones strings); on the command line, a JSON
//           object (key={"a": 1}). Held as the JSON object's text.
// A quoted scalar ("5", '5') is a string, so it is rejected for int, double
// and bool keys. An override value of the form '...' or "..." is unquoted
// the same way (the outer quotes are removed; no escapes are processed). An unquoted override value starting with '['
// or '{' is a sequence or map, which only a map key accepts (as JSON).
//
// Errors are InvalidArgument (NotFound for a missing file). Each message
// starts with where the value came from ("run.yaml:3", "YAML text:3" or
// "command line 'trainer.lr=abc'"), names the key and says what is allowed:
// unknown keys (with the closest declared key when one is close), values of
// the wrong type, values out of range, enum values not allowed, overrides
// without '=', sequences or maps where a scalar is expected, empty values,
// and YAML syntax errors (with the line yaml-cpp reports).
//
// Thread safety: build a ConfigSchema on one thread. A Config is immutable
// after Load and may be read from any number of threads; it holds its own
// copy of the schema, so the schema may be destroyed after Load.
#ifndef SLUICE_RUNTIME_CONFIG_H_
#define SLUICE_RUNTIME_CONFIG_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::runtime {

enum class ConfigType { kInt, kDouble, kBool, kString, kEnum, kMap };

// "int", "double", "bool", "string", "enum" or "map".
std::string_view ConfigTypeName(ConfigType type);

// A resolved value; kString and kEnum keys hold a std::string, kMap keys
// the JSON text of an object.
using ConfigValue = std::variant<int64_t, double, bool, std::string>;

// One declared key.
struct ConfigKey {
  std::string key;  // dotted, e.g. "trainer.lr"
  ConfigType type = ConfigType::kString;
  ConfigValue def;
  int64_t int_min = 0, int_max = 0;       // kInt: inclusive bounds
  double double_min = 0, double_max = 0;  // kDouble: inclusive bounds
  std::vector<std::string> allowed;       // kEnum: the allowed values
  std::string help;
};

class ConfigSchema {
 public:
  // Each Add declares one key. Preconditions (SLUICE_CHECK: these are
  // programming errors, not user input): the key is dotted segments of
  // [A-Za-z0-9_-]; it is new; it is neither a section of other keys nor
  // inside another key ("a.b" and "a.b.c" cannot both be keys);
  // min <= def <= max; an enum's default is among its allowed values.
  void AddInt(std::string key, int64_t def, int64_t min, int64_t max, std::string help);
  void AddDouble(std::string key, double def, double min, double max, std::string help);
  void AddBool(std::string key, bool def, std::string help);
  void AddString(std::string key, std::string def, std::string help);
  void AddEnum(std::string key, std::string def, std::vector<std::string> allowed, std::string help);
  // A map key; its default is the empty map.
  void AddMap(std::string key, std::string help);
  // Declares a key as another schema declared it (same preconditions).
  void AddKey(const ConfigKey& key) { Add(key); }

  // A markdown table, one row per key in declaration order, with columns
  // key, type, default, allowed and help (for docs/config.md).
  std::string Document() const;

  // Declared keys in declaration order.
  const std::vector<ConfigKey>& keys() const { return keys_; }
  // The declared key, or null.
  const ConfigKey* Find(const std::string& key) const;
  // True when `prefix` is a proper dotted prefix of some key ("trainer" for
  // "trainer.lr").
  bool IsSection(const std::string& prefix) const { return sections_.count(prefix) != 0; }

 private:
  void Add(ConfigKey key);

  std::vector<ConfigKey> keys_;             // declaration order
  std::map<std::string, size_t> index_;     // key -> position in keys_
  std::map<std::string, size_t> sections_;  // dotted prefix -> number of keys under it
};

class Config {
 public:
  // Loads the YAML file at yaml_path (skipped when empty; nested maps become
  // dotted keys), then applies `overrides` ("a.b=value") in order.
  // Errors: NotFound if the file does not exist; InvalidArgument as described
  // at the top of this file.
  static Result<Config> Load(const ConfigSchema& schema, const std::string& yaml_path,
                             const std::vector<std::string>& overrides);
  // As Load, with the YAML given as text (errors say "YAML text:<line>").
  static Result<Config> FromYamlText(const ConfigSchema& schema, const std::string& text,
                                     const std::vector<std::string>& overrides);

  // Preconditions (SLUICE_CHECK): `key` is declared with the getter's type;
  // GetString serves kString, kEnum and kMap keys (a map's JSON text).
  int64_t GetInt(const std::string& key) const;
  double GetDouble(const std::string& key) const;
  bool GetBool(const std::string& key) const;
  std::string GetString(const std::string& key) const;

  // The resolved value of every key as nested YAML maps (sections in order of
  // first declaration, keys in declaration order); FromYamlText(schema, ToYaml(), {}) reproduces this Config exactly
  // (doubles are written with round-trip precision).
  std::string ToYaml() const;

 private:
  Config(std::shared_ptr<const ConfigSchema> schema, std::vector<ConfigValue> values)
      : schema_(std::move(schema)), values_(std::move(values)) {}
  static Result<Config> Resolve(const ConfigSchema& schema, const std::string* yaml_text, const std::string& origin,
                                const std::vector<std::string>& overrides);
  const ConfigValue& Get(const std::string& key, ConfigType type) const;

  std::shared_ptr<const ConfigSchema> schema_;
  std::vector<ConfigValue> values_;  // parallel to schema_->keys()
};

}  // namespace sluice::runtime

#endif  // SLUICE_RUNTIME_CONFIG_H_
