"""Circuits found, not guessed: every edge of the residual graph scored by edge attribution patching (EAP, Syed
et al. 2023) or EAP with integrated gradients (EAP-IG, Hanna et al. 2024), and the circuits of the top edges
run as pruned models for their faithfulness curve (MIB, Mueller et al. 2025). attnviz.discover, `attnviz
discover`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TYPE_CHECKING

import numpy as np

from attnviz.api.models import borrows, resolve_model
from attnviz.api.patching.methods import DISCOVERY
from attnviz.api.result import Line, Result
from attnviz.base.arguments import checked
from attnviz.base.text import check_text, visible
from attnviz.errors import InputError, UsageError, arg
from attnviz.panels import short_model
from attnviz.progress import Reporter

if TYPE_CHECKING:
    from attnviz.engine.discovery_lean import Plan

__all__ = ["discover", "Discovery", "read_pairs", "DISCOVER_METHODS", "SHARES", "CURVE_TOLERANCE", "MAX_PAIRS"]

DISCOVER_METHODS = DISCOVERY.names()
SHARES = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # the curve's shares of the edges (MIB's)
CURVE_TOLERANCE = 1e-4  # |f(all edges) − 1|, |f(none)|, times the logit gap, over max(1, |LD|): float32 sums
FAITHFUL = 0.8  # the report names the smallest circuit on the curve that keeps this much
MAX_PAIRS = 1000  # --pairs: lines read at most
MAX_PAIRS_BYTES = 16 << 20  # --pairs: bytes read at most
MISMATCH_EXIT = 3


@dataclass(frozen=True)
class Discovery(Result):
    """Every edge of the residual graph scored, and the faithfulness curve of the circuits of its top edges.

    `nodes` and `receivers` name the graph (engine/discovery.py): input, a{l}.{h}, m{l}; each head's input
    a{l}.{h}.q / .k / .v (under grouped-query attention a key-value head's: a{l}.kv{g}.k), m{l}, logits.
    `scores` (receivers, nodes): (a_u^clean − a_u^corrupt) · ∂M/∂x_r summed over the pairs, 0 where node u
    writes after receiver r reads; M the logit difference of each pair's answers at the last position.
    `curve`: ((edges kept, faithfulness), …), faithfulness (Σ M_circuit − Σ M_corrupt) / (Σ M_clean −
    Σ M_corrupt) over the pairs, each circuit run with every edge outside it fed the corrupted run's
    contribution: 1 with every edge kept, 0 with none."""

    command: ClassVar[str] = "discover"
    model: str
    pairs: tuple[tuple[str, str, str, str], ...]  # (clean, corrupt, answer, other), each pair
    method: str
    steps: int  # EAP-IG's interpolation steps (0 for EAP)
    nodes: tuple[str, ...]
    receivers: tuple[str, ...]
    reach: tuple[int, ...]  # per receiver, the nodes that write before it reads (a prefix of nodes)
    scores: np.ndarray  # (receivers, nodes)
    curve: tuple[tuple[int, float], ...]
    clean_diff: float  # Σ over the pairs of M on the clean run
    corrupt_diff: float
    listed: int = 20
    lean: bool = False  # ran without α (engine/discovery_lean.py: the scoring would not fit the memory budget)

    figure_name: ClassVar[str] = "attnviz_discover.png"
    page_name: ClassVar[str] = "attnviz_discover.html"

    @property
    def total(self) -> int:
        """How many edges the graph has."""
        return int(sum(self.reach))

    @property
    def area(self) -> float:
        """The area under the curve over the share of edges kept (trapezoid, 0 to 1): MIB's measure of how
        little of the graph keeps the behaviour (1: the first edges keep all of it)."""
        x = np.array([n for n, _ in self.curve], np.float64) / max(1, self.total)
        y = np.array([f for _, f in self.curve], np.float64)
        return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))

    @property
    def passed(self) -> bool:
        """Every edge kept gives the clean runs and none the corrupted ones, within CURVE_TOLERANCE."""
        ends = {n: f for n, f in self.curve}
        gap = abs(self.clean_diff - self.corrupt_diff)
        bound = CURVE_TOLERANCE * max(1.0, abs(self.clean_diff), abs(self.corrupt_diff))
        return abs(ends[self.total] - 1.0) * gap <= bound and abs(ends[0]) * gap <= bound

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else MISMATCH_EXIT

    def edges(self, k: int | None = None) -> list[dict]:
        """The edges by |score|, highest first (ties in graph order): from, to, score; the first k (None: all)."""
        allowed = np.arange(len(self.nodes))[None, :] < np.array(self.reach)[:, None]
        magnitude = np.where(allowed, np.abs(self.scores), -1.0).ravel()
        order = np.argsort(-magnitude, kind="stable")[:self.total if k is None else min(k, self.total)]
        U = len(self.nodes)
        return [{"from": self.nodes[i % U], "to": self.receivers[i // U], "score": float(self.scores.flat[i])}
                for i in order]

    def smallest(self, level: float = FAITHFUL) -> tuple[int, float] | None:
        """The smallest circuit on the curve whose faithfulness reaches `level`: (edges, faithfulness)."""
        return next(((n, f) for n, f in self.curve if f >= level), None)

    def to_dict(self) -> dict:
        """What `attnviz discover --json` prints."""
        return {"model": self.model, "method": self.method, "steps": self.steps,
                "pairs": [{"clean": c, "corrupt": k, "answers": [a, b]} for c, k, a, b in self.pairs],
                "metric": "logit difference", "clean_logit_diff": self.clean_diff,
                "corrupt_logit_diff": self.corrupt_diff, "nodes": list(self.nodes), "edge_count": self.total,
                "edges": self.edges(), "curve": [{"edges": n, "faithfulness": f} for n, f in self.curve],
                "area": self.area, "passed": self.passed, "without_alpha": self.lean}

    def to_rows(self) -> list[dict]:
        return self.edges()

    def report(self, **style: Any) -> list:
        from attnviz.render.tables import records_table, verdict

        rows = [{"rank": n + 1, **e} for n, e in enumerate(self.edges(self.listed))]
        name = DISCOVERY.title(self.method) + (f", {self.steps} steps" if self.steps else "")
        shown = (f"{visible(self.pairs[0][2])!r} against {visible(self.pairs[0][3])!r}" if len(self.pairs) == 1
                 else f"{len(self.pairs)} pairs")
        items: list = [records_table(rows, [("rank", "rank", "d"), ("from", "from", ""), ("to", "to", ""),
                                            ("score", "score", "+.4f")],
                                     f"{short_model(self.model)}: the top {len(rows)} of {self.total:,} edges "
                                     f"({name}), {shown}", min_widths={"from": 6, "to": 9}),
                       records_table([{"edges": n, "share": n / max(1, self.total), "faithfulness": f}
                                      for n, f in self.curve],
                                     [("edges", "edges kept", ",d"), ("share", "share", ".1%"),
                                      ("faithfulness", "faithfulness", "+.3f")],
                                     "the circuit of the top edges, run (every other edge fed the corrupted run)")]
        found = self.smallest()
        items.append(Line(f"Area under the curve (MIB): {self.area:.3f}. "
                          + (f"The smallest circuit on the curve keeping {FAITHFUL:.0%} of the logit difference: "
                             f"{found[0]:,} edges ({found[0] / max(1, self.total):.1%}), faithfulness {found[1]:.3f}."
                             if found else f"No circuit on the curve short of every edge keeps {FAITHFUL:.0%}.")))
        ends = dict(self.curve)
        items.append(verdict(self.passed, f"every edge kept gives the clean run ({ends[self.total]:.6f}) and none the "
                                          f"corrupted run ({ends[0]:.6f}), tolerance {CURVE_TOLERANCE:.0e} of the "
                                          f"metric"))
        if self.lean:
            items.append(Line("Ran without α: the prompts' scoring would not fit the memory budget on the full path; "
                              "the model's own SDPA attention, each receiver's gradient made from the backward pass's "
                              "own (no copy of the stream per receiver), blocks recomputed as the budget needs",
                              style="dim"))
        over = "summed over the pairs" if len(self.pairs) > 1 else "of the pair"
        items.append(Line(f"logit difference {over}: clean {self.clean_diff:+.3f}, corrupted "
                          f"{self.corrupt_diff:+.3f}. score: (a clean − a corrupted) · ∂M/∂(the receiver's input), "
                          + ("at the clean run" if self.method == "eap" else
                             f"averaged over {self.steps} inputs from the corrupted to the clean embeddings")
                          + "; faithfulness: (M circuit − M corrupted) / (M clean − M corrupted). Nodes: input (the "
                          "embeddings), aL.H (head H of layer L), mL (layer L's MLP); a receiver adds .q, .k or .v "
                          "(aL.kvG.k: the key of group G under grouped-query attention), logits the output. "
                          "attnviz explain discover.", style="dim"))
        return items

    def figure(self, *, ax=None):
        from attnviz.render.charts import discovery_figure

        return discovery_figure(self, ax=ax)

    def html(self, *, command: str | None = None) -> str:
        """One self-contained page: the circuit and its curve (the figure, as SVG), the curve's table, and the
        top edges (`listed`) in a table a box filters by node name. Nothing is fetched from anywhere."""
        import html
        import io

        buffer = io.BytesIO()
        self.figure().savefig(buffer, format="svg")
        svg = buffer.getvalue().decode("utf-8")
        svg = svg[svg.index("<svg"):]
        curve = "".join(f"<tr><td>{n:,}</td><td>{n / max(1, self.total):.2%}</td><td>{f:.4f}</td></tr>"
                        for n, f in self.curve)
        edges = "".join(f"<tr><td>{k + 1}</td><td>{html.escape(e['from'])}</td><td>{html.escape(e['to'])}</td>"
                        f"<td>{e['score']:+.5f}</td></tr>" for k, e in enumerate(self.edges(self.listed)))
        pairs = "".join(f"<li>{html.escape(visible(c))} / {html.escape(visible(k))}: {html.escape(visible(a))!s} "
                        f"against {html.escape(visible(b))}</li>" for c, k, a, b in self.pairs[:20])
        more = f"<li>… and {len(self.pairs) - 20} more</li>" if len(self.pairs) > 20 else ""
        title = html.escape(f"{short_model(self.model)}: the circuit found ({self.method})")
        made = f"<p class=note>{html.escape(command)}</p>" if command else ""
        return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{title}</title>"
                "<meta http-equiv=Content-Security-Policy content=\"default-src 'none'; style-src 'unsafe-inline'; "
                "script-src 'unsafe-inline'; img-src data:\"><style>body{font:14px system-ui,sans-serif;margin:1.5em}"
                "table{border-collapse:collapse;margin:1em 0}td,th{padding:2px 10px;text-align:right}"
                "td:nth-child(2),td:nth-child(3){text-align:left}svg{max-width:100%;height:auto}"
                ".note{color:#666}</style></head><body>"
                f"<h1>{title}</h1>{made}<ul>{pairs}{more}</ul>"
                f"<p>{self.total:,} edges; area under the faithfulness curve {self.area:.3f}; "
                f"{'PASS' if self.passed else 'FAIL'}: every edge kept gives the clean run, none the corrupted one.</p>"
                f"{svg}<h2>Faithfulness curve</h2><table><tr><th>edges kept</th><th>share</th><th>faithfulness</th>"
                f"</tr>{curve}</table><h2>The top {min(self.listed, self.total)} edges</h2>"
                "<input id=find placeholder='a node, e.g. a23.4 or m0' oninput=\"const q=this.value.trim();"
                "for(const r of document.querySelectorAll('#edges tr.e'))r.hidden=q&&!r.textContent.includes(q)\">"
                "<table id=edges><tr><th>rank</th><th>from</th><th>to</th><th>score</th></tr>"
                + edges.replace("<tr>", "<tr class=e>") + "</table></body></html>")


def python_pairs(pairs: Any) -> list[tuple[str, str, tuple[str, str]]]:
    """`pairs=` from Python as the docs show it: a list (or tuple) of (clean, corrupt, (answer, other)) or of
    {"clean": …, "corrupt": …, "answers": [answer, other]} (the JSON-lines shape); anything else refused naming
    the pair and what it should be."""
    shape = "(clean, corrupt, (answer, other)) or {\"clean\": …, \"corrupt\": …, \"answers\": [A, B]}"
    if isinstance(pairs, (str, bytes, dict)) or not isinstance(pairs, (list, tuple)):
        raise UsageError(f"{arg('pairs')} takes a list of pairs, each {shape}, or a JSON-lines file's path; got "
                         f"{type(pairs).__name__}", "pairs")
    if not pairs:
        raise UsageError(f"{arg('pairs')} is empty: give at least one pair, {shape}", "pairs")
    if len(pairs) == 3 and all(isinstance(x, str) for x in pairs[:2]) and not isinstance(pairs[0], (tuple, list)):
        raise UsageError(f"{arg('pairs')} takes a list of pairs: put the one pair in a list, [{shape}]", "pairs")
    if len(pairs) > MAX_PAIRS:
        raise UsageError(f"{arg('pairs')} holds {len(pairs):,} pairs; at most {MAX_PAIRS:,}", "pairs")
    found = []
    for n, item in enumerate(pairs, 1):
        if isinstance(item, dict):
            clean, corrupt, answers = item.get("clean"), item.get("corrupt"), item.get("answers")
        elif isinstance(item, (list, tuple)) and len(item) == 3:
            clean, corrupt, answers = item
        else:
            raise UsageError(f"pair {n} is not {shape}", "pairs")
        if not (isinstance(clean, str) and isinstance(corrupt, str) and isinstance(answers, (list, tuple))
                and len(answers) == 2 and all(isinstance(a, str) for a in answers)):
            raise UsageError(f"pair {n} is not {shape}: its answers are two texts, each one token (not "
                             f"{visible(repr(answers))[:40]})", "pairs")
        found.append((clean, corrupt, (answers[0], answers[1])))
    return found


def read_pairs(path: str | Path, *, lines: bool = False):
    """--pairs FILE (- for standard input): JSON lines of {"clean": …, "corrupt": …, "answers": [A, B]} (blank
    lines skipped); a bad line is one error naming its number. At most MAX_PAIRS pairs and MAX_PAIRS_BYTES.
    `lines`: also each pair's label, "FILE line N", for the errors found later."""
    from attnviz.base.files import read_input

    data, name = read_input(None if str(path) == "-" else path, MAX_PAIRS_BYTES, "pairs")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{visible(name)} is not UTF-8 text (byte {exc.start})", "pairs") from None
    path = name
    pairs: list[tuple[str, str, tuple[str, str]]] = []
    labels: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{visible(str(path))} line {number}: not JSON ({exc.msg})", "pairs") from None
        if (not isinstance(item, dict) or not isinstance(item.get("clean"), str)
                or not isinstance(item.get("corrupt"), str) or not isinstance(item.get("answers"), list)
                or len(item["answers"]) != 2 or not all(isinstance(a, str) for a in item["answers"])):
            raise InputError(f"{visible(str(path))} line {number}: give {{\"clean\": TEXT, \"corrupt\": TEXT, "
                             f"\"answers\": [A, B]}}", "pairs")
        pairs.append((item["clean"], item["corrupt"], (item["answers"][0], item["answers"][1])))
        labels.append(f"{visible(str(path))} line {number}")
        if len(pairs) > MAX_PAIRS:
            raise InputError(f"{visible(str(path))} holds more than {MAX_PAIRS:,} pairs", "pairs")
    if not pairs:
        raise InputError(f"{visible(str(path))} holds no pair", "pairs")
    return (pairs, labels) if lines else pairs


@borrows
@checked
def discover(clean: str | None = None, corrupt: str | None = None, *, answers: Sequence[str] | None = None,
             pairs: Any = None, model: Any = None, tokenizer: Any = None, method: str = "eap-ig", steps: int = 5,
             top: int = 20, device: str = "auto", dtype: str = "float32",
             reporter: Reporter | None = None) -> Discovery:
    """Score every edge of a causal LM's residual graph for the difference between a clean and a corrupted
    prompt (as many tokens each), M the logit difference of `answers` (the answer, the other: one token each)
    at the last position; or over `pairs` ([(clean, corrupt, (answer, other)), …], or a JSON-lines file's
    path), the scores summed. `method` "eap" (the gradient at the clean run) or "eap-ig" (averaged over `steps`
    inputs between the corrupted and the clean embeddings). Then the faithfulness curve: the circuit of the top
    edges run for each share in SHARES. `top`: the edges the report lists."""
    chosen = DISCOVERY.get(method)()
    if not 1 <= steps <= 100:
        raise UsageError(f"{arg('steps')} takes a whole number from 1 to 100; got {steps}", "steps")
    if not 1 <= top <= 1000:
        raise UsageError(f"{arg('top')} takes a whole number from 1 to 1000; got {top}", "top")
    if pairs is not None and (clean is not None or corrupt is not None or answers is not None):
        raise UsageError(f"give the prompts and {arg('answers')}, or {arg('pairs')}, not both", "pairs")
    if pairs is None:
        if clean is None or corrupt is None or answers is None or len(answers) != 2:
            raise UsageError(f"give the clean prompt, the corrupted one and {arg('answers')} (two tokens), or "
                             f"{arg('pairs')}", "answers")
        given = [(clean, corrupt, (answers[0], answers[1]))]
    elif isinstance(pairs, (str, Path)):
        if not str(pairs).strip():
            raise UsageError(f"{arg('pairs')} is an empty path: give a JSON-lines file (- for standard input) or a "
                             f"list of pairs", "pairs")
        given, labels = read_pairs(pairs, lines=True)
    else:
        given = python_pairs(pairs)
    if pairs is None or not isinstance(pairs, (str, Path)):
        labels = [f"pair {n}" for n in range(1, len(given) + 1)]
    for label, (c, k, (a, b)) in zip(labels, given):
        check_text(c)
        check_text(k)
        if a == b:
            raise UsageError(f"{label}: the two answers must differ", "answers")
    loaded = resolve_model(model, tokenizer, device=device, dtype=dtype, lm_head=True)
    loaded.require_single("discover")
    from attnviz.api.attribution.logits import target_id
    from attnviz.engine.discovery import circuit_sums, graph, score_edges
    from attnviz.engine.forward import encode
    g = graph(loaded.model)
    prepared = []
    for label, (c, k, (a, b)) in zip(labels, given):
        first, second = encode(loaded, c), encode(loaded, k)
        if len(first.tokens) != len(second.tokens):
            where = f"{label}: " if len(given) > 1 or pairs is not None else ""
            raise InputError(f"{where}the prompts must have as many tokens: the clean one has {len(first.tokens)}, "
                             f"the corrupted one {len(second.tokens)}", "corrupt")
        ids = (target_id(loaded, a, "answers"), target_id(loaded, b, "answers"))
        prepared.append((first, second, (int(ids[0] or 0), int(ids[1] or 0))))
    longest = max(len(p[0].tokens) for p in prepared)
    plan = lean_path(loaded, g, longest, chosen.points(steps))
    reporter = reporter or Reporter()
    runs = [(first.inputs, second.inputs, ids) for first, second, ids in prepared]
    from attnviz.engine import discovery_lean

    with reporter.progress("Scoring edges", len(runs), "pairs") as step:
        if plan is None:
            scores, clean_sum, corrupt_sum = score_edges(g, runs, chosen.gradients(steps), step)
        else:
            scores, clean_sum, corrupt_sum = discovery_lean.score_edges(g, runs, steps if chosen.uses_steps else 0,
                                                                        plan, step)
    if abs(clean_sum - corrupt_sum) < 1e-6:
        raise InputError("the clean and corrupted prompts give the same logit difference: there is nothing to find; "
                         f"choose prompts that differ in what they predict, or other {arg('answers')}", "answers")
    total = g.edges()
    counts = sorted({int(round(share * total)) for share in SHARES})
    with reporter.progress("Faithfulness curve", len(runs) * len(counts), "runs") as step:
        if plan is None:
            sums = circuit_sums(g, runs, scores, counts, step)
        else:
            sums = discovery_lean.circuit_sums(g, runs, scores, counts, step, plan)
    gap = clean_sum - corrupt_sum
    curve = tuple((n, (sums[n] - corrupt_sum) / gap) for n in counts)
    shown = tuple((c, k, loaded.tokenizer.decode([right]), loaded.tokenizer.decode([wrong]))
                  for (c, k, _), (_, _, (right, wrong)) in zip(given, prepared))
    return Discovery(model=loaded.name, pairs=shown, method=method, steps=steps if chosen.uses_steps else 0,
                     nodes=tuple(g.nodes), receivers=tuple(g.receivers), reach=tuple(g.reach),
                     scores=scores, curve=curve, clean_diff=clean_sum, corrupt_diff=corrupt_sum, listed=top,
                     lean=plan is not None)


def lean_path(loaded: Any, g: Any, T: int, batch: int) -> Plan | None:
    """None where scoring the edges of T-token prompts fits the memory budget on the full path
    (engine.discovery); else the long path's plan (engine.discovery_lean.Plan: without α, no copy of the stream
    per receiver), checked part by part before anything runs. The budget's spare goes, in the curve (no stream
    kept, no gradients), to the corrupted run's record kept whole (else each circuit records it again), then to
    layers' heads' writes kept once made; in the scoring (no writes kept), to the recomputed blocks' attention
    outputs (engine/lean.py recomputing: per byte they save the most), then to more layers' receivers' gradients
    held and scored together, then to blocks kept whole."""
    from attnviz.engine.discovery import scoring_bytes
    from attnviz.engine.discovery_lean import layer_bytes, lean_parts, Plan, record_bytes, write_bytes
    from attnviz.engine.lean import attention_kept_bytes, recomputing
    from attnviz.engine.memory import check_parts, memory_budget

    budget = loaded.memory_budget or memory_budget()
    if sum(scoring_bytes(g, T, batch).values()) <= budget:
        return None
    parts, stream = lean_parts(g, T)
    check_parts(loaded, parts, f"scoring the edges of {T:,}-token prompts without α (the model's own SDPA "
                               f"attention; {len(g.layers)} layers)",
                "shorten the prompts (on this path the memory grows linearly in the tokens)")
    L = len(g.layers)
    block, writes, record = parts["one block's activations"], write_bytes(g, T), record_bytes(g, T)
    spare = budget - sum(parts.values())
    hold = spare + stream >= record  # the curve (no stream): the corrupted run's record kept whole
    cached = min(L, max(0, spare + stream - hold * record) // writes)
    kept = attention_kept_bytes(g.model.config, T)
    attention = min(L, spare // kept) * kept
    grouped = min(L, 1 + max(0, spare - attention) // layer_bytes(g, T))
    recomputed, keeping = recomputing(L, spare - (grouped - 1) * layer_bytes(g, T), block, kept)
    return Plan(recomputed=recomputed, keeping=keeping, group=grouped, cached=cached, hold=hold)
