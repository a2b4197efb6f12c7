# The installed torch, for the torch ops (python/csrc): its headers,
# libraries, C++ ABI and version, asked of a Python that imports it (as
# torch.utils.cpp_extension does), as the INTERFACE target vflow_torch.
#
#   VFLOW_TORCH_OPS     AUTO (default): build the ops when VFLOW_TORCH_PYTHON
#                       imports torch built with CUDA; ON: the same, an error
#                       when it does not; OFF: never.
#   VFLOW_TORCH_PYTHON  the Python whose torch the ops build against
#                       (default: the build's Python; pip's isolated build
#                       environment has no torch: pass
#                       --no-build-isolation, or point this at the Python
#                       that will import vflow).
#
# Sets VFLOW_TORCH_FOUND and VFLOW_TORCH_VERSION.
set(VFLOW_TORCH_OPS "AUTO" CACHE STRING
  "Build the torch ops: AUTO, ON or OFF")
set_property(CACHE VFLOW_TORCH_OPS PROPERTY STRINGS AUTO ON OFF)
set(VFLOW_TORCH_PYTHON "" CACHE FILEPATH
  "The Python whose torch the torch ops build against")
set(VFLOW_TORCH_FOUND OFF)

if(NOT VFLOW_TORCH_OPS MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR
    "VFLOW_TORCH_OPS=${VFLOW_TORCH_OPS}: expected AUTO, ON or OFF")
endif()

function(_vflow_torch_missing why)
  if(VFLOW_TORCH_OPS STREQUAL "ON")
    message(FATAL_ERROR "VFLOW_TORCH_OPS=ON, but ${why}")
  endif()
  message(STATUS "vflow torch ops: not built (${why})")
endfunction()

if(VFLOW_TORCH_OPS STREQUAL "OFF")
  return()
endif()
if(NOT VFLOW_ENABLE_CUDA)
  _vflow_torch_missing("the GPU runtime is off (VFLOW_ENABLE_CUDA)")
  return()
endif()
set(_vflow_torch_python "${VFLOW_TORCH_PYTHON}")
if(NOT _vflow_torch_python)
  set(_vflow_torch_python "${Python_EXECUTABLE}")
endif()
if(NOT _vflow_torch_python)
  _vflow_torch_missing("no Python to ask for torch (VFLOW_TORCH_PYTHON)")
  return()
endif()

# One line per fact; the script prints nothing else on success.
set(_vflow_torch_query [=[
import os, sys
try:
    import torch
    from torch.utils import cpp_extension
except Exception as e:
    print("no torch: %s" % e, file=sys.stderr)
    sys.exit(1)
if not torch.version.cuda:
    print("torch %s was built without CUDA" % torch.__version__, file=sys.stderr)
    sys.exit(1)
print(torch.__version__)
print(torch.version.cuda)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("|".join(cpp_extension.include_paths()))
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
]=])
execute_process(
  COMMAND "${_vflow_torch_python}" -c "${_vflow_torch_query}"
  OUTPUT_VARIABLE _vflow_torch_out
  ERROR_VARIABLE _vflow_torch_err
  RESULT_VARIABLE _vflow_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
if(NOT _vflow_torch_rc EQUAL 0)
  string(REGEX REPLACE "\n.*" "" _vflow_torch_err "${_vflow_torch_err}")
  _vflow_torch_missing("${_vflow_torch_python}: ${_vflow_torch_err}")
  return()
endif()
string(REPLACE "\n" ";" _vflow_torch_lines "${_vflow_torch_out}")
list(LENGTH _vflow_torch_lines _vflow_torch_count)
if(NOT _vflow_torch_count EQUAL 5)
  _vflow_torch_missing("${_vflow_torch_python} answered '${_vflow_torch_out}'")
  return()
endif()
list(GET _vflow_torch_lines 0 VFLOW_TORCH_VERSION)
list(GET _vflow_torch_lines 1 _vflow_torch_cuda)
list(GET _vflow_torch_lines 2 _vflow_torch_abi)
list(GET _vflow_torch_lines 3 _vflow_torch_includes)
list(GET _vflow_torch_lines 4 _vflow_torch_libdir)
string(REPLACE "|" ";" _vflow_torch_includes "${_vflow_torch_includes}")

# torch's CUDA major must be the toolkit's: the ops share torch's CUDA
# runtime and streams.
string(REGEX MATCH "^[0-9]+" _vflow_torch_cuda_major "${_vflow_torch_cuda}")
if(NOT _vflow_torch_cuda_major STREQUAL CUDAToolkit_VERSION_MAJOR)
  _vflow_torch_missing("torch ${VFLOW_TORCH_VERSION} uses CUDA "
    "${_vflow_torch_cuda}, this build's toolkit is ${CUDAToolkit_VERSION}")
  return()
endif()

# The runtime's kernels (linked in) are built with the C++11 ABI.
if(NOT _vflow_torch_abi STREQUAL "1")
  _vflow_torch_missing("torch ${VFLOW_TORCH_VERSION} uses the pre-C++11 "
    "std::string ABI; vflow builds with the C++11 one")
  return()
endif()

set(_vflow_torch_libs "")
foreach(lib c10 c10_cuda torch torch_cpu torch_cuda)
  find_library(_vflow_torch_lib_${lib} NAMES ${lib}
    PATHS "${_vflow_torch_libdir}" NO_DEFAULT_PATH)
  if(NOT _vflow_torch_lib_${lib})
    _vflow_torch_missing("no lib${lib} in ${_vflow_torch_libdir}")
    return()
  endif()
  list(APPEND _vflow_torch_libs "${_vflow_torch_lib_${lib}}")
endforeach()

add_library(vflow_torch INTERFACE)
target_include_directories(vflow_torch SYSTEM INTERFACE
  ${_vflow_torch_includes})
target_link_libraries(vflow_torch INTERFACE ${_vflow_torch_libs}
  CUDA::cudart)
set(VFLOW_TORCH_FOUND ON)
message(STATUS "vflow torch ops: against torch ${VFLOW_TORCH_VERSION} "
  "(CUDA ${_vflow_torch_cuda}) of ${_vflow_torch_python}")
