// GGUF reader/writer: the real Gemma 4 vocab file, writer round trips of every value type and block
// type, layout rules of gguf-py, split files; the gguf format plugin writing and reading through the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <random>

#include "common/plugins.hpp"
#include "gguf_io.hpp"  // plugins/gguf (specula_gguf_io)
#include "specula/error.hpp"
#include "specula/mapped_file.hpp"
#include "specula/quant.hpp"

namespace fs = std::filesystem;
using namespace specula;
using gguf::ValueType;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::path(SPECULA_BINARY_DIR) / "test-tmp" / "formats" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::byte> bytes_of(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST(Gguf, RealGemma4VocabLoads) {
  const fs::path p = fs::path(SPECULA_SHARED_DIR) / "gemma4-vocab" / "ggml-vocab-gemma-4.gguf";
  ASSERT_TRUE(fs::exists(p)) << p;
  auto mf = gguf::open(p);
  EXPECT_EQ(mf->format(), "gguf");
  const auto& md = mf->metadata();
  EXPECT_EQ(md.at("general.architecture").get<std::string>(), "gemma4");
  const auto& tokens = md.at("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.is_array());
  EXPECT_EQ(tokens.size(), 262144u);
  // Ids from gemma4-formats-spec §7.2 / §7.3.
  EXPECT_EQ(tokens[2].get<std::string>(), "<bos>");
  EXPECT_EQ(tokens[106].get<std::string>(), "<turn|>");
  EXPECT_EQ(tokens[107].get<std::string>(), "\n");
  EXPECT_TRUE(md.at("tokenizer.ggml.merges").is_array());
  EXPECT_GT(md.at("tokenizer.ggml.merges").size(), 500000u);

  // Types as declared in the file: token_type is an INT32 array.
  auto map = MappedFile::open(p);
  gguf::File f = gguf::parse(map->bytes(), p.string());
  bool found = false;
  for (const auto& [key, kt] : f.keys)
    if (key == "tokenizer.ggml.token_type") {
      found = true;
      EXPECT_EQ(kt.type, ValueType::ARRAY);
      EXPECT_EQ(kt.elem, ValueType::INT32);
    }
  EXPECT_TRUE(found);
}

TEST(Gguf, WriterRoundTripsEveryValueType) {
  gguf::Writer w;
  w.set_string("general.architecture", "test");
  w.set("u8", ValueType::UINT8, 255);
  w.set("i8", ValueType::INT8, -128);
  w.set("u16", ValueType::UINT16, 65535);
  w.set("i16", ValueType::INT16, -32768);
  w.set_u32("u32", 4000000000u);
  w.set_i32("i32", -2000000000);
  w.set_f32("f32", 0.1f);
  w.set_bool("bool", true);
  w.set_string("str", std::string("h\xC3\xA9llo\0x", 8));
  w.set("u64", ValueType::UINT64, uint64_t{18000000000000000000ull});
  w.set("i64", ValueType::INT64, int64_t{-9000000000000000000ll});
  w.set("f64", ValueType::FLOAT64, 1e300);
  w.set_array("arr.str", ValueType::STRING, {"a", "", "ccc"});
  w.set_array("arr.i32", ValueType::INT32, {1, -2, 3});
  w.set_array("arr.bool", ValueType::BOOL, {true, false, true});
  w.set_array("arr.f32", ValueType::FLOAT32, {1.5, -2.25});
  w.set_array("arr.empty", ValueType::UINT8, nlohmann::json::array());
  const auto bytes = w.serialize();
  gguf::File f = gguf::parse(bytes, "mem.gguf");
  EXPECT_EQ(f.keys.size(), 18u);
  EXPECT_EQ(f.keys[0].first, "general.architecture");  // insertion order kept
  EXPECT_EQ(f.metadata["u8"], 255);
  EXPECT_EQ(f.metadata["i8"], -128);
  EXPECT_EQ(f.metadata["u16"], 65535);
  EXPECT_EQ(f.metadata["i16"], -32768);
  EXPECT_EQ(f.metadata["u32"], 4000000000u);
  EXPECT_EQ(f.metadata["i32"], -2000000000);
  EXPECT_EQ(f.metadata["f32"].get<float>(), 0.1f);
  EXPECT_EQ(f.metadata["bool"], true);
  EXPECT_EQ(f.metadata["str"].get<std::string>(), std::string("h\xC3\xA9llo\0x", 8));
  EXPECT_EQ(f.metadata["u64"].get<uint64_t>(), 18000000000000000000ull);
  EXPECT_EQ(f.metadata["i64"].get<int64_t>(), -9000000000000000000ll);
  EXPECT_EQ(f.metadata["f64"].get<double>(), 1e300);
  EXPECT_EQ(f.metadata["arr.str"], nlohmann::json({"a", "", "ccc"}));
  EXPECT_EQ(f.metadata["arr.i32"], nlohmann::json({1, -2, 3}));
  EXPECT_EQ(f.metadata["arr.bool"], nlohmann::json({true, false, true}));
  EXPECT_EQ(f.metadata["arr.f32"], nlohmann::json({1.5, -2.25}));
  EXPECT_TRUE(f.metadata["arr.empty"].is_array());
  EXPECT_TRUE(f.metadata["arr.empty"].empty());
  for (const auto& [k, kt] : f.keys) {
    if (k == "arr.i32") {
      EXPECT_EQ(kt.elem, ValueType::INT32);
    }
  }

  // Values must fit their declared type.
  EXPECT_THROW(w.set("bad", ValueType::UINT8, 256), Error);
  EXPECT_THROW(w.set("bad", ValueType::INT8, -129), Error);
  EXPECT_THROW(w.set("bad", ValueType::UINT32, -1), Error);
  EXPECT_THROW(w.set("bad", ValueType::INT64, uint64_t{1} << 63), Error);
  EXPECT_THROW(w.set("bad", ValueType::STRING, 5), Error);
  EXPECT_THROW(w.set_array("bad", ValueType::INT16, {1, 40000}), Error);

  // Re-writing the parsed metadata reproduces the bytes exactly.
  gguf::Writer w2;
  w2.copy_metadata(f);
  EXPECT_EQ(w2.serialize(), bytes);
}

TEST(Gguf, TensorsRoundTripWithGgufPyLayout) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  gguf::Writer w;
  w.set_string("general.architecture", "test");
  std::vector<float> a(3 * 5), b(2 * 256), c(7);
  for (auto* v : {&a, &b, &c})
    for (auto& x : *v) x = nd(rng);
  std::vector<std::byte> bq(*dtype_row_bytes(DType::Q4_K, 256) * 2);
  quantize_row(DType::Q4_K, b.data(), bq.data(), 256);
  quantize_row(DType::Q4_K, b.data() + 256, bq.data() + 144, 256);
  w.add_tensor("a", DType::F32, {3, 5}, bytes_of(a));
  w.add_tensor("b.q4k", DType::Q4_K, {2, 256}, bq);
  w.add_tensor("c", DType::F32, {7}, bytes_of(c));
  const auto bytes = w.serialize();
  gguf::File f = gguf::parse(bytes, "mem.gguf");
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.alignment, 32u);
  EXPECT_EQ(f.data_offset % 32, 0u);
  EXPECT_EQ(f.tensors[0].shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(f.tensors[1].shape, (std::vector<int64_t>{2, 256}));
  EXPECT_EQ(f.tensors[1].type, DType::Q4_K);
  EXPECT_EQ(f.tensors[2].shape, (std::vector<int64_t>{7}));
  // gguf-py layout: offsets are the running sum of sizes padded to 32, the file ends padded.
  const auto base = reinterpret_cast<const std::byte*>(bytes.data()) + f.data_offset;
  EXPECT_EQ(f.tensors[0].data.data(), base);
  EXPECT_EQ(f.tensors[1].data.data(), base + 64);          // 60 bytes -> 64
  EXPECT_EQ(f.tensors[2].data.data(), base + 64 + 288);    // 288 bytes, already aligned
  EXPECT_EQ(bytes.size(), f.data_offset + 64 + 288 + 32);  // 28 bytes -> 32
  EXPECT_EQ(std::memcmp(f.tensors[0].data.data(), a.data(), 60), 0);
  EXPECT_EQ(std::memcmp(f.tensors[1].data.data(), bq.data(), bq.size()), 0);
  // The raw ne are innermost-first: the first tensor's info has ne = [5, 3].
  const std::string needle = "a";
  // ne[0] of "a" directly follows its name (8-byte length + 1 byte) and n_dims (4 bytes).
  const auto it = std::search(bytes.begin(), bytes.end(), reinterpret_cast<const std::byte*>("\x01\0\0\0\0\0\0\0a"),
                              reinterpret_cast<const std::byte*>("\x01\0\0\0\0\0\0\0a") + 9);
  ASSERT_NE(it, bytes.end());
  uint32_t n_dims;
  uint64_t ne0, ne1;
  std::memcpy(&n_dims, &*(it + 9), 4);
  std::memcpy(&ne0, &*(it + 13), 8);
  std::memcpy(&ne1, &*(it + 21), 8);
  EXPECT_EQ(n_dims, 2u);
  EXPECT_EQ(ne0, 5u);
  EXPECT_EQ(ne1, 3u);
}

TEST(Gguf, CustomAlignmentIsWrittenAndHonoured) {
  gguf::Writer w(64);
  std::vector<float> a(3, 1.0f);
  w.add_tensor("a", DType::F32, {3}, bytes_of(a));
  w.add_tensor("b", DType::F32, {3}, bytes_of(a));
  const auto bytes = w.serialize();
  gguf::File f = gguf::parse(bytes, "mem.gguf");
  EXPECT_EQ(f.alignment, 64u);
  EXPECT_EQ(f.metadata["general.alignment"], 64);
  EXPECT_EQ(f.data_offset % 64, 0u);
  EXPECT_EQ(f.tensors[1].data.data() - f.tensors[0].data.data(), 64);
}

TEST(Gguf, SplitFilesOpenAsOneModel) {
  const fs::path dir = temp_dir("split");
  std::vector<float> a(4, 1.0f), b(4, 2.0f), c(4, 3.0f);
  gguf::Writer w1, w2;
  w1.set_string("general.architecture", "test");
  w1.set_u32("test.block_count", 2);
  w1.set("split.no", ValueType::UINT16, 0);
  w1.set("split.count", ValueType::UINT16, 2);
  w1.set("split.tensors.count", ValueType::INT32, 3);
  w1.add_tensor("a", DType::F32, {4}, bytes_of(a));
  w1.add_tensor("b", DType::F32, {2, 2}, bytes_of(b));
  w2.set("split.no", ValueType::UINT16, 1);
  w2.set("split.count", ValueType::UINT16, 2);
  w2.set("split.tensors.count", ValueType::INT32, 3);
  w2.add_tensor("c", DType::F32, {4}, bytes_of(c));
  w1.write(dir / "m-00001-of-00002.gguf");
  w2.write(dir / "m-00002-of-00002.gguf");
  for (const char* open_as : {"m-00001-of-00002.gguf", "m-00002-of-00002.gguf"}) {
    auto mf = gguf::open(dir / open_as);
    EXPECT_EQ(mf->path(), dir / "m-00001-of-00002.gguf");
    ASSERT_EQ(mf->tensors().size(), 3u);
    EXPECT_EQ(mf->metadata().at("test.block_count"), 2);
    const TensorInfo* t = mf->find("c");
    ASSERT_NE(t, nullptr);
    float v[4];
    dequantize_tensor(*t, v);
    EXPECT_EQ(v[3], 3.0f);
    EXPECT_EQ(mf->find("b")->shape, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(mf->find("zzz"), nullptr);
  }
  fs::remove(dir / "m-00002-of-00002.gguf");
  try {
    gguf::open(dir / "m-00001-of-00002.gguf");
    FAIL() << "missing shard accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m-00002-of-00002.gguf"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(Gguf, StreamingWriteEqualsInMemory) {
  const fs::path dir = temp_dir("stream");
  std::vector<float> a(7, 1.5f), b(6, -2.0f);
  gguf::Writer held, streamed;
  for (auto* w : {&held, &streamed}) w->set_string("general.architecture", "test");
  held.add_tensor("a", DType::F32, {7}, bytes_of(a));
  held.add_tensor("b", DType::F32, {2, 3}, bytes_of(b));
  streamed.declare_tensor("a", DType::F32, {7});
  streamed.add_tensor("b", DType::F32, {2, 3}, bytes_of(b));
  EXPECT_EQ(streamed.tensor_bytes(0), 28u);
  streamed.write(dir / "s.gguf", [&](size_t i, const gguf::Writer::PutBytes& put) {
    ASSERT_EQ(i, 0u);
    const auto all = bytes_of(a);
    put(std::span(all).subspan(0, 5));  // in pieces
    put(std::span(all).subspan(5));
  });
  std::ifstream in(dir / "s.gguf", std::ios::binary);
  const std::vector<char> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto want = held.serialize();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);
  EXPECT_FALSE(fs::exists(dir / "s.gguf.part"));

  // A fill that gives too few bytes fails naming the tensor and leaves neither file behind.
  try {
    const auto all = bytes_of(a);
    streamed.write(dir / "short.gguf", [&](size_t, const gguf::Writer::PutBytes& put) {
      put(std::span(all).subspan(0, 4));
    });
    FAIL() << "short fill accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'a'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "short.gguf"));
  EXPECT_FALSE(fs::exists(dir / "short.gguf.part"));
  EXPECT_THROW(streamed.serialize(), Error);
}

// ------------------------------------------------------------------ the gguf format plugin, through the host

namespace {

std::vector<char> file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

// Metadata (every kind of value, a non-default alignment) and tensors (held and streamed in pieces)
// written by the plugin the host finds for "gguf" read back the same through the host, typed keys in
// order included, and the file is byte for byte what the writer library makes of the same input.
TEST(GgufFormat, WriteThroughTheHostReadsBack) {
  const fs::path dir = temp_dir("host-write");
  auto& host = specula_test::host();
  const auto writer = host.make_writer("gguf");
  ASSERT_TRUE(writer->can_write());

  gguf::Metadata md;
  md.set_u32("general.alignment", 64);
  md.set_string("general.architecture", "test");
  md.set("test.small", ValueType::UINT8, 7);
  md.set("test.big", ValueType::INT64, int64_t{-1} << 40);
  md.set_f32("test.eps", 1e-6f);
  md.set_bool("test.flag", true);
  md.set_array("test.per_layer", ValueType::INT32, {1, -2, 3});
  md.set_array("tokenizer.ggml.tokens", ValueType::STRING, {"<pad>", "a", "bb"});
  md.set_u32("test.block_count", 2);
  md.set_u32("test.block_count", 3);  // replaced in place
  EXPECT_THROW(md.set("test.bad", ValueType::UINT8, 256), Error);

  std::vector<float> held(6), streamed(2 * 64);
  for (size_t i = 0; i < held.size(); ++i) held[i] = 0.5f * static_cast<float>(i);
  for (size_t i = 0; i < streamed.size(); ++i) streamed[i] = std::sin(0.1f * static_cast<float>(i));
  std::vector<std::byte> q8(2 * 68);
  for (int r = 0; r < 2; ++r) quantize_row(DType::Q8_0, streamed.data() + r * 64, q8.data() + r * 68, 64);
  const auto held_bytes = bytes_of(held);
  std::vector<TensorSpec> specs = {
      {"held", DType::F32, {2, 3}, held_bytes, {}},
      {"streamed", DType::Q8_0, {2, 64}, {}, [&](const PutBytes& put) {
         put(std::span(q8).subspan(0, 10));  // in pieces
         put(std::span(q8).subspan(10));
       }}};
  writer->write(dir / "w.gguf", md, specs);
  EXPECT_FALSE(fs::exists(dir / "w.gguf.part"));

  const auto file = host.open_model(dir / "w.gguf");
  EXPECT_EQ(file->format(), "gguf");
  EXPECT_EQ(file->architecture(), "test");
  const gguf::Metadata* back = file->gguf_metadata();
  ASSERT_NE(back, nullptr);
  ASSERT_EQ(back->keys().size(), md.keys().size());
  for (size_t i = 0; i < md.keys().size(); ++i) {
    const auto& [key, type] = md.keys()[i];
    EXPECT_EQ(back->keys()[i].first, key);
    EXPECT_EQ(back->keys()[i].second.type, type.type) << key;
    EXPECT_EQ(back->keys()[i].second.elem, type.elem) << key;
    EXPECT_EQ(*back->find(key), *md.find(key)) << key;
  }
  EXPECT_EQ(back->values(), file->metadata());
  EXPECT_EQ(file->metadata().at("test.block_count"), 3);
  ASSERT_EQ(file->tensors().size(), 2u);
  const TensorInfo* h = file->find("held");
  const TensorInfo* s = file->find("streamed");
  ASSERT_TRUE(h && s);
  EXPECT_EQ(h->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s->type, DType::Q8_0);
  EXPECT_TRUE(std::equal(h->data.begin(), h->data.end(), held_bytes.begin(), held_bytes.end()));
  EXPECT_TRUE(std::equal(s->data.begin(), s->data.end(), q8.begin(), q8.end()));
  EXPECT_EQ((s->data.data() - h->data.data()) % 64, 0);

  // The same bits as the writer library given the same keys and tensors.
  gguf::Writer w(64);
  w.copy_metadata(md);
  w.add_tensor("held", DType::F32, {2, 3}, held_bytes);
  w.add_tensor("streamed", DType::Q8_0, {2, 64}, q8);
  const auto want = w.serialize();
  const auto got = file_bytes(dir / "w.gguf");
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);

  // A held tensor of the wrong size is refused before the file is created; a short fill fails naming
  // the tensor. Neither leaves a file behind.
  std::vector<TensorSpec> wrong = {{"held", DType::F32, {2, 4}, held_bytes, {}}};
  try {
    writer->write(dir / "wrong.gguf", md, wrong);
    ADD_FAILURE() << "a held tensor of the wrong size was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'held'"), std::string::npos) << e.what();
  }
  std::vector<TensorSpec> short_fill = {
      {"streamed", DType::Q8_0, {2, 64}, {}, [&](const PutBytes& put) { put(std::span(q8).subspan(1)); }}};
  try {
    writer->write(dir / "short.gguf", md, short_fill);
    ADD_FAILURE() << "a short fill was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'streamed'"), std::string::npos) << e.what();
  }
  for (const char* name : {"wrong.gguf", "wrong.gguf.part", "short.gguf", "short.gguf.part"})
    EXPECT_FALSE(fs::exists(dir / name)) << name;
}

// Only the gguf plugin writes: asking for a writer of another format names what was found.
TEST(GgufFormat, NoWriterForOtherFormats) {
  try {
    specula_test::host().make_writer("safetensors");
    FAIL() << "a safetensors writer was found";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no format plugin writes safetensors files"), std::string::npos) << m;
    EXPECT_NE(m.find("gguf (gguf, writes)"), std::string::npos) << m;
  }
}
