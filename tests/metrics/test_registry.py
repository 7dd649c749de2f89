"""The metric registry is the one place for a metric: registering one puts it in every table and file."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import make_capture, run
from typer.testing import CliRunner

from attnviz import metrics
from attnviz.cli import app
from attnviz.errors import UsageError
from attnviz.api.gallery import export

COMMANDS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "commands.md"


@pytest.fixture
def extra_metric():
    """A metric defined only here: the mean weight on the last key, written with three decimals."""
    metric = metrics.Metric("last_key_mass", "lastkey", "mean over rows of the weight on the last key",
                            rows=lambda r: r.alpha[..., -1], fmt="{:.3f}")
    metrics.register(metric)
    yield metric
    metrics.unregister(metric.name)


def capture():
    rng = np.random.default_rng(3)
    return make_capture(rng.dirichlet(np.ones(5), size=(2, 3, 5)), ["[CLS]", "a", "b", "c", "[SEP]"],
                        special=[True, False, False, False, True], kinds=["start", "", "", "", "end"])


def test_a_registered_metric_reaches_every_output(extra_metric, tmp_path):
    cap = capture()
    expected = cap.attentions[..., -1].mean(axis=-1)  # (L, H)
    path = cap.save(tmp_path / "c.npz")
    runner = CliRunner()
    table = runner.invoke(app, ["heads", "--from", str(path)], env={"COLUMNS": "250"})
    assert table.exit_code == 0 and "lastkey" in table.stdout and f"{expected[1, 2]:.3f}" in table.stdout
    rows = json.loads(runner.invoke(app, ["heads", "--from", str(path), "--json"]).stdout)["heads"]
    assert rows[5]["last_key_mass"] == pytest.approx(float(expected[1, 2]))
    csv_lines = runner.invoke(app, ["heads", "--from", str(path), "--csv"]).stdout.splitlines()
    assert "last_key_mass" in csv_lines[0].split(",")
    ordered = runner.invoke(app, ["heads", "--from", str(path), "--sort", "lastkey", "--json"])
    values = [r["last_key_mass"] for r in json.loads(ordered.stdout)["heads"]]
    assert values == sorted(values)
    folder = export(cap, tmp_path / "export", layer=[0, 1], head=[0, 1, 2])
    assert json.loads((folder / "heads.json").read_text())[0]["last_key_mass"] == pytest.approx(float(expected[0, 0]))
    assert "last_key_mass" in (folder / "heads.csv").read_text().splitlines()[0]
    html = (folder / "index.html").read_text()
    assert "lastkey" in html and f"{expected[0, 1]:.3f}" in html and "weight on the last key" in html
    assert "| `last_key_mass` | `lastkey` | mean over rows of the weight on the last key |" in \
        metrics.definitions_markdown()
    explain = runner.invoke(app, ["explain", "lastkey"])
    assert explain.exit_code == 0 and "weight on the last key" in explain.stdout


def test_names_and_headers_are_unique():
    with pytest.raises(UsageError, match="exists"):
        metrics.register(metrics.Metric("entropy", "e2", "dup", rows=lambda r: r.alpha.max(axis=-1)))
    keys = [k for m in metrics.METRICS for k in {m.name, m.header}]
    assert len(keys) == len(set(keys))


def test_the_docs_definition_table_is_the_registry():
    """The docs' table is generated (python scripts/make_samples.py --tables) and must match."""
    text = COMMANDS_PAGE.read_text(encoding="utf-8")
    block = re.search(r"<!-- metrics:start -->\n(.*?)<!-- metrics:end -->", text, re.S)
    assert block is not None, "docs/commands.md lost its metrics markers"
    assert block.group(1) == metrics.definitions_markdown()


def _sorted_by(records: list[dict], key: str, desc: bool = False) -> bool:
    """Whether records are in the order of `key`, NaN last either way."""
    values = [r.get(key) for r in records]
    numbers = [v for v in values if not (isinstance(v, float) and v != v)]
    assert values[:len(numbers)] == numbers  # NaN (a metric that does not apply) after every number
    return numbers == sorted(numbers, reverse=desc)


@pytest.mark.slow
def test_every_table_header_is_a_sort_key(tmp_path):
    """Sorting by a column's header orders the heads by that column's values (ascending, or descending with
    --desc), on a capture whose heads differ, so an order that ignored the key would show."""
    from attnviz.render.tables import head_columns

    path = capture().save(tmp_path / "c.npz")
    changed = 0
    unsorted = json.loads(CliRunner().invoke(app, ["heads", "--from", str(path), "--json"]).stdout)["heads"]
    shown = [(key, header) for key, header, _width, _text in head_columns() if key in unsorted[0]]
    assert len(shown) >= 10  # the optional columns (kept: sink logits) are absent for this model
    for key, header in shown:
        for desc in ([], ["--desc"]):
            result = CliRunner().invoke(app, ["heads", "--from", str(path), "--sort", header, *desc, "--json"])
            assert result.exit_code == 0, (header, result.output)
            records = json.loads(result.stdout)["heads"]
            assert sorted(map(json.dumps, records)) == sorted(map(json.dumps, unsorted))  # the same heads
            assert _sorted_by(records, key, bool(desc)), (header, desc)
            changed += records != unsorted
    assert changed >= len(shown)  # most keys reorder these heads


def test_sort_keys_are_the_column_headers(tmp_path):
    """Every header the heads table prints is accepted by --sort and orders the heads by that column."""
    from attnviz.render.tables import head_columns

    cap = capture().save(tmp_path / "c.npz")
    table = run("heads", "--from", cap, env={"COLUMNS": "200"}).stdout
    header = next(line for line in table.splitlines() if "label" in line and "entropy" in line).split()
    keys = {h: k for k, h, _w, _t in head_columns()}
    assert set(header) <= set(keys)
    for column in header:
        result = run("heads", "--from", cap, "--sort", column, "--json")
        assert result.exit_code == 0, column
        assert _sorted_by(json.loads(result.stdout)["heads"], keys[column]), column
