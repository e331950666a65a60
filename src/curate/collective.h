// Byte-level collectives the distributed curation run is built from, over comm::Communicator:
// an all-to-all of variable-length byte blocks (in bounded rounds, so no message exceeds MPI's
// int count and the staging buffers stay small), gather to one rank and broadcast of a string.
// Called from the main thread only (the MPI communicator is MPI_THREAD_FUNNELED).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace loom::curate {

// Block r of `out` goes to rank r (out.size() == c.size()); returns the block each rank sent
// to this one, in rank order. Collective: every rank calls it. Blocks travel in rounds of at
// most `round_bytes` per peer.
std::vector<std::string> exchange_bytes(comm::Communicator& c, std::vector<std::string> out,
                                        size_t round_bytes = 16u << 20);

// Every rank's string, in rank order, on `root` (empty vector elsewhere).
std::vector<std::string> gather_bytes(comm::Communicator& c, std::string mine, int root = 0);

// root's string on every rank.
std::string broadcast_bytes(comm::Communicator& c, std::string s, int root = 0);

// Element-wise sum over ranks, in place.
void sum_i64(comm::Communicator& c, std::vector<int64_t>& v);

// True on every rank when `mine` is true on any rank.
bool any_rank(comm::Communicator& c, bool mine);

// Appends a trivially copyable value / array to a byte block, and reads them back.
template <class T>
void put(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
std::vector<T> as_array(const std::string& s) {
  std::vector<T> v(s.size() / sizeof(T));
  if (!v.empty()) __builtin_memcpy(static_cast<void*>(v.data()), s.data(), v.size() * sizeof(T));
  return v;
}

}  // namespace loom::curate
