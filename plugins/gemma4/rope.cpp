#include "rope.hpp"

#include <fmt/format.h>

#include "specula/error.hpp"

namespace specula::gemma4 {

using json = nlohmann::json;

Ropes rope_from_gguf(const GgufKeys& k, const ModelFile& file, int64_t head_dim_sliding, int64_t head_dim_full,
                     const std::string& where) {
  const int64_t dims_swa = k.optional_int("rope.dimension_count_swa", head_dim_sliding);
  const int64_t dims = k.optional_int("rope.dimension_count", head_dim_full);
  Ropes r;
  r.sliding = {k.optional_float("rope.freq_base_swa", k.optional_float("rope.freq_base", 10000.0f)), dims_swa / 2,
               static_cast<float>(dims_swa), 1.0f};
  r.full = {k.optional_float("rope.freq_base", 10000.0f), dims / 2, static_cast<float>(dims), 1.0f};
  r.full.rotated_pairs = rope_freqs_rotated_pairs(file, dims, r.full.rotated_pairs, where);
  if (r.sliding.rotated_pairs > head_dim_sliding / 2 || r.full.rotated_pairs > head_dim_full / 2)
    fail("{}: rope.dimension_count(_swa) exceeds the head dims", where);
  return r;
}

Ropes rope_from_hf(const json& tc, int64_t head_dim_sliding, int64_t head_dim_full, const std::string& where,
                   std::string_view prefix) {
  json rope = tc.value("rope_parameters", json());
  if (rope.is_null())
    rope = json::parse(R"({"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}})");
  auto rope_for = [&](const char* type, int64_t head_dim) {
    if (!rope.is_object() || !rope.contains(type) || !rope[type].is_object())
      fail("{}: {}rope_parameters.{} is missing", where, prefix, type);
    const JsonFields r(rope[type], where, fmt::format("{}rope_parameters.{}.", prefix, type));
    const std::string kind = r.get<std::string>("rope_type", "default");
    const float prf = r.get<float>("partial_rotary_factor", 1.0f);
    const float factor = r.get<float>("factor", 1.0f);
    if (!(prf > 0.0f && prf <= 1.0f) || !(factor > 0.0f))
      fail("{}: {}rope_parameters.{} has partial_rotary_factor {} and factor {}; expected 0 < partial_rotary_factor "
           "<= 1 and factor > 0", where, prefix, type, prf, factor);
    RopeConfig out{r.get<float>("rope_theta", 10000.0f), head_dim / 2, static_cast<float>(head_dim), 1.0f / factor};
    if (kind == "proportional") {
      out.rotated_pairs = static_cast<int64_t>(prf * static_cast<float>(head_dim)) / 2;
    } else if (kind != "default" || prf != 1.0f) {
      fail("{}: {}rope_parameters.{} has rope_type '{}' with partial_rotary_factor {}; only 'default' (full "
           "rotation) and 'proportional' are supported", where, prefix, type, kind, prf);
    }
    return out;
  };
  return {rope_for("sliding_attention", head_dim_sliding), rope_for("full_attention", head_dim_full)};
}

}  // namespace specula::gemma4
