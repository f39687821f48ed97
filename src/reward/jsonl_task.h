// The "jsonl" task: examples read from JSON Lines files (format in task.h).
#ifndef SLUICE_REWARD_JSONL_TASK_H_
#define SLUICE_REWARD_JSONL_TASK_H_

#include <memory>

#include "sluice/reward/task.h"

namespace sluice::reward::internal {

// Reads and validates the files eagerly; the task holds every example.
Result<std::unique_ptr<Task>> MakeJsonlTask(const JsonlOptions& options);

}  // namespace sluice::reward::internal

#endif  // SLUICE_REWARD_JSONL_TASK_H_
