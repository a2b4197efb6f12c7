# Finds LLVM/MLIR 16 and links them from LLVM's static archives.
#
# Debian's exported MLIR targets link the LLVM shared library (the imported
# target `LLVM`). vflowc must be self-contained so that it can be carried to a
# machine without LLVM, so that target is pointed at the static Support and
# Demangle archives instead (the only LLVM libraries MLIR's core needs).

find_package(MLIR 16 REQUIRED CONFIG
  HINTS /usr/lib/llvm-16/lib/cmake/mlir)
message(STATUS "Using MLIR ${LLVM_PACKAGE_VERSION} from ${MLIR_DIR}")

list(APPEND CMAKE_MODULE_PATH "${MLIR_CMAKE_DIR}" "${LLVM_CMAKE_DIR}")
include(TableGen)
include(AddLLVM)
include(AddMLIR)

set(VFLOW_LLVM_STATIC_LIBS
  "${LLVM_LIBRARY_DIR}/libLLVMDemangle.a"
  pthread dl rt m)
find_library(VFLOW_TINFO NAMES tinfo ncurses)
if(VFLOW_TINFO)
  list(APPEND VFLOW_LLVM_STATIC_LIBS "${VFLOW_TINFO}")
endif()

get_target_property(_vflow_llvm_configs LLVM IMPORTED_CONFIGURATIONS)
foreach(_cfg ${_vflow_llvm_configs})
  set_target_properties(LLVM PROPERTIES
    IMPORTED_LOCATION_${_cfg} "${LLVM_LIBRARY_DIR}/libLLVMSupport.a"
    IMPORTED_SONAME_${_cfg} "")
endforeach()
set_target_properties(LLVM PROPERTIES
  IMPORTED_NO_SONAME TRUE
  INTERFACE_LINK_LIBRARIES "${VFLOW_LLVM_STATIC_LIBS}")

include_directories(SYSTEM ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
add_definitions(${LLVM_DEFINITIONS})

# Binaries carried to the GPU machine must not need this machine's libstdc++.
set(VFLOW_PORTABLE_LINK_FLAGS -static-libstdc++ -static-libgcc -Wl,--as-needed)

set(VFLOW_LIT "/usr/lib/llvm-16/build/utils/lit/lit.py")
set(VFLOW_LLVM_TOOLS_DIR "/usr/lib/llvm-16/bin")

# MLIRConfig names mlir-tblgen without a path; Debian keeps it in the LLVM
# bin directory, which is not on PATH.
if(NOT IS_ABSOLUTE "${MLIR_TABLEGEN_EXE}")
  find_program(VFLOW_MLIR_TBLGEN mlir-tblgen
    HINTS "${LLVM_TOOLS_BINARY_DIR}" /usr/lib/llvm-16/bin REQUIRED)
  set(MLIR_TABLEGEN_EXE "${VFLOW_MLIR_TBLGEN}")
endif()
