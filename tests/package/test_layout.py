"""The shape of the package, held by tests: the command line enters the library only through the API, and
every import edge — at the top of a module, inside a function, or by name through importlib — is seen."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "attnviz"


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports: import statements anywhere in it (functions included), relative imports
    resolved, and importlib.import_module / __import__ called with a string literal."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__"):
                found.add(node.args[0].value)
    return found


def test_the_walk_sees_imports_inside_functions_and_by_name(tmp_path):
    source = PACKAGE / "cli" / "_probe_for_test.py"
    source.write_text("def f():\n    from attnviz.engine import models\n    import importlib\n"
                      "    importlib.import_module('attnviz.engine.stream')\n", encoding="utf-8")
    try:
        seen = imported_modules(source)
    finally:
        source.unlink()
    assert {"attnviz.engine", "attnviz.engine.models", "attnviz.engine.stream"} <= seen


@pytest.mark.parametrize("path", sorted((PACKAGE / "cli").glob("*.py")), ids=lambda p: p.name)
def test_the_command_line_never_imports_the_engine(path):
    """cli/ calls attnviz.api (and the viewing layers below it), never the torch side directly."""
    engine = sorted(m for m in imported_modules(path) if m == "attnviz.engine" or m.startswith("attnviz.engine."))
    assert engine == [], f"{path.name} imports {engine}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "serve").glob("*.py")), ids=lambda p: p.name)
def test_the_live_app_never_imports_the_engine(path):
    """serve/ calls the same functions a notebook does (attnviz.api), never the torch side directly."""
    engine = sorted(m for m in imported_modules(path) if m == "attnviz.engine" or m.startswith("attnviz.engine."))
    assert engine == [], f"{path.name} imports {engine}"


def test_no_import_cycles_in_the_package():
    """Following every import of an attnviz module (top-level, inside functions, by name), the modules form no
    cycle. The package root re-exports and is left out; a package and its own modules are one."""
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in imported_modules(path) if m in modules and m not in (name, "attnviz")}
             for name, path in modules.items()}
    seen: set[str] = set()
    stack: list[str] = []

    def visit(node: str) -> None:
        if node in stack:
            raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(node):] + [node]))
        if node in seen:
            return
        stack.append(node)
        for dep in graph[node]:
            if not (dep.startswith(node + ".") or node.startswith(dep + ".")):
                visit(dep)
        stack.pop()
        seen.add(node)

    for module in graph:
        visit(module)


def test_the_version_lives_in_one_leaf():
    for path in PACKAGE.rglob("*.py"):
        if path.name == "_version.py":
            assert imported_modules(path) <= {"__future__"}
            continue
        assert "attnviz.__version__" not in imported_modules(path), path
    import attnviz
    from attnviz._version import __version__

    assert attnviz.__version__ == __version__


def test_the_capture_function_is_never_shadowed_by_a_module():
    """No module of the package is named like a public function (no module-class override is needed)."""
    import importlib

    import attnviz

    public = set(attnviz.__all__)
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    assert not public & modules, public & modules
    for name in ("attnviz.data.capture", "attnviz.api.gallery", "attnviz.corpora"):
        importlib.import_module(name)
    assert callable(attnviz.capture) and callable(attnviz.export) and callable(attnviz.corpus)
    assert type(attnviz).__name__ == "module"


def test_no_package_shadows_its_own_modules():
    """In every package, a name the package binds that is also one of its modules is that module: a function
    re-exported under a module's name would hide the module (monkeypatching it, reading its constants)."""
    import importlib

    for init in sorted(PACKAGE.rglob("__init__.py")):
        folder = init.parent
        dotted = ".".join(folder.relative_to(PACKAGE.parent).parts)
        package = importlib.import_module(dotted)
        for module in sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__"):
            bound = vars(package).get(module)
            assert bound is None or type(bound).__name__ == "module", f"{dotted}.{module} is hidden by {bound!r}"


TORCH_SIDE = ("torch", "transformers", "captum", "ctranslate2", "onnxruntime", "faster_whisper", "gguf")
MAX_LINES = 550  # STYLE.md: a module longer than this is split
MAX_LOOSE_MODULES = 8  # modules at the package root besides __init__, __main__ and _version


def outside_engine() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "engine")


@pytest.mark.parametrize("path", outside_engine(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_engine_imports_the_torch_side(path):
    """torch, transformers and the other model runtimes are imported under engine/ only (a saved capture is read,
    drawn and served without them)."""
    found = sorted(m for m in imported_modules(path) if m.split(".")[0] in TORCH_SIDE)
    assert found == [], f"{path.relative_to(PACKAGE)} imports {found}"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_longer_than_the_limit(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines (at most {MAX_LINES}): split it"


def test_the_package_root_holds_a_handful_of_modules():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py", "_version.py"))
    assert len(loose) <= MAX_LOOSE_MODULES, f"the package root holds {len(loose)} modules: {loose}"


def test_the_limits_catch_what_they_are_for(tmp_path):
    """The three checks above fail on a module that breaks them (the walk reads a file under the package)."""
    probe = PACKAGE / "metrics" / "_probe_limits_for_test.py"
    probe.write_text("def f():\n    import torch\n    return torch\n" + "x = 1\n" * MAX_LINES, encoding="utf-8")
    try:
        assert probe in outside_engine()
        with pytest.raises(AssertionError, match="imports"):
            test_only_the_engine_imports_the_torch_side(probe)
        with pytest.raises(AssertionError, match="split it"):
            test_no_module_is_longer_than_the_limit(probe)
    finally:
        probe.unlink()
