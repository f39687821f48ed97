// Single-thread encode throughput of a tokenizer.json on a corpus (one JSON
// string per line), next to the reference implementation's in the same run
// when a command for it is given (the Hugging Face tokenizers library's
// Rust core through its Node build: scripts/tokenizer_fixtures/bench_reference.mjs).
//
//   tokenizer_bench --model=DIR --corpus=FILE [--rounds=5]
//                   [--reference="node scripts/tokenizer_fixtures/bench_reference.mjs"]
//
// Each figure is the best of --rounds passes over the whole corpus (bytes of
// UTF-8 text per second); both sides encode the same texts with no special
// tokens added, and the ids are compared.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sluice/model/hf_tokenizer.h"
#include "sluice/runtime/flags.h"

namespace {

using nlohmann::json;
using sluice::Status;

Status Run(const std::vector<std::string>& args) {
  sluice::runtime::FlagSet flags;
  flags.Add("model", "", "directory with tokenizer.json");
  flags.Add("corpus", "", "JSONL file, one JSON string per line");
  flags.Add("rounds", "5", "passes over the corpus; the best is reported");
  flags.Add("reference", "", "command that prints the reference's MB/s for MODEL CORPUS ROUNDS (empty: none)");
  SLUICE_RETURN_IF_ERROR(flags.Parse(args));
  if (flags.help_requested()) {
    std::printf("usage: tokenizer_bench [flags]\n%s", flags.Usage().c_str());
    return Status::Ok();
  }
  SLUICE_RETURN_IF_ERROR(flags.RejectPositional());
  SLUICE_ASSIGN_OR_RETURN(std::string model, flags.GetString("model"));
  SLUICE_ASSIGN_OR_RETURN(std::string corpus_path, flags.GetString("corpus"));
  SLUICE_ASSIGN_OR_RETURN(int64_t rounds, flags.GetInt("rounds", 1, 1000));
  SLUICE_ASSIGN_OR_RETURN(std::string reference, flags.GetString("reference"));
  if (model.empty() || corpus_path.empty()) return Status::InvalidArgument("--model and --corpus are required");
  std::ifstream in(corpus_path);
  if (!in) return Status::NotFound(corpus_path + ": cannot open");
  std::vector<std::string> texts;
  size_t bytes = 0;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (!j.is_string()) return Status::InvalidArgument(corpus_path + ":" + std::to_string(n) + ": not a JSON string");
    texts.push_back(j.get<std::string>());
    bytes += texts.back().size();
  }
  const auto load_start = std::chrono::steady_clock::now();
  SLUICE_ASSIGN_OR_RETURN(auto tokenizer, sluice::model::HfTokenizer::Load(model));
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  double best = 1e300;
  size_t tokens = 0;
  for (int64_t r = 0; r < rounds; ++r) {
    tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const std::string& t : texts) tokens += tokenizer->Encode(t)->size();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double ours = static_cast<double>(bytes) / best / 1e6;
  std::printf("corpus: %zu texts, %.2f MB, %zu tokens; one thread, best of %lld passes\n", texts.size(), bytes / 1e6,
              tokens, static_cast<long long>(rounds));
  std::printf("sluice HfTokenizer:   %8.2f MB/s  (load %.2f s)\n", ours, load_s);
  if (reference.empty()) {
    std::printf("reference: not run (--reference)\n");
    return Status::Ok();
  }
  const std::string command = reference + " '" + model + "' '" + corpus_path + "' " + std::to_string(rounds);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) return Status::Unavailable("cannot run the reference: " + command);
  char buf[256];
  double theirs = 0;
  while (std::fgets(buf, sizeof(buf), pipe.get()) != nullptr) {
    if (std::sscanf(buf, "MB/s %lf", &theirs) == 1) break;
  }
  if (theirs <= 0) return Status::Unavailable("the reference printed no 'MB/s N' line: " + command);
  std::printf("reference (%s): %8.2f MB/s\nratio sluice / reference: %.2fx\n", reference.c_str(), theirs,
              ours / theirs);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Status s = Run(std::vector<std::string>(argv + 1, argv + argc));
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return s.code() == sluice::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
