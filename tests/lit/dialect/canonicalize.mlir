// RUN: vflow-opt %s -canonicalize -split-input-file | FileCheck %s

// fold scalar add
// CHECK-LABEL: vt.flow @fold_scalar_add
// CHECK: %[[C:.*]] = vt.constant 5.000000e+00 : !vt.tensor<[], f32>
// CHECK-NOT: vt.add
// CHECK: vt.state_store @s, %[[C]]
vt.flow @fold_scalar_add {
  vt.state @s : !vt.tensor<[], f32> = 0.0
  vt.index_stage {
    %sc = vt.input position : !vt.tensor<[block:N], f32>
    %a = vt.constant 2.0 : !vt.tensor<[], f32>
    %b = vt.constant 3.0 : !vt.tensor<[], f32>
    %r = vt.add %a, %b : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    vt.state_store @s, %r : !vt.tensor<[], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// fold scalar chain
// CHECK-LABEL: vt.flow @fold_scalar_chain
// CHECK: %[[C:.*]] = vt.constant -1.500000e+00 : !vt.tensor<[], f32>
// CHECK-NOT: vt.mul
// CHECK-NOT: vt.sub
// CHECK-NOT: vt.neg
// CHECK: vt.state_store @s, %[[C]]
vt.flow @fold_scalar_chain {
  vt.state @s : !vt.tensor<[], f32> = 0.0
  vt.index_stage {
    %sc = vt.input position : !vt.tensor<[block:N], f32>
    %a = vt.constant 2.0 : !vt.tensor<[], f32>
    %b = vt.constant 0.5 : !vt.tensor<[], f32>
    %m = vt.mul %a, %b : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %d = vt.sub %m, %a : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %e = vt.maximum %d, %b : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %f = vt.div %e, %b : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %g = vt.pow %a, %f : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %h = vt.minimum %g, %a : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %i = vt.sub %h, %b : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %r = vt.neg %i : !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    vt.state_store @s, %r : !vt.tensor<[], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// fold scalar cmp and logic
// CHECK-LABEL: vt.flow @fold_scalar_cmp_and_logic
// CHECK: %[[C:.*]] = vt.constant 1.000000e+00 : !vt.tensor<[], f32>
// CHECK-NOT: vt.cmp
// CHECK-NOT: vt.and
// CHECK-NOT: vt.not
// CHECK: vt.state_store @s, %[[C]]
vt.flow @fold_scalar_cmp_and_logic {
  vt.state @s : !vt.tensor<[], f32> = 0.0
  vt.index_stage {
    %sc = vt.input position : !vt.tensor<[block:N], f32>
    %a = vt.constant 2.0 : !vt.tensor<[], f32>
    %b = vt.constant 3.0 : !vt.tensor<[], f32>
    %lt = vt.cmp lt %a, %b : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %eq = vt.cmp eq %a, %b : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %ne = vt.not %eq : !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %r = vt.and %lt, %ne : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    vt.state_store @s, %r : !vt.tensor<[], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// fold scalar unary
// CHECK-LABEL: vt.flow @fold_scalar_unary
// CHECK: %[[C:.*]] = vt.constant 2.000000e+00 : !vt.tensor<[], f32>
// CHECK-NOT: vt.sqrt
// CHECK-NOT: vt.abs
// CHECK: vt.state_store @s, %[[C]]
vt.flow @fold_scalar_unary {
  vt.state @s : !vt.tensor<[], f32> = 0.0
  vt.index_stage {
    %sc = vt.input position : !vt.tensor<[block:N], f32>
    %a = vt.constant -4.0 : !vt.tensor<[], f32>
    %b = vt.abs %a : !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %r = vt.sqrt %b : !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    vt.state_store @s, %r : !vt.tensor<[], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// fold hash: splitmix64 of the bits of 1.0, the top 24 bits as a fraction
// CHECK-LABEL: vt.flow @fold_hash
// CHECK: %[[C:.*]] = vt.constant 0.989888787 : !vt.tensor<[], f32>
// CHECK-NOT: vt.hash
// CHECK: vt.state_store @s, %[[C]]
vt.flow @fold_hash {
  vt.state @s : !vt.tensor<[], f32> = 0.0
  vt.index_stage {
    %sc = vt.input position : !vt.tensor<[block:N], f32>
    %a = vt.constant 1.0 : !vt.tensor<[], f32>
    %r = vt.hash %a : !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    vt.state_store @s, %r : !vt.tensor<[], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// mul by one
// CHECK-LABEL: vt.flow @mul_by_one
// CHECK: %[[P:.*]] = vt.input position
// CHECK-NOT: vt.mul
// CHECK: vt.topk %[[P]],
vt.flow @mul_by_one {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %c = vt.constant 1.0 : !vt.tensor<[], f32>
    %sc = vt.mul %p, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// one times x
// CHECK-LABEL: vt.flow @one_times_x
// CHECK: %[[P:.*]] = vt.input position
// CHECK-NOT: vt.mul
// CHECK: vt.topk %[[P]],
vt.flow @one_times_x {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %c = vt.constant 1.0 : !vt.tensor<[], f32>
    %sc = vt.mul %c, %p : !vt.tensor<[], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// add zero
// CHECK-LABEL: vt.flow @add_zero
// CHECK: %[[P:.*]] = vt.input position
// CHECK-NOT: vt.add
// CHECK: vt.topk %[[P]],
vt.flow @add_zero {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %c = vt.constant 0.0 : !vt.tensor<[], f32>
    %sc = vt.add %p, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// zero plus x
// CHECK-LABEL: vt.flow @zero_plus_x
// CHECK: %[[P:.*]] = vt.input position
// CHECK-NOT: vt.add
// CHECK: vt.topk %[[P]],
vt.flow @zero_plus_x {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %c = vt.constant 0.0 : !vt.tensor<[], f32>
    %sc = vt.add %c, %p : !vt.tensor<[], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// sub zero
// CHECK-LABEL: vt.flow @sub_zero
// CHECK: %[[P:.*]] = vt.input position
// CHECK-NOT: vt.sub
// CHECK: vt.topk %[[P]],
vt.flow @sub_zero {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %c = vt.constant 0.0 : !vt.tensor<[], f32>
    %sc = vt.sub %p, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// div by one
// CHECK-LABEL: vt.flow @div_by_one
// CHECK: %[[P:.*]] = vt.input position
// CHECK-NOT: vt.div
// CHECK: vt.topk %[[P]],
vt.flow @div_by_one {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %c = vt.constant 1.0 : !vt.tensor<[], f32>
    %sc = vt.div %p, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// mul by two is kept
// CHECK-LABEL: vt.flow @mul_by_two_is_kept
// CHECK: %[[C:.*]] = vt.constant 2.000000e+00
// CHECK: %[[P:.*]] = vt.input position
// CHECK: %[[M:.*]] = vt.mul %[[P]], %[[C]]
// CHECK: vt.topk %[[M]],
vt.flow @mul_by_two_is_kept {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %c = vt.constant 2.0 : !vt.tensor<[], f32>
    %sc = vt.mul %p, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// neg neg
// CHECK-LABEL: vt.flow @neg_neg
// CHECK: %[[P:.*]] = vt.input position
// CHECK-NOT: vt.neg
// CHECK: vt.topk %[[P]],
vt.flow @neg_neg {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %a = vt.neg %p : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %sc = vt.neg %a : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// neg chain of five keeps one neg
// CHECK-LABEL: vt.flow @neg_chain_of_five_keeps_one_neg
// CHECK: %[[P:.*]] = vt.input position
// CHECK-NEXT: %[[N:.*]] = vt.neg %[[P]]
// CHECK-NOT: vt.neg
// CHECK: vt.topk %[[N]],
vt.flow @neg_chain_of_five_keeps_one_neg {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %a = vt.neg %p : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %b = vt.neg %a : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %c = vt.neg %b : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %d = vt.neg %c : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %sc = vt.neg %d : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// neg neg of negative zero stays negative zero
// CHECK-LABEL: vt.flow @neg_neg_of_negative_zero_stays_negative_zero
// CHECK: %[[C:.*]] = vt.constant -0.000000e+00 : !vt.tensor<[], f32>
// CHECK-NOT: vt.neg
// CHECK: vt.state_store @s, %[[C]]
vt.flow @neg_neg_of_negative_zero_stays_negative_zero {
  vt.state @s : !vt.tensor<[], f32> = 0.0
  vt.index_stage {
    %z = vt.constant -0.0 : !vt.tensor<[], f32>
    %a = vt.neg %z : !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %b = vt.neg %a : !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    vt.state_store @s, %b : !vt.tensor<[], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// reduce without axes
// CHECK-LABEL: vt.flow @reduce_without_axes
// CHECK: %[[P:.*]] = vt.input position
// CHECK-NOT: vt.reduce
// CHECK: vt.topk %[[P]],
vt.flow @reduce_without_axes {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %sc = vt.reduce sum %p [] : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// Nested sums are kept: merging them would change the rounding of the
// partial sums, and canonicalization must not change results.
// CHECK-LABEL: vt.flow @reduce_reduce_sum
// CHECK: %[[K:.*]] = vt.input K
// CHECK: %[[X:.*]] = vt.mul %[[K]]
// CHECK: %[[A:.*]] = vt.reduce sum %[[X]] [token, dim]
// CHECK: %[[R:.*]] = vt.reduce sum %[[A]] [head]
// CHECK: vt.topk %[[R]],
vt.flow @reduce_reduce_sum {
  vt.index_stage {
    %k = vt.input K : !vt.tensor<[block:N, token:16, dim:D], f32>
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %x = vt.mul %k, %q : !vt.tensor<[block:N, token:16, dim:D], f32>, !vt.tensor<[head:G, dim:D], f32> -> !vt.tensor<[block:N, token:16, dim:D, head:G], f32>
    %a = vt.reduce sum %x [token, dim] : !vt.tensor<[block:N, token:16, dim:D, head:G], f32> -> !vt.tensor<[block:N, head:G], f32>
    %sc = vt.reduce sum %a [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// reduce reduce max
// CHECK-LABEL: vt.flow @reduce_reduce_max
// CHECK: %[[K:.*]] = vt.input K
// CHECK: %[[X:.*]] = vt.mul %[[K]]
// CHECK: %[[R:.*]] = vt.reduce max %[[X]] [token, dim, head] : !vt.tensor<[block:N, token:16, dim:D, head:G], f32> -> !vt.tensor<[block:N], f32>
// CHECK-NOT: vt.reduce
// CHECK: vt.topk %[[R]],
vt.flow @reduce_reduce_max {
  vt.index_stage {
    %k = vt.input K : !vt.tensor<[block:N, token:16, dim:D], f32>
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %x = vt.mul %k, %q : !vt.tensor<[block:N, token:16, dim:D], f32>, !vt.tensor<[head:G, dim:D], f32> -> !vt.tensor<[block:N, token:16, dim:D, head:G], f32>
    %a = vt.reduce max %x [token, dim] : !vt.tensor<[block:N, token:16, dim:D, head:G], f32> -> !vt.tensor<[block:N, head:G], f32>
    %sc = vt.reduce max %a [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// reduce reduce min
// CHECK-LABEL: vt.flow @reduce_reduce_min
// CHECK: %[[K:.*]] = vt.input K
// CHECK: %[[X:.*]] = vt.mul %[[K]]
// CHECK: %[[R:.*]] = vt.reduce min %[[X]] [token, dim, head] : !vt.tensor<[block:N, token:16, dim:D, head:G], f32> -> !vt.tensor<[block:N], f32>
// CHECK-NOT: vt.reduce
// CHECK: vt.topk %[[R]],
vt.flow @reduce_reduce_min {
  vt.index_stage {
    %k = vt.input K : !vt.tensor<[block:N, token:16, dim:D], f32>
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %x = vt.mul %k, %q : !vt.tensor<[block:N, token:16, dim:D], f32>, !vt.tensor<[head:G, dim:D], f32> -> !vt.tensor<[block:N, token:16, dim:D, head:G], f32>
    %a = vt.reduce min %x [token, dim] : !vt.tensor<[block:N, token:16, dim:D, head:G], f32> -> !vt.tensor<[block:N, head:G], f32>
    %sc = vt.reduce min %a [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// reduce reduce mean is kept
// CHECK-LABEL: vt.flow @reduce_reduce_mean_is_kept
// CHECK: vt.reduce mean %{{.*}} [dim]
// CHECK: vt.reduce mean %{{.*}} [head]
vt.flow @reduce_reduce_mean_is_kept {
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  vt.cache_stage {
    %kk = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    %km = vt.reduce max %kk [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
    vt.field_store @k, %km : !vt.tensor<[dim:D], f32>
    vt.yield
  }
  vt.index_stage {
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %k = vt.field_load @k : !vt.tensor<[block:N, dim:D], f32>
    %x = vt.mul %q, %k : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
    %a = vt.reduce mean %x [dim] : !vt.tensor<[block:N, head:G, dim:D], f32> -> !vt.tensor<[block:N, head:G], f32>
    %sc = vt.reduce mean %a [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// reduce reduce mixed kinds is kept
// CHECK-LABEL: vt.flow @reduce_reduce_mixed_kinds_is_kept
// CHECK: vt.reduce sum %{{.*}} [head]
// CHECK: vt.reduce max %{{.*}} [dim]
vt.flow @reduce_reduce_mixed_kinds_is_kept {
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  vt.cache_stage {
    %kk = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    %km = vt.reduce max %kk [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
    vt.field_store @k, %km : !vt.tensor<[dim:D], f32>
    vt.yield
  }
  vt.index_stage {
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %k = vt.field_load @k : !vt.tensor<[block:N, dim:D], f32>
    %x = vt.mul %q, %k : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
    %a = vt.reduce sum %x [head] : !vt.tensor<[block:N, head:G, dim:D], f32> -> !vt.tensor<[block:N, dim:D], f32>
    %sc = vt.reduce max %a [dim] : !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// rename to itself
// CHECK-LABEL: vt.flow @rename_to_itself
// CHECK: %[[M:.*]] = vt.input mass
// CHECK-NOT: vt.rename
// CHECK: vt.reduce sum %[[M]] [head]
vt.flow @rename_to_itself {
  vt.index_stage {
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    %r = vt.rename %m "head" -> "head" : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N, head:G], f32>
    %sc = vt.reduce sum %r [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// rename rename
// CHECK-LABEL: vt.flow @rename_rename
// CHECK: %[[M:.*]] = vt.input mass
// CHECK: %[[R:.*]] = vt.rename %[[M]] "head" -> "h2" : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N, h2:G], f32>
// CHECK-NOT: vt.rename
// CHECK: vt.reduce sum %[[R]] [h2]
vt.flow @rename_rename {
  vt.index_stage {
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    %a = vt.rename %m "head" -> "h1" : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N, h1:G], f32>
    %b = vt.rename %a "h1" -> "h2" : !vt.tensor<[block:N, h1:G], f32> -> !vt.tensor<[block:N, h2:G], f32>
    %sc = vt.reduce sum %b [h2] : !vt.tensor<[block:N, h2:G], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// rename rename back
// CHECK-LABEL: vt.flow @rename_rename_back
// CHECK: %[[M:.*]] = vt.input mass
// CHECK-NOT: vt.rename
// CHECK: vt.reduce sum %[[M]] [head]
vt.flow @rename_rename_back {
  vt.index_stage {
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    %a = vt.rename %m "head" -> "h" : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N, h:G], f32>
    %b = vt.rename %a "h" -> "head" : !vt.tensor<[block:N, h:G], f32> -> !vt.tensor<[block:N, head:G], f32>
    %sc = vt.reduce sum %b [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %sc, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// host budget folds constants only
// CHECK-LABEL: vt.flow @host_budget_folds_constants_only
// CHECK-DAG: %[[C:.*]] = vt.constant 4.000000e+00
// CHECK-DAG: %[[B:.*]] = vt.param_load @budget
// CHECK: %[[K:.*]] = vt.mul %[[B]], %[[C]]
// CHECK: vt.topk %{{.*}}, %[[K]]
vt.flow @host_budget_folds_constants_only {
  vt.param @budget = 16 : i64
  vt.index_stage {
    %sc = vt.input position : !vt.tensor<[block:N], f32>
    %b = vt.param_load @budget : !vt.tensor<[], f32>
    %two = vt.constant 2.0 : !vt.tensor<[], f32>
    %four = vt.add %two, %two : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %k = vt.mul %b, %four : !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %s = vt.topk %sc, %k : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}
