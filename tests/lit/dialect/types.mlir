// RUN: vflow-opt %s -split-input-file -verify-diagnostics | FileCheck %s

// Valid types round-trip; each invalid one is its own split.

// CHECK-LABEL: vt.flow @types
vt.flow @types {
  // CHECK: vt.state @symbolic : !vt.tensor<[head:G, dim:D], f32> = 0.000000e+00
  vt.state @symbolic : !vt.tensor<[head:G, dim:D], f32> = 0.0
  // CHECK: vt.state @static : !vt.tensor<[m:8, n:1], bf16> = 0.000000e+00
  vt.state @static : !vt.tensor<[m:8, n:1], bf16> = 0.0
  // CHECK: vt.state @scalar : !vt.tensor<[], f16> = 0.000000e+00
  vt.state @scalar : !vt.tensor<[], f16> = 0.0
  // CHECK: vt.state @fp8a : !vt.tensor<[dim:D], f8E4M3FN> = 0.000000e+00
  vt.state @fp8a : !vt.tensor<[dim:D], f8E4M3FN> = 0.0
  // CHECK: vt.state @fp8b : !vt.tensor<[dim:D], f8E5M2> = 0.000000e+00
  vt.state @fp8b : !vt.tensor<[dim:D], f8E5M2> = 0.0
  // Unusual axis names: keywords print bare, integer-type names quoted.
  // CHECK: vt.state @names : !vt.tensor<[f32:2, "i8":4, "two words":3, x.y:5], f32> = 0.000000e+00
  vt.state @names : !vt.tensor<["f32":2, "i8":4, "two words":3, x.y:5], f32> = 0.0
  // Negative integers spell the symbolic sizes.
  // CHECK: vt.state @numeric : !vt.tensor<[a:N, b:G, c:D], f32> = 0.000000e+00
  vt.state @numeric : !vt.tensor<[a:-1, b:-2, c:-3], f32> = 0.0
  // CHECK: vt.axis @m = 8 {test.axes = [#vt.axis<"dim", D>, #vt.axis<"m", 8>, #vt.axis<"block", N>, #vt.axis<"head", G>]}
  vt.axis @m = 8 {test.axes = [#vt.axis<"dim", D>, #vt.axis<"m", 8>, #vt.axis<"block", -1>, #vt.axis<"head", G>]}
  // CHECK: vt.index_stage
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    // CHECK: vt.topk {{.*}} : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    // CHECK: vt.return {{.*}} : !vt.selection
    vt.return %s : !vt.selection
  }
}

// -----

// duplicate_axis_name
// expected-error @+1 {{duplicate axis name 'dim'}}
vt.axis @m = 8 {test.t = !vt.tensor<[dim:D, dim:4], f32>}

// -----

// zero_axis_size
// expected-error @+1 {{invalid size 0 of axis 'm': expected a positive integer, N, G or D}}
vt.axis @m = 8 {test.t = !vt.tensor<[m:0], f32>}

// -----

// axis_size_below_minus_three
// expected-error @+1 {{invalid size -4 of axis 'm': expected a positive integer, N, G or D}}
vt.axis @m = 8 {test.t = !vt.tensor<[m:-4], f32>}

// -----

// unknown_symbolic_size
// expected-error @+1 {{expected an axis size: a positive integer, N, G or D}}
vt.axis @m = 8 {test.t = !vt.tensor<[m:K], f32>}

// -----

// integer_element_type
// expected-error @+1 {{element type must be f32, bf16, f16, f8E4M3FN or f8E5M2, got 'i32'}}
vt.axis @m = 8 {test.t = !vt.tensor<[m:4], i32>}

// -----

// f64_element_type
// expected-error @+1 {{element type must be f32, bf16, f16, f8E4M3FN or f8E5M2, got 'f64'}}
vt.axis @m = 8 {test.t = !vt.tensor<[], f64>}

// -----

// a_third_parameter (tensors have no layout parameter)
// expected-error @+1 {{expected '>'}}
vt.axis @m = 8 {test.t = !vt.tensor<[m:4], f32, paged>}

// -----

// missing_element_type
// expected-error @+1 {{expected ','}}
vt.axis @m = 8 {test.t = !vt.tensor<[m:4]>}

// -----

// empty_axis_name
// expected-error @+1 {{axis name must not be empty}}
vt.axis @m = 8 {test.a = #vt.axis<"", 4>}

// -----

// axis_attr_with_zero_size
// expected-error @+1 {{invalid size 0 of axis 'm'}}
vt.axis @m = 8 {test.a = #vt.axis<"m", 0>}
