// SplitMix64 (Steele, Lea and Flood, 2014): a small random generator whose
// output is fixed by its definition. std::uniform_int_distribution is not
// (two standard libraries may draw differently), and every rank must draw
// the same permutation, and a seed must give the same synthetic data on
// every machine.
#pragma once

#include <cstdint>

namespace vqa::util {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // Uniform in [0, bound), bound > 0, without modulo bias: draws in the short
  // tail above the largest multiple of bound are rejected (for small bounds
  // that happens once in about 2^64 / bound draws).
  uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t value = next();
    while (value >= limit) value = next();
    return value % bound;
  }

 private:
  uint64_t state_;
};

}  // namespace vqa::util
