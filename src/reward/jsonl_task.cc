#include "jsonl_task.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace sluice::reward::internal {
namespace {

using nlohmann::json;

// Reads `key` of `object` into *out. Absent (or null) optional fields leave
// *out untouched; every other problem is an error naming `where`.
Status ReadStringField(const json& object, const char* key, bool required, const std::string& where, std::string* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    return required ? Status::InvalidArgument(where + "missing \"" + key + "\"") : Status::Ok();
  }
  if (!it->is_string()) {
    return Status::InvalidArgument(where + "\"" + key + "\" must be a string, got " + std::string(it->type_name()) +
                                   " " + it->dump());
  }
  *out = it->get<std::string>();
  return Status::Ok();
}

// The math task's layouts: GSM8K ({"question", "answer": "... #### 72"}) and
// MATH ({"problem", "solution": "... \\boxed{72} ..."}), besides
// {"prompt", "answer"[, "solution"]}; the instruction follows the prompt.
Result<Example> ParseMathExample(const json& object, const std::string& where, const JsonlOptions& options) {
  Example example;
  if (object.contains("question")) {
    SLUICE_RETURN_IF_ERROR(ReadStringField(object, "question", true, where, &example.prompt));
    std::string worked;
    SLUICE_RETURN_IF_ERROR(ReadStringField(object, "answer", true, where, &worked));
    const size_t hashes = worked.rfind("####");
    if (hashes == std::string::npos) {
      return Status::InvalidArgument(where + "GSM8K \"answer\" has no '#### <final answer>'");
    }
    example.answer = ExtractMathAnswer(worked.substr(hashes));
    example.solution = worked;
  } else if (object.contains("problem")) {
    SLUICE_RETURN_IF_ERROR(ReadStringField(object, "problem", true, where, &example.prompt));
    SLUICE_RETURN_IF_ERROR(ReadStringField(object, "solution", true, where, &example.solution));
    if (example.solution.find("\\boxed{") == std::string::npos) {
      return Status::InvalidArgument(where + "MATH \"solution\" has no \\boxed{<final answer>}");
    }
    example.answer = ExtractMathAnswer(example.solution);
  } else {
    SLUICE_RETURN_IF_ERROR(ReadStringField(object, "prompt", true, where, &example.prompt));
    SLUICE_RETURN_IF_ERROR(ReadStringField(object, "answer", true, where, &example.answer));
    SLUICE_RETURN_IF_ERROR(ReadStringField(object, "solution", false, where, &example.solution));
  }
  if (example.prompt.empty()) return Status::InvalidArgument(where + "the question is empty");
  if (NormalizeMathAnswer(example.answer).empty()) return Status::InvalidArgument(where + "the final answer is empty");
  if (!example.solution.empty() && !MathAnswersMatch(ExtractMathAnswer(example.solution), example.answer)) {
    return Status::InvalidArgument(where + "the solution's final answer '" + ExtractMathAnswer(example.solution) +
                                   "' is not the answer '" + example.answer + "'");
  }
  if (!options.instruction.empty()) example.prompt += "\n" + options.instruction;
  return example;
}

Result<Example> ParseExample(const std::string& line, const std::string& where, const JsonlOptions& options) {
  json object;
  try {
    object = json::parse(line);
  } catch (const json::parse_error& e) {
    return Status::InvalidArgument(where + "malformed JSON near byte " + std::to_string(e.byte));
  }
  if (!object.is_object()) {
    return Status::InvalidArgument(where + "expected a JSON object, got " + std::string(object.type_name()));
  }
  if (options.math) return ParseMathExample(object, where, options);
  Example example;
  SLUICE_RETURN_IF_ERROR(ReadStringField(object, "prompt", true, where, &example.prompt));
  SLUICE_RETURN_IF_ERROR(ReadStringField(object, "answer", true, where, &example.answer));
  SLUICE_RETURN_IF_ERROR(ReadStringField(object, "solution", false, where, &example.solution));
  if (example.prompt.empty()) return Status::InvalidArgument(where + "\"prompt\" is empty");
  const std::string answer = NormalizeAnswer(example.answer);
  if (answer.empty()) return Status::InvalidArgument(where + "\"answer\" is empty");
  // The reward reads the text after the last marker, so an answer holding one
  // could never be matched.
  if (answer.find(kAnswerMarker) != std::string::npos) {
    return Status::InvalidArgument(where + "\"answer\" contains '" + kAnswerMarker +
                                   "', the final-answer marker; it could never be matched");
  }
  if (!example.solution.empty() && NormalizeAnswer(ExtractFinalAnswer(example.solution)) != answer) {
    return Status::InvalidArgument(where + "\"solution\" ends in the answer '" + ExtractFinalAnswer(example.solution) +
                                   "', not '" + example.answer + "'");
  }
  return example;
}

Result<std::vector<Example>> ReadJsonl(const std::string& path, const JsonlOptions& options) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::NotFound("jsonl task: " + path + " does not exist");
  if (std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument("jsonl task: " + path + " is a directory, not a JSONL file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Unavailable("jsonl task: cannot open " + path);
  std::vector<Example> examples;
  std::string line;
  for (size_t line_number = 1; std::getline(in, line); ++line_number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    SLUICE_ASSIGN_OR_RETURN(Example example,
                            ParseExample(line, path + ":" + std::to_string(line_number) + ": ", options));
    example.source = path + ":" + std::to_string(line_number);
    examples.push_back(std::move(example));
  }
  if (in.bad()) return Status::Unavailable("jsonl task: error reading " + path);
  if (examples.empty()) return Status::InvalidArgument("jsonl task: " + path + " holds no examples");
  return examples;
}

class JsonlTask final : public Task {
 public:
  JsonlTask(std::vector<Example> train, std::vector<Example> eval, bool math)
      : train_(std::move(train)), eval_(std::move(eval)), math_(math) {
    for (size_t i = 0; i < train_.size(); ++i) {
      train_[i].index = i;
      train_[i].split = Split::kTrain;
    }
    for (size_t i = 0; i < eval_.size(); ++i) {
      eval_[i].index = i;
      eval_[i].split = Split::kEval;
    }
    has_solutions_ = std::any_of(train_.begin(), train_.end(), [](const Example& e) { return !e.solution.empty(); });
  }

  std::string name() const override { return math_ ? "math" : "jsonl"; }

  uint64_t size(Split split) const override { return examples(split).size(); }

  bool has_solutions() const override { return has_solutions_; }

  Result<Example> Get(Split split, uint64_t index) const override {
    const std::vector<Example>& all = examples(split);
    if (index >= all.size()) {
      return Status::OutOfRange("jsonl task: " + std::string(SplitName(split)) + " index " + std::to_string(index) +
                                " is past the split's " + std::to_string(all.size()) + " examples");
    }
    return all[index];
  }

  double Score(const Example& example, std::string_view response) const override {
    if (math_) return MathAnswersMatch(ExtractMathAnswer(response), example.answer) ? 1.0 : 0.0;
    return NormalizeAnswer(ExtractFinalAnswer(response)) == NormalizeAnswer(example.answer) ? 1.0 : 0.0;
  }

 private:
  const std::vector<Example>& examples(Split split) const { return split == Split::kTrain ? train_ : eval_; }

  std::vector<Example> train_;
  std::vector<Example> eval_;
  bool has_solutions_ = false;
  bool math_ = false;
};

}  // namespace

Result<std::unique_ptr<Task>> MakeJsonlTask(const JsonlOptions& options) {
  if (options.train_path.empty()) return Status::InvalidArgument("task option 'jsonl.train_path' is required");
  SLUICE_ASSIGN_OR_RETURN(std::vector<Example> train, ReadJsonl(options.train_path, options));
  std::vector<Example> eval;
  if (!options.eval_path.empty()) {
    SLUICE_ASSIGN_OR_RETURN(eval, ReadJsonl(options.eval_path, options));
  } else {
    if (!(options.eval_fraction > 0 && options.eval_fraction < 1)) {
      return Status::InvalidArgument("task option 'jsonl.eval_fraction' must be in (0, 1), got " +
                                     std::to_string(options.eval_fraction));
    }
    if (train.size() < 2) {
      return Status::InvalidArgument("jsonl task: " + options.train_path +
                                     " holds 1 example; holding out an eval split needs at least 2 (or set "
                                     "jsonl.eval_path)");
    }
    const size_t held_out =
        std::max<size_t>(1, static_cast<size_t>(static_cast<double>(train.size()) * options.eval_fraction));
    eval.assign(std::make_move_iterator(train.end() - held_out), std::make_move_iterator(train.end()));
    train.resize(train.size() - held_out);
  }

  // Held-out prompts never reach training, even when the file repeats them.
  std::unordered_set<std::string> eval_prompts;
  for (const Example& e : eval) eval_prompts.insert(e.prompt);
  std::erase_if(train, [&](const Example& e) { return eval_prompts.count(e.prompt) != 0; });
  if (train.empty()) {
    return Status::InvalidArgument("jsonl task: every train example of " + options.train_path +
                                   " has a prompt that is in the eval split; nothing is left to train on");
  }
  return std::unique_ptr<Task>(new JsonlTask(std::move(train), std::move(eval), options.math));
}

}  // namespace sluice::reward::internal
