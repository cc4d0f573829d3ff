# tfz_use_shared_libstdcxx(target): links `target` against the shared libstdc++ (libstdc++.so.6),
# the copy that torch's own libraries use, even where the compiler's default is to link libstdc++
# statically. Used for every shared library we build (libtfz_core, the Python module _C).
# See Note [Build: one libstdc++ in the process].

# Note [Build: one libstdc++ in the process]
# A process that imports torch has one libstdc++: the shared libstdc++.so.6 that libtorch_cpu and
# libc10 need. A shared library of ours must use that same copy. A compiler that links libstdc++
# statically by default (a gcc installed under /opt/gcc on some GPU images) gives a
# libtfz_core.so with no NEEDED libstdc++.so.6 entry that exports thousands of std:: symbols
# (logic_error, locale and codecvt members, ...) of its own libstdc++ copy, although it links only
# torch, torch_cpu and c10. Loaded beside torch, the two copies each keep their own locale and
# facet state, and the exported copy interposes some of the shared one's symbols for the whole
# process: the first `functionalize` call then dies in normalized_signature
# (core/OpSchemaInfo.cpp), where an ostringstream prints an IValue, with libstdc++'s
# ostream::_M_insert<long> reaching a codecvt function. So we name the shared libstdc++ on the
# link line ourselves: the linker resolves every libstdc++ reference there, and a static
# libstdc++ the driver appends afterwards contributes nothing. The file is the compiler's own
# libstdc++.so.6 where it has one, else the system's (the one torch's wheels load). test_build.py
# checks the result (NEEDED entry, no libstdc++ symbol defined by us).
# Rejected: -Wl,--exclude-libs (hides the copy's symbols but keeps two libstdc++ states in one
# process, and the IValue printing crosses between them), and asking users to pick another
# compiler (nothing tells them why the first call crashes).

if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
                  OUTPUT_VARIABLE _tfz_libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT IS_ABSOLUTE "${_tfz_libstdcxx}" OR NOT EXISTS "${_tfz_libstdcxx}")
    find_library(_tfz_libstdcxx_system NAMES libstdc++.so.6
                 PATHS /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib
                 NO_DEFAULT_PATH)
    set(_tfz_libstdcxx "${_tfz_libstdcxx_system}")
  endif()
  if(_tfz_libstdcxx)
    set(TFZ_LIBSTDCXX "${_tfz_libstdcxx}" CACHE FILEPATH "the shared libstdc++ our libraries link")
    message(STATUS "torch-functionalize: shared libstdc++: ${TFZ_LIBSTDCXX}")
  else()
    message(WARNING "torch-functionalize: no libstdc++.so.6 found; if ${CMAKE_CXX_COMPILER} links "
                    "libstdc++ statically, importing the extension next to torch will crash. "
                    "Pass -DTFZ_LIBSTDCXX=/path/to/libstdc++.so.6 (see cmake/SharedLibstdcxx.cmake).")
  endif()
endif()

function(tfz_use_shared_libstdcxx target)
  if(TFZ_LIBSTDCXX)
    target_link_libraries(${target} PRIVATE "${TFZ_LIBSTDCXX}")
  endif()
endfunction()
