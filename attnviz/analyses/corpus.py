"""corpus: head statistics over many texts (attnviz.corpus, attnviz corpus): an analysis of a model and a corpus,
on the corpus engine every --corpus option shares (attnviz.api.corpora)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.analyses import register
from attnviz.base.options import as_keywords, option

if TYPE_CHECKING:
    from attnviz.api.corpora import Corpus

SUMMARY = ("Head statistics over a corpus: every metric of the heads table per head, as mean and standard deviation "
           "over texts and token-weighted over query rows, pattern-label counts and per-layer mass on "
           "[CLS]/[SEP]/punctuation. Texts run in padded, length-sorted batches. `attnviz corpus merge DIR DIR… -o "
           "DIR` combines runs into what one run over all of them gives.")


@dataclass(frozen=True)
class Options:
    field: str | None = option(None, "JSON lines: the field holding the text (default: text). Implies --format "
                                     "jsonl.")
    format: str | None = option(None, "txt or jsonl: how to read the files (default: jsonl for .jsonl/.json or with "
                                      "--field, txt for .txt, else jsonl when the first line that holds text is a "
                                      "JSON object).", metavar="FORMAT", choices=("txt", "jsonl"),
                                aliases={"json": "jsonl", "ndjson": "jsonl", "text": "txt"})
    batch_size: int = option(32, "Texts per forward pass, 1 to 4,096 (fewer for long texts when the attention would "
                                 "pass the memory budget).", names=("-b",), minimum=1, maximum=4096, metavar="N")
    max_length: int | None = option(None, "Cut texts longer than this many tokens (counted in the summary). Default: "
                                          "the model's maximum.", minimum=2, metavar="TOKENS")
    out_dir: Path | None = option(None, "Write stats.json (mergeable), heads.csv/json, layers.csv and grid PNGs to "
                                        "this folder.", names=("--output", "-o"), folder=True)
    force: bool = option(False, "Replace an earlier attnviz folder in --out-dir (never other files).")
    words: bool = option(False, "Statistics of attention between words instead of sub-word tokens (as --words gives "
                                "for one text: to a word, the sum over its pieces; from a word, their mean).")
    weight: str = option("texts", "texts or tokens: what the table shows: means over texts, or token-weighted means "
                                  "over query rows.", metavar="WEIGHT", choices=("texts", "tokens"),
                         aliases={"text": "texts", "token": "tokens", "rows": "tokens"})
    top: int | None = option(None, "Show only the first N heads in the table.", minimum=1, metavar="N")
    engine: str = option("local", "local: this process; ray: Ray Data (pip install \"attnviz[ray]\"), a local Ray or "
                                  "--address.", metavar="ENGINE", choices=("local", "ray"))
    address: str | None = option(None, "Ray: the cluster to join (ray://host:10001, or auto for a `ray start` "
                                       "cluster on this machine). Default: start a local Ray.")
    workers: int = option(2, "Ray: model replicas (actors), each loading the model once (1 to 4,096).", minimum=1,
                          maximum=4096, metavar="N")


@register("corpus", Options, SUMMARY, reads="model")
def compute(model: Any, options: Options, texts: Any, files: Any = None) -> Corpus:
    from attnviz.api.corpora import corpus

    return corpus(texts, files=files, model=model, **as_keywords(options))
