// Hostile and broken files: every case must raise specula::Error whose message names the file and the
// offending field — no crash, no huge allocation, no read past the buffer (run under ASan to check the
// last point: SPECULA_SANITIZE=ON).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "gguf_io.hpp"  // plugins/gguf (specula_gguf_io)
#include "safetensors_io.hpp"  // plugins/safetensors (specula_safetensors_io)
#include "specula/error.hpp"

namespace fs = std::filesystem;
using namespace specula;

namespace {

// Little-endian byte builder for hand-made GGUF images.
struct Bytes {
  std::vector<std::byte> b;
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  Bytes& raw(const void* p, size_t n) {
    const auto* c = static_cast<const std::byte*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  Bytes& pad(size_t a) {
    b.resize((b.size() + a - 1) / a * a);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n);
    return *this;
  }
};

Bytes gguf_header(uint64_t n_tensors, uint64_t n_kv) {
  Bytes h;
  h.raw("GGUF", 4).u32(3).u64(n_tensors).u64(n_kv);
  return h;
}

// A tensor info record: ne innermost-first.
void tensor_info(Bytes& b, const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
  b.str(name).u32(static_cast<uint32_t>(ne.size()));
  for (uint64_t d : ne) b.u64(d);
  b.u32(type).u64(offset);
}

std::string gguf_error(const Bytes& b) {
  try {
    gguf::parse(b.b, "bad.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

std::string st_error(const std::string& header, size_t data_bytes = 0, const char* name = "bad.safetensors") {
  std::vector<std::byte> b(8 + header.size() + data_bytes);
  const uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  try {
    safetensors::parse(b, name);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

#define EXPECT_MENTIONS(msg, ...)                                                   \
  do {                                                                              \
    const std::string m_ = (msg);                                                   \
    for (const char* w_ : {__VA_ARGS__}) EXPECT_NE(m_.find(w_), std::string::npos) << "'" << w_ << "' not in: " << m_; \
  } while (0)

}  // namespace

TEST(BadGguf, EveryTruncationIsRefused) {
  gguf::Writer w;
  w.set_string("general.architecture", "test");
  w.set_array("tokens", gguf::ValueType::STRING, {"a", "bb", "ccc"});
  std::vector<float> v(40, 1.0f);
  w.add_tensor("t0", DType::F32, {5, 8}, {reinterpret_cast<const std::byte*>(v.data()), 160});
  w.add_tensor("t1", DType::Q8_0, {1, 32}, {reinterpret_cast<const std::byte*>(v.data()), 34});
  const auto full = w.serialize();
  ASSERT_NO_THROW(gguf::parse(full, "ok.gguf"));
  // The last tensor's data ends 30 bytes before the file does (padding), so cut at most up to there.
  for (size_t cut = 0; cut + 30 < full.size(); ++cut) {
    const std::vector<std::byte> part(full.begin(), full.begin() + cut);
    try {
      gguf::parse(part, "cut.gguf");
      FAIL() << "prefix of " << cut << " bytes accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("cut.gguf: ", 0), 0u) << m;
      EXPECT_TRUE(m.find("truncated") != std::string::npos || m.find("left") != std::string::npos ||
                  m.find("past the end") != std::string::npos)
          << m;
    }
  }
}

TEST(BadGguf, WrongMagicAndVersion) {
  Bytes b;
  b.raw("GGML", 4).u32(3).u64(0).u64(0);
  EXPECT_MENTIONS(gguf_error(b), "bad.gguf", "magic", "GGML", "expected \"GGUF\"");
  Bytes v = gguf_header(0, 0);
  std::memset(v.b.data() + 4, 0, 4);
  v.b[4] = std::byte{1};
  EXPECT_MENTIONS(gguf_error(v), "bad.gguf", "version 1");
}

TEST(BadGguf, AbsurdCountsAndLengths) {
  // A key whose string length is 2^63.
  Bytes s = gguf_header(0, 1);
  s.u64(uint64_t{1} << 63).raw("key", 3).zeros(32);
  EXPECT_MENTIONS(gguf_error(s), "bad.gguf", "key/value record 0 key", "string length 9223372036854775808");
  // 10^12 tensors.
  EXPECT_MENTIONS(gguf_error(gguf_header(1000000000000ull, 0).zeros(64)), "bad.gguf", "tensor_count 1000000000000");
  // 2^60 key/value pairs.
  EXPECT_MENTIONS(gguf_error(gguf_header(0, uint64_t{1} << 60)), "bad.gguf", "kv_count");
  // An array of 2^62 UINT32.
  Bytes a = gguf_header(0, 1);
  a.str("arr").u32(9).u32(4).u64(uint64_t{1} << 62).u32(1);
  EXPECT_MENTIONS(gguf_error(a), "bad.gguf", "key 'arr'", "array of 4611686018427387904 UINT32");
  // A string value longer than the file.
  Bytes v = gguf_header(0, 1);
  v.str("name").u32(8).u64(1000).raw("abc", 3);
  EXPECT_MENTIONS(gguf_error(v), "bad.gguf", "value of key 'name'", "string length 1000");
}

TEST(BadGguf, BadKeys) {
  Bytes t = gguf_header(0, 1);
  t.str("k").u32(13).u32(0);
  EXPECT_MENTIONS(gguf_error(t), "bad.gguf", "key 'k'", "unknown value type 13");
  Bytes d = gguf_header(0, 2);
  d.str("k").u32(4).u32(1).str("k").u32(4).u32(2);
  EXPECT_MENTIONS(gguf_error(d), "bad.gguf", "duplicate key 'k'");
  Bytes n = gguf_header(0, 1);
  n.str("k").u32(9).u32(9).u64(0);
  EXPECT_MENTIONS(gguf_error(n), "bad.gguf", "key 'k'", "nested arrays");
  Bytes e = gguf_header(0, 1);
  e.str("").u32(4).u32(0);
  EXPECT_MENTIONS(gguf_error(e), "bad.gguf", "empty key");
  Bytes al = gguf_header(0, 1);
  al.str("general.alignment").u32(4).u32(48);
  EXPECT_MENTIONS(gguf_error(al), "bad.gguf", "general.alignment", "48", "power of two");
  Bytes at = gguf_header(0, 1);
  at.str("general.alignment").u32(10).u64(32);
  EXPECT_MENTIONS(gguf_error(at), "bad.gguf", "general.alignment", "UINT64", "expected UINT32");
}

TEST(BadGguf, BadTensorInfos) {
  auto one = [](const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset, size_t data) {
    Bytes b = gguf_header(1, 0);
    tensor_info(b, name, ne, type, offset);
    b.pad(32).zeros(data);
    return gguf_error(b);
  };
  EXPECT_MENTIONS(one("w", {4}, 0, 0, 16), "(accepted)");  // the baseline is valid
  EXPECT_MENTIONS(one("w", {4}, 99, 0, 16), "bad.gguf", "tensor 0 ('w')", "unknown or unsupported ggml type id 99");
  EXPECT_MENTIONS(one("w", {4}, 1001, 0, 16), "bad.gguf", "tensor 0 ('w')", "type id 1001");
  EXPECT_MENTIONS(one("w", {100, 2}, 12, 0, 4096), "bad.gguf", "tensor 0 ('w')", "ne[0] = 100", "Q4_K", "256");
  EXPECT_MENTIONS(one("w", {4}, 0, 16, 64), "bad.gguf", "tensor 0 ('w')", "offset 16", "alignment 32");
  EXPECT_MENTIONS(one("w", {4}, 0, 0, 8), "bad.gguf", "tensor 0 ('w')", "past the end");
  EXPECT_MENTIONS(one("w", {4}, 0, uint64_t{1} << 62, 16), "bad.gguf", "tensor 0 ('w')", "past the end");
  EXPECT_MENTIONS(one("w", {1, 1, 1, 1, 1}, 0, 0, 16), "bad.gguf", "tensor 0 ('w')", "n_dims = 5");
  EXPECT_MENTIONS(one("w", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0, 16), "bad.gguf", "tensor 0 ('w')", "overflow");
  EXPECT_MENTIONS(one("w", {uint64_t{1} << 63}, 0, 0, 16), "bad.gguf", "ne[0]", "too large");
  // Found by fuzzing: a zero dim must not hide an overflowing product of the others.
  EXPECT_MENTIONS(one("w", {0, uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0, 16), "bad.gguf", "tensor 0 ('w')", "overflow");
  EXPECT_MENTIONS(one("", {4}, 0, 0, 16), "bad.gguf", "tensor 0", "empty tensor name");

  // Two tensors sharing bytes, and two with one name.
  Bytes o = gguf_header(2, 0);
  tensor_info(o, "a", {16}, 0, 0);
  tensor_info(o, "b", {8}, 0, 32);
  o.pad(32).zeros(64);
  EXPECT_MENTIONS(gguf_error(o), "bad.gguf", "'b'", "overlaps", "'a'");
  Bytes d = gguf_header(2, 0);
  tensor_info(d, "a", {8}, 0, 0);
  tensor_info(d, "a", {8}, 0, 32);
  d.pad(32).zeros(64);
  EXPECT_MENTIONS(gguf_error(d), "bad.gguf", "tensor 1 ('a')", "duplicate tensor name");
}

TEST(BadGguf, FileErrorsNameThePath) {
  const fs::path dir = fs::path(SPECULA_BINARY_DIR) / "test-tmp" / "formats-bad";
  fs::create_directories(dir);
  const fs::path p = dir / "truncated.gguf";
  {
    Bytes b = gguf_header(1, 0);
    tensor_info(b, "w", {1024}, 0, 0);
    b.pad(32).zeros(100);
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.b.data()), b.b.size());
  }
  try {
    gguf::open(p);
    FAIL();
  } catch (const Error& e) {
    const std::string path = p.string();
    EXPECT_MENTIONS(e.what(), path.c_str(), "tensor 0 ('w')", "past the end");
  }
  try {
    gguf::open(dir / "does-not-exist.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "does-not-exist.gguf", "cannot open");
  }
}

TEST(BadSafetensors, HeaderProblems) {
  std::vector<std::byte> tiny(5);
  try {
    safetensors::parse(tiny, "bad.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "bad.safetensors", "truncated");
  }
  std::vector<std::byte> huge(16);
  const uint64_t big = uint64_t{1} << 40;
  std::memcpy(huge.data(), &big, 8);
  try {
    safetensors::parse(huge, "bad.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "bad.safetensors", "header length 1099511627776", "limit");
  }
  std::vector<std::byte> past(16);
  const uint64_t n = 100;
  std::memcpy(past.data(), &n, 8);
  try {
    safetensors::parse(past, "bad.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "bad.safetensors", "header length 100", "truncated");
  }
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})", 4), "bad.safetensors",
                  "malformed JSON header");
  EXPECT_MENTIONS(st_error(R"([1, 2])"), "bad.safetensors", "must start with '{'");
  EXPECT_MENTIONS(st_error(R"({"__metadata__": 5})"), "bad.safetensors", "__metadata__");
}

TEST(BadSafetensors, TensorEntryProblems) {
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 8), "(accepted)");
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", 2),
                  "bad.safetensors", "tensor 'a'", "dtype 'F8_E4M3'");
  EXPECT_MENTIONS(st_error(R"({"a": {"shape": [2], "data_offsets": [0, 8]}})", 8), "bad.safetensors", "tensor 'a'",
                  "'dtype'");
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8), "bad.safetensors",
                  "tensor 'a'", "hold 8 bytes", "needs 12");
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4), "bad.safetensors",
                  "tensor 'a'", "past the end");
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8), "bad.safetensors",
                  "tensor 'a'", "end before begin");
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8), "bad.safetensors",
                  "tensor 'a' shape", "non-negative");
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "U8", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 8]}})", 8),
                  "bad.safetensors", "tensor 'a'", "overflows");
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F32", "shape": [0, 1099511627776, 1099511627776], "data_offsets": [0, 0]}})"),
                  "bad.safetensors", "tensor 'a'", "overflows");
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                               "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12),
                  "bad.safetensors", "overlaps");
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                               "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})", 12),
                  "bad.safetensors", "tensor 'b'", "hole");
  EXPECT_MENTIONS(st_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4), "bad.safetensors",
                  "tensor 'a'", "data_offsets");
}

TEST(BadSafetensors, CheckpointProblems) {
  const fs::path dir = fs::path(SPECULA_BINARY_DIR) / "test-tmp" / "formats-bad" / "ckpt";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // MLX scales without biases.
  safetensors::Writer w;
  std::vector<uint32_t> words(8);
  std::vector<uint16_t> sc(1);
  w.add_tensor("m.weight", DType::U32, {1, 8}, {reinterpret_cast<const std::byte*>(words.data()), 32});
  w.add_tensor("m.scales", DType::BF16, {1, 1}, {reinterpret_cast<const std::byte*>(sc.data()), 2});
  w.write(dir / "model.safetensors");
  try {
    safetensors::open(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "model.safetensors", "m.scales", "m.biases");
  }
  // An index naming a tensor that its shard lacks.
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"m.weight": "model.safetensors",
      "m.scales": "model.safetensors", "ghost": "model.safetensors"}})";
  try {
    safetensors::open(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "model.safetensors.index.json", "'ghost'");
  }
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"m.weight": "../etc/passwd"}})";
  try {
    safetensors::open(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "model.safetensors.index.json", "m.weight", "plain file name");
  }
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": )";
  try {
    safetensors::open(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "model.safetensors.index.json", "malformed JSON");
  }
  fs::remove(dir / "model.safetensors.index.json");
  std::ofstream(dir / "config.json") << "{ nope";
  try {
    safetensors::open(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_MENTIONS(e.what(), "config.json", "malformed JSON");
  }
}
