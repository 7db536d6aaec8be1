// `specula bench`: prompt-processing and token-generation speed of a target (llama-bench's pp/tg
// measures), plus speculative decoding with the pipeline's drafter, real or replayed at a given acceptance
// (core/include/specula/core/acceptance_replay.hpp). bench/compare_llama.sh runs it next
// to llama.cpp on the same file and prints the ratios.
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/core/acceptance_replay.hpp"
#include "specula/core/generator.hpp"
#include "specula/core/json_schema_grammar.hpp"
#include "specula/error.hpp"
#include "specula/hub.hpp"
#include "specula/log.hpp"
#include "specula/op_profile.hpp"

namespace {

constexpr int kMaxVerify = 9;  // verification batches timed: 2 .. 9 tokens (K = 1 .. 8)

namespace cli = specula::cli;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The fixed pseudo-random prompt of tools/llama-ref/gemma4_goldens.mjs and bench/llama_peer.mjs (BOS,
// then an LCG over ordinary token ids), so every engine processes the same tokens.
std::vector<int32_t> synthetic_prompt(int64_t n, int64_t vocab) {
  std::vector<int32_t> out{2};
  uint64_t x = 12345;
  while (static_cast<int64_t>(out.size()) < n) {
    x = (x * 1103515245 + 12345) % 2147483648;
    out.push_back(static_cast<int32_t>(300 + x % static_cast<uint64_t>(std::min<int64_t>(30000, vocab - 300))));
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

int32_t argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

struct Summary {
  double median = 0, min = 0, max = 0;
};
Summary summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

int run_bench(const std::vector<std::string>& args) {
  cli::ModelArgs model;
  int64_t prompt_tokens = 512, gen_tokens = 128;
  int repetitions = 3, sequences = 1;
  bool as_json = false, no_drafter = false, profile = false, verify = false;
  std::string acceptance_profile, schema_path;
  uint64_t replay_seed = 1;
  cli::po::options_description desc(
      "usage: specula bench PIPELINE.yaml [options]\n"
      "       specula bench --model PATH [--backend NAME] [options]\n\n"
      "Measures, on a fixed synthetic prompt, prompt processing (one forward over -p/--prompt-tokens, as\n"
      "llama-bench's pp) and token generation (-n/--gen-tokens single-token forwards, greedy, as its tg),\n"
      "each --repetitions times on a fresh context; reports the median (min-max). With a drafter in the\n"
      "pipeline it also times greedy speculative generation and its acceptance; with --acceptance-profile\n"
      "it replays that acceptance instead (greedy; every line says \"replay\") against plain decoding through\n"
      "the same engine. The first, untimed run pages the weights in.\n\noptions");
  desc.add_options()("help,h", "show this help")(
      "prompt-tokens,p", cli::po::value(&prompt_tokens)->default_value(prompt_tokens), "prompt length (llama-bench -p)")(
      "gen-tokens,n", cli::po::value(&gen_tokens)->default_value(gen_tokens), "tokens generated (llama-bench -n)")(
      "repetitions,r", cli::po::value(&repetitions)->default_value(repetitions), "timed runs (llama-bench -r)")(
      "sequences,s", cli::po::value(&sequences)->default_value(sequences),
      "decode this many sequences in one batch (Model::forward_batch): tg is then their aggregate rate, pp the "
      "rate of prefilling all of them; no speculative or verification measurement")(
      "json", cli::po::bool_switch(&as_json), "print one JSON object")(
      "no-drafter", cli::po::bool_switch(&no_drafter), "skip the speculative measurement")(
      "verify", cli::po::bool_switch(&verify),
      "time verification forwards of 2..9 tokens against a decode step (always with a drafter: the MTP cost model)")(
      "profile", cli::po::bool_switch(&profile),
      "print time per op kind, weight and layer when the backend ends (CPU backend: host clock; Vulkan: GPU timestamps; includes the untimed run)")(
      "acceptance-profile", cli::po::value(&acceptance_profile),
      "replay this acceptance with the drafter: a1,a2,... (entry i: the fraction of rounds whose first i drafts are "
      "all accepted; 0 rejects every draft). Each round drafts and verifies as always, but its drafts are replaced "
      "first by the target's own greedy tokens or by tokens it rejects (docs/performance.md, \"Acceptance replay\")")(
      "replay-seed", cli::po::value(&replay_seed)->default_value(replay_seed), "seed of the replay's draws")(
      "json-schema", cli::po::value(&schema_path),
      "also generate greedily under this JSON schema (a file; response_format json_schema): the masks' cost per "
      "token against a decode step, and with a drafter the acceptance with the schema (replayed with "
      "--acceptance-profile)");
  cli::po::variables_map vm;
  if (!cli::parse_model_command(args, desc, model, vm, false)) return 0;
  if (prompt_tokens < 1 || gen_tokens < 1 || repetitions < 1 || sequences < 1)
    specula::fail("--prompt-tokens, --gen-tokens, --repetitions and --sequences must be at least 1");
  const bool replaying = !acceptance_profile.empty();
  const std::vector<double> replay_profile =
      replaying ? specula::core::AcceptanceReplay::parse_profile(acceptance_profile) : std::vector<double>{};
  if (replaying && (no_drafter || sequences > 1))
    specula::fail("--acceptance-profile replays the speculative loop of one sequence with a drafter; it does not "
                  "combine with {}", no_drafter ? "--no-drafter" : "--sequences (a plain batched measurement)");
  if (sequences > 1) no_drafter = true, verify = false;
  if (profile) model.overrides.push_back({"backend.options.profile", "true", "command line (--profile)"});

  const auto t_load = Clock::now();
  specula::core::Pipeline pipeline = cli::resolve_pipeline(model);
  auto host = cli::make_host(pipeline, model.plugin_paths);
  specula::core::BuildOptions build;
  build.load_drafter = !no_drafter;
  build.locate = specula::core::hub::model_locator();
  specula::core::BuiltPipeline built = specula::core::build_pipeline(pipeline, *host, build);
  const double load_seconds = seconds_since(t_load);
  auto& target = built.target;
  if (replaying && !built.drafter)
    specula::fail("--acceptance-profile replays the speculative loop: the pipeline has no drafter (give --drafter)");

  const int64_t vocab = target->info().vocab_size;
  const int draft = built.drafter ? (pipeline.drafter ? pipeline.drafter->draft_tokens : 3) : 0;
  const int longest = built.drafter && pipeline.drafter && pipeline.drafter->draft_auto ? pipeline.drafter->draft_max : draft;
  specula::ContextOptions copts;
  // The smallest context that holds the run, or the one asked for (llama-bench allocates n_ctx 4096); a
  // replay's greedy run goes a draft and a token further (llama.cpp's loop may pass -n by that much).
  const int64_t needed = prompt_tokens + std::max<int64_t>(gen_tokens + longest + (replaying ? 2 : 1),
                                                           verify || built.drafter ? kMaxVerify : 0);
  const int64_t asked = pipeline.target.context_length;
  copts.context_length = std::max(needed, asked);
  const int64_t limit = asked > 0 ? asked : target->info().context_length;
  if (limit > 0 && needed > limit)
    specula::fail("--prompt-tokens {} + --gen-tokens {} exceed the {} context of {} tokens{}", prompt_tokens, gen_tokens,
                  asked > 0 ? "--context-length" : "model's", limit, asked > 0 ? "" : " (raise it with --context-length)");
  const std::vector<int32_t> prompt = synthetic_prompt(prompt_tokens, vocab);

  // One plain run: prefill each sequence, then `gen` greedy steps of one token per sequence, all sequences
  // in one forward. Returns {pp seconds, tg seconds}.
  auto plain_run = [&](int64_t gen) {
    std::vector<std::unique_ptr<specula::ModelContext>> ctx;
    std::vector<int32_t> next;
    auto t0 = Clock::now();
    for (int s = 0; s < sequences; ++s) {
      ctx.push_back(target->new_context(copts));
      next.push_back(argmax(ctx.back()->forward(prompt, 1)));
    }
    const double pp = seconds_since(t0);
    t0 = Clock::now();
    for (int64_t i = 0; i < gen; ++i) {
      if (sequences == 1) {
        next[0] = argmax(ctx[0]->forward(std::span<const int32_t>(&next[0], 1), 1));
        continue;
      }
      std::vector<specula::BatchEntry> batch;
      for (int s = 0; s < sequences; ++s) batch.push_back({ctx[s].get(), std::span<const int32_t>(&next[s], 1), 1});
      const auto logits = target->forward_batch(batch);
      for (int s = 0; s < sequences; ++s) next[s] = argmax(logits[s]);
    }
    return std::pair{pp, seconds_since(t0)};
  };

  plain_run(std::min<int64_t>(gen_tokens, 4));  // warm-up: pages the weights in, builds graphs
  std::vector<double> pp, tg;
  for (int r = 0; r < repetitions; ++r) {
    auto [p, t] = plain_run(gen_tokens);
    pp.push_back(static_cast<double>(prompt_tokens) * sequences / p);
    tg.push_back(static_cast<double>(gen_tokens) * sequences / t);
    specula::log_debug("bench run {}: pp {:.2f} tok/s, tg {:.2f} tok/s", r + 1, pp.back(), tg.back());
  }
  const Summary pps = summarize(pp), tgs = summarize(tg);

  // The MTP cost model: what a verification of K + 1 tokens and a draft of K cost against one decode step,
  // and the acceptance rate from which drafting K tokens pays (tokens per round (1 - a^(K+1)) / (1 - a),
  // each accepted independently with probability a).
  nlohmann::json costs = nullptr;
  if (verify || built.drafter) {
    const double step = 1.0 / tgs.median;
    auto ctx = target->new_context(copts);
    std::vector<float> logits = ctx->forward(prompt, 1);
    // The tokens verified: the greedy continuation (what accepted drafts are), so that a mixture of experts
    // routes them as it would real drafts (one token repeated would select fewer distinct experts).
    std::vector<int32_t> tokens{argmax(logits)};
    while (tokens.size() < static_cast<size_t>(kMaxVerify))
      tokens.push_back(argmax(ctx->forward(std::span<const int32_t>(&tokens.back(), 1), 1)));
    ctx->truncate(prompt_tokens);
    const int32_t last = tokens[0];
    costs = nlohmann::json::array();
    for (int k = 1; k + 1 <= kMaxVerify; ++k) {
      // One untimed verification first: a batch size's first forward builds its graph and touches its new
      // buffers (on 26B-A4B, 5 rows: 86 ms against 75-80 after), which a speculative loop pays once. Left
      // in, it made the median of 3 runs that of the slower warm one and left K = 4 above K = 5.
      ctx->forward(std::span<const int32_t>(tokens.data(), static_cast<size_t>(k + 1)), k + 1);
      ctx->truncate(prompt_tokens);
      std::vector<double> tv, td;
      for (int r = 0; r < std::max(repetitions, 3); ++r) {
        auto t0 = Clock::now();
        ctx->forward(std::span<const int32_t>(tokens.data(), static_cast<size_t>(k + 1)), k + 1);
        tv.push_back(seconds_since(t0));
        ctx->truncate(prompt_tokens);
        if (built.drafter) {
          t0 = Clock::now();
          specula::DraftRequest request;
          request.last_token = last;
          request.n = k;
          built.drafter->draft(ctx->view(), request);
          td.push_back(seconds_since(t0));
        }
      }
      const double v = summarize(tv).median, d = td.empty() ? 0.0 : summarize(td).median;
      const double round = (v + d) / step;  // in decode steps
      auto speedup = [&](double a) { return (a >= 1.0 ? k + 1.0 : (1.0 - std::pow(a, k + 1)) / (1.0 - a)) / round; };
      nlohmann::json even = nullptr;  // null: never pays, even with every draft accepted
      if (speedup(1.0) >= 1.0) {
        double lo = 0.0, hi = 1.0;  // speedup grows with a: bisect for speedup = 1
        for (int i = 0; i < 50; ++i) {
          const double mid = (lo + hi) / 2;
          (speedup(mid) < 1.0 ? lo : hi) = mid;
        }
        even = speedup(0.0) >= 1.0 ? 0.0 : hi;
      }
      costs.push_back({{"draft_tokens", k}, {"verify_ms", 1e3 * v}, {"verify_steps", v / step}, {"draft_ms", 1e3 * d},
                       {"round_steps", round}, {"break_even_acceptance", even}});
    }
  }

  nlohmann::json spec = nullptr, replay = nullptr;
  if (built.drafter) {
    // Greedy speculative generation; a model's end token may stop it early, so the rate is per token made.
    specula::SamplingParams greedy_params;  // temperature 0: greedy
    auto greedy = host->make_sampler(pipeline.sampler.plugin, greedy_params, pipeline.sampler.options);
    specula::core::Generator generator(target, greedy, built.drafter), plain(target, greedy);
    specula::core::GenerationOptions o;
    o.max_tokens = static_cast<int>(gen_tokens);
    o.draft_tokens = draft;
    specula::core::apply_drafting(pipeline, o);
    // The replay plants tokens of one plain greedy run (untimed), as long as the replayed run may go.
    std::vector<int32_t> greedy_run;
    if (replaying) {
      specula::core::GenerationOptions go;
      go.max_tokens = static_cast<int>(gen_tokens) + longest + 1;
      const auto r = plain.generate(prompt, go, {}, copts.context_length);
      greedy_run = prompt;
      greedy_run.insert(greedy_run.end(), r.tokens.begin(), r.tokens.end());
      if (r.stop_reason == specula::core::StopReason::EndToken) greedy_run.push_back(r.stop_token);
    }
    std::vector<double> rate, plain_rate;
    specula::core::GenerationStats last;
    for (int r = 0; r < repetitions; ++r) {
      std::optional<specula::core::AcceptanceReplay> replayed;
      if (replaying) {  // plain decoding through the same engine, alternating with the replay
        specula::core::GenerationOptions po;
        po.max_tokens = static_cast<int>(gen_tokens);
        plain_rate.push_back(plain.generate(prompt, po, {}, copts.context_length).stats.decode_tokens_per_second());
        replayed.emplace(replay_profile, greedy_run, replay_seed, built.backend.get());
        o.draft_hook = &*replayed;
      }
      auto result = generator.generate(prompt, o, {}, copts.context_length);
      last = result.stats;
      rate.push_back(last.decode_tokens_per_second());
    }
    const Summary s = summarize(rate);
    // With draft_tokens: auto, the lengths the engine picked (steps by length, 0 = plain steps).
    const int64_t steps = last.speculative_steps;
    spec = {{"draft_tokens", o.draft_auto ? nlohmann::json("auto") : nlohmann::json(draft)},
            {"mean_draft_length", steps ? double(last.drafted_tokens) / steps : 0.0},
            {"steps_by_draft_length", last.steps_by_draft_length},
            {"accepted_by_position", last.accepted_by_position},
            {"drafted_by_position", last.drafted_by_position},
            {"tokens_per_second", s.median},
            {"min", s.min},                   {"max", s.max},
            {"generated_tokens", last.generated_tokens},
            {"acceptance_rate", last.acceptance_rate()}, {"tokens_per_step", last.tokens_per_step()},
            {"mean_accepted_length", last.mean_accepted_length()},
            {"speedup_vs_tg", s.median / tgs.median}};
    if (replaying) {
      // Per round = per target forward of the decode loop (plain steps of draft_tokens: auto included).
      int64_t rounds = 0;
      double expected = 0;
      for (size_t k = 0; k < last.steps_by_draft_length.size(); ++k) {
        rounds += last.steps_by_draft_length[k];
        expected += static_cast<double>(last.steps_by_draft_length[k]) * specula::core::AcceptanceReplay::expected_tokens(replay_profile, static_cast<int>(k));
      }
      std::vector<double> measured;
      for (size_t i = 0; i < last.drafted_by_position.size(); ++i)
        measured.push_back(last.drafted_by_position[i] ? double(last.accepted_by_position[i]) / last.drafted_by_position[i] : 0.0);
      const double plain_median = summarize(plain_rate).median;
      replay = {{"replay_profile", replay_profile},
                {"replay_seed", replay_seed},
                {"replay_speedup", s.median / plain_median},
                {"replay_plain_tokens_per_second", plain_median},
                {"replay_tokens_per_round", rounds ? 1.0 + double(last.accepted_tokens) / rounds : 0.0},
                {"replay_expected_tokens_per_round", rounds ? expected / rounds : 0.0},
                {"replay_mean_draft_tokens", rounds ? double(last.drafted_tokens) / rounds : 0.0},
                {"replay_accepted_fraction_by_position", measured}};
    }
  }

  // --json-schema: what masking costs per row against a decode step (the first run meets every stack for
  // the first time and walks the trie; later ones find the masks kept), and acceptance under the schema.
  nlohmann::json constrained = nullptr;
  if (!schema_path.empty()) {
    std::ifstream in(schema_path);
    if (!in) specula::fail("--json-schema: cannot read '{}'", schema_path);
    std::stringstream text;
    text << in.rdbuf();
    specula::SamplingParams greedy_params;
    auto greedy = host->make_sampler(pipeline.sampler.plugin, greedy_params, pipeline.sampler.options);
    specula::core::Generator plain(target, greedy);
    std::optional<specula::core::Generator> drafting;
    if (built.drafter) drafting.emplace(target, greedy, built.drafter);
    specula::core::GenerationOptions co;
    co.max_tokens = static_cast<int>(gen_tokens);
    co.response_format = "json_schema";
    co.grammar = specula::json_schema_to_gbnf(text.str());
    auto per_row_ms = [](const specula::core::GenerationStats& st) {
      return st.constrained_rows ? 1e3 * st.constraint_seconds / static_cast<double>(st.constrained_rows) : 0.0;
    };
    const auto first = plain.generate(prompt, co, {}, copts.context_length).stats;
    std::vector<double> mask_ms, rate;
    for (int r = 0; r < repetitions; ++r) {
      const auto st = plain.generate(prompt, co, {}, copts.context_length).stats;
      mask_ms.push_back(per_row_ms(st));
      rate.push_back(st.decode_tokens_per_second());
    }
    const double step_ms = 1e3 / tgs.median, mask = summarize(mask_ms).median;
    constrained = {{"schema", schema_path}, {"generated_tokens", first.generated_tokens},
                   {"mask_ms_per_row", mask}, {"mask_ms_per_row_first_run", per_row_ms(first)},
                   {"decode_step_ms", step_ms}, {"mask_fraction_of_step", mask / step_ms},
                   {"tokens_per_second", summarize(rate).median}};
    if (drafting) {
      specula::core::GenerationOptions so = co;
      so.draft_tokens = draft;
      specula::core::apply_drafting(pipeline, so);
      std::vector<int32_t> run;  // the replay's planted tokens come from the constrained greedy run
      if (replaying) {
        const auto r = plain.generate(prompt, co, {}, copts.context_length);
        run = prompt;
        run.insert(run.end(), r.tokens.begin(), r.tokens.end());
        if (r.stop_reason == specula::core::StopReason::EndToken) run.push_back(r.stop_token);
      }
      // Twice: the drafts reach parse stacks the plain runs did not (the first run walks the trie for them).
      specula::core::GenerationStats first_spec, st;
      for (int r = 0; r < 2; ++r) {
        std::optional<specula::core::AcceptanceReplay> replayed;
        if (replaying) {
          replayed.emplace(replay_profile, run, replay_seed, built.backend.get());
          so.draft_hook = &*replayed;
        }
        (r == 0 ? first_spec : st) = drafting->generate(prompt, so, {}, copts.context_length).stats;
      }
      constrained["speculative"] = {{"acceptance_rate", st.acceptance_rate()}, {"tokens_per_step", st.tokens_per_step()},
                                    {"tokens_per_second", st.decode_tokens_per_second()},
                                    {"mask_ms_per_row", per_row_ms(st)}, {"mask_ms_per_row_first_run", per_row_ms(first_spec)},
                                    {"replay", replaying}};
    }
  }

  // --profile on a mixture of experts: per graph kind (1 row: a decode step; K + 1: a verification), the
  // distinct experts its MatMulIds selected, summed over the MoE layers, and the expert bytes they read.
  nlohmann::json experts = nullptr;
  if (const specula::OpProfile* p = built.backend->profile()) {
    for (const auto& r : p->expert_reads()) {
      if (experts.is_null()) experts = nlohmann::json::array();
      experts.push_back({{"rows", r.rows}, {"nodes", r.nodes}, {"runs", r.runs}, {"moe_layers", r.moe_layers},
                         {"distinct_experts", r.experts_per_run}, {"expert_bytes", r.bytes_per_run}});
    }
  }

  const auto& dev = built.backend->device();
  if (as_json) {
    nlohmann::json j = {{"model", pipeline.target.model.string()},
                        {"backend", built.backend->name()},
                        {"device", dev.name},
                        {"threads", pipeline.backend.options.value("threads", 0)},
                        {"prompt_tokens", prompt_tokens},
                        {"gen_tokens", gen_tokens},
                        {"repetitions", repetitions},
                        {"sequences", sequences},
                        {"load_seconds", load_seconds},
                        {"pp_tokens_per_second", pps.median},
                        {"pp_min", pps.min},
                        {"pp_max", pps.max},
                        {"tg_tokens_per_second", tgs.median},
                        {"tg_min", tgs.min},
                        {"tg_max", tgs.max},
                        {"peak_rss_mib", peak_rss_mib()},
                        {"speculative", spec},
                        {"verify_costs", costs}};
    if (!experts.is_null()) j["moe_experts"] = experts;
    if (replaying) j.update(replay);
    if (!constrained.is_null()) j["json_schema"] = constrained;
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  // A replay's lines all say so: its acceptance is planted, not the drafter's.
  const auto say = [&](const std::string& line) { fmt::print("{}{}\n", replaying ? "replay   " : "", line); };
  say(fmt::format("model    {}", pipeline.target.model.string()));
  say(fmt::format("backend  {} ({})", built.backend->name(), dev.name));
  say(fmt::format("load     {:.2f} s, peak RSS {:.0f} MiB", load_seconds, peak_rss_mib()));
  say(fmt::format("pp{:<6} {:8.2f} tok/s  ({:.2f}-{:.2f})", prompt_tokens, pps.median, pps.min, pps.max));
  say(fmt::format("tg{:<6} {:8.2f} tok/s  ({:.2f}-{:.2f}){}", gen_tokens, tgs.median, tgs.min, tgs.max,
                  sequences > 1 ? fmt::format(", {} sequences in one batch (aggregate)", sequences) : ""));
  if (!costs.is_null()) {
    say(fmt::format("{:<8} {:>10} {:>8} {:>10} {:>8} {:>11}", "draft K", "verify ms", "steps", "draft ms", "round", "break-even"));
    for (const auto& c : costs) {
      const auto& a = c["break_even_acceptance"];
      say(fmt::format("{:<8} {:>10.1f} {:>8.2f} {:>10.1f} {:>8.2f} {:>11}", c["draft_tokens"].get<int>(),
                      c["verify_ms"].get<double>(), c["verify_steps"].get<double>(), c["draft_ms"].get<double>(),
                      c["round_steps"].get<double>(), a.is_number() ? fmt::format("{:.0f}%", 100 * a.get<double>()) : "never"));
    }
  }
  if (!experts.is_null()) {
    say(fmt::format("{:<8} {:>6} {:>6} {:>8} {:>14} {:>10}", "experts", "rows", "nodes", "runs", "distinct/run", "MB/run"));
    for (const auto& e : experts)
      say(fmt::format("{:<8} {:>6} {:>6} {:>8} {:>14.1f} {:>10.2f}", "", e["rows"].get<int64_t>(), e["nodes"].get<int64_t>(),
                      e["runs"].get<int64_t>(), e["distinct_experts"].get<double>(), e["expert_bytes"].get<double>() / 1e6));
  }
  if (!constrained.is_null()) {
    say(fmt::format("schema   mask {:.3f} ms/row ({:.2f}% of a {:.1f} ms decode step; first run {:.3f} ms/row), {:.2f} tok/s",
                    constrained["mask_ms_per_row"].get<double>(), 100 * constrained["mask_fraction_of_step"].get<double>(),
                    constrained["decode_step_ms"].get<double>(), constrained["mask_ms_per_row_first_run"].get<double>(),
                    constrained["tokens_per_second"].get<double>()));
    if (constrained.contains("speculative"))
      say(fmt::format("schema   with the drafter: acceptance {:.1f}%, {:.2f} tokens/step, {:.2f} tok/s",
                      100 * constrained["speculative"]["acceptance_rate"].get<double>(),
                      constrained["speculative"]["tokens_per_step"].get<double>(),
                      constrained["speculative"]["tokens_per_second"].get<double>()));
  }
  if (spec.is_null()) return 0;
  const std::string length = spec["draft_tokens"].is_string()
                                 ? fmt::format("auto (mean {:.2f})", spec["mean_draft_length"].get<double>())
                                 : std::to_string(draft);
  if (!replaying) {
    say(fmt::format("spec{:<4} {:8.2f} tok/s  ({:.2f}-{:.2f}), draft {}, acceptance {:.1f}%, {:.2f} tokens/step, x{:.2f} vs tg",
                    gen_tokens, spec["tokens_per_second"].get<double>(), spec["min"].get<double>(),
                    spec["max"].get<double>(), length, 100 * spec["acceptance_rate"].get<double>(),
                    spec["tokens_per_step"].get<double>(), spec["speedup_vs_tg"].get<double>()));
    return 0;
  }
  say(fmt::format("spec{:<4} {:8.2f} tok/s  ({:.2f}-{:.2f}), draft {}, profile {}", gen_tokens,
                  spec["tokens_per_second"].get<double>(), spec["min"].get<double>(), spec["max"].get<double>(), length,
                  fmt::join(replay_profile, ",")));
  say(fmt::format("rounds   {:.2f} tokens (the profile gives {:.2f}), {:.2f} drafts; accepted by position {:.2f}",
                  replay["replay_tokens_per_round"].get<double>(), replay["replay_expected_tokens_per_round"].get<double>(),
                  replay["replay_mean_draft_tokens"].get<double>(),
                  fmt::join(replay["replay_accepted_fraction_by_position"].get<std::vector<double>>(), " ")));
  say(fmt::format("plain{:<3} {:8.2f} tok/s  (the same engine without the drafter): speed-up x{:.2f}", gen_tokens,
                  replay["replay_plain_tokens_per_second"].get<double>(), replay["replay_speedup"].get<double>()));
  return 0;
}

}  // namespace

SPECULA_COMMAND("bench", "prompt-processing and generation speed (llama-bench's pp/tg), speculative too", run_bench);
