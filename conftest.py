"""Process-wide test set-up, loaded before every test directory's own conftest.

CPython 3.11 keeps the AST constructor's recursion counter in module state, so an `ast.parse` that
starts inside another one (a finalizer run by the garbage collector mid-parse, e.g. one that formats
a traceback, which parses source lines for its carets) leaves the outer parse with
"SystemError: AST constructor recursion depth mismatch". Hypothesis parses lambdas' source while it
draws, so a schemathesis run failed this way after earlier tests had left cyclic garbage behind.
3.12 keeps the counter per call. Here each parse runs with the collector paused and one at a time.
"""

from __future__ import annotations

import ast
import gc
import sys
import threading


def _guard_ast_parse() -> None:
    parse = ast.parse
    one_at_a_time = threading.RLock()

    def guarded_parse(*args, **kwargs):  # type: ignore[no-untyped-def]
        with one_at_a_time:
            collecting = gc.isenabled()
            gc.disable()
            try:
                return parse(*args, **kwargs)
            finally:
                if collecting:
                    gc.enable()

    ast.parse = guarded_parse  # type: ignore[assignment]


if sys.version_info < (3, 12):
    _guard_ast_parse()
