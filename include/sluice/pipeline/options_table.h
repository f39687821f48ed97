// The `sluice train` config keys that set RunOptions, declared once: each
// key's type, default, range and help, and the field it sets. The schema
// (`--help-config`, docs/config.md), the mapping from a loaded config
// (RunOptionsFromConfig) and the range checks of RunOptions::Validate all
// come from this table.
#ifndef SLUICE_PIPELINE_OPTIONS_TABLE_H_
#define SLUICE_PIPELINE_OPTIONS_TABLE_H_

#include "sluice/common/status.h"
#include "sluice/pipeline/options.h"
#include "sluice/runtime/config_table.h"

namespace sluice::pipeline {

// The table (built once; keys in the order docs/config.md lists them within
// each section).
const runtime::ConfigTable<RunOptions>& RunOptionsTable();

// RunOptions from a config loaded with a schema that holds the table's keys:
// the bound fields, then what other keys derive (the devices from
// model.device and the role overrides, the learning-rate schedules, the
// off-policy correction and recomputation `auto` choose, the trainer's
// temperature), then Validate. Errors: InvalidArgument naming the key.
Result<RunOptions> RunOptionsFromConfig(const runtime::Config& c);

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_OPTIONS_TABLE_H_
