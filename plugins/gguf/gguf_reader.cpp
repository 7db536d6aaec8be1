// GGUF v3 reader. Hostile files are expected: every read is bounds-checked against the buffer, counts
// are checked against the bytes left before anything is allocated, and every error names the file and
// the field.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <unordered_map>

#include "gguf_io.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/mapped_file.hpp"

namespace specula::gguf {

namespace {

constexpr uint32_t kMaxDims = 4;  // GGML_MAX_DIMS

// Smallest encoded size of one value of `t` (a string is at least its 8-byte length).
uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 12;
  }
  return 1;
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

class Cursor {
 public:
  Cursor(std::span<const std::byte> bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return bytes_.size() - pos_; }

  template <typename T>
  T read(const std::string& field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& field) {
    const uint64_t len = read<uint64_t>(field + " (string length)");
    if (len > left())
      fail("{}: {}: string length {} exceeds the {} bytes left in the file (truncated or corrupt)", name_,
           field, len, left());
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  void need(uint64_t n, const std::string& field) {
    if (n > left())
      fail("{}: truncated at byte {} while reading {} (needs {} bytes, {} left)", name_, pos_, field, n, left());
  }

  std::span<const std::byte> bytes_;
  const std::string& name_;
  uint64_t pos_ = 0;
};

nlohmann::json read_scalar(Cursor& c, ValueType t, const std::string& field) {
  switch (t) {
    case ValueType::UINT8: return c.read<uint8_t>(field);
    case ValueType::INT8: return c.read<int8_t>(field);
    case ValueType::UINT16: return c.read<uint16_t>(field);
    case ValueType::INT16: return c.read<int16_t>(field);
    case ValueType::UINT32: return c.read<uint32_t>(field);
    case ValueType::INT32: return c.read<int32_t>(field);
    case ValueType::FLOAT32: return c.read<float>(field);
    case ValueType::BOOL: return c.read<uint8_t>(field) != 0;
    case ValueType::STRING: return c.read_string(field);
    case ValueType::UINT64: return c.read<uint64_t>(field);
    case ValueType::INT64: return c.read<int64_t>(field);
    case ValueType::FLOAT64: return c.read<double>(field);
    case ValueType::ARRAY: break;
  }
  fail("internal: read_scalar on ARRAY");
}

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

File parse(std::span<const std::byte> bytes, const std::string& name) {
  Cursor c(bytes, name);
  File f;
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) {
    char m[5] = {};
    std::memcpy(m, &magic, 4);
    for (char& ch : m)
      if (ch && (ch < 32 || ch > 126)) ch = '?';
    fail("{}: not a GGUF file: magic is \"{}\" (0x{:08x}), expected \"GGUF\"", name, m, magic);
  }
  f.version = c.read<uint32_t>("version");
  if (f.version != 2 && f.version != 3)
    fail("{}: GGUF version {} is not supported (expected 3; 2 is read as 3){}", name, f.version,
         (f.version & 0xFFFF) == 0 ? " — this looks like a big-endian file" : "");
  const uint64_t n_tensors = c.read<uint64_t>("tensor_count");
  const uint64_t n_kv = c.read<uint64_t>("kv_count");
  // Each record takes at least 12 (KV) or 24 (tensor info) bytes: refuse absurd counts before allocating.
  if (n_kv > c.left() / 12)
    fail("{}: kv_count {} cannot fit in the {} bytes left in the file", name, n_kv, c.left());

  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string where = fmt::format("key/value record {}", i);
    std::string key = c.read_string(where + " key");
    if (key.empty()) fail("{}: {}: empty key", name, where);
    if (f.metadata.contains(key)) fail("{}: duplicate key '{}' ({})", name, key, where);
    const uint32_t raw_type = c.read<uint32_t>("type of key '" + key + "'");
    if (!known_value_type(raw_type))
      fail("{}: key '{}': unknown value type {} (expected 0..12)", name, key, raw_type);
    KeyType kt{static_cast<ValueType>(raw_type), ValueType::UINT8};
    const std::string field = "value of key '" + key + "'";
    nlohmann::json value;
    if (kt.type == ValueType::ARRAY) {
      const uint32_t raw_elem = c.read<uint32_t>("element type of array '" + key + "'");
      if (!known_value_type(raw_elem))
        fail("{}: key '{}': unknown array element type {} (expected 0..12)", name, key, raw_elem);
      kt.elem = static_cast<ValueType>(raw_elem);
      if (kt.elem == ValueType::ARRAY) fail("{}: key '{}': nested arrays are not supported", name, key);
      const uint64_t count = c.read<uint64_t>("element count of array '" + key + "'");
      if (count > c.left() / min_value_bytes(kt.elem))
        fail("{}: key '{}': array of {} {} values cannot fit in the {} bytes left in the file", name, key,
             count, value_type_name(kt.elem), c.left());
      value = nlohmann::json::array();
      value.get_ref<nlohmann::json::array_t&>().reserve(static_cast<size_t>(count));
      for (uint64_t j = 0; j < count; ++j) value.push_back(read_scalar(c, kt.elem, field));
    } else {
      value = read_scalar(c, kt.type, field);
    }
    f.metadata[key] = std::move(value);
    f.keys.emplace_back(std::move(key), kt);
  }

  if (f.metadata.contains("general.alignment")) {
    const auto it = std::find_if(f.keys.begin(), f.keys.end(),
                                 [](const auto& k) { return k.first == "general.alignment"; });
    if (it->second.type != ValueType::UINT32)
      fail("{}: key 'general.alignment' has type {}, expected UINT32", name, value_type_name(it->second.type));
    f.alignment = f.metadata["general.alignment"].get<uint64_t>();
    if (!is_power_of_two(f.alignment))
      fail("{}: key 'general.alignment' = {} is not a power of two", name, f.alignment);
  }

  if (n_tensors > c.left() / 24)
    fail("{}: tensor_count {} cannot fit in the {} bytes left in the file", name, n_tensors, c.left());
  struct Raw {
    uint64_t offset;
    uint64_t nbytes;
  };
  std::vector<Raw> raw;
  raw.reserve(static_cast<size_t>(n_tensors));
  f.tensors.reserve(static_cast<size_t>(n_tensors));
  std::unordered_map<std::string, size_t> seen;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = c.read_string(fmt::format("name of tensor {}", i));
    const std::string what = fmt::format("tensor {} ('{}')", i, t.name);
    if (t.name.empty()) fail("{}: {}: empty tensor name", name, what);
    if (!seen.emplace(t.name, i).second)
      fail("{}: {}: duplicate tensor name (first used by tensor {})", name, what, seen[t.name]);
    const uint32_t n_dims = c.read<uint32_t>(what + " n_dims");
    if (n_dims > kMaxDims) fail("{}: {}: n_dims = {}, expected at most {}", name, what, n_dims, kMaxDims);
    uint64_t ne[kMaxDims] = {1, 1, 1, 1};
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ne[d] = c.read<uint64_t>(fmt::format("{} ne[{}]", what, d));
      if (ne[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("{}: {}: ne[{}] = {} is negative or too large", name, what, d, ne[d]);
      // Zero-sized dims included: the product of the others must fit too (TensorInfo::elements()
      // multiplies in any order).
      if (ne[d] != 0 && elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / ne[d])
        fail("{}: {}: element count overflows int64 (ne[{}] = {})", name, what, d, ne[d]);
      if (ne[d] != 0) elements *= ne[d];
    }
    const uint32_t raw_type = c.read<uint32_t>(what + " type");
    const DTypeTraits* tr = dtype_traits_from_ggml(raw_type);
    if (!tr) fail("{}: {}: unknown or unsupported ggml type id {}", name, what, raw_type);
    t.type = tr->type;
    if (ne[0] % tr->block_elems != 0)
      fail("{}: {}: ne[0] = {} is not a multiple of the {} block size {}", name, what, ne[0], tr->name,
           tr->block_elems);
    const uint64_t offset = c.read<uint64_t>(what + " offset");
    if (offset % f.alignment != 0)
      fail("{}: {}: offset {} is not a multiple of the alignment {}", name, what, offset, f.alignment);
    // nbytes = row bytes * rows, each step overflow-checked.
    uint64_t nbytes = *dtype_row_bytes(t.type, ne[0]);
    for (uint32_t d = 1; d < kMaxDims; ++d) {
      if (ne[d] != 0 && nbytes > std::numeric_limits<uint64_t>::max() / ne[d])
        fail("{}: {}: byte size overflows", name, what);
      nbytes *= ne[d];
    }
    for (uint32_t d = n_dims; d-- > 0;) t.shape.push_back(static_cast<int64_t>(ne[d]));
    raw.push_back({offset, nbytes});
    f.tensors.push_back(std::move(t));
  }

  const uint64_t pos = c.pos();
  f.data_offset = (pos + f.alignment - 1) / f.alignment * f.alignment;
  if (f.data_offset < pos) fail("{}: data section offset overflows", name);
  const uint64_t size = bytes.size();
  for (size_t i = 0; i < raw.size(); ++i) {
    const uint64_t avail = size > f.data_offset ? size - f.data_offset : 0;
    if (raw[i].offset > avail || raw[i].nbytes > avail - raw[i].offset)
      fail("{}: tensor {} ('{}'): data [{}, {}) of the data section (starting at byte {}) runs past the end "
           "of the file ({} bytes) — truncated file or bad offset",
           name, i, f.tensors[i].name, raw[i].offset, raw[i].offset + raw[i].nbytes, f.data_offset, size);
    f.tensors[i].data = bytes.subspan(static_cast<size_t>(f.data_offset + raw[i].offset),
                                      static_cast<size_t>(raw[i].nbytes));
  }
  // No two tensors may share bytes.
  std::vector<size_t> order(raw.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return raw[a].offset < raw[b].offset; });
  size_t prev = SIZE_MAX;
  for (size_t i : order) {
    if (raw[i].nbytes == 0) continue;
    if (prev != SIZE_MAX && raw[prev].offset + raw[prev].nbytes > raw[i].offset)
      fail("{}: tensor '{}' (offset {}, {} bytes) overlaps tensor '{}' (offset {}, {} bytes)", name,
           f.tensors[i].name, raw[i].offset, raw[i].nbytes, f.tensors[prev].name, raw[prev].offset,
           raw[prev].nbytes);
    prev = i;
  }
  return f;
}

bool has_magic(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char m[4] = {};
  return in.read(m, 4) && std::memcmp(m, "GGUF", 4) == 0;
}

namespace {

class GgufModelFile final : public ModelFile {
 public:
  std::string format() const override { return "gguf"; }
  std::filesystem::path path() const override { return path_; }
  const nlohmann::json& metadata() const override { return metadata_.values(); }
  const Metadata* gguf_metadata() const override { return &metadata_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(const std::string& name) const override {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }

  std::filesystem::path path_;
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<std::shared_ptr<const MappedFile>> maps_;
};

// `stem-00002-of-00005.gguf` -> (stem, 2, 5).
bool split_name(const std::filesystem::path& p, std::string* stem, int* no, int* count) {
  static const std::regex re(R"((.*)-(\d{5})-of-(\d{5})\.gguf)");
  std::smatch m;
  const std::string file = p.filename().string();
  if (!std::regex_match(file, m, re)) return false;
  *stem = m[1].str();
  *no = std::stoi(m[2].str());
  *count = std::stoi(m[3].str());
  return *no >= 1 && *count >= 1 && *no <= *count;
}

int64_t int_key(const nlohmann::json& md, const char* key, int64_t fallback) {
  auto it = md.find(key);
  return it != md.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

}  // namespace

std::unique_ptr<ModelFile> open(const std::filesystem::path& path) {
  auto mf = std::make_unique<GgufModelFile>();
  mf->path_ = path;
  std::vector<std::filesystem::path> shards{path};
  std::string stem;
  int no = 0, count = 0;
  if (split_name(path, &stem, &no, &count) && count > 1) {
    shards.clear();
    for (int i = 1; i <= count; ++i) {
      auto shard = path.parent_path() / fmt::format("{}-{:05d}-of-{:05d}.gguf", stem, i, count);
      if (!std::filesystem::exists(shard))
        fail("{}: split GGUF shard {} of {} is missing: {}", path.string(), i, count, shard.string());
      shards.push_back(shard);
    }
    mf->path_ = shards.front();
  }
  int64_t declared_total = -1;
  for (size_t s = 0; s < shards.size(); ++s) {
    auto map = MappedFile::open(shards[s]);
    File f = parse(map->bytes(), shards[s].string());
    if (shards.size() > 1) {
      const int64_t sno = int_key(f.metadata, "split.no", static_cast<int64_t>(s));
      const int64_t scount = int_key(f.metadata, "split.count", static_cast<int64_t>(shards.size()));
      if (sno != static_cast<int64_t>(s) || scount != static_cast<int64_t>(shards.size()))
        fail("{}: key 'split.no' = {} / 'split.count' = {} do not match the file name (shard {} of {})",
             shards[s].string(), sno, scount, s + 1, shards.size());
      if (s == 0) declared_total = int_key(f.metadata, "split.tensors.count", -1);
    }
    if (s == 0) mf->metadata_ = Metadata::adopt(std::move(f.metadata), std::move(f.keys));
    for (auto& t : f.tensors) {
      if (mf->index_.count(t.name))
        fail("{}: tensor '{}' also appears in an earlier shard", shards[s].string(), t.name);
      mf->index_.emplace(t.name, mf->tensors_.size());
      mf->tensors_.push_back(std::move(t));
    }
    mf->maps_.push_back(std::move(map));
  }
  if (declared_total >= 0 && declared_total != static_cast<int64_t>(mf->tensors_.size()))
    fail("{}: key 'split.tensors.count' = {} but the {} shards hold {} tensors", mf->path_.string(),
         declared_total, shards.size(), mf->tensors_.size());
  log_debug("gguf: opened {} ({} tensors, {} keys, {} file(s))", mf->path_.string(), mf->tensors_.size(),
            mf->metadata_.size(), shards.size());
  return mf;
}

}  // namespace specula::gguf
