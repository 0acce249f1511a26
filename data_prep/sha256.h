// SHA-256 (FIPS 180-4) of a file's bytes, as `sha256sum` prints it: the
// dataset file records the digests of the tokenizer files it was built from,
// so that anyone can check them with standard tools. Not used for security.
#pragma once

#include <cstdint>
#include <string>

namespace vqa::prep {

// Lower-case hex digest of `bytes`.
std::string sha256_hex(const std::string& bytes);

}  // namespace vqa::prep
