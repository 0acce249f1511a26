// A hash of a string that is the same in every build and on every host
// (std::hash is not), for comparing texts across ranks.
#pragma once

#include <cstdint>
#include <string>

namespace vqa::util {

// FNV-1a, 64 bits.
inline uint64_t stable_hash(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char byte : text) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace vqa::util
