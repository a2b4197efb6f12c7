// RUN: vflow-opt %s --vt-incremental-cache --split-input-file | FileCheck %s
// Reductions over token of per-token values merge as tokens arrive; an
// elementwise epilogue (sqrt) is a finalize step.

// CHECK-LABEL: vt.flow @quest
// CHECK: vt.cache_field @kmax : !vt.tensor<[dim:D], bf16> {finalize = false, merge = "max"}
// CHECK: vt.cache_field @kmin : !vt.tensor<[dim:D], bf16> {finalize = false, merge = "min"}
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

// CHECK-LABEL: vt.flow @eps
// CHECK: vt.cache_field @G : !vt.tensor<[m:8, n:8], f32> {finalize = false, merge = "sum"}
// CHECK: vt.cache_field @frob : !vt.tensor<[], f32> {finalize = true, merge = "sum"}
module {
  vt.flow @eps {
    vt.param compile_time @block_size = 128 : i64
    vt.param @budget = 32 : i64
    vt.param @alpha = 1.100000e+00 : f64
    vt.param @keep_last = 8 : i64
    vt.param compile_time @sketch = 8 : i64
    vt.param @keep_first = 1 : i64
    vt.param compile_time @head_dim = 0 : i64
    vt.axis @m = 8
    vt.const @Phi : !vt.tensor<[dim:D, m:8], f32> {
      %0 = vt.rademacher {seed = 0 : i64} : !vt.tensor<[dim:D, m:8], f32>
      %1 = vt.constant 8.000000e+00 : !vt.tensor<[], f32>
      %2 = vt.sqrt %1 : !vt.tensor<[], f32> -> !vt.tensor<[], f32>
      %3 = vt.div %0, %2 : !vt.tensor<[dim:D, m:8], f32>, !vt.tensor<[], f32> -> !vt.tensor<[dim:D, m:8], f32>
      vt.yield %3 : !vt.tensor<[dim:D, m:8], f32>
    }
    vt.cache_field @G : !vt.tensor<[m:8, n:8], f32>
    vt.cache_field @frob : !vt.tensor<[], f32>
    vt.cache_stage {
      %0 = vt.input K : !vt.tensor<[token:128, dim:D], f32>
      %1 = vt.const_load @Phi : !vt.tensor<[dim:D, m:8], f32>
      %2 = vt.mul %0, %1 : !vt.tensor<[token:128, dim:D], f32>, !vt.tensor<[dim:D, m:8], f32> -> !vt.tensor<[token:128, dim:D, m:8], f32>
      %3 = vt.reduce sum %2 [dim] : !vt.tensor<[token:128, dim:D, m:8], f32> -> !vt.tensor<[token:128, m:8], f32>
      %4 = vt.rename %3 "m" -> "n" : !vt.tensor<[token:128, m:8], f32> -> !vt.tensor<[token:128, n:8], f32>
      %5 = vt.mul %3, %4 : !vt.tensor<[token:128, m:8], f32>, !vt.tensor<[token:128, n:8], f32> -> !vt.tensor<[token:128, m:8, n:8], f32>
      %6 = vt.reduce sum %5 [token] : !vt.tensor<[token:128, m:8, n:8], f32> -> !vt.tensor<[m:8, n:8], f32>
      vt.field_store @G, %6 : !vt.tensor<[m:8, n:8], f32>
      %7 = vt.mul %0, %0 : !vt.tensor<[token:128, dim:D], f32>, !vt.tensor<[token:128, dim:D], f32> -> !vt.tensor<[token:128, dim:D], f32>
      %8 = vt.reduce sum %7 [token, dim] : !vt.tensor<[token:128, dim:D], f32> -> !vt.tensor<[], f32>
      %9 = vt.sqrt %8 : !vt.tensor<[], f32> -> !vt.tensor<[], f32>
      vt.field_store @frob, %9 : !vt.tensor<[], f32>
      vt.yield
    }
    vt.index_stage {
      %0 = vt.input q : !vt.tensor<[head:G, dim:D], f32>
      %1 = vt.const_load @Phi : !vt.tensor<[dim:D, m:8], f32>
      %2 = vt.mul %0, %1 : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[dim:D, m:8], f32> -> !vt.tensor<[head:G, dim:D, m:8], f32>
      %3 = vt.reduce sum %2 [dim] : !vt.tensor<[head:G, dim:D, m:8], f32> -> !vt.tensor<[head:G, m:8], f32>
      %4 = vt.field_load @G : !vt.tensor<[block:N, m:8, n:8], f32>
      %5 = vt.mul %4, %3 : !vt.tensor<[block:N, m:8, n:8], f32>, !vt.tensor<[head:G, m:8], f32> -> !vt.tensor<[block:N, head:G, m:8, n:8], f32>
      %6 = vt.rename %3 "m" -> "n" : !vt.tensor<[head:G, m:8], f32> -> !vt.tensor<[head:G, n:8], f32>
      %7 = vt.mul %5, %6 : !vt.tensor<[block:N, head:G, m:8, n:8], f32>, !vt.tensor<[head:G, n:8], f32> -> !vt.tensor<[block:N, head:G, m:8, n:8], f32>
      %8 = vt.reduce sum %7 [m, n] : !vt.tensor<[block:N, head:G, m:8, n:8], f32> -> !vt.tensor<[block:N, head:G], f32>
      %9 = vt.reduce max %8 [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
      %10 = vt.sqrt %9 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
      %11 = vt.field_load @frob : !vt.tensor<[block:N], f32>
      %12 = vt.reduce l2norm %0 [dim] : !vt.tensor<[head:G, dim:D], f32> -> !vt.tensor<[head:G], f32>
      %13 = vt.reduce max %12 [head] : !vt.tensor<[head:G], f32> -> !vt.tensor<[], f32>
      %14 = vt.mul %11, %13 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
      %15 = vt.minimum %10, %14 : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
      %16 = vt.param_load @budget : !vt.tensor<[], f32>
      %17 = vt.kth_largest %15, %16 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
      %18 = vt.param_load @alpha : !vt.tensor<[], f32>
      %19 = vt.div %17, %18 : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
      %20 = vt.constant 2.000000e+00 : !vt.tensor<[], f32>
      %21 = vt.param_load @budget : !vt.tensor<[], f32>
      %22 = vt.mul %20, %21 : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
      %23 = vt.threshold %15, %19, %22 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32>
      vt.return %23 : !vt.selection
    }
  }
}

// -----

// mean needs a count (finalize); a reduction over split tokens is not a
// per-token merge.
// CHECK-LABEL: vt.flow @f
// CHECK: vt.cache_field @m : !vt.tensor<[dim:4], f32> {finalize = true, merge = "mean"}
// CHECK: vt.cache_field @s : !vt.tensor<[dim:4, sub:2], f32> {finalize = false, merge = "none"}
module {
  vt.flow @f {
    vt.param compile_time @block_size = 8 : i64
    vt.param compile_time @head_dim = 4 : i64
    vt.cache_field @m : !vt.tensor<[dim:4], f32>
    vt.cache_field @s : !vt.tensor<[dim:4, sub:2], f32>
    vt.cache_stage {
      %0 = vt.input K : !vt.tensor<[token:8, dim:4], f32>
      %1 = vt.reduce mean %0 [token] : !vt.tensor<[token:8, dim:4], f32> -> !vt.tensor<[dim:4], f32>
      vt.field_store @m, %1 : !vt.tensor<[dim:4], f32>
      %2 = vt.split %0 "token" -> "sub" x 2 : !vt.tensor<[token:8, dim:4], f32> -> !vt.tensor<[token:4, dim:4, sub:2], f32>
      %3 = vt.reduce max %2 [token] : !vt.tensor<[token:4, dim:4, sub:2], f32> -> !vt.tensor<[dim:4, sub:2], f32>
      vt.field_store @s, %3 : !vt.tensor<[dim:4, sub:2], f32>
      vt.yield
    }
    vt.index_stage {
      %0 = vt.input position : !vt.tensor<[block:N], f32>
      %1 = vt.constant 2.0 : !vt.tensor<[], f32>
      %2 = vt.topk %0, %1 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
      vt.return %2 : !vt.selection
    }
  }
}
