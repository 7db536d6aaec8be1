// `specula eval`: the parity contract. Feeds a token sequence through the target model in one prefill and
// prints, for every input position, the N most likely next tokens with their log-probabilities
// (log-softmax of the softcapped logits). Tests and external checks compare these with llama.cpp.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/error.hpp"
#include "specula/hub.hpp"

namespace {

namespace cli = specula::cli;
namespace po = boost::program_options;

// Top-n (id, log-probability) of one row of logits; ties go to the lower id.
std::vector<std::pair<int32_t, double>> top_log_probs(std::span<const float> logits, int n) {
  double max = -INFINITY;
  for (float v : logits) max = std::max(max, static_cast<double>(v));
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  const double lse = max + std::log(sum);
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t k = std::min<size_t>(static_cast<size_t>(n), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  std::vector<std::pair<int32_t, double>> out;
  for (size_t i = 0; i < k; ++i) out.emplace_back(ids[i], static_cast<double>(logits[ids[i]]) - lse);
  return out;
}

int run_eval(const std::vector<std::string>& args) {
  cli::ModelArgs model;
  std::string tokens_text;
  int top = 20;
  po::options_description desc(
      "specula eval --model PATH [--backend NAME] --tokens 2,818,... [--top 20] [--json]\n"
      "Prints the top next-token log-probabilities at every input position");
  desc.add_options()("help,h", "show this help")(
      "tokens", po::value(&tokens_text)->required(), "token ids, comma- or space-separated")(
      "top", po::value(&top)->default_value(20), "how many tokens per position")(
      "json", "one JSON line per position: {\"pos\": i, \"top\": [[id, logprob], ...]}");
  po::variables_map vm;
  if (!cli::parse_model_command(args, desc, model, vm, false)) return 0;
  if (top < 1) specula::fail("--top {}: expected a positive number", top);
  const std::vector<int32_t> tokens = cli::parse_token_list(tokens_text);
  if (tokens.empty()) specula::fail("--tokens: no token ids given");

  // Only the backend and the target: eval needs no sampler or drafter.
  const specula::core::Pipeline p = cli::resolve_pipeline(model);
  auto host = cli::make_host(p, model.plugin_paths);
  auto backend = specula::core::make_backend(p, *host);
  auto file = specula::core::open_target(p, *host, specula::core::hub::model_locator());
  auto loader = specula::core::target_loader(p, *host, *file);
  specula::core::check_target(p, *loader, *file, *backend);
  auto target = loader->load(file, backend, p.target.options);
  specula::ContextOptions copt;
  copt.context_length = p.target.context_length > 0 ? p.target.context_length : static_cast<int64_t>(tokens.size());
  auto ctx = target->new_context(copt);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const std::vector<float> logits = ctx->forward(tokens, n);
  const int64_t vocab = target->info().vocab_size;
  if (static_cast<int64_t>(logits.size()) != n * vocab)
    specula::fail("eval: the model returned {} logits for {} positions of vocabulary {}", logits.size(), n, vocab);
  const bool json = vm.count("json") > 0;
  for (int64_t i = 0; i < n; ++i) {
    auto best = top_log_probs(std::span<const float>(logits).subspan(i * vocab, vocab), top);
    std::string line;
    if (json) {
      line = fmt::format("{{\"pos\": {}, \"top\": [", i);
      for (size_t j = 0; j < best.size(); ++j)
        line += fmt::format("{}[{}, {:.7f}]", j ? ", " : "", best[j].first, best[j].second);
      line += "]}";
    } else {
      line = fmt::format("pos {:>4} (token {:>6}):", i, tokens[i]);
      for (const auto& [id, lp] : best) line += fmt::format(" {}:{:.4f}", id, lp);
    }
    fmt::print("{}\n", line);
  }
  return 0;
}

}  // namespace

SPECULA_COMMAND("eval", "print the top next-token log-probabilities at every input position", run_eval);
