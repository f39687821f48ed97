#include "sluice/simulate/cost_profile.h"

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "sluice/runtime/config.h"

namespace sluice::simulate {

namespace {

// Every cost field with its key and help, in file order.
struct CostField {
  const char* key;
  double CostProfile::*field;
  const char* help;
  double most = 1e9;  // a fraction's is below 1; seconds otherwise
};

const std::vector<CostField>& CostFields() {
  static const std::vector<CostField> fields = {
      {"rollout.decode_step_s", &CostProfile::decode_step_s, "a decode step's fixed part"},
      {"rollout.decode_row_s", &CostProfile::decode_row_s, "per sequence in the decode step"},
      {"rollout.decode_context_s", &CostProfile::decode_context_s, "per token a decoded row attends"},
      {"rollout.memory_step_s", &CostProfile::memory_step_s,
       "roofline: streaming the weights once per decode step (the step takes max(memory, compute))"},
      {"rollout.memory_context_s", &CostProfile::memory_context_s, "roofline: reading one attended token's KV entries"},
      {"rollout.compute_row_s", &CostProfile::compute_row_s, "roofline: one row's arithmetic in a decode step"},
      {"rollout.compute_context_s", &CostProfile::compute_context_s,
       "roofline: one attended token's attention arithmetic"},
      {"rollout.prefill_prompt_s", &CostProfile::prefill_prompt_s, "per prompt prefilled"},
      {"rollout.prefill_token_s", &CostProfile::prefill_token_s, "per prompt token prefilled"},
      {"trainer.step_s", &CostProfile::train_step_s, "per trainer step: optimizer, batch assembly"},
      {"trainer.micro_batch_s", &CostProfile::train_micro_batch_s, "per micro-batch"},
      {"trainer.token_s", &CostProfile::train_token_s, "per padded token of a micro-batch"},
      {"trainer.token_context_s", &CostProfile::train_token_context_s,
       "per padded token x the micro-batch's longest sample (attention)"},
      {"trainer.update_s", &CostProfile::train_update_s,
       "per optimizer update (each mini-batch): optimizer, gradient reduction"},
      {"trainer.proximal_share", &CostProfile::train_proximal_share,
       "the fraction of a micro-batch's cost in the pass before the update (proximal and reference "
       "log-probabilities), a phase of its own",
       0.95},
      {"weights.publish_s", &CostProfile::publish_s, "the trainer publishing a version"},
      {"weights.fill_s", &CostProfile::weight_fill_s,
       "from a publish until the rollout can switch to the version (its standby copy, in the background)"},
      {"weights.switch_s", &CostProfile::weight_switch_s, "a rollout engine switching to a version"},
      {"reward.answer_s", &CostProfile::reward_answer_s, "scoring one answer"},
  };
  return fields;
}

runtime::ConfigSchema Schema() {
  runtime::ConfigSchema s;
  s.AddInt("profile.format", 0, 0, 1000, "the profile format (this build reads 1 to 3)");
  s.AddString("profile.model", "", "the model's shape; the profile is refused for another");
  s.AddString("profile.device", "cpu", "where it was measured");
  s.AddInt("profile.threads", 1, 1, 1 << 20, "threads per role when measured");
  s.AddString("profile.measured_by", "", "the command and build that wrote it");
  for (const CostField& f : CostFields()) {
    s.AddDouble(f.key, 0.0, 0.0, f.most, std::string(f.help) + (f.most < 1 ? " (a fraction)" : " (seconds)"));
  }
  s.AddInt("cpu.cores", 0, 0, 1 << 20, "cores the threads share (0: each thread its own hardware)");
  s.AddDouble("cpu.rollout_slowdown", 1.0, 1.0, 1000.0, "how much slower an engine runs with every core busy");
  s.AddDouble("cpu.trainer_slowdown", 1.0, 1.0, 1000.0, "how much slower training runs with every core busy");
  return s;
}

}  // namespace

Status CostProfile::Validate() const {
  if (model.empty()) return Status::InvalidArgument("cost profile: no model (profile.model)");
  if (threads < 1) return Status::InvalidArgument("cost profile: profile.threads must be >= 1");
  if (cores < 0) return Status::InvalidArgument("cost profile: cpu.cores must be >= 0");
  for (const auto& [key, v] :
       {std::pair{"cpu.rollout_slowdown", rollout_slowdown}, std::pair{"cpu.trainer_slowdown", trainer_slowdown}}) {
    if (!std::isfinite(v) || v < 1)
      return Status::InvalidArgument(std::string("cost profile: ") + key + " must be >= 1");
  }
  for (const CostField& f : CostFields()) {
    const double v = this->*f.field;
    if (!std::isfinite(v) || v < 0) {
      return Status::InvalidArgument(std::string("cost profile: ") + f.key + " must be a finite cost >= 0");
    }
    if (v > f.most) {
      char most[32];
      std::snprintf(most, sizeof(most), "%g", f.most);
      return Status::InvalidArgument(std::string("cost profile: ") + f.key + " must be at most " + most);
    }
  }
  return Status::Ok();
}

std::string FormatCostProfile(const CostProfile& p) {
  std::string out = "# Sluice cost profile: seconds on one thread, read by sluice simulate (docs/simulator.md)\n";
  auto quoted = [](const std::string& v) {
    std::string q = "\"";
    for (char ch : v) q += (ch == '"' || ch == '\\') ? '\'' : ch;
    return q + "\"";
  };
  out += "profile:\n  format: " + std::to_string(kCostProfileFormat) + "\n  model: " + quoted(p.model) +
         "\n  device: " + quoted(p.device) + "\n  threads: " + std::to_string(p.threads) +
         "\n  measured_by: " + quoted(p.measured_by) + "\n";
  std::string section;
  for (const CostField& f : CostFields()) {
    const std::string key = f.key;
    const size_t dot = key.find('.');
    if (key.substr(0, dot) != section) {
      section = key.substr(0, dot);
      out += section + ":\n";
    }
    char value[64];
    std::snprintf(value, sizeof(value), "%.6g", p.*f.field);
    out += "  " + key.substr(dot + 1) + ": " + value + "  # " + f.help + "\n";
  }
  char slowdown[128];
  std::snprintf(slowdown, sizeof(slowdown),
                "  rollout_slowdown: %.4g  # an engine, every core busy\n  trainer_slowdown: %.4g  # training, "
                "every core busy\n",
                p.rollout_slowdown, p.trainer_slowdown);
  out += "cpu:\n  cores: " + std::to_string(p.cores) + "  # cores the threads share (0: each its own hardware)\n" +
         slowdown;
  return out;
}

namespace {

Result<CostProfile> FromConfig(const runtime::Config& c, const std::string& origin) {
  const int64_t format = c.GetInt("profile.format");
  if (format < kOldestCostProfileFormat || format > kCostProfileFormat) {
    return Status::InvalidArgument(
        origin + ": " +
        (format == 0 ? std::string("not a cost profile (no profile.format)")
                     : "profile.format " + std::to_string(format) + ", this build reads formats " +
                           std::to_string(kOldestCostProfileFormat) + " to " + std::to_string(kCostProfileFormat)) +
        "; write one with sluice calibrate");
  }
  CostProfile p;
  p.model = c.GetString("profile.model");
  p.device = c.GetString("profile.device");
  p.threads = c.GetInt("profile.threads");
  p.measured_by = c.GetString("profile.measured_by");
  for (const CostField& f : CostFields()) p.*f.field = c.GetDouble(f.key);
  p.cores = c.GetInt("cpu.cores");
  p.rollout_slowdown = c.GetDouble("cpu.rollout_slowdown");
  p.trainer_slowdown = c.GetDouble("cpu.trainer_slowdown");
  Status valid = p.Validate();
  if (!valid.ok()) return Status::InvalidArgument(origin + ": " + valid.message());
  return p;
}

}  // namespace

Result<CostProfile> LoadCostProfile(const std::string& path) {
  const runtime::ConfigSchema schema = Schema();
  SLUICE_ASSIGN_OR_RETURN(runtime::Config c, runtime::Config::Load(schema, path, {}));
  return FromConfig(c, path);
}

Result<CostProfile> ParseCostProfile(const std::string& yaml_text, const std::string& origin) {
  const runtime::ConfigSchema schema = Schema();
  SLUICE_ASSIGN_OR_RETURN(runtime::Config c, runtime::Config::FromYamlText(schema, yaml_text, {}));
  return FromConfig(c, origin);
}

}  // namespace sluice::simulate
