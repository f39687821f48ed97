#include "sluice/runtime/flags.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace sluice::runtime {

void FlagSet::Add(const std::string& name, const std::string& default_value, const std::string& help, bool is_bool) {
  flags_[name] = Flag{default_value, default_value, help, is_bool};
}

void FlagSet::Add(std::initializer_list<FlagSpec> specs) {
  for (const FlagSpec& f : specs) Add(f.name, f.default_value, f.help, f.is_bool);
}

Status FlagSet::RejectPositional() const {
  if (positional_.empty()) return Status::Ok();
  return Status::InvalidArgument("unexpected argument '" + positional_[0] +
                                 "': this command takes flags only (--name=value; see --help)");
}

Result<bool> FlagSet::ParseOrHelp(const std::vector<std::string>& args, const std::string& usage) {
  SLUICE_RETURN_IF_ERROR(Parse(args));
  if (!help_requested_) return false;
  std::printf("usage: %s\n%s", usage.c_str(), Usage().c_str());
  return true;
}

Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      std::string known;
      for (const auto& [n, f] : flags_) known += (known.empty() ? "--" : ", --") + n;
      return Status::InvalidArgument("unknown flag --" + name + " (known: " + known + ")");
    }
    if (!has_value) {
      if (it->second.is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return Status::InvalidArgument("flag --" + name + " needs a value");
      }
    }
    it->second.value = value;
  }
  return Status::Ok();
}

Result<const FlagSet::Flag*> FlagSet::Find(const std::string& name) const {
  auto it = flags_.find(name);
  if (it == flags_.end()) return Status::Internal("flag --" + name + " was never declared");
  return &it->second;
}

Result<std::string> FlagSet::GetString(const std::string& name) const {
  SLUICE_ASSIGN_OR_RETURN(const Flag* f, Find(name));
  return f->value;
}

Result<int64_t> FlagSet::GetInt(const std::string& name, int64_t min, int64_t max) const {
  SLUICE_ASSIGN_OR_RETURN(const Flag* f, Find(name));
  int64_t v = 0;
  const char* end = f->value.data() + f->value.size();
  auto [ptr, ec] = std::from_chars(f->value.data(), end, v);
  if (ec != std::errc() || ptr != end) {
    return Status::InvalidArgument("flag --" + name + " must be an integer, got '" + f->value + "'");
  }
  if (v < min || v > max) {
    return Status::InvalidArgument("flag --" + name + " must be in [" + std::to_string(min) + ", " +
                                   std::to_string(max) + "], got " + f->value);
  }
  return v;
}

Result<double> FlagSet::GetDouble(const std::string& name, double min, double max) const {
  SLUICE_ASSIGN_OR_RETURN(const Flag* f, Find(name));
  std::istringstream in(f->value);
  double v = 0;
  in >> v;
  if (f->value.empty() || in.fail() || !in.eof() || !std::isfinite(v)) {
    return Status::InvalidArgument("flag --" + name + " must be a number, got '" + f->value + "'");
  }
  if (v < min || v > max) {
    std::ostringstream msg;
    msg << "flag --" << name << " must be in [" << min << ", " << max << "], got " << f->value;
    return Status::InvalidArgument(msg.str());
  }
  return v;
}

Result<bool> FlagSet::GetBool(const std::string& name) const {
  SLUICE_ASSIGN_OR_RETURN(const Flag* f, Find(name));
  if (f->value == "true" || f->value == "1") return true;
  if (f->value == "false" || f->value == "0") return false;
  return Status::InvalidArgument("flag --" + name + " must be true or false, got '" + f->value + "'");
}

Result<std::string> FlagSet::GetChoice(const std::string& name, const std::vector<std::string>& allowed) const {
  SLUICE_ASSIGN_OR_RETURN(const Flag* f, Find(name));
  std::string list;
  for (const auto& a : allowed) {
    if (a == f->value) return f->value;
    list += (list.empty() ? "" : ", ") + a;
  }
  return Status::InvalidArgument("flag --" + name + " must be one of {" + list + "}, got '" + f->value + "'");
}

std::string FlagSet::Usage() const {
  std::ostringstream out;
  for (const auto& [name, f] : flags_) {
    out << "  --" << name;
    if (!f.is_bool) out << "=" << (f.default_value.empty() ? "\"\"" : f.default_value);
    out << "\n      " << f.help << "\n";
  }
  return out.str();
}

}  // namespace sluice::runtime
