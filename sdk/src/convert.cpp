// Conversion to GGUF: out-type rules, the tokenizer keys llama.cpp's converter writes from tokenizer.json,
// and the streaming writer that runs a converter plugin's plan.
#include "specula/convert.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <cctype>
#include <set>
#include <sstream>
#include <unordered_map>

#include "specula/compute.hpp"
#include "specula/error.hpp"
#include "specula/quant.hpp"

namespace specula {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return json::parse(buffer.str());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
}

fs::path checkpoint_dir(const ModelFile& file) {
  std::error_code ec;
  return fs::is_directory(file.path(), ec) ? file.path() : file.path().parent_path();
}

// tokenizer_config.json names a token as a string or as {"content": ...}.
std::optional<std::string> named_token(const json& config, const std::string& key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

// llama.cpp's token types.
enum TokenType : int32_t { kNormal = 1, kControl = 3, kUserDefined = 4, kByte = 6 };

}  // namespace

std::optional<DType> convert_outtype(std::string_view name) {
  if (name == "f32") return DType::F32;
  if (name == "f16") return DType::F16;
  if (name == "bf16") return DType::BF16;
  if (name == "q8_0") return DType::Q8_0;
  return std::nullopt;
}

DType auto_outtype(const ModelFile& file) {
  for (const TensorInfo& t : file.tensors()) {
    if (t.shape.size() < 2) continue;
    const DType stored = t.type == DType::MLX_AFFINE ? t.quant.scale_type : t.type;
    return stored == DType::BF16 ? DType::BF16 : DType::F16;
  }
  return DType::F16;
}

uint32_t llama_file_type(DType outtype) {
  switch (outtype) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q8_0: return 7;
    case DType::BF16: return 32;
    default: break;
  }
  fail("convert: out type {} is not one of F32, F16, BF16, Q8_0", dtype_name(outtype));
}

DType convert_tensor_type(const ConvertTensor& t, DType outtype) {
  if (t.keep_f32) return DType::F32;
  if (outtype == DType::Q8_0 && (t.shape.empty() || t.shape.back() % 32 != 0)) return DType::F16;
  return outtype;
}

bool llama_keeps_f32(const std::string& name, size_t dims) {
  const auto ends = [&](std::string_view s) { return name.size() >= s.size() && name.ends_with(s); };
  return dims <= 1 || ends("_norm.weight") || !ends(".weight") || ends(".ffn_gate_inp.weight") ||
         ends(".ffn_gate_inp_shexp.weight");
}

std::string default_model_name(const ModelFile& file, const ConvertOptions& options) {
  if (!options.name.empty()) return options.name;
  const fs::path dir = checkpoint_dir(file);
  std::string name = (dir.filename().empty() ? dir.parent_path() : dir).filename().string();
  return name.empty() ? "model" : name;
}

int64_t add_hf_tokenizer(const ModelFile& file, gguf::Metadata& out, const std::string& model,
                         const std::vector<std::string>& user_defined) {
  const json& md = file.metadata();
  const fs::path dir = checkpoint_dir(file);
  if (!md.contains("tokenizer_json_path") || !md["tokenizer_json_path"].is_string())
    fail("{}: tokenizer.json is missing; the GGUF needs the tokenizer (tokenizer.ggml.* keys) it describes",
         (dir / "tokenizer.json").string());
  const fs::path tj_path = md["tokenizer_json_path"].get<std::string>();
  const std::string where = tj_path.string();
  const json tj = read_json(tj_path);
  static const json no_merges = json::array();
  const json config = md.value("tokenizer_config", json::object());
  const json model_config = md.value("config", json::object());

  auto mit = tj.find("model");
  if (mit == tj.end() || !mit->is_object() || mit->value("type", "") != "BPE" || !mit->value("byte_fallback", false))
    fail("{}: model is not a BPE with byte_fallback; llama.cpp's converter reads only that (Llama/Gemma-style) "
         "tokenizer", where);
  const json& vocab = mit->contains("vocab") ? (*mit)["vocab"] : no_merges;
  if (!vocab.is_object() || vocab.empty()) fail("{}: model.vocab is missing or empty", where);
  const json added = tj.value("added_tokens", json::array());
  if (!added.is_array()) fail("{}: added_tokens is not an array", where);

  // The base vocabulary must be ids 0..n-1; added tokens may reuse those ids or extend them.
  const int64_t base = static_cast<int64_t>(vocab.size());
  std::vector<std::string> tokens(static_cast<size_t>(base));
  std::vector<bool> seen(static_cast<size_t>(base), false);
  for (const auto& [piece, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= base)
      fail("{}: model.vocab['{}'] = {} is not an id in [0, {})", where, piece, id.dump(), base);
    const auto i = id.get<size_t>();
    if (seen[i]) fail("{}: model.vocab gives id {} twice", where, i);
    seen[i] = true;
    tokens[i] = piece;
  }
  std::set<int64_t> special_ids;
  std::map<int64_t, std::pair<std::string, bool>> extra;  // added tokens beyond the vocabulary
  for (const json& a : added) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      fail("{}: added_tokens entry {} lacks an integer id or a string content", where, a.dump().substr(0, 120));
    const int64_t id = a["id"].get<int64_t>();
    const std::string content = a["content"].get<std::string>();
    const bool special = a.value("special", false);
    if (id < 0) fail("{}: added token '{}' has id {}", where, content, id);
    if (id < base) tokens[static_cast<size_t>(id)] = content;  // transformers' get_vocab(): the added text wins
    else extra[id] = {content, special};
    if (special) special_ids.insert(id);
  }
  int64_t next = base;
  for (const auto& [id, e] : extra) {
    if (id != next) fail("{}: added token ids must continue the vocabulary without gaps; expected {}, got {}", where, next, id);
    tokens.push_back(e.first);
    ++next;
  }
  // SpecialVocab resolves the named ids through added_tokens only.
  auto added_id = [&](const std::string& content) -> std::optional<int64_t> {
    for (const json& a : added)
      if (a["content"] == content) return a["id"].get<int64_t>();
    return std::nullopt;
  };
  // The tokens tokenizer_config.json names are special too (transformers' all_special_ids), wherever
  // they are in the vocabulary.
  std::unordered_map<std::string, int64_t> id_of;
  for (size_t i = tokens.size(); i-- > 0;) id_of[tokens[i]] = static_cast<int64_t>(i);
  auto mark = [&](const std::string& text) {
    if (auto it = id_of.find(text); it != id_of.end()) special_ids.insert(it->second);
  };
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (it.key().size() > 6 && it.key().ends_with("_token"))
      if (auto text = named_token(config, it.key())) mark(*text);
    if ((it.key() == "additional_special_tokens" || it.key() == "extra_special_tokens") && it->is_array())
      for (const json& e : *it) {
        const json& text = e.is_object() ? e.value("content", json()) : e;
        if (text.is_string()) mark(text.get<std::string>());
      }
  }

  const std::set<std::string> visible(user_defined.begin(), user_defined.end());
  auto byte_token = [](const std::string& t) {  // <0xNN>
    return t.size() == 6 && t.starts_with("<0x") && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
           std::isxdigit(static_cast<unsigned char>(t[4]));
  };
  json tokens_json = json::array(), scores = json::array(), types = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t type = kNormal;
    if (static_cast<int64_t>(i) >= base) type = extra[static_cast<int64_t>(i)].second ? kControl : kUserDefined;
    else if (byte_token(tokens[i])) type = kByte;
    else if (special_ids.count(static_cast<int64_t>(i))) type = kControl;
    if (visible.count(tokens[i])) type = kUserDefined;
    tokens_json.push_back(tokens[i]);
    scores.push_back(-1000.0f);
    types.push_back(type);
  }
  out.set_string("tokenizer.ggml.model", model);
  out.set_array("tokenizer.ggml.tokens", gguf::ValueType::STRING, std::move(tokens_json));
  out.set_array("tokenizer.ggml.scores", gguf::ValueType::FLOAT32, std::move(scores));
  out.set_array("tokenizer.ggml.token_type", gguf::ValueType::INT32, std::move(types));

  // SpecialVocab: merges, special ids, add_* flags, chat template, in this order.
  const json& merges = mit->contains("merges") ? (*mit)["merges"] : no_merges;
  json merges_json = json::array();
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    if (m.is_string()) {
      merges_json.push_back(m);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      // Pairs (transformers >= 4.45) are joined with one space; a space inside a part becomes U+0120.
      auto escape = [](std::string s) {
        for (size_t p; (p = s.find(' ')) != std::string::npos;) s.replace(p, 1, "\xC4\xA0");
        return s;
      };
      merges_json.push_back(escape(m[0].get<std::string>()) + " " + escape(m[1].get<std::string>()));
    } else {
      fail("{}: model.merges[{}] is {}; expected \"left right\" or [left, right]", where, r, m.dump());
    }
  }
  if (!merges_json.empty()) out.set_array("tokenizer.ggml.merges", gguf::ValueType::STRING, std::move(merges_json));

  static const std::vector<std::pair<std::string, std::string>> kinds = {
      {"bos", "bos_token_id"}, {"eos", "eos_token_id"}, {"unk", "unknown_token_id"}, {"sep", "seperator_token_id"},
      {"pad", "padding_token_id"}, {"mask", "mask_token_id"}};  // gguf-py has no key for cls
  std::vector<std::pair<std::string, int64_t>> ids;  // insertion order = key order
  auto set_id = [&](const std::string& kind, int64_t id) {
    for (const auto& e : ids)
      if (e.first == kind) return;  // the first source wins
    if (id >= 0 && id < static_cast<int64_t>(tokens.size())) ids.emplace_back(kind, id);
  };
  // tokenizer.json's post-processor says whether BOS/EOS are added (the simple TemplateProcessing form).
  std::vector<std::pair<std::string, bool>> add_flags;
  auto set_flag = [&](const std::string& kind, bool v) {
    for (auto& f : add_flags)
      if (f.first == kind) {
        f.second = v;
        return;
      }
    add_flags.emplace_back(kind, v);
  };
  if (auto pp = tj.find("post_processor"); pp != tj.end() && pp->is_object()) {
    const json procs = pp->contains("processors") ? (*pp)["processors"] : json::array({*pp});
    for (const json& p : procs) {
      if (p.value("type", "") != "TemplateProcessing") continue;
      const json single = p.value("single", json::array());
      if (single.size() < 2) continue;
      auto special_of = [](const json& item) {
        return item.contains("SpecialToken") ? item["SpecialToken"].value("id", "") : std::string();
      };
      if (const std::string first = special_of(single.front()); !first.empty())
        set_flag("bos", first == named_token(config, "bos_token").value_or(first));
      if (const std::string last = special_of(single.back()); !last.empty())
        set_flag("eos", last == named_token(config, "eos_token").value_or(last));
    }
  }
  for (const auto& [kind, key] : kinds) {
    if (auto add = config.find("add_" + kind + "_token"); add != config.end() && add->is_boolean())
      set_flag(kind, add->get<bool>());
    if (auto text = named_token(config, kind + "_token"))
      if (auto id = added_id(*text)) set_id(kind, *id);
  }
  for (const auto& [kind, key] : kinds) {
    const json* v = nullptr;
    if (auto it = model_config.find(kind + "_token_id"); it != model_config.end() && !it->is_null()) v = &*it;
    else if (auto tc = model_config.find("text_config"); tc != model_config.end() && tc->is_object())
      if (auto jt = tc->find(kind + "_token_id"); jt != tc->end()) v = &*jt;
    if (v && v->is_number_integer()) set_id(kind, v->get<int64_t>());
  }
  for (const auto& [kind, id] : ids) {
    std::string key;
    for (const auto& [k, name] : kinds)
      if (k == kind) key = name;
    out.set_u32("tokenizer.ggml." + key, static_cast<uint32_t>(id));
  }
  for (const auto& [kind, v] : add_flags) out.set_bool("tokenizer.ggml.add_" + kind + "_token", v);

  json templ = config.value("chat_template", json());
  if (templ.is_null()) {
    if (fs::exists(dir / "chat_template.jinja")) {
      std::ifstream in(dir / "chat_template.jinja", std::ios::binary);
      std::stringstream s;
      s << in.rdbuf();
      templ = s.str();
    } else if (fs::exists(dir / "chat_template.json")) {
      templ = read_json(dir / "chat_template.json").value("chat_template", json());
    }
  }
  if (templ.is_string()) out.set_string("tokenizer.chat_template", templ.get<std::string>());
  else if (!templ.is_null())
    fail("{}: chat_template is {}; only a single template string is supported", (dir / "tokenizer_config.json").string(),
         templ.type_name());
  return static_cast<int64_t>(tokens.size());
}

namespace {

// Drops the whole pages of `bytes` from this process's memory map once they have been converted: the
// checkpoint stays in the page cache, but the process's resident set no longer grows with the model.
void release(std::span<const std::byte> bytes) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data()), end = begin + bytes.size();
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

// Releases the stored bytes of rows [r0, r1) of `t` (for MLX: its packed codes, scales and biases).
void release_rows(const TensorInfo& t, int64_t r0, int64_t r1) {
  const int64_t rows = t.shape.size() < 2 ? 1 : t.elements() / t.shape.back();
  auto part = [&](std::span<const std::byte> all) {
    const size_t row = all.size() / static_cast<size_t>(rows);
    release(all.subspan(static_cast<size_t>(r0) * row, static_cast<size_t>(r1 - r0) * row));
  };
  part(t.data);
  if (t.type == DType::MLX_AFFINE) {
    part(t.quant.scales);
    part(t.quant.biases);
  }
}

// Output rows of one tensor, read from its sources: the row of source `s` that output row r is.
struct RowSource {
  const TensorInfo* tensor;
  int64_t row;
};

class RowMap {
 public:
  RowMap(const ConvertTensor& t, const std::string& where) : t_(t) {
    const size_t n = t.shape.size();
    if (n == 0) fail("{}: tensor '{}' has no dimensions", where, t.name);
    for (int64_t d : t.shape)
      if (d <= 0) fail("{}: tensor '{}' has shape {}; every dimension must be positive", where, t.name, shape_str(t.shape));
    cols_ = t.shape.back();
    rows_ = 1;
    for (size_t d = 0; d + 1 < n; ++d) rows_ *= t.shape[d];
    if (t.sources.empty()) return;
    const size_t k = t.concat_axis;
    if (t.sources.size() > 1 && k + 1 >= n)
      fail("{}: tensor '{}': concatenation along axis {} of a {}-D tensor; only outer axes are supported", where,
           t.name, k, n);
    int64_t along = 0;
    for (const TensorInfo* s : t.sources) {
      auto bad = [&] {
        fail("{}: tensor '{}' (from '{}', shape {}) does not fit the output shape {}", where, t.name, s->name,
             shape_str(s->shape), shape_str(t.shape));
      };
      const int64_t elems = s->elements();
      if (t.sources.size() == 1) {
        // Same row length, at least as many rows (a converter may keep only the first rows).
        const int64_t src_cols = s->shape.empty() ? 1 : s->shape.back();
        if (src_cols != cols_ || elems < rows_ * cols_) bad();
        per_outer_.push_back(rows_);
        outer_ = 1;
        return;
      }
      if (s->shape.size() != n) bad();
      for (size_t d = 0; d < n; ++d)
        if (d != k && s->shape[d] != t.shape[d]) bad();
      along += s->shape[k];
      int64_t inner = 1;
      for (size_t d = k; d + 1 < n; ++d) inner *= s->shape[d];
      per_outer_.push_back(inner);
    }
    if (along != t.shape[k])
      fail("{}: tensor '{}': its sources add up to {} along axis {}, the output has {}", where, t.name, along, k,
           t.shape[k]);
    outer_ = 1;
    for (size_t d = 0; d < k; ++d) outer_ *= t.shape[d];
  }

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }

  // Fills rows [r0, r1) into dst (cols() floats each).
  void read(int64_t r0, int64_t r1, float* dst) const {
    if (t_.sources.empty()) {
      std::fill(dst, dst + (r1 - r0) * cols_, 0.0f);
      return;
    }
    int64_t block = 0;
    for (int64_t v : per_outer_) block += v;
    for (int64_t r = r0; r < r1;) {
      const int64_t o = r / block;
      int64_t within = r % block;
      size_t s = 0;
      while (within >= per_outer_[s]) within -= per_outer_[s++];
      // A run of consecutive rows from the same source.
      const int64_t n = std::min(r1 - r, per_outer_[s] - within);
      const int64_t src_row = o * per_outer_[s] + within;
      dequantize_rows(*t_.sources[s], src_row, src_row + n, dst + (r - r0) * cols_);
      release_rows(*t_.sources[s], src_row, src_row + n);
      r += n;
    }
  }

 private:
  const ConvertTensor& t_;
  int64_t rows_ = 0, cols_ = 0, outer_ = 1;
  std::vector<int64_t> per_outer_;  // rows each source contributes per outer index
};

}  // namespace

void write_converted(const ModelFormat& writer, const gguf::Metadata& metadata, const std::vector<ConvertTensor>& tensors,
                     DType outtype, const fs::path& path, const ConvertProgress& progress) {
  llama_file_type(outtype);  // refuses any other out type
  if (!writer.can_write()) fail("{}: the {} format plugin cannot write files", path.string(), writer.name());
  const std::string where = path.string();
  std::vector<RowMap> maps;
  maps.reserve(tensors.size());
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const ConvertTensor& t : tensors) {
    maps.emplace_back(t, where);
    for (const TensorInfo* s : t.sources)
      if (s->type != DType::MLX_AFFINE && !can_dequantize(s->type))
        fail("{}: tensor '{}' is stored as {}, which cannot be converted", where, s->name, dtype_name(s->type));
    specs.push_back({t.name, convert_tensor_type(t, outtype), t.shape, {}, {}});
  }
  // Rows are converted in chunks of about 4 MiB of floats.
  constexpr int64_t kChunkFloats = int64_t{1} << 20;
  for (size_t i = 0; i < tensors.size(); ++i) {
    specs[i].fill = [&, i](const PutBytes& put) {
      const ConvertTensor& t = tensors[i];
      const RowMap& m = maps[i];
      const DType type = specs[i].type;
      const uint64_t row_bytes = *dtype_row_bytes(type, static_cast<uint64_t>(m.cols()));
      const int64_t step = std::max<int64_t>(1, kChunkFloats / m.cols());
      std::vector<float> values(static_cast<size_t>(std::min(step, m.rows()) * m.cols()));
      std::vector<std::byte> bytes(static_cast<size_t>(std::min(step, m.rows())) * row_bytes);
      for (int64_t r0 = 0; r0 < m.rows(); r0 += step) {
        const int64_t r1 = std::min(m.rows(), r0 + step);
        m.read(r0, r1, values.data());
        for (int64_t r = r0; r < r1; ++r) {
          float* row = values.data() + (r - r0) * m.cols();
          if (t.transform) t.transform(r, std::span<float>(row, static_cast<size_t>(m.cols())));
          quantize_row(type, row, bytes.data() + (r - r0) * row_bytes, m.cols());
        }
        put(std::span<const std::byte>(bytes.data(), static_cast<size_t>(r1 - r0) * row_bytes));
      }
      if (progress) progress(i);
    };
  }
  writer.write(path, metadata, specs);
}

}  // namespace specula
