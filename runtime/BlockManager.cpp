//===- BlockManager.cpp - Physical page allocator with refcounts ----------===//

#include "vflow/Runtime/BlockManager.h"
#include "vflow/Runtime/Error.h"

#include <limits>
#include <string>

using namespace vflow::rt;

BlockManager::BlockManager(int64_t numPages) {
  if (numPages <= 0 || numPages > std::numeric_limits<PageId>::max())
    throw Error("block manager: numPages must be in [1, " +
                std::to_string(std::numeric_limits<PageId>::max()) + "], got " +
                std::to_string(numPages));
  refCounts.assign(static_cast<size_t>(numPages), 0);
  freeList.reserve(static_cast<size_t>(numPages));
  for (int64_t page = numPages - 1; page >= 0; --page)
    freeList.push_back(static_cast<PageId>(page));
}

std::optional<PageId> BlockManager::tryAllocate() {
  if (freeList.empty())
    return std::nullopt;
  PageId page = freeList.back();
  freeList.pop_back();
  refCounts[page] = 1;
  return page;
}

PageId BlockManager::allocate() {
  if (std::optional<PageId> page = tryAllocate())
    return *page;
  throw Error("KV cache exhausted: all " + std::to_string(numPages()) +
              " pages are in use");
}

void BlockManager::checkPage(PageId page, const char *operation) const {
  if (page < 0 || page >= numPages())
    throw Error(std::string("block manager: cannot ") + operation + " page " +
                std::to_string(page) + ": page ids are in [0, " +
                std::to_string(numPages()) + ")");
  if (refCounts[page] == 0)
    throw Error(std::string("block manager: cannot ") + operation + " page " +
                std::to_string(page) + ": it is free (refcount 0)");
}

void BlockManager::retain(PageId page) {
  checkPage(page, "retain");
  ++refCounts[page];
}

bool BlockManager::release(PageId page) {
  checkPage(page, "release");
  if (--refCounts[page] > 0)
    return false;
  freeList.push_back(page);
  return true;
}

int32_t BlockManager::refCount(PageId page) const {
  if (page < 0 || page >= numPages())
    throw Error("block manager: page " + std::to_string(page) +
                " is out of range: page ids are in [0, " +
                std::to_string(numPages()) + ")");
  return refCounts[page];
}
