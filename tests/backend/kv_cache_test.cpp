// KvCache::truncate on the backend: the forgotten positions' slots become empty in every layer (full and
// ring), the hidden row of the new last position moves into last_hidden, and the host reads nothing.
#include <gtest/gtest.h>

#include <numeric>

#include "common/counting_backend.hpp"
#include "specula/kv_cache.hpp"
#include "test_util.hpp"

using namespace specula;

namespace {

std::vector<int32_t> read_i32(ComputeBackend& b, const BackendTensorPtr& t) {
  std::vector<int32_t> v(static_cast<size_t>(t->shape()[0]));
  b.read(*t, std::as_writable_bytes(std::span<int32_t>(v)));
  return v;
}

TEST(KvCache, TruncateMarksSlotsEmptyOnTheBackendWithoutReadingBack) {
  test::Fixture fx;
  specula_test::CountingBackend b(std::shared_ptr<ComputeBackend>(fx.backend.get(), [](ComputeBackend*) {}));
  KvCacheSpec spec;
  spec.layers = {{1, 4, 0, "full"}, {1, 4, 3, "ring"}};  // a ring of window - 1 + step = 6 slots
  spec.step_tokens = 4;
  spec.hidden_size = 3;
  KvCache c(b, spec, 16);
  ASSERT_TRUE(c.layer(1).ring);
  ASSERT_EQ(c.layer(1).slots, 6);
  // As if positions 0..8 were written, the last step 5..8 (its hidden rows r hold 10 r + column).
  std::vector<int32_t> full(16, -1), ring(6, -1);
  for (int32_t p = 0; p < 9; ++p) full[static_cast<size_t>(p)] = p, ring[static_cast<size_t>(p % 6)] = p;
  b.write(*c.layer(0).pos, test::bytes_of(full));
  b.write(*c.layer(1).pos, test::bytes_of(ring));
  std::vector<float> step(12);
  for (size_t i = 0; i < step.size(); ++i) step[i] = static_cast<float>(10 * (i / 3) + i % 3);
  b.write(*c.step_hidden(), test::bytes_of(step));
  c.appended(5);
  c.appended(4);
  ASSERT_EQ(c.position(), 9);

  b.reads = 0;
  c.truncate(7);  // forget 7 and 8: the new last position 6 is row 1 of the last step
  c.truncate(6);  // and 6: row 0
  EXPECT_EQ(b.reads, 0) << "truncate must not read back from the backend";
  EXPECT_EQ(c.position(), 6);

  std::vector<int32_t> want_full(16, -1), want_ring{6, 7, 8, 3, 4, 5};
  std::iota(want_full.begin(), want_full.begin() + 6, 0);
  for (int32_t& p : want_ring)
    if (p >= 6) p = -1;
  EXPECT_EQ(read_i32(b, c.layer(0).pos), want_full);
  EXPECT_EQ(read_i32(b, c.layer(1).pos), want_ring);
  std::vector<float> last(3);
  b.read(*c.last_hidden(), std::as_writable_bytes(std::span<float>(last)));
  EXPECT_EQ(last, (std::vector<float>{0, 1, 2})) << "the hidden row of position 5";

  // A step deep (the most a ring allows), past the last step's rows: last_hidden keeps what it holds.
  b.reads = 0;
  c.truncate(2);
  EXPECT_EQ(b.reads, 0);
  std::fill(want_full.begin() + 2, want_full.end(), -1);
  EXPECT_EQ(read_i32(b, c.layer(0).pos), want_full);
  EXPECT_EQ(read_i32(b, c.layer(1).pos), std::vector<int32_t>(6, -1));
  b.read(*c.last_hidden(), std::as_writable_bytes(std::span<float>(last)));
  EXPECT_EQ(last, (std::vector<float>{0, 1, 2}));
  EXPECT_THROW(c.truncate(3), Error) << "past the position";
}

}  // namespace
