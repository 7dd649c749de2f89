"""The README is the first screen and the docs are whole: every link between them lands on a file, and the
command-line reference is made from the command line itself (every command, every option)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _relative_links(page: Path) -> list[tuple[str, Path]]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code is not a link
    found = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        found.append((target, (page.parent / target.split("#")[0]).resolve()))
    return found


def test_the_readme_fits_a_screen_and_every_link_lands():
    readme = ROOT / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 250
    links = _relative_links(readme)
    assert any(target.endswith(".png") for target, _ in links)  # a heatmap on the first screen
    assert any(target.endswith(".svg") for target, _ in links)  # and a terminal picture
    missing = [target for target, path in links if not path.exists()]
    assert not missing, missing


def test_every_docs_page_is_in_the_navigation_and_every_link_between_pages_lands():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    docs = ROOT / "docs"
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}
    generated = {"reference/cli.md", "changelog.md"}  # made by scripts/docs_hooks.py when the site is built
    assert pages | generated == set(re.findall(r":\s*([\w/.-]+\.md)\s*$", nav, re.M))
    for page in docs.rglob("*.md"):
        for target, path in _relative_links(page):
            if path.is_relative_to(docs.resolve()) and path.relative_to(docs.resolve()).as_posix() in generated:
                continue
            assert path.exists(), f"{page.name}: {target}"  # read as plain Markdown, every link lands


def test_the_site_serves_every_picture_a_page_links(monkeypatch):
    """The docs hook publishes what the pages link under sample_outputs/ (no list by hand) and rewrites each
    such link to where the site serves it: a picture a page links but the repository lacks fails here."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    docs = ROOT / "docs"
    published = {f"samples/{name}" for name in hooks.linked_samples(docs)}
    assert all((ROOT / "sample_outputs" / name.removeprefix("samples/")).is_file() for name in published)
    linked = 0
    for page in docs.rglob("*.md"):
        src = page.relative_to(docs).as_posix()
        site = hooks.on_page_markdown(page.read_text(encoding="utf-8"), SimpleNamespace(
            file=SimpleNamespace(src_uri=src)), {}, None)
        for target in LINK.findall(site):
            if "sample_outputs/" in target:
                raise AssertionError(f"{src}: {target} is not rewritten to the site's samples/")
            if "samples/" in target:
                served = (Path(src).parent / target.split("#")[0]).as_posix()
                served = str(Path(served).resolve().relative_to(Path("/").resolve())) if served.startswith("/") \
                    else __import__("posixpath").normpath(served)
                assert served in published, (src, target)
                linked += 1
    assert linked >= 30


@pytest.mark.slow
def test_the_docs_site_builds_strictly_without_a_warning(tmp_path):
    """`mkdocs build --strict`, as scripts/lint.sh runs it, with every warning shown: none."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env={**__import__("os").environ,
                                                                           "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr[-2000:]
    assert (tmp_path / "site" / "samples" / "whisper_cross.png").is_file()
    assert (tmp_path / "site" / "reference" / "api" / "index.html").is_file()


def test_the_api_reference_is_made_from_the_one_table_of_names():
    """docs/reference/api.md is what scripts/docs_hooks.py writes from attnviz.api.PUBLIC: every public name,
    none by hand (run `python scripts/docs_hooks.py` after changing the table)."""
    import importlib.util

    from attnviz.api import PUBLIC

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    assert page == hooks.api_markdown() + "\n"
    assert all(re.search(rf"^::: [\w.]+\.{name}$", page, re.M) for names in PUBLIC.values() for name in names)


def test_the_cli_reference_names_every_command_and_option():
    from attnviz.cli import command_group
    from attnviz.cli.reference import markdown

    text = markdown()
    sections = dict(re.findall(r"^## `attnviz ([\w-]+)`\n(.*?)(?=^## |\Z)", text, re.S | re.M))
    group = command_group()
    assert list(sections) == group.list_commands(None)
    for name, command in group.commands.items():
        for param in command.params:
            if param.param_type_name == "option" and not getattr(param, "hidden", False):
                assert all(f"`{opt}`" in sections[name] for opt in param.opts), (name, param.opts)
                if param.help:
                    shown = " ".join(param.help.split())[:40]
                    shown = shown.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
                    assert shown in sections[name], (name, param.opts)
    assert "&lt;s&gt;" in sections["heatmap"] and "<s>" not in sections["heatmap"]  # help text is text


def test_the_number_of_offline_models_the_front_pages_give_is_the_number_they_list():
    """index.md said "five real pretrained models" above a table of six."""
    import re

    from attnviz.engine import offline

    words = {5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
    n = len(offline.MODELS)
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        text = page.read_text(encoding="utf-8")
        said = re.search(r"(\w+) offline models", text).group(1).lower()
        table = text[text.index("| `--model` |"):].split("\n\n")[0]  # the models' table
        rows = re.findall(r"^\| `(\w[\w.-]*)`( \(default\))? \|", table, re.M)  # not the header's `--model`
        assert said == words[n] and {r[0] for r in rows} == {m.aliases[0] for m in offline.MODELS}, page.name
