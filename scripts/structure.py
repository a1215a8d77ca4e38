"""The shape of the source tree, checked by scripts/check.sh:

- no import circle between the project's modules (strongly connected
  components of the module import graph, imports inside functions included):
  this fails the check;
- the import layers inside servers/, printed bottom first: a module's layer is
  one above the highest layer it imports from servers/, so a newcomer sees
  which parts stand on which (and a circle could not be layered at all).

There is no size limit: module length and parameter counts are not checked
(a cohesive long module beats one split to fit a count; a call with many
arguments takes them by keyword or as one value).  Tests and generated
protobuf code are exempt.  `--report` prints the largest modules, classes and
functions (for a review or a closing note).

    python scripts/structure.py [--report]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

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


def import_graph(names: set[str]) -> dict[str, list[str]]:
    """Each module's direct imports among `names` (imports inside functions included)."""
    import grimp

    graph = grimp.build_graph("svtagg", cache_dir=None)
    names = names & graph.modules  # scripts/ and the like are not modules of the package
    return {
        m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in names)
        for m in names
    }


def layers(edges: dict[str, list[str]], prefix: str) -> list[list[str]]:
    """The modules under `prefix` by import layer, bottom first (imports from
    outside `prefix` do not count); only for a graph without circles."""
    inside = {m: [i for i in edges[m] if i.startswith(prefix)] for m in edges}
    inside = {m: deps for m, deps in inside.items() if m.startswith(prefix)}
    # A package's __init__ (a docstring, no imports) is not a layer's module.
    inside = {m: d for m, d in inside.items() if not any(o.startswith(m + ".") for o in inside)}
    level: dict[str, int] = {}

    def of(m: str) -> int:
        if m not in level:
            level[m] = 1 + max((of(i) for i in inside[m]), default=-1)
        return level[m]

    for m in inside:
        of(m)
    out: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for m, n in level.items():
        out[n].append(m[len(prefix) :] or "(package)")
    return [sorted(row) for row in out]


def classes(path: Path) -> list[tuple[int, int, str]]:
    """(lines, methods, name) of every class in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        (
            (node.end_lineno or node.lineno) - node.lineno + 1,
            sum(isinstance(c, ast.FunctionDef | ast.AsyncFunctionDef) for c in node.body),
            node.name,
        )
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]


def import_cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components (size > 1) of the direct-import graph."""
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
    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", action="store_true", help="print the largest modules/functions")
    args = ap.parse_args()
    files = sources()
    # Every module of the package (an __init__ names its package).
    edges = import_graph({module_name(p) for p in files})
    problems = [f"import circle: {' ↔ '.join(c)}" for c in import_cycles(edges)]
    if args.report:
        sizes = sorted(((len(p.read_text().splitlines()), p) for p in files), reverse=True)
        print("largest modules (lines):")
        for n, p in sizes[:12]:
            print(f"  {n:5d}  {p.relative_to(ROOT)}")
        big = sorted(
            (n, k, f"{p.relative_to(ROOT)} {name}") for p in files for n, k, name in classes(p)
        )[::-1]
        print("largest classes (lines, methods):")
        for n, k, where in big[:12]:
            print(f"  {n:5d} {k:3d}  {where}")
        funcs = sorted(
            (n, f"{p.relative_to(ROOT)}:{line} {name}")
            for p in files
            for n, name, line in functions(p)
        )[::-1]
        print("most parameters:")
        for n, where in funcs[:12]:
            print(f"  {n:5d}  {where}")
    for line in problems:
        print(f"structure: {line}", file=sys.stderr)
    if problems:
        return 1
    rows = layers(edges, "svtagg.servers.")
    print(f"structure: servers/ in {len(rows)} import layers, bottom first:")
    for n, row in enumerate(rows):
        print(f"  {n:2d}  {' '.join(row)}")
    inner = sum(
        len([i for i in v if i.startswith("svtagg.servers.")])
        for k, v in edges.items()
        if k.startswith("svtagg.servers.")
    )
    print(f"structure: {len(files)} modules, no import circle ({inner} imports inside servers/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
