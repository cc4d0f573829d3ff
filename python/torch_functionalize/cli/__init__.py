"""The `python -m torch_functionalize` command line (a demo of the transform on small programs).
Library code lives outside this package; nothing here is imported by `import torch_functionalize`.
"""

from .command import main

__all__ = ["main"]
