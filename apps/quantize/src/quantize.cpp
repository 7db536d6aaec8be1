// GGUF quantization with llama.cpp's rules (src/llama-quant.cpp of the release Specula tracks,
// re-derived): which tensors are quantized, which type each gets, the output order and metadata.
#include "specula/quantize.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <charconv>
#include <chrono>
#include <cmath>
#include <exception>
#include <numeric>
#include <optional>
#include <span>
#include <thread>

#include <fmt/format.h>

#include "specula/core/plugin_host.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/quant.hpp"

namespace specula::core {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// llama.cpp's LLAMA_FTYPE_* values of the file types below.
namespace ftype {
constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 7, kQ5_0 = 8, kQ5_1 = 9, kQ4_K_S = 14,
                   kQ4_K_M = 15, kQ5_K_S = 16, kQ5_K_M = 17, kQ6_K = 18, kIQ4_NL = 25, kIQ4_XS = 30, kBF16 = 32;
}
constexpr uint32_t kQuantizationVersion = 2;  // GGML_QNT_VERSION: the block layouts Specula writes

const std::vector<QuantFileType> kFileTypes = {
    {"Q4_0", ftype::kQ4_0, DType::Q4_0, "Q4_0; embeddings Q6_K"},
    {"Q4_1", ftype::kQ4_1, DType::Q4_1, "Q4_1; embeddings Q6_K"},
    {"Q5_0", ftype::kQ5_0, DType::Q5_0, "Q5_0; embeddings Q6_K"},
    {"Q5_1", ftype::kQ5_1, DType::Q5_1, "Q5_1; embeddings Q6_K"},
    {"IQ4_NL", ftype::kIQ4_NL, DType::IQ4_NL,
     "IQ4_NL; Q5_K for attn_v when 4+ query heads share a KV head and for the first 1/8 of ffn_down; "
     "embeddings Q6_K"},
    {"IQ4_XS", ftype::kIQ4_XS, DType::IQ4_XS, "IQ4_XS; the upgrades of IQ4_NL"},
    {"Q4_K_S", ftype::kQ4_K_S, DType::Q4_K,
     "Q4_K; Q5_K for the first 4 attn_v and the first 1/8 of ffn_down; embeddings Q6_K"},
    {"Q4_K_M", ftype::kQ4_K_M, DType::Q4_K,
     "Q4_K; Q6_K for attn_v and ffn_down in the first and last 1/8 of the layers and every third "
     "between; embeddings Q6_K"},
    {"Q4_K", ftype::kQ4_K_M, DType::Q4_K, "llama.cpp's alias of Q4_K_M"},
    {"Q5_K_S", ftype::kQ5_K_S, DType::Q5_K, "Q5_K; embeddings Q6_K"},
    {"Q5_K_M", ftype::kQ5_K_M, DType::Q5_K, "Q5_K; Q6_K for attn_v and ffn_down as in Q4_K_M; embeddings Q6_K"},
    {"Q5_K", ftype::kQ5_K_M, DType::Q5_K, "llama.cpp's alias of Q5_K_M"},
    {"Q6_K", ftype::kQ6_K, DType::Q6_K, "Q6_K"},
    {"Q8_0", ftype::kQ8_0, DType::Q8_0, "Q8_0"},
    {"F16", ftype::kF16, DType::F16, "every 2-D weight F16"},
    {"BF16", ftype::kBF16, DType::BF16, "every 2-D weight BF16"},
    {"F32", ftype::kF32, DType::F32, "every 2-D weight F32"},
};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::toupper(static_cast<unsigned char>(x)) == std::toupper(static_cast<unsigned char>(y));
         });
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

uint32_t block_elems(DType t) { return dtype_traits(t)->block_elems; }

// The layer of a "blk.N.*" name (as llama.cpp's sscanf("blk.%d.") reads it), -1 for the others.
int layer_of(std::string_view name) {
  if (!name.starts_with("blk.")) return -1;
  int layer = -1;
  const char* p = name.data() + 4;
  std::from_chars(p, name.data() + name.size(), layer);
  return layer;
}

// Substrings of the tensors llama.cpp keeps as they are: norms, MoE routers, tiny or positional tables
// of other architectures, multimodal parts.
constexpr std::string_view kKeptAsIs[] = {
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight",
    "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd",
    "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook",
    "mm.a.code_embd"};

// Only weights of two or more dimensions are quantized, and not those above.
bool quantizable(const std::string& name, const std::vector<int64_t>& shape) {
  if (shape.size() < 2 || !name.ends_with("weight")) return false;
  if (name == "position_embd.weight" || name == "token_types.weight") return false;
  return std::none_of(std::begin(kKeptAsIs), std::end(kKeptAsIs), [&](auto s) { return contains(name, s); });
}

// The roles llama.cpp's mix rules look at.
enum class Role { Embedding, Output, AttnV, AttnK, AttnOutput, FfnDown, Other };

Role role_of(const std::string& n) {
  if (n == "output.weight") return Role::Output;
  if (n == "token_embd.weight" || n == "per_layer_token_embd.weight") return Role::Embedding;
  // Fused QKV and MLA's KV projection carry V: the rules treat them as attn_v.
  if (contains(n, "attn_qkv.weight") || contains(n, "attn_kv_b.weight") || contains(n, "attn_v.weight"))
    return Role::AttnV;
  if (contains(n, "attn_k.weight")) return Role::AttnK;
  if (contains(n, "attn_output.weight")) return Role::AttnOutput;
  if (contains(n, "ffn_down")) return Role::FfnDown;
  return Role::Other;
}

// An integer key, or element 0 of a per-layer array; nullopt when absent.
std::optional<int64_t> int_key(const json& md, const std::string& key) {
  const auto it = md.find(key);
  if (it == md.end()) return std::nullopt;
  const json& v = it->is_array() && !it->empty() ? it->front() : *it;
  if (!v.is_number_integer()) return std::nullopt;
  return v.get<int64_t>();
}

// The layer-position rules of the _M mixes: the first and last eighth of the layers and every third
// layer between get more bits.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The state llama.cpp's rules carry from tensor to tensor.
class MixRules {
 public:
  MixRules(const json& md, const std::vector<TensorInfo>& tensors, const QuantFileType& type, std::string source)
      : type_(type), source_(std::move(source)) {
    const auto arch = md.find("general.architecture");
    arch_ = arch != md.end() && arch->is_string() ? arch->get<std::string>() : "";
    n_layer_ = int_key(md, arch_ + ".block_count").value_or(-1);
    n_expert_ = int_key(md, arch_ + ".expert_count").value_or(0);
    const int64_t heads = int_key(md, arch_ + ".attention.head_count").value_or(0);
    const int64_t kv = int_key(md, arch_ + ".attention.head_count_kv").value_or(heads);
    n_gqa_ = kv > 0 ? heads / kv : 0;
    for (const auto& t : tensors) {
      const Role r = role_of(t.name);
      n_attn_v_ += r == Role::AttnV;
      tied_ = tied_ && r != Role::Output;
    }
  }

  DType apply(const std::string& name, int64_t ncols) {
    const uint32_t f = type_.ftype;
    const bool iq4 = f == ftype::kIQ4_NL || f == ftype::kIQ4_XS;
    DType t = type_.base;
    const Role role = role_of(name);
    if (role == Role::Output || (tied_ && role == Role::Embedding)) {
      // The output projection (the token embedding when tied) is the most sensitive tensor.
      if (ncols % block_elems(t) != 0) t = DType::Q8_0;
      else if (t != DType::Q8_0) t = DType::Q6_K;
    } else if (role == Role::AttnV) {
      if (iq4 && n_gqa_ >= 4) t = DType::Q5_K;
      else if ((f == ftype::kQ4_K_M || f == ftype::kQ5_K_M) && use_more_bits(i_attn_v_, n_attn_v_)) t = DType::Q6_K;
      else if (f == ftype::kQ4_K_S && i_attn_v_ < 4) t = DType::Q5_K;
      if (n_expert_ == 8) t = DType::Q8_0;
      ++i_attn_v_;
    } else if (role == Role::AttnK) {
      if (n_expert_ == 8) t = DType::Q8_0;
    } else if (role == Role::AttnOutput) {
      if (n_expert_ == 8 && (f == ftype::kQ4_K_S || f == ftype::kQ4_K_M || iq4)) t = DType::Q5_K;
    } else if (role == Role::FfnDown && (iq4 || f == ftype::kQ4_K_S || f == ftype::kQ4_K_M || f == ftype::kQ5_K_M)) {
      const int n = n_layers(name);
      // Experts of one layer are not consecutive in every file: MoE models take the layer from the name.
      int i = i_ffn_down_;
      if (n_expert_ > 1) {
        i = layer_of(name);
        if (i < 0 || i >= n)
          fail("{}: tensor '{}': cannot tell its layer (expected blk.N. with N < {})", source_, name, n);
      }
      if (f == ftype::kQ4_K_M) {
        if (use_more_bits(i, n)) t = DType::Q6_K;
      } else if (iq4 && i < n / 8) {
        t = DType::Q5_K;
      } else if (f == ftype::kQ5_K_M && use_more_bits(i, n)) {
        t = DType::Q6_K;
      } else if (f == ftype::kQ4_K_S && i < n / 8) {
        t = DType::Q5_K;
      }
      ++i_ffn_down_;
    }
    return t;
  }

 private:
  int n_layers(const std::string& name) const {
    if (n_layer_ <= 0)
      fail("{}: tensor '{}': {} places ffn_down by layer, but the file has no '{}.block_count'", source_, name,
           type_.name, arch_.empty() ? "<general.architecture>" : arch_);
    return static_cast<int>(n_layer_);
  }
  const QuantFileType& type_;
  std::string source_, arch_;
  int64_t n_layer_ = -1, n_expert_ = 0, n_gqa_ = 0;
  int n_attn_v_ = 0, i_attn_v_ = 0, i_ffn_down_ = 0;
  bool tied_ = true;  // no output.weight: the token embedding is the output projection
};

// A type whose blocks do not fit the row length falls back to a 32-value block type of about the
// same precision, and to F16 when even that does not fit.
DType fallback_for(DType t, int64_t ncols) {
  DType f = t;
  switch (t) {
    case DType::IQ4_XS: f = DType::IQ4_NL; break;
    case DType::Q4_K: f = DType::Q5_0; break;
    case DType::Q5_K: f = DType::Q5_1; break;
    case DType::Q6_K: f = DType::Q8_0; break;
    default: break;
  }
  return ncols % block_elems(f) == 0 ? f : DType::F16;
}

bool convertible(DType t) {
  const DTypeTraits* tr = dtype_traits(t);
  return (t == DType::F32 || t == DType::F16 || t == DType::BF16 || tr->quantized) && can_dequantize(t);
}

// Runs f(begin, end) over [0, n) on up to `workers` threads (the caller's included); rethrows the first
// error.
template <typename F>
void parallel_for(int64_t n, unsigned workers, const F& f) {
  workers = static_cast<unsigned>(std::clamp<int64_t>(workers, 1, std::max<int64_t>(n, 1)));
  if (workers == 1) return f(int64_t{0}, n);
  std::vector<std::exception_ptr> errors(workers);
  std::vector<std::thread> threads;
  auto run = [&](unsigned w) {
    try {
      f(n * w / workers, n * (w + 1) / workers);
    } catch (...) {
      errors[w] = std::current_exception();
    }
  };
  for (unsigned w = 1; w < workers; ++w) threads.emplace_back(run, w);
  run(0);
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Drops the pages of an input range that has been consumed from this process's memory: the mapping
// stays valid (the page cache still holds them), but the resident size stays at about one slab.
void release(std::span<const std::byte> range) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(range.data()) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(range.data()) + range.size()) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

constexpr uint64_t kSlabBytes = 32ull << 20;   // rows converted per step, at most about this much
constexpr int64_t kMinThreadElems = 32 * 512;  // smaller pieces are not worth a thread (llama.cpp's chunk)

class Converter {
 public:
  Converter(const QuantizeOptions& o, const std::string& source, uint64_t total, size_t tensors)
      : opt_(o), source_(source), total_(total), tensors_(tensors),
        threads_(o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency())) {}

  void write(size_t index, const TensorPlan& p, const TensorInfo& t, const PutBytes& put) {
    index_ = index;
    name_ = p.name;
    if (p.from == p.to) {
      for (uint64_t at = 0; at < t.data.size(); at += kSlabBytes) {
        const auto piece = t.data.subspan(at, std::min<uint64_t>(kSlabBytes, t.data.size() - at));
        emit(put, piece);
        release(piece);
      }
      return;
    }
    const int64_t ncols = p.shape.back();
    const int64_t rows = t.elements() / ncols;
    const uint64_t in_row = *dtype_row_bytes(p.from, ncols), out_row = *dtype_row_bytes(p.to, ncols);
    const uint64_t widest = std::max({in_row, out_row, static_cast<uint64_t>(ncols) * sizeof(float)});
    const int64_t slab_rows = std::max<int64_t>(1, static_cast<int64_t>(kSlabBytes / widest));
    buffer_.resize(static_cast<size_t>(std::min(slab_rows, rows) * out_row));
    for (int64_t r0 = 0; r0 < rows; r0 += slab_rows) {
      const int64_t n = std::min(slab_rows, rows - r0);
      const unsigned workers = static_cast<unsigned>(std::min<int64_t>(threads_, n * ncols / kMinThreadElems + 1));
      parallel_for(n, workers, [&](int64_t a, int64_t b) {
        std::vector<float> row(static_cast<size_t>(ncols));
        for (int64_t r = a; r < b; ++r) {
          dequantize_row(p.from, t.data.data() + (r0 + r) * in_row, row.data(), ncols);
          for (int64_t c = 0; c < ncols; ++c)
            if (!std::isfinite(row[c]))
              fail("{}: tensor '{}': row {} holds {} at column {}; cannot convert {} to {}", source_, p.name, r0 + r,
                   row[c], c, dtype_name(p.from), dtype_name(p.to));
          quantize_row(p.to, row.data(), buffer_.data() + r * out_row, ncols);
        }
      });
      emit(put, std::span(buffer_.data(), static_cast<size_t>(n * out_row)));
      release(t.data.subspan(r0 * in_row, n * in_row));
    }
  }

 private:
  void emit(const PutBytes& put, std::span<const std::byte> bytes) {
    if (opt_.cancel && opt_.cancel->load()) fail("{}: interrupted", source_);
    put(bytes);
    written_ += bytes.size();
    if (opt_.on_progress) opt_.on_progress({index_ + 1, tensors_, name_, written_, total_});
  }
  const QuantizeOptions& opt_;
  const std::string& source_;
  uint64_t total_, written_ = 0;
  size_t tensors_, index_ = 0;
  unsigned threads_;
  std::string name_;
  std::vector<std::byte> buffer_;
};

}  // namespace

const std::vector<QuantFileType>& quant_file_types() { return kFileTypes; }

const QuantFileType* find_quant_file_type(std::string_view name) {
  for (const auto& t : kFileTypes)
    if (iequals(t.name, name)) return &t;
  uint32_t number = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), number);
  if (ec == std::errc() && end == name.data() + name.size() && !name.empty())
    for (const auto& t : kFileTypes)
      if (t.ftype == number) return &t;
  return nullptr;
}

std::string quant_file_type_names() {
  std::string out;
  for (const auto& t : kFileTypes) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

std::vector<TensorPlan> plan_quantization(const json& metadata, const std::vector<TensorInfo>& tensors,
                                          const QuantFileType& type, bool pure, const std::string& source) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = layer_of(tensors[a].name), lb = layer_of(tensors[b].name);
    return la != lb ? la < lb : tensors[a].name < tensors[b].name;
  });
  MixRules rules(metadata, tensors, type, source);
  const bool quantized_base = dtype_traits(type.base)->quantized;
  std::vector<TensorPlan> plan;
  plan.reserve(tensors.size());
  for (const size_t i : order) {
    const TensorInfo& t = tensors[i];
    TensorPlan p{i, t.name, t.shape, t.type, t.type, false};
    // llama.cpp counts dimensions as ggml_n_dims does: outer dimensions of size 1 do not count.
    while (p.shape.size() > 1 && p.shape.front() == 1) p.shape.erase(p.shape.begin());
    if (quantizable(t.name, p.shape)) {
      p.to = type.base;
      if (quantized_base) {
        if (!pure) p.to = rules.apply(t.name, p.shape.back());
        if (p.shape.back() % block_elems(p.to) != 0) {
          const DType wanted = p.to;
          p.to = fallback_for(wanted, p.shape.back());
          p.fallback = true;
          log_debug("{}: {} rows of {} are not whole {} blocks: {} instead", source, t.name, p.shape.back(),
                    dtype_name(wanted), dtype_name(p.to));
        }
      }
    }
    plan.push_back(std::move(p));
  }
  return plan;
}

std::shared_ptr<const ModelFile> open_quantize_input(const PluginHost& host, const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{}: cannot open: {}", path.string(), std::strerror(ENOENT));
  auto file = host.open_model(path);
  if (file->format() != "gguf" || !file->gguf_metadata())
    fail("{}: a {} checkpoint; quantize reads GGUF files only: convert it to GGUF first (specula convert {} --out "
         "FILE.gguf --outtype f16), then quantize that",
         path.string(), file->format(), path.string());
  if (int_key(file->metadata(), "split.count").value_or(1) > 1)
    fail("{}: one shard of a split model; merge the shards first (llama-gguf-split --merge)", path.string());
  return file;
}

QuantizeStats quantize_gguf(const PluginHost& host, const fs::path& input, const fs::path& output,
                            const QuantizeOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (!options.type) fail("quantize: no type given (one of {})", quant_file_type_names());
  const QuantFileType& type = *options.type;
  const auto file = open_quantize_input(host, input);
  const std::string source = file->path().string();
  const gguf::Metadata& metadata = *file->gguf_metadata();
  const fs::path dir = output.parent_path();
  if (!dir.empty() && !fs::is_directory(dir))
    fail("{}: cannot write: directory '{}' does not exist", output.string(), dir.string());
  std::error_code ec;
  if (fs::equivalent(file->path(), output, ec))
    fail("{}: the output would replace the input; give another output path", output.string());
  const auto writer = host.make_writer("gguf");

  const std::vector<TensorPlan> plan = plan_quantization(file->metadata(), file->tensors(), type, options.pure, source);
  QuantizeStats stats;
  std::map<DType, size_t> requantized_from;
  // The input's keys in order (its general.alignment too, which the writer keeps), less the two llama.cpp
  // re-sets at the end and the split keys (the output is one file).
  gguf::Metadata out_metadata;
  for (const auto& [key, kt] : metadata.keys()) {
    if (key == "general.file_type" || key == "general.quantization_version" || key.starts_with("split.")) continue;
    out_metadata.set(key, kt.type, metadata.values().at(key), kt.elem);
  }
  out_metadata.set_u32("general.quantization_version", kQuantizationVersion);
  out_metadata.set_u32("general.file_type", type.ftype);
  std::vector<TensorSpec> specs;
  specs.reserve(plan.size());
  uint64_t total = 0;
  for (const auto& p : plan) {
    if (p.from != p.to) {
      if (!convertible(p.from))
        fail("{}: tensor '{}': cannot convert {} to {}: only float and block-quantized tensors are converted", source,
             p.name, dtype_name(p.from), dtype_name(p.to));
      ++stats.converted;
      if (dtype_traits(p.from)->quantized) ++requantized_from[p.from];
    }
    const auto row = dtype_row_bytes(p.to, static_cast<uint64_t>(p.shape.back()));
    if (!row) fail("{}: tensor '{}': a row of {} is not whole {} blocks", source, p.name, p.shape.back(), dtype_name(p.to));
    uint64_t bytes = *row;
    for (size_t d = 0; d + 1 < p.shape.size(); ++d) bytes *= static_cast<uint64_t>(p.shape[d]);
    total += bytes;
    specs.push_back({p.name, p.to, p.shape, {}, {}});
    ++stats.type_counts[p.to];
    stats.fallbacks += p.fallback;
  }
  stats.tensors = plan.size();
  for (const auto& [t, n] : requantized_from) stats.requantized += n;
  if (stats.requantized) {
    std::string from;
    for (const auto& [t, n] : requantized_from) from += fmt::format("{}{} {}", from.empty() ? "" : ", ", n, dtype_name(t));
    log_info("{}: requantizing {} already quantized tensors ({}): dequantized, then quantized again (as "
             "llama-quantize --allow-requantize does); the original F16/BF16/F32 file gives better quality",
             source, stats.requantized, from);
  }
  if (stats.fallbacks)
    log_info("{}: {} of {} tensors have rows that are not whole blocks of their type and fall back as llama.cpp's "
             "do (-v lists them)",
             source, stats.fallbacks, plan.size());

  Converter convert(options, source, total, plan.size());
  for (size_t i = 0; i < plan.size(); ++i)
    specs[i].fill = [&, i](const PutBytes& put) {
      const TensorPlan& p = plan[i];
      log_debug("[{}/{}] {}: {} -> {}", i + 1, plan.size(), p.name, dtype_name(p.from), dtype_name(p.to));
      convert.write(i, p, file->tensors()[p.input_index], put);
    };
  writer->write(output, out_metadata, specs);
  stats.input_bytes = fs::file_size(file->path());
  stats.output_bytes = fs::file_size(output);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace specula::core
