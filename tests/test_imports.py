"""The imports of fedmpi/, read from the source: no import circle, and no module importing a module
of a higher layer except the exceptions docs/DESIGN.md names ("Layers", read from there)."""

from __future__ import annotations

import ast
import os
import re

from conftest import ROOT

PKG = os.path.join(ROOT, "fedmpi")


def modules() -> dict[str, str]:
    """{dotted module name: file} of every module of fedmpi/ (a package is its __init__)."""
    out = {}
    for folder, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
                out[name] = path
    return out


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under ``if TYPE_CHECKING:`` (never run)."""
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            children = node.orelse
        else:
            children = list(ast.iter_child_nodes(node))
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
        for child in children:
            visit(child)

    visit(tree)
    return found


def imports(mods: dict[str, str]) -> dict[str, set[str]]:
    """{module: the fedmpi modules it imports}; importing ``a.b.c`` also imports ``a`` and ``a.b``
    (but a module's own packages are already being imported when it runs: no edge to them)."""
    graph = {}
    for name, path in mods.items():
        package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        targets = set()
        for node in _runtime_imports(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                bases = [a.name for a in node.names]
            else:
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                base = ".".join(base + ([node.module] if node.module else []))
                bases = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in bases:
                parts = target.split(".")
                targets |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & mods.keys()
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        graph[name] = targets - own
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def design_block(kind: str) -> list[str]:
    """The lines of the ```kind fenced block of docs/DESIGN.md."""
    text = open(os.path.join(ROOT, "docs", "DESIGN.md"), encoding="utf-8").read()
    block = re.search(rf"```{kind}\n(.*?)```", text, re.S)
    assert block, f"docs/DESIGN.md has no ```{kind} block"
    return [ln.split("#", 1)[0].strip() for ln in block.group(1).splitlines() if ln.split("#", 1)[0].strip()]


def command_modules() -> set[str]:
    """The modules of the subcommands listed in cli._EXTENSIONS (entry points: the top layer)."""
    tree = ast.parse(open(os.path.join(PKG, "cli.py"), encoding="utf-8").read())
    table = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "_EXTENSIONS" for t in n.targets))
    return {"fedmpi" + entry.elts[1].value for entry in table.elts}


def layers(mods: dict[str, str]) -> dict[str, int]:
    """{module: its layer number} from docs/DESIGN.md: a module is in the layer of the longest
    name listed there that it is, or lies under; command modules are in the last layer."""
    listed = {}
    rows = design_block("layers")
    for number, row in enumerate(rows):
        for name in row.split(":", 1)[1].split():
            listed["fedmpi" if name == "fedmpi" else f"fedmpi.{name}"] = number
    out = {}
    for m in mods:
        prefixes = [p for p in listed if m == p or m.startswith(p + ".")]
        assert prefixes, f"{m} is in no layer of docs/DESIGN.md"
        out[m] = listed[max(prefixes, key=len)]
    for m in command_modules():
        out[m] = len(rows) - 1
    return out


def upward(graph: dict[str, set[str]], layer: dict[str, int]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets if layer[b] > layer[a]}


def test_no_import_circle():
    assert circles(imports(modules())) == []


def test_no_import_from_a_higher_layer_but_the_named_exceptions():
    mods = modules()
    found = upward(imports(mods), layers(mods))
    named = {tuple(f"fedmpi.{x.strip()}" for x in ln.split("->")) for ln in design_block("upward")}
    assert found == named, (f"undeclared: {sorted(found - named)}; "
                            f"named in docs/DESIGN.md but gone: {sorted(named - found)}")


def test_the_checks_see_what_they_look_for(tmp_path):
    """A circle and an upward import in a made-up package are found; TYPE_CHECKING imports are not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert upward({"low": {"high"}, "high": {"low"}}, {"low": 0, "high": 1}) == {("low", "high")}
    tree = ast.parse("import x\nif TYPE_CHECKING:\n    import y\nelse:\n    import z\ndef f():\n    import w\n")
    assert [ast.unparse(n) for n in _runtime_imports(tree)] == ["import x", "import z", "import w"]


def test_the_registry_and_the_loader_do_not_import_each_other():
    graph = imports(modules())
    assert "fedmpi.plugins" not in graph["fedmpi.registry"] and "fedmpi.registry" not in graph["fedmpi.plugins"]
    assert graph["fedmpi.schema"] == set()  # how a key is declared: nothing else of fedmpi
