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

// block_size_zero
vt.flow @f {
  // expected-error @+1 {{'block_size' must be a power of two in 1..1024, got 0}}
  vt.param compile_time @block_size = 0 : i64
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// block_size_not_a_power_of_two
vt.flow @f {
  // expected-error @+1 {{'block_size' must be a power of two in 1..1024, got 24}}
  vt.param compile_time @block_size = 24 : i64
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// block_size_above_1024
vt.flow @f {
  // expected-error @+1 {{'block_size' must be a power of two in 1..1024, got 2048}}
  vt.param compile_time @block_size = 2048 : i64
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// block_size_f64
vt.flow @f {
  // expected-error @+1 {{'block_size' must be an i64, got 1.600000e+01 : f64}}
  vt.param compile_time @block_size = 16.0 : f64
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// block_size_not_compile_time
vt.flow @f {
  // expected-error @+1 {{'block_size' must be compile_time: the kernels are specialized on it}}
  vt.param @block_size = 16 : i64
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// head_dim_above_1024
vt.flow @f {
  // expected-error @+1 {{'head_dim' must be in 0..1024, got 2048}}
  vt.param compile_time @head_dim = 2048 : i64
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// head_dim_negative
vt.flow @f {
  // expected-error @+1 {{'head_dim' must be in 0..1024, got -1}}
  vt.param compile_time @head_dim = -1 : i64
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// head_dim_not_compile_time
vt.flow @f {
  // expected-error @+1 {{'head_dim' must be compile_time: the kernels are specialized on it}}
  vt.param @head_dim = 64 : i64
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// keep_first_negative
vt.flow @f {
  // expected-error @+1 {{'keep_first' must be >= 0, got -1}}
  vt.param @keep_first = -1 : i64
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// keep_last_bool
vt.flow @f {
  // expected-error @+1 {{'keep_last' must be an i64, got true}}
  vt.param @keep_last = true
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

// axis_above_65536
vt.flow @f {
  // expected-error @+1 {{size must be at most 65536, got 65537}}
  vt.axis @m = 65537
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// axis_named_token
vt.flow @f {
  // expected-error @+1 {{'token' is a builtin axis}}
  vt.axis @token = 16
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
  // expected-error @+1 {{type must not depend on the block count N (axis 'm')}}
  vt.const @c : !vt.tensor<[m:N], f32> {
    %0 = vt.gaussian {seed = 1 : i64} : !vt.tensor<[m:N], f32>
    vt.yield %0 : !vt.tensor<[m:N], f32>
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// const_with_block_axis
vt.flow @f {
  // expected-error @+1 {{type must not have a 'block' axis (a const is the same for every sequence and head)}}
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

// const_with_head_axis
vt.flow @f {
  // expected-error @+1 {{type must not have a 'head' axis (a const is the same for every sequence and head)}}
  vt.const @c : !vt.tensor<[head:G, m:4], f32> {
    %0 = vt.gaussian {seed = 1 : i64} : !vt.tensor<[head:G, m:4], f32>
    vt.yield %0 : !vt.tensor<[head:G, m:4], f32>
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

// cache_field_dim_is_static_without_head_dim
vt.flow @f {
  // expected-error @+1 {{type axis 'dim' must have size D, got 7}}
  vt.cache_field @k : !vt.tensor<[dim:7], bf16>
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// cache_field_dim_does_not_divide_the_head_dim
vt.flow @f {
  vt.param compile_time @head_dim = 64 : i64
  // expected-error @+1 {{type axis 'dim' must have size 64 (the flow's head_dim) or, after vt.split, a divisor of it, got 24}}
  vt.cache_field @k : !vt.tensor<[dim:24], bf16>
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// cache_field_never_stored
vt.flow @f {
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  // expected-error @+1 {{is never stored: the cache stage must store every cache field}}
  vt.cache_field @unstored : !vt.tensor<[dim:D], bf16>
  vt.cache_stage {
    %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    %m = vt.reduce max %k [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
    vt.field_store @k, %m : !vt.tensor<[dim:D], f32>
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

// cache_field_without_cache_stage
vt.flow @f {
  // expected-error @+1 {{is never stored: the cache stage must store every cache field}}
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// field_stored_twice
vt.flow @f {
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  vt.cache_stage {
    %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    %m = vt.reduce max %k [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
    // expected-note @+1 {{first store here}}
    vt.field_store @k, %m : !vt.tensor<[dim:D], f32>
    // expected-error @+1 {{stores field @k a second time in this stage}}
    vt.field_store @k, %m : !vt.tensor<[dim:D], f32>
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

// state_with_token_axis
vt.flow @f {
  // expected-error @+1 {{type must not have a 'token' axis (a state lives per sequence or per block)}}
  vt.state @s : !vt.tensor<[block:N, token:16], f32> = 0.0
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// state_with_block_axis_not_first
vt.flow @f {
  // expected-error @+1 {{a per-block state must have its 'block' axis first, got [head:G, block:N]}}
  vt.state @s : !vt.tensor<[head:G, block:N], f32> = 0.0
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// state_head_axis_is_not_G
vt.flow @f {
  // expected-error @+1 {{type axis 'head' must have size G, got 4}}
  vt.state @s : !vt.tensor<[block:N, head:4], f32> = 0.0
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

// cache_stage_K_token_differs_from_block_size
vt.flow @f {
  vt.param compile_time @block_size = 32 : i64
  vt.cache_stage {
    // expected-error @+1 {{result axis 'token' must have size 32 (the flow's block_size), got 16}}
    %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
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

// index_stage_V_token_differs_from_block_size
vt.flow @f {
  vt.param compile_time @block_size = 32 : i64
  vt.index_stage {
    // expected-error @+1 {{result axis 'token' must have size 32 (the flow's block_size), got 16}}
    %v = vt.input V : !vt.tensor<[block:N, token:16, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// K_token_differs_from_default_block_size
vt.flow @f {
  vt.index_stage {
    // expected-error @+1 {{result axis 'token' must have size 16 (the flow's block_size), got 32}}
    %k = vt.input K : !vt.tensor<[block:N, token:32, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// q_dim_differs_from_head_dim
vt.flow @f {
  vt.param compile_time @head_dim = 64 : i64
  vt.index_stage {
    // expected-error @+1 {{result axis 'dim' must have size 64 (the flow's head_dim), got D}}
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// q_dim_static_without_head_dim
vt.flow @f {
  vt.index_stage {
    // expected-error @+1 {{result axis 'dim' must have size D, got 64}}
    %q = vt.input q : !vt.tensor<[head:G, dim:64], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// q_head_is_not_G
vt.flow @f {
  vt.index_stage {
    // expected-error @+1 {{result axis 'head' must have size G, got 4}}
    %q = vt.input q : !vt.tensor<[head:4, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// position_block_is_not_N
vt.flow @f {
  vt.index_stage {
    // expected-error @+1 {{result axis 'block' must have size N, got 8}}
    %p = vt.input position : !vt.tensor<[block:8], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:8], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// field_load_block_is_not_N
vt.flow @f {
  vt.cache_field @k : !vt.tensor<[dim:D], bf16>
  vt.cache_stage {
    %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
    %m = vt.reduce max %k [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
    vt.field_store @k, %m : !vt.tensor<[dim:D], f32>
    vt.yield
  }
  vt.index_stage {
    // expected-error @+1 {{result axis 'block' must have size N, got 8}}
    %f = vt.field_load @k : !vt.tensor<[block:8, dim:D], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// gaussian_token_differs_from_block_size
vt.flow @f {
  vt.const @c : !vt.tensor<[token:8], f32> {
    // expected-error @+1 {{result axis 'token' must have size 16 (the flow's block_size), got 8}}
    %0 = vt.gaussian {seed = 1 : i64} : !vt.tensor<[token:8], f32>
    vt.yield %0 : !vt.tensor<[token:8], f32>
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// rename_to_token_with_another_size
vt.flow @f {
  vt.const @c : !vt.tensor<[m:8], f32> {
    %0 = vt.gaussian {seed = 1 : i64} : !vt.tensor<[m:8], f32>
    vt.yield %0 : !vt.tensor<[m:8], f32>
  }
  vt.index_stage {
    %c = vt.const_load @c : !vt.tensor<[m:8], f32>
    // expected-error @+1 {{result axis 'token' must have size 16 (the flow's block_size), got 8}}
    %t = vt.rename %c "m" -> "token" : !vt.tensor<[m:8], f32> -> !vt.tensor<[token:8], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
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
    %m = vt.split %k "token" -> "sub" x 4 : !vt.tensor<[block:N, token:16, dim:D], f32> -> !vt.tensor<[block:N, sub:4, token:4, dim:D], f32>
    // expected-error @+1 {{axis 'token' has size 16 in operand #0 but 4 in operand #1}}
    %x = vt.add %k, %m : !vt.tensor<[block:N, token:16, dim:D], f32>, !vt.tensor<[block:N, sub:4, token:4, dim:D], f32> -> !vt.tensor<[block:N, sub:4, token:16, dim:D], f32>
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

// conv_with_more_than_15_weights
vt.flow @f {
  vt.index_stage {
    %q = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{expects at most 15 weights, got 17}}
    %c = vt.conv %q [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0] : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
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

// split_outer_axis_is_builtin
vt.flow @f {
  vt.const @c : !vt.tensor<[m:8], f32> {
    %0 = vt.gaussian {seed = 1 : i64} : !vt.tensor<[m:8], f32>
    vt.yield %0 : !vt.tensor<[m:8], f32>
  }
  vt.index_stage {
    %c = vt.const_load @c : !vt.tensor<[m:8], f32>
    // expected-error @+1 {{outer axis 'token' is a builtin axis}}
    %x = vt.split %c "m" -> "token" x 2 : !vt.tensor<[m:8], f32> -> !vt.tensor<[token:2, m:4], f32>
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
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    // expected-error @+1 {{axis 'dim' already exists in the input}}
    %x = vt.rename %q "head" -> "dim" : !vt.tensor<[head:G, dim:D], f32> -> !vt.tensor<[dim:G], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// rename_of_block
vt.flow @f {
  vt.index_stage {
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    // expected-error @+1 {{the 'block' axis cannot be renamed}}
    %x = vt.rename %m "block" -> "b" : !vt.tensor<[block:N, head:G], f32> -> !vt.tensor<[b:N, head:G], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// rename_to_block
vt.flow @f {
  vt.index_stage {
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    // expected-error @+1 {{the 'block' axis cannot be renamed}}
    %x = vt.rename %q "head" -> "block" : !vt.tensor<[head:G, dim:D], f32> -> !vt.tensor<[block:G, dim:D], f32>
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

// rademacher_with_negative_seed
vt.flow @f {
  vt.const @c : !vt.tensor<[m:8], f32> {
    // expected-error @+1 {{seed must be in 0..4294967295, got -1}}
    %0 = vt.rademacher {seed = -1 : i64} : !vt.tensor<[m:8], f32>
    vt.yield %0 : !vt.tensor<[m:8], f32>
  }
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// gaussian_with_seed_above_32_bits
vt.flow @f {
  vt.const @c : !vt.tensor<[m:8], f32> {
    // expected-error @+1 {{seed must be in 0..4294967295, got 4294967296}}
    %0 = vt.gaussian {seed = 4294967296 : i64} : !vt.tensor<[m:8], f32>
    vt.yield %0 : !vt.tensor<[m:8], f32>
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

// input_layer_in_cache_stage
vt.flow @f {
  vt.cache_stage {
    // expected-error @+1 {{input layer is only available in vt.index_stage}}
    %l = vt.input layer : !vt.tensor<[], f32>
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

// input_kv_head_with_axes
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{input kv_head must have the axes [] here}}
    %h = vt.input kv_head : !vt.tensor<[block:N], f32>
    %s = vt.topk %p, %p : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// input_group_in_cache_stage
vt.flow @f {
  vt.cache_stage {
    // expected-error @+1 {{input group is only available in vt.index_stage}}
    %g = vt.input group : !vt.tensor<[], f32>
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

// topp_with_device_max
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %h = vt.constant 0.5 : !vt.tensor<[], f32>
    %m = vt.reduce max %p [block] : !vt.tensor<[block:N], f32> -> !vt.tensor<[], f32>
    // expected-error @+1 {{max must be host-evaluable}}
    %s = vt.topp %p, %h, %m : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32>
    vt.return %s : !vt.selection
  }
}

// -----

// topp_score_without_block
vt.flow @f {
  vt.index_stage {
    %h = vt.constant 0.5 : !vt.tensor<[], f32>
    // expected-error @+1 {{score must have exactly the axes [block], got []}}
    %s = vt.topp %h, %h : !vt.tensor<[], f32>, !vt.tensor<[], f32>
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

// Each kind of kernel launches over its one grid.
vt.flow @kernel_launch_grid_of_kind {
  vt.index_stage {
    %0 = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{a block_map kernel launches over a tile grid, not row}}
    %1 = vt.kernel block_map launch <row, threads = 1024> {
      vt.yield %0 : !vt.tensor<[block:N], f32>
    } -> !vt.tensor<[block:N], f32>
    %2 = vt.constant 1.0 : !vt.tensor<[], f32>
    %3 = vt.topk %1, %2 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %3 : !vt.selection
  }
}

// -----

// append and commit are the runtime's own kernels, never a vt.kernel's.
vt.flow @kernel_launch_append {
  vt.cache_stage {
    // expected-error @+1 {{a cache_map kernel launches over a fields grid, not append}}
    vt.kernel cache_map launch <append, threads = 256> {
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

vt.flow @launch_threads {
  vt.index_stage {
    %0 = vt.input position : !vt.tensor<[block:N], f32>
    %1 = vt.constant 1.0 : !vt.tensor<[], f32>
    // expected-error @+1 {{threads must be a multiple of 32 in 32..1024, got 100}}
    %2 = vt.kernel select launch <row, threads = 100> {
      %3 = vt.topk %0, %1 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
      vt.yield %3 : !vt.selection
    } -> !vt.selection
    vt.return %2 : !vt.selection
  }
}

// -----

vt.flow @launch_tile_without_blocks {
  vt.index_stage {
    %0 = vt.input position : !vt.tensor<[block:N], f32>
    // expected-error @+1 {{a tile launch needs tile_blocks >= 1, got 0}}
    %1 = vt.kernel block_map launch <tile, threads = 256> {
      vt.yield %0 : !vt.tensor<[block:N], f32>
    } -> !vt.tensor<[block:N], f32>
    %2 = vt.constant 1.0 : !vt.tensor<[], f32>
    %3 = vt.topk %1, %2 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    vt.return %3 : !vt.selection
  }
}

// -----

vt.flow @launch_row_with_blocks {
  vt.index_stage {
    %0 = vt.input position : !vt.tensor<[block:N], f32>
    %1 = vt.constant 1.0 : !vt.tensor<[], f32>
    // expected-error @+1 {{tile_blocks is only for a tile launch, not row}}
    %2 = vt.kernel select launch <row, threads = 1024, tile_blocks = 8> {
      %3 = vt.topk %0, %1 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
      vt.yield %3 : !vt.selection
    } -> !vt.selection
    vt.return %2 : !vt.selection
  }
}

// -----

vt.flow @launch_unknown_grid {
  vt.index_stage {
    %0 = vt.input position : !vt.tensor<[block:N], f32>
    %1 = vt.constant 1.0 : !vt.tensor<[], f32>
    // expected-error @+2 {{expected ::vflow::vt::LaunchGrid to be one of: append, fields, tile, row, commit}}
    // expected-error @+1 {{failed to parse VT_LaunchAttr parameter 'grid'}}
    %2 = vt.kernel select launch <seq_kvhead, threads = 1024> {
      %3 = vt.topk %0, %1 : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
      vt.yield %3 : !vt.selection
    } -> !vt.selection
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

// -----

// retain_score_with_two_axes
vt.flow @f {
  vt.index_stage {
    %m = vt.input mass : !vt.tensor<[block:N, head:G], f32>
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    // expected-error @+1 {{retain score must have the block axis, or the block and token axes, only}}
    vt.return %s retain %m, %n combine "sum" : !vt.selection, !vt.tensor<[block:N, head:G], f32>, !vt.tensor<[], f32>
  }
}

// -----

// retain_capacity_not_scalar
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    // expected-error @+1 {{retain capacity must be a scalar}}
    vt.return %s retain %p, %p combine "sum" : !vt.selection, !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32>
  }
}

// -----

// retain_combine_unknown
vt.flow @f {
  vt.index_stage {
    %p = vt.input position : !vt.tensor<[block:N], f32>
    %n = vt.input num_blocks : !vt.tensor<[], f32>
    %s = vt.topk %p, %n : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    // expected-error @+1 {{combine must be "sum" or "max", got "mean"}}
    vt.return %s retain %p, %n combine "mean" : !vt.selection, !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
  }
}
