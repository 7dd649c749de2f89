"""MkDocs hooks (mkdocs.yml): the command-line reference page is made from the Typer app at build time, and
the sample pictures under sample_outputs/ are served as samples/ (made by scripts/make_samples.py, not
copied into docs/)."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ("cat_layer0_head2.png", "cat_layer5_mean.png", "cat_all_layers.png", "cat_terminal.svg",
           "korean_multilingual_layer0_head2.png", "view_head.png", "view_model.png", "view_matrix.png",
           "steps_layer0_head2.png", "smollm2_causal_layer0.png", "rollout.png", "entropy.png")


def on_files(files, config):
    from attnviz.cli.reference import markdown

    files.append(File.generated(config, "reference/cli.md", content=markdown()))
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").replace("](docs/", "](")
    files.append(File.generated(config, "changelog.md", content=changelog))
    for name in SAMPLES:
        files.append(File.generated(config, f"samples/{name}", abs_src_path=str(ROOT / "sample_outputs" / name)))
    return files
