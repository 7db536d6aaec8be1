// Safetensors / MLX reader. Hostile files are expected: the header length is capped and checked against
// the file, every tensor's offsets and byte size are checked, and errors name the file and the field.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "safetensors_io.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/mapped_file.hpp"
#include "specula/quant.hpp"

namespace specula::safetensors {

namespace fs = std::filesystem;
using nlohmann::json;

std::optional<DType> dtype_from_string(std::string_view s) {
  static const std::pair<std::string_view, DType> kMap[] = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"F64", DType::F64},
      {"I8", DType::I8},   {"I16", DType::I16}, {"I32", DType::I32},   {"I64", DType::I64},
      {"U8", DType::U8},   {"U32", DType::U32}, {"BOOL", DType::U8}};
  for (const auto& [name, t] : kMap)
    if (name == s) return t;
  return std::nullopt;
}

std::string_view dtype_to_string(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I8: return "I8";
    case DType::I16: return "I16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::U32: return "U32";
    default: fail("safetensors: dtype {} cannot be stored in a safetensors file", dtype_name(t));
  }
}

namespace {

uint64_t checked_u64(const json& v, const std::string& name, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  fail("{}: {}: expected a non-negative integer, got {}", name, what, v.dump(-1, ' ', false, json::error_handler_t::replace));
}

}  // namespace

File parse(std::span<const std::byte> bytes, const std::string& name) {
  File f;
  if (bytes.size() < 8)
    fail("{}: truncated: {} bytes, a safetensors file starts with an 8-byte header length", name, bytes.size());
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeaderBytes)
    fail("{}: header length {} exceeds the {} byte limit (not a safetensors file?)", name, n, kMaxHeaderBytes);
  if (n > bytes.size() - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes) — truncated file", name, n, bytes.size());
  f.header_bytes = n;
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  if (n == 0 || text[0] != '{') fail("{}: JSON header must start with '{{'", name);
  json header;
  try {
    header = json::parse(text, text + n);
  } catch (const json::exception& e) {
    fail("{}: malformed JSON header ({} bytes): {}", name, n, e.what());
  }
  if (!header.is_object()) fail("{}: JSON header is not an object", name);
  const std::span<const std::byte> buffer = bytes.subspan(static_cast<size_t>(8 + n));

  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) fail("{}: '__metadata__' must be an object of strings", name);
      f.metadata = *it;
      continue;
    }
    const std::string& tname = it.key();
    const json& e = *it;
    const std::string what = "tensor '" + tname + "'";
    if (!e.is_object()) fail("{}: {}: entry is not an object", name, what);
    const auto dt = e.find("dtype");
    if (dt == e.end() || !dt->is_string()) fail("{}: {}: missing string field 'dtype'", name, what);
    const auto type = dtype_from_string(dt->get<std::string>());
    if (!type)
      fail("{}: {}: dtype '{}' is not supported (F32 F16 BF16 F64 I8 I16 I32 I64 U8 U32 BOOL)", name, what,
           dt->get<std::string>());
    const auto sh = e.find("shape");
    if (sh == e.end() || !sh->is_array()) fail("{}: {}: missing array field 'shape'", name, what);
    TensorInfo t;
    t.name = tname;
    t.type = *type;
    uint64_t elements = 1;
    for (const auto& d : *sh) {
      const uint64_t v = checked_u64(d, name, what + " shape");
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (v != 0 && elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / v))
        fail("{}: {}: shape {} overflows", name, what, sh->dump());
      if (v != 0) elements *= v;  // product of the non-zero dims must fit (see elements() below)
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const auto off = e.find("data_offsets");
    if (off == e.end() || !off->is_array() || off->size() != 2)
      fail("{}: {}: 'data_offsets' must be [begin, end]", name, what);
    const uint64_t begin = checked_u64((*off)[0], name, what + " data_offsets[0]");
    const uint64_t end = checked_u64((*off)[1], name, what + " data_offsets[1]");
    if (end < begin) fail("{}: {}: data_offsets [{}, {}] end before begin", name, what, begin, end);
    if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) elements = 0;
    const uint64_t size = dtype_traits(t.type)->block_bytes;
    if (elements > std::numeric_limits<uint64_t>::max() / size || end - begin != elements * size)
      fail("{}: {}: data_offsets [{}, {}] hold {} bytes but {} {} needs {}", name, what, begin, end, end - begin,
           dt->get<std::string>(), sh->dump(), elements * size);
    if (end > buffer.size())
      fail("{}: {}: data_offsets [{}, {}] run past the end of the data buffer ({} bytes) — truncated file", name,
           what, begin, end, buffer.size());
    t.data = buffer.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
    ranges.push_back({begin, end, f.tensors.size()});
    f.tensors.push_back(std::move(t));
  }
  // The buffer must be covered exactly: no overlap, no hole, nothing after the last tensor.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& r = ranges[i];
    if (r.begin < expect)
      fail("{}: tensor '{}' (bytes [{}, {})) overlaps tensor '{}'", name, f.tensors[r.index].name, r.begin, r.end,
           f.tensors[ranges[i - 1].index].name);
    if (r.begin > expect)
      fail("{}: tensor '{}' starts at byte {} of the data buffer, leaving a hole after byte {}", name,
           f.tensors[r.index].name, r.begin, expect);
    expect = r.end;
  }
  if (expect != buffer.size())
    log_warn("{}: {} bytes after the last tensor are not used by any tensor", name, buffer.size() - expect);
  return f;
}

bool looks_like_checkpoint(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path.extension() == ".safetensors";
  if (!fs::is_directory(path, ec)) return false;
  if (fs::exists(path / "model.safetensors.index.json", ec)) return true;
  for (const auto& e : fs::directory_iterator(path, ec))
    if (e.path().extension() == ".safetensors") return true;
  return false;
}

const json* text_config_value(const json& config, std::string_view key) {
  if (!config.is_object()) return nullptr;
  const std::string k(key);
  auto tc = config.find("text_config");
  if (tc != config.end() && tc->is_object()) {
    auto it = tc->find(k);
    if (it != tc->end() && !it->is_null()) return &*it;
  }
  auto it = config.find(k);
  return it != config.end() && !it->is_null() ? &*it : nullptr;
}

namespace {

uint32_t u32_field(const json& obj, const char* key, uint32_t fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1024)
    fail("config.json: '{}' = {} is not a valid integer", key, it->dump());
  return static_cast<uint32_t>(it->get<int64_t>());
}

// The quantization objects of one scope: "quantization" then "quantization_config".
std::vector<std::pair<std::string, const json*>> quant_objects(const json& scope) {
  std::vector<std::pair<std::string, const json*>> out;
  for (const char* k : {"quantization", "quantization_config"}) {
    auto it = scope.find(k);
    if (it != scope.end() && it->is_object()) out.emplace_back(k, &*it);
  }
  return out;
}

}  // namespace

QuantChoice resolve_quantization(const json& config, const std::string& module_path) {
  std::vector<std::pair<std::string, const json*>> scopes;
  if (config.is_object()) {
    scopes.emplace_back("", &config);
    auto tc = config.find("text_config");
    if (tc != config.end() && tc->is_object()) scopes.emplace_back("text_config.", &*tc);
  }
  // Per-module override, then the global forms in order, each looked for in the root, then text_config.
  for (const auto& [prefix, scope] : scopes)
    for (const auto& [qkey, q] : quant_objects(*scope)) {
      auto it = q->find(module_path);
      if (it != q->end() && it->is_object()) {
        QuantChoice c;
        c.bits = u32_field(*it, "bits", u32_field(*q, "bits", 4));
        c.group_size = u32_field(*it, "group_size", u32_field(*q, "group_size", 64));
        c.source = fmt::format("config.json {}{}[\"{}\"]", prefix, qkey, module_path);
        return c;
      }
    }
  for (const auto& [prefix, scope] : scopes)
    if (scope->contains("quantization_bits")) {
      QuantChoice c;
      c.bits = u32_field(*scope, "quantization_bits", 4);
      c.group_size = u32_field(*scope, "quantization_group_size", 64);
      c.source = fmt::format("config.json {}quantization_bits", prefix);
      return c;
    }
  for (const auto& [prefix, scope] : scopes)
    for (const auto& [qkey, q] : quant_objects(*scope))
      if (q->contains("bits")) {
        QuantChoice c;
        c.bits = u32_field(*q, "bits", 4);
        c.group_size = u32_field(*q, "group_size", 64);
        c.source = fmt::format("config.json {}{}.bits", prefix, qkey);
        return c;
      }
  for (const auto& [prefix, scope] : scopes) {
    auto it = scope->find("quantization");
    if (it != scope->end() && it->is_string()) {
      const std::string label = it->get<std::string>();
      if (label != "int8" && label != "int4")
        fail("config.json: {}quantization = \"{}\" is not a known label (int8, int4)", prefix, label);
      QuantChoice c;
      c.bits = label == "int8" ? 8 : 4;
      c.group_size = 0;  // the label names no group size
      c.source = fmt::format("config.json {}quantization = \"{}\"", prefix, label);
      return c;
    }
  }
  return QuantChoice{4, 64, "default (INT4, group 64)"};
}

namespace {

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) fail("{}: cannot open", p.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: malformed JSON: {}", p.string(), e.what());
  }
}

class StModelFile final : public ModelFile {
 public:
  std::string format() const override { return format_; }
  fs::path path() const override { return path_; }
  const json& metadata() const override { return metadata_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(const std::string& name) const override {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }

  std::string format_ = "safetensors";
  fs::path path_;
  json metadata_ = json::object();
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<std::shared_ptr<const MappedFile>> maps_;
};

std::string strip_suffix(const std::string& s, std::string_view suffix) {
  return s.substr(0, s.size() - suffix.size());
}
bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Folds `<m>.weight` (U32) + `<m>.scales` + `<m>.biases` into one MLX_AFFINE tensor.
TensorInfo fold_mlx(const std::string& module, const TensorInfo& w, const TensorInfo& s, const TensorInfo& b,
                    const json& config, const std::string& where) {
  const std::string what = fmt::format("{}: MLX-quantized module '{}'", where, module);
  if (w.type != DType::U32) fail("{}: '{}.weight' has dtype {}, expected U32 packed words", what, module, dtype_name(w.type));
  if (s.type != b.type || (s.type != DType::F16 && s.type != DType::BF16 && s.type != DType::F32))
    fail("{}: scales ({}) and biases ({}) must share one of F16/BF16/F32", what, dtype_name(s.type), dtype_name(b.type));
  if (w.shape.empty() || s.shape.size() != w.shape.size() || b.shape != s.shape ||
      !std::equal(w.shape.begin(), w.shape.end() - 1, s.shape.begin()))
    fail("{}: shapes weight {} / scales {} / biases {} do not match", what, json(w.shape).dump(), json(s.shape).dump(),
         json(b.shape).dump());
  const int64_t words = w.shape.back(), groups = s.shape.back();
  QuantChoice q = resolve_quantization(config, module);
  if (q.group_size == 0 && groups > 0) {
    // A label without a group size: the group size follows from the shapes.
    const int64_t k = words * 32 / q.bits;
    q.group_size = k % groups == 0 ? static_cast<uint32_t>(k / groups) : 0;
  }
  if (!mlx_params_valid(q.bits, q.group_size))
    fail("{}: bits {} / group_size {} (from {}) are not supported (bits 2,3,4,5,6,8; group 32,64,128)", what, q.bits,
         q.group_size, q.source);
  const int64_t k = groups * q.group_size;
  if (k * q.bits != words * 32)
    fail("{}: weight has {} u32 words per row and scales {} groups per row, which does not fit bits={} "
         "group_size={} (from {}): the checkpoint was quantized differently from what its config says",
         what, words, groups, q.bits, q.group_size, q.source);
  TensorInfo t;
  t.name = module + ".weight";
  t.type = DType::MLX_AFFINE;
  t.shape = w.shape;
  t.shape.back() = k;
  t.data = w.data;
  t.quant.bits = q.bits;
  t.quant.group_size = q.group_size;
  t.quant.scale_type = s.type;
  t.quant.scales = s.data;
  t.quant.biases = b.data;
  return t;
}

}  // namespace

std::unique_ptr<ModelFile> open(const fs::path& path) {
  auto mf = std::make_unique<StModelFile>();
  mf->path_ = path;
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  if (!is_dir && !fs::is_regular_file(path, ec)) fail("{}: no such file or directory", path.string());
  const fs::path dir = is_dir ? path : path.parent_path();

  // Which files, and (with an index) which tensor lives where.
  std::vector<fs::path> files;
  std::map<std::string, std::string> weight_map;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (!is_dir) {
    files.push_back(path);
  } else if (fs::exists(index_path)) {
    const json index = read_json_file(index_path);
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) fail("{}: missing object 'weight_map'", index_path.string());
    std::set<std::string> names;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) fail("{}: weight_map['{}'] is not a file name", index_path.string(), it.key());
      const std::string file = it->get<std::string>();
      if (file.find('/') != std::string::npos || file == ".." || file.empty())
        fail("{}: weight_map['{}'] = '{}' is not a plain file name", index_path.string(), it.key(), file);
      weight_map[it.key()] = file;
      names.insert(file);
    }
    for (const auto& n : names) {
      if (!fs::exists(dir / n))
        fail("{}: shard '{}' listed in weight_map is missing from {}", index_path.string(), n, dir.string());
      files.push_back(dir / n);
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors" && e.path().filename().string().rfind("model", 0) == 0)
        files.push_back(e.path());
    if (files.empty())
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".safetensors") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    if (files.empty()) fail("{}: no .safetensors files in this directory", dir.string());
  }

  json config = json::object();
  for (const auto& [key, file] : {std::pair<const char*, const char*>{"config", "config.json"},
                                  {"generation_config", "generation_config.json"},
                                  {"tokenizer_config", "tokenizer_config.json"}}) {
    if (fs::exists(dir / file)) mf->metadata_[key] = read_json_file(dir / file);
  }
  if (mf->metadata_.contains("config")) config = mf->metadata_["config"];
  if (fs::exists(dir / "tokenizer.json")) mf->metadata_["tokenizer_json_path"] = (dir / "tokenizer.json").string();

  // Raw tensors of every shard, by name.
  std::vector<TensorInfo> raw;
  std::unordered_map<std::string, size_t> raw_index;
  std::unordered_map<std::string, std::string> raw_file;
  bool mlx_metadata = false;
  for (const auto& file : files) {
    auto map = MappedFile::open(file);
    File f = parse(map->bytes(), file.string());
    if (f.metadata.is_object()) {
      if (!mf->metadata_.contains("__metadata__")) mf->metadata_["__metadata__"] = f.metadata;
      auto fmt_it = f.metadata.find("format");
      if (fmt_it != f.metadata.end() && *fmt_it == "mlx") mlx_metadata = true;
    }
    for (auto& t : f.tensors) {
      if (raw_index.count(t.name))
        fail("{}: tensor '{}' also appears in {}", file.string(), t.name, raw_file[t.name]);
      if (!weight_map.empty()) {
        auto wm = weight_map.find(t.name);
        if (wm == weight_map.end() || wm->second != file.filename().string())
          fail("{}: tensor '{}' is not mapped to this shard by {}", file.string(), t.name, index_path.string());
      }
      raw_index[t.name] = raw.size();
      raw_file[t.name] = file.string();
      raw.push_back(std::move(t));
    }
    mf->maps_.push_back(std::move(map));
  }
  for (const auto& [name, file] : weight_map)
    if (!raw_index.count(name))
      fail("{}: tensor '{}' listed in weight_map is not in shard '{}'", index_path.string(), name, file);

  // MLX: a module is quantized iff `<path>.scales` exists (mlx-lm's rule).
  std::set<std::string> folded;
  bool any_mlx = false;
  for (const auto& t : raw) {
    if (!ends_with(t.name, ".scales")) continue;
    const std::string module = strip_suffix(t.name, ".scales");
    auto w = raw_index.find(module + ".weight");
    auto b = raw_index.find(module + ".biases");
    const std::string where = raw_file[t.name];
    if (w == raw_index.end()) fail("{}: '{}' has no matching '{}.weight'", where, t.name, module);
    if (b == raw_index.end())
      fail("{}: '{}' has no '{}.biases': only MLX affine quantization is supported (mxfp4/nvfp4 are not)", where,
           t.name, module);
    folded.insert(module);
    any_mlx = true;
  }
  for (const auto& t : raw) {
    std::string module;
    if (ends_with(t.name, ".weight")) module = strip_suffix(t.name, ".weight");
    else if (ends_with(t.name, ".scales")) module = strip_suffix(t.name, ".scales");
    else if (ends_with(t.name, ".biases")) module = strip_suffix(t.name, ".biases");
    if (!module.empty() && folded.count(module)) {
      if (!ends_with(t.name, ".weight")) continue;
      mf->tensors_.push_back(fold_mlx(module, t, raw[raw_index[module + ".scales"]], raw[raw_index[module + ".biases"]],
                                      config, raw_file[t.name]));
    } else {
      mf->tensors_.push_back(t);
    }
    mf->index_[mf->tensors_.back().name] = mf->tensors_.size() - 1;
  }
  mf->maps_.shrink_to_fit();
  // "quantization" is MLX's key; HF's own "quantization_config" alone does not make a file MLX.
  const bool config_quantized = config.is_object() && config.contains("quantization");
  if (any_mlx || mlx_metadata || config_quantized) mf->format_ = "mlx";
  log_debug("{}: opened {} ({} tensors from {} file(s))", path.string(), mf->format_, mf->tensors_.size(), files.size());
  return mf;
}

}  // namespace specula::safetensors
