// RUN: vflow-opt %s --split-input-file --vt-fuse-kernels --vt-plan-launches | FileCheck %s
// RUN: vflow-opt %s --split-input-file --vt-fuse-kernels --vt-plan-launches=tile-blocks=128 | FileCheck %s --check-prefix=TILE
// RUN: not vflow-opt %s --split-input-file --vt-fuse-kernels --vt-plan-launches=tile-blocks=0 2>&1 | FileCheck %s --check-prefix=ZERO
// Every kernel gets its launch, the one the CUDA backend emits and the
// runtime launches: the cache stage over pages, block maps over tiles of
// blocks, cross-block and select kernels over whole lists.

// CHECK-LABEL: vt.flow @quest
// CHECK: vt.kernel cache_map launch <fields, threads = 256> {
// CHECK: vt.kernel block_map launch <tile, threads = 256, tile_blocks = 64> {
// CHECK: vt.kernel select launch <row, threads = 512> {
// TILE-LABEL: vt.flow @quest
// TILE: vt.kernel block_map launch <tile, threads = 256, tile_blocks = 128> {
// ZERO: error: --tile-blocks must be at least 1
module {
  vt.flow @quest {
    vt.param @budget = 64 : i64
    vt.param compile_time @block_size = 16 : i64
    vt.param @keep_first = 1 : i64
    vt.param @keep_last = 1 : i64
    vt.param compile_time @head_dim = 0 : i64
    vt.cache_field @kmax : !vt.tensor<[dim:D], bf16>
    vt.cache_field @kmin : !vt.tensor<[dim:D], bf16>
    vt.cache_stage {
      %0 = vt.input K : !vt.tensor<[token:16, dim:D], f32>
      %1 = vt.reduce max %0 [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
      vt.field_store @kmax, %1 : !vt.tensor<[dim:D], f32>
      %2 = vt.reduce min %0 [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
      vt.field_store @kmin, %2 : !vt.tensor<[dim:D], f32>
      vt.yield
    }
    vt.index_stage {
      %0 = vt.input q : !vt.tensor<[head:G, dim:D], f32>
      %1 = vt.field_load @kmax : !vt.tensor<[block:N, dim:D], f32>
      %2 = vt.mul %0, %1 : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
      %3 = vt.field_load @kmin : !vt.tensor<[block:N, dim:D], f32>
      %4 = vt.mul %0, %3 : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
      %5 = vt.maximum %2, %4 : !vt.tensor<[block:N, head:G, dim:D], f32>, !vt.tensor<[block:N, head:G, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
      %6 = vt.reduce sum %5 [dim] : !vt.tensor<[block:N, head:G, dim:D], f32> -> !vt.tensor<[block:N, head:G], f32>
      %7 = vt.reduce max %6 [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
      %8 = vt.param_load @budget : !vt.tensor<[], f32>
      %9 = vt.topk %7, %8 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
      vt.return %9 : !vt.selection
    }
  }
}

// -----

// CHECK-LABEL: vt.flow @above_mean
// CHECK: vt.kernel cache_map launch <fields, threads = 256> {
// CHECK: vt.kernel block_map launch <tile, threads = 256, tile_blocks = 64> {
// CHECK: vt.kernel cross_block launch <row, threads = 512> {
// CHECK: vt.kernel block_map launch <tile, threads = 256, tile_blocks = 64> {
// CHECK: vt.kernel cross_block launch <row, threads = 512> {
// CHECK: vt.kernel block_map launch <tile, threads = 256, tile_blocks = 64> {
// CHECK: vt.kernel select launch <row, threads = 512> {
// TILE-LABEL: vt.flow @above_mean
// TILE: vt.kernel block_map launch <tile, threads = 256, tile_blocks = 128> {
module {
  vt.flow @above_mean {
    vt.param @max_blocks = 128 : i64
    vt.param @margin = 1.000000e+00 : f64
    vt.param compile_time @block_size = 16 : i64
    vt.param @keep_first = 1 : i64
    vt.param @keep_last = 1 : i64
    vt.param compile_time @head_dim = 0 : i64
    vt.cache_field @centroid : !vt.tensor<[dim:D], bf16>
    vt.cache_stage {
      %0 = vt.input K : !vt.tensor<[token:16, dim:D], f32>
      %1 = vt.reduce mean %0 [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
      vt.field_store @centroid, %1 : !vt.tensor<[dim:D], f32>
      vt.yield
    }
    vt.index_stage {
      %0 = vt.input q : !vt.tensor<[head:G, dim:D], f32>
      %1 = vt.field_load @centroid : !vt.tensor<[block:N, dim:D], f32>
      %2 = vt.mul %0, %1 : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
      %3 = vt.reduce sum %2 [dim] : !vt.tensor<[block:N, head:G, dim:D], f32> -> !vt.tensor<[block:N, head:G], f32>
      %4 = vt.reduce max %3 [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
      %5 = vt.reduce mean %4 [block] : !vt.tensor<[block:N], f32> -> !vt.tensor<[], f32>
      %6 = vt.sub %4, %5 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
      %7 = vt.sub %4, %5 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
      %8 = vt.mul %6, %7 : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
      %9 = vt.reduce mean %8 [block] : !vt.tensor<[block:N], f32> -> !vt.tensor<[], f32>
      %10 = vt.sqrt %9 : !vt.tensor<[], f32> -> !vt.tensor<[], f32>
      %11 = vt.param_load @margin : !vt.tensor<[], f32>
      %12 = vt.mul %11, %10 : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
      %13 = vt.add %5, %12 : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
      %14 = vt.param_load @max_blocks : !vt.tensor<[], f32>
      %15 = vt.threshold %4, %13, %14 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32>
      vt.return %15 : !vt.selection
    }
  }
}

