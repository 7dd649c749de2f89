"""MkDocs hooks (mkdocs.yml): the command-line reference is made from the Typer app at build time, the Python API
reference page (docs/reference/api.md) is written from the API's one table of public names (attnviz.api.PUBLIC)
by `python scripts/docs_hooks.py` (a test fails while it is stale), the changelog comes from CHANGELOG.md; and the
sample pictures the pages link under sample_outputs/ are published beside them (made by
scripts/make_samples.py, never copied into docs/)."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
# A page links a sample as the repository holds it, ../sample_outputs/NAME (../../ from docs/guide/): the link
# works in the Markdown read on its own, and the site serves the file as samples/NAME beside the pages.
SAMPLE_LINK = re.compile(r"((?:\.\./)+)sample_outputs/([A-Za-z0-9_.\-/]+)")


def linked_samples(docs: Path) -> set[str]:
    """Every sample a page of `docs` links (its name under sample_outputs/)."""
    return {m.group(2) for page in docs.rglob("*.md") for m in SAMPLE_LINK.finditer(page.read_text("utf-8"))}


def on_files(files, config):
    from attnviz.cli.reference import markdown

    files.append(File.generated(config, "reference/cli.md", content=markdown()))
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").replace("](docs/", "](")
    files.append(File.generated(config, "changelog.md", content=changelog))
    for name in sorted(linked_samples(Path(config["docs_dir"]))):
        files.append(File.generated(config, f"samples/{name}", abs_src_path=str(ROOT / "sample_outputs" / name)))
    return files


def on_page_markdown(markdown, page, config, files):
    """The repository's links to samples (../sample_outputs/NAME from docs/) as the site's (samples/NAME)."""
    depth = page.file.src_uri.count("/")

    def site(match: re.Match) -> str:
        if len(match.group(1)) // 3 != depth + 1:  # not a link out of docs/ into sample_outputs/
            return match.group(0)
        return "../" * depth + "samples/" + match.group(2)

    return SAMPLE_LINK.sub(site, markdown)


SECTIONS = {  # a module of the API table -> the heading its names go under
    "attnviz.api.models": "Models", "attnviz.api.capturing": "Capturing α: text, pictures, sound",
    "attnviz.api.views": "Views of α", "attnviz.api.stats": "Head statistics",
    "attnviz.api.scratch.verify": "From the weights: verify", "attnviz.api.scratch.steps": "From the weights: steps",
    "attnviz.api.scratch.positions": "From the weights: positions", "attnviz.api.scratch.scaling":
        "From the weights: scaling", "attnviz.api.values": "Value-weighted norms and sinks",
    "attnviz.api.attribution.contributions": "Contributions", "attnviz.api.attribution.logits": "Logit attribution",
    "attnviz.api.ablation.removing": "Removing heads", "attnviz.api.ablation.ranking": "Every head removed alone",
    "attnviz.api.ablation.detectors": "Detecting heads", "attnviz.api.patching.activation": "Activation patching",
    "attnviz.api.patching.paths": "Path patching", "attnviz.api.mechanisms.circuits": "Circuits from the weights",
    "attnviz.api.mechanisms.retrieval": "Retrieval heads", "attnviz.api.mechanisms.massive": "Massive activations",
    "attnviz.api.speech": "Word timings", "attnviz.api.generation": "Writing", "attnviz.api.costs": "Cost",
    "attnviz.api.corpora": "Corpora", "attnviz.api.gallery": "Export", "attnviz.data.capture": "The Capture",
    "attnviz.data.parts": "An encoder-decoder model's Parts", "attnviz.metrics": "Metrics",
    "attnviz.errors": "Errors", "attnviz.progress": "Progress",
}


def api_markdown() -> str:
    """The Python API reference: every public name of attnviz.api.PUBLIC, under its module's heading, each
    rendered from where it is defined (a re-exported class from its own module)."""
    import importlib

    from attnviz.api import PUBLIC

    lines = ["# Python API", "",
             "Everything here is importable from `attnviz` itself (`attnviz.capture`, `attnviz.Capture`, …); "
             "`import attnviz` loads neither torch nor transformers until a model is needed. Every command is one "
             "function of the same name (hyphens as underscores), which takes its input first and everything else "
             "by keyword, and returns a result that owns its output: `to_dict()` (what the command's `--json` "
             "prints), `to_rows()` (its `--csv`), `report()` (its table), `figure()` and `html()`. This page is "
             "made from the API's one table of names (`attnviz.api.PUBLIC`) by `python scripts/docs_hooks.py`.", ""]
    for module, names in PUBLIC.items():
        lines += [f"## {SECTIONS.get(module, module)}", ""]
        home = importlib.import_module(module)
        for name in names:
            value = getattr(home, name)
            defined = getattr(value, "__module__", None) if callable(value) else None
            own = defined and defined.startswith("attnviz") and getattr(value, "__name__", name) == name
            where = f"{defined}.{name}" if own else f"{module}.{name}"
            lines += [f"::: {where}", ""]
    return "\n".join(lines)


if __name__ == "__main__":  # python scripts/docs_hooks.py: write the Python API page from attnviz.api.PUBLIC
    (ROOT / "docs" / "reference" / "api.md").write_text(api_markdown() + "\n", encoding="utf-8")
