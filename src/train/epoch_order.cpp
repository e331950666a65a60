#include "train/epoch_order.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"

namespace loom {

EpochOrder::EpochOrder(int64_t n, uint64_t seed, bool shuffle)
    : n_(n), seed_(seed), shuffle_(shuffle) {
  LOOM_CHECK(n > 0, "no examples to visit");
  permute();
}

void EpochOrder::permute() {
  order_.resize(size_t(n_));
  for (int64_t i = 0; i < n_; ++i) order_[size_t(i)] = i;
  if (!shuffle_) return;
  for (int64_t i = n_ - 1; i > 0; --i) {  // Fisher-Yates, draws keyed by (seed, epoch, i)
    const double u = uniform_at(seed_ + 0x5f7, uint64_t(epoch_), uint64_t(i));
    const int64_t j = std::min<int64_t>(i, int64_t(u * double(i + 1)));
    std::swap(order_[size_t(i)], order_[size_t(j)]);
  }
}

int64_t EpochOrder::next() {
  if (cursor_ == n_) {
    ++epoch_;
    cursor_ = 0;
    permute();
  }
  return order_[size_t(cursor_++)];
}

void EpochOrder::put_back() {
  LOOM_CHECK(cursor_ > 0, "put_back at the start of an epoch");
  --cursor_;
}

Json EpochOrder::state() const {
  Json j = Json::object();
  j["epoch"] = epoch_;
  j["cursor"] = cursor_;
  return j;
}

void EpochOrder::restore(const Json& s) {
  const int64_t e = s.at("epoch").as_int(), c = s.at("cursor").as_int();
  LOOM_CHECK(e >= 0 && c >= 0 && c <= n_, "data order state (epoch ", e, ", cursor ", c,
             ") does not fit ", n_, " examples");
  epoch_ = e;
  cursor_ = c;
  permute();
}

}  // namespace loom
