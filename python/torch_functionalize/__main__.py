"""Entry point of `python -m torch_functionalize`: the functionalization demo (see cli/command.py)."""

from .cli import main

raise SystemExit(main())
