#include "base/status.h"

#include <gtest/gtest.h>

namespace dserve {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return invalid_argument("not positive: " + std::to_string(x));
  return x;
}

Result<int> doubled(int x) {
  DS_ASSIGN_OR_RETURN(int v, parse_positive(x));
  return 2 * v;
}

TEST(StatusTest, PropagatesErrorsAndValues) {
  EXPECT_EQ(doubled(4).value(), 8);
  Result<int> bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().to_string(), "invalid argument: not positive: -1");
  EXPECT_EQ(bad.status().with_context("f.gguf").message(), "f.gguf: not positive: -1");
}

}  // namespace
}  // namespace dserve
