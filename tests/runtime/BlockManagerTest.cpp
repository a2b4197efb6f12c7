//===- BlockManagerTest.cpp - Page allocator and refcounts ----------------===//

#include "vflow/Runtime/BlockManager.h"

#include "TestUtil.h"

#include <gtest/gtest.h>

using namespace vflow::rt;
using vflow::rt::test::expectError;

namespace {

TEST(BlockManager, AllocatesInOrderAndCountsUsers) {
  BlockManager manager(4);
  EXPECT_EQ(manager.numPages(), 4);
  EXPECT_EQ(manager.numFree(), 4);
  EXPECT_EQ(manager.numUsed(), 0);
  EXPECT_EQ(manager.allocate(), 0);
  EXPECT_EQ(manager.allocate(), 1);
  EXPECT_EQ(manager.numFree(), 2);
  EXPECT_EQ(manager.numUsed(), 2);
  EXPECT_EQ(manager.refCount(0), 1);
  EXPECT_EQ(manager.refCount(2), 0);
  EXPECT_TRUE(manager.isFree(3));

  manager.retain(1);
  manager.retain(1);
  EXPECT_EQ(manager.refCount(1), 3);
  EXPECT_FALSE(manager.release(1));
  EXPECT_FALSE(manager.release(1));
  EXPECT_EQ(manager.refCount(1), 1);
  EXPECT_EQ(manager.numUsed(), 2);
  EXPECT_TRUE(manager.release(1));
  EXPECT_TRUE(manager.isFree(1));
  EXPECT_EQ(manager.numFree(), 3);
  // The page released last is handed out next.
  EXPECT_EQ(manager.allocate(), 1);
  EXPECT_EQ(manager.allocate(), 2);
}

TEST(BlockManager, ExhaustionThrowsWithTheNumbers) {
  BlockManager manager(3);
  for (int i = 0; i < 3; ++i)
    manager.allocate();
  EXPECT_EQ(manager.numFree(), 0);
  EXPECT_FALSE(manager.tryAllocate().has_value());
  expectError([&] { manager.allocate(); }, "KV cache exhausted",
              "all 3 pages are in use");
  EXPECT_EQ(manager.numUsed(), 3);
  manager.release(2);
  EXPECT_EQ(manager.tryAllocate(), std::optional<PageId>(2));
}

TEST(BlockManager, RejectsBadPages) {
  expectError([] { BlockManager manager(0); }, "numPages", "got 0");
  expectError([] { BlockManager manager(-5); }, "got -5");
  BlockManager manager(2);
  expectError([&] { manager.retain(0); }, "retain page 0", "free");
  expectError([&] { manager.release(1); }, "release page 1", "free");
  expectError([&] { manager.release(2); }, "page 2", "[0, 2)");
  expectError([&] { manager.retain(-1); }, "page -1");
  expectError([&] { manager.refCount(7); }, "page 7 is out of range");
  PageId page = manager.allocate();
  manager.release(page);
  expectError([&] { manager.release(page); }, "it is free");
}

} // namespace
