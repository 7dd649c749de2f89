"""The folder `attnviz corpus -o` writes: stats.json (the mergeable state), heads.csv/heads.json (every head:
mean and standard deviation over texts and token-weighted), layers.csv (Clark-style per-layer mass), bad_lines.csv
and grid pictures: entropy, special-token mass, previous-token score and pattern-label shares."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attnviz.corpora import STATE_FILE, CorpusState
from attnviz.base.files import write_folder
from attnviz.metrics import LABELS, uniform_entropy
from attnviz.panels import entropy_panel, head_grid_panel, label_share_page, Page, Panel, Scale, short_model
from attnviz.base.records import to_csv, to_json
from attnviz.render.png import mixed_figure, panel_figure, save_figure


def corpus_pictures(state: CorpusState) -> dict[str, Panel | Page]:
    """file name -> Page or Panel of the grid pictures."""

    model = short_model(state.model)
    over = f"over {state.texts:,} texts{' (partial)' if state.partial else ''}"
    mean_len = state.tokens / max(state.texts, 1)
    pictures: dict[str, Panel | Page] = {}
    if "entropy" in state.metrics:
        pictures["entropy.png"] = entropy_panel(state.grid("entropy"), uniform_entropy(max(round(mean_len), 2)),
                                                state.model, title=f"mean attention entropy per head, {over} "
                                                                   f"(ln of the mean length as uniform)")
    special = [name for name in ("start_mass", "end_mass") if name in state.metrics]
    if special:
        mass = sum(np.nan_to_num(state.grid(name)) for name in special)
        pictures["special.png"] = head_grid_panel(mass, Scale(0.0, 1.0, "weight on [CLS]/[SEP] (BOS/EOS)"),
                                                  f"{model} · mean weight on special tokens, {over}", "special")
    if "prev" in state.metrics:
        pictures["prev.png"] = head_grid_panel(np.nan_to_num(state.grid("prev")), Scale(0.0, 1.0, "α_i,i−1"),
                                               f"{model} · previous-token score, {over}", "prev")
    pictures["labels.png"] = label_share_page(state.label_counts, LABELS,
                                              f"{model} · pattern labels: share of texts per head, {over}")
    return pictures


def write_corpus_folder(state: CorpusState, out_dir: str | Path, force: bool = False) -> Path:
    """Write every file of a corpus run into `out_dir`, atomically (see export.write_folder)."""

    def fill(staging: Path) -> None:
        (staging / STATE_FILE).write_text(json.dumps(state.to_json(), ensure_ascii=False, allow_nan=False) + "\n",
                                          encoding="utf-8")
        records = state.records()
        meta = {"summary": state.summary(), "weightings": WEIGHTING_NOTE, "heads": records}
        (staging / "heads.json").write_text(to_json(meta, indent=1) + "\n", encoding="utf-8")
        (staging / "heads.csv").write_text(to_csv(records), encoding="utf-8")
        (staging / "layers.csv").write_text(to_csv(state.layer_records()), encoding="utf-8")
        if state.bad_lines:
            rows = [{"source": s, "line": n, "reason": r} for s, n, r in state.bad_lines]
            (staging / "bad_lines.csv").write_text(to_csv(rows), encoding="utf-8")
        if state.texts:
            for name, picture in corpus_pictures(state).items():
                if isinstance(picture, Page):
                    figure = mixed_figure(picture, ncols=4)
                else:
                    figure = panel_figure(picture)
                save_figure(figure, staging / name, dpi=100)
                figure.figure.clear()

    return write_folder(out_dir, force, fill, what="corpus statistics")


WEIGHTING_NOTE = ("<metric>, <metric>_std: mean and sample standard deviation over texts, each text's value being "
                  "what `attnviz heads` shows for it; <metric>_tokens, <metric>_tokens_std: token-weighted, every "
                  "query row of every text one sample (column metrics such as vertical and sink: the text's value, "
                  "counted once per row). label: the most frequent pattern label, label_share its share of texts, "
                  "label_<name>: texts that gave each label.")
