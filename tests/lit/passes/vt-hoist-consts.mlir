// RUN: vflow-opt %s --vt-hoist-consts --split-input-file | FileCheck %s
// Work on consts alone that holds a reduction moves into new consts after
// the flow's consts; values that read K, q, fields or a run-time param stay
// in the stage, and so does cheap elementwise work on consts.

// CHECK-LABEL: vt.flow @h
// CHECK: vt.const @P
// CHECK: vt.const @hoisted.0 : !vt.tensor<[dim:D], f32> {
// CHECK-NEXT: vt.const_load @P
// CHECK-NEXT: vt.reduce max %{{.*}} [m]
// CHECK: vt.const @hoisted.1 : !vt.tensor<[dim:D], f32> {
// CHECK: vt.mul
// CHECK-NEXT: vt.reduce sum %{{.*}} [m]
// CHECK: vt.const @hoisted.2 : !vt.tensor<[m:4], f32> {
// CHECK: vt.reduce l2norm %{{.*}} [dim]
// CHECK: vt.const @hoisted.3 : !vt.tensor<[], f32> {
// CHECK: vt.reduce sum %{{.*}} [dim, m]
// CHECK: vt.cache_stage {
// CHECK-NOT: vt.const_load @P
// CHECK: vt.const_load @hoisted.0
// CHECK: vt.const_load @hoisted.1
// CHECK: vt.reduce sum %{{.*}} [token, dim]
// CHECK: vt.index_stage {
// CHECK-NOT: vt.const_load @P
// CHECK: vt.const_load @hoisted.2
// The run-time param alpha keeps its product and max in the stage.
// CHECK: vt.param_load @alpha
// CHECK-NEXT: vt.mul
// CHECK-NEXT: vt.reduce max %{{.*}} [m]
// CHECK: vt.const_load @hoisted.3
module {
  vt.flow @h {
    vt.param @budget = 8 : i64
    vt.param @alpha = 2.000000e+00 : f64
    vt.param compile_time @block_size = 16 : i64
    vt.param @keep_first = 1 : i64
    vt.param @keep_last = 1 : i64
    vt.param compile_time @head_dim = 0 : i64
    vt.axis @m = 4
    vt.const @P : !vt.tensor<[dim:D, m:4], f32> {
      %0 = vt.rademacher {seed = 3 : i64} : !vt.tensor<[dim:D, m:4], f32>
      vt.yield %0 : !vt.tensor<[dim:D, m:4], f32>
    }
    vt.cache_field @s : !vt.tensor<[dim:D], bf16>
    vt.cache_field @w : !vt.tensor<[dim:D], bf16>
    vt.cache_stage {
      %0 = vt.input K : !vt.tensor<[token:16, dim:D], f32>
      %1 = vt.const_load @P : !vt.tensor<[dim:D, m:4], f32>
      %2 = vt.reduce max %1 [m] : !vt.tensor<[dim:D, m:4], f32> -> !vt.tensor<[dim:D], f32>
      %3 = vt.mul %0, %2 : !vt.tensor<[token:16, dim:D], f32>, !vt.tensor<[dim:D], f32> -> !vt.tensor<[token:16, dim:D], f32>
      %4 = vt.reduce sum %3 [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
      vt.field_store @s, %4 : !vt.tensor<[dim:D], f32>
      %5 = vt.const_load @P : !vt.tensor<[dim:D, m:4], f32>
      %6 = vt.constant 2.000000e+00 : !vt.tensor<[], f32>
      %7 = vt.mul %5, %6 : !vt.tensor<[dim:D, m:4], f32>, !vt.tensor<[], f32> -> !vt.tensor<[dim:D, m:4], f32>
      %8 = vt.reduce sum %7 [m] : !vt.tensor<[dim:D, m:4], f32> -> !vt.tensor<[dim:D], f32>
      %9 = vt.reduce sum %0 [token, dim] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[], f32>
      %10 = vt.constant 0.000000e+00 : !vt.tensor<[], f32>
      %11 = vt.mul %9, %10 : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
      %12 = vt.add %8, %11 : !vt.tensor<[dim:D], f32>, !vt.tensor<[], f32> -> !vt.tensor<[dim:D], f32>
      vt.field_store @w, %12 : !vt.tensor<[dim:D], f32>
      vt.yield
    }
    vt.index_stage {
      %0 = vt.input q : !vt.tensor<[head:G, dim:D], f32>
      %1 = vt.const_load @P : !vt.tensor<[dim:D, m:4], f32>
      %2 = vt.reduce l2norm %1 [dim] : !vt.tensor<[dim:D, m:4], f32> -> !vt.tensor<[m:4], f32>
      %3 = vt.field_load @s : !vt.tensor<[block:N, dim:D], f32>
      %4 = vt.mul %0, %3 : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
      %5 = vt.reduce sum %4 [dim] : !vt.tensor<[block:N, head:G, dim:D], f32> -> !vt.tensor<[block:N, head:G], f32>
      %6 = vt.reduce sum %5 [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
      %7 = vt.param_load @alpha : !vt.tensor<[], f32>
      %8 = vt.mul %2, %7 : !vt.tensor<[m:4], f32>, !vt.tensor<[], f32> -> !vt.tensor<[m:4], f32>
      %9 = vt.reduce max %8 [m] : !vt.tensor<[m:4], f32> -> !vt.tensor<[], f32>
      %10 = vt.mul %6, %9 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
      %11 = vt.field_load @w : !vt.tensor<[block:N, dim:D], f32>
      %12 = vt.reduce sum %11 [dim] : !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N], f32>
      %13 = vt.const_load @P : !vt.tensor<[dim:D, m:4], f32>
      %14 = vt.reduce sum %13 [dim, m] : !vt.tensor<[dim:D, m:4], f32> -> !vt.tensor<[], f32>
      %15 = vt.mul %12, %14 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
      %16 = vt.add %10, %15 : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
      %17 = vt.param_load @budget : !vt.tensor<[], f32>
      %18 = vt.topk %16, %17 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
      vt.return %18 : !vt.selection
    }
  }
}


// -----

// CHECK-LABEL: vt.flow @cheap
// A compile-time param may feed a hoisted value; Pd * 2 has no reduction
// and stays inline in the cache stage.
// CHECK: vt.const @hoisted.0 : !vt.tensor<[], f32> {
// CHECK-NEXT: vt.const_load @Pd
// CHECK-NEXT: vt.param_load @scale
// CHECK-NEXT: vt.mul
// CHECK-NEXT: vt.reduce sum
// CHECK: vt.cache_stage {
// CHECK-NEXT: vt.input K
// CHECK-NEXT: vt.const_load @Pd
// CHECK-NEXT: vt.constant 2.0
// CHECK-NEXT: vt.mul
// CHECK: vt.index_stage {
// CHECK-NOT: vt.param_load @scale
// CHECK: vt.const_load @hoisted.0
module {
  vt.flow @cheap {
    vt.param @budget = 8 : i64
    vt.param compile_time @block_size = 16 : i64
    vt.param @keep_first = 1 : i64
    vt.param @keep_last = 1 : i64
    vt.param compile_time @head_dim = 0 : i64
    vt.param compile_time @scale = 3 : i64
    vt.const @Pd : !vt.tensor<[dim:D], f32> {
      %0 = vt.gaussian {seed = 5 : i64} : !vt.tensor<[dim:D], f32>
      vt.yield %0 : !vt.tensor<[dim:D], f32>
    }
    vt.cache_field @t : !vt.tensor<[dim:D], bf16>
    vt.cache_stage {
      %0 = vt.input K : !vt.tensor<[token:16, dim:D], f32>
      %1 = vt.const_load @Pd : !vt.tensor<[dim:D], f32>
      %2 = vt.constant 2.000000e+00 : !vt.tensor<[], f32>
      %3 = vt.mul %1, %2 : !vt.tensor<[dim:D], f32>, !vt.tensor<[], f32> -> !vt.tensor<[dim:D], f32>
      %4 = vt.mul %0, %3 : !vt.tensor<[token:16, dim:D], f32>, !vt.tensor<[dim:D], f32> -> !vt.tensor<[token:16, dim:D], f32>
      %5 = vt.reduce sum %4 [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
      vt.field_store @t, %5 : !vt.tensor<[dim:D], f32>
      vt.yield
    }
    vt.index_stage {
      %0 = vt.input q : !vt.tensor<[head:G, dim:D], f32>
      %1 = vt.field_load @t : !vt.tensor<[block:N, dim:D], f32>
      %2 = vt.mul %0, %1 : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
      %3 = vt.reduce sum %2 [dim] : !vt.tensor<[block:N, head:G, dim:D], f32> -> !vt.tensor<[block:N, head:G], f32>
      %4 = vt.reduce sum %3 [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
      %5 = vt.const_load @Pd : !vt.tensor<[dim:D], f32>
      %s = vt.param_load @scale : !vt.tensor<[], f32>
      %ps = vt.mul %5, %s : !vt.tensor<[dim:D], f32>, !vt.tensor<[], f32> -> !vt.tensor<[dim:D], f32>
      %6 = vt.reduce sum %ps [dim] : !vt.tensor<[dim:D], f32> -> !vt.tensor<[], f32>
      %7 = vt.mul %4, %6 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
      %8 = vt.constant 1.600000e+01 : !vt.tensor<[], f32>
      %9 = vt.mul %7, %8 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
      %10 = vt.param_load @budget : !vt.tensor<[], f32>
      %11 = vt.topk %9, %10 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
      vt.return %11 : !vt.selection
    }
  }
}

