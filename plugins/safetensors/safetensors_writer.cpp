// Safetensors writer (fixtures and tests): the Rust/PyTorch layout or MLX's, plus MLX-quantized modules.
#include <algorithm>
#include <cstring>
#include <fstream>

#include "safetensors_io.hpp"
#include "specula/error.hpp"
#include "specula/quant.hpp"

namespace specula::safetensors {

void Writer::add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape,
                        std::span<const std::byte> data) {
  dtype_to_string(type);  // throws for a type safetensors cannot hold
  if (name == "__metadata__") fail("safetensors writer: '__metadata__' is not a tensor name");
  for (const auto& t : tensors_)
    if (t.name == name) fail("safetensors writer: duplicate tensor '{}'", name);
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  if (data.size() != n * dtype_traits(type)->block_bytes)
    fail("safetensors writer: tensor '{}': {} bytes given, {} {} needs {}", name, data.size(), dtype_name(type),
         nlohmann::json(shape).dump(), n * dtype_traits(type)->block_bytes);
  tensors_.push_back({name, type, shape, std::vector<std::byte>(data.begin(), data.end())});
}

void Writer::add_mlx_quantized(const std::string& module, const std::vector<int64_t>& shape, const float* w,
                               uint32_t bits, uint32_t group_size, DType scale_type) {
  if (shape.empty()) fail("safetensors writer: module '{}': empty shape", module);
  const int64_t k = shape.back();
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
  const MlxRowParams p{bits, group_size, scale_type};
  const size_t packed_row = static_cast<size_t>(k) * bits / 8;
  const size_t scale_row = static_cast<size_t>(k / group_size) * dtype_traits(scale_type)->block_bytes;
  std::vector<std::byte> packed(rows * packed_row), scales(rows * scale_row), biases(rows * scale_row);
  for (int64_t r = 0; r < rows; ++r)
    mlx_quantize_row(p, w + r * k, k, packed.data() + r * packed_row, scales.data() + r * scale_row,
                     biases.data() + r * scale_row);
  std::vector<int64_t> wshape = shape, sshape = shape;
  wshape.back() = k * bits / 32;
  sshape.back() = k / group_size;
  add_tensor(module + ".weight", DType::U32, wshape, packed);
  add_tensor(module + ".scales", scale_type, sshape, scales);
  add_tensor(module + ".biases", scale_type, sshape, biases);
}

uint64_t Writer::data_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.data.size();
  return n;
}

std::vector<std::string> Writer::names() const {
  std::vector<std::string> out;
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

std::vector<std::byte> Writer::serialize() const {
  std::vector<const Tensor*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  if (style_ == Style::Rust) {
    std::stable_sort(order.begin(), order.end(), [](const Tensor* a, const Tensor* b) {
      const uint32_t sa = dtype_traits(a->type)->block_bytes, sb = dtype_traits(b->type)->block_bytes;
      return sa != sb ? sa > sb : a->name < b->name;
    });
  } else {
    std::stable_sort(order.begin(), order.end(), [](const Tensor* a, const Tensor* b) { return a->name < b->name; });
  }
  // nlohmann's object is sorted by key; to keep the Rust order in the text, build the JSON by hand.
  std::string header = "{";
  if (!metadata_.empty()) header += "\"__metadata__\":" + metadata_.dump() + ",";
  uint64_t offset = 0;
  for (const Tensor* t : order) {
    header += nlohmann::json(t->name).dump() + ":{\"dtype\":\"" + std::string(dtype_to_string(t->type)) +
              "\",\"shape\":" + nlohmann::json(t->shape).dump() + ",\"data_offsets\":[" + std::to_string(offset) +
              "," + std::to_string(offset + t->data.size()) + "]},";
    offset += t->data.size();
  }
  if (header.back() == ',') header.pop_back();
  header += "}";
  if (style_ == Style::Rust) header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + header.size());
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (const Tensor* t : order) out.insert(out.end(), t->data.begin(), t->data.end());
  return out;
}

void Writer::write(const std::filesystem::path& path) const {
  const auto bytes = serialize();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create file", path.string());
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) fail("{}: write failed", path.string());
}

void write_index(const std::filesystem::path& dir, const std::vector<std::pair<std::string, const Writer*>>& shards) {
  nlohmann::json index;
  uint64_t total = 0;
  index["weight_map"] = nlohmann::json::object();
  for (const auto& [file, w] : shards) {
    total += w->data_bytes();
    for (const auto& n : w->names()) index["weight_map"][n] = file;
  }
  index["metadata"] = {{"total_size", total}};
  std::ofstream out(dir / "model.safetensors.index.json");
  if (!out) fail("{}: cannot create model.safetensors.index.json", dir.string());
  out << index.dump(2) << "\n";
}

}  // namespace specula::safetensors
