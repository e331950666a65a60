#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

using namespace loom;

TEST(Tensor, ShapesViewsAndConversion) {
  Tensor t = Tensor::zeros({2, 3});
  for (int i = 0; i < 6; ++i) t.data<float>()[i] = static_cast<float>(i) + 0.1f;
  EXPECT_EQ(t.numel(), 6);
  Tensor r = t.reshape({3, 2});
  EXPECT_EQ(r.data<float>(), t.data<float>());  // a view
  Tensor s = t.slice(1, 2);
  EXPECT_EQ(s.data<float>()[0], 3.1f);
  Tensor tt = t.transpose(0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  Tensor c = tt.clone();
  EXPECT_EQ(c.data<float>()[1], 3.1f);  // element (0,1) of the transpose = t(1,0)
  Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.nbytes(), 12u);
  EXPECT_EQ(b.to(DType::F32).data<float>()[5], round_bf16(5.1f));
  EXPECT_THROW(t.reshape({4, 2}), Error);
  EXPECT_THROW(t.slice(1, 3), Error);
  EXPECT_THROW(tt.reshape({6}), Error);
}
