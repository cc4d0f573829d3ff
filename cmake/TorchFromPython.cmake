# Finds LibTorch and defines tfz::torch, an INTERFACE target with exactly what our code uses:
# the headers and the torch, torch_cpu and c10 libraries (TORCH_PYTHON_LIBRARY is set too, for the
# Python module). Where LibTorch comes from, first match wins:
#   1. Torch_DIR (.../share/cmake/Torch) or a CMAKE_PREFIX_PATH entry holding share/cmake/Torch
#      (a LibTorch download; no Python needed);
#   2. the torch package of the active Python (torch.utils.cmake_prefix_path).
# See Note [Build: link only what we use]. Installed with the CMake package, so consumers of
# tfz::core find their LibTorch the same way (torch_functionalizeConfig.cmake includes it).

# Note [Build: link only what we use]
# find_package(Torch) (TorchConfig.cmake, Caffe2Config.cmake) on a CUDA build of torch requires
# the CUDA toolkit (it fails with "Your installed Caffe2 version uses CUDA but I cannot find the
# CUDA libraries", then on CUDA_nvrtc_LIBRARY-NOTFOUND) and puts the CUDA libraries, nvrtc and
# their transitive dependencies into ${TORCH_LIBRARIES}. Our code uses none of them: it is
# device-generic and reaches CUDA kernels through the dispatcher, which libtorch_cpu's loaded
# CUDA backend registers at `import torch` / LibTorch start-up. So we never run torch's config: we
# locate the libraries ourselves and link torch, torch_cpu and c10 only (and torch_python for the
# module). Which libstdc++ they share: Note [Build: one libstdc++ in the process].
# What torch's config would give us besides, _GLIBCXX_USE_CXX11_ABI and the C++ standard, is read
# from TorchConfig.cmake.
# Rejected: find_package(Torch) with CUDA variables faked (brittle, and still links CUDA), or
# requiring the toolkit (most users have none: a CUDA wheel on a CPU-only machine is the common
# case).

function(_tfz_torch_root_from_dir dir out)
  # .../share/cmake/Torch -> the LibTorch root
  get_filename_component(root "${dir}/../../.." ABSOLUTE)
  set(${out} "${root}" PARENT_SCOPE)
endfunction()

if(NOT TARGET tfz::torch)
  set(_tfz_root "")
  if(Torch_DIR AND EXISTS "${Torch_DIR}/TorchConfig.cmake")
    _tfz_torch_root_from_dir("${Torch_DIR}" _tfz_root)
  elseif(DEFINED ENV{Torch_DIR} AND EXISTS "$ENV{Torch_DIR}/TorchConfig.cmake")
    _tfz_torch_root_from_dir("$ENV{Torch_DIR}" _tfz_root)
  else()
    foreach(prefix IN LISTS CMAKE_PREFIX_PATH)
      if(EXISTS "${prefix}/share/cmake/Torch/TorchConfig.cmake")
        set(_tfz_root "${prefix}")
        break()
      endif()
    endforeach()
  endif()
  if(NOT _tfz_root)
    if(NOT Python3_EXECUTABLE)
      find_package(Python3 REQUIRED COMPONENTS Interpreter)
    endif()
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import torch, os; print(os.path.dirname(torch.__file__))"
      OUTPUT_VARIABLE _tfz_root OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _tfz_rc)
    if(NOT _tfz_rc EQUAL 0)
      message(FATAL_ERROR
        "torch-functionalize: no LibTorch found. Pass -DTorch_DIR=<libtorch>/share/cmake/Torch, "
        "or install torch for ${Python3_EXECUTABLE} (pip install torch==2.13.0).")
    endif()
  endif()

  set(_tfz_libs "")
  foreach(lib torch torch_cpu c10)
    find_library(TFZ_${lib}_LIBRARY ${lib} PATHS "${_tfz_root}/lib" NO_DEFAULT_PATH)
    if(NOT TFZ_${lib}_LIBRARY)
      message(FATAL_ERROR "torch-functionalize: lib${lib} not found in ${_tfz_root}/lib")
    endif()
    list(APPEND _tfz_libs "${TFZ_${lib}_LIBRARY}")
  endforeach()
  find_library(TORCH_PYTHON_LIBRARY torch_python PATHS "${_tfz_root}/lib" NO_DEFAULT_PATH)

  set(_tfz_abi 1)
  if(EXISTS "${_tfz_root}/share/cmake/Torch/TorchConfig.cmake")
    file(STRINGS "${_tfz_root}/share/cmake/Torch/TorchConfig.cmake" _tfz_abi_line
         REGEX "_GLIBCXX_USE_CXX11_ABI=[01]")
    if(_tfz_abi_line MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
      set(_tfz_abi ${CMAKE_MATCH_1})
    endif()
  endif()
  # The C++ standard torch's headers need, as TorchConfig.cmake gives it to its consumers, so we
  # compile with it too. TorchConfig has said it two ways: up to 2.14 a `CXX_STANDARD <n>` target
  # property (17 in 2.11, 20 since 2.13; 2.14's headers use C++20 library features), since 2.15
  # `target_compile_features(torch INTERFACE cxx_std_<n>)` (2.15's headers need std::
  # strong_ordering). Both spellings are read (a feature check on the file, not on the version);
  # the highest standard named wins, and 17 when the file names none.
  set(_tfz_std 17)
  if(EXISTS "${_tfz_root}/share/cmake/Torch/TorchConfig.cmake")
    file(STRINGS "${_tfz_root}/share/cmake/Torch/TorchConfig.cmake" _tfz_std_lines
         REGEX "CXX_STANDARD [0-9]+|cxx_std_[0-9]+")
    foreach(_tfz_line IN LISTS _tfz_std_lines)
      if(_tfz_line MATCHES "(CXX_STANDARD |cxx_std_)([0-9]+)" AND CMAKE_MATCH_2 GREATER _tfz_std)
        set(_tfz_std ${CMAKE_MATCH_2})
      endif()
    endforeach()
  endif()
  set(_tfz_version "")
  if(EXISTS "${_tfz_root}/version.py")  # the Python package
    file(STRINGS "${_tfz_root}/version.py" _tfz_version_line REGEX "^__version__")
    string(REGEX REPLACE "^__version__ *= *['\"]([^'\"]*)['\"].*" "\\1" _tfz_version
           "${_tfz_version_line}")
  elseif(EXISTS "${_tfz_root}/build-version")  # a LibTorch download
    file(READ "${_tfz_root}/build-version" _tfz_version)
    string(STRIP "${_tfz_version}" _tfz_version)
  endif()
  set(TFZ_TORCH_VERSION "${_tfz_version}" CACHE INTERNAL "torch version built against")
  set(TFZ_TORCH_ROOT "${_tfz_root}" CACHE INTERNAL "LibTorch root")

  add_library(tfz::torch INTERFACE IMPORTED GLOBAL)
  set_target_properties(tfz::torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES
      "${_tfz_root}/include;${_tfz_root}/include/torch/csrc/api/include"
    INTERFACE_LINK_LIBRARIES "${_tfz_libs}"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${_tfz_abi}"
    INTERFACE_COMPILE_FEATURES "cxx_std_${_tfz_std}")
  message(STATUS "torch-functionalize: LibTorch ${_tfz_version} at ${_tfz_root} "
                 "(linking torch, torch_cpu, c10; C++${_tfz_std}; _GLIBCXX_USE_CXX11_ABI=${_tfz_abi})")
endif()
