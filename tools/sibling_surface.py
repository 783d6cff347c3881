"""What titan-train uses of its siblings, checked against the siblings installed: `nox -s lower_bound`'s first check.

    python tools/sibling_surface.py check packages/titan-train/src        # exit 1 naming each use the install lacks
    python tools/sibling_surface.py fingerprint packages/titan-train/src  # one line per use: its signature there

Read from titan-train's sources (never run): every name imported from a sibling (`from titan_parallel.ep import
X`, `import titan_models.plan as plan` then `plan.X`) and the keyword arguments each call site passes to it. `check`
imports each name from the siblings this Python finds and fails where a module or a name is missing or a call passes
a keyword the callable does not take: titan-train using an API its lowest allowed sibling lacks fails here, whether
or not a test reaches that call. `fingerprint` prints each used name's signature as found: lower_bound compares the
lowest siblings' with the tree's to decide whether the interface titan-train uses changed between them (then it runs
titan-train's whole suite against them, RELEASING.md). Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SIBLINGS = ("titan_models", "titan_parallel", "titan_float8", "titan_checkpoint", "titan_debug")


@dataclass
class Use:
    module: str
    name: str  # "" for the module itself
    where: list[str] = field(default_factory=list)  # file:line of each import or call
    keywords: dict[str, str] = field(default_factory=dict)  # keyword -> the first file:line passing it

    @property
    def label(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module


def _is_sibling(module: str) -> bool:
    return module.split(".")[0] in SIBLINGS


def _uses_in(path: Path, uses: dict[tuple[str, str], Use]) -> None:
    tree = ast.parse(path.read_text(), str(path))
    names: dict[str, tuple[str, str]] = {}  # local name -> (module, name) of a `from ... import`
    modules: dict[str, str] = {}  # local name -> module of an `import ... as`

    def use(module: str, name: str, line: int) -> Use:
        found = uses.setdefault((module, name), Use(module, name))
        found.where.append(f"{path}:{line}")
        return found

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _is_sibling(node.module):
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, alias.name)
                use(node.module, alias.name, node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_sibling(alias.name):
                    modules[alias.asname or alias.name.split(".")[0]] = alias.name
                    use(alias.name, "", node.lineno)
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            module = modules[node.value.id]
            if node.value.id == module.split(".")[0] and "." in module:  # `import a.b` binds a: a.b.X is not checked
                continue
            target = use(module, node.attr, node.lineno)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in names:
                target = use(*names[func.id], node.lineno)
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in modules:
                target = use(modules[func.value.id], func.attr, node.lineno)
            if target is not None:
                for keyword in node.keywords:
                    if keyword.arg is not None:
                        target.keywords.setdefault(keyword.arg, f"{path}:{node.lineno}")


def sibling_uses(src: Path) -> list[Use]:
    uses: dict[tuple[str, str], Use] = {}
    for path in sorted(src.rglob("*.py")):
        _uses_in(path, uses)
    return sorted(uses.values(), key=lambda u: (u.module, u.name))


def _resolve(use: Use) -> object:
    """The module or object `use` names, as this Python imports it; raises ImportError / AttributeError."""
    module = importlib.import_module(use.module)
    if not use.name:
        return module
    try:
        return getattr(module, use.name)
    except AttributeError:
        return importlib.import_module(f"{use.module}.{use.name}")  # `from package import submodule`


def _resolved(uses: list[Use]) -> Iterator[tuple[Use, object, Exception | None]]:
    """Each use with what it names here, or the error that says it is missing."""
    for use in uses:
        try:
            yield use, _resolve(use), None
        except (ImportError, AttributeError) as missing:
            yield use, None, missing


def _signature(found: object) -> inspect.Signature | None:
    if inspect.ismodule(found) or not callable(found):
        return None
    try:
        return inspect.signature(found)
    except (TypeError, ValueError):  # a builtin or C type without one
        return None


def problems(uses: list[Use]) -> list[str]:
    found_problems = []
    for use, found, missing in _resolved(uses):
        if missing is not None:
            found_problems.append(f"{use.label} (used at {use.where[0]}): not in the installed sibling ({missing})")
            continue
        signature = _signature(found)
        if signature is None or any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
            continue
        for keyword, where in use.keywords.items():
            if keyword not in signature.parameters:
                found_problems.append(f"{use.label}{signature} takes no keyword {keyword!r} (passed at {where})")
    return found_problems


def fingerprint(uses: list[Use]) -> list[str]:
    lines = []
    for use, found, missing in _resolved(uses):
        if missing is not None:
            lines.append(f"{use.label} missing")
            continue
        signature = _signature(found)
        kind = "module" if inspect.ismodule(found) else type(found).__name__
        described = f"{use.label} {kind}{'' if signature is None else signature}"
        lines.append(re.sub(r" at 0x[0-9a-f]+", "", described))  # a default's repr may hold an address
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["check", "fingerprint"])
    parser.add_argument("src", type=Path, help="titan-train's src folder")
    args = parser.parse_args(argv)
    uses = sibling_uses(args.src)
    if args.what == "fingerprint":
        print("\n".join(fingerprint(uses)))
        return 0
    found_problems = problems(uses)
    for problem in found_problems:
        print(f"sibling_surface: {problem}", file=sys.stderr)
    modules = sorted({use.module.split(".")[0] for use in uses})
    versions = ", ".join(f"{m} {getattr(importlib.import_module(m), '__version__', '?')}" for m in modules)
    print(f"sibling_surface: {len(uses)} names titan-train uses checked against {versions}: "
          f"{len(found_problems)} missing or called with a keyword they do not take")  # fmt: skip
    return 1 if found_problems else 0


if __name__ == "__main__":
    sys.exit(main())
