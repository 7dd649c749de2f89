"""What a corpus run reports: the table of every head (mean ± sd), and the summary lines.
"""

from __future__ import annotations



from attnviz.metrics import all_metrics
from attnviz.corpora.lines import MAX_BAD_LISTED
from attnviz.corpora.state import CorpusState


def table_records(state: CorpusState, weighting: str = "texts") -> list[dict]:
    """Records shaped like the heads table's (layer, head, each metric, label), holding the means over texts
    or the token-weighted means; top_key, which has no mean, is "–"; the label is the most frequent one."""
    suffix = "" if weighting == "texts" else "_tokens"
    out = []
    for record in state.records():
        row: dict = {"layer": record["layer"], "head": record["head"]}
        for m in all_metrics():
            if m.kind == "text":
                row[m.name] = "–"
            elif m.name in record:
                row[m.name] = record[m.name + suffix]
        row["label"] = record["label"]
        out.append(row)
    return out


def summary_lines(state: CorpusState, shown_bad: int = 10) -> list[str]:
    """What a run read, in words: texts, tokens, truncation, and the bad lines by number."""
    unit = "words" if state.level == "word" else "tokens"
    lines = [f"{state.texts:,} texts, {state.tokens:,} {unit} from {state.lines:,} lines"
             + (f"; {state.truncated:,} cut at {state.max_length} tokens" if state.truncated else "")
             + ("; PARTIAL (stopped early)" if state.partial else "")]
    if state.unknown:
        have = "text has" if state.unknown == 1 else "texts have"
        lines.append(f"{state.unknown:,} {have} words {state.model} does not know (its unknown-word token stands "
                     f"for them, so they carry no meaning here); a multilingual model reads them")
    if state.bad:
        reasons = ", ".join(f"{count:,} {reason}" for reason, count in sorted(state.bad.items(), key=lambda x: -x[1]))
        lines.append(f"{state.bad_total:,} lines skipped: {reasons}")
        for source, number, reason in state.bad_lines[:shown_bad]:
            lines.append(f"  {source}:{number}: {reason}")
        if state.bad_total > shown_bad:
            lines.append(f"  … {state.bad_total - shown_bad:,} more (bad_lines.csv in the -o folder lists up to "
                         f"{MAX_BAD_LISTED})")
    return lines
