// Graph builder: records nodes and infers their shapes and types, rejecting a wrong model while the
// graph is built (not while it runs), with a message naming the op, the node and the shapes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>

#include "specula/compute.hpp"
#include "specula/error.hpp"

namespace specula {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::Input: return "Input";
    case Op::Constant: return "Constant";
    case Op::GetRows: return "GetRows";
    case Op::MatMul: return "MatMul";
    case Op::MatMulId: return "MatMulId";
    case Op::Add: return "Add";
    case Op::Mul: return "Mul";
    case Op::Scale: return "Scale";
    case Op::RmsNorm: return "RmsNorm";
    case Op::GeluTanh: return "GeluTanh";
    case Op::Softcap: return "Softcap";
    case Op::Rope: return "Rope";
    case Op::Attention: return "Attention";
    case Op::Softmax: return "Softmax";
    case Op::TopK: return "TopK";
    case Op::Argmax: return "Argmax";
    case Op::Reshape: return "Reshape";
    case Op::Slice: return "Slice";
    case Op::Concat: return "Concat";
    case Op::WriteRows: return "WriteRows";
    case Op::Copy: return "Copy";
    case Op::Div: return "Div";
    case Op::Clamp: return "Clamp";
    case Op::Scatter: return "Scatter";
    case Op::TopPDraw: return "TopPDraw";
    case Op::AcceptDrafts: return "AcceptDrafts";
  }
  return "unknown op";
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

namespace {

int64_t elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

bool is_float_storage(DType t) {
  const DTypeTraits* tr = dtype_traits(t);
  if (!tr) return false;
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || tr->quantized;
}

bool is_plain_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Describes an operand for an error message: 'name' F32 [2, 3].
std::string describe(const Node& n) {
  return fmt::format("'{}' {} {}", n.name, dtype_name(n.type), shape_str(n.shape));
}

}  // namespace

const Node& Graph::node(Value v) const {
  if (v.id < 0 || static_cast<size_t>(v.id) >= nodes_.size())
    fail("graph: value #{} is not a node of this graph ({} nodes)", v.id, nodes_.size());
  return nodes_[static_cast<size_t>(v.id)];
}

Value Graph::push(Node n) {
  if (nodes_.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail("graph: too many nodes");
  for (int64_t d : n.shape)
    if (d <= 0)
      fail("graph: {} '{}' would have shape {}; every axis must be positive", op_name(n.op),
           n.name, shape_str(n.shape));
  if (n.name.empty()) n.name = fmt::format("{}#{}", op_name(n.op), nodes_.size());
  nodes_.push_back(std::move(n));
  return Value{static_cast<int32_t>(nodes_.size() - 1)};
}

Value Graph::named(Value v, std::string name) {
  node(v);
  nodes_[static_cast<size_t>(v.id)].name = std::move(name);
  return v;
}

namespace {

// Shared checks with uniform messages. `what` names the new node's op.
struct Checker {
  const Graph& g;
  Op op;
  std::string node_name;  // name the new node will get

  [[noreturn]] void error(const std::string& what) const {
    fail("graph: {} '{}': {}", op_name(op), node_name, what);
  }
  const Node& get(Value v, const char* role) const {
    if (!v) error(fmt::format("operand '{}' is missing", role));
    return g.node(v);
  }
  void rank(const Node& n, const char* role, size_t lo, size_t hi) const {
    if (n.shape.size() < lo || n.shape.size() > hi)
      error(fmt::format("{} {} must have {} axes", role, describe(n),
                        lo == hi ? fmt::format("{}", lo) : fmt::format("{} to {}", lo, hi)));
  }
  // The draw's parameters (TopPDraw, AcceptDrafts).
  void sampling(float temperature, float top_p, float min_p) const {
    if (!(temperature > 0.0f) || !std::isfinite(temperature))
      error(fmt::format("temperature {} must be a finite number > 0", temperature));
    if (!(top_p > 0.0f && top_p <= 1.0f)) error(fmt::format("top_p {} must be in (0, 1]", top_p));
    if (!(min_p >= 0.0f && min_p <= 1.0f)) error(fmt::format("min_p {} must be in [0, 1]", min_p));
  }
  void type_i32(const Node& n, const char* role) const {
    if (n.type != DType::I32) error(fmt::format("{} {} must be I32", role, describe(n)));
  }
  void type_float(const Node& n, const char* role) const {
    if (!is_float_storage(n.type))
      error(fmt::format("{} {} must hold floating-point values", role, describe(n)));
  }
};

}  // namespace

Value Graph::input(DType type, Shape shape, std::string name) {
  if (!dtype_traits(type)) fail("graph: Input '{}': unknown dtype {}", name, static_cast<uint32_t>(type));
  if (dtype_traits(type)->quantized || type == DType::MLX_AFFINE)
    fail("graph: Input '{}': inputs hold plain values, not {}", name, dtype_name(type));
  if (shape.empty()) fail("graph: Input '{}': shape must have at least one axis", name);
  Node n;
  n.op = Op::Input;
  n.type = type;
  n.shape = std::move(shape);
  n.name = std::move(name);
  return push(std::move(n));
}

Value Graph::constant(const BackendTensorPtr& t) {
  if (!t) fail("graph: Constant: null tensor");
  // One node per tensor, so that reads after a WriteRows see the same storage by construction.
  if (auto it = constants_.find(t.get()); it != constants_.end()) return Value{it->second};
  Node n;
  n.op = Op::Constant;
  n.type = t->type();
  n.shape = t->shape();
  n.tensor = t;
  n.name = t->name();
  if (n.shape.empty()) fail("graph: Constant '{}': tensor has no shape", n.name);
  Value v = push(std::move(n));
  constants_.emplace(t.get(), v.id);
  return v;
}

Value Graph::get_rows(Value table, Value ids) {
  Checker c{*this, Op::GetRows, fmt::format("GetRows#{}", nodes_.size())};
  const Node& t = c.get(table, "table");
  const Node& id = c.get(ids, "ids");
  c.rank(t, "table", 2, 2);
  if (t.type != DType::I32) c.type_float(t, "table");
  c.type_i32(id, "ids");
  Node n;
  n.op = Op::GetRows;
  n.type = t.type == DType::I32 ? DType::I32 : DType::F32;
  n.shape = id.shape;
  n.shape.push_back(t.shape[1]);
  n.src = {table.id, ids.id, -1, -1, -1, -1};
  return push(std::move(n));
}

Value Graph::matmul(Value weight, Value x) {
  Checker c{*this, Op::MatMul, fmt::format("MatMul#{}", nodes_.size())};
  const Node& w = c.get(weight, "weight");
  const Node& a = c.get(x, "x");
  c.rank(w, "weight", 2, 2);
  c.type_float(w, "weight");
  c.type_float(a, "x");
  if (a.shape.back() != w.shape[1])
    c.error(fmt::format("x {} has {} features but weight {} is [out, in] with in = {}", describe(a),
                        a.shape.back(), describe(w), w.shape[1]));
  Node n;
  n.op = Op::MatMul;
  n.shape = a.shape;
  n.shape.back() = w.shape[0];
  n.src = {weight.id, x.id, -1, -1, -1, -1};
  return push(std::move(n));
}

Value Graph::matmul_id(Value experts, Value x, Value ids) {
  Checker c{*this, Op::MatMulId, fmt::format("MatMulId#{}", nodes_.size())};
  const Node& e = c.get(experts, "experts");
  const Node& a = c.get(x, "x");
  const Node& id = c.get(ids, "ids");
  c.rank(e, "experts", 3, 3);
  c.type_float(e, "experts");
  c.rank(a, "x", 3, 3);
  c.type_float(a, "x");
  c.rank(id, "ids", 2, 2);
  c.type_i32(id, "ids");
  if (a.shape[2] != e.shape[2])
    c.error(fmt::format("x {} has {} features but experts {} are [E, out, in] with in = {}",
                        describe(a), a.shape[2], describe(e), e.shape[2]));
  if (a.shape[0] != id.shape[0] || (a.shape[1] != id.shape[1] && a.shape[1] != 1))
    c.error(fmt::format("x {} must be [N, K, in] or [N, 1, in] for ids {} [N, K]", describe(a),
                        describe(id)));
  Node n;
  n.op = Op::MatMulId;
  n.shape = {id.shape[0], id.shape[1], e.shape[1]};
  n.src = {experts.id, x.id, ids.id, -1, -1, -1};
  return push(std::move(n));
}

namespace {
Node binary(const Graph& g, Op op, Value a, Value b, size_t index) {
  Checker c{g, op, fmt::format("{}#{}", op_name(op), index)};
  const Node& x = c.get(a, "a");
  const Node& y = c.get(b, "b");
  c.type_float(x, "a");
  c.type_float(y, "b");
  bool ok = y.shape.size() <= x.shape.size();
  for (size_t k = 0; ok && k < y.shape.size(); ++k) {
    int64_t dy = y.shape[y.shape.size() - 1 - k], dx = x.shape[x.shape.size() - 1 - k];
    ok = dy == dx || dy == 1;
  }
  if (!ok)
    c.error(fmt::format("b {} does not broadcast against a {}: b's axes, right-aligned, must each "
                        "equal a's or be 1",
                        describe(y), describe(x)));
  Node n;
  n.op = op;
  n.shape = x.shape;
  n.src = {a.id, b.id, -1, -1, -1, -1};
  n.name = c.node_name;
  return n;
}

Node unary(const Graph& g, Op op, Value a, size_t index) {
  Checker c{g, op, fmt::format("{}#{}", op_name(op), index)};
  const Node& x = c.get(a, "x");
  c.type_float(x, "x");
  Node n;
  n.op = op;
  n.shape = x.shape;
  n.src = {a.id, -1, -1, -1, -1, -1};
  n.name = c.node_name;
  return n;
}
}  // namespace

Value Graph::add(Value a, Value b) { return push(binary(*this, Op::Add, a, b, nodes_.size())); }
Value Graph::mul(Value a, Value b) { return push(binary(*this, Op::Mul, a, b, nodes_.size())); }

Value Graph::scale(Value a, float s) {
  Node n = unary(*this, Op::Scale, a, nodes_.size());
  n.f[0] = s;
  return push(std::move(n));
}

Value Graph::rms_norm(Value x, Value weight, float eps) {
  Node n = unary(*this, Op::RmsNorm, x, nodes_.size());
  Checker c{*this, Op::RmsNorm, fmt::format("RmsNorm#{}", nodes_.size())};
  if (!(eps >= 0.0f)) c.error(fmt::format("eps {} must be >= 0", eps));
  if (weight) {
    const Node& w = c.get(weight, "weight");
    c.type_float(w, "weight");
    if (elements(w.shape) != n.shape.back())
      c.error(fmt::format("weight {} must have {} elements, one per feature of x {}", describe(w),
                          n.shape.back(), describe(node(x))));
    n.src[1] = weight.id;
  }
  n.f[0] = eps;
  return push(std::move(n));
}

Value Graph::gelu_tanh(Value x) { return push(unary(*this, Op::GeluTanh, x, nodes_.size())); }

Value Graph::softcap(Value x, float cap) {
  Node n = unary(*this, Op::Softcap, x, nodes_.size());
  if (!(cap > 0.0f)) fail("graph: Softcap '{}': cap {} must be > 0", n.name, cap);
  n.f[0] = cap;
  return push(std::move(n));
}

Value Graph::rope(Value x, Value positions, int64_t rotated_pairs, float theta,
                  float exponent_divisor, float freq_scale) {
  Checker c{*this, Op::Rope, fmt::format("Rope#{}", nodes_.size())};
  const Node& a = c.get(x, "x");
  const Node& p = c.get(positions, "positions");
  c.rank(a, "x", 3, 3);
  c.type_float(a, "x");
  c.rank(p, "positions", 1, 1);
  c.type_i32(p, "positions");
  if (p.shape[0] != a.shape[0])
    c.error(fmt::format("positions {} must have one entry per token of x {} [T, H, D]", describe(p),
                        describe(a)));
  if (a.shape[2] % 2 != 0)
    c.error(fmt::format("head dim of x {} must be even (NeoX halves)", describe(a)));
  if (rotated_pairs < 0 || rotated_pairs > a.shape[2] / 2)
    c.error(fmt::format("rotated_pairs {} must be in [0, D/2 = {}] for x {}", rotated_pairs,
                        a.shape[2] / 2, describe(a)));
  if (!(theta > 0.0f) || !(exponent_divisor > 0.0f) || !(freq_scale > 0.0f))
    c.error(fmt::format("theta {}, exponent divisor {} and freq scale {} must all be > 0", theta,
                        exponent_divisor, freq_scale));
  Node n;
  n.op = Op::Rope;
  n.shape = a.shape;
  n.src = {x.id, positions.id, -1, -1, -1, -1};
  n.i[0] = rotated_pairs;
  n.f = {theta, exponent_divisor, freq_scale, 0.0f};
  return push(std::move(n));
}

Value Graph::attention(Value q, Value k, Value v, Value key_pos, Value query_pos, float scale,
                       int64_t window, bool causal, Value slots_in_use) {
  Checker c{*this, Op::Attention, fmt::format("Attention#{}", nodes_.size())};
  const Node& qn = c.get(q, "q");
  const Node& kn = c.get(k, "k");
  const Node& vn = c.get(v, "v");
  const Node& kp = c.get(key_pos, "key positions");
  const Node& qp = c.get(query_pos, "query positions");
  c.rank(qn, "q", 3, 3);
  c.rank(kn, "k", 3, 3);
  c.rank(vn, "v", 3, 3);
  c.rank(kp, "key positions", 1, 1);
  c.rank(qp, "query positions", 1, 1);
  c.type_float(qn, "q");
  for (const Node* n : {&kn, &vn})
    if (!is_plain_float(n->type))
      c.error(fmt::format("k and v must be F32, F16 or BF16; got {}", describe(*n)));
  c.type_i32(kp, "key positions");
  c.type_i32(qp, "query positions");
  const int64_t T = qn.shape[0], Hq = qn.shape[1], D = qn.shape[2];
  const int64_t S = kn.shape[0], Hkv = kn.shape[1];
  if (kn.shape[2] != D)
    c.error(fmt::format("k {} must have head dim {} like q {}", describe(kn), D, describe(qn)));
  if (vn.shape[0] != S || vn.shape[1] != Hkv)
    c.error(fmt::format("v {} must be [S = {}, Hkv = {}, Dv] like k {}", describe(vn), S, Hkv,
                        describe(kn)));
  if (Hq % Hkv != 0)
    c.error(fmt::format("query heads {} (q {}) must be a multiple of KV heads {} (k {})", Hq,
                        describe(qn), Hkv, describe(kn)));
  if (kp.shape[0] != S)
    c.error(fmt::format("key positions {} must have one entry per slot of k {}", describe(kp),
                        describe(kn)));
  if (qp.shape[0] != T)
    c.error(fmt::format("query positions {} must have one entry per token of q {}", describe(qp),
                        describe(qn)));
  if (window < 0) c.error(fmt::format("window {} must be >= 0 (0 = none)", window));
  if (slots_in_use) {
    const Node& live = c.get(slots_in_use, "slots in use");
    c.type_i32(live, "slots in use");
    if (live.shape != Shape{1}) c.error(fmt::format("slots in use {} must be I32 [1]", describe(live)));
  }
  Node n;
  n.op = Op::Attention;
  n.shape = {T, Hq * vn.shape[2]};
  n.src = {q.id, k.id, v.id, key_pos.id, query_pos.id, slots_in_use.id};
  n.i[0] = window;
  n.i[1] = causal ? 1 : 0;
  n.f[0] = scale;
  return push(std::move(n));
}

Value Graph::softmax(Value x) { return push(unary(*this, Op::Softmax, x, nodes_.size())); }

Value Graph::top_k(Value x, int64_t k) {
  Node n = unary(*this, Op::TopK, x, nodes_.size());
  if (k < 1 || k > n.shape.back())
    fail("graph: TopK '{}': k = {} must be in [1, {}] for x {}", n.name, k, n.shape.back(),
         describe(node(x)));
  n.type = DType::I32;
  n.shape.back() = k;
  n.i[0] = k;
  return push(std::move(n));
}

Value Graph::argmax(Value x) {
  Node n = unary(*this, Op::Argmax, x, nodes_.size());
  n.type = DType::I32;
  n.shape.back() = 1;
  return push(std::move(n));
}

Value Graph::reshape(Value x, Shape shape) {
  Checker c{*this, Op::Reshape, fmt::format("Reshape#{}", nodes_.size())};
  const Node& a = c.get(x, "x");
  if (shape.empty() || shape.size() > 8)
    c.error(fmt::format("new shape {} must have 1 to 8 axes", shape_str(shape)));
  for (int64_t d : shape)
    if (d <= 0) c.error(fmt::format("new shape {} has a non-positive axis", shape_str(shape)));
  if (elements(shape) != elements(a.shape))
    c.error(fmt::format("new shape {} has {} elements but x {} has {}", shape_str(shape),
                        elements(shape), describe(a), elements(a.shape)));
  const DTypeTraits* tr = dtype_traits(a.type);
  if (tr && tr->quantized && (shape.back() % tr->block_elems != 0))
    c.error(fmt::format("new shape {} splits the {}-value blocks of x {}", shape_str(shape),
                        tr->block_elems, describe(a)));
  Node n;
  n.op = Op::Reshape;
  n.type = a.type;
  n.shape = shape;
  n.src = {x.id, -1, -1, -1, -1, -1};
  for (size_t k = 0; k < shape.size(); ++k) n.i[k] = shape[k];
  return push(std::move(n));
}

Value Graph::slice(Value x, int64_t start, int64_t length) {
  Checker c{*this, Op::Slice, fmt::format("Slice#{}", nodes_.size())};
  const Node& a = c.get(x, "x");
  if (a.type != DType::F32 && a.type != DType::I32)
    c.error(fmt::format("x {} must be F32 or I32", describe(a)));
  if (start < 0 || length < 1 || start + length > a.shape.back())
    c.error(fmt::format("range [{}, {}) is not inside the last axis of x {}", start, start + length,
                        describe(a)));
  Node n;
  n.op = Op::Slice;
  n.type = a.type;
  n.shape = a.shape;
  n.shape.back() = length;
  n.src = {x.id, -1, -1, -1, -1, -1};
  n.i[0] = start;
  n.i[1] = length;
  return push(std::move(n));
}

Value Graph::concat(Value a, Value b) {
  Checker c{*this, Op::Concat, fmt::format("Concat#{}", nodes_.size())};
  const Node& x = c.get(a, "a");
  const Node& y = c.get(b, "b");
  if ((x.type != DType::F32 && x.type != DType::I32) || y.type != x.type)
    c.error(fmt::format("a {} and b {} must both be F32 or both I32", describe(x), describe(y)));
  bool ok = x.shape.size() == y.shape.size();
  for (size_t k = 0; ok && k + 1 < x.shape.size(); ++k) ok = x.shape[k] == y.shape[k];
  if (!ok)
    c.error(fmt::format("a {} and b {} must agree on every axis but the last", describe(x),
                        describe(y)));
  Node n;
  n.op = Op::Concat;
  n.type = x.type;
  n.shape = x.shape;
  n.shape.back() += y.shape.back();
  n.src = {a.id, b.id, -1, -1, -1, -1};
  return push(std::move(n));
}

Value Graph::write_rows(const BackendTensorPtr& dst, Value rows, Value row_ids) {
  Checker c{*this, Op::WriteRows, fmt::format("WriteRows#{}", nodes_.size())};
  if (!dst) c.error("destination tensor is null");
  c.node_name = fmt::format("WriteRows({})", dst->name());
  const Node& r = c.get(rows, "rows");
  const Node& id = c.get(row_ids, "row ids");
  if (!is_plain_float(dst->type()) && dst->type() != DType::I32)
    c.error(fmt::format("destination '{}' is {}; rows can be written to F32, F16, BF16 or I32",
                        dst->name(), dtype_name(dst->type())));
  const Shape& ds = dst->shape();
  if (ds.empty()) c.error(fmt::format("destination '{}' has no shape", dst->name()));
  c.rank(id, "row ids", 1, 1);
  c.type_i32(id, "row ids");
  if ((dst->type() == DType::I32) != (r.type == DType::I32))
    c.error(fmt::format("rows {} cannot be written to '{}' {}", describe(r), dst->name(),
                        dtype_name(dst->type())));
  if (r.type != DType::I32) c.type_float(r, "rows");
  const int64_t row_elems = elements(ds) / ds[0];
  if (r.shape.empty() || r.shape[0] != id.shape[0] || elements(r.shape) / r.shape[0] != row_elems)
    c.error(fmt::format("rows {} must be [N = {}, ...] with {} values per row to fit '{}' {}",
                        describe(r), id.shape[0], row_elems, dst->name(), shape_str(ds)));
  Value d = constant(dst);
  Node n;
  n.op = Op::WriteRows;
  n.type = dst->type();
  n.shape = ds;
  n.src = {d.id, rows.id, row_ids.id, -1, -1, -1};
  n.tensor = dst;
  n.name = c.node_name;
  return push(std::move(n));
}

Value Graph::copy(Value x, DType type) {
  Node n = unary(*this, Op::Copy, x, nodes_.size());
  if (!is_plain_float(type))
    fail("graph: Copy '{}': target type {} must be F32, F16 or BF16", n.name, dtype_name(type));
  n.type = type;
  return push(std::move(n));
}

Value Graph::div(Value a, Value b) { return push(binary(*this, Op::Div, a, b, nodes_.size())); }

Value Graph::clamp(Value x, float lo, float hi) {
  Node n = unary(*this, Op::Clamp, x, nodes_.size());
  if (!(lo <= hi)) fail("graph: Clamp '{}': lo {} must be <= hi {}", n.name, lo, hi);
  n.f[0] = lo;
  n.f[1] = hi;
  return push(std::move(n));
}

Value Graph::scatter(Value a, Value ids, Value values) {
  Checker c{*this, Op::Scatter, fmt::format("Scatter#{}", nodes_.size())};
  const Node& x = c.get(a, "a");
  const Node& id = c.get(ids, "ids");
  const Node& v = c.get(values, "values");
  c.rank(x, "a", 1, 1);
  c.rank(id, "ids", 1, 1);
  c.rank(v, "values", 1, 1);
  if (x.type != DType::F32 || v.type != DType::F32)
    c.error(fmt::format("a {} and values {} must be F32", describe(x), describe(v)));
  c.type_i32(id, "ids");
  if (v.shape[0] != id.shape[0])
    c.error(fmt::format("values {} must have one entry per id of {}", describe(v), describe(id)));
  Node n;
  n.op = Op::Scatter;
  n.shape = x.shape;
  n.src = {a.id, ids.id, values.id, -1, -1, -1};
  return push(std::move(n));
}

Value Graph::top_p_draw(Value logits, Value uniform, Value ids, float temperature, float top_p, float min_p) {
  Checker c{*this, Op::TopPDraw, fmt::format("TopPDraw#{}", nodes_.size())};
  const Node& x = c.get(logits, "logits");
  const Node& u = c.get(uniform, "uniform");
  const Node& id = c.get(ids, "ids");
  c.rank(x, "logits", 1, 1);
  c.rank(id, "ids", 1, 1);
  if (x.type != DType::F32 || u.type != DType::F32)
    c.error(fmt::format("logits {} and uniform {} must be F32", describe(x), describe(u)));
  if (u.shape != Shape{1}) c.error(fmt::format("uniform {} must be [1]", describe(u)));
  c.type_i32(id, "ids");
  if (id.shape[0] != x.shape[0])
    c.error(fmt::format("ids {} must have one entry per logit of {}", describe(id), describe(x)));
  c.sampling(temperature, top_p, min_p);
  Node n;
  n.op = Op::TopPDraw;
  n.type = DType::I32;
  n.shape = {1};
  n.src = {logits.id, uniform.id, ids.id, -1, -1, -1};
  n.f[0] = temperature;
  n.f[1] = top_p;
  n.f[2] = min_p;
  n.f[3] = 1.0f / temperature;  // rounded once here: backends multiply by it (no device division)
  return push(std::move(n));
}

Value Graph::accept_drafts(Value target_logits, Value target_top, Value draft_logits, Value draft_top, Value drafts,
                           Value uniforms, float temperature, float top_p, float min_p) {
  Checker c{*this, Op::AcceptDrafts, fmt::format("AcceptDrafts#{}", nodes_.size())};
  const Node& p = c.get(target_logits, "target logits");
  const Node& pt = c.get(target_top, "target top");
  const Node& q = c.get(draft_logits, "draft logits");
  const Node& qt = c.get(draft_top, "draft top");
  const Node& d = c.get(drafts, "drafts");
  const Node& u = c.get(uniforms, "uniforms");
  c.rank(p, "target logits", 2, 2);
  c.rank(pt, "target top", 2, 2);
  c.rank(q, "draft logits", 2, 2);
  c.rank(qt, "draft top", 2, 2);
  c.rank(d, "drafts", 1, 1);
  c.rank(u, "uniforms", 1, 1);
  if (p.type != DType::F32 || q.type != DType::F32 || u.type != DType::F32)
    c.error(fmt::format("target logits {}, draft logits {} and uniforms {} must be F32", describe(p), describe(q),
                        describe(u)));
  c.type_i32(pt, "target top");
  c.type_i32(qt, "draft top");
  c.type_i32(d, "drafts");
  const int64_t n = d.shape[0], V = p.shape[1];
  if (n < 1) c.error(fmt::format("drafts {} must hold at least one draft", describe(d)));
  if (p.shape[0] != n + 1 || q.shape != Shape{n, V})
    c.error(fmt::format("target logits {} must be [{}, V] and draft logits {} [{}, V] for the {} drafts", describe(p),
                        n + 1, describe(q), n, n));
  if (pt.shape[0] != n + 1 || qt.shape[0] != n || pt.shape[1] < 1 || pt.shape[1] > V || qt.shape[1] < 1 ||
      qt.shape[1] > V)
    c.error(fmt::format("target top {} and draft top {} must be TopK rows of the logits ([{}, K] and [{}, K], "
                        "1 <= K <= {})", describe(pt), describe(qt), n + 1, n, V));
  if (u.shape[0] != 2 * n + 1)
    c.error(fmt::format("uniforms {} must be [{}]: two per draft and one for the bonus", describe(u), 2 * n + 1));
  c.sampling(temperature, top_p, min_p);
  Node out;
  out.op = Op::AcceptDrafts;
  out.type = DType::I32;
  out.shape = {n + 2};
  out.src = {target_logits.id, target_top.id, draft_logits.id, draft_top.id, drafts.id, uniforms.id};
  out.f = {temperature, top_p, min_p, 1.0f / temperature};
  return push(std::move(out));
}

void Graph::mark_output(Value v) {
  node(v);
  for (int32_t o : outputs_)
    if (o == v.id) return;
  outputs_.push_back(v.id);
}

}  // namespace specula
