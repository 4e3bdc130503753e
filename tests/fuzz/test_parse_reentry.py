"""The root conftest's guard: an `ast.parse` entered again by a finalizer during a parse (how
CPython 3.11 raised "AST constructor recursion depth mismatch" under hypothesis) parses cleanly."""

from __future__ import annotations

import ast
import gc


class _ParsesWhenCollected:
    """Cyclic garbage whose finalizer parses, as one that formats a traceback does."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        ast.parse("a.b(c)[d] + e")


def test_a_parse_entered_again_by_a_finalizer_still_parses() -> None:
    source = "\n".join(f"x{i} = [{', '.join(str(j) for j in range(50))}]" for i in range(400))
    gc.collect()
    for _ in range(20):
        for _ in range(200):
            _ParsesWhenCollected()
        tree = ast.parse(source)
        assert len(tree.body) == 400
    gc.collect()
