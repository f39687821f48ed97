// `sluice <command> [flags]`: the command-line entry point.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "sluice/launch/commands.h"
#include "sluice/runtime/process.h"

namespace {

constexpr const char* kUsage =
    "usage: sluice <command> [--flag=value ...]\n"
    "commands:\n"
    "  train      warm start, then RL on a verifiable task (YAML config + key=value overrides)\n"
    "  eval       held-out accuracy of a checkpoint on a task\n"
    "  generate   generate with the continuous-batching rollout engine\n"
    "  report     render a run directory's metrics as one HTML page\n"
    "  init       write a freshly initialized built-in model as a Hugging Face checkpoint\n"
    "  tokenize   a model's tokenizer.json on text (ids as JSON), or --decode ids\n"
    "  calibrate  measure what a run's parts cost here: a cost profile for simulate\n"
    "  simulate   predict a run's wall time in each mode from its config and a cost profile\n"
    "  plan       compare training policies on a GPU cluster (roofline costs), recommend a split\n"
    "run `sluice <command> --help` for the command's flags\n";

}  // namespace

int main(int argc, char** argv) {
  sluice::runtime::EnsurePassiveOpenMp(argv);
  sluice::runtime::TuneAllocator();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "train") return sluice::launch::RunTrainCommand(args);
  if (command == "eval") return sluice::launch::RunEvalCommand(args);
  if (command == "init") return sluice::launch::RunInitCommand(args);
  if (command == "generate") return sluice::launch::RunGenerateCommand(args);
  if (command == "report") return sluice::launch::RunReportCommand(args);
  if (command == "tokenize") return sluice::launch::RunTokenizeCommand(args);
  if (command == "calibrate") return sluice::launch::RunCalibrateCommand(args);
  if (command == "simulate") return sluice::launch::RunSimulateCommand(args);
  if (command == "plan") return sluice::launch::RunPlanCommand(args);
  std::fprintf(stderr, "unknown command '%s'\n%s", command.c_str(), kUsage);
  return 2;
}
