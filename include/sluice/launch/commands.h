// The `sluice` subcommands. Each takes its arguments (after the subcommand
// name), prints to stdout/stderr and returns a process exit code:
// 0 success, 1 runtime failure, 2 bad usage or input.
#ifndef SLUICE_LAUNCH_COMMANDS_H_
#define SLUICE_LAUNCH_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::launch {

// Runs a command body: prints a failing Status as "error: <Code>: <message>"
// and turns it into the exit code; libtorch exceptions become Internal.
int RunCommand(Status (*command)(const std::vector<std::string>&), const std::vector<std::string>& args);

// Sets libtorch's intra-op threads: `threads`, or every core when 0.
void SetIntraOpThreads(int64_t threads);

// `sluice init`: writes a freshly initialized built-in model (a preset) as a
// Hugging Face checkpoint directory.
int RunInitCommand(const std::vector<std::string>& args);

// `sluice generate`: loads a checkpoint (or a preset) and generates with the
// continuous-batching rollout engine, printing samples and throughput.
int RunGenerateCommand(const std::vector<std::string>& args);

// `sluice train`: warm start then synchronous RL on a built-in or JSONL task,
// configured by a YAML file and key=value overrides.
int RunTrainCommand(const std::vector<std::string>& args);

// `sluice eval`: held-out accuracy of a checkpoint on a task.
int RunEvalCommand(const std::vector<std::string>& args);

// `sluice tokenize`: a model directory's tokenizer.json on text (ids as
// JSON), or the reverse with --decode.
int RunTokenizeCommand(const std::vector<std::string>& args);

// `sluice calibrate`: measures what a run's parts cost here for the config's
// model and writes a cost profile for the simulator.
int RunCalibrateCommand(const std::vector<std::string>& args);

// `sluice simulate`: predicts a run's wall time in each mode from its config
// and a cost profile (docs/simulator.md).
int RunSimulateCommand(const std::vector<std::string>& args);

// `sluice plan`: compares training policies on a GPU cluster under roofline
// costs, searches the split and staleness, reproduces published regimes
// (docs/simulator.md).
int RunPlanCommand(const std::vector<std::string>& args);

// `sluice report RUN_DIR`: writes RUN_DIR/report.html (see report.h).
int RunReportCommand(const std::vector<std::string>& args);

}  // namespace sluice::launch

#endif  // SLUICE_LAUNCH_COMMANDS_H_
