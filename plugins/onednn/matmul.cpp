// Matrix products: dispatch by weight storage type to the fastest kernel available.
#include "kernels.hpp"

namespace specula::cpu {

void matmul(ThreadPool& pool, const Matrix& w, const float* x, int64_t n, float* y) {
  matmul_generic(pool, w, x, n, y);
}

}  // namespace specula::cpu
