// specula-example PIPELINE_OR_MODEL "message" [max_tokens]: streams the model's answer to one user
// message, then prints the call's statistics to stderr. docs/api.md walks through it.
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "specula/api.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: specula-example PIPELINE.yaml|MODEL \"message\" [max_tokens]\n";
    return 2;
  }
  try {
    auto model = specula::api::Model::open(argv[1]);  // a YAML pipeline, or a GGUF / model directory
    auto sampling = model->default_sampling();        // the pipeline's (or generation_config.json's)
    if (argc > 3) sampling.max_tokens = std::atoi(argv[3]);

    const specula::api::ChatMessage messages[] = {{"user", argv[2]}};
    auto session = model->new_session();
    const auto result = session->generate_stream(messages, sampling, [](std::string_view chunk) {
      std::cout << chunk << std::flush;  // answer text only: valid UTF-8, thought channel removed
    });
    std::cout << "\n";
    const auto& st = result.stats;
    std::cerr << st.prompt_tokens << " prompt tokens, " << st.generated_tokens << " generated at "
              << st.decode_tokens_per_second() << " tok/s; drafted " << st.drafted_tokens << ", accepted "
              << st.accepted_tokens << "; stop: " << specula::core::stop_reason_name(result.stop_reason) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "specula-example: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
