// Command-line flags: `--name=value`, `--name value`, and `--flag` for
// booleans. Every flag must be declared; unknown flags and malformed values
// are errors that name the flag and what is allowed.
//
// Thread safety: build and parse on one thread; read-only afterwards.
#ifndef SLUICE_RUNTIME_FLAGS_H_
#define SLUICE_RUNTIME_FLAGS_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::runtime {

// A flag's declaration, for a command's table of them.
struct FlagSpec {
  std::string name;
  std::string default_value;
  std::string help;
  bool is_bool = false;
};

class FlagSet {
 public:
  // Declares a flag with its default (as text) and help line.
  void Add(const std::string& name, const std::string& default_value, const std::string& help, bool is_bool = false);
  // Declares each flag of a table.
  void Add(std::initializer_list<FlagSpec> specs);

  // Parses args (without the program / subcommand names). Positional
  // arguments are collected into positional(). Errors: InvalidArgument.
  Status Parse(const std::vector<std::string>& args);
  // A command's parse: Parse, then with --help prints "usage: <usage>" and
  // the flags' help to stdout and returns true (the command does nothing
  // more); otherwise false.
  Result<bool> ParseOrHelp(const std::vector<std::string>& args, const std::string& usage);

  Result<std::string> GetString(const std::string& name) const;
  // Integer in [min, max]; errors name the flag and the range.
  Result<int64_t> GetInt(const std::string& name, int64_t min, int64_t max) const;
  Result<double> GetDouble(const std::string& name, double min, double max) const;
  Result<bool> GetBool(const std::string& name) const;
  // One of `allowed`.
  Result<std::string> GetChoice(const std::string& name, const std::vector<std::string>& allowed) const;

  const std::vector<std::string>& positional() const { return positional_; }
  // For commands that take flags only: InvalidArgument naming the first
  // positional argument, if any (a word that would otherwise be ignored).
  Status RejectPositional() const;
  // True when --help or -h was among the arguments.
  bool help_requested() const { return help_requested_; }
  std::string Usage() const;

 private:
  struct Flag {
    std::string value;
    std::string default_value;
    std::string help;
    bool is_bool = false;
  };
  Result<const Flag*> Find(const std::string& name) const;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

}  // namespace sluice::runtime

#endif  // SLUICE_RUNTIME_FLAGS_H_
