# TFZ_SANITIZE=address,undefined (any list -fsanitize accepts) builds our own targets, never torch,
# with the sanitizers: the flags travel on the tfz_warnings INTERFACE target that every target links.
# tools/sanitize.sh drives such a build and runs the C++ and Python suites under it
# (docs/reliability.md, "Sanitizers").
set(TFZ_SANITIZE "" CACHE STRING "Comma-separated -fsanitize list for our targets (e.g. address,undefined)")
if(TFZ_SANITIZE)
  # -fno-sanitize-recover: a UBSan finding fails the run instead of scrolling past in the log.
  set(_tfz_san -fsanitize=${TFZ_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  target_compile_options(tfz_warnings INTERFACE ${_tfz_san})
  target_link_options(tfz_warnings INTERFACE ${_tfz_san})
  # libstdc++'s checked operator[] (std::array, std::vector, ...). ASan does not see an index past
  # a std::array member that still lands inside the same object: the unboxed kernels' Call::seen_
  # overflowed into the members after it that way, unreported, until a layout change turned it
  # into a crash. The checks change no ABI, so our targets still mix with torch's.
  target_compile_definitions(tfz_warnings INTERFACE _GLIBCXX_ASSERTIONS)
  message(STATUS "torch-functionalize: sanitizers ${TFZ_SANITIZE} on our targets")
endif()
