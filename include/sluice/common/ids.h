// Identifiers every module shares, each defined once: the hubs, the rollout,
// the trainer and the pipeline all use these types (the module namespaces
// re-export them).
#ifndef SLUICE_COMMON_IDS_H_
#define SLUICE_COMMON_IDS_H_

#include <cstdint>

namespace sluice {

// A version of the policy weights: the CheckpointEngine's version number (0
// for the weights a run starts from, one more per publish; versions only
// increase). Rows, tokens and engines record the version that produced them.
using PolicyVersion = int64_t;

// A GRPO group: the answers to one prompt share it. The pipeline uses the
// prompt's cursor in the run's prompt order; in the TransferQueue group ids
// are scoped to a partition. Never negative for a real group.
using GroupId = int64_t;

}  // namespace sluice

#endif  // SLUICE_COMMON_IDS_H_
