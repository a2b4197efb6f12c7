//===- VTAttrs.td - vTensor attributes and enums -----------*- tablegen -*-===//

#ifndef VFLOW_DIALECT_VT_VTATTRS_TD
#define VFLOW_DIALECT_VT_VTATTRS_TD

include "vflow/Dialect/VT/VTDialect.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def VT_InputKindAttr : I32EnumAttr<"InputKind", "a stage input", [
    I32EnumAttrCase<"K", 0>,
    I32EnumAttrCase<"V", 1>,
    I32EnumAttrCase<"q", 2>,
    I32EnumAttrCase<"mass", 3>,
    I32EnumAttrCase<"position", 4>,
    I32EnumAttrCase<"num_blocks", 5>,
    I32EnumAttrCase<"context_len", 6>,
    I32EnumAttrCase<"step", 7>,
    I32EnumAttrCase<"group", 8>,
    I32EnumAttrCase<"layer", 9>,
    I32EnumAttrCase<"kv_head", 10>,
    I32EnumAttrCase<"first_token", 11>
  ]> {
  let cppNamespace = "::vflow::vt";
  // IntegerAttr-based so that ops print the bare keyword.
}

def VT_ReduceKindAttr : I32EnumAttr<"ReduceKind", "a reduction", [
    I32EnumAttrCase<"sum", 0>,
    I32EnumAttrCase<"mean", 1>,
    I32EnumAttrCase<"max", 2>,
    I32EnumAttrCase<"min", 3>,
    I32EnumAttrCase<"l2norm", 4>
  ]> {
  let cppNamespace = "::vflow::vt";
  // IntegerAttr-based so that ops print the bare keyword.
}

def VT_KernelKindAttr : I32EnumAttr<"KernelKind",
    "the kernel template a fused group runs in", [
    I32EnumAttrCase<"cache_map", 0>,
    I32EnumAttrCase<"block_map", 1>,
    I32EnumAttrCase<"cross_block", 2>,
    I32EnumAttrCase<"select", 3>
  ]> {
  let cppNamespace = "::vflow::vt";
}

def VT_LaunchGridAttr : I32EnumAttr<"LaunchGrid",
    "the grid a GPU kernel is launched over", [
    I32EnumAttrCase<"append", 0>,
    I32EnumAttrCase<"fields", 1>,
    I32EnumAttrCase<"tile", 2>,
    I32EnumAttrCase<"row", 3>,
    I32EnumAttrCase<"commit", 4>
  ]> {
  let cppNamespace = "::vflow::vt";
  // The same cases, in the same order, as the runtime's rt::GpuGrid
  // (GpuFlowInfo.h), which the CUDA emitter converts this to.
  let genSpecializedAttr = 0;
}

def VT_CmpPredicateAttr : I32EnumAttr<"CmpPredicate", "a comparison", [
    I32EnumAttrCase<"lt", 0>,
    I32EnumAttrCase<"le", 1>,
    I32EnumAttrCase<"gt", 2>,
    I32EnumAttrCase<"ge", 3>,
    I32EnumAttrCase<"eq", 4>,
    I32EnumAttrCase<"ne", 5>
  ]> {
  let cppNamespace = "::vflow::vt";
  // IntegerAttr-based so that ops print the bare keyword.
}

//===----------------------------------------------------------------------===//
// AxisAttr
//===----------------------------------------------------------------------===//

def VT_AxisAttr : AttrDef<VT_Dialect, "Axis"> {
  let mnemonic = "axis";
  let summary = "a named tensor axis and its size";
  let description = [{
    One axis of a `!vt.tensor`: a name and a size. The size is a positive
    integer or one of the symbols `N` (blocks, -1), `G` (query heads per KV
    head, -2) and `D` (head dimension, -3).

    ```mlir
    #vt.axis<"dim", D>
    #vt.axis<"m", 8>
    ```
  }];
  let parameters = (ins StringRefParameter<"axis name">:$name,
                        "int64_t":$size);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// True when the size is a positive integer (not N, G or D).
    bool isStatic() const { return getSize() > 0; }
  }];
}

//===----------------------------------------------------------------------===//
// LaunchAttr
//===----------------------------------------------------------------------===//

def VT_LaunchAttr : AttrDef<VT_Dialect, "Launch"> {
  let mnemonic = "launch";
  let summary = "how a vt.kernel is launched on the GPU";
  let description = [{
    The launch plan of one `vt.kernel`, decided by `--vt-plan-launches` and
    read by the CUDA backend: the grid (`fields`: one CTA per (page, KV
    head), the cache stage; `tile`: one per (tile of blocks, sequence, KV
    head); `row`: one per (sequence, KV head)), the threads per CTA (a
    multiple of 32 in 32..1024) and, for `tile` only, the most blocks of a
    tile (at least 1; the runtime may cut it to fit shared memory). `append`
    and `commit` are the grids of the runtime's own kernels (the new token's
    K/V, the stored states), never of a `vt.kernel`.

    ```mlir
    #vt.launch<tile, threads = 256, tile_blocks = 64>
    #vt.launch<row, threads = 512>
    ```
  }];
  let parameters = (ins EnumParameter<VT_LaunchGridAttr>:$grid,
                        "int64_t":$threads,
                        DefaultValuedParameter<"int64_t", "0">:$tileBlocks);
  let assemblyFormat = [{
    `<` $grid `,` `threads` `=` $threads
        (`,` `tile_blocks` `=` $tileBlocks^)? `>`
  }];
  let genVerifyDecl = 1;
}

#endif // VFLOW_DIALECT_VT_VTATTRS_TD
