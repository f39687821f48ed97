#include "sluice/reward/python_reward.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

#include "python_worker.h"
#include "sluice/common/logging.h"
#include "sluice/common/mutex.h"

namespace sluice::reward {
namespace {

using internal::PythonWorker;
using Clock = PythonWorker::Clock;

constexpr int kMaxWorkers = 64;

bool IsIdentifier(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    static_cast<unsigned char>(c) >= 0x80;  // Python identifiers may be non-ASCII
    if (!ok) return false;
  }
  return true;
}

bool IsDottedIdentifier(std::string_view s) {
  for (;;) {
    const size_t dot = s.find('.');
    if (!IsIdentifier(s.substr(0, dot))) return false;
    if (dot == std::string_view::npos) return true;
    s.remove_prefix(dot + 1);
  }
}

std::string Seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

Status CheckOptions(const PythonRewardOptions& o) {
  SLUICE_RETURN_IF_ERROR(ParseFunctionSpec(o.function).status());
  if (o.executable.empty()) return Status::InvalidArgument("reward.python_executable is empty");
  if (o.workers < 1 || o.workers > kMaxWorkers) {
    return Status::InvalidArgument("reward.python_workers must be in [1, " + std::to_string(kMaxWorkers) + "], got " +
                                   std::to_string(o.workers));
  }
  if (o.timeout.count() <= 0) return Status::InvalidArgument("reward.python_timeout_s must be > 0");
  if (o.start_timeout.count() <= 0) return Status::InvalidArgument("the Python worker start timeout must be > 0");
  if (o.max_start_failures < 1) return Status::InvalidArgument("max_start_failures must be >= 1");
  if (!std::isfinite(o.error_reward)) return Status::InvalidArgument("reward.error_reward must be a finite number");
  return Status::Ok();
}

// The task: base's examples, Score by the Python function through a pool of
// workers. A worker is owned by the calling thread while it scores (moved out
// of its slot), so mu_ is held only to take and give back slots.
class PythonRewardTask final : public Task {
 public:
  PythonRewardTask(std::unique_ptr<Task> base, PythonRewardOptions options)
      : base_(std::move(base)), options_(std::move(options)), slots_(static_cast<size_t>(options_.workers)) {}

  std::string name() const override { return base_->name(); }
  Result<Example> Get(Split split, uint64_t index) const override { return base_->Get(split, index); }
  uint64_t size(Split split) const override { return base_->size(split); }
  bool has_solutions() const override { return base_->has_solutions(); }
  uint64_t score_errors() const override { return errors_.load(); }
  int max_parallel_scores() const override { return options_.workers; }

  double Score(const Example& example, std::string_view response) const override {
    internal::ScoreRequest request;
    request.data_source = base_->name();
    request.solution_str = std::string(response);
    request.ground_truth = example.answer;
    request.index = example.index;
    request.split = std::string(SplitName(example.split));
    request.prompt = example.prompt;
    Result<double> score = Call(request);
    if (score.ok()) return *score;
    errors_.fetch_add(1);
    SLUICE_LOG(WARNING) << "reward.python " << options_.function << ": " << request.split << " example "
                        << example.index << ": " << score.status().message() << "; reward " << options_.error_reward;
    return options_.error_reward;
  }

 private:
  struct Slot {
    std::unique_ptr<PythonWorker> worker;  // null: none running (started at its next use)
    bool busy = false;
  };

  // The function's score, or why there is none (the message is logged).
  Result<double> Call(const internal::ScoreRequest& request) const {
    size_t slot = 0;
    std::unique_ptr<PythonWorker> worker;
    {
      MutexLock lock(&mu_);
      // Each holder gives its slot back within start_timeout + timeout, so
      // this waits for the callers ahead of it, not forever.
      for (;;) {
        if (broken_.has_value()) return *broken_;
        auto free = std::find_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.busy; });
        if (free != slots_.end()) {
          slot = static_cast<size_t>(free - slots_.begin());
          break;
        }
        slot_freed_.WaitFor(&mu_, std::chrono::seconds(1), [&]() SLUICE_REQUIRES(mu_) {
          return broken_.has_value() ||
                 std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.busy; });
        });
      }
      slots_[slot].busy = true;
      worker = std::move(slots_[slot].worker);
    }
    auto give_back = [&](std::unique_ptr<PythonWorker> w) {
      MutexLock lock(&mu_);
      slots_[slot].worker = std::move(w);
      slots_[slot].busy = false;
      slot_freed_.NotifyOne();
    };
    if (worker == nullptr) {
      Result<std::unique_ptr<PythonWorker>> started = StartWorker();
      if (!started.ok()) {
        give_back(nullptr);
        return started.status();
      }
      worker = std::move(*started);
    }
    const uint64_t id = next_id_.fetch_add(1);
    Result<internal::ScoreReply> reply = worker->Call(id, request, Clock::now() + options_.timeout);
    if (!reply.ok()) {
      const pid_t pid = worker->pid();
      worker.reset();  // killed and reaped; the slot starts a new one at its next use
      give_back(nullptr);
      if (reply.status().code() == StatusCode::kTimeout) {
        return Status::Timeout("no result within reward.python_timeout_s = " + Seconds(options_.timeout) +
                               "; the worker (pid " + std::to_string(pid) + ") was killed and will be replaced");
      }
      return Status(reply.status().code(), reply.status().message() + "; the worker will be replaced");
    }
    give_back(std::move(worker));
    if (!reply->ok) return Status::InvalidArgument("the function " + reply->error);
    return reply->score;
  }

  // A new worker, retried on the spot; after max_start_failures failed
  // starts in a row (counted across threads) the pool is broken for good.
  Result<std::unique_ptr<PythonWorker>> StartWorker() const {
    for (int attempt = 1;; ++attempt) {
      Result<std::unique_ptr<PythonWorker>> started = PythonWorker::Start(
          options_.executable, {"reward", options_.function}, Clock::now() + options_.start_timeout);
      MutexLock lock(&mu_);
      if (started.ok()) {
        start_failures_ = 0;
        return started;
      }
      ++start_failures_;
      if (broken_.has_value()) return *broken_;
      if (start_failures_ >= options_.max_start_failures || attempt >= options_.max_start_failures) {
        broken_ = Status::FailedPrecondition("no worker could be started (given up after " +
                                             std::to_string(start_failures_) + " failed starts in a row)");
        SLUICE_LOG(ERROR) << "reward.python " << options_.function << ": " << broken_->message()
                          << "; every later sample gets reward.error_reward at once. The last failure: "
                          << started.status().ToString();
        slot_freed_.NotifyAll();
        return *broken_;
      }
      SLUICE_LOG(WARNING) << "reward.python " << options_.function << ": a worker failed to start (attempt " << attempt
                          << " of " << options_.max_start_failures << "): " << started.status().ToString();
    }
  }

  const std::unique_ptr<Task> base_;
  const PythonRewardOptions options_;
  mutable Mutex mu_;
  mutable CondVar slot_freed_;
  mutable std::vector<Slot> slots_ SLUICE_GUARDED_BY(mu_);
  mutable int start_failures_ SLUICE_GUARDED_BY(mu_) = 0;
  mutable std::optional<Status> broken_ SLUICE_GUARDED_BY(mu_);  // sticky once set
  mutable std::atomic<uint64_t> next_id_{0};
  mutable std::atomic<uint64_t> errors_{0};
};

}  // namespace

Result<FunctionSpec> ParseFunctionSpec(const std::string& spec) {
  const std::string form =
      "reward.python '" + spec + "': expected 'package.module:function' or 'path/to/file.py:function'";
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos) return Status::InvalidArgument(form + " (there is no ':')");
  FunctionSpec out{spec.substr(0, colon), spec.substr(colon + 1)};
  if (out.module.empty()) return Status::InvalidArgument(form + " (the module before ':' is empty)");
  if (out.function.empty()) return Status::InvalidArgument(form + " (the function after ':' is empty)");
  if (!IsDottedIdentifier(out.function)) {
    return Status::InvalidArgument(form + " ('" + out.function + "' is not a Python name)");
  }
  const bool file = out.module.size() > 3 && out.module.compare(out.module.size() - 3, 3, ".py") == 0;
  if (!file && !IsDottedIdentifier(out.module)) {
    return Status::InvalidArgument(form + " ('" + out.module + "' is neither a module name nor a .py file)");
  }
  return out;
}

Status CheckPythonReward(const PythonRewardOptions& options) {
  SLUICE_RETURN_IF_ERROR(CheckOptions(options));
  Result<std::unique_ptr<PythonWorker>> worker =
      PythonWorker::Start(options.executable, {"reward", options.function}, Clock::now() + options.start_timeout);
  return worker.status().WithContext("reward.python '" + options.function + "'");
}

Result<std::unique_ptr<Task>> MakePythonRewardTask(std::unique_ptr<Task> base, const PythonRewardOptions& options) {
  if (base == nullptr) return Status::InvalidArgument("MakePythonRewardTask: no base task");
  SLUICE_RETURN_IF_ERROR(CheckOptions(options));
  return std::unique_ptr<Task>(new PythonRewardTask(std::move(base), options));
}

}  // namespace sluice::reward
