// GGUF v3 writer with gguf-py's layout (gemma4-formats-spec §1.3).
#include <cstdint>
#include <cstring>
#include <fstream>

#include "specula/error.hpp"
#include "gguf_io.hpp"

namespace specula::gguf {
namespace {

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

class Out {
 public:
  std::vector<std::byte> bytes;
  template <typename T>
  void put(T v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    bytes.insert(bytes.end(), p, p + s.size());
  }
  void pad_to(uint64_t alignment) { bytes.resize(static_cast<size_t>(align_up(bytes.size(), alignment))); }
};

void put_scalar(Out& o, ValueType t, const nlohmann::json& v) {
  switch (t) {
    case ValueType::UINT8: o.put(v.get<uint8_t>()); return;
    case ValueType::INT8: o.put(v.get<int8_t>()); return;
    case ValueType::UINT16: o.put(v.get<uint16_t>()); return;
    case ValueType::INT16: o.put(v.get<int16_t>()); return;
    case ValueType::UINT32: o.put(v.get<uint32_t>()); return;
    case ValueType::INT32: o.put(v.get<int32_t>()); return;
    case ValueType::FLOAT32: o.put(v.get<float>()); return;
    case ValueType::BOOL: o.put<uint8_t>(v.get<bool>() ? 1 : 0); return;
    case ValueType::STRING: o.put_string(v.get<std::string>()); return;
    case ValueType::UINT64: o.put(v.get<uint64_t>()); return;
    case ValueType::INT64: o.put(v.get<int64_t>()); return;
    case ValueType::FLOAT64: o.put(v.get<double>()); return;
    case ValueType::ARRAY: break;
  }
  fail("gguf writer: nested arrays are not supported");
}

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    fail("gguf writer: alignment {} is not a power of two", alignment);
  if (alignment != kDefaultAlignment) set_u32("general.alignment", alignment);
}

void Writer::copy_metadata(const File& f) {
  for (const auto& [key, kt] : f.keys) set(key, kt.type, f.metadata.at(key), kt.elem);
}

void Writer::copy_metadata(const Metadata& m) {
  for (const auto& [key, kt] : m.keys()) set(key, kt.type, m.values().at(key), kt.elem);
}

uint64_t Writer::checked_bytes(const std::string& name, DType type, const std::vector<int64_t>& shape) const {
  const DTypeTraits* tr = dtype_traits(type);
  if (!tr || static_cast<uint32_t>(type) >= 1000)
    fail("gguf writer: tensor '{}': dtype {} has no GGUF type id", name, dtype_name(type));
  if (shape.empty() || shape.size() > 4) fail("gguf writer: tensor '{}': needs 1..4 dimensions", name);
  for (const auto& t : tensors_)
    if (t.name == name) fail("gguf writer: duplicate tensor '{}'", name);
  uint64_t rows = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) rows *= static_cast<uint64_t>(shape[d]);
  const auto row = dtype_row_bytes(type, static_cast<uint64_t>(shape.back()));
  if (!row) fail("gguf writer: tensor '{}': row of {} is not whole {} blocks", name, shape.back(), tr->name);
  return *row * rows;
}

void Writer::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape,
                        std::span<const std::byte> data) {
  const uint64_t bytes = checked_bytes(name, type, shape);
  if (data.size() != bytes)
    fail("gguf writer: tensor '{}': {} data bytes, {} {} needs {}", name, data.size(), dtype_name(type),
         nlohmann::json(shape).dump(), bytes);
  tensors_.push_back({name, type, shape, bytes, false, std::vector<std::byte>(data.begin(), data.end())});
}

void Writer::declare_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape) {
  const uint64_t bytes = checked_bytes(name, type, shape);
  tensors_.push_back({name, type, shape, bytes, true, {}});
}

std::vector<std::byte> Writer::header() const {
  Out o;
  o.put<uint32_t>(kMagic);
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(kv_.size());
  for (const auto& [key, kt] : kv_.keys()) {
    const nlohmann::json& value = kv_.values().at(key);
    o.put_string(key);
    o.put<uint32_t>(static_cast<uint32_t>(kt.type));
    if (kt.type == ValueType::ARRAY) {
      o.put<uint32_t>(static_cast<uint32_t>(kt.elem));
      o.put<uint64_t>(value.size());
      for (const auto& v : value) put_scalar(o, kt.elem, v);
    } else {
      put_scalar(o, kt.type, value);
    }
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    o.put_string(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) o.put<uint64_t>(static_cast<uint64_t>(t.shape[d]));
    o.put<uint32_t>(static_cast<uint32_t>(t.type));
    o.put<uint64_t>(offset);
    offset += align_up(t.bytes, alignment_);
  }
  o.pad_to(alignment_);
  return std::move(o.bytes);
}

std::vector<std::byte> Writer::serialize() const {
  Out o;
  o.bytes = header();
  for (const auto& t : tensors_) {
    if (t.declared) fail("gguf writer: tensor '{}' was declared for streaming; use write(path, fill)", t.name);
    o.bytes.insert(o.bytes.end(), t.data.begin(), t.data.end());
    o.pad_to(alignment_);
  }
  return std::move(o.bytes);
}

void Writer::write(const std::filesystem::path& path, const Fill& fill) const {
  std::filesystem::path part = path;
  part += ".part";
  std::ofstream out(part, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create file", part.string());
  auto put = [&](std::span<const std::byte> b) {
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  };
  try {
    const auto head = header();
    put(head);
    static constexpr std::byte zeros[64] = {};
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      if (!t.declared) {
        put(t.data);
      } else {
        if (!fill) fail("gguf writer: tensor '{}' was declared but write() got no fill", t.name);
        uint64_t written = 0;
        fill(i, [&](std::span<const std::byte> b) {
          written += b.size();
          if (written > t.bytes) fail("gguf writer: tensor '{}': fill gave more than {} bytes", t.name, t.bytes);
          put(b);
        });
        if (written != t.bytes)
          fail("gguf writer: tensor '{}': fill gave {} bytes, {} expected", t.name, written, t.bytes);
      }
      for (uint64_t pad = align_up(t.bytes, alignment_) - t.bytes; pad > 0;) {
        const uint64_t n = pad < sizeof zeros ? pad : sizeof zeros;
        put(std::span(zeros, static_cast<size_t>(n)));
        pad -= n;
      }
      if (!out) fail("{}: write failed (disk full?)", part.string());
    }
    out.close();
    if (!out) fail("{}: write failed (disk full?)", part.string());
    std::filesystem::rename(part, path);
  } catch (...) {
    out.close();
    std::error_code ec;
    std::filesystem::remove(part, ec);
    throw;
  }
}

void write(const std::filesystem::path& path, const Metadata& metadata, const std::vector<TensorSpec>& tensors) {
  uint32_t alignment = kDefaultAlignment;
  if (const nlohmann::json* a = metadata.find("general.alignment")) {
    const KeyType* kt = metadata.type("general.alignment");
    if (kt->type != ValueType::UINT32)
      fail("{}: key 'general.alignment' has type {}, expected UINT32", path.string(), value_type_name(kt->type));
    alignment = a->get<uint32_t>();
  }
  Writer w(alignment);
  w.copy_metadata(metadata);
  // Held bytes are not copied: every tensor is declared, and the held ones checked here, before the file
  // is created.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    w.declare_tensor(t.name, t.type, t.shape);
    if (!t.fill && t.bytes.size() != w.tensor_bytes(i))
      fail("gguf writer: tensor '{}': {} data bytes, {} {} needs {}", t.name, t.bytes.size(), dtype_name(t.type),
           nlohmann::json(t.shape).dump(), w.tensor_bytes(i));
  }
  w.write(path, [&](size_t index, const PutBytes& put) {
    const TensorSpec& t = tensors[index];
    if (t.fill) t.fill(put);
    else put(t.bytes);
  });
}

}  // namespace specula::gguf
