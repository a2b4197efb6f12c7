//===- VTOps.td - vTensor operations ------------------------*- tablegen -*-===//
//
// The ops of the vt dialect. docs/design/vt-dialect.md is the contract.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_DIALECT_VT_VTOPS_TD
#define VFLOW_DIALECT_VT_VTOPS_TD

include "vflow/Dialect/VT/VTTypes.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

class VT_Op<string mnemonic, list<Trait> traits = []>
    : Op<VT_Dialect, mnemonic, traits>;

class VT_OpTrait<string name> : NativeOpTrait<name> {
  let cppNamespace = "::vflow::vt::OpTrait";
}

// Result axes are the union of the axes of all operands (shared names must
// have equal sizes); the result element type is f32.
def VT_BroadcastElementwise : VT_OpTrait<"BroadcastElementwise">;

def VT_ScalarF32 : Type<
    And<[CPred<"$_self.isa<::vflow::vt::TensorType>()">,
         CPred<"$_self.cast<::vflow::vt::TensorType>().isScalar()">]>,
    "vt scalar tensor", "::vflow::vt::TensorType">;

def VT_AxisNameArrayAttr : TypedArrayAttrBase<StrAttr, "axis name array">;

//===----------------------------------------------------------------------===//
// Structure ops
//===----------------------------------------------------------------------===//

def VT_FlowOp : VT_Op<"flow", [
    Symbol, SymbolTable, IsolatedFromAbove, NoTerminator, SingleBlock,
    NoRegionArguments]> {
  let summary = "one flow of a vflow program";
  let description = [{
    Holds the declarations of a flow (`vt.param`, `vt.axis`, `vt.const`,
    `vt.cache_field`, `vt.state`), at most one `vt.cache_stage` and exactly
    one `vt.index_stage`. It is a symbol table for the declarations.

    Every type in the flow gives the builtin axes their sizes: `block` N,
    `head` G, `token` the `block_size` param (16 without one), `dim` the
    `head_dim` param when positive, else D; a static `token` or `dim` may
    have a divisor of that size after `vt.split`. The cache stage stores
    every `vt.cache_field`.

    ```mlir
    vt.flow @quest {
      vt.param @budget = 64 : i64
      vt.index_stage { ... }
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name);
  let regions = (region SizedRegion<1>:$bodyRegion);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $bodyRegion";
  let skipDefaultBuilders = 1;
  let builders = [
    OpBuilder<(ins "::llvm::StringRef":$name)>
  ];
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// The cache stage, or null when the flow has none.
    CacheStageOp getCacheStage();
    /// The index stage, or null when missing (verification fails then).
    IndexStageOp getIndexStage();
  }];
}

def VT_ParamOp : VT_Op<"param", [Symbol, HasParent<"FlowOp">]> {
  let summary = "a flow parameter with its value";
  let description = [{
    A parameter of the flow with its (possibly overridden) value: an `i64`,
    `f64` or `i1` attribute. `compile_time` params specialize kernels. The
    reserved params are `i64`: `block_size` a power of two in 1..1024 and
    `head_dim` in 0..1024, both `compile_time`; `keep_first` and `keep_last`
    >= 0.

    ```mlir
    vt.param @budget = 64 : i64
    vt.param compile_time @sketch = 8 : i64
    vt.param @scale = 5.000000e-01 : f64
    vt.param @use_sink = true
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypedAttrInterface:$value,
                       UnitAttr:$compile_time);
  let assemblyFormat = [{
    (`compile_time` $compile_time^)? $sym_name `=` $value attr-dict
  }];
  let hasVerifier = 1;
}

def VT_AxisOp : VT_Op<"axis", [Symbol, HasParent<"FlowOp">]> {
  let summary = "a declared user axis";
  let description = [{
    The size is in 1..65536; the name is not a builtin axis (`block`,
    `head`, `token`, `dim`).

    ```mlir
    vt.axis @m = 8
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, I64Attr:$size);
  let assemblyFormat = "$sym_name `=` $size attr-dict";
  let hasVerifier = 1;
}

def VT_ConstOp : VT_Op<"const", [
    Symbol, HasParent<"FlowOp">, IsolatedFromAbove, NoRegionArguments]> {
  let summary = "a constant tensor computed from generator ops";
  let description = [{
    A constant tensor computed once per (flow, head dimension). The region
    computes it from generator ops (`vt.rademacher`, `vt.gaussian`,
    `vt.literal`) and elementwise ops, and ends with `vt.yield` of a value of
    exactly the declared type, which has no `block` or `head` axis.

    ```mlir
    vt.const @Phi : !vt.tensor<[dim:D, m:8], f32> {
      %0 = vt.rademacher {seed = 7 : i64} : !vt.tensor<[dim:D, m:8], f32>
      vt.yield %0 : !vt.tensor<[dim:D, m:8], f32>
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<VT_TensorType>:$type);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name `:` $type attr-dict-with-keyword $body";
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    ::vflow::vt::TensorType getTensorType() {
      return getType().cast<::vflow::vt::TensorType>();
    }
  }];
}

def VT_CacheFieldOp : VT_Op<"cache_field", [Symbol, HasParent<"FlowOp">]> {
  let summary = "a per-block cache field";
  let description = [{
    A value stored for every completed block. The type gives the per-block
    shape (no `block` or `token` axis) and the storage element type.

    ```mlir
    vt.cache_field @kmax : !vt.tensor<[dim:D], bf16>
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<VT_TensorType>:$type);
  let assemblyFormat = "$sym_name `:` $type attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::vflow::vt::TensorType getTensorType() {
      return getType().cast<::vflow::vt::TensorType>();
    }
  }];
}

def VT_StateOp : VT_Op<"state", [Symbol, HasParent<"FlowOp">]> {
  let summary = "a persistent state";
  let description = [{
    A value kept across decode steps, initialized to `init`. A `block` axis
    makes it per block and must come first. A state has no `token` axis.

    ```mlir
    vt.state @acc : !vt.tensor<[block:N], f32> = 0.000000e+00
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<VT_TensorType>:$type,
                       F32Attr:$init);
  let assemblyFormat = "$sym_name `:` $type `=` $init attr-dict";
  let hasVerifier = 1;
  let builders = [
    OpBuilder<(ins "::llvm::StringRef":$name, "::vflow::vt::TensorType":$type,
                   CArg<"float", "0.0f">:$init), [{
      build($_builder, $_state, $_builder.getStringAttr(name),
            ::mlir::TypeAttr::get(type), $_builder.getF32FloatAttr(init));
    }]>
  ];
  let extraClassDeclaration = [{
    ::vflow::vt::TensorType getTensorType() {
      return getType().cast<::vflow::vt::TensorType>();
    }
  }];
}

def VT_CacheStageOp : VT_Op<"cache_stage", [
    HasParent<"FlowOp">, IsolatedFromAbove, NoRegionArguments]> {
  let summary = "the stage run once per completed block";
  let description = [{
    Runs once per completed block with inputs `K` and `V` and stores each
    cache field exactly once. Ends with `vt.yield` without operands.

    ```mlir
    vt.cache_stage {
      %k = vt.input K : !vt.tensor<[token:16, dim:D], f32>
      %m = vt.reduce max %k [token] : !vt.tensor<[token:16, dim:D], f32> -> !vt.tensor<[dim:D], f32>
      vt.field_store @kmax, %m : !vt.tensor<[dim:D], f32>
      vt.yield
    }
    ```
  }];
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "attr-dict-with-keyword $body";
  let skipDefaultBuilders = 1;
  let builders = [OpBuilder<(ins)>];
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::Block &getBodyBlock() { return getBody().front(); }
  }];
}

def VT_IndexStageOp : VT_Op<"index_stage", [
    HasParent<"FlowOp">, IsolatedFromAbove, NoRegionArguments]> {
  let summary = "the stage run once per decode step";
  let description = [{
    Runs once per decode step and returns the selected blocks with
    `vt.return`. Each state is stored at most once.

    ```mlir
    vt.index_stage {
      ...
      vt.return %sel : !vt.selection
    }
    ```
  }];
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "attr-dict-with-keyword $body";
  let skipDefaultBuilders = 1;
  let builders = [OpBuilder<(ins)>];
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::Block &getBodyBlock() { return getBody().front(); }
  }];
}

def VT_YieldOp : VT_Op<"yield", [
    Pure, Terminator, ReturnLike,
    ParentOneOf<["ConstOp", "CacheStageOp", "KernelOp"]>]> {
  let summary = "ends a vt.const region, a vt.cache_stage or a vt.kernel";
  let description = [{
    ```mlir
    vt.yield %v : !vt.tensor<[m:8], f32>
    vt.yield
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "attr-dict ($values^ `:` qualified(type($values)))?";
  let builders = [OpBuilder<(ins), [{ build($_builder, $_state, ::mlir::ValueRange()); }]>];
}

def VT_ReturnOp : VT_Op<"return", [
    Pure, Terminator, ReturnLike, HasParent<"IndexStageOp">,
    AttrSizedOperandSegments]> {
  let summary = "returns the selection of the index stage";
  let description = [{
    Ends the index stage with its selection. A flow with a retain block
    also returns the retain score (one value per block) and its capacity
    (a scalar budget in blocks, which the host evaluates), with `combine`
    saying how the runtime adds up the scores of KV heads and layers:

    ```mlir
    vt.return %sel : !vt.selection
    vt.return %sel retain %score, %cap combine "sum"
        : !vt.selection, !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    ```
  }];
  let arguments = (ins VT_SelectionType:$selection,
                   Optional<VT_TensorType>:$retainScore,
                   Optional<VT_TensorType>:$retainCapacity,
                   OptionalAttr<StrAttr>:$combine);
  let assemblyFormat = [{
    $selection (`retain` $retainScore^ `,` $retainCapacity `combine` $combine)?
    attr-dict `:` qualified(type($selection))
    (`,` qualified(type($retainScore))^ `,` qualified(type($retainCapacity)))?
  }];
  let builders = [OpBuilder<(ins "::mlir::Value":$selection), [{
    build($_builder, $_state, selection, ::mlir::Value(), ::mlir::Value(),
          ::mlir::StringAttr());
  }]>];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Stage inputs and symbol accesses
//===----------------------------------------------------------------------===//

def VT_KernelOp : VT_Op<"kernel", [
    RecursiveMemoryEffects, SingleBlockImplicitTerminator<"YieldOp">]> {
  let summary = "a group of ops fused into one kernel";
  let description = [{
    Made by `--vt-fuse-kernels`: the ops of a stage that run in one kernel
    template. `cache_map` runs once per (page, KV head) in the cache stage;
    `block_map` maps over the blocks of a sequence (and computes
    per-sequence values); `cross_block` reduces or scans along `block`;
    `select` turns scores into the selected block list. The region may use
    values defined before the kernel; `vt.yield` gives the values used after
    it. `--vt-plan-launches` adds the `launch` plan (`#vt.launch`) that the
    CUDA backend launches the kernel by: `fields` for `cache_map`, `tile`
    for `block_map`, `row` for `cross_block` and `select`.

    ```mlir
    %s = vt.kernel block_map launch <tile, threads = 256, tile_blocks = 64> {
      %1 = vt.mul %q, %c : ... -> ...
      vt.yield %1 : !vt.tensor<[block:N, head:G, dim:D], f32>
    } -> !vt.tensor<[block:N, head:G, dim:D], f32>
    ```
  }];
  let arguments = (ins VT_KernelKindAttr:$kind,
                       OptionalAttr<VT_LaunchAttr>:$launch);
  let results = (outs Variadic<AnyType>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $kind (`launch` $launch^)? attr-dict-with-keyword $body
    (`->` qualified(type($results))^)?
  }];
  let builders = [
    OpBuilder<(ins "::mlir::TypeRange":$results, "KernelKind":$kind), [{
      build($_builder, $_state, results, kind, LaunchAttr());
    }]>
  ];
  let hasVerifier = 1;
}

def VT_InputOp : VT_Op<"input", [Pure]> {
  let summary = "a stage input";
  let description = [{
    `K` and `V` are `[token, dim]` in the cache stage and
    `[block, token, dim]` in the index stage. Index stage only: `q`
    (`[head, dim]`), `mass` (`[block, head]`), `position` (`[block]`) and the
    scalars `num_blocks`, `context_len`, `step`, `group` (the query heads
    of a KV head, fixed for a session), `layer` and `kv_head` (the model's
    indices of the decode layer and KV head the stage runs for).

    ```mlir
    %q = vt.input q : !vt.tensor<[head:G, dim:D], f32>
    ```
  }];
  let arguments = (ins VT_InputKindAttr:$kind);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = "$kind attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def VT_ParamLoadOp : VT_Op<"param_load", [
    Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "the value of a param as a scalar";
  let description = [{
    ```mlir
    %b = vt.param_load @budget : !vt.tensor<[], f32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$param);
  let results = (outs VT_ScalarF32:$result);
  let assemblyFormat = "$param attr-dict `:` qualified(type($result))";
}

def VT_ConstLoadOp : VT_Op<"const_load", [
    Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "the value of a vt.const";
  let description = [{
    The result has the axes and element type of the const.

    ```mlir
    %phi = vt.const_load @Phi : !vt.tensor<[dim:D, m:8], f32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = "$name attr-dict `:` qualified(type($result))";
}

def VT_FieldStoreOp : VT_Op<"field_store", [
    MemoryEffects<[MemWrite]>,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "stores a cache field for the current block";
  let description = [{
    Cache stage only. The value has exactly the axes of the field; it is
    converted to the field's storage type.

    ```mlir
    vt.field_store @kmax, %m : !vt.tensor<[dim:D], f32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$field, VT_AnyTensor:$value);
  let assemblyFormat = "$field `,` $value attr-dict `:` qualified(type($value))";
  let hasVerifier = 1;
}

def VT_FieldLoadOp : VT_Op<"field_load", [
    Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a cache field over all blocks";
  let description = [{
    Index stage only. The result has the field's axes plus `block`, in f32.

    ```mlir
    %kmax = vt.field_load @kmax : !vt.tensor<[block:N, dim:D], f32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$field);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = "$field attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def VT_StateLoadOp : VT_Op<"state_load", [
    MemoryEffects<[MemRead]>,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "reads a state";
  let description = [{
    Index stage only. The result has the state's axes; its element type is
    f32 or the state's.

    ```mlir
    %a = vt.state_load @acc : !vt.tensor<[block:N], f32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$state);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = "$state attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def VT_StateStoreOp : VT_Op<"state_store", [
    MemoryEffects<[MemWrite]>,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "writes a state";
  let description = [{
    Index stage only, at most once per state. The value has the state's
    axes; its element type is f32 or the state's.

    ```mlir
    vt.state_store @acc, %new : !vt.tensor<[block:N], f32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$state, VT_AnyTensor:$value);
  let assemblyFormat = "$state `,` $value attr-dict `:` qualified(type($value))";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Constants and elementwise ops
//===----------------------------------------------------------------------===//

def VT_ConstantOp : VT_Op<"constant", [ConstantLike, Pure]> {
  let summary = "a scalar f32 constant";
  let description = [{
    ```mlir
    %c = vt.constant 1.500000e+00 : !vt.tensor<[], f32>
    ```
  }];
  let arguments = (ins F32Attr:$value);
  let results = (outs VT_ScalarF32:$result);
  let assemblyFormat = "$value attr-dict `:` qualified(type($result))";
  let builders = [
    OpBuilder<(ins "float":$value), [{
      build($_builder, $_state,
            ::vflow::vt::TensorType::getScalar($_builder.getContext()),
            $_builder.getF32FloatAttr(value));
    }]>
  ];
  let hasFolder = 1;
  let hasVerifier = 1;
}

class VT_BinaryOp<string mnemonic, string desc, list<Trait> traits = []>
    : VT_Op<mnemonic, !listconcat([Pure, VT_BroadcastElementwise], traits)> {
  let summary = desc;
  let description = [{
    Elementwise, broadcasting by axis name: the result axes are the union of
    the operand axes.

    ```mlir
    %2 = vt.}] # mnemonic # [{ %0, %1 : !vt.tensor<[head:G, dim:D], f32>, !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N, head:G, dim:D], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$lhs, VT_AnyTensor:$rhs);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` qualified(type($lhs)) `,` qualified(type($rhs)) `->` qualified(type($result))
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Value":$lhs, "::mlir::Value":$rhs), [{
      build($_builder, $_state,
            ::vflow::vt::inferBroadcastResultType({lhs, rhs}), lhs, rhs);
    }]>
  ];
  let hasFolder = 1;
}

def VT_AddOp : VT_BinaryOp<"add", "elementwise addition", [Commutative]>;
def VT_SubOp : VT_BinaryOp<"sub", "elementwise subtraction">;
def VT_MulOp : VT_BinaryOp<"mul", "elementwise multiplication", [Commutative]>;
def VT_DivOp : VT_BinaryOp<"div", "elementwise division">;
def VT_PowOp : VT_BinaryOp<"pow", "elementwise power">;
def VT_MaximumOp : VT_BinaryOp<"maximum", "elementwise maximum", [Commutative]>;
def VT_MinimumOp : VT_BinaryOp<"minimum", "elementwise minimum", [Commutative]>;
def VT_AndOp : VT_BinaryOp<"and", "elementwise logical and (nonzero is true, result 0/1)", [Commutative]>;
def VT_OrOp : VT_BinaryOp<"or", "elementwise logical or (nonzero is true, result 0/1)", [Commutative]>;

def VT_CmpOp : VT_Op<"cmp", [Pure, VT_BroadcastElementwise]> {
  let summary = "elementwise comparison (result 0/1)";
  let description = [{
    ```mlir
    %c = vt.cmp gt %a, %t : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    ```
  }];
  let arguments = (ins VT_CmpPredicateAttr:$predicate,
                       VT_AnyTensor:$lhs, VT_AnyTensor:$rhs);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $predicate $lhs `,` $rhs attr-dict `:` qualified(type($lhs)) `,` qualified(type($rhs)) `->` qualified(type($result))
  }];
  let builders = [
    OpBuilder<(ins "::vflow::vt::CmpPredicate":$predicate,
                   "::mlir::Value":$lhs, "::mlir::Value":$rhs), [{
      build($_builder, $_state,
            ::vflow::vt::inferBroadcastResultType({lhs, rhs}), predicate,
            lhs, rhs);
    }]>
  ];
  let hasFolder = 1;
}

class VT_UnaryOp<string mnemonic, string desc, list<Trait> traits = []>
    : VT_Op<mnemonic, !listconcat([Pure, VT_BroadcastElementwise], traits)> {
  let summary = desc;
  let description = [{
    Elementwise; the result has the axes of the input.

    ```mlir
    %1 = vt.}] # mnemonic # [{ %0 : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$input);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = "$input attr-dict `:` qualified(type($input)) `->` qualified(type($result))";
  let builders = [
    OpBuilder<(ins "::mlir::Value":$input), [{
      build($_builder, $_state,
            ::vflow::vt::inferBroadcastResultType({input}), input);
    }]>
  ];
  let hasFolder = 1;
}

def VT_NegOp : VT_UnaryOp<"neg", "elementwise negation">;
def VT_NotOp : VT_UnaryOp<"not", "elementwise logical not (result 0/1)">;
def VT_ExpOp : VT_UnaryOp<"exp", "elementwise exponential">;
def VT_LogOp : VT_UnaryOp<"log", "elementwise natural logarithm">;
def VT_SqrtOp : VT_UnaryOp<"sqrt", "elementwise square root">;
def VT_RsqrtOp : VT_UnaryOp<"rsqrt", "elementwise reciprocal square root">;
def VT_AbsOp : VT_UnaryOp<"abs", "elementwise absolute value">;
def VT_ReluOp : VT_UnaryOp<"relu", "elementwise max(x, 0)">;
def VT_SigmoidOp : VT_UnaryOp<"sigmoid", "elementwise logistic sigmoid">;
def VT_SiluOp : VT_UnaryOp<"silu", "elementwise x * sigmoid(x)">;
def VT_TanhOp : VT_UnaryOp<"tanh", "elementwise hyperbolic tangent">;
def VT_HashOp : VT_UnaryOp<"hash",
    "elementwise uniform value in [0, 1) from the f32 bits (splitmix64)">;

def VT_ClampOp : VT_Op<"clamp", [Pure, VT_BroadcastElementwise]> {
  let summary = "elementwise clamp to [lo, hi]";
  let description = [{
    Broadcasting like the binary ops.

    ```mlir
    %r = vt.clamp %x, %lo, %hi : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$input, VT_AnyTensor:$lo,
                       VT_AnyTensor:$hi);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $input `,` $lo `,` $hi attr-dict `:` qualified(type($input)) `,` qualified(type($lo)) `,` qualified(type($hi)) `->` qualified(type($result))
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Value":$input, "::mlir::Value":$lo,
                   "::mlir::Value":$hi), [{
      build($_builder, $_state,
            ::vflow::vt::inferBroadcastResultType({input, lo, hi}), input, lo,
            hi);
    }]>
  ];
}

def VT_WhereOp : VT_Op<"where", [Pure, VT_BroadcastElementwise]> {
  let summary = "elementwise select: cond != 0 ? a : b";
  let description = [{
    Broadcasting like the binary ops.

    ```mlir
    %r = vt.where %c, %a, %b : !vt.tensor<[block:N], f32>, !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$condition, VT_AnyTensor:$trueValue,
                       VT_AnyTensor:$falseValue);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $condition `,` $trueValue `,` $falseValue attr-dict `:` qualified(type($condition)) `,` qualified(type($trueValue)) `,` qualified(type($falseValue)) `->` qualified(type($result))
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Value":$condition, "::mlir::Value":$trueValue,
                   "::mlir::Value":$falseValue), [{
      build($_builder, $_state,
            ::vflow::vt::inferBroadcastResultType(
                {condition, trueValue, falseValue}),
            condition, trueValue, falseValue);
    }]>
  ];
}

//===----------------------------------------------------------------------===//
// Reductions and ops along `block`
//===----------------------------------------------------------------------===//

def VT_ReduceOp : VT_Op<"reduce", [Pure]> {
  let summary = "reduces over named axes";
  let description = [{
    Removes the named axes (distinct, present in the input). An empty list
    folds to the input.

    ```mlir
    %3 = vt.reduce sum %2 [dim] : !vt.tensor<[block:N, dim:D], f32> -> !vt.tensor<[block:N], f32>
    ```
  }];
  let arguments = (ins VT_ReduceKindAttr:$kind, VT_AnyTensor:$input,
                       VT_AxisNameArrayAttr:$axes);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $kind $input custom<AxisList>($axes) attr-dict `:` qualified(type($input)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizer = 1;
  let extraClassDeclaration = [{
    /// The reduced axis names.
    ::llvm::SmallVector<::llvm::StringRef> getAxisNames();
    /// A wide reduction: not over `block`, and over the head dim or over at
    /// least 32 elements of static axes. Its sums (sum, mean, l2norm)
    /// accumulate in f32 lanes in one fixed order (rules::kSumLanes in
    /// NumericRules.h); other sums accumulate in f64.
    bool isWide();
    /// A sum, mean or l2norm that is wide.
    bool sumsInLanes();
  }];
}

def VT_SoftmaxOp : VT_Op<"softmax", [Pure]> {
  let summary = "softmax along block with a scalar scale";
  let description = [{
    `softmax(scale * x)` along `block`, independently for every other index.

    ```mlir
    %p = vt.softmax %s, %scale : !vt.tensor<[block:N, head:G], f32>, !vt.tensor<[], f32> -> !vt.tensor<[block:N, head:G], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$input, VT_ScalarF32:$scale);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $input `,` $scale attr-dict `:` qualified(type($input)) `,` qualified(type($scale)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
}

def VT_NormalizeOp : VT_Op<"normalize", [Pure]> {
  let summary = "normalizes along block to sum 1";
  let description = [{
    ```mlir
    %n = vt.normalize %x : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$input);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = "$input attr-dict `:` qualified(type($input)) `->` qualified(type($result))";
  let hasVerifier = 1;
}

def VT_ConvOp : VT_Op<"conv", [Pure]> {
  let summary = "1-D convolution along block";
  let description = [{
    Centered convolution along `block` with an odd number of weights
    (zero padding).

    ```mlir
    %c = vt.conv %x [2.500000e-01, 5.000000e-01, 2.500000e-01] : !vt.tensor<[block:N], f32> -> !vt.tensor<[block:N], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$input, DenseF32ArrayAttr:$weights);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $input $weights attr-dict `:` qualified(type($input)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
}

def VT_KthLargestOp : VT_Op<"kth_largest", [Pure]> {
  let summary = "the k-th largest value along block";
  let description = [{
    `k` is a host-evaluable scalar (1-based). The result drops `block`.

    ```mlir
    %t = vt.kth_largest %s, %k : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32> -> !vt.tensor<[], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$input, VT_ScalarF32:$k);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $input `,` $k attr-dict `:` qualified(type($input)) `,` qualified(type($k)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Shape ops
//===----------------------------------------------------------------------===//

def VT_SplitOp : VT_Op<"split", [Pure]> {
  let summary = "splits an axis into an outer axis and the rest";
  let description = [{
    Replaces `axis` (static size S, divisible by `factor`) by `outer` of size
    `factor` followed by `axis` of size S / factor.

    ```mlir
    %s = vt.split %x "token" -> "sub" x 4 : !vt.tensor<[token:16], f32> -> !vt.tensor<[sub:4, token:4], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$input, StrAttr:$axis, StrAttr:$outer,
                       I64Attr:$factor);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $input $axis `->` $outer `x` $factor attr-dict `:` qualified(type($input)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
}

def VT_RenameOp : VT_Op<"rename", [Pure]> {
  let summary = "renames an axis";
  let description = [{
    ```mlir
    %r = vt.rename %x "m" -> "n" : !vt.tensor<[m:8], f32> -> !vt.tensor<[n:8], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$input, StrAttr:$from, StrAttr:$to);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $input $from `->` $to attr-dict `:` qualified(type($input)) `->` qualified(type($result))
  }];
  let hasVerifier = 1;
  let hasFolder = 1;
}

//===----------------------------------------------------------------------===//
// Const generators
//===----------------------------------------------------------------------===//

def VT_RademacherOp : VT_Op<"rademacher", [Pure]> {
  let summary = "random +1/-1 entries (vt.const regions only)";
  let description = [{
    ```mlir
    %r = vt.rademacher {seed = 7 : i64} : !vt.tensor<[dim:D, m:8], f32>
    ```
  }];
  let arguments = (ins I64Attr:$seed);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = "attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def VT_GaussianOp : VT_Op<"gaussian", [Pure]> {
  let summary = "random standard normal entries (vt.const regions only)";
  let description = [{
    ```mlir
    %g = vt.gaussian {seed = 7 : i64} : !vt.tensor<[dim:D, m:8], f32>
    ```
  }];
  let arguments = (ins I64Attr:$seed);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = "attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def VT_LiteralOp : VT_Op<"literal", [Pure]> {
  let summary = "a literal tensor (vt.const regions only)";
  let description = [{
    Values in row-major order of the type's axes; all sizes static. The
    optional `source` names where the values came from.

    ```mlir
    %l = vt.literal [1.000000e+00, 2.000000e+00] : !vt.tensor<[m:2], f32>
    %w = vt.literal [1.000000e+00] source "w.npy" : !vt.tensor<[m:1], f32>
    ```
  }];
  let arguments = (ins DenseF32ArrayAttr:$values, OptionalAttr<StrAttr>:$source);
  let results = (outs VT_AnyTensor:$result);
  let assemblyFormat = [{
    $values (`source` $source^)? attr-dict `:` qualified(type($result))
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Selections
//===----------------------------------------------------------------------===//

def VT_TopKOp : VT_Op<"topk", [Pure]> {
  let summary = "the k blocks of highest score";
  let description = [{
    `score` has exactly the axes `{block}`; `k` is a host-evaluable scalar.

    ```mlir
    %s = vt.topk %score, %k : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$score, VT_ScalarF32:$k);
  let results = (outs VT_SelectionType:$result);
  let assemblyFormat = "$score `,` $k attr-dict `:` qualified(type($score)) `,` qualified(type($k))";
  let builders = [
    OpBuilder<(ins "::mlir::Value":$score, "::mlir::Value":$k), [{
      build($_builder, $_state, ::vflow::vt::SelectionType::get($_builder.getContext()), score, k);
    }]>
  ];
  let hasVerifier = 1;
}

def VT_ApproxTopKOp : VT_Op<"approx_topk", [Pure]> {
  let summary = "approximately the k blocks of highest score";
  let description = [{
    Like `vt.topk` with a target recall in (0, 1].

    ```mlir
    %s = vt.approx_topk %score, %k {recall = 9.500000e-01 : f64} : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$score, VT_ScalarF32:$k, F64Attr:$recall);
  let results = (outs VT_SelectionType:$result);
  let assemblyFormat = "$score `,` $k attr-dict `:` qualified(type($score)) `,` qualified(type($k))";
  let builders = [
    OpBuilder<(ins "::mlir::Value":$score, "::mlir::Value":$k,
                   "double":$recall), [{
      build($_builder, $_state, ::vflow::vt::SelectionType::get($_builder.getContext()), score, k,
            $_builder.getF64FloatAttr(recall));
    }]>
  ];
  let hasVerifier = 1;
}

def VT_ThresholdOp : VT_Op<"threshold", [Pure]> {
  let summary = "the blocks whose score reaches a threshold";
  let description = [{
    Selects blocks with `score >= threshold` (scalar), at most `max`
    (optional, host-evaluable) of them, highest first.

    ```mlir
    %s = vt.threshold %score, %t : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    %s2 = vt.threshold %score, %t, %max : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$score, VT_ScalarF32:$threshold,
                       Optional<VT_ScalarF32>:$max);
  let results = (outs VT_SelectionType:$result);
  let assemblyFormat = [{
    $score `,` $threshold (`,` $max^)? attr-dict `:` qualified(type($score)) `,` qualified(type($threshold)) (`,` qualified(type($max))^)?
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Value":$score, "::mlir::Value":$threshold,
                   CArg<"::mlir::Value", "{}">:$max), [{
      build($_builder, $_state, ::vflow::vt::SelectionType::get($_builder.getContext()), score, threshold, max);
    }]>
  ];
  let hasVerifier = 1;
}

def VT_TopPOp : VT_Op<"topp", [Pure]> {
  let summary = "the fewest blocks that hold a share of the softmax mass";
  let description = [{
    Ranks the candidate blocks by `score` (highest first) and selects the
    shortest prefix whose share of the softmax mass of the scores over the
    candidates reaches `p` (scalar), at most `max` (optional,
    host-evaluable) blocks. The weights and the cut follow
    `rules::toppWeight` and `rules::toppTarget` (fixed point, so every
    backend sums them exactly).

    ```mlir
    %s = vt.topp %score, %p : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>
    %s2 = vt.topp %score, %p, %max : !vt.tensor<[block:N], f32>, !vt.tensor<[], f32>, !vt.tensor<[], f32>
    ```
  }];
  let arguments = (ins VT_AnyTensor:$score, VT_ScalarF32:$p,
                       Optional<VT_ScalarF32>:$max);
  let results = (outs VT_SelectionType:$result);
  let assemblyFormat = [{
    $score `,` $p (`,` $max^)? attr-dict `:` qualified(type($score)) `,` qualified(type($p)) (`,` qualified(type($max))^)?
  }];
  let builders = [
    OpBuilder<(ins "::mlir::Value":$score, "::mlir::Value":$p,
                   CArg<"::mlir::Value", "{}">:$max), [{
      build($_builder, $_state, ::vflow::vt::SelectionType::get($_builder.getContext()), score, p, max);
    }]>
  ];
  let hasVerifier = 1;
}

def VT_UnionOp : VT_Op<"union", [Pure, Commutative]> {
  let summary = "the union of two selections";
  let description = [{
    ```mlir
    %s = vt.union %a, %b
    ```
  }];
  let arguments = (ins VT_SelectionType:$lhs, VT_SelectionType:$rhs);
  let results = (outs VT_SelectionType:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict";
  let builders = [
    OpBuilder<(ins "::mlir::Value":$lhs, "::mlir::Value":$rhs), [{
      build($_builder, $_state, ::vflow::vt::SelectionType::get($_builder.getContext()), lhs, rhs);
    }]>
  ];
}

#endif // VFLOW_DIALECT_VT_VTOPS_TD
