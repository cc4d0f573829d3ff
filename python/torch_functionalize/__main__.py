"""Entry point of `python -m torch_functionalize`: the functionalization demo (see _demo.py)."""

from ._demo import main

raise SystemExit(main())
