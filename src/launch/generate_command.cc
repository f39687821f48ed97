// `sluice init` and `sluice generate`.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "sluice/launch/commands.h"
#include "sluice/model/device.h"
#include "sluice/model/hf_tokenizer.h"
#include "sluice/model/tokenizer.h"
#include "sluice/model/weights.h"
#include "sluice/rollout/engine.h"
#include "sluice/runtime/flags.h"

namespace sluice::launch {
namespace {

namespace fs = std::filesystem;
using runtime::FlagSet;

// Prints the error and returns the exit code for it.
int Fail(const Status& status) {
  std::cerr << "error: " << status.ToString() << "\n";
  return status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kNotFound ||
                 status.code() == StatusCode::kOutOfRange
             ? 2
             : 1;
}

std::string Printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 32 || c >= 127) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// The text of `ids` for display. A model's vocabulary may be larger than its
// tokenizer's (padded for the hardware, as Qwen's is), and a random or
// undertrained model samples those ids too: each is shown as <id N>.
std::string ShownText(const model::Tokenizer& tokenizer, const std::vector<model::TokenId>& ids) {
  auto whole = tokenizer.Decode(ids);
  if (whole.ok()) return *whole;
  std::string out;
  std::vector<model::TokenId> run;
  auto flush = [&] {
    if (auto text = tokenizer.Decode(run); text.ok()) out += *text;
    run.clear();
  };
  for (model::TokenId id : ids) {
    if (tokenizer.Knows(id)) {
      run.push_back(id);
    } else {
      flush();
      out += "<id " + std::to_string(id) + ">";
    }
  }
  flush();
  return out;
}

Status Init(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Add("preset", "1m", "built-in model size: tiny, 1m, 5m, 20m, 0.5b");
  flags.Add("seed", "0", "initialization seed");
  flags.Add("out", "", "output directory (Hugging Face layout: config.json + model.safetensors)");
  flags.Add("dtype", "F32", "weight dtype on disk: F32, BF16, F16");
  flags.Add("model-type", "llama", "architecture: llama, qwen2, qwen3");
  flags.Add("tokenizer", "",
            "directory whose tokenizer.json (and tokenizer_config.json) the model gets: its vocabulary sets "
            "vocab_size, its bos/eos tokens the config's ids (empty: the byte tokenizer)");
  SLUICE_ASSIGN_OR_RETURN(const bool helped, flags.ParseOrHelp(args, "sluice init [flags]"));
  if (helped) return Status::Ok();
  SLUICE_RETURN_IF_ERROR(flags.RejectPositional());
  SLUICE_ASSIGN_OR_RETURN(std::string preset, flags.GetString("preset"));
  SLUICE_ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetModelConfig(preset));
  SLUICE_ASSIGN_OR_RETURN(config.model_type, flags.GetChoice("model-type", {"llama", "qwen2", "qwen3"}));
  config.attention_bias = config.model_type == "qwen2";
  SLUICE_ASSIGN_OR_RETURN(std::string tokenizer_dir, flags.GetString("tokenizer"));
  if (!tokenizer_dir.empty()) {
    SLUICE_ASSIGN_OR_RETURN(auto tokenizer, model::HfTokenizer::Load(tokenizer_dir));
    config.vocab_size = tokenizer->vocab_size();
    config.bos_token_id = tokenizer->bos_id();
    config.eos_token_id = tokenizer->eos_id();
  }
  SLUICE_RETURN_IF_ERROR(config.Validate());
  SLUICE_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("seed", 0, INT64_MAX));
  SLUICE_ASSIGN_OR_RETURN(std::string out, flags.GetString("out"));
  if (out.empty()) return Status::InvalidArgument("flag --out is required");
  SLUICE_ASSIGN_OR_RETURN(std::string dtype_name, flags.GetChoice("dtype", {"F32", "BF16", "F16"}));
  model::Transformer m(config, static_cast<uint64_t>(seed));
  SLUICE_RETURN_IF_ERROR(model::SavePretrained(m, out, *ParseDTypeName(dtype_name)));
  SLUICE_RETURN_IF_ERROR(model::CopyTokenizerFiles(tokenizer_dir, out));
  std::printf("wrote %s model (%.2fM parameters) to %s\n", preset.c_str(), config.NumParameters() / 1e6, out.c_str());
  return Status::Ok();
}

Status Generate(const std::vector<std::string>& args) {
  FlagSet flags;
  flags.Add("model", "", "checkpoint directory (config.json + safetensors); empty: a fresh --preset model");
  flags.Add("preset", "1m", "built-in model when --model is empty: tiny, 1m, 5m, 20m, 0.5b");
  flags.Add("prompt", "", "prompt text; empty: a few built-in prompts");
  flags.Add("num-samples", "4", "samples per prompt");
  flags.Add("slots", "8", "concurrent sequences (continuous-batching slots)");
  flags.Add("scheduling", "continuous", "continuous or static batching");
  flags.Add("max-new-tokens", "48", "response length limit");
  flags.Add("temperature", "1.0", "sampling temperature (0 = greedy)");
  flags.Add("top-k", "0", "top-k truncation (0 = off)");
  flags.Add("top-p", "1.0", "nucleus truncation (1 = off)");
  flags.Add("seed", "0", "sampling seed (request i uses seed + i)");
  flags.Add("threads", "0", "intra-op threads (0 = all cores)");
  flags.Add("device", "auto", "auto (cuda when a GPU is usable), cpu, cuda or cuda:N");
  flags.Add("dtype", "auto", "weights and KV cache: auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16");
  SLUICE_ASSIGN_OR_RETURN(const bool helped, flags.ParseOrHelp(args, "sluice generate [flags]"));
  if (helped) return Status::Ok();
  SLUICE_RETURN_IF_ERROR(flags.RejectPositional());
  SLUICE_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", 0, 1024));
  SetIntraOpThreads(threads);
  SLUICE_ASSIGN_OR_RETURN(std::string device_name, flags.GetString("device"));
  SLUICE_ASSIGN_OR_RETURN(torch::Device device, model::ResolveDevice(device_name));
  SLUICE_ASSIGN_OR_RETURN(std::string model_dir, flags.GetString("model"));
  std::shared_ptr<model::Transformer> m;
  if (model_dir.empty()) {
    SLUICE_ASSIGN_OR_RETURN(std::string preset, flags.GetString("preset"));
    SLUICE_ASSIGN_OR_RETURN(model::ModelConfig config, model::PresetModelConfig(preset));
    m = std::make_shared<model::Transformer>(config, 0);
    m->to(device);
  } else {
    SLUICE_ASSIGN_OR_RETURN(m, model::LoadPretrained(model_dir, device));
  }
  SLUICE_ASSIGN_OR_RETURN(std::string dtype_name, flags.GetString("dtype"));
  SLUICE_ASSIGN_OR_RETURN(torch::ScalarType dtype, model::ResolveDtype(dtype_name, device));
  if (dtype != torch::kFloat32) model::PlaceModel(*m, device, dtype);
  // The model directory's own tokenizer.json when it has one, else bytes.
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<const model::Tokenizer> owned, model::LoadTokenizer(model_dir));
  std::error_code ec;
  const std::string tokenizer_name = !model_dir.empty() && fs::exists(fs::path(model_dir) / "tokenizer.json", ec)
                                         ? (fs::path(model_dir) / "tokenizer.json").string()
                                         : std::string("the byte tokenizer");
  const model::Tokenizer& tokenizer = *owned;
  if (m->config().vocab_size < tokenizer.vocab_size()) {
    return Status::InvalidArgument(
        "the model's vocab_size " + std::to_string(m->config().vocab_size) + " is smaller than " + tokenizer_name +
        "'s " + std::to_string(tokenizer.vocab_size()) + " ids: the tokenizer does not belong to this model");
  }

  rollout::EngineOptions options;
  SLUICE_ASSIGN_OR_RETURN(int64_t slots, flags.GetInt("slots", 1, 4096));
  options.num_slots = static_cast<int32_t>(slots);
  SLUICE_ASSIGN_OR_RETURN(std::string scheduling, flags.GetChoice("scheduling", {"continuous", "static"}));
  options.scheduling = scheduling == "static" ? rollout::Scheduling::kStatic : rollout::Scheduling::kContinuous;
  options.eos_token_id = tokenizer.eos_id();  // -1: the config's eos_token_id
  SLUICE_ASSIGN_OR_RETURN(auto engine, rollout::RolloutEngine::Create(rollout::PolicySnapshot{m, 0}, options));

  rollout::SamplingParams sampling;
  SLUICE_ASSIGN_OR_RETURN(int64_t max_new, flags.GetInt("max-new-tokens", 1, 1 << 20));
  sampling.max_new_tokens = static_cast<int32_t>(max_new);
  SLUICE_ASSIGN_OR_RETURN(double temperature, flags.GetDouble("temperature", 0.0, 100.0));
  sampling.temperature = static_cast<float>(temperature);
  SLUICE_ASSIGN_OR_RETURN(int64_t top_k, flags.GetInt("top-k", 0, 1 << 30));
  sampling.top_k = static_cast<int32_t>(top_k);
  SLUICE_ASSIGN_OR_RETURN(double top_p, flags.GetDouble("top-p", 1e-6, 1.0));
  sampling.top_p = static_cast<float>(top_p);
  SLUICE_ASSIGN_OR_RETURN(int64_t seed, flags.GetInt("seed", 0, INT64_MAX));
  SLUICE_ASSIGN_OR_RETURN(int64_t samples, flags.GetInt("num-samples", 1, 1 << 20));
  SLUICE_ASSIGN_OR_RETURN(std::string prompt, flags.GetString("prompt"));
  std::vector<std::string> prompts = {prompt};
  if (prompt.empty()) prompts = {"12+7=", "Sort 3 1 2:", "The quick brown fox", "(4*5)-3="};

  uint64_t id = 0;
  for (const std::string& p : prompts) {
    std::vector<model::TokenId> ids;
    if (tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
    SLUICE_ASSIGN_OR_RETURN(const std::vector<model::TokenId> text_ids, tokenizer.Encode(p));
    ids.insert(ids.end(), text_ids.begin(), text_ids.end());
    for (int64_t s = 0; s < samples; ++s, ++id) {
      rollout::GenerationRequest r{id, ids, sampling};
      r.sampling.seed = static_cast<uint64_t>(seed) + id;
      SLUICE_RETURN_IF_ERROR(engine->Submit(std::move(r)));
    }
  }
  auto start = std::chrono::steady_clock::now();
  SLUICE_ASSIGN_OR_RETURN(auto results, engine->RunUntilIdle());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  for (const auto& r : results) {
    const std::string prompt_text = ShownText(tokenizer, r.prompt);
    const std::string text = ShownText(tokenizer, r.tokens);
    double mean_logprob = 0;
    for (float lp : r.logprobs) mean_logprob += lp;
    mean_logprob /= std::max<size_t>(1, r.logprobs.size());
    std::printf("[%3llu] %-22s -> %-50s (%zu tokens, %s, mean logprob %.2f)\n", static_cast<unsigned long long>(r.id),
                Printable(prompt_text).c_str(), Printable(text).c_str(), r.tokens.size(),
                rollout::FinishReasonName(r.finish), mean_logprob);
  }
  const auto& st = engine->stats();
  std::printf("\n%s model, %.2fM parameters, device %s, %d slots (%s batching)\n",
              model_dir.empty() ? "fresh" : model_dir.c_str(), m->config().NumParameters() / 1e6, device.str().c_str(),
              options.num_slots, scheduling.c_str());
  std::printf("%zu sequences, %lld tokens in %.2f s: %.0f tokens/s, %lld steps, slot occupancy %.0f%%\n",
              results.size(), static_cast<long long>(st.generated_tokens), secs, st.generated_tokens / secs,
              static_cast<long long>(st.steps), 100.0 * st.occupancy(options.num_slots));
  return Status::Ok();
}

}  // namespace

void SetIntraOpThreads(int64_t threads) {
  torch::set_num_threads(threads > 0 ? static_cast<int>(threads)
                                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

int RunCommand(Status (*command)(const std::vector<std::string>&), const std::vector<std::string>& args) {
  try {
    Status s = command(args);
    return s.ok() ? 0 : Fail(s);
  } catch (const c10::Error& e) {
    return Fail(Status::Internal(std::string("libtorch: ") + e.what_without_backtrace()));
  }
}

int RunInitCommand(const std::vector<std::string>& args) { return RunCommand(Init, args); }
int RunGenerateCommand(const std::vector<std::string>& args) { return RunCommand(Generate, args); }

}  // namespace sluice::launch
