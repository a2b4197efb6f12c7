//===- VTTypes.td - vTensor types ---------------------------*- tablegen -*-===//

#ifndef VFLOW_DIALECT_VT_VTTYPES_TD
#define VFLOW_DIALECT_VT_VTTYPES_TD

include "vflow/Dialect/VT/VTAttrs.td"
include "mlir/IR/AttrTypeBase.td"

class VT_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<VT_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

def VT_TensorType : VT_Type<"Tensor", "tensor"> {
  let summary = "a tensor with named axes";
  let description = [{
    `!vt.tensor<[axis:size, ...], elem>`. Axis order is the order of the
    values in memory when a backend materializes the tensor; no two axes
    share a name. Sizes are positive integers or `N`, `G`, `D`. The element
    type is `f32`, `bf16`, `f16`, `f8E4M3FN` or `f8E5M2`. Where the values
    live (registers, shared memory, the paged cache) is the backends'
    decision, not part of the type.

    ```mlir
    !vt.tensor<[block:N, head:G, dim:D], f32>
    !vt.tensor<[token:16, m:8], f32>
    !vt.tensor<[], f32>
    ```
  }];
  let parameters = (ins
    ArrayRefParameter<"::vflow::vt::AxisAttr", "named axes">:$axes,
    "::mlir::Type":$elementType
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// A tensor with no axes.
    bool isScalar() const { return getAxes().empty(); }
    /// Number of axes.
    unsigned getRank() const { return getAxes().size(); }
    /// True when an axis of this name exists.
    bool hasAxis(::llvm::StringRef name) const;
    /// The size of the named axis, or std::nullopt when absent.
    std::optional<int64_t> getAxisSize(::llvm::StringRef name) const;
    /// The axis of this name, or a null attribute.
    ::vflow::vt::AxisAttr getAxis(::llvm::StringRef name) const;
    /// The axis names in type order.
    ::llvm::SmallVector<::llvm::StringRef> getAxisNames() const;
    /// True when every axis size is a positive integer.
    bool hasStaticShape() const;
    /// Product of the sizes; only meaningful with a static shape.
    int64_t getNumElements() const;
    /// True when both types have the same axis names with the same sizes,
    /// in any order (element types are not compared).
    bool hasSameAxes(TensorType other) const;
    /// This type with another element type / axis list.
    TensorType withElementType(::mlir::Type elementType) const;
    TensorType withAxes(::llvm::ArrayRef<::vflow::vt::AxisAttr> axes) const;
    /// This type without the named axes (absent names are ignored).
    TensorType withoutAxes(::llvm::ArrayRef<::llvm::StringRef> names) const;
    /// A scalar of the given element type (f32 when null).
    static TensorType getScalar(::mlir::MLIRContext *context,
                                ::mlir::Type elementType = {});
  }];
}

def VT_SelectionType : VT_Type<"Selection", "selection"> {
  let summary = "the blocks chosen by the index stage";
  let description = [{
    `!vt.selection`: a set of blocks of the sequence, the value returned by
    `vt.index_stage`.
  }];
}

def VT_AnyTensor : Type<CPred<"$_self.isa<::vflow::vt::TensorType>()">,
                        "vt tensor", "::vflow::vt::TensorType">;

#endif // VFLOW_DIALECT_VT_VTTYPES_TD
