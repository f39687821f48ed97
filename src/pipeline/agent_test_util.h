// Private to the pipeline's agent tests.
#ifndef SLUICE_SRC_PIPELINE_AGENT_TEST_UTIL_H_
#define SLUICE_SRC_PIPELINE_AGENT_TEST_UTIL_H_

#include <torch/torch.h>

#include <memory>

#include "sluice/model/transformer.h"

namespace sluice::pipeline::agent_test {

// A byte model that ends every turn at once (each turn the end token
// alone: every embedding the same vector, the output layer pointing at EOS),
// whatever the libtorch's random numbers and a few training steps: the
// agent machinery's behaviour does not depend on what is said.
inline std::shared_ptr<model::Transformer> EndingModel() {
  model::ModelConfig c = *model::PresetModelConfig("tiny");
  c.tie_word_embeddings = false;
  c.max_position_embeddings = 256;
  auto m = std::make_shared<model::Transformer>(c, 3);
  torch::NoGradGuard g;
  for (auto& p : m->named_parameters()) {
    if (p.key().find("norm") == std::string::npos) p.value().zero_();
  }
  auto params = m->named_parameters();
  params["model.embed_tokens.weight"].fill_(1.0);
  params["lm_head.weight"][model::ByteTokenizer::kEos].fill_(8.0);
  return m;
}

}  // namespace sluice::pipeline::agent_test

#endif  // SLUICE_SRC_PIPELINE_AGENT_TEST_UTIL_H_
