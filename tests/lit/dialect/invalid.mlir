// RUN: vflow-opt %s -split-input-file -verify-diagnostics

// flow_without_index_stage
// expected-error @+1 {{expects exactly one vt.index_stage, found 0}}
vt.flow @f {
}

// -----

// flow_with_two_cache_stages
// expected-error @+1 {{expects at most one vt.cache_stage, found 2}}
vt.flow @f {
  vt.cache_stage {
    vt.yield
  }
  vt.cache_stage {
    vt.yield
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// param_with_i32_value
vt.flow @f {
  // expected-error @+1 {{value must be an i64, f64 or i1 attribute, got 3 : i32}}
  vt.param @p = 3 : i32
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// axis_with_zero_size
vt.flow @f {
  // expected-error @+1 {{size must be positive, got 0}}
  vt.axis @m = 0
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// duplicate_symbol_in_flow
vt.flow @f {
  // expected-note @+1 {{see existing symbol definition here}}
  vt.param @p = 1 : i64
  // expected-error @+1 {{redefinition of symbol named 'p'}}
  vt.axis @p = 4
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// const_yield_type_differs_from_declared_type
vt.flow @f {
  // expected-error @+1 {{yielded type '!vt.tensor<[m:4], f32>' differs from the declared type '!vt.tensor<[m:8], f32>'}}
  vt.const @c : !vt.tensor<[m:8], f32> {
    %0 = vt.gaussian {seed = 1 : i64} : !vt.tensor<[m:4], f32>
    vt.yield %0 : !vt.tensor<[m:4], f32>
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// const_type_uses_block_count
vt.flow @f {
  // expected-error @+1 {{type must not depend on the block count N (axis 'block')}}
  vt.const @c : !vt.tensor<[block:N], f32> {
    %0 = vt.gaussian {seed = 1 : i64} : !vt.tensor<[block:N], f32>
    vt.yield %0 : !vt.tensor<[block:N], f32>
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// cache_field_with_block_axis
vt.flow @f {
  // expected-error @+1 {{type must not have a 'block' axis}}
  vt.cache_field @k : !vt.tensor<[block:N, dim:D], bf16>
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// cache_field_with_token_axis
vt.flow @f {
  // expected-error @+1 {{type must not have a 'token' axis}}
  vt.cache_field @k : !vt.tensor<[token:16], bf16>
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// cache_stage_yield_with_operand
vt.flow @f {
  // expected-error @+1 {{must end with vt.yield without operands}}
  vt.cache_stage {
    %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    vt.yield %k : !vt.tensor<[token:16, dim:D], f32>
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// index_stage_ending_with_yield
vt.flow @f {
  vt.index_stage {
    // expected-error @+1 {{expects parent op to be one of 'vt.const, vt.cache_stage, vt.kernel'}}
    vt.yield
  }
}

// -----

// return_outside_index_stage
vt.flow @f {
  vt.cache_stage {
    %p = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    // expected-error @+1 {{expects parent op 'vt.index_stage'}}
    vt.return %p : !vt.tensor<[token:16, dim:D], f32>
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// state_stored_twice
vt.flow @f {
  vt.state @acc : !vt.tensor<[block:N], f32> = 0.0
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-note @+1 {{first store here}}
    vt.state_store @acc, %p : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{stores state @acc a second time in this stage}}
    vt.state_store @acc, %p : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// input_q_in_cache_stage
vt.flow @f {
  vt.cache_stage {
    // expected-error @+1 {{input q is only available in vt.index_stage}}
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    vt.yield
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// input_K_without_block_axis_in_index_stage
vt.flow @f {
  vt.index_stage {
    // expected-error @+1 {{input K must have the axes [block, token, dim] here, got [token:16, dim:D]}}
    %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// input_mass_with_wrong_axes
vt.flow @f {
  vt.index_stage {
    // expected-error @+1 {{input mass must have the axes [block, head] here, got [block:N]}}
    %m = vt.input mass : !vt.tensor<[block:N], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// input_outside_stage
vt.flow @f {
  // expected-error @+1 {{must be inside vt.cache_stage or vt.index_stage}}
  %n = vt.input num_blocks : !vt.tensor<[], f32>
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n2 = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n2 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// param_load_of_unknown_symbol
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{'@budget' does not name a vt.param of the enclosing vt.flow}}
    %n = vt.param_load @budget : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// param_load_of_a_state
vt.flow @f {
  vt.state @budget : !vt.tensor<[], f32> = 0.0
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{'@budget' does not name a vt.param of the enclosing vt.flow}}
    %n = vt.param_load @budget : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// param_load_with_non_scalar_result
vt.flow @f {
  vt.param @budget = 8 : i64
  vt.index_stage {
    // expected-error @+1 {{result #0 must be vt scalar tensor}}
    %b = vt.param_load @budget : !vt.tensor<[block:N], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// param_load_with_bf16_result
vt.flow @f {
  vt.param @budget = 8 : i64
  vt.index_stage {
    // expected-error @+1 {{result must be a scalar f32 tensor}}
    %b = vt.param_load @budget : !vt.tensor<[], bf16>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// const_load_type_mismatch
vt.flow @f {
  vt.const @c : !vt.tensor<[m:8], f32> {
    %0 = vt.gaussian {seed = 1 : i64} : !vt.tensor<[m:8], f32>
    vt.yield %0 : !vt.tensor<[m:8], f32>
  }
  vt.index_stage {
    // expected-error @+1 {{result type '!vt.tensor<[m:4], f32>' does not match the type '!vt.tensor<[m:8], f32>' of @c}}
    %c = vt.const_load @c : !vt.tensor<[m:4], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// field_store_in_index_stage
vt.flow @f {
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  vt.index_stage {
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %m = vt.reduce max %q [head] : !vt.tensor<[head:G, dim:D], f32> -> !vt.tensor<[dim:D], f32>
    // expected-error @+1 {{is only allowed inside vt.cache_stage}}
    vt.field_store @k, %m : !vt.tensor<[dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// field_store_axes_differ_from_field
vt.flow @f {
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  vt.cache_stage {
    %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    // expected-error @+1 {{stored value axes [token:16, dim:D] differ from the axes [dim:D] of field @k}}
    vt.field_store @k, %k : !vt.tensor<[token:16, dim:D], f32>
    vt.yield
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// field_store_of_unknown_field
vt.flow @f {
  vt.cache_stage {
    %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    // expected-error @+1 {{'@k' does not name a vt.cache_field of the enclosing vt.flow}}
    vt.field_store @k, %k : !vt.tensor<[token:16, dim:D], f32>
    vt.yield
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// field_load_in_cache_stage
vt.flow @f {
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  vt.cache_stage {
    // expected-error @+1 {{is only allowed inside vt.index_stage}}
    %k = vt.field_load @k : !vt.tensor<[block:N, dim:D], f32>
    vt.yield
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// field_load_without_block_axis
vt.flow @f {
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  vt.index_stage {
    // expected-error @+1 {{result axes [dim:D] must be the axes [dim:D] of field @k plus 'block'}}
    %k = vt.field_load @k : !vt.tensor<[dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// field_load_with_storage_element_type
vt.flow @f {
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  vt.index_stage {
    // expected-error @+1 {{result element type must be f32, got 'bf16'}}
    %k = vt.field_load @k : !vt.tensor<[block:N, dim:D], bf16>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// state_load_axes_differ_from_state
vt.flow @f {
  vt.state @acc : !vt.tensor<[block:N], f32> = 0.0
  vt.index_stage {
    // expected-error @+1 {{result axes [] differ from the axes [block:N] of state @acc}}
    %a = vt.state_load @acc : !vt.tensor<[], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// state_store_element_type_mismatch
vt.flow @f {
  vt.state @acc : !vt.tensor<[block:N], bf16> = 0.0
  vt.state @h : !vt.tensor<[block:N], f16> = 0.0
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %x = vt.state_load @h : !vt.tensor<[block:N], f16>
    // expected-error @+1 {{stored value element type must be f32 or 'bf16', got 'f16'}}
    vt.state_store @acc, %x : !vt.tensor<[block:N], f16>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// state_store_in_cache_stage
vt.flow @f {
  vt.state @acc : !vt.tensor<[], f32> = 0.0
  vt.cache_stage {
    %c = vt.constant 1.0 : !vt.tensor<[], f32>
    // expected-error @+1 {{is only allowed inside vt.index_stage}}
    vt.state_store @acc, %c : !vt.tensor<[], f32>
    vt.yield
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// constant_with_f16_result
vt.flow @f {
  vt.index_stage {
    // expected-error @+1 {{result element type must be f32, got 'f16'}}
    %c = vt.constant 1.0 : !vt.tensor<[], f16>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// binary_shared_axis_with_different_sizes
vt.flow @f {
  vt.index_stage {
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %k = vt.input K : !vt.tensor<[block:N, token:16, dim:D], f32>
    %r = vt.reduce sum %k [token] : !vt.tensor<[block:N, token:16, dim:D], f32> -> !vt.tensor<[block:N, dim:D], f32>
    %c = vt.constant 1.0 : !vt.tensor<[], f32>
    %m = vt.rename %r "block" -> "head" : !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[head:N, dim:D], f32>
    // expected-error @+1 {{axis 'head' has size G in operand #0 but N in operand #1}}
    %x = vt.add %q, %m : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[head:N, dim:D], f32> -> !vt.tensor<[head:G, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// binary_result_is_not_the_union
vt.flow @f {
  vt.index_stage {
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{result axes [head:G, dim:D] must be the union of the operand axes [head:G, dim:D, block:N]}}
    %x = vt.mul %q, %p : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[head:G, dim:D], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// binary_result_not_f32
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{result element type must be f32, got 'bf16'}}
    %x = vt.sub %p, %p : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], bf16>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// unary_result_axes_differ
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{result axes [] must be the union of the operand axes [block:N]}}
    %x = vt.exp %p : !vt.tensor<[block:N], f32> -> !vt.tensor<[], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// where_result_is_not_the_union
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    %c = vt.constant 0.0 : !vt.tensor<[], f32>
    // expected-error @+1 {{result axes [block:N] must be the union of the operand axes [block:N, head:G]}}
    %x = vt.where %p, %m, %c : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N, head:G], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// reduce_over_missing_axis
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{reduced axis 'dim' is not an axis of the input [block:N]}}
    %x = vt.reduce sum %p [dim] : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// reduce_axis_listed_twice
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{reduced axis 'block' is listed twice}}
    %x = vt.reduce sum %p [block, block] : !vt.tensor<[block:N], f32> -> !vt.tensor<[], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// reduce_result_keeps_reduced_axis
vt.flow @f {
  vt.index_stage {
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    // expected-error @+1 {{result axes [block:N, head:G] must be [block:N]}}
    %x = vt.reduce max %m [head] : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N, head:G], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// softmax_without_block_axis
vt.flow @f {
  vt.index_stage {
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %c = vt.constant 1.0 : !vt.tensor<[], f32>
    // expected-error @+1 {{input must have a 'block' axis, got [head:G, dim:D]}}
    %x = vt.softmax %q, %c : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[], f32> -> !vt.tensor<[head:G, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// normalize_result_axes_differ
vt.flow @f {
  vt.index_stage {
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    // expected-error @+1 {{result axes [block:N] must be [block:N, head:G]}}
    %x = vt.normalize %m : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// conv_with_even_number_of_weights
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{expects an odd number of weights, got 2}}
    %x = vt.conv %p [0.5, 0.5] : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// kth_largest_with_device_k
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %k = vt.reduce max %p [block] : !vt.tensor<[block:N], f32> -> !vt.tensor<[], f32>
    // expected-error @+1 {{k must be host-evaluable}}
    %x = vt.kth_largest %p, %k : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// kth_largest_result_keeps_block
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    // expected-error @+1 {{result axes [block:N] must be []}}
    %x = vt.kth_largest %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// split_of_symbolic_size
vt.flow @f {
  vt.index_stage {
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    // expected-error @+1 {{axis 'dim' must have a static size to be split, got D}}
    %x = vt.split %q "dim" -> "sub" x 2 : !vt.tensor<[head:G, dim:D], f32> -> !vt.tensor<[head:G, sub:2, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// split_factor_does_not_divide
vt.flow @f {
  vt.index_stage {
    %k = vt.input K : !vt.tensor<[block:N, token:16, dim:D], f32>
    // expected-error @+1 {{factor 3 does not divide the size 16 of axis 'token'}}
    %x = vt.split %k "token" -> "sub" x 3 : !vt.tensor<[block:N, token:16, dim:D], f32> -> !vt.tensor<[block:N, sub:3, token:5, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// split_outer_axis_already_exists
vt.flow @f {
  vt.index_stage {
    %k = vt.input K : !vt.tensor<[block:N, token:16, dim:D], f32>
    // expected-error @+1 {{outer axis 'dim' must be a new axis name}}
    %x = vt.split %k "token" -> "dim" x 4 : !vt.tensor<[block:N, token:16, dim:D], f32> -> !vt.tensor<[block:N, token:4, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// split_result_axes_wrong
vt.flow @f {
  vt.index_stage {
    %k = vt.input K : !vt.tensor<[block:N, token:16, dim:D], f32>
    // expected-error @+1 {{result axes [block:N, sub:4, token:16, dim:D] must be [block:N, sub:4, token:4, dim:D]}}
    %x = vt.split %k "token" -> "sub" x 4 : !vt.tensor<[block:N, token:16, dim:D], f32> -> !vt.tensor<[block:N, sub:4, token:16, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// rename_of_missing_axis
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{axis 'm' is not an axis of the input [block:N]}}
    %x = vt.rename %p "m" -> "n" : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// rename_to_existing_axis
vt.flow @f {
  vt.index_stage {
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    // expected-error @+1 {{axis 'block' already exists in the input}}
    %x = vt.rename %m "head" -> "block" : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:G], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// rename_result_axes_wrong
vt.flow @f {
  vt.index_stage {
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    // expected-error @+1 {{result axes [block:N, head:G] must be [block:N, h:G]}}
    %x = vt.rename %m "head" -> "h" : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[block:N, head:G], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// rademacher_outside_const
vt.flow @f {
  vt.index_stage {
    // expected-error @+1 {{is only allowed inside vt.const}}
    %r = vt.rademacher {seed = 1 : i64} : !vt.tensor<[m:8], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// gaussian_outside_const
vt.flow @f {
  vt.cache_stage {
    // expected-error @+1 {{is only allowed inside vt.const}}
    %r = vt.gaussian {seed = 1 : i64} : !vt.tensor<[m:8], f32>
    vt.yield
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// literal_with_symbolic_size
vt.flow @f {
  vt.const @c : !vt.tensor<[dim:D], f32> {
    // expected-error @+1 {{type must have static sizes, got axis 'dim' of size D}}
    %0 = vt.literal [1.0] : !vt.tensor<[dim:D], f32>
    vt.yield %0 : !vt.tensor<[dim:D], f32>
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// literal_value_count_mismatch
vt.flow @f {
  vt.const @c : !vt.tensor<[m:2, n:2], f32> {
    // expected-error @+1 {{has 3 values but the type holds 4}}
    %0 = vt.literal [1.0, 2.0, 3.0] : !vt.tensor<[m:2, n:2], f32>
    vt.yield %0 : !vt.tensor<[m:2, n:2], f32>
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// topk_score_with_extra_axis
vt.flow @f {
  vt.index_stage {
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    // expected-error @+1 {{score must have exactly the axes [block], got [block:N, head:G]}}
    %s = vt.topk %m, %n : !vt.tensor<[block:N, head:G], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// topk_with_device_k
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %k = vt.reduce sum %p [block] : !vt.tensor<[block:N], f32> -> !vt.tensor<[], f32>
    // expected-error @+1 {{k must be host-evaluable}}
    %s = vt.topk %p, %k : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// topk_with_step_as_k
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %k = vt.input step : !vt.tensor<[], f32>
    // expected-error @+1 {{k must be host-evaluable}}
    %s = vt.topk %p, %k : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// topk_with_non_scalar_k
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{operand #1 must be vt scalar tensor}}
    %s = vt.topk %p, %p : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// approx_topk_recall_out_of_range
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    // expected-error @+1 {{recall must be in (0, 1], got 1.5}}
    %s = vt.approx_topk %p, %n {recall = 1.5 : f64} : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// threshold_with_device_max
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %t = vt.constant 0.5 : !vt.tensor<[], f32>
    %m = vt.reduce max %p [block] : !vt.tensor<[block:N], f32> -> !vt.tensor<[], f32>
    // expected-error @+1 {{max must be host-evaluable}}
    %s = vt.threshold %p, %t, %m : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// threshold_score_without_block
vt.flow @f {
  vt.index_stage {
    %t = vt.constant 0.5 : !vt.tensor<[], f32>
    // expected-error @+1 {{score must have exactly the axes [block], got []}}
    %s = vt.threshold %t, %t : !vt.tensor<[], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// A kernel outside a stage.
vt.flow @kernel_outside_stage {
  // expected-error @+1 {{must be inside vt.cache_stage or vt.index_stage}}
  vt.kernel block_map {
    vt.yield
  }
  vt.index_stage {
    %0 = vt.input position : !vt.tensor<[block:N], f32>
    %1 = vt.constant 1.0 : !vt.tensor<[], f32>
    %2 = vt.topk %0, %1 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %2 : !vt.selection
  }
}

// -----

// Only cache_map kernels belong in the cache stage.
vt.flow @kernel_kind_in_cache {
  vt.cache_stage {
    // expected-error @+1 {{a block_map kernel cannot be in vt.cache_stage}}
    vt.kernel block_map {
      vt.yield
    }
    vt.yield
  }
  vt.index_stage {
    %0 = vt.input position : !vt.tensor<[block:N], f32>
    %1 = vt.constant 1.0 : !vt.tensor<[], f32>
    %2 = vt.topk %0, %1 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %2 : !vt.selection
  }
}

// -----

// Yields must match the kernel's results.
vt.flow @kernel_yield_mismatch {
  vt.index_stage {
    %0 = vt.input position : !vt.tensor<[block:N], f32>
    %1 = vt.constant 1.0 : !vt.tensor<[], f32>
    // expected-error @+1 {{yields 0 values whose types differ from its results}}
    %k = vt.kernel block_map {
      vt.yield
    } -> !vt.tensor<[block:N], f32>
    %2 = vt.topk %k, %1 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %2 : !vt.selection
  }
}
