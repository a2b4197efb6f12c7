// RUN: vflow-opt %s | vflow-opt | FileCheck %s
// RUN: vflow-opt %s -mlir-print-op-generic | vflow-opt | FileCheck %s

// Round-trips every vt op through the custom and the generic form.

// CHECK-LABEL: vt.flow @declarations
vt.flow @declarations {
  // CHECK: vt.param @budget = 64 : i64
  vt.param @budget = 64 : i64
  // CHECK: vt.param compile_time @sketch = 8 : i64
  vt.param compile_time @sketch = 8 : i64
  // CHECK: vt.param @scale = 5.000000e-01 : f64
  vt.param @scale = 0.5 : f64
  // CHECK: vt.param @use_sink = true
  vt.param @use_sink = true
  // CHECK: vt.axis @m = 8
  vt.axis @m = 8
  // CHECK: vt.const @Phi : !vt.tensor<[dim:D, m:8], f32> {
  // CHECK-NEXT: %[[R:.*]] = vt.rademacher {seed = 7 : i64} : !vt.tensor<[dim:D, m:8], f32>
  // CHECK-NEXT: vt.yield %[[R]] : !vt.tensor<[dim:D, m:8], f32>
  vt.const @Phi : !vt.tensor<[dim:D, m:8], f32> {
    %0 = vt.rademacher {seed = 7 : i64} : !vt.tensor<[dim:D, m:8], f32>
    vt.yield %0 : !vt.tensor<[dim:D, m:8], f32>
  }
  // CHECK: vt.const @Gauss : !vt.tensor<[dim:D, m:8], f32> {
  // CHECK-NEXT: vt.gaussian {seed = 3 : i64} : !vt.tensor<[dim:D, m:8], f32>
  // CHECK-NEXT: vt.constant
  // CHECK-NEXT: vt.mul
  vt.const @Gauss : !vt.tensor<[dim:D, m:8], f32> {
    %0 = vt.gaussian {seed = 3 : i64} : !vt.tensor<[dim:D, m:8], f32>
    %c = vt.constant 0.5 : !vt.tensor<[], f32>
    %1 = vt.mul %0, %c : !vt.tensor<[dim:D, m:8], f32>, !vt.tensor<[], f32> -> !vt.tensor<[dim:D, m:8], f32>
    vt.yield %1 : !vt.tensor<[dim:D, m:8], f32>
  }
  // CHECK: vt.const @W : !vt.tensor<[m:2, n:2], f32> {
  // CHECK-NEXT: vt.literal [1.000000e+00, 2.000000e+00, 3.000000e+00, 4.000000e+00] source "w.npy" : !vt.tensor<[m:2, n:2], f32>
  vt.const @W : !vt.tensor<[m:2, n:2], f32> {
    %0 = vt.literal [1.0, 2.0, 3.0, 4.0] source "w.npy" : !vt.tensor<[m:2, n:2], f32>
    vt.yield %0 : !vt.tensor<[m:2, n:2], f32>
  }
  // CHECK: vt.const @Bias : !vt.tensor<[m:2], f32> {
  // CHECK-NEXT: vt.literal [5.000000e-01, 2.500000e-01] : !vt.tensor<[m:2], f32>
  vt.const @Bias : !vt.tensor<[m:2], f32> {
    %0 = vt.literal [0.5, 0.25] : !vt.tensor<[m:2], f32>
    vt.yield %0 : !vt.tensor<[m:2], f32>
  }
  // CHECK: vt.cache_field @kmax : !vt.tensor<[dim:D], bf16>
  vt.cache_field @kmax : !vt.tensor<[dim:D], bf16>
  // CHECK: vt.cache_field @sketch_k : !vt.tensor<[m:8], f8E4M3FN>
  vt.cache_field @sketch_k : !vt.tensor<[m:8], f8E4M3FN>
  // CHECK: vt.state @acc : !vt.tensor<[block:N], f32> = 0.000000e+00
  vt.state @acc : !vt.tensor<[block:N], f32> = 0.0
  // CHECK: vt.state @steps : !vt.tensor<[], f16> = 1.000000e+00
  vt.state @steps : !vt.tensor<[], f16> = 1.0

  // CHECK: vt.cache_stage {
  vt.cache_stage {
    // CHECK: %[[K:.*]] = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    // CHECK: vt.input V : !vt.tensor<[token:16, dim:D], f32>
    %v = vt.input V : !vt.tensor<[token:16, dim:D], f32>
    // CHECK: %[[M:.*]] = vt.reduce max %[[K]] [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
    %m = vt.reduce max %k [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
    // CHECK: vt.field_store @kmax, %[[M]] : !vt.tensor<[dim:D], f32>
    vt.field_store @kmax, %m : !vt.tensor<[dim:D], f32>
    // CHECK: vt.const_load @Phi : !vt.tensor<[dim:D, m:8], f32>
    %phi = vt.const_load @Phi : !vt.tensor<[dim:D, m:8], f32>
    // CHECK: vt.mul {{.*}} -> !vt.tensor<[token:16, dim:D, m:8], f32>
    %kp = vt.mul %k, %phi : !vt.tensor<[token:16, dim:D], f32>, !vt.tensor<[dim:D, m:8], f32> -> !vt.tensor<[token:16, dim:D, m:8], f32>
    // CHECK: vt.reduce sum {{.*}} [token, dim] : !vt.tensor<[token:16, dim:D, m:8], f32> -> !vt.tensor<[m:8], f32>
    %sk = vt.reduce sum %kp [token, dim] : !vt.tensor<[token:16, dim:D, m:8], f32> -> !vt.tensor<[m:8], f32>
    vt.field_store @sketch_k, %sk : !vt.tensor<[m:8], f32>
    // CHECK: vt.yield
    vt.yield
  }

  // CHECK: vt.index_stage {
  vt.index_stage {
    // CHECK: %[[Q:.*]] = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    // CHECK: vt.input K : !vt.tensor<[block:N, token:16, dim:D], f32>
    %k = vt.input K : !vt.tensor<[block:N, token:16, dim:D], f32>
    // CHECK: vt.input V : !vt.tensor<[block:N, token:16, dim:D], f32>
    %v = vt.input V : !vt.tensor<[block:N, token:16, dim:D], f32>
    // CHECK: vt.input mass : !vt.tensor<[block:N, head:G], f32>
    %mass = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    // CHECK: vt.input position : !vt.tensor<[block:N], f32>
    %pos = vt.input position : !vt.tensor<[block:N], f32>
    // CHECK: vt.input num_blocks : !vt.tensor<[], f32>
    %nb = vt.input num_blocks : !vt.tensor<[], f32>
    // CHECK: vt.input context_len : !vt.tensor<[], f32>
    %len = vt.input context_len : !vt.tensor<[], f32>
    // CHECK: vt.input step : !vt.tensor<[], f32>
    %step = vt.input step : !vt.tensor<[], f32>
    // CHECK: vt.input group : !vt.tensor<[], f32>
    %group = vt.input group : !vt.tensor<[], f32>
    // CHECK: vt.input layer : !vt.tensor<[], f32>
    %layer = vt.input layer : !vt.tensor<[], f32>
    // CHECK: vt.input kv_head : !vt.tensor<[], f32>
    %kvh = vt.input kv_head : !vt.tensor<[], f32>
    // CHECK: %[[B:.*]] = vt.param_load @budget : !vt.tensor<[], f32>
    %budget = vt.param_load @budget : !vt.tensor<[], f32>
    // CHECK: %[[KM:.*]] = vt.field_load @kmax : !vt.tensor<[block:N, dim:D], f32>
    %kmax = vt.field_load @kmax : !vt.tensor<[block:N, dim:D], f32>
    // CHECK: vt.state_load @acc : !vt.tensor<[block:N], f32>
    %acc = vt.state_load @acc : !vt.tensor<[block:N], f32>
    // CHECK: vt.constant 1.500000e+00 : !vt.tensor<[], f32>
    %c = vt.constant 1.5 : !vt.tensor<[], f32>

    // CHECK: %[[P:.*]] = vt.mul %[[Q]], %[[KM]] : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
    %p = vt.mul %q, %kmax : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
    // CHECK: vt.add {{.*}} : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    %a0 = vt.add %acc, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.sub
    %a1 = vt.sub %a0, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.div
    %a2 = vt.div %a1, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.pow
    %a3 = vt.pow %a2, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.maximum
    %a4 = vt.maximum %a3, %pos : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.minimum
    %a5 = vt.minimum %a4, %pos : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.and
    %a6 = vt.and %a5, %pos : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.or
    %a7 = vt.or %a6, %pos : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.cmp lt
    %c0 = vt.cmp lt %a7, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.cmp le
    %c1 = vt.cmp le %a7, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.cmp gt
    %c2 = vt.cmp gt %a7, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.cmp ge
    %c3 = vt.cmp ge %a7, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.cmp eq
    %c4 = vt.cmp eq %a7, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.cmp ne
    %c5 = vt.cmp ne %c4, %c3 : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>

    // CHECK: vt.neg {{.*}} : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %u0 = vt.neg %c5 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.not
    %u1 = vt.not %u0 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.exp
    %u2 = vt.exp %u1 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.log
    %u3 = vt.log %u2 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.sqrt
    %u4 = vt.sqrt %u3 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.rsqrt
    %u5 = vt.rsqrt %u4 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.abs
    %u6 = vt.abs %u5 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.relu
    %u7 = vt.relu %u6 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.sigmoid
    %u8 = vt.sigmoid %u7 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.silu
    %u9 = vt.silu %u8 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.tanh
    %u10 = vt.tanh %u9 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.hash
    %u11 = vt.hash %u10 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>

    // CHECK: vt.clamp {{.*}} : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    %t0 = vt.clamp %u10, %c, %budget : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.where {{.*}} : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N, head:G], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N, head:G], f32>
    %t1 = vt.where %c0, %mass, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N, head:G], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N, head:G], f32>

    // CHECK: vt.reduce sum %[[P]] [dim] : !vt.tensor<[block:N, head:G, dim:D], f32> -> !vt.tensor<[block:N, head:G], f32>
    %r0 = vt.reduce sum %p [dim] : !vt.tensor<[block:N, head:G, dim:D], f32> -> !vt.tensor<[block:N, head:G], f32>
    // CHECK: vt.reduce mean {{.*}} [head]
    %r1 = vt.reduce mean %r0 [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.reduce min {{.*}} [head]
    %r2 = vt.reduce min %t1 [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.reduce l2norm {{.*}} [block, head]
    %r3 = vt.reduce l2norm %t1 [block, head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[], f32>

    // CHECK: vt.softmax {{.*}} : !vt.tensor<[block:N, head:G], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N, head:G], f32>
    %s0 = vt.softmax %r0, %r3 : !vt.tensor<[block:N, head:G], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N, head:G], f32>
    // CHECK: vt.normalize {{.*}} : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %s1 = vt.normalize %r1 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.conv {{.*}} [2.500000e-01, 5.000000e-01, 2.500000e-01] : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %s2 = vt.conv %s1 [0.25, 0.5, 0.25] : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: vt.kth_largest {{.*}} : !vt.tensor<[block:N, head:G], f32>, !vt.tensor<[], f32> -> !vt.tensor<[head:G], f32>
    %s3 = vt.kth_largest %s0, %budget : !vt.tensor<[block:N, head:G], f32>, !vt.tensor<[], f32> -> !vt.tensor<[head:G], f32>

    // CHECK: vt.split {{.*}} "token" -> "sub" x 4 : !vt.tensor<[block:N, token:16, dim:D], f32> -> !vt.tensor<[block:N, sub:4, token:4, dim:D], f32>
    %sp = vt.split %k "token" -> "sub" x 4 : !vt.tensor<[block:N, token:16, dim:D], f32> -> !vt.tensor<[block:N, sub:4, token:4, dim:D], f32>
    // CHECK: vt.rename {{.*}} "head" -> "h" : !vt.tensor<[head:G], f32> -> !vt.tensor<[h:G], f32>
    %rn = vt.rename %s3 "head" -> "h" : !vt.tensor<[head:G], f32> -> !vt.tensor<[h:G], f32>

    // CHECK: vt.state_store @acc, {{.*}} : !vt.tensor<[block:N], f32>
    vt.state_store @acc, %s2 : !vt.tensor<[block:N], f32>

    // CHECK: %[[K2:.*]] = vt.mul %[[B]], %{{.*}} : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %half = vt.constant 0.5 : !vt.tensor<[], f32>
    %k2 = vt.mul %budget, %half : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %k3 = vt.minimum %k2, %nb : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    // CHECK: %[[S0:.*]] = vt.topk %{{.*}}, %{{.*}} : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    %sel0 = vt.topk %s2, %k3 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    // CHECK: %[[S1:.*]] = vt.approx_topk %{{.*}}, %[[B]] {recall = 7.500000e-01 : f64} : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    %sel1 = vt.approx_topk %r1, %budget {recall = 0.75 : f64} : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    // CHECK: %[[S2:.*]] = vt.threshold %{{.*}}, %{{.*}} : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    %sel2 = vt.threshold %r2, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    // CHECK: %[[S3:.*]] = vt.threshold %{{.*}}, %{{.*}}, %[[B]] : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32>
    %sel3 = vt.threshold %r2, %c, %budget : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32>
    // CHECK: %[[S4:.*]] = vt.topp %{{.*}}, %[[HALF:.*]] : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    %sel4 = vt.topp %r2, %half : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    // CHECK: %[[S5:.*]] = vt.topp %{{.*}}, %[[HALF]], %[[B]] : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32>
    %sel5 = vt.topp %r2, %half, %budget : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32>
    // CHECK: %[[U0:.*]] = vt.union %[[S0]], %[[S1]]
    %u01 = vt.union %sel0, %sel1
    %u23a = vt.union %sel2, %sel3
    %u45 = vt.union %sel4, %sel5
    %u23 = vt.union %u23a, %u45
    // CHECK: %[[U:.*]] = vt.union %[[U0]], %{{.*}}
    %sel = vt.union %u01, %u23
    // CHECK: vt.return %[[U]] : !vt.selection
    vt.return %sel : !vt.selection
  }
}

// A flow with only an index stage.
// CHECK-LABEL: vt.flow @minimal
// CHECK-NOT: vt.cache_stage
// CHECK: vt.index_stage
vt.flow @minimal {
  vt.index_stage {
    %pos = vt.input position : !vt.tensor<[block:N], f32>
    %len = vt.input context_len : !vt.tensor<[], f32>
    %g = vt.input group : !vt.tensor<[], f32>
    %l = vt.input layer : !vt.tensor<[], f32>
    %h = vt.input kv_head : !vt.tensor<[], f32>
    %k0 = vt.mul %len, %g : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %k1 = vt.sub %k0, %l : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %k = vt.add %k1, %h : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %sel = vt.topk %pos, %k : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %sel : !vt.selection
  }
}

// A flow with a retain block: the return carries its score and capacity.
// CHECK-LABEL: vt.flow @retaining
// CHECK: vt.return %{{.*}} retain %[[POS:.*]], %[[CAP:.*]] combine "max" : !vt.selection, !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
vt.flow @retaining {
  vt.param @capacity = 8 : i64
  vt.index_stage {
    %pos = vt.input position : !vt.tensor<[block:N], f32>
    %cap = vt.param_load @capacity : !vt.tensor<[], f32>
    %sel = vt.topk %pos, %cap : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %sel retain %pos, %cap combine "max" : !vt.selection, !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
  }
}

// A retain score per token ([block, token]): token-grain eviction.
// CHECK-LABEL: vt.flow @retaining_tokens
// CHECK: vt.return %{{.*}} retain %{{.*}}, %{{.*}} combine "sum" : !vt.selection, !vt.tensor<[block:N, token:16], f32>, !vt.tensor<[], f32>
vt.flow @retaining_tokens {
  vt.param @capacity = 100 : i64
  vt.index_stage {
    %pos = vt.input position : !vt.tensor<[block:N], f32>
    %k = vt.input K : !vt.tensor<[block:N, token:16, dim:D], f32>
    %norm = vt.reduce sum %k [dim] : !vt.tensor<[block:N, token:16, dim:D], f32> -> !vt.tensor<[block:N, token:16], f32>
    %cap = vt.param_load @capacity : !vt.tensor<[], f32>
    %sel = vt.topk %pos, %cap : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %sel retain %norm, %cap combine "sum" : !vt.selection, !vt.tensor<[block:N, token:16], f32>, !vt.tensor<[], f32>
  }
}

// -----

// Kernels with their launches (--vt-plan-launches), and one not planned.
// CHECK-LABEL: vt.flow @kernels
// CHECK: vt.kernel cache_map launch <fields, threads = 128> {
// CHECK: %[[S:.*]] = vt.kernel block_map launch <tile, threads = 256, tile_blocks = 32> {
// CHECK: vt.yield %{{.*}} : !vt.tensor<[block:N], f32>
// CHECK: } -> !vt.tensor<[block:N], f32>
// CHECK: vt.kernel cross_block launch <row, threads = 1024> {
// CHECK: vt.kernel select {
vt.flow @kernels {
  vt.cache_field @c : !vt.tensor<[dim:D], bf16>
  vt.cache_stage {
    %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    vt.kernel cache_map launch <fields, threads = 128> {
      %m = vt.reduce mean %k [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
      vt.field_store @c, %m : !vt.tensor<[dim:D], f32>
    }
    vt.yield
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %two = vt.constant 2.0 : !vt.tensor<[], f32>
    %s = vt.kernel block_map launch <tile, threads = 256, tile_blocks = 32> {
      %x = vt.mul %p, %two : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
      vt.yield %x : !vt.tensor<[block:N], f32>
    } -> !vt.tensor<[block:N], f32>
    %m = vt.kernel cross_block launch <row, threads = 1024> {
      %y = vt.reduce max %s [block] : !vt.tensor<[block:N], f32> -> !vt.tensor<[], f32>
      vt.yield %y : !vt.tensor<[], f32>
    } -> !vt.tensor<[], f32>
    %sel = vt.kernel select {
      %t = vt.topk %s, %two : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
      vt.yield %t : !vt.selection
    } -> !vt.selection
    vt.return %sel : !vt.selection
  }
}

// -----

// Reserved params at the ends of their ranges; token and dim split below
// the flow's block_size and head_dim.
// CHECK-LABEL: vt.flow @reserved_params_and_split_builtin_axes
// CHECK: vt.param compile_time @block_size = 1024 : i64
// CHECK: vt.param @keep_first = 0 : i64
// CHECK: vt.param @keep_last = 2 : i64
// CHECK: vt.param compile_time @head_dim = 64 : i64
// CHECK: vt.split %{{.*}} "token" -> "sub" x 4 : !vt.tensor<[token:1024, dim:64], f32> -> !vt.tensor<[sub:4, token:256, dim:64], f32>
// CHECK: vt.split %{{.*}} "dim" -> "part" x 4 : !vt.tensor<[sub:4, token:256, dim:64], f32> -> !vt.tensor<[sub:4, token:256, part:4, dim:16], f32>
// CHECK: vt.field_load @kpart : !vt.tensor<[block:N, part:4, dim:16], f32>
vt.flow @reserved_params_and_split_builtin_axes {
  vt.param compile_time @block_size = 1024 : i64
  vt.param @keep_first = 0 : i64
  vt.param @keep_last = 2 : i64
  vt.param compile_time @head_dim = 64 : i64
  vt.cache_field @kpart : !vt.tensor<[part:4, dim:16], bf16>
  vt.cache_stage {
    %k = vt.input K : !vt.tensor<[token:1024, dim:64], f32>
    %s = vt.split %k "token" -> "sub" x 4 : !vt.tensor<[token:1024, dim:64], f32> -> !vt.tensor<[sub:4, token:256, dim:64], f32>
    %d = vt.split %s "dim" -> "part" x 4 : !vt.tensor<[sub:4, token:256, dim:64], f32> -> !vt.tensor<[sub:4, token:256, part:4, dim:16], f32>
    %m = vt.reduce max %d [sub, token] : !vt.tensor<[sub:4, token:256, part:4, dim:16], f32> -> !vt.tensor<[part:4, dim:16], f32>
    vt.field_store @kpart, %m : !vt.tensor<[part:4, dim:16], f32>
    vt.yield
  }
  vt.index_stage {
    %f = vt.field_load @kpart : !vt.tensor<[block:N, part:4, dim:16], f32>
    %sc = vt.reduce sum %f [part, dim] : !vt.tensor<[block:N, part:4, dim:16], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %sel = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %sel : !vt.selection
  }
}
