"""The lazy front door seen by a type checker: attnviz/__init__.py's TYPE_CHECKING block names every public name
from its home, exactly attnviz.api.PUBLIC; mypy then sees each function's signature and result type."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnviz
from attnviz.api import PUBLIC

ROOT = Path(attnviz.__file__).parent


def typed_names(source: str) -> dict[str, tuple[str, ...]]:
    """module -> the names the `if TYPE_CHECKING:` block of `source` imports from it (each `X as X`)."""
    found: dict[str, tuple[str, ...]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module and statement.module != "attnviz":
                    assert all(alias.asname == alias.name for alias in statement.names)  # re-exported
                    found[statement.module] = tuple(alias.name for alias in statement.names)
    return found


def test_the_typed_block_is_the_public_table():
    assert typed_names((ROOT / "__init__.py").read_text(encoding="utf-8")) == PUBLIC


def test_the_check_sees_a_name_missing_from_the_block():
    source = (ROOT / "__init__.py").read_text(encoding="utf-8").replace("heads as heads, ", "")
    assert typed_names(source) != PUBLIC


def test_the_package_is_marked_typed():
    assert (ROOT / "py.typed").is_file()


@pytest.mark.slow
def test_mypy_sees_the_result_types(tmp_path):
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent))
    if mypy is None:
        pytest.skip("mypy is not installed (pip install -e .[test])")
    (tmp_path / "use.py").write_text("import attnviz\n"
                                     "reveal_type(attnviz.heads)\n"
                                     "reveal_type(attnviz.load('minilm').run('x').sinks())\n"
                                     "reveal_type(attnviz.sinks('a text'))\n"
                                     "reveal_type(attnviz.sinks(['a text', 'another']))\n"
                                     "reveal_type(attnviz.patch('a', 'b'))\n"
                                     "reveal_type(attnviz.patch('a', 'b', senders='0.1'))\n"
                                     "reveal_type(attnviz.faithfulness(['a', 'b']))\n"
                                     "reveal_type(attnviz.detect())\n", encoding="utf-8")
    done = subprocess.run([mypy, "--follow-imports=silent", "--no-incremental", "use.py"], cwd=tmp_path,
                          capture_output=True, text=True, env={"MYPYPATH": str(ROOT.parent), "PATH": ""})
    lines = [line for line in done.stdout.splitlines() if "Revealed type" in line]
    assert len(lines) == 8, done.stdout + done.stderr
    assert lines[0].endswith('-> attnviz.api.stats.HeadTable"') and "source: Any" in lines[0]
    # one type per call: where the argument decides the result, an overload says which
    assert [line.rsplit('"', 2)[-2] for line in lines[1:]] == [
        "attnviz.api.values.Sinks", "attnviz.api.values.Sinks", "attnviz.api.values.SinkRate",
        "attnviz.api.patching.activation.Patching", "attnviz.api.patching.paths.PathPatching",
        "attnviz.api.attribution.faithfulness_corpus.FaithfulnessCorpus", "attnviz.api.ablation.detectors.Detection"]
