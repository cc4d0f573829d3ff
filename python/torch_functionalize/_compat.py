"""Import-time check that the installed torch is the one the extension was built against.

See Note [Build: torch version skew].
"""

# Note [Build: torch version skew]
# The extension links libtorch's C++ symbols, which change between torch releases: importing it
# under another torch fails with an undefined-symbol ImportError at best and crashes at worst.
# setup.py records the torch version it built against (_build_info.py) and the package checks it
# before loading _C, raising an ImportError that names both versions and the rebuild command.
# Only the release (2.13.0) is compared, not the local build tag (+cpu, +cu130): the CPU and CUDA
# builds of one release export the same libtorch_cpu/c10 symbols, which are all we link
# (Note [Build: link only what we use]).
# Rejected: a version check inside _C (it would never run: the loader fails first).

REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps torch-functionalize"


def _release(version: str) -> str:
    return version.split("+")[0]


def check_torch_version(built: str, running: str) -> None:
    """Raises ImportError if `running` is another torch release than `built`."""
    if _release(built) != _release(running):
        raise ImportError(
            f"torch_functionalize was built against torch {built}, but torch {running} is "
            f"installed. Rebuild it for this torch: {REBUILD} (from a source checkout: "
            f"pip install --no-build-isolation -e .)."
        )
