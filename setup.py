"""Build driver for torch-functionalize: configures and builds the CMake project (LibTorch from the
installed torch) and places _C and libtfz_core next to the Python package. No source lists here.

Environment: DEBUG=1 builds with debug info and no optimisation; TFZ_BUILD_TESTS=1 also builds the
GoogleTest executables in the same CMake tree (build/python).
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch  # the build runs against the installed torch (--no-build-isolation)

        ext_dir = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build_dir = os.path.join(ROOT, "build", "python")
        debug = os.environ.get("DEBUG", "0") == "1"
        tests = os.environ.get("TFZ_BUILD_TESTS", "0") == "1"
        lib_dir = os.path.join(build_dir, "lib")
        args = [
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={lib_dir}",
            f"-DCMAKE_BUILD_TYPE={'Debug' if debug else 'RelWithDebInfo'}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DTFZ_BUILD_TESTS={'ON' if tests else 'OFF'}",
            "-DTFZ_BUILD_PYTHON=ON",
        ]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        if shutil.which("ccache"):
            args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
        print(f"torch-functionalize: torch {torch.__version__}, debug={debug}, tests={tests}, "
              f"build dir {build_dir}, output {ext_dir}")
        os.makedirs(build_dir, exist_ok=True)
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir] + args)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs])
        # The libraries stay in the build tree (the GoogleTest executables link them there) and
        # are copied next to the package: _C finds libtfz_core through its $ORIGIN rpath.
        built = lib_dir
        module = next(f for f in os.listdir(built) if f.startswith("_C.") and f.endswith(".so"))
        targets = [ext_dir]
        if getattr(self, "editable_mode", False) or self.inplace:
            targets.append(os.path.join(ROOT, "python", "torch_functionalize"))
        for target in targets:
            os.makedirs(target, exist_ok=True)
            shutil.copy2(os.path.join(built, "libtfz_core.so"), target)
        shutil.copy2(os.path.join(built, module), self.get_ext_fullpath(ext.name))

setup(
    name="torch-functionalize",
    version="0.1.0",
    description="Functionalization for PyTorch programs as an out-of-tree extension",
    package_dir={"": "python"},
    packages=find_packages("python"),
    package_data={"torch_functionalize": ["*.pyi", "py.typed"]},
    ext_modules=[CMakeExtension("torch_functionalize._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    install_requires=["torch"],
    # torch.compile(model, backend="tfz"): dynamo looks names up in this group.
    entry_points={"torch_dynamo_backends": ["tfz = torch_functionalize.dynamo:backend"]},
)
