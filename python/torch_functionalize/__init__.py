"""torch-functionalize: remove mutations (and optionally views) from PyTorch programs.

Public surface: ``functionalize`` (the contract of ``torch.func.functionalize``), ``capture``
(the functional program of f as an FX GraphModule, recorded in C++), ``functionalize_graph`` (FX GraphModule in, functional GraphModule out), ``reinplace`` (a functional graph
rewritten to write in place where nothing can tell), and the helpers
``to_functional``, ``from_functional``, ``is_functional``, ``sync`` and ``enable``; ``backend``,
the torch.compile backend (also registered by name: ``torch.compile(m, backend="tfz")``).
"""
import torch  # noqa: F401  (loads libtorch before our extension)

from ._compat import check_torch_version as _check_torch_version

_BUILT_WITH: "str | None"
try:
    from ._build_info import TORCH_VERSION as _BUILT_WITH
except ImportError:  # a build tree without the record (e.g. CMake alone): nothing to compare
    _BUILT_WITH = None
if _BUILT_WITH is not None:
    _check_torch_version(_BUILT_WITH, torch.__version__)

from . import _C  # noqa: E402, F401

# The guard ops graphs hold return nothing and have no users: without this, FX's dead-code
# elimination (torch.compile's passes, gm.graph.eliminate_dead_code()) drops them, and the graph
# then runs silently on inputs it does not hold for. See
# Note [Capture: guards on values read] and
# Note [Inputs: storage coordinates under a tracer].
for _name in torch._C._dispatch_get_all_op_names():
    if _name.startswith("tfz::_guard_"):
        torch.fx.node.has_side_effect(getattr(torch.ops.tfz, _name[len("tfz::"):]).default)
from . import _tensor_methods  # noqa: E402

_tensor_methods.install()
from . import control_flow as _control_flow  # noqa: E402

_control_flow.install()
from . import autograd_function as _autograd_function  # noqa: E402

_autograd_function.install()
from . import rng_state as _rng_state  # noqa: E402
from . import generator_watch as _generator_watch  # noqa: E402

_rng_state.install()
_generator_watch.install()
from . import lazy_modules as _lazy_modules  # noqa: E402

_lazy_modules.install()
from . import saved_tensor_hooks as _saved_tensor_hooks  # noqa: E402

_saved_tensor_hooks.install()
from .api import enable, from_functional, functionalize, is_functional, sync, to_functional
from .capture import capture, example_inputs, graph_module_of, load_graph
from .dynamo import backend
from .export import export
from .graph import functionalize_graph
from .reinplace import reinplace

__version__ = "0.1.0"
__all__ = [
    "functionalize",
    "capture",
    "graph_module_of",
    "load_graph",
    "example_inputs",
    "functionalize_graph",
    "export",
    "reinplace",
    "to_functional",
    "from_functional",
    "is_functional",
    "sync",
    "enable",
    "backend",
]
