// RUN: vflow-opt %s --vt-fuse-kernels --vt-plan-launches | FileCheck %s
// RUN: vflow-opt %s --vt-fuse-kernels --vt-plan-launches=tile-blocks=128 | FileCheck %s --check-prefix=TILE
// Every kernel gets a launch plan.

// CHECK: vt.kernel cache_map attributes {plan = {grid = "page_kvhead", reads_kv = false, widest = ["token:16", "dim:D"]}}
// CHECK: vt.kernel block_map attributes {plan = {grid = "seq_kvhead_tile", reads_kv = false, tile_blocks = 64 : i64, widest = ["head:G", "dim:D"]}}
// CHECK: vt.kernel select attributes {plan = {grid = "seq_kvhead", reads_kv = false, widest = []}}
// TILE: tile_blocks = 128 : i64
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
