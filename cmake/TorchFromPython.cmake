# Finds LibTorch from the active Python's torch install (the torch==2.13.0 wheel), and the Python
# development files when the extension module is built. Sets TORCH_PYTHON_LIBRARY.
if(TFZ_BUILD_PYTHON)
  find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)
else()
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
endif()

execute_process(
  COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE TFZ_TORCH_CMAKE_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE TFZ_TORCH_FOUND)
if(NOT TFZ_TORCH_FOUND EQUAL 0)
  message(FATAL_ERROR "torch is not importable from ${Python3_EXECUTABLE}; run: pip install torch==2.13.0")
endif()
list(APPEND CMAKE_PREFIX_PATH ${TFZ_TORCH_CMAKE_PREFIX})
find_package(Torch REQUIRED)

# The pybind11 that torch bundles (include/pybind11): torch's Tensor type casters are compiled
# against it, and mixing two pybind11 versions in one process breaks their shared internals.
find_library(TORCH_PYTHON_LIBRARY torch_python PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
message(STATUS "torch-functionalize: Torch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}")
