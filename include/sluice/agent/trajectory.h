// A multi-turn trajectory, token-exact: the opening's rendering, the
// model's turns as it sampled them, and each environment turn as the chat
// template renders its messages at that position, with what is trained.
//
// The sequence is only ever appended to. The model's tokens are never
// re-tokenized: a turn is the tokens the model sampled (its end-of-turn
// token included), trained (mask 1) with their behaviour logprobs and the
// weight versions that sampled them. Everything else (the opening, the
// environment's messages, the template's role headers and the generation
// prompt) has mask 0 and no logprob or version.
//
// How an environment turn is rendered: the conversation is rendered with
// the model's last turn replaced by a marker, the new messages after it and
// the generation prompt; the text after the marker is the environment turn
// (less the end-of-turn token's text the model already sampled). So the
// trajectory is the template's rendering of the whole conversation wherever
// the template renders earlier turns the same way whatever follows them
// (append-only); where it does not (Qwen3 drops the <think> blocks of turns
// before the last user message), the model's turns stay as sampled.
//
// Spans: every message has one, in order, and they tile the sequence. A
// model turn's span is its sampled tokens; an environment message's covers
// its rendering, the template's markup around it included (the generation
// prompt goes with the turn's last message, the end-of-turn markup after a
// model turn with the first). Per-message boundaries come from rendering
// the messages one more at a time; a template that cannot render a prefix
// of a turn (one that insists on a user message) gives that turn fewer,
// longer spans, each named by its first message's role.
//
// Thread safety: a value; one thread at a time.
#ifndef SLUICE_AGENT_TRAJECTORY_H_
#define SLUICE_AGENT_TRAJECTORY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/agent/action.h"
#include "sluice/agent/environment.h"
#include "sluice/common/ids.h"
#include "sluice/common/status.h"
#include "sluice/model/chat_format.h"

namespace sluice::agent {

using model::TokenId;

// Why a trajectory ended.
enum class EndReason {
  kNone,        // not ended
  kDone,        // the environment said done
  kMaxTurns,    // agent.max_turns model turns, and the environment not done
  kMaxTokens,   // the trajectory reached agent.max_tokens in a model turn
  kLength,      // a model turn reached rl.max_new_tokens without ending
  kContext,     // the environment's answer would not fit agent.max_tokens
  kEnvTimeout,  // a reset or step ran past agent.env_timeout_seconds
  kEnvTime,     // the environment's time summed past agent.max_env_seconds
  kEnvError,    // the environment failed (raised, died, answered malformed)
};
// "done", "max_turns", ... as trajectories.jsonl writes them.
const char* EndReasonName(EndReason reason);

struct TrajectoryLimits {
  int32_t max_turns = 8;             // model turns
  int64_t max_tokens = 1024;         // the whole sequence, opening included
  int32_t max_turn_tokens = 256;     // one model turn (rl.max_new_tokens)
  int64_t max_message_bytes = 8192;  // an environment message's content; truncated past it

  // InvalidArgument naming the limit.
  Status Validate() const;
};

// A message's tokens: [start, end) of the sequence.
struct Span {
  std::string role;
  int64_t start = 0, end = 0;
  std::string content;
};

class Trajectory {
 public:
  // Renders the opening (its messages and tools, with the generation
  // prompt). Errors: InvalidArgument for a message with a role other than
  // system or user, content that is not UTF-8, tools that are not a JSON
  // array, a rendering the template refuses; OutOfRange for an opening that
  // leaves no room for a model turn in max_tokens.
  static Result<Trajectory> Open(std::shared_ptr<const model::ChatFormat> format, const Opening& opening,
                                 ToolCallFormat calls, const TrajectoryLimits& limits);

  // The sequence so far: the prompt of the model's next turn.
  const std::vector<TokenId>& tokens() const { return tokens_; }
  // How many tokens the next model turn may sample (> 0 until ended).
  int32_t TurnBudget() const;

  // The model's turn: what it sampled (`eos`: the turn ended on the
  // end-of-turn token, the last of `sampled`), one logprob and version per
  // token. Returns the action for the environment, or nullopt when the turn
  // ended the trajectory (a limit). InvalidArgument (nothing added) for
  // mismatched lengths, an empty turn or a trajectory already ended.
  Result<std::optional<Action>> AddModelTurn(const std::vector<TokenId>& sampled, const std::vector<float>& logprobs,
                                             const std::vector<PolicyVersion>& versions, bool eos);

  // The environment's answer to the last action: the trajectory ends when
  // it is done, at max_turns, on a malformed message (a role other than
  // tool or user, content that is not UTF-8: kEnvError) or when its
  // rendering would not fit (kContext); else its messages are appended
  // (each content bounded by max_message_bytes) with the next generation
  // prompt. The reward, when given, is kept. Errors (nothing added): a
  // trajectory ended or not waiting for the environment.
  Status AddEnvironmentTurn(const StepResult& step);

  // Ends it (an environment that failed, ran out of time).
  void End(EndReason reason, std::string detail = "");

  bool ended() const { return end_ != EndReason::kNone; }
  EndReason end_reason() const { return end_; }
  const std::string& end_detail() const { return end_detail_; }
  // Whether the last model turn waits for the environment's answer.
  bool awaiting_environment() const { return awaiting_env_; }

  int64_t opening_length() const { return opening_length_; }
  const std::vector<uint8_t>& mask() const { return mask_; }  // 1: sampled by the model
  // One per token: the behaviour logprob and the version of a sampled
  // token; 0 and -1 elsewhere (mask 0).
  const std::vector<float>& logprobs() const { return logprobs_; }
  const std::vector<PolicyVersion>& versions() const { return versions_; }
  const std::vector<Span>& turns() const { return turns_; }
  int32_t model_turns() const { return model_turns_; }
  // The environment's reward, when it gave one.
  std::optional<double> reward() const { return reward_; }
  // The content of the model's last turn (what the task's reward scores
  // when the environment gives none).
  std::string last_model_content() const;
  // Environment messages cut to max_message_bytes.
  int64_t truncated_messages() const { return truncated_; }
  // Tool calls the model wrote, and those among them that could not be
  // read (flagged to the environment).
  int64_t tool_calls() const { return tool_calls_; }
  int64_t malformed_tool_calls() const { return malformed_calls_; }

  // What travels with the trajectory's tokens to the trainer (JSON): its
  // turns, end reason and detail, the environment's reward (or null), the
  // last model turn's content, and its counts of model turns and tool calls.
  std::string Summary() const;

 private:
  Trajectory() = default;
  // The text after the marker (or all of it, with no marker) of each
  // rendering of `base` plus one more of `added` at a time, cut into one
  // piece per message (see the file comment).
  Result<std::vector<std::string>> RenderPieces(const nlohmann::ordered_json& base, const nlohmann::ordered_json& added,
                                                bool after_marker) const;
  // Appends pieces as environment spans of `added`'s roles; OutOfRange
  // (nothing appended) when they do not fit with room for a model turn.
  Status AppendPieces(const std::vector<std::string>& pieces, const nlohmann::ordered_json& added);

  std::shared_ptr<const model::ChatFormat> format_;
  ToolCallFormat calls_ = ToolCallFormat::kHermes;
  TrajectoryLimits limits_;
  nlohmann::ordered_json messages_;  // the conversation, for the template
  nlohmann::ordered_json tools_;     // null or an array
  std::vector<TokenId> tokens_;
  std::vector<uint8_t> mask_;
  std::vector<float> logprobs_;
  std::vector<PolicyVersion> versions_;
  std::vector<Span> turns_;
  int64_t opening_length_ = 0;
  int32_t model_turns_ = 0;
  bool awaiting_env_ = false;
  std::optional<double> reward_;
  int64_t truncated_ = 0;
  int64_t tool_calls_ = 0, malformed_calls_ = 0;
  EndReason end_ = EndReason::kNone;
  std::string end_detail_;
};

// A Summary() read back: the environment's reward, if it gave one, else
// the last model turn's content (what the task's reward scores), and what
// the run's metrics count.
struct TrajectorySummary {
  std::optional<double> env_reward;
  std::string content;
  std::string end_reason;
  int64_t model_turns = 0, tool_calls = 0, malformed_tool_calls = 0;
};
// DataLoss for text that is not a summary.
Result<TrajectorySummary> ReadTrajectorySummary(const std::string& summary);

// A trained trajectory as run_dir/trajectories.jsonl has it (docs/agents.md).
struct TrajectoryLine {
  int64_t sample_id = 0, group_id = 0, step = 0;
  std::vector<TokenId> tokens;          // the whole sequence
  std::vector<float> logprobs;          // one per token (any value where not sampled)
  std::vector<PolicyVersion> versions;  // one per token; negative: not sampled (mask 0)
  std::string summary;                  // Trajectory::Summary()
  double reward = 0, advantage = 0;
};
// The line, without its newline. DataLoss for arrays of different lengths
// or a summary that is not one.
Result<std::string> FormatTrajectoryLine(const TrajectoryLine& line);

}  // namespace sluice::agent

#endif  // SLUICE_AGENT_TRAJECTORY_H_
