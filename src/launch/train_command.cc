// `sluice train` and `sluice eval`: the synchronous RL run from a YAML config
// with key=value overrides, and held-out evaluation of a checkpoint.
#include <arpa/inet.h>
#include <netdb.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "sluice/common/check.h"
#include "sluice/common/file_util.h"
#include "sluice/common/random.h"
#include "sluice/launch/commands.h"
#include "sluice/launch/report.h"
#include "sluice/model/hf_tokenizer.h"
#include "sluice/model/weights.h"
#include "sluice/pipeline/evaluator.h"
#include "sluice/pipeline/options_table.h"
#include "sluice/pipeline/rank_agent.h"
#include "sluice/pipeline/run.h"
#include "sluice/reward/python_reward.h"
#include "sluice/reward/task.h"
#include "sluice/runtime/config.h"
#include "sluice/runtime/config_table.h"
#include "sluice/runtime/flags.h"
#include "sluice/runtime/launch_env.h"
#include "sluice/runtime/supervisor.h"
#include "train_config.h"

namespace sluice::launch {
namespace {

using runtime::Config;
using runtime::ConfigSchema;
using runtime::FlagSet;
using runtime::StopOnSignals;

namespace fs = std::filesystem;

}  // namespace

// The train config, shared with `sluice calibrate` and `sluice simulate`
// (train_config.h); the helpers between are file-local (static). Its keys:
// those of RunOptions (pipeline/options_table.h) and these, the task's
// (bound to reward::TaskOptions) and the launcher's own.
static const runtime::ConfigTable<reward::TaskOptions>& LaunchTable() {
  static const runtime::ConfigTable<reward::TaskOptions>* table = [] {
    auto* tp = new runtime::ConfigTable<reward::TaskOptions>;
    runtime::ConfigTable<reward::TaskOptions>& t = *tp;
    t.Declare().AddInt("run.threads", 0, 0, 1024, "intra-op threads (0 = all cores)");
    t.Declare().AddBool("run.overwrite", false,
                        "start afresh in a run.dir that holds an earlier run, removing that run's files first");
    t.Declare().AddEnum("run.progress", "auto", {"auto", "bar", "lines", "off"}, "progress display on stderr");
    t.Declare().AddEnum(
        "model.preset", "1m", {"tiny", "1m", "5m", "20m", "0.5b"},
        "built-in model size when model.path is empty (0.5b: Qwen2.5-0.5B's shape and vocabulary size)");
    t.Enum("task.name", "arithmetic", {"arithmetic", "sort", "jsonl", "math"},
           "the verifiable task (math: task.jsonl.* files in the GSM8K or MATH layout, answers compared as math)",
           SLUICE_FIELD(name));
    t.Int("task.train_size", 100000, 1, 100000000, "generated tasks: train examples", SLUICE_FIELD(train_size));
    t.Int("task.eval_size", 200, 1, 1000000, "generated tasks: held-out examples", SLUICE_FIELD(eval_size));
    t.Double("task.eval_fraction", 0.1, 1e-6, 0.5,
             "generated tasks: share of the problem space held out (by a hash of the prompt)",
             SLUICE_FIELD(eval_fraction));
    t.Int("task.arithmetic.max_ops", 10, 1, 64, "arithmetic: most operations in a problem",
          SLUICE_FIELD(arithmetic.max_ops));
    t.Int("task.arithmetic.max_operand", 9, 1, 999, "arithmetic: operands are drawn from [1, max_operand]",
          SLUICE_FIELD(arithmetic.max_operand));
    t.Int("task.arithmetic.max_total", 99, 1, 1000000, "arithmetic: running totals stay in [0, max_total]",
          SLUICE_FIELD(arithmetic.max_total));
    t.Double("task.arithmetic.ops_exponent", 2.0, 0.0, 10.0, "arithmetic: P(k ops) ~ k^-exponent (larger = shorter)",
             SLUICE_FIELD(arithmetic.ops_exponent));
    t.Enum("task.arithmetic.scratchpad", "steps", {"steps", "reduce"},
           "arithmetic: 'steps' writes a+b=c per operation, 'reduce' rewrites the remaining expression",
           SLUICE_FIELD(arithmetic.scratchpad));
    t.Int("task.sort.min_length", 2, 1, 64, "sort: shortest list", SLUICE_FIELD(sort.min_length));
    t.Int("task.sort.max_length", 8, 1, 64, "sort: longest list", SLUICE_FIELD(sort.max_length));
    t.String("task.jsonl.train_path", "", "jsonl: file of {\"prompt\", \"answer\"[, \"solution\"]} lines",
             SLUICE_FIELD(jsonl.train_path));
    t.String("task.jsonl.eval_path", "", "jsonl: held-out file (empty: the tail of train_path)",
             SLUICE_FIELD(jsonl.eval_path));
    t.Double("task.jsonl.eval_fraction", 0.1, 1e-9, 0.999999, "jsonl: share of train_path held out",
             SLUICE_FIELD(jsonl.eval_fraction));
    t.String("task.math.instruction", "Let's think step by step and output the final answer within \\boxed{}.",
             "math: a line added after every question (empty: none)", SLUICE_FIELD(jsonl.instruction));
    t.Declare().AddString(
        "reward.python", "",
        "score answers with this Python function instead of the task's rule: package.module:function or "
        "path/to/file.py:function, verl's compute_score(data_source, solution_str, ground_truth, extra_info) "
        "(empty: off; docs/python.md)");
    t.Declare().AddInt("reward.python_workers", 2, 1, 64, "reward.python: worker processes per process that scores");
    t.Declare().AddDouble(
        "reward.python_timeout_s", 10.0, 0.001, 86400.0,
        "reward.python: seconds one call may take; past it the answer gets reward.error_reward and the "
        "worker is killed and replaced");
    t.Declare().AddString("reward.python_executable", "python3",
                          "reward.python: the Python interpreter (searched on PATH when it has no '/')");
    t.Declare().AddDouble(
        "reward.error_reward", 0.0, -1e6, 1e6,
        "reward.python: the reward of an answer whose function raised, timed out or returned no number");
    return tp;
  }();
  return *table;
}

ConfigSchema TrainSchema() {
  // Both tables' keys, grouped by section in this order (within a section,
  // each table's order).
  const ConfigSchema& run = pipeline::RunOptionsTable().schema();
  const ConfigSchema& launch = LaunchTable().schema();
  ConfigSchema s;
  for (const char* section : {"run", "model", "task", "reward", "agent", "sft", "rl", "trainer", "pipeline", "cluster",
                              "eval", "checkpoint"}) {
    const std::string prefix = std::string(section) + ".";
    for (const ConfigSchema* from : {&run, &launch}) {
      for (const runtime::ConfigKey& k : from->keys()) {
        if (k.key.rfind(prefix, 0) == 0) s.AddKey(k);
      }
    }
  }
  SLUICE_CHECK(s.keys().size() == run.keys().size() + launch.keys().size()) << "a config key outside the sections";
  return s;
}

Result<reward::TaskOptions> TaskOptionsFrom(const Config& c) {
  reward::TaskOptions t;
  LaunchTable().Apply(c, &t);
  t.seed = static_cast<uint64_t>(c.GetInt("run.seed"));
  if (t.name == "jsonl" && t.jsonl.train_path.empty()) {
    return Status::InvalidArgument("config key 'task.jsonl.train_path' must be set when task.name is jsonl");
  }
  return t;
}

// reward.python's options; nullopt when it is off.
static std::optional<reward::PythonRewardOptions> PythonRewardOptionsFrom(const Config& c) {
  reward::PythonRewardOptions o;
  o.function = c.GetString("reward.python");
  if (o.function.empty()) return std::nullopt;
  o.executable = c.GetString("reward.python_executable");
  o.workers = static_cast<int>(c.GetInt("reward.python_workers"));
  o.timeout =
      std::chrono::milliseconds(std::max<int64_t>(1, std::llround(c.GetDouble("reward.python_timeout_s") * 1000)));
  o.error_reward = c.GetDouble("reward.error_reward");
  return o;
}

// The run's task (task.*), scored by reward.python's function when it is
// set. Its workers start where it first scores, so a process that never
// scores starts none.
Result<std::unique_ptr<reward::Task>> MakeRunTask(const Config& c, const reward::TaskOptions& t) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<reward::Task> task, reward::MakeTask(t));
  const std::optional<reward::PythonRewardOptions> python = PythonRewardOptionsFrom(c);
  if (!python.has_value()) return task;
  return reward::MakePythonRewardTask(std::move(task), *python);
}

// Before anything is built: reward.python's function must load (the module
// imports, the function exists and is callable).
static Status CheckRunReward(const Config& c) {
  const std::optional<reward::PythonRewardOptions> python = PythonRewardOptionsFrom(c);
  return python.has_value() ? reward::CheckPythonReward(*python) : Status::Ok();
}

// What a run writes into its run.dir (and so what run.overwrite removes).
constexpr const char* kRunEntries[] = {"config.yaml",     "metrics.jsonl", "trajectories.jsonl", "report.html",
                                       kEvalBeforeRlFile, "sft",           "reference",          "checkpoints",
                                       "final",           "roles"};

// A run never writes over an earlier one by accident: a run.dir that holds
// anything is refused unless the user resumes the run in it (which needs
// something to resume) or asks to overwrite it, and says which.
static Status PrepareRunDir(const std::string& dir, bool resume, bool overwrite) {
  if (resume && overwrite) {
    return Status::InvalidArgument("run.resume=true and run.overwrite=true exclude each other: continue the run in " +
                                   dir + ", or replace it");
  }
  std::error_code ec;
  const fs::path root(dir);
  if (fs::exists(root, ec) && !fs::is_directory(root, ec)) {
    return Status::FailedPrecondition("run.dir " + dir + " exists and is not a directory");
  }
  std::vector<fs::path> ours;      // what an earlier run wrote there
  std::vector<std::string> found;  // every entry there, ours first, for messages
  for (const char* name : kRunEntries) {
    if (!fs::exists(root / name, ec)) continue;
    ours.push_back(root / name);
    found.push_back(fs::is_directory(root / name, ec) ? std::string(name) + "/" : name);
  }
  if (fs::is_directory(root, ec)) {
    std::error_code list_error;
    for (const auto& entry : fs::directory_iterator(root, list_error)) {
      const std::string name = entry.path().filename().string();
      if (std::find(std::begin(kRunEntries), std::end(kRunEntries), name) == std::end(kRunEntries)) {
        found.push_back(name);
      }
    }
    if (list_error) return Status::Unavailable("cannot read run.dir " + dir + ": " + list_error.message());
  }
  std::string listed;
  for (size_t i = 0; i < found.size() && i < 6; ++i) listed += (i > 0 ? ", " : "") + found[i];
  if (found.size() > 6) listed += ", ...";
  if (resume) {
    if (fs::exists(root / "checkpoints" / "latest", ec) || fs::exists(root / "sft" / "config.json", ec)) {
      return Status::Ok();
    }
    return Status::FailedPrecondition("run.resume=true, but run.dir " + dir +
                                      " holds no run to resume (no checkpoints/latest and no sft/ warm start" +
                                      (found.empty() ? "" : "; it holds " + listed) + ")");
  }
  if (found.empty()) return Status::Ok();
  if (!overwrite) {
    return Status::FailedPrecondition("run.dir " + dir + " is not empty (" + listed +
                                      "): set run.resume=true to continue the run in it, run.overwrite=true to "
                                      "replace it, or choose another run.dir");
  }
  // Overwrite: remove what a run writes; anything else stays where it is.
  for (const fs::path& entry : ours) {
    if (Status s = RemoveTree(entry.string()); !s.ok()) return Status::Unavailable("run.overwrite: " + s.message());
  }
  if (!ours.empty()) std::fprintf(stderr, "sluice train: run.overwrite: removed the earlier run in %s\n", dir.c_str());
  return Status::Ok();
}

Result<pipeline::RunOptions> RunOptionsFrom(const Config& c) { return pipeline::RunOptionsFromConfig(c); }

Result<std::shared_ptr<model::Transformer>> InitialModel(const Config& c) {
  const std::string path = c.GetString("model.path");
  if (!path.empty()) return model::LoadPretrained(path);
  SLUICE_ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetModelConfig(c.GetString("model.preset")));
  return std::make_shared<model::Transformer>(config, static_cast<uint64_t>(c.GetInt("run.seed")));
}

namespace {

std::string Duration(double seconds) {
  char buf[32];
  const int s = static_cast<int>(std::max(0.0, seconds));
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%dh%02dm", s / 3600, (s / 60) % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%dm%02ds", s / 60, s % 60);
  }
  return buf;
}

// Progress on stderr: a redrawn bar on a terminal, periodic lines otherwise.
class Progress {
 public:
  explicit Progress(const std::string& mode)
      : bar_(mode == "bar" || (mode == "auto" && ::isatty(STDERR_FILENO))), off_(mode == "off") {}

  void Update(const std::string& phase, int64_t done, int64_t total, const pipeline::StepRecord* r) {
    if (off_) return;
    if (phase != phase_) {
      phase_ = phase;
      start_ = std::chrono::steady_clock::now();
      gen_tokens_ = train_tokens_ = 0;
      gen_s_ = train_s_ = 0;
    }
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double eta = done > 0 ? elapsed / done * (total - done) : 0;
    char line[320];
    const int width = 24;
    const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
    std::string bar = std::string(filled, '#') + std::string(width - filled, '.');
    if (phase == "sft") {
      std::snprintf(line, sizeof(line), "warm start [%s] %lld/%lld ETA %s loss %.3f", bar.c_str(),
                    static_cast<long long>(done), static_cast<long long>(total), Duration(eta).c_str(),
                    r ? r->train.loss : 0.0);
    } else {
      const bool streaming = !r->staleness_hist.empty();
      gen_tokens_ += streaming ? r->rollout_tokens : r->generated_tokens;
      train_tokens_ += r->train.tokens;
      gen_s_ += r->gen_seconds;
      train_s_ += r->train_seconds;
      if (r->has_eval) last_eval_ = r->eval.accuracy;
      // Streaming: each stage's rate over the run so far and how busy it was
      // this step; sync: tokens/s of each phase.
      std::string busy_gen, busy_train;
      if (streaming) {
        busy_gen = " (" + std::to_string(static_cast<int>(100 * r->rollout_busy)) + "% busy)";
        busy_train = " (" + std::to_string(static_cast<int>(100 * r->trainer_busy)) + "% busy)";
      }
      std::snprintf(line, sizeof(line),
                    "RL [%s] %lld/%lld ETA %s reward %.2f acc %.2f%s gen %.0f tok/s%s train %.0f tok/s%s", bar.c_str(),
                    static_cast<long long>(done), static_cast<long long>(total), Duration(eta).c_str(), r->reward_mean,
                    r->accuracy,
                    last_eval_ >= 0 ? (" eval_acc " + std::to_string(last_eval_).substr(0, 4)).c_str() : "",
                    gen_s_ > 0 ? gen_tokens_ / gen_s_ : 0.0, busy_gen.c_str(),
                    train_s_ > 0 ? train_tokens_ / train_s_ : 0.0, busy_train.c_str());
    }
    if (bar_) {
      std::fprintf(stderr, "\r\033[K%s", line);
      if (done == total) std::fputc('\n', stderr);
    } else {
      const int64_t every = std::max<int64_t>(1, total / 20);
      if (done % every == 0 || done == total || (r && r->has_eval)) std::fprintf(stderr, "%s\n", line);
    }
    std::fflush(stderr);
  }

 private:
  bool bar_, off_;
  std::string phase_;
  std::chrono::steady_clock::time_point start_;
  int64_t gen_tokens_ = 0, train_tokens_ = 0;
  double gen_s_ = 0, train_s_ = 0, last_eval_ = -1;
};

// pipeline.processes: how this program runs a role of `run_dir`'s run (the
// launcher appends the connection flags).
Result<std::vector<std::string>> RoleCommand(const std::string& run_dir) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return Status::Unavailable("cannot resolve /proc/self/exe: " + ec.message());
  return std::vector<std::string>{exe.string(), "train", "--config=" + (fs::path(run_dir) / "config.yaml").string(),
                                  "model.path=" + (fs::path(run_dir) / "roles" / "init").string(), "sft.steps=0"};
}

// In a role process (started by a launcher with --role): runs that role.
Status RunRoleProcess(const pipeline::RoleConnection& c, Config& config) {
  const std::string role = pipeline::PipelineRoleName(c.role);
  SLUICE_ASSIGN_OR_RETURN(pipeline::RunOptions options, RunOptionsFrom(config));
  if (c.trainer_ranks > 0) options.pipeline.trainer_ranks = static_cast<int32_t>(c.trainer_ranks);
  SLUICE_ASSIGN_OR_RETURN(reward::TaskOptions task_options, TaskOptionsFrom(config));
  SetIntraOpThreads(config.GetInt("run.threads"));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<reward::Task> task, MakeRunTask(config, task_options));
  SLUICE_ASSIGN_OR_RETURN(auto policy, InitialModel(config));
  SLUICE_ASSIGN_OR_RETURN(auto loop, pipeline::TrainingRun::Create(policy, std::move(task), options));
  Progress progress(c.role == pipeline::PipelineRole::kTrainer ? config.GetString("run.progress") : "off");
  auto report = [&](const std::string& phase, int64_t done, int64_t total, const pipeline::StepRecord* r) {
    progress.Update(phase, done, total, r);
  };
  return loop->RunRole(c, report).WithContext(role + " role");
}

// The IPv4 address `host` names (a numeric address as it is).
Result<std::string> ResolveIPv4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::Unavailable("cannot resolve the rendezvous host '" + host + "': " + ::gai_strerror(rc));
  }
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof(text));
  ::freeaddrinfo(found);
  return std::string(text);
}

// Where a launched (or joining) process meets the run: the ranks' store at
// the rendezvous, this launch attempt's keys in it, and the config's digest.
Status MeetAt(const runtime::ProcessPlacement& p, const Config& config, pipeline::PipelineOptions* po) {
  SLUICE_ASSIGN_OR_RETURN(const std::string ip, ResolveIPv4(p.master_addr));
  po->wiring.trainer_store = ip + ":" + std::to_string(p.master_port);
  po->wiring.trainer_store_external = p.store_served_by_launcher;
  // torchrun's agent store (its static rendezvous) lives across
  // --max-restarts attempts: each attempt's ranks meet in a namespace of
  // their own. A store rank 0 serves (torchrun's c10d rendezvous, Slurm,
  // MPI) is new with every attempt; and c10d's agents do not count the
  // restarts that another host's failure brings, so their counts differ.
  const int64_t attempt = p.store_served_by_launcher ? p.restart_count : 0;
  po->wiring.trainer_store_prefix = "sluice/attempt-" + std::to_string(attempt);
  if (attempt > 0) po->wiring.previous_store_prefix = "sluice/attempt-" + std::to_string(attempt - 1);
  po->wiring.hub_bind = ip.rfind("127.", 0) == 0 ? "" : "tcp://" + ip + ":0";
  char digest[17];  // of the config as every rank read it
  std::snprintf(digest, sizeof(digest), "%016llx", static_cast<unsigned long long>(Fnv1a(config.ToYaml())));
  po->wiring.config_digest = digest;
  po->wiring.model_path = config.GetString("model.path");
  return Status::Ok();
}

// Started by torchrun, srun or mpirun as one of world_size processes of one
// run: trainer ranks first, then cluster.rollout_ranks rollout replicas,
// then cluster.reward_ranks reward workers. Rank 0's process is the run's launcher (hub,
// reward, trainer rank 0, its host's rollout replicas; its hub listens on
// the rendezvous host's address, with a token, when that is not loopback);
// the others run beside it (pipeline::RunLaunchedRank). Errors: the
// streaming process mode missing, or counts disagreeing with the launch.
Status PlaceRanks(const runtime::ProcessPlacement& p, const Config& config, pipeline::RunOptions* o) {
  pipeline::PipelineOptions& po = o->pipeline;
  const std::string launched = "launched as " + p.ToString();
  if (!po.processes || po.mode == pipeline::PipelineMode::kDirect) {
    return Status::FailedPrecondition(
        launched +
        ": each launched process is one trainer rank, rollout replica or reward worker of the run, "
        "which needs pipeline.processes=true and a streaming pipeline.mode (sync, "
        "one_step_off, async)");
  }
  const std::string declared = "cluster.rollout_ranks=" + std::to_string(po.remote_rollout_replicas) +
                               ", cluster.reward_ranks=" + std::to_string(po.remote_reward_workers) +
                               " and cluster.storage_ranks=" + std::to_string(po.remote_storage_units);
  const int64_t trainers =
      p.world_size - po.remote_rollout_replicas - po.remote_reward_workers - po.remote_storage_units;
  if (trainers < 1) {
    return Status::InvalidArgument(declared + ", but " + launched +
                                   ": that leaves no trainer rank (rank 0 is one); launch more processes or declare "
                                   "fewer rollout, reward and storage ranks");
  }
  if (po.trainer_ranks != 1 && po.trainer_ranks != trainers) {
    return Status::InvalidArgument("pipeline.trainer_ranks=" + std::to_string(po.trainer_ranks) + ", but " + launched +
                                   ", and " + declared + " leave " + std::to_string(trainers) +
                                   " trainer rank(s); leave it unset or set it to " + std::to_string(trainers));
  }
  if (!po.trainer_command.empty()) {
    return Status::InvalidArgument(launched +
                                   ": launched trainer ranks are Sluice's trainer; pipeline.trainer_command "
                                   "replaces it");
  }
  po.trainer_ranks = static_cast<int32_t>(trainers);
  po.wiring.local_trainer_ranks = 1;
  return MeetAt(p, config, &po);
}

// Set on the child a launched rank's supervisor starts (SuperviseLaunchedRank).
constexpr char kSupervisedRankVariable[] = "SLUICE_SUPERVISED_RANK";
// And on a joined process's child: the index its supervisor was given.
constexpr char kJoinedIndexVariable[] = "SLUICE_JOINED_INDEX";

// A process of a launched run beside rank 0's (trainer rank, rollout
// replica or reward worker `index`; `joined`: beyond the launch, `sluice
// train --join`), until the run ends. With pipeline.max_restarts a replica
// or worker runs as a child of this process, its host's supervisor (the
// same command again, told by kSupervisedRankVariable to run the role
// itself).
Status RunBesideRankZero(const Config& config, const pipeline::RunOptions& options,
                         const std::vector<std::string>& args, pipeline::PipelineRole role, int64_t index, bool joined,
                         const std::string& placed) {
  SLUICE_ASSIGN_OR_RETURN(reward::TaskOptions task_options, TaskOptionsFrom(config));
  SetIntraOpThreads(config.GetInt("run.threads"));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<reward::Task> task, MakeRunTask(config, task_options));
  SLUICE_ASSIGN_OR_RETURN(auto policy, InitialModel(config));
  SLUICE_ASSIGN_OR_RETURN(auto loop, pipeline::TrainingRun::Create(policy, std::move(task), options));
  const pipeline::PipelineOptions& po = options.pipeline;
  const std::chrono::seconds wait(po.rank_timeout_seconds);
  if (joined && index < 0) {
    SLUICE_ASSIGN_OR_RETURN(index, pipeline::ClaimJoinedIndex(po, po.wiring.trainer_store, role, wait));
  }
  const std::string what = pipeline::PipelineProcessTitle(role, index);
  std::fprintf(stderr, "sluice train: %s, %s of the run at %s%s\n", placed.c_str(), what.c_str(),
               po.wiring.trainer_store.c_str(), joined ? " (joined beyond the launch)" : "");
  if (role != pipeline::PipelineRole::kTrainer && po.max_restarts > 0 &&
      std::getenv(kSupervisedRankVariable) == nullptr) {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec) return Status::Unavailable("cannot resolve /proc/self/exe: " + ec.message());
    std::vector<std::string> command = {exe.string(), "train"};
    command.insert(command.end(), args.begin(), args.end());
    std::map<std::string, std::string> env = {{kSupervisedRankVariable, "1"}};
    if (joined) env[kJoinedIndexVariable] = std::to_string(index);  // the child keeps this number
    SLUICE_RETURN_IF_ERROR(
        pipeline::SuperviseLaunchedRank(po, po.wiring.trainer_store, role, index, wait, command, env, joined));
  } else {
    SLUICE_RETURN_IF_ERROR(pipeline::RunLaunchedRank(*loop, po.wiring.trainer_store, role, index, wait, joined));
  }
  std::fprintf(stderr, "%s: done\n", what.c_str());
  return Status::Ok();
}

// `sluice train --join=rollout|reward`: one more rollout replica or reward
// worker for a run launched with torchrun, srun or mpirun, started on any
// host while the run goes on (MASTER_ADDR / MASTER_PORT name the run's
// rendezvous, as for its ranks; TORCHELASTIC_RESTART_COUNT its attempt).
Status JoinRun(const std::string& join, const Config& config, const std::vector<std::string>& args) {
  const pipeline::PipelineRole role = join == "rollout"  ? pipeline::PipelineRole::kRollout
                                      : join == "reward" ? pipeline::PipelineRole::kReward
                                                         : pipeline::PipelineRole::kTrainer;
  if (role == pipeline::PipelineRole::kTrainer) {
    return Status::InvalidArgument("--join=" + join +
                                   ": a process joins a run as a rollout replica (--join=rollout) or a reward worker "
                                   "(--join=reward); trainer ranks are fixed at launch");
  }
  if (std::getenv("MASTER_ADDR") == nullptr || std::getenv("MASTER_PORT") == nullptr) {
    return Status::InvalidArgument("--join=" + join +
                                   ": set MASTER_ADDR and MASTER_PORT to the run's rendezvous (what its ranks were "
                                   "launched with)");
  }
  SLUICE_ASSIGN_OR_RETURN(runtime::ProcessPlacement placement, runtime::PlacementFromEnvironment(std::getenv));
  SLUICE_ASSIGN_OR_RETURN(pipeline::RunOptions options, RunOptionsFrom(config));
  pipeline::PipelineOptions& po = options.pipeline;
  if (!po.processes || po.mode == pipeline::PipelineMode::kDirect) {
    return Status::FailedPrecondition("--join=" + join +
                                      ": a run's processes need pipeline.processes=true and a streaming "
                                      "pipeline.mode (sync, one_step_off, async), as the run's config has");
  }
  SLUICE_RETURN_IF_ERROR(MeetAt(placement, config, &po));
  int64_t index = -1;
  if (const char* given = std::getenv(kJoinedIndexVariable); given != nullptr && std::getenv(kSupervisedRankVariable)) {
    index = std::atoll(given);
  }
  return RunBesideRankZero(config, options, args, role, index, /*joined=*/true,
                           "joining from " + placement.master_addr + ":" + std::to_string(placement.master_port));
}

Status Train(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Add("config", "", "YAML config file (keys: `sluice train --help-config`)");
  flags.Add("help-config", "false", "print every config key with its default and exit", /*is_bool=*/true);
  flags.Add("join", "",
            "join a launched run from another host beyond its launch: rollout or reward (MASTER_ADDR and "
            "MASTER_PORT name its rendezvous; the same config as its ranks)");
  // Set by a launcher (pipeline.processes) on the role processes it starts.
  pipeline::AddRoleFlags(flags);
  SLUICE_ASSIGN_OR_RETURN(const bool helped, flags.ParseOrHelp(args, "sluice train [--config=FILE] [key=value ...]"));
  if (helped) return Status::Ok();
  ConfigSchema schema = TrainSchema();
  SLUICE_ASSIGN_OR_RETURN(bool help_config, flags.GetBool("help-config"));
  if (help_config) {
    std::printf("%s", schema.Document().c_str());
    return Status::Ok();
  }
  SLUICE_ASSIGN_OR_RETURN(std::string config_path, flags.GetString("config"));
  SLUICE_ASSIGN_OR_RETURN(Config config, Config::Load(schema, config_path, flags.positional()));
  SLUICE_ASSIGN_OR_RETURN(std::optional<pipeline::RoleConnection> role, pipeline::RoleFromFlags(flags));
  if (role) return RunRoleProcess(*role, config);
  SLUICE_ASSIGN_OR_RETURN(const std::string join, flags.GetString("join"));
  if (!join.empty()) return JoinRun(join, config, args);
  SLUICE_ASSIGN_OR_RETURN(runtime::ProcessPlacement placement, runtime::PlacementFromEnvironment(std::getenv));
  SLUICE_ASSIGN_OR_RETURN(pipeline::RunOptions options, RunOptionsFrom(config));
  if (placement.world_size == 1 &&
      (options.pipeline.remote_rollout_replicas > 0 || options.pipeline.remote_reward_workers > 0 ||
       options.pipeline.remote_storage_units > 0)) {
    return Status::InvalidArgument(
        "cluster.rollout_ranks=" + std::to_string(options.pipeline.remote_rollout_replicas) +
        ", cluster.reward_ranks=" + std::to_string(options.pipeline.remote_reward_workers) +
        ", cluster.storage_ranks=" + std::to_string(options.pipeline.remote_storage_units) +
        ": rollout, reward and storage ranks are processes that a launcher (torchrun, srun, mpirun) starts beside "
        "rank 0, and this process is the only one (no RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS or "
        "OMPI_COMM_WORLD_RANK/SIZE, or a world size of 1); use pipeline.rollout_replicas and "
        "pipeline.reward_workers for processes on this host");
  }
  if (placement.world_size > 1) {
    SLUICE_RETURN_IF_ERROR(PlaceRanks(placement, config, &options));
    if (placement.rank > 0 && std::getenv(kSupervisedRankVariable) == nullptr) {
      // A torchrun restart: this attempt starts when rank 0 has ended the last.
      SLUICE_ASSIGN_OR_RETURN(const bool finished, pipeline::AwaitPreviousAttempt(options.pipeline));
      if (finished) {
        std::fprintf(stderr, "sluice train: %s: the attempt before this one finished the run; nothing to do\n",
                     placement.ToString().c_str());
        return Status::Ok();
      }
    }
    const int64_t storage_from = placement.world_size - options.pipeline.remote_storage_units;
    if (placement.rank >= storage_from) {
      return pipeline::ServeHubStorage(options, placement.rank - storage_from, placement.ToString());
    }
    if (placement.rank > 0) {
      const pipeline::PipelineOptions& po = options.pipeline;
      const int64_t rollout_from = po.trainer_ranks, reward_from = rollout_from + po.remote_rollout_replicas;
      const pipeline::PipelineRole role = placement.rank < rollout_from  ? pipeline::PipelineRole::kTrainer
                                          : placement.rank < reward_from ? pipeline::PipelineRole::kRollout
                                                                         : pipeline::PipelineRole::kReward;
      const int64_t index = role == pipeline::PipelineRole::kTrainer ? placement.rank
                            : role == pipeline::PipelineRole::kRollout
                                ? po.rollout_replicas + placement.rank - rollout_from
                                : po.reward_workers + placement.rank - reward_from;
      return RunBesideRankZero(config, options, args, role, index, /*joined=*/false, placement.ToString());
    }
  }
  SLUICE_RETURN_IF_ERROR(CheckRunReward(config));
  SLUICE_RETURN_IF_ERROR(pipeline::CheckAgentEnvironment(options.agent, options.tokenizer_dir));
  if (options.pipeline.processes) {
    SLUICE_ASSIGN_OR_RETURN(options.pipeline.wiring.role_command, RoleCommand(options.run_dir));
  }
  SLUICE_ASSIGN_OR_RETURN(reward::TaskOptions task_options, TaskOptionsFrom(config));
  SetIntraOpThreads(config.GetInt("run.threads"));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<reward::Task> task, MakeRunTask(config, task_options));
  SLUICE_ASSIGN_OR_RETURN(auto policy, InitialModel(config));
  bool overwrite = config.GetBool("run.overwrite");
  // The torchrun job that started the run (its --rdzv_id), kept in the run
  // directory: the same job starting rank 0 again is a restart even when
  // its agent did not count one (c10d: another host failed).
  const fs::path job_file = fs::path(options.run_dir) / "torchrun_job";
  bool same_job = false;
  if (!placement.job_id.empty()) {
    Result<std::string> started_by = ReadFileToString(job_file.string());
    same_job = started_by.ok() && *started_by == placement.job_id;
  }
  if ((placement.restart_count > 0 || same_job) && !options.resume) {
    // torchrun --max-restarts started this command again after a failure:
    // take up the failed attempt's run (its latest checkpoint), or, with
    // none yet, start it over in place.
    std::error_code ec;
    if (fs::exists(fs::path(options.run_dir) / "checkpoints" / "latest", ec)) {
      options.resume = true;
      overwrite = false;
    } else {
      overwrite = true;
    }
    std::fprintf(stderr, "sluice train: torchrun restart %lld%s: %s\n", static_cast<long long>(placement.restart_count),
                 placement.restart_count == 0 ? (" (job " + placement.job_id + " started again)").c_str() : "",
                 options.resume ? "resuming from the run's latest checkpoint" : "no checkpoint yet, starting over");
  }
  SLUICE_RETURN_IF_ERROR(PrepareRunDir(options.run_dir, options.resume, overwrite));
  if (!placement.job_id.empty() && !same_job) {
    SLUICE_RETURN_IF_ERROR(WriteFileAtomically(job_file.string(), placement.job_id));
  }
  std::fprintf(
      stderr, "sluice train: task %s, %.2fM-parameter model, %lld RL steps x %lld prompts x %lld answers, run dir %s\n",
      task->name().c_str(), policy->config().NumParameters() / 1e6, static_cast<long long>(options.rl.steps),
      static_cast<long long>(options.rl.prompts_per_step), static_cast<long long>(options.rl.group_size),
      options.run_dir.c_str());
  SLUICE_ASSIGN_OR_RETURN(auto loop, pipeline::TrainingRun::Create(policy, std::move(task), options));
  {
    // The config the run used, as it would be resumed (written once the run
    // is set up, so a start refused on its inputs leaves the directory
    // empty): run.overwrite is how this start treated the directory, not
    // part of the run.
    SLUICE_ASSIGN_OR_RETURN(Config saved, Config::FromYamlText(schema, config.ToYaml(), {"run.overwrite=false"}));
    SLUICE_RETURN_IF_ERROR(WriteFileAtomically((fs::path(options.run_dir) / "config.yaml").string(), saved.ToYaml()));
  }
  Progress progress(config.GetString("run.progress"));
  auto report = [&](const std::string& phase, int64_t done, int64_t total, const pipeline::StepRecord* r) {
    progress.Update(phase, done, total, r);
  };
  const auto start = std::chrono::steady_clock::now();
  SLUICE_RETURN_IF_ERROR(loop->WarmStart(report));
  SLUICE_ASSIGN_OR_RETURN(pipeline::EvalResult before, loop->Evaluate());
  std::fprintf(stderr, "held-out accuracy before RL: %.1f%% (%lld examples, greedy)\n", 100 * before.accuracy,
               static_cast<long long>(before.examples));
  nlohmann::json before_json{{"eval_accuracy", before.accuracy}, {"examples", before.examples}};
  if (before.tool_use >= 0) before_json["eval_tool_use"] = before.tool_use;  // agent runs
  SLUICE_RETURN_IF_ERROR(
      WriteFileAtomically((fs::path(options.run_dir) / kEvalBeforeRlFile).string(), before_json.dump() + "\n"));
  {
    // Process mode: Ctrl-C (or SIGTERM) stops every role and cleans up.
    std::optional<StopOnSignals> signals;
    if (options.pipeline.processes) signals.emplace();
    SLUICE_RETURN_IF_ERROR(loop->Train(report, signals ? signals->flag() : nullptr));
  }
  SLUICE_ASSIGN_OR_RETURN(pipeline::EvalResult after, loop->Evaluate());
  const fs::path final_dir = fs::path(options.run_dir) / "final";
  SLUICE_RETURN_IF_ERROR(model::SavePretrained(*policy, final_dir.string()));
  SLUICE_RETURN_IF_ERROR(model::CopyTokenizerFiles(options.tokenizer_dir, final_dir.string()));
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 60;
  std::printf("held-out accuracy: %.1f%% before RL -> %.1f%% after RL (%lld examples, greedy), %.1f min\n",
              100 * before.accuracy, 100 * after.accuracy, static_cast<long long>(after.examples), minutes);
  if (before.tool_use >= 0 && after.tool_use >= 0) {
    std::printf("held-out answers calling a tool: %.1f%% before RL -> %.1f%% after RL\n", 100 * before.tool_use,
                100 * after.tool_use);
  }
  std::printf("final model: %s   metrics: %s\n", final_dir.c_str(),
              (fs::path(options.run_dir) / "metrics.jsonl").c_str());
  SLUICE_ASSIGN_OR_RETURN(std::string report_path, WriteRunReport(options.run_dir));
  std::printf("report: %s\n", report_path.c_str());
  return Status::Ok();
}

Status Eval(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Add("config", "", "YAML config file (same keys as train; task.* and eval.* are used)");
  flags.Add("model", "", "checkpoint directory to evaluate (required)");
  SLUICE_ASSIGN_OR_RETURN(const bool helped,
                          flags.ParseOrHelp(args, "sluice eval --model=DIR [--config=FILE] [key=value ...]"));
  if (helped) return Status::Ok();
  SLUICE_ASSIGN_OR_RETURN(std::string model_dir, flags.GetString("model"));
  if (model_dir.empty()) return Status::InvalidArgument("flag --model is required");
  SLUICE_ASSIGN_OR_RETURN(std::string config_path, flags.GetString("config"));
  ConfigSchema schema = TrainSchema();
  std::vector<std::string> overrides = flags.positional();
  overrides.insert(overrides.begin(), {"rl.steps=0", "sft.steps=0"});
  SLUICE_ASSIGN_OR_RETURN(Config config, Config::Load(schema, config_path, overrides));
  SLUICE_ASSIGN_OR_RETURN(pipeline::RunOptions options, RunOptionsFrom(config));
  SLUICE_RETURN_IF_ERROR(CheckRunReward(config));
  SLUICE_ASSIGN_OR_RETURN(reward::TaskOptions task_options, TaskOptionsFrom(config));
  SetIntraOpThreads(config.GetInt("run.threads"));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<reward::Task> task, MakeRunTask(config, task_options));
  SLUICE_ASSIGN_OR_RETURN(auto policy, model::LoadPretrained(model_dir));
  pipeline::EvaluatorOptions eval_options = pipeline::EvaluatorOptionsFor(options);
  SLUICE_ASSIGN_OR_RETURN(eval_options.tokenizer, model::LoadTokenizer(model_dir));
  SLUICE_ASSIGN_OR_RETURN(eval_options.prompt_format, pipeline::PromptFormatFor(options.prompts, model_dir));
  eval_options.tokenizer_dir = model_dir;
  SLUICE_ASSIGN_OR_RETURN(auto evaluator, pipeline::Evaluator::Create(policy, std::move(task), eval_options));
  auto result = evaluator->Evaluate();
  SLUICE_RETURN_IF_ERROR(result.status());
  std::printf("held-out accuracy %.1f%%, mean reward %.3f, mean response %.1f tokens (%lld examples, greedy)\n",
              100 * result->accuracy, result->mean_reward, result->mean_length,
              static_cast<long long>(result->examples));
  if (result->sampled_accuracy >= 0) {
    std::printf("sampled accuracy %.1f%% (%lld answers per example)\n", 100 * result->sampled_accuracy,
                static_cast<long long>(options.eval.samples));
  }
  if (std::string by = result->DifficultySummary(); !by.empty()) {
    std::printf("greedy accuracy by difficulty (examples): %s\n", by.c_str());
  }
  return Status::Ok();
}

Status Report(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Add("compare", "",
            "compare runs instead: write OUT/comparison.html and OUT/comparison.md from LABEL=RUN_DIR "
            "arguments (runs sharing a label are seeds; the first label is the baseline)");
  SLUICE_RETURN_IF_ERROR(flags.Parse(args));
  SLUICE_ASSIGN_OR_RETURN(std::string compare_out, flags.GetString("compare"));
  if (!flags.help_requested() && !compare_out.empty()) {
    std::vector<LabeledRun> runs;
    for (const std::string& arg : flags.positional()) {
      const size_t eq = arg.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == arg.size()) {
        return Status::InvalidArgument("sluice report --compare: '" + arg + "' is not LABEL=RUN_DIR");
      }
      runs.push_back({arg.substr(0, eq), arg.substr(eq + 1)});
    }
    SLUICE_ASSIGN_OR_RETURN(Comparison c, CompareRuns(runs));
    std::error_code ec;
    fs::create_directories(compare_out, ec);
    SLUICE_RETURN_IF_ERROR(WriteFileAtomically((fs::path(compare_out) / "comparison.html").string(), c.html));
    SLUICE_RETURN_IF_ERROR(WriteFileAtomically((fs::path(compare_out) / "comparison.md").string(), c.markdown));
    std::printf("%s%s/comparison.html\n", c.markdown.c_str(), compare_out.c_str());
    return Status::Ok();
  }
  if (flags.help_requested() || flags.positional().size() != 1) {
    std::printf(
        "usage: sluice report RUN_DIR\n  writes RUN_DIR/report.html: charts of the run's metrics, one "
        "self-contained page\n       sluice report --compare=OUT LABEL=RUN_DIR ...\n%s",
        flags.Usage().c_str());
    return flags.help_requested() ? Status::Ok() : Status::InvalidArgument("sluice report takes one RUN_DIR");
  }
  SLUICE_ASSIGN_OR_RETURN(std::string path, WriteRunReport(flags.positional()[0]));
  std::printf("%s\n", path.c_str());
  return Status::Ok();
}

}  // namespace

int RunTrainCommand(const std::vector<std::string>& args) { return RunCommand(Train, args); }
int RunEvalCommand(const std::vector<std::string>& args) { return RunCommand(Eval, args); }
int RunReportCommand(const std::vector<std::string>& args) { return RunCommand(Report, args); }

}  // namespace sluice::launch
