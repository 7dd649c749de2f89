"""The README is the first screen and the docs are whole: every link between them lands on a file, and the
command-line reference is made from the command line itself (every command, every option)."""

from __future__ import annotations

import re
from pathlib import Path

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
            served = path.relative_to(docs.resolve()).as_posix()  # where the link lands on the site
            if served.startswith("samples/"):  # served from sample_outputs/ by the hook (from any page's folder)
                path = ROOT / "sample_outputs" / served.removeprefix("samples/")
            elif served in generated:
                continue
            assert path.exists(), f"{page.name}: {target}"


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
