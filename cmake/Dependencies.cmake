# Test and benchmark dependencies from Debian's packages via find_package (no network at build
# time): GoogleTest (libgtest-dev).
if(TFZ_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(TFZ_BUILD_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
