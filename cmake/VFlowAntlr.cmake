# ANTLR4: the Java tool generates the C++ parser at build time; the C++
# runtime is linked from its static archive.
find_program(ANTLR4_TOOL antlr4 REQUIRED)
find_path(ANTLR4_INCLUDE_DIR antlr4-runtime.h
  PATH_SUFFIXES antlr4-runtime REQUIRED)
find_library(ANTLR4_STATIC_LIB NAMES libantlr4-runtime.a REQUIRED)

add_library(antlr4_static STATIC IMPORTED)
set_target_properties(antlr4_static PROPERTIES
  IMPORTED_LOCATION "${ANTLR4_STATIC_LIB}"
  INTERFACE_INCLUDE_DIRECTORIES "${ANTLR4_INCLUDE_DIR}")
# Debian's static ANTLR runtime uses the local-exec TLS model, which a shared
# object (the Python extension) cannot hold: that build links the shared
# runtime instead and ships it next to the extension (python/CMakeLists.txt).
if(VFLOW_BUILD_PYTHON)
  find_library(ANTLR4_SHARED_LIB NAMES libantlr4-runtime.so REQUIRED)
  set_target_properties(antlr4_static PROPERTIES
    IMPORTED_LOCATION "${ANTLR4_SHARED_LIB}")
endif()

# vflow_antlr_generate(<grammar.g4> <outdir> <out-var>): runs the tool and
# returns the generated .cpp files in <out-var>.
function(vflow_antlr_generate grammar outdir outvar)
  get_filename_component(_name "${grammar}" NAME_WE)
  set(_sources
    "${outdir}/${_name}Lexer.cpp" "${outdir}/${_name}Parser.cpp"
    "${outdir}/${_name}BaseVisitor.cpp" "${outdir}/${_name}Visitor.cpp")
  set(_headers
    "${outdir}/${_name}Lexer.h" "${outdir}/${_name}Parser.h"
    "${outdir}/${_name}BaseVisitor.h" "${outdir}/${_name}Visitor.h")
  add_custom_command(
    OUTPUT ${_sources} ${_headers}
    COMMAND ${CMAKE_COMMAND} -E make_directory "${outdir}"
    COMMAND "${ANTLR4_TOOL}" -Dlanguage=Cpp -visitor -no-listener
            -package vflow::grammar -o "${outdir}" -Xexact-output-dir
            "${grammar}"
    DEPENDS "${grammar}"
    COMMENT "Generating the ${_name} parser with ANTLR4"
    VERBATIM)
  set(${outvar} ${_sources} PARENT_SCOPE)
endfunction()
