// `specula run`: generate from a prompt (rendered with the model's chat format) or from token ids,
// streaming the answer, with or without a speculative drafter.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/core/generator.hpp"
#include "specula/core/json_schema_grammar.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace {

namespace cli = specula::cli;
using ordered_json = nlohmann::ordered_json;

// The `k` highest entries of log_softmax(logits) (natural log, computed in double), highest first,
// ties by lower id: [[id, logprob], ...].
ordered_json top_log_probs(const std::vector<float>& logits, size_t k) {
  ordered_json out = ordered_json::array();
  if (logits.empty()) return out;
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  k = std::min(k, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
  for (size_t i = 0; i < k; ++i) out.push_back({order[i], static_cast<double>(logits[order[i]]) - lse});
  return out;
}

// One --trace-json line: docs/cli.md, "Traces".
ordered_json round_json(const specula::core::RoundTrace& r) {
  ordered_json steps = ordered_json::array();
  for (size_t i = 0; i < r.draft.size(); ++i)
    steps.push_back({{"token", r.draft[i]},
                     {"top", top_log_probs(i < r.draft_logits.size() ? r.draft_logits[i] : std::vector<float>{}, 20)}});
  return {{"round", r.round}, {"n_past", r.n_past},         {"id_last", r.last_token}, {"draft", r.draft},
          {"ids", r.target_greedy}, {"n_accepted", r.accepted}, {"steps", steps}};
}

int run_run(const std::vector<std::string>& args) {
  cli::ModelArgs model;
  std::string prompt, tokens_text, prompt_file, schema_file, grammar_file, regex;
  int logprobs = -1;
  bool json_object = false;
  bool as_json = false, show_thoughts = false, raw = false, no_drafter = false, speedup = false, trace_json = false;
  cli::po::options_description desc(
      "usage: specula run PIPELINE.yaml (-p TEXT | -f FILE | --tokens 1,2,3) [options]\n"
      "       specula run MODEL.gguf|MODEL_DIR (-p TEXT | -f FILE | --tokens 1,2,3) [options]\n"
      "       specula run -m PATH [-b NAME] (-p TEXT | -f FILE | --tokens 1,2,3) [options]\n\n"
      "Generates a reply and streams it to stdout; statistics go to stderr (or into --json).\n"
      "--prompt is rendered as a user message with the model's chat format (system message from the\n"
      "pipeline's chat section) and tokenized with special tokens parsed; --tokens are used as is.\n"
      "Ctrl+C stops generation (the text so far and the statistics are still printed); a second exits.\n\noptions");
  desc.add_options()("help,h", "show this help")("prompt,p", cli::po::value(&prompt), "the user message")(
      "file,f", cli::po::value(&prompt_file), "read the user message from a file")(
      "system,s", cli::po::value<std::string>(), "system message (overrides the pipeline's chat.system)")(
      "tokens", cli::po::value(&tokens_text), "prompt token ids, comma-separated")(
      "raw", cli::po::bool_switch(&raw), "tokenize --prompt as is, without the chat format")(
      "json", cli::po::bool_switch(&as_json), "print one JSON object (tokens, text, statistics) at the end")(
      "logprobs", cli::po::value(&logprobs),
      "with --json: each token's log-probability (log_softmax of the target's raw logits) and the N most likely "
      "tokens there, 0..20 (the host samples and verifies; drafting stays on)")(
      "trace-json", cli::po::bool_switch(&trace_json),
      "print one JSON line per speculative round (draft, the target's tokens, acceptance, the drafter's top-20 "
      "log-probabilities per step), then a summary line, instead of the text (docs/cli.md)")(
      "show-thoughts", cli::po::bool_switch(&show_thoughts), "also print the model's thought channel")(
      "json-object", cli::po::bool_switch(&json_object), "the answer is one JSON object (response_format json_object)")(
      "json-schema", cli::po::value(&schema_file), "the answer is JSON valid against the schema in this file")(
      "regex", cli::po::value(&regex), "the answer is text this regular expression matches whole")(
      "grammar", cli::po::value(&grammar_file), "the answer is a sentence of the GBNF grammar in this file ('root' rule)")(
      "no-drafter", cli::po::bool_switch(&no_drafter), "ignore the pipeline's drafter (plain decoding)")(
      "speedup", cli::po::bool_switch(&speedup),
      "then generate again without the drafter (same prompt and sampler, output not shown) and end with one "
      "line: acceptance rate and speed-up of the drafter");
  cli::po::variables_map vm;
  if (!cli::parse_model_command(args, desc, model, vm)) return 0;
  if (!prompt_file.empty()) {
    if (!prompt.empty()) specula::fail("give either --prompt TEXT or --file FILE, not both");
    prompt = cli::read_text_file(prompt_file, "--file");
  }
  if (prompt.empty() == tokens_text.empty()) specula::fail("give exactly one of --prompt TEXT and --tokens IDS (--file FILE reads the prompt from a file)");

  if (logprobs != -1 && !as_json) specula::fail("--logprobs N is reported in --json's object; add --json");
  if (logprobs != -1 && (logprobs < 0 || logprobs > 20)) specula::fail("--logprobs must be 0..20, got {}", logprobs);
  if (speedup && no_drafter) specula::fail("--speedup measures the drafter; it cannot be combined with --no-drafter");
  if (trace_json && (no_drafter || as_json || speedup))
    specula::fail("--trace-json prints the drafter's rounds and a summary instead of the text; it cannot be combined "
                  "with {}", no_drafter ? "--no-drafter" : as_json ? "--json" : "--speedup");
  cli::Session s = cli::open_session(model, !no_drafter);
  if (trace_json && !s.built.drafter)
    specula::fail("--trace-json traces speculative rounds, and this pipeline has no drafter (add a drafter: section "
                  "or --drafter FILE)");
  if (speedup && !s.built.drafter)
    specula::fail("--speedup compares the pipeline with and without its drafter, and this pipeline has no drafter "
                  "(add a drafter: section or --drafter FILE)");
  auto& target = s.built.target;
  std::vector<int32_t> ids;
  if (!tokens_text.empty()) {
    ids = cli::parse_token_list(tokens_text);
    const int64_t vocab = target->info().vocab_size;
    for (int32_t id : ids) {
      if (id >= vocab) specula::fail("--tokens: id {} is outside the vocabulary of {} tokens", id, vocab);
    }
  } else {
    auto tokenizer = target->tokenizer();
    if (!tokenizer) specula::fail("the model has no tokenizer; use --tokens");
    std::string text = prompt;
    auto chat = target->chat_format();
    if (!raw && !chat) specula::log_warn("the model has no chat format; the prompt is tokenized as plain text");
    if (!raw && chat) {
      std::vector<specula::ChatMessage> messages;
      if (!s.pipeline.chat.system.empty()) messages.push_back({"system", s.pipeline.chat.system});
      messages.push_back({"user", prompt});
      text = chat->render(messages, true, s.pipeline.chat.enable_thinking);
    }
    ids = tokenizer->encode(text, false, true);
    specula::log_debug("prompt: {} tokens", ids.size());
  }

  specula::core::GenerationOptions options;
  options.max_tokens = s.pipeline.sampler.max_tokens;
  options.show_thoughts = show_thoughts || s.pipeline.chat.show_thoughts;
  specula::core::apply_drafting(s.pipeline, options);
  options.stop_strings = s.pipeline.sampler.stop;
  options.interrupt = cli::interrupt_flag();
  options.logprobs = logprobs;
  if (json_object + !schema_file.empty() + !regex.empty() + !grammar_file.empty() > 1)
    specula::fail("give at most one of --json-object, --json-schema, --regex and --grammar");
  if (json_object) options.response_format = "json_object";
  if (!schema_file.empty()) {
    options.response_format = "json_schema";
    options.grammar = specula::json_schema_to_gbnf(cli::read_text_file(schema_file, "--json-schema"));
  }
  if (!regex.empty()) options.response_format = "regex", options.grammar = specula::regex_to_gbnf(regex);
  if (!grammar_file.empty()) options.response_format = "grammar", options.grammar = cli::read_text_file(grammar_file, "--grammar");
  if (trace_json) options.on_round = [](const specula::core::RoundTrace& r) { fmt::print("{}\n", round_json(r).dump()); };
  cli::install_interrupt_handler();
  specula::core::Generator generator(target, s.built.sampler, s.built.drafter);
  specula::core::Generator baseline(target, s.built.sampler, nullptr);
  if (speedup) {
    // Both ways once, briefly and unshown, before either is timed: the first steps of a process page the
    // weights in and build each graph shape, which would otherwise count against whichever runs first.
    auto warm = options;
    warm.max_tokens = std::min(options.max_tokens, 16);
    generator.generate(ids, warm, {}, s.pipeline.target.context_length);
    baseline.generate(ids, warm, {}, s.pipeline.target.context_length);
  }
  auto result = generator.generate(
      ids, options,
      [&](int32_t, std::string_view text) {
        if (as_json || trace_json || text.empty()) return;
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      },
      s.pipeline.target.context_length);

  // The same generation without the drafter, for the speed-up (decode rates; the prompt's prefill is
  // the same work in both). Both ways alternate, kSpeedupRuns each counting the shown one (A B A B ...),
  // and their medians make the ratio: one pair of 0.1 s runs on a shared machine measures its neighbours
  // as much as the drafter.
  constexpr int kSpeedupRuns = 5;
  std::optional<specula::core::GenerationResult> plain;
  double with_rate = result.stats.decode_tokens_per_second(), without_rate = 0;
  if (speedup && result.stop_reason != specula::core::StopReason::Interrupted) {
    std::vector<double> with{with_rate}, without;
    for (int k = 0; k < kSpeedupRuns; ++k) {
      plain = baseline.generate(ids, options, {}, s.pipeline.target.context_length);
      without.push_back(plain->stats.decode_tokens_per_second());
      if (k + 1 < kSpeedupRuns)
        with.push_back(generator.generate(ids, options, {}, s.pipeline.target.context_length).stats.decode_tokens_per_second());
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    with_rate = median(with);
    without_rate = median(without);
  }
  const double speedup_ratio = without_rate > 0 ? with_rate / without_rate : 0;

  const auto& st = result.stats;
  const nlohmann::json by_position = {{"accepted_by_position", st.accepted_by_position},
                                      {"drafted_by_position", st.drafted_by_position},
                                      {"mean_accepted_length", st.mean_accepted_length()},
                                      {"tokens_per_step", st.tokens_per_step()}};
  if (trace_json) {
    // Every token the rounds produced, the end token that stopped them included (as llama.cpp counts).
    std::vector<int32_t> generated = result.tokens;
    if (result.stop_token >= 0) generated.push_back(result.stop_token);
    ordered_json summary = {{"n_predict", generated.size()},
                            {"n_drafted", st.drafted_tokens},
                            {"n_accept", st.accepted_tokens},
                            {"generated", generated},
                            {"prompt", ids},
                            {"max_tokens", options.max_tokens},
                            {"draft_tokens", options.draft_auto ? ordered_json("auto") : ordered_json(options.draft_tokens)},
                            {"rounds", st.speculative_steps},
                            {"accepted_by_position", st.accepted_by_position},
                            {"mean_accepted_length", st.mean_accepted_length()},
                            {"stop_reason", std::string(specula::core::stop_reason_name(result.stop_reason))}};
    fmt::print("{}\n", ordered_json{{"summary", summary}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  if (as_json) {
    nlohmann::json j;
    j["prompt_tokens"] = ids;
    j["tokens"] = result.tokens;
    j["text"] = result.text;
    j["stop_reason"] = std::string(specula::core::stop_reason_name(result.stop_reason));
    j["stop_token"] = result.stop_token;
    j["seed"] = s.pipeline.sampler.params.seed;
    j["stats"] = {{"prompt_tokens", st.prompt_tokens},
                  {"generated_tokens", st.generated_tokens},
                  {"prefill_seconds", st.prefill_seconds},
                  {"decode_seconds", st.decode_seconds},
                  {"prefill_tokens_per_second", st.prefill_tokens_per_second()},
                  {"decode_tokens_per_second", st.decode_tokens_per_second()},
                  {"speculative_steps", st.speculative_steps},
                  {"drafted_tokens", st.drafted_tokens},
                  {"accepted_tokens", st.accepted_tokens},
                  {"acceptance_rate", st.acceptance_rate()},
                  {"draft_seconds", st.draft_seconds},
                  {"sampling", st.sampling_path()},
                  {"device_sampled_tokens", st.device_sampled_tokens},
                  {"host_sampled_tokens", st.host_sampled_tokens},
                  {"device_verified_steps", st.device_verified_steps}};
    if (!st.host_sampling_reason.empty()) j["stats"]["host_sampling_reason"] = st.host_sampling_reason;
    if (logprobs >= 0) {
      // Per token: its id, text (the token's bytes, invalid UTF-8 replaced) and log-probability, and the
      // most likely alternatives there (docs/cli.md).
      const auto tok = target->tokenizer();
      auto text_of = [&](int32_t id) { return tok ? tok->token_bytes(id) : std::string(); };
      nlohmann::json lps = nlohmann::json::array();
      for (const auto& lp : result.logprobs) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& [id, v] : lp.top) top.push_back({{"token", id}, {"text", text_of(id)}, {"logprob", v}});
        lps.push_back({{"token", lp.token}, {"text", text_of(lp.token)}, {"logprob", lp.logprob}, {"top_logprobs", top}});
      }
      j["logprobs"] = std::move(lps);
    }
    j["stats"].update(by_position);
    if (plain) {
      j["baseline"] = {{"tokens", plain->tokens},
                       {"generated_tokens", plain->stats.generated_tokens},
                       {"decode_seconds", plain->stats.decode_seconds},
                       {"decode_tokens_per_second", without_rate}};
      j["speedup"] = speedup_ratio;
      j["speedup_runs"] = {{"runs_each", kSpeedupRuns}, {"decode_tokens_per_second", with_rate}};
    }
    // error_handler replace: generated bytes need not be valid UTF-8 when a model misbehaves.
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  fmt::print("\n");
  std::fflush(stdout);  // the answer line ends before the statistics on stderr
  specula::log_info("prefill: {} tokens in {:.3f} s ({:.1f} tok/s); decode: {} tokens in {:.3f} s ({:.1f} tok/s); "
                    "stop: {}", st.prompt_tokens, st.prefill_seconds, st.prefill_tokens_per_second(),
                    st.generated_tokens, st.decode_seconds, st.decode_tokens_per_second(),
                    specula::core::stop_reason_name(result.stop_reason));
  if (st.speculative_steps) {
    specula::log_info("speculative: {} steps, {} drafted, {} accepted ({:.1f}%; by draft position {}), {:.2f} "
                      "tokens per target forward", st.speculative_steps, st.drafted_tokens, st.accepted_tokens,
                      100 * st.acceptance_rate(), fmt::join(st.accepted_by_position, "/"), st.tokens_per_step());
  }
  if (plain) {
    // One line whatever the log level: what `make run` ends with.
    fmt::print(stderr, "{} tokens at {:.1f} tok/s with the drafter, {:.1f} tok/s without: acceptance rate {:.1f} %, "
                       "{:.2f} tokens per target step, speed-up {:.2f}x\n",
               st.generated_tokens, with_rate, without_rate,
               100 * st.acceptance_rate(), st.tokens_per_step(), speedup_ratio);
  }
  return 0;
}

}  // namespace

SPECULA_COMMAND("run", "generate from a prompt or token ids (pipeline YAML or --model)", run_run);
