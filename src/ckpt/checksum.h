// Content checksums for checkpoints: XXH64 (the xxHash 64-bit algorithm, the one zstd frames
// carry), written here because Debian's libzstd does not export its copy. Not cryptographic: it
// detects flipped bytes, truncation and mixed-up files, not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom::ckpt {

uint64_t xxh64(const void* data, size_t n, uint64_t seed = 0);

// 16 lowercase hex digits, and back; parse_hex64 is false for anything else.
std::string hex64(uint64_t v);
bool parse_hex64(const std::string& s, uint64_t* out);

}  // namespace loom::ckpt
