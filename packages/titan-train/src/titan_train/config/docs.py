"""Field documentation read from the strings under each dataclass field (see sections.py)."""

import ast
import functools
import inspect
import textwrap


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field name: its docstring} for a dataclass whose fields are followed by string literals."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs
