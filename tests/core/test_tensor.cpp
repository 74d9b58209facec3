// Tensor basics: factories, views share storage, contiguity, host access, shape errors.
#include <gtest/gtest.h>

#include "helpers.h"

using namespace toy;
using namespace toy::test;

TEST(Tensor, FactoriesAndHostAccess) {
  Tensor z = zeros(Shape{2, 3});
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.strides(), (Strides{3, 1}));
  for (float v : z.to_f32_vector()) EXPECT_EQ(v, 0.0f);
  Tensor f = full(Shape{2}, 2.5, DType::BF16);
  EXPECT_EQ(f.to_f32_vector(), (std::vector<float>{2.5f, 2.5f}));
  Tensor a = arange(5, DType::I32);
  EXPECT_EQ(a.to_i32_vector(), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(scalar(3.0).item(), 3.0);
  EXPECT_EQ(scalar(3.0).ndim(), 0);
  Tensor v = from_vector(std::vector<float>{1, 2, 3, 4}, Shape{2, 2}, DType::F16);
  EXPECT_EQ(v.to_f32_vector(), (std::vector<float>{1, 2, 3, 4}));
}

TEST(Tensor, EmptyAndSizeOneDims) {
  Tensor e = zeros(Shape{0, 4});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(e.to_f32_vector().empty());
  Tensor s = add(zeros(Shape{0, 4}), ones(Shape{4}));
  EXPECT_EQ(s.shape(), (Shape{0, 4}));
  Tensor one = ones(Shape{1, 1, 3});
  EXPECT_TRUE(one.is_contiguous());
}

TEST(Tensor, ViewsShareStorage) {
  Tensor x = from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, Shape{2, 3});
  Tensor t = transpose(x);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.storage().get(), x.storage().get());
  EXPECT_EQ(t.to_f32_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor s = slice(x, 1, 1, 3);
  EXPECT_EQ(s.to_f32_vector(), (std::vector<float>{1, 2, 4, 5}));
  Tensor r = reshape(x, Shape{3, -1});
  EXPECT_EQ(r.storage().get(), x.storage().get());
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  // reshape of a transposed view must copy; view must refuse.
  Tensor rc = reshape(t, Shape{6});
  EXPECT_NE(rc.storage().get(), x.storage().get());
  EXPECT_EQ(rc.to_f32_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(view(t, Shape{6}), Error);
}

TEST(Tensor, DetachSharesStorageWithoutHistory) {
  Tensor x = param(ones(Shape{3}));
  Tensor y = scale(x, 2.0f);
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.storage().get(), y.storage().get());
  EXPECT_TRUE(y.requires_grad());
}

TEST(Tensor, ErrorsNameWhatWasExpected) {
  Tensor x = zeros(Shape{2, 3});
  try {
    x.data<int32_t>();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos);
  }
  EXPECT_THROW(x.item(), Error);
  EXPECT_THROW(empty(Shape{2, -1}), Error);
  EXPECT_THROW(empty(Shape{2, 33}, DType::Q8_0), Error);
  EXPECT_THROW(x.size(2), Error);
  EXPECT_THROW(arange(3, DType::I32).requires_grad_(), Error);
  EXPECT_THROW(Tensor().raw_data(), Error);
}
