// Minimal .npy files (NumPy format 1.0, little-endian int32/int64, C order) for the dataset
// index caches, so they can be inspected with numpy.load like Megatron's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

void write_npy(const std::string& path, const std::vector<int32_t>& data,
               std::vector<int64_t> shape);  // atomic write
void write_npy(const std::string& path, const std::vector<int64_t>& data,
               std::vector<int64_t> shape);
// Reads an int32 / int64 array; throws naming the file if the dtype or shape differs.
std::vector<int32_t> read_npy_i32(const std::string& path, std::vector<int64_t>* shape);
std::vector<int64_t> read_npy_i64(const std::string& path, std::vector<int64_t>* shape);

}  // namespace loom::data
