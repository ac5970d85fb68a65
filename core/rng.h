// Counter-based RNG: every value is a pure function of (seed, tensor_id, element index), so the
// data of a case does not depend on thread count or fill order.
#pragma once
#include <cstdint>

namespace ropekv {

// splitmix64 finaliser: a bijective mix of 64 bits.
inline uint64_t rng_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t rng_u64(uint64_t seed, uint64_t tensor_id, uint64_t index) {
  return rng_mix64(rng_mix64(rng_mix64(seed) ^ tensor_id) ^ index);
}

// Uniform in [0, 1) with 53 random bits.
inline double rng_unit(uint64_t seed, uint64_t tensor_id, uint64_t index) {
  return static_cast<double>(rng_u64(seed, tensor_id, index) >> 11) * 0x1.0p-53;
}

// Uniform integer in [0, n) (n > 0); the tiny modulo bias is irrelevant for test data.
inline uint64_t rng_below(uint64_t seed, uint64_t tensor_id, uint64_t index, uint64_t n) {
  return rng_u64(seed, tensor_id, index) % n;
}

// A sequential stream for choices made one after another (problem generation).
struct rng_stream {
  uint64_t seed;
  uint64_t tensor_id;
  uint64_t counter = 0;
  uint64_t next_u64() { return rng_u64(seed, tensor_id, counter++); }
  double next_unit() { return rng_unit(seed, tensor_id, counter++); }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next_u64() % n; }
  int64_t range(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo + 1)));
  }
  bool chance(double p) { return next_unit() < p; }
};

}  // namespace ropekv
