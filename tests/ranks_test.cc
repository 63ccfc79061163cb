// core/ranks.h (the shares of a data-parallel job) and core/hash.h (FNV-1a 64 digests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/hash.h"
#include "core/ranks.h"

namespace woq {
namespace {

TEST(Ranks, SharesCoverEveryItemOnceInRankOrder) {
  for (const std::int64_t n : {0, 1, 2, 5, 7, 181, 1000})
    for (int size = 1; size <= 9; ++size) {
      std::int64_t next = 0, smallest = n, largest = 0;
      for (int r = 0; r < size; ++r) {
        const auto [first, last] = share(n, r, size);
        EXPECT_EQ(first, next) << n << " items, rank " << r << " of " << size;
        EXPECT_LE(first, last);
        smallest = std::min(smallest, last - first);
        largest = std::max(largest, last - first);
        next = last;
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(largest - smallest, 1) << n << " items over " << size;
    }
  EXPECT_EQ(share(7, 0, 3), (std::pair<std::int64_t, std::int64_t>{0, 3}));  // the lower ranks take the larger
  EXPECT_EQ(share(7, 2, 3), (std::pair<std::int64_t, std::int64_t>{5, 7}));
  EXPECT_THROW(share(7, 3, 3), Error);
  EXPECT_THROW(share(7, 0, 0), Error);
  EXPECT_THROW(share(-1, 0, 1), Error);
}

TEST(Ranks, OneProcessGathersItsOwnDoubles) {
  Ranks& one = one_process();
  EXPECT_EQ(one.rank(), 0);
  EXPECT_EQ(one.size(), 1);
  EXPECT_TRUE(one.leader());
  const std::vector<double> mine = {1.5, -0.0, 1e-300, 3.0};
  const std::vector<double> all = gather_doubles(one, mine);
  ASSERT_EQ(all.size(), mine.size());
  for (std::size_t i = 0; i < all.size(); ++i) EXPECT_EQ(std::signbit(all[i]), std::signbit(mine[i]));
  EXPECT_EQ(all, mine);
  EXPECT_TRUE(gather_doubles(one, {}).empty());
}

TEST(Ranks, LaunchedRanksReadsTheLaunchersVariable) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) unsetenv(v);
  EXPECT_EQ(launched_ranks(), 1);
  setenv("PMI_SIZE", "3", 1);
  EXPECT_EQ(launched_ranks(), 3);
  setenv("PMI_SIZE", "3x", 1);
  EXPECT_THROW(launched_ranks(), Error);
  setenv("PMI_SIZE", "0", 1);
  EXPECT_THROW(launched_ranks(), Error);
  unsetenv("PMI_SIZE");
}

// Reference values of FNV-1a 64 (the FNV authors' test vectors).
TEST(Fnv1a64, KnownDigestsAndPiecewiseFeeding) {
  EXPECT_EQ(Fnv1a64{}.hex(), "cbf29ce484222325");
  EXPECT_EQ(Fnv1a64{}.add("a").hex(), "af63dc4c8601ec8c");
  EXPECT_EQ(Fnv1a64{}.add("foobar").hex(), "85944171f73967e8");
  EXPECT_EQ(Fnv1a64{}.add("foo").add("bar").hex(), "85944171f73967e8");
  const std::string s = "foobar";
  EXPECT_EQ(fnv1a64_hex(s.data(), s.size()), "85944171f73967e8");
}

}  // namespace
}  // namespace woq
