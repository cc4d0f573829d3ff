# One INTERFACE target with the warning flags our own targets link (never applied to torch).
add_library(tfz_warnings INTERFACE)
target_compile_options(tfz_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter)
