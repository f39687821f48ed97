// Python environments in worker processes (python_environment.h).
#include "sluice/agent/python_environment.h"

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "reward/python_worker.h"
#include "sluice/reward/python_reward.h"

namespace sluice::agent {

namespace {

using nlohmann::json;
using reward::internal::PythonWorker;
using Clock = std::chrono::steady_clock;

Status CheckOptions(const PythonEnvironmentOptions& o) {
  SLUICE_RETURN_IF_ERROR(reward::ParseFunctionSpec(o.spec).status().WithContext("agent.env"));
  const json config = json::parse(o.config, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return Status::InvalidArgument("agent.env_config is not a JSON object: " + o.config.substr(0, 80));
  }
  if (o.workers < 1 || o.workers > 1024) return Status::InvalidArgument("agent.env_workers must be in [1, 1024]");
  if (o.timeout.count() <= 0 || o.start_timeout.count() <= 0) {
    return Status::InvalidArgument("a Python environment's timeouts must be > 0");
  }
  return Status::Ok();
}

std::vector<std::string> ModeArgs(const PythonEnvironmentOptions& o) { return {"env", o.spec, o.config}; }

// The messages of a reply, checked: a list of objects with string role and
// content (and, optionally, a string tool_call_id).
Result<std::vector<Message>> ReadMessages(const json& result, const char* what) {
  const auto it = result.find("messages");
  if (it == result.end() || !it->is_array()) {
    return Status::InvalidArgument(std::string(what) + " answered no \"messages\" list");
  }
  std::vector<Message> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string which = std::string(what) + "'s message " + std::to_string(i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return Status::InvalidArgument(which + " is not {\"role\": str, \"content\": str}");
    }
    Message msg{m["role"].get<std::string>(), m["content"].get<std::string>(), ""};
    if (m.contains("tool_call_id") && !m["tool_call_id"].is_null()) {
      if (!m["tool_call_id"].is_string()) return Status::InvalidArgument(which + "'s tool_call_id is not a string");
      msg.tool_call_id = m["tool_call_id"].get<std::string>();
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

struct PythonEnvironmentPool::Impl {
  struct Slot {
    std::mutex mu;
    std::unique_ptr<PythonWorker> worker;  // null: none (started at the next call)
    uint64_t generation = 0;               // the workers this slot has started
    std::vector<uint64_t> to_close;        // trajectories whose environments go
  };

  explicit Impl(PythonEnvironmentOptions o) : options(std::move(o)), slots(static_cast<size_t>(options.workers)) {}

  // One request to slot `s`'s worker (started when it has none), after the
  // closes owed there. `generation`: the worker the caller's environment
  // lives in (0: any; set to the one that answered). The reply's "result",
  // or an error: the call's (it raised, ...) as InvalidArgument; a worker
  // that failed (killed and replaced) as Timeout or Unavailable.
  // One request to a worker (started when its slot has none), after the
  // closes owed there. `*slot`: the slot of the caller's environment, or
  // kAnySlot at its reset: then a slot whose worker is free is taken (a new
  // environment does not queue behind a busy or hung worker while another
  // is idle), else the next in turn. `*generation`: the worker the
  // environment lives in (0: any; set to the one that answered). The
  // reply's "result", or an error: the call's (it raised, ...) as
  // InvalidArgument; a worker that failed (killed, replaced at its slot's
  // next call) as Timeout or Unavailable.
  static constexpr size_t kAnySlot = static_cast<size_t>(-1);
  Result<json> Call(size_t* slot_index, json request, uint64_t* generation) {
    std::unique_lock<std::mutex> lock;
    if (*slot_index == kAnySlot) {
      const size_t first = next_slot++ % slots.size();
      for (size_t i = 0; i < slots.size() && !lock.owns_lock(); ++i) {
        const size_t s = (first + i) % slots.size();
        lock = std::unique_lock<std::mutex>(slots[s].mu, std::try_to_lock);
        if (lock.owns_lock()) *slot_index = s;
      }
      if (!lock.owns_lock()) {
        *slot_index = first;
        lock = std::unique_lock<std::mutex>(slots[first].mu);
      }
    } else {
      lock = std::unique_lock<std::mutex>(slots[*slot_index].mu);
    }
    Slot& slot = slots[*slot_index];
    if (slot.worker == nullptr) {
      Result<std::unique_ptr<PythonWorker>> started = PythonWorker::Start(
          options.executable, ModeArgs(options), Clock::now() + options.start_timeout, "agent.python_executable");
      if (!started.ok()) return started.status().WithContext("agent.env '" + options.spec + "'");
      slot.worker = std::move(started).value();
      ++slot.generation;
      slot.to_close.clear();  // a new worker holds none
    }
    if (*generation != 0 && *generation != slot.generation) {
      return Status::Unavailable(
          "the worker this environment lived in was replaced (it was killed after a "
          "timeout, or died)");
    }
    *generation = slot.generation;
    {
      std::lock_guard<std::mutex> closes(close_mu);
      for (auto it = closing.begin(); it != closing.end();) {
        if (it->first != *slot_index) {
          ++it;
          continue;
        }
        slot.to_close.push_back(it->second);
        it = closing.erase(it);
      }
    }
    for (uint64_t key : slot.to_close) {
      SLUICE_RETURN_IF_ERROR(Exchange(slot, {{"op", "close"}, {"trajectory", key}}).status());
    }
    slot.to_close.clear();
    return Exchange(slot, std::move(request));
  }

  Result<json> Exchange(Slot& slot, json request) {
    const pid_t pid = slot.worker->pid();
    Result<json> reply = slot.worker->Exchange(next_id++, std::move(request), Clock::now() + options.timeout);
    if (!reply.ok()) {
      slot.worker.reset();  // killed and reaped; the next call starts another
      const std::string why =
          reply.status().code() == StatusCode::kTimeout ? "did not answer in time" : reply.status().message();
      return Status(
          reply.status().code() == StatusCode::kTimeout ? StatusCode::kTimeout : StatusCode::kUnavailable,
          "the environment's worker (pid " + std::to_string(pid) + ") " + why + "; it was killed and will be replaced");
    }
    if (reply->contains("error")) {
      const json& e = (*reply)["error"];
      return Status::InvalidArgument(e.is_string() ? e.get<std::string>() : e.dump());
    }
    if (!reply->contains("result")) {
      slot.worker.reset();
      return Status::Unavailable("the environment's worker (pid " + std::to_string(pid) +
                                 ") answered neither a result nor an error; it was killed");
    }
    return std::move((*reply)["result"]);
  }

  // Never waits for a busy worker (an environment is destroyed on the
  // rollout's thread): the close is sent before that worker's next call.
  void Close(size_t s, uint64_t key) {
    std::lock_guard<std::mutex> lock(close_mu);
    closing.emplace_back(s, key);
  }

  const PythonEnvironmentOptions options;
  std::vector<Slot> slots;
  std::atomic<uint64_t> next_id{1};
  std::atomic<uint64_t> next_key{1};
  std::atomic<size_t> next_slot{0};
  std::mutex close_mu;
  std::vector<std::pair<size_t, uint64_t>> closing;  // (slot, trajectory) to close there
};

namespace {

class PythonEnvironment final : public Environment {
 public:
  PythonEnvironment(std::shared_ptr<PythonEnvironmentPool::Impl> pool, uint64_t key)
      : pool_(std::move(pool)), key_(key) {}
  ~PythonEnvironment() override {
    if (opened_) pool_->Close(slot_, key_);
  }

  Result<Opening> Reset(const std::string& row) override {
    json parsed = json::parse(row, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object()) return Status::InvalidArgument("the row is not a JSON object");
    generation_ = 0;
    if (opened_) pool_->Close(slot_, key_);  // a reset again: anew, in whichever worker is free
    opened_ = false;
    slot_ = PythonEnvironmentPool::Impl::kAnySlot;
    SLUICE_ASSIGN_OR_RETURN(
        const json result,
        pool_->Call(&slot_, {{"op", "reset"}, {"trajectory", key_}, {"row", std::move(parsed)}}, &generation_));
    opened_ = true;
    if (!result.is_object()) return Status::InvalidArgument("reset() answered " + Kind(result) + ", not a dict");
    Opening opening;
    SLUICE_ASSIGN_OR_RETURN(opening.messages, ReadMessages(result, "reset()"));
    if (const auto tools = result.find("tools"); tools != result.end() && !tools->is_null()) {
      if (!tools->is_array()) return Status::InvalidArgument("reset()'s \"tools\" is not a list");
      if (!tools->empty()) opening.tools = tools->dump();
    }
    return opening;
  }

  Result<StepResult> Step(const Action& action) override {
    json calls = json::array();
    for (const ToolCall& c : action.tool_calls) {
      json call = {{"id", c.id}, {"name", c.name}};
      const json args = json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
      call["arguments"] = c.error.empty() && args.is_object() ? args : json();
      if (!c.error.empty()) call["error"] = c.error;
      calls.push_back(std::move(call));
    }
    const json request = {{"op", "step"},
                          {"trajectory", key_},
                          {"action", {{"content", action.content}, {"tool_calls", std::move(calls)}}}};
    if (!opened_) return Status::FailedPrecondition("step() before a reset that succeeded");
    SLUICE_ASSIGN_OR_RETURN(const json result, pool_->Call(&slot_, request, &generation_));
    if (!result.is_object()) return Status::InvalidArgument("step() answered " + Kind(result) + ", not a dict");
    StepResult step;
    SLUICE_ASSIGN_OR_RETURN(step.messages, ReadMessages(result, "step()"));
    if (const auto reward = result.find("reward"); reward != result.end() && !reward->is_null()) {
      if (!reward->is_number()) return Status::InvalidArgument("step()'s \"reward\" is not a number or None");
      step.reward = reward->get<double>();
    }
    const auto done = result.find("done");
    if (done == result.end() || !done->is_boolean()) {
      return Status::InvalidArgument("step() answered no \"done\" (True or False)");
    }
    step.done = done->get<bool>();
    return step;
  }

 private:
  static std::string Kind(const json& j) { return j.is_null() ? "None" : std::string(j.type_name()); }

  std::shared_ptr<PythonEnvironmentPool::Impl> pool_;
  size_t slot_ = PythonEnvironmentPool::Impl::kAnySlot;  // its worker's, from its reset
  const uint64_t key_;
  uint64_t generation_ = 0;
  bool opened_ = false;
};

}  // namespace

Status CheckPythonEnvironment(const PythonEnvironmentOptions& options) {
  SLUICE_RETURN_IF_ERROR(CheckOptions(options));
  Result<std::unique_ptr<PythonWorker>> worker = PythonWorker::Start(
      options.executable, ModeArgs(options), Clock::now() + options.start_timeout, "agent.python_executable");
  return worker.status().WithContext("agent.env '" + options.spec + "'");
}

Result<std::shared_ptr<PythonEnvironmentPool>> PythonEnvironmentPool::Create(const PythonEnvironmentOptions& options) {
  SLUICE_RETURN_IF_ERROR(CheckOptions(options));
  return std::shared_ptr<PythonEnvironmentPool>(new PythonEnvironmentPool(std::make_unique<Impl>(options)));
}

PythonEnvironmentPool::PythonEnvironmentPool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PythonEnvironmentPool::~PythonEnvironmentPool() = default;

std::unique_ptr<Environment> PythonEnvironmentPool::Make() {
  return std::make_unique<PythonEnvironment>(impl_, impl_->next_key++);
}

}  // namespace sluice::agent
