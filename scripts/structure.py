"""The shape of the source tree, checked by scripts/check.sh:

- no import circle between the project's modules (strongly connected
  components of the module import graph, imports inside functions included):
  this fails the check;
- modules above MAX_LINES lines and functions taking more than MAX_PARAMS
  parameters (self / cls not counted) are listed as notes, not failures: the
  sizes are a nudge towards cohesive modules, and a cohesive long module is
  better than one split by the count alone.

Tests and generated protobuf code are exempt.  `--report` prints the largest
modules and functions as well (for a review or a closing note).

    python scripts/structure.py [--report]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

MAX_LINES = 700
MAX_PARAMS = 8
ROOT = Path(__file__).resolve().parent.parent
EXEMPT_DIRS = {"tests", ".venv", "build", "dist", ".git", "results"}


def sources() -> list[Path]:
    out = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT)
        if rel.parts[0] in EXEMPT_DIRS or "_pb2" in p.name or ".egg-info" in str(rel):
            continue
        out.append(p)
    return out


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["svtagg", *parts])


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    if names and names[0].arg in ("self", "cls"):
        n -= 1
    return n


def functions(path: Path) -> list[tuple[int, str, int]]:
    """(parameters, qualified name, line) of every function in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[int, str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                out.append((parameters(child), name, child.lineno))
                walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def import_cycles(names: set[str]) -> list[list[str]]:
    """Strongly connected components (size > 1) of the direct-import graph."""
    import grimp

    graph = grimp.build_graph("svtagg", cache_dir=None)
    names = names & graph.modules  # scripts/ and the like are not modules of the package
    edges = {
        m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in names)
        for m in names
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:  # Tarjan's algorithm
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(names):
        if v not in index:
            connect(v)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", action="store_true", help="print the largest modules/functions")
    args = ap.parse_args()
    files = sources()
    sizes = sorted(((len(p.read_text().splitlines()), p) for p in files), reverse=True)
    funcs = sorted(
        (
            (n, f"{p.relative_to(ROOT)}:{line} {name}")
            for p in files
            for n, name, line in functions(p)
        ),
        reverse=True,
    )
    notes = [
        f"{p.relative_to(ROOT)}: {n} lines (nudge {MAX_LINES})" for n, p in sizes if n > MAX_LINES
    ]
    notes += [
        f"{where}: {n} parameters (nudge {MAX_PARAMS})" for n, where in funcs if n > MAX_PARAMS
    ]
    # Every module of the package (an __init__ names its package).
    names = {module_name(p) for p in files}
    problems = [f"import circle: {' ↔ '.join(c)}" for c in import_cycles(names)]
    if args.report:
        print("largest modules (lines):")
        for n, p in sizes[:12]:
            print(f"  {n:5d}  {p.relative_to(ROOT)}")
        print("most parameters:")
        for n, where in funcs[:12]:
            print(f"  {n:5d}  {where}")
    for line in notes:
        print(f"structure: note: {line}")
    for line in problems:
        print(f"structure: {line}", file=sys.stderr)
    if not problems:
        print(f"structure: {len(files)} modules, no import circle ({len(notes)} size notes)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
