// RUN: vflow-opt %s -cse | FileCheck %s

// Pure ops with equal operands and attributes are merged; state loads are
// not merged across a state store.

// CHECK-LABEL: vt.flow @cse
vt.flow @cse {
  vt.state @acc : !vt.tensor<[block:N], f32> = 0.0
  vt.index_stage {
    // CHECK: %[[P:.*]] = vt.input position
    // CHECK-NOT: vt.input position
    %p0 = vt.input position : !vt.tensor<[block:N], f32>
    %p1 = vt.input position : !vt.tensor<[block:N], f32>
    // CHECK: %[[E:.*]] = vt.exp %[[P]]
    // CHECK-NOT: vt.exp
    %e0 = vt.exp %p0 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %e1 = vt.exp %p1 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: %[[S:.*]] = vt.add %[[E]], %[[E]]
    %s = vt.add %e0, %e1 : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    // CHECK: %[[L0:.*]] = vt.state_load @acc
    %l0 = vt.state_load @acc : !vt.tensor<[block:N], f32>
    // CHECK: vt.state_store @acc, %[[S]]
    vt.state_store @acc, %s : !vt.tensor<[block:N], f32>
    // CHECK: %[[L1:.*]] = vt.state_load @acc
    %l1 = vt.state_load @acc : !vt.tensor<[block:N], f32>
    // CHECK: vt.add %[[L0]], %[[L1]]
    %sum = vt.add %l0, %l1 : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %sel = vt.topk %sum, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %sel : !vt.selection
  }
}
