// Token-exact multi-turn trajectories (trajectory.h).
#include "sluice/agent/trajectory.h"

#include <algorithm>
#include <utility>

#include "sluice/common/enum_names.h"
#include "sluice/common/strings.h"

namespace sluice::agent {

namespace {

using nlohmann::ordered_json;

// Stands in for the model's last turn in a rendering: the environment turn
// is the text after it.
constexpr std::string_view kMarker = "\xE2\x90\x9Esluice:model-turn\xE2\x90\x9E";

constexpr const char* kEndReasonNames[] = {"",        "done",        "max_turns", "max_tokens", "length",
                                           "context", "env_timeout", "env_time",  "env_error"};

size_t CommonPrefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// `text` cut to at most `bytes` bytes at a character boundary, saying so.
std::string Bounded(const std::string& text, int64_t bytes, bool* cut) {
  *cut = static_cast<int64_t>(text.size()) > bytes;
  if (!*cut) return text;
  size_t end = static_cast<size_t>(bytes);
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + " [" + std::to_string(text.size() - end) + " bytes cut]";
}

}  // namespace

const char* EndReasonName(EndReason reason) { return EnumName(kEndReasonNames, reason); }

Status TrajectoryLimits::Validate() const {
  if (max_turns < 1) return Status::InvalidArgument("agent.max_turns must be >= 1");
  if (max_tokens < 2) return Status::InvalidArgument("agent.max_tokens must be >= 2");
  if (max_turn_tokens < 1)
    return Status::InvalidArgument("the tokens of a model turn (rl.max_new_tokens) must be >= 1");
  if (max_message_bytes < 16) return Status::InvalidArgument("agent.max_message_bytes must be >= 16");
  return Status::Ok();
}

Result<Trajectory> Trajectory::Open(std::shared_ptr<const model::ChatFormat> format, const Opening& opening,
                                    ToolCallFormat calls, const TrajectoryLimits& limits) {
  if (!format) return Status::InvalidArgument("a trajectory needs its model's chat format");
  SLUICE_RETURN_IF_ERROR(limits.Validate());
  if (opening.messages.empty()) return Status::InvalidArgument("the opening has no messages");
  Trajectory t;
  t.format_ = std::move(format);
  t.calls_ = calls;
  t.limits_ = limits;
  t.messages_ = ordered_json::array();
  if (!opening.tools.empty()) {
    t.tools_ = ordered_json::parse(opening.tools, nullptr, /*allow_exceptions=*/false);
    if (t.tools_.is_discarded() || !t.tools_.is_array()) {
      return Status::InvalidArgument("the opening's tools are not a JSON array");
    }
  }
  ordered_json added = ordered_json::array();
  for (size_t i = 0; i < opening.messages.size(); ++i) {
    const Message& m = opening.messages[i];
    const std::string which = "opening message " + std::to_string(i);
    if (m.role != "system" && m.role != "user") {
      return Status::InvalidArgument(which + " has role " + Quoted(m.role) + " (an opening has system and user ones)");
    }
    if (!IsValidUtf8(m.content)) return Status::InvalidArgument(which + "'s content is not UTF-8");
    added.push_back({{"role", m.role}, {"content", m.content}});
  }
  SLUICE_ASSIGN_OR_RETURN(const std::vector<std::string> pieces,
                          t.RenderPieces(ordered_json::array(), added, /*after_marker=*/false));
  Status fits = t.AppendPieces(pieces, added);
  if (!fits.ok()) return fits.code() == StatusCode::kOutOfRange ? fits.WithContext("the opening") : fits;
  t.messages_ = std::move(added);
  t.opening_length_ = static_cast<int64_t>(t.tokens_.size());
  return t;
}

int32_t Trajectory::TurnBudget() const {
  if (ended() || awaiting_env_) return 0;
  const int64_t room = limits_.max_tokens - static_cast<int64_t>(tokens_.size());
  return static_cast<int32_t>(std::clamp<int64_t>(room, 0, limits_.max_turn_tokens));
}

Result<std::vector<std::string>> Trajectory::RenderPieces(const ordered_json& base, const ordered_json& added,
                                                          bool after_marker) const {
  const size_t k = added.size();
  auto render = [&](size_t j) -> Result<std::string> {
    ordered_json ctx = ordered_json::object();
    ordered_json messages = base;
    for (size_t i = 0; i < j; ++i) messages.push_back(added[i]);
    ctx["messages"] = std::move(messages);
    ctx["add_generation_prompt"] = j == k;
    if (!tools_.is_null()) ctx["tools"] = tools_;
    SLUICE_ASSIGN_OR_RETURN(std::string text, format_->Render(ctx));
    if (!after_marker) return text;
    const size_t at = text.rfind(kMarker);
    if (at == std::string::npos) {
      return Status::InvalidArgument("the chat template does not render the model's last turn where it was");
    }
    return text.substr(at + kMarker.size());
  };
  SLUICE_ASSIGN_OR_RETURN(const std::string whole, render(k));
  std::vector<std::string> pieces;
  size_t from = 0;
  for (size_t j = 1; j < k; ++j) {
    Result<std::string> part = render(j);  // a template may refuse a prefix: then no boundary here
    const size_t to = part.ok() ? std::max(from, CommonPrefix(*part, whole)) : from;
    pieces.push_back(whole.substr(from, to - from));
    from = to;
  }
  pieces.push_back(whole.substr(from));
  return pieces;
}

Status Trajectory::AppendPieces(const std::vector<std::string>& pieces, const ordered_json& added) {
  std::vector<std::vector<TokenId>> ids;
  size_t total = tokens_.size();
  for (const std::string& piece : pieces) {
    SLUICE_ASSIGN_OR_RETURN(std::vector<TokenId> piece_ids, format_->Encode(piece));
    total += piece_ids.size();
    ids.push_back(std::move(piece_ids));
  }
  if (static_cast<int64_t>(total) + 1 > limits_.max_tokens) {
    return Status::OutOfRange("renders to " + std::to_string(total) + " tokens, past agent.max_tokens " +
                              std::to_string(limits_.max_tokens) + " less one for the model's turn");
  }
  for (size_t j = 0; j < ids.size(); ++j) {
    const int64_t start = static_cast<int64_t>(tokens_.size());
    tokens_.insert(tokens_.end(), ids[j].begin(), ids[j].end());
    mask_.resize(tokens_.size(), 0);
    logprobs_.resize(tokens_.size(), 0.f);
    versions_.resize(tokens_.size(), -1);
    turns_.push_back({added[j]["role"].get<std::string>(), start, static_cast<int64_t>(tokens_.size()),
                      added[j]["content"].get<std::string>()});
  }
  return Status::Ok();
}

Result<std::optional<Action>> Trajectory::AddModelTurn(const std::vector<TokenId>& sampled,
                                                       const std::vector<float>& logprobs,
                                                       const std::vector<PolicyVersion>& versions, bool eos) {
  if (ended() || awaiting_env_) {
    return Status::InvalidArgument(ended() ? "the trajectory has ended" : "the trajectory waits for the environment");
  }
  if (sampled.empty() || logprobs.size() != sampled.size() || versions.size() != sampled.size()) {
    return Status::InvalidArgument("a model turn of " + std::to_string(sampled.size()) + " tokens with " +
                                   std::to_string(logprobs.size()) + " logprobs and " +
                                   std::to_string(versions.size()) + " versions");
  }
  if (static_cast<int64_t>(sampled.size()) > TurnBudget()) {
    return Status::InvalidArgument("a model turn of " + std::to_string(sampled.size()) + " tokens, past its budget " +
                                   std::to_string(TurnBudget()));
  }
  // (A model's vocabulary may be larger than its tokenizer's: ids the
  // tokenizer does not know decode to nothing.)
  const std::string content = ValidUtf8(model::DecodeKnown(format_->tokenizer(), sampled, /*skip_special=*/true));
  const int64_t start = static_cast<int64_t>(tokens_.size());
  tokens_.insert(tokens_.end(), sampled.begin(), sampled.end());
  mask_.resize(tokens_.size(), 1);
  logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.end());
  versions_.insert(versions_.end(), versions.begin(), versions.end());
  turns_.push_back({"assistant", start, static_cast<int64_t>(tokens_.size()), content});
  messages_.push_back({{"role", "assistant"}, {"content", content}});
  ++model_turns_;
  if (!eos) {
    End(static_cast<int64_t>(tokens_.size()) >= limits_.max_tokens ? EndReason::kMaxTokens : EndReason::kLength);
    return std::optional<Action>();
  }
  awaiting_env_ = true;
  Action action = ParseAction(content, calls_, model_turns_ - 1);
  tool_calls_ += static_cast<int64_t>(action.tool_calls.size());
  for (const ToolCall& c : action.tool_calls) malformed_calls_ += c.error.empty() ? 0 : 1;
  return std::optional<Action>(std::move(action));
}

Status Trajectory::AddEnvironmentTurn(const StepResult& step) {
  if (!awaiting_env_) return Status::InvalidArgument("the trajectory does not wait for the environment");
  awaiting_env_ = false;
  if (step.reward) reward_ = step.reward;
  if (step.done) {
    End(EndReason::kDone);
    return Status::Ok();
  }
  if (model_turns_ >= limits_.max_turns) {
    End(EndReason::kMaxTurns);
    return Status::Ok();
  }
  if (step.messages.empty()) {
    End(EndReason::kEnvError, "the environment answered no message and is not done");
    return Status::Ok();
  }
  ordered_json added = ordered_json::array();
  int64_t cut = 0;
  for (size_t i = 0; i < step.messages.size(); ++i) {
    const Message& m = step.messages[i];
    const std::string which = "the environment's message " + std::to_string(i);
    if (m.role != "tool" && m.role != "user") {
      End(EndReason::kEnvError, which + " has role " + Quoted(m.role) + " (tool or user)");
      return Status::Ok();
    }
    if (!IsValidUtf8(m.content)) {
      End(EndReason::kEnvError, which + "'s content is not UTF-8");
      return Status::Ok();
    }
    bool was_cut = false;
    ordered_json msg = {{"role", m.role}, {"content", Bounded(m.content, limits_.max_message_bytes, &was_cut)}};
    if (m.role == "tool") msg["tool_call_id"] = m.tool_call_id;
    cut += was_cut ? 1 : 0;
    added.push_back(std::move(msg));
  }
  ordered_json base = messages_;
  base.back()["content"] = std::string(kMarker);
  Result<std::vector<std::string>> pieces = RenderPieces(base, added, /*after_marker=*/true);
  if (!pieces.ok()) {
    End(EndReason::kEnvError, "rendering the environment's messages: " + pieces.status().message());
    return Status::Ok();
  }
  // The end-of-turn token the model sampled is the template's too.
  const std::string eos_text = model::DecodeKnown(format_->tokenizer(), {tokens_.back()}, /*skip_special=*/false);
  std::string& first = pieces->front();
  if (!eos_text.empty() && first.compare(0, eos_text.size(), eos_text) == 0) first.erase(0, eos_text.size());
  Status fits = AppendPieces(*pieces, added);
  if (fits.code() == StatusCode::kOutOfRange) {
    End(EndReason::kContext, "the environment's answer " + fits.message());
    return Status::Ok();
  }
  SLUICE_RETURN_IF_ERROR(fits);
  truncated_ += cut;
  for (auto& m : added) messages_.push_back(std::move(m));
  return Status::Ok();
}

void Trajectory::End(EndReason reason, std::string detail) {
  if (ended()) return;
  end_ = reason;
  end_detail_ = std::move(detail);
  awaiting_env_ = false;
}

std::string Trajectory::last_model_content() const {
  for (auto it = turns_.rbegin(); it != turns_.rend(); ++it) {
    if (it->role == "assistant") return it->content;
  }
  return "";
}

std::string Trajectory::Summary() const {
  ordered_json j = ordered_json::object();
  ordered_json turns = ordered_json::array();
  for (const Span& s : turns_) {
    turns.push_back({{"role", s.role}, {"start", s.start}, {"end", s.end}, {"content", s.content}});
  }
  j["turns"] = std::move(turns);
  j["end_reason"] = EndReasonName(end_);
  j["detail"] = end_detail_;
  j["env_reward"] = reward_ ? ordered_json(*reward_) : ordered_json();
  j["content"] = last_model_content();
  j["model_turns"] = model_turns_;
  j["tool_calls"] = tool_calls_;
  j["malformed_tool_calls"] = malformed_calls_;
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

Result<TrajectorySummary> ReadTrajectorySummary(const std::string& summary) {
  const ordered_json j = ordered_json::parse(summary, nullptr, /*allow_exceptions=*/false);
  auto field = [&](const char* name) { return j.is_object() ? j.find(name) : j.end(); };
  const auto reward = field("env_reward"), content = field("content"), reason = field("end_reason");
  if (j.is_discarded() || reward == j.end() || content == j.end() || !content->is_string() ||
      !(reward->is_null() || reward->is_number()) || reason == j.end() || !reason->is_string()) {
    return Status::DataLoss("a trajectory's summary is not one: " + summary.substr(0, 80));
  }
  TrajectorySummary s;
  if (reward->is_number()) s.env_reward = reward->get<double>();
  s.content = content->get<std::string>();
  s.end_reason = reason->get<std::string>();
  auto count = [&](const char* name) -> int64_t {
    const auto it = field(name);
    return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
  };
  s.model_turns = count("model_turns");
  s.tool_calls = count("tool_calls");
  s.malformed_tool_calls = count("malformed_tool_calls");
  return s;
}

Result<std::string> FormatTrajectoryLine(const TrajectoryLine& line) {
  const size_t n = line.tokens.size();
  if (line.logprobs.size() != n || line.versions.size() != n) {
    return Status::DataLoss("a trajectory of " + std::to_string(n) + " tokens with " +
                            std::to_string(line.logprobs.size()) + " logprobs and " +
                            std::to_string(line.versions.size()) + " versions");
  }
  const ordered_json summary = ordered_json::parse(line.summary, nullptr, /*allow_exceptions=*/false);
  if (summary.is_discarded() || !summary.is_object() || !summary.contains("turns") || !summary.contains("end_reason")) {
    return Status::DataLoss("a trajectory's summary is not one: " + line.summary.substr(0, 80));
  }
  ordered_json j = ordered_json::object();
  j["sample_id"] = line.sample_id;
  j["group_id"] = line.group_id;
  j["step"] = line.step;
  j["tokens"] = line.tokens;
  ordered_json mask = ordered_json::array(), lp = ordered_json::array(), vs = ordered_json::array();
  for (size_t i = 0; i < n; ++i) {
    const bool sampled = line.versions[i] >= 0;
    mask.push_back(sampled ? 1 : 0);
    lp.push_back(sampled ? ordered_json(line.logprobs[i]) : ordered_json());
    vs.push_back(sampled ? ordered_json(line.versions[i]) : ordered_json());
  }
  j["mask"] = std::move(mask);
  j["logprobs"] = std::move(lp);
  j["versions"] = std::move(vs);
  j["turns"] = summary["turns"];
  j["reward"] = line.reward;
  j["advantage"] = line.advantage;
  j["end_reason"] = summary["end_reason"];
  if (summary.contains("detail") && summary["detail"].is_string() && !summary["detail"].get<std::string>().empty()) {
    j["end_detail"] = summary["detail"];
  }
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

}  // namespace sluice::agent
