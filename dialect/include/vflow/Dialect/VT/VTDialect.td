//===- VTDialect.td - vTensor dialect definition -----------*- tablegen -*-===//
//
// The vTensor (`vt`) dialect: named-axis tensors and the ops of a vflow
// sparse-attention program (see docs/design/vt-dialect.md).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_DIALECT_VT_VTDIALECT_TD
#define VFLOW_DIALECT_VT_VTDIALECT_TD

include "mlir/IR/OpBase.td"

def VT_Dialect : Dialect {
  let name = "vt";
  let cppNamespace = "::vflow::vt";
  let summary = "Named-axis tensors for decode-time sparse attention";
  let description = [{
    The vTensor dialect holds one `vt.flow` per vflow program flow. Values are
    tensors whose axes have names (`!vt.tensor<[block:N, dim:D], f32>`);
    elementwise ops broadcast by axis name.
  }];
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
  let hasConstantMaterializer = 1;
  let useFoldAPI = kEmitFoldAdaptorFolder;
  let extraClassDeclaration = [{
    void registerAttributes();
    void registerTypes();
  }];
}

#endif // VFLOW_DIALECT_VT_VTDIALECT_TD
