//===- BlockManager.h - Physical page allocator with refcounts --*- C++ -*-===//
//
// Hands out the physical pages of a paged KV cache. A page is free (refcount
// 0) or used by one or more sequences (refcount >= 1); prefix sharing and
// fork retain a page once per extra user, and a page returns to the free list
// when its last user releases it. Allocation order is deterministic: a fresh
// manager hands out 0, 1, 2, ...; a released page is the next one handed out.
//
// Not thread-safe: one thread (the host scheduler) owns a manager.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_BLOCKMANAGER_H
#define VFLOW_RUNTIME_BLOCKMANAGER_H

#include <cstdint>
#include <optional>
#include <vector>

namespace vflow {
namespace rt {

/// A physical page id in [0, numPages).
using PageId = int32_t;

class BlockManager {
public:
  /// Throws Error unless 0 < numPages.
  explicit BlockManager(int64_t numPages);

  /// A free page with refcount 1. Throws Error ("KV cache exhausted: all N
  /// pages are in use") when none is free.
  PageId allocate();
  /// Like allocate(), but gives nothing when every page is in use.
  std::optional<PageId> tryAllocate();

  /// Adds a user to a used page. Throws Error for a free or out-of-range page.
  void retain(PageId page);
  /// Removes a user; the page becomes free when none is left. Returns true
  /// when it did. Throws Error for a free or out-of-range page.
  bool release(PageId page);

  int32_t refCount(PageId page) const;
  bool isFree(PageId page) const { return refCount(page) == 0; }

  int32_t numPages() const { return static_cast<int32_t>(refCounts.size()); }
  int32_t numFree() const { return static_cast<int32_t>(freeList.size()); }
  int32_t numUsed() const { return numPages() - numFree(); }

private:
  void checkPage(PageId page, const char *operation) const;

  std::vector<int32_t> refCounts;
  /// Free pages; the back is handed out next.
  std::vector<PageId> freeList;
};

} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_BLOCKMANAGER_H
