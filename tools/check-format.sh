#!/usr/bin/env bash
# Fails when a C++ source is not formatted with clang-format (LLVM style,
# .clang-format at the root). Fix with: clang-format -i FILE...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
mapfile -t files < <(git ls-files '*.cpp' '*.h' 2>/dev/null || find frontend dialect compiler tools tests -name '*.cpp' -o -name '*.h')
clang-format --dry-run -Werror "${files[@]}"
echo "clang-format: ${#files[@]} files formatted"
