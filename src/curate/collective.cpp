#include "curate/collective.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace loom::curate {

std::vector<std::string> exchange_bytes(comm::Communicator& c, std::vector<std::string> out,
                                        size_t round_bytes) {
  const int P = c.size();
  LOOM_CHECK(static_cast<int>(out.size()) == P, "exchange_bytes: ", out.size(), " blocks for ", P,
             " ranks");
  std::vector<int64_t> send_len(static_cast<size_t>(P)), recv_len(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r)
    send_len[static_cast<size_t>(r)] = static_cast<int64_t>(out[r].size());
  c.all_to_all(send_len.data(), recv_len.data(), 1, DType::I64);
  std::vector<std::string> in(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) in[static_cast<size_t>(r)].reserve(static_cast<size_t>(recv_len[r]));
  round_bytes = std::max<size_t>(round_bytes, 1);
  std::vector<size_t> sent(static_cast<size_t>(P), 0);
  std::string sbuf, rbuf;
  for (;;) {
    // This round's block size: the largest remainder of any pair, capped, agreed by all.
    int64_t left = 0;
    for (int r = 0; r < P; ++r)
      left = std::max<int64_t>(left, static_cast<int64_t>(out[r].size() - sent[r]));
    for (int r = 0; r < P; ++r)
      left = std::max<int64_t>(left, recv_len[r] - static_cast<int64_t>(in[r].size()));
    left = c.all_reduce_scalar(left, comm::ReduceOp::Max);
    if (left == 0) break;
    const size_t n = std::min<size_t>(static_cast<size_t>(left), round_bytes);
    sbuf.assign(n * static_cast<size_t>(P), '\0');
    rbuf.assign(n * static_cast<size_t>(P), '\0');
    for (int r = 0; r < P; ++r) {
      size_t k = std::min(n, out[r].size() - sent[r]);
      if (k) std::memcpy(sbuf.data() + n * static_cast<size_t>(r), out[r].data() + sent[r], k);
      sent[r] += k;
    }
    c.all_to_all(sbuf.data(), rbuf.data(), static_cast<int64_t>(n), DType::U8);
    for (int r = 0; r < P; ++r) {
      size_t k = std::min<size_t>(n, static_cast<size_t>(recv_len[r]) - in[r].size());
      in[r].append(rbuf.data() + n * static_cast<size_t>(r), k);
    }
  }
  return in;
}

std::vector<std::string> gather_bytes(comm::Communicator& c, std::string mine, int root) {
  std::vector<std::string> out(static_cast<size_t>(c.size()));
  out[static_cast<size_t>(root)] = std::move(mine);
  auto in = exchange_bytes(c, std::move(out));
  if (c.rank() != root) in.clear();
  return in;
}

std::string broadcast_bytes(comm::Communicator& c, std::string s, int root) {
  int64_t n = c.rank() == root ? static_cast<int64_t>(s.size()) : 0;
  c.broadcast(&n, 1, DType::I64, root);
  s.resize(static_cast<size_t>(n));
  // In pieces below MPI's int count.
  const size_t piece = 1u << 30;
  for (size_t at = 0; at < s.size(); at += piece)
    c.broadcast(s.data() + at, static_cast<int64_t>(std::min(piece, s.size() - at)), DType::U8,
                root);
  return s;
}

void sum_i64(comm::Communicator& c, std::vector<int64_t>& v) {
  if (!v.empty())
    c.all_reduce(v.data(), static_cast<int64_t>(v.size()), DType::I64, comm::ReduceOp::Sum);
}

bool any_rank(comm::Communicator& c, bool mine) {
  return c.all_reduce_scalar(static_cast<int64_t>(mine), comm::ReduceOp::Max) > 0;
}

}  // namespace loom::curate
