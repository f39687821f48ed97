// Config keys declared once. A ConfigTable<T> declares each key of a
// ConfigSchema together with what it sets in a T: a field (SLUICE_FIELD), or
// an enum field with the names of its values. From that one declaration come
// the key's type, default, range and help (the schema: parsing, errors,
// `--help-config`, docs/config.md), the mapping from a loaded Config into a
// T (Apply), and the range check of a T built in code (Check), whose
// messages name the key.
//
// A key whose value is not one field (a default that depends on other keys,
// a unit converted, a value shared by several fields) is declared with
// Declare() and read by the code that derives from it.
//
//   ConfigTable<Options> t;
//   t.Int("rl.steps", 100, 0, 10000000, "RL steps", SLUICE_FIELD(rl.steps));
//   t.Choice("pipeline.mode", "direct", {{"direct", Mode::kDirect}, ...}, "...", SLUICE_FIELD(mode));
//
// Thread safety: build a table on one thread; Apply and Check are const.
#ifndef SLUICE_RUNTIME_CONFIG_TABLE_H_
#define SLUICE_RUNTIME_CONFIG_TABLE_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/runtime/config.h"

// A field of the table's T, for ConfigTable's binders: SLUICE_FIELD(rl.steps)
// reaches `t.rl.steps` of a T or a const T.
#define SLUICE_FIELD(path) \
  [](auto& sluice_field_owner) -> auto& { return sluice_field_owner.path; }

namespace sluice::runtime {

template <typename T>
class ConfigTable {
 public:
  // An integer field (any integer type that holds [min, max]).
  template <typename Field>
  void Int(const std::string& key, int64_t def, int64_t min, int64_t max, std::string help, Field field) {
    schema_.AddInt(key, def, min, max, std::move(help));
    Bind(
        key, [key, field](const Config& c, T& t) { Assign(field(t), c.GetInt(key)); },
        [key, field, min, max](const T& t) -> Status {
          const int64_t v = static_cast<int64_t>(field(t));
          if (v >= min && v <= max) return Status::Ok();
          return Bad(key,
                     "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " + std::to_string(v));
        });
  }
  // A float or double field.
  template <typename Field>
  void Double(const std::string& key, double def, double min, double max, std::string help, Field field) {
    schema_.AddDouble(key, def, min, max, std::move(help));
    Bind(
        key, [key, field](const Config& c, T& t) { Assign(field(t), c.GetDouble(key)); },
        [key, field, min, max](const T& t) -> Status {
          const double v = static_cast<double>(field(t));
          // (A float field holds the nearest float to a bound given as a double.)
          using F = std::remove_cv_t<std::remove_reference_t<decltype(field(t))>>;
          if (v >= static_cast<double>(static_cast<F>(min)) && v <= static_cast<double>(static_cast<F>(max))) {
            return Status::Ok();
          }
          return Bad(key, "must be in [" + Number(min) + ", " + Number(max) + "], got " + Number(v));
        });
  }
  template <typename Field>
  void Bool(const std::string& key, bool def, std::string help, Field field) {
    schema_.AddBool(key, def, std::move(help));
    Bind(
        key, [key, field](const Config& c, T& t) { field(t) = c.GetBool(key); }, nullptr);
  }
  template <typename Field>
  void String(const std::string& key, std::string def, std::string help, Field field) {
    schema_.AddString(key, std::move(def), std::move(help));
    Bind(
        key, [key, field](const Config& c, T& t) { field(t) = c.GetString(key); }, nullptr);
  }
  // A std::string field holding a map's JSON object text ("{}" by default).
  template <typename Field>
  void Map(const std::string& key, std::string help, Field field) {
    schema_.AddMap(key, std::move(help));
    Bind(
        key, [key, field](const Config& c, T& t) { field(t) = c.GetString(key); }, nullptr);
  }
  // A std::string field holding one of `allowed`.
  template <typename Field>
  void Enum(const std::string& key, std::string def, std::vector<std::string> allowed, std::string help, Field field) {
    schema_.AddEnum(key, std::move(def), allowed, std::move(help));
    Bind(
        key, [key, field](const Config& c, T& t) { field(t) = c.GetString(key); },
        [key, field, allowed](const T& t) -> Status {
          const std::string& v = field(t);
          if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return Status::Ok();
          return Bad(key, "'" + v + "' is not one of " + Join(allowed));
        });
  }
  // An enum-typed field: each allowed name with the value it sets.
  template <typename E, typename Field>
  void Choice(const std::string& key, std::string def, std::vector<std::pair<std::string, E>> values, std::string help,
              Field field) {
    std::vector<std::string> names;
    for (const auto& [name, value] : values) names.push_back(name);
    schema_.AddEnum(key, std::move(def), names, std::move(help));
    Bind(
        key,
        [key, field, values](const Config& c, T& t) {
          const std::string name = c.GetString(key);
          for (const auto& [n, v] : values) {
            if (n == name) field(t) = v;
          }
        },
        [key, field, values, names](const T& t) -> Status {
          for (const auto& [n, v] : values) {
            if (v == field(t)) return Status::Ok();
          }
          return Bad(key, "holds a value that is none of " + Join(names));
        });
  }

  // A key the table does not map: the code that derives from it reads it
  // from the Config (it is still parsed, checked and documented).
  ConfigSchema& Declare() { return schema_; }

  const ConfigSchema& schema() const { return schema_; }

  // Sets every field the table binds from `c` (loaded with schema() or a
  // schema that holds its keys).
  void Apply(const Config& c, T* t) const {
    for (const Entry& e : entries_) e.apply(c, *t);
  }
  // The first bound field outside its key's range or allowed values:
  // InvalidArgument "option KEY: must be in [MIN, MAX], got V" (or naming the
  // allowed values).
  Status Check(const T& t) const {
    for (const Entry& e : entries_) {
      if (!e.check) continue;
      if (Status s = e.check(t); !s.ok()) return s;
    }
    return Status::Ok();
  }

 private:
  struct Entry {
    std::string key;
    std::function<void(const Config&, T&)> apply;
    std::function<Status(const T&)> check;  // null: any value of the type is allowed
  };

  void Bind(const std::string& key, std::function<void(const Config&, T&)> apply,
            std::function<Status(const T&)> check) {
    entries_.push_back({key, std::move(apply), std::move(check)});
  }
  template <typename F, typename V>
  static void Assign(F& field, V value) {
    field = static_cast<F>(value);
  }
  static Status Bad(const std::string& key, const std::string& why) {
    return Status::InvalidArgument("option " + key + ": " + why);
  }
  static std::string Number(double v) {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%.9g", v);
    return buf;
  }
  static std::string Join(const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) out += (i > 0 ? ", " : "") + names[i];
    return out;
  }

  ConfigSchema schema_;
  std::vector<Entry> entries_;
};

}  // namespace sluice::runtime

#endif  // SLUICE_RUNTIME_CONFIG_TABLE_H_
