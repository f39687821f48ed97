// The `sluice train` config (its schema and what it builds), shared by the
// commands that read the same config: calibrate and simulate.
#ifndef SLUICE_LAUNCH_TRAIN_CONFIG_H_
#define SLUICE_LAUNCH_TRAIN_CONFIG_H_

#include <memory>

#include "sluice/common/status.h"
#include "sluice/model/transformer.h"
#include "sluice/pipeline/options.h"
#include "sluice/reward/task.h"
#include "sluice/runtime/config.h"

namespace sluice::launch {

runtime::ConfigSchema TrainSchema();
// Errors: InvalidArgument naming the key.
Result<pipeline::RunOptions> RunOptionsFrom(const runtime::Config& c);
Result<reward::TaskOptions> TaskOptionsFrom(const runtime::Config& c);
Result<std::unique_ptr<reward::Task>> MakeRunTask(const runtime::Config& c, const reward::TaskOptions& t);
// model.path's checkpoint, or a fresh model.preset seeded by run.seed.
Result<std::shared_ptr<model::Transformer>> InitialModel(const runtime::Config& c);

}  // namespace sluice::launch

#endif  // SLUICE_LAUNCH_TRAIN_CONFIG_H_
