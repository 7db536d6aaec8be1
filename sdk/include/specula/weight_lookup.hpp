// Finding a model's or a drafter's tensors in its file, whatever the layout (GGUF, Hugging Face
// safetensors, MLX): the plugin names each tensor as GGUF does and says which names it may have in the
// file; the lookup tries them in order, checks the shape the configuration needs and loads the tensor.
// A missing or misshaped tensor is an error naming the file, the tensor and the shape.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "specula/compute.hpp"
#include "specula/model_file.hpp"

namespace specula {

class WeightLookup {
 public:
  // The names a tensor (given by its GGUF name) may have in the file, in the order they are tried.
  using Names = std::function<std::vector<std::string>(const std::string& gguf_name)>;
  // `whose` ("model", "drafter") is what the errors say needs the tensor. Without a backend every
  // tensor is looked up and checked, none loaded (need() and optional() return null).
  WeightLookup(const ModelFile& file, ComputeBackend* backend, Names names, std::string whose);

  std::vector<std::string> names(const std::string& gguf_name) const { return names_(gguf_name); }
  // The file's tensor, or null; `shown` receives the name as the file spells it (the first candidate
  // when there is none).
  const TensorInfo* find(const std::string& gguf_name, std::string* shown = nullptr) const;
  // The file's tensor, checked to have `shape`.
  const TensorInfo& info(const std::string& gguf_name, const Shape& shape) const;
  BackendTensorPtr need(const std::string& gguf_name, const Shape& shape);
  // Null when the file has no such tensor; checked and loaded like need() when it has.
  BackendTensorPtr optional(const std::string& gguf_name, const Shape& shape);

 private:
  const ModelFile& file_;
  ComputeBackend* backend_;
  Names names_;
  std::string whose_;
};

}  // namespace specula
