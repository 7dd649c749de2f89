"""Circuits found (attnviz discover, attnviz.discover): the residual graph run edge by edge, each check against an
independent computation — the model's own forward pass (every receiver reading the live stream, every edge kept,
none kept), attribution patching of each head (its outgoing edges sum to it), the edge count from the graph's
shape, EAP-IG's batched steps against one step at a time, and EAP-IG with one step against EAP."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from helpers import build_tiny_model, one_line_error, require_real, run

import attnviz
from attnviz.engine import offline
from attnviz.errors import InputError

CLEAN = "The cat sat on the mat"
KINDS = ("gpt2", "llama", "qwen2")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made: dict = {}

    def folder(kind: str):
        if kind not in made:
            made[kind] = str(build_tiny_model(kind, tmp_path_factory.mktemp(kind) / kind, lm=kind != "bert", init=0.3))
        return made[kind]

    return folder


def loaded_of(folder):
    from attnviz.engine.models import load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load(folder, device="cpu", lm_head="auto")


def corrupt_for(loaded) -> str:
    """CLEAN with its animal changed, as many tokens for this tokenizer."""
    from attnviz.engine.forward import encode

    length = len(encode(loaded, CLEAN).tokens)
    for animal in ("dog", "cow", "hat", "rat", "bat", "pig", "mat"):
        text = CLEAN.replace("cat", animal)
        if text != CLEAN and len(encode(loaded, text).tokens) == length:
            return text
    raise AssertionError("no corrupted prompt of the clean one's length")


def answers_of(loaded) -> tuple[str, str]:
    """Two texts of one token each in the model's vocabulary."""
    found = []
    for i in range(5, len(loaded.tokenizer)):
        text = loaded.tokenizer.decode([i])
        if text and "," not in text and "'" not in text and loaded.tokenizer.encode(
                text, add_special_tokens=False) == [i]:
            found.append(text)
        if len(found) == 2:
            return found[0], found[1]
    raise AssertionError("no two single-token texts")


def runs(kind, folders):
    from attnviz.engine.discovery import graph
    from attnviz.engine.forward import encode

    loaded = loaded_of(folders(kind))
    return loaded, graph(loaded.model), encode(loaded, CLEAN), encode(loaded, corrupt_for(loaded))


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference over the larger of 1 and the largest value: float32 sums agree to ~1e-6 of it."""
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("kind", KINDS + ("mistral", "qwen3", "smollm3"))
def test_the_graph_runs_as_the_model_every_edge_kept_is_clean_none_is_corrupt(kind, folders):
    """Every receiver reading its own copy of the live stream gives the model's own logits; built edge by edge
    with every edge kept, the clean run's; with none kept, the corrupted run's (within 1e-5 of the logits' size:
    float32 sums of the same terms in another order)."""
    from attnviz.engine.discovery import run as graph_run

    loaded, g, clean, corrupt = runs(kind, folders)
    R, U = len(g.receivers), len(g.nodes)
    with torch.inference_mode():
        own_clean = loaded.model(**clean.inputs).logits[:, -1]
        own_corrupt = loaded.model(**corrupt.inputs).logits[:, -1]
        live = graph_run(g, clean.inputs)
        corrupted = graph_run(g, corrupt.inputs)
        every = graph_run(g, clean.inputs, keep=torch.ones(R, U), corrupt=corrupted)
        none = graph_run(g, clean.inputs, keep=torch.zeros(R, U), corrupt=corrupted)
    assert close(live.logits, own_clean) <= 1e-5 and close(corrupted.logits, own_corrupt) <= 1e-5
    assert close(every.logits, own_clean) <= 1e-5 and close(none.logits, own_corrupt) <= 1e-5
    assert close(own_clean, own_corrupt) > 1e-3  # the two runs differ, so the checks above can fail


@pytest.mark.parametrize("kind", KINDS)
def test_the_edges_are_counted_from_the_graphs_shape(kind, folders):
    """Into layer l's attention: every query, key and value input (H + 2G of them) from the input and the H heads
    and the MLP of each earlier layer; into its MLP, the same and its own heads; into the logits, every node."""
    loaded, g, _, _ = runs(kind, folders)
    L, H, G = len(g.layers), g.H, g.G
    expected = sum((H + 2 * G) * (1 + n * (H + 1)) + (1 + n * (H + 1) + H) for n in range(L)) + 1 + L * (H + 1)
    assert g.edges() == expected and len(g.nodes) == 1 + L * (H + 1) and len(g.receivers) == L * (H + 2 * G + 1) + 1


@pytest.mark.parametrize("kind", KINDS)
def test_a_heads_outgoing_edges_sum_to_its_attribution_patching(kind, folders):
    """EAP's scores of the edges leaving head h sum to (a_clean − a_corrupt) · ∂M/∂a_h, which is attribution
    patching of the head at the clean run (patch's AtP, noising: corrupt into clean, the opposite sign): the
    gradient of M reaches a head's output only through the receivers after it. Within 1e-5 of the largest."""
    from attnviz.api.patching.prompts import Metric
    from attnviz.engine.ablation import site
    from attnviz.engine.discovery import edge_scores, receiver_gradients, run as graph_run
    from attnviz.engine.patching import attributed, donor_run

    loaded, g, clean, corrupt = runs(kind, folders)
    ids = [loaded.tokenizer.encode(a, add_special_tokens=False)[0] for a in answers_of(loaded)]

    def metric(logits):
        return logits[:, ids[0]].double() - logits[:, ids[1]].double()

    with torch.inference_mode():
        clean_run, corrupt_run = graph_run(g, clean.inputs), graph_run(g, corrupt.inputs)
    scores = edge_scores(g, clean_run, corrupt_run, receiver_gradients(g, clean.inputs, metric))
    where = site(loaded.model)
    heads, _, _ = attributed(where, clean.inputs, donor_run(where, corrupt.inputs), range(len(clean.tokens)),
                             Metric(answers=(ids[0], ids[1])).tensor)
    atp = heads.sum(1)  # (L, H): corrupt into clean
    summed = torch.tensor([[float(scores[:, g.head_node(n, h)].sum()) for h in range(g.H)]
                           for n in range(len(g.layers))], dtype=torch.float64)
    assert float(atp.abs().max()) > 1e-3
    assert float((summed + atp).abs().max()) <= 1e-5 * max(1.0, float(atp.abs().max()))
    reach = torch.tensor(g.reach)
    assert bool((scores[torch.arange(len(g.nodes))[None, :] >= reach[:, None]] == 0).all())  # no edge backwards


def test_eap_ig_steps_batched_equal_one_at_a_time_and_one_step_is_eap(folders):
    """EAP-IG runs its steps as one batch; the gradients equal those of each step run alone, summed (float32
    within 1e-5 of the largest). With one step (α = 1, the clean embeddings) EAP-IG is EAP."""
    from attnviz.engine.discovery import receiver_gradients, run as graph_run

    loaded, g, clean, corrupt = runs("llama", folders)
    ids = [loaded.tokenizer.encode(a, add_special_tokens=False)[0] for a in answers_of(loaded)]

    def metric(logits):
        return logits[:, ids[0]].double() - logits[:, ids[1]].double()

    with torch.inference_mode():
        start, end = graph_run(g, corrupt.inputs).outputs[0], graph_run(g, clean.inputs).outputs[0]
    steps = 4
    embeddings = torch.cat([start + (k / steps) * (end - start) for k in range(1, steps + 1)])
    batch = {key: value.expand(steps, *value.shape[1:]) for key, value in clean.inputs.items()}
    together = receiver_gradients(g, batch, metric, embeddings=embeddings)
    alone = sum(receiver_gradients(g, clean.inputs, metric, embeddings=embeddings[k:k + 1]) for k in range(steps))
    assert float((together - alone).abs().max()) <= 1e-5 * max(1.0, float(alone.abs().max()))
    answers = answers_of(loaded)
    eap = attnviz.discover(CLEAN, corrupt_for(loaded), answers=answers, model=loaded, method="eap")
    one = attnviz.discover(CLEAN, corrupt_for(loaded), answers=answers, model=loaded, method="eap-ig", steps=1)
    np.testing.assert_allclose(one.scores, eap.scores, rtol=0, atol=1e-6 * max(1.0, float(np.abs(eap.scores).max())))
    assert one.steps == 1 and eap.steps == 0


def test_the_curve_runs_the_circuits_and_ends_at_both_runs(folders):
    """The curve: 0 edges and every edge among its points, in order, ending at 0 and 1 (passed); the share of
    edges in SHARES; the listed edges by |score|; the area by the trapezoid rule over the shares, computed here
    again; every edge in the JSON once. The borrowed model gets back no hook and no gradient."""
    from attnviz.api.patching.discovery import SHARES

    folder = folders("gpt2")
    loaded = loaded_of(folder)
    before = [(name, p.requires_grad) for name, p in loaded.model.named_parameters()]
    result = attnviz.discover(CLEAN, corrupt_for(loaded), answers=answers_of(loaded), model=loaded, steps=3)
    counts = [n for n, _ in result.curve]
    assert counts == sorted({round(s * result.total) for s in SHARES}) and counts[0] == 0 and counts[-1] == result.total
    assert result.passed and abs(result.curve[0][1]) < 1e-4 and abs(result.curve[-1][1] - 1) < 1e-4
    x = np.array(counts) / result.total
    y = np.array([f for _, f in result.curve])
    assert result.area == pytest.approx(float(np.trapezoid(y, x)), abs=1e-12)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["edge_count"] == result.total == len(data["edges"])
    magnitudes = [abs(e["score"]) for e in data["edges"]]
    assert magnitudes == sorted(magnitudes, reverse=True)
    assert len({(e["from"], e["to"]) for e in data["edges"]}) == result.total
    assert [(name, p.requires_grad) for name, p in loaded.model.named_parameters()] == before
    assert all(p.grad is None for p in loaded.model.parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in loaded.model.modules())


def test_discover_from_the_command_line(folders, tmp_path):
    """TEXT, - and --text-file agree; --pairs sums over pairs (two copies of one pair: the same edges, doubled
    scores); --csv is every edge; -o and --html are written; the report names the top edge and the check."""
    folder = folders("llama")
    loaded = loaded_of(folder)
    a, b = answers_of(loaded)
    corrupt = corrupt_for(loaded)
    pair = f"'{a}','{b}'"
    path = tmp_path / "clean.txt"
    path.write_text(CLEAN, encoding="utf-8")
    given = json.loads(run("discover", CLEAN, corrupt, "-m", folder, "--answers", pair, "--json").stdout)
    piped = json.loads(run("discover", "-", corrupt, "-m", folder, "--answers", pair, "--json", input=CLEAN).stdout)
    filed = json.loads(run("discover", "--text-file", path, corrupt, "-m", folder, "--answers", pair,
                           "--json").stdout)
    assert given == piped == filed and given["passed"] and given["method"] == "eap-ig" and given["steps"] == 5
    assert given["pairs"] == [{"clean": CLEAN, "corrupt": corrupt, "answers": [a, b]}]
    lines = tmp_path / "pairs.jsonl"
    lines.write_text("\n".join(json.dumps({"clean": CLEAN, "corrupt": corrupt, "answers": [a, b]})
                               for _ in range(2)) + "\n", encoding="utf-8")
    twice = json.loads(run("discover", "--pairs", lines, "-m", folder, "--json").stdout)
    first = {(e["from"], e["to"]): e["score"] for e in given["edges"]}
    assert all(e["score"] == pytest.approx(2 * first[(e["from"], e["to"])], abs=1e-9) for e in twice["edges"])
    assert [c["faithfulness"] for c in twice["curve"]] == pytest.approx([c["faithfulness"] for c in given["curve"]],
                                                                       abs=1e-9)
    csv = run("discover", CLEAN, corrupt, "-m", folder, "--answers", pair, "--csv").stdout.splitlines()
    assert csv[0] == "from,to,score" and len(csv) == 1 + given["edge_count"]
    shown = run("discover", CLEAN, corrupt, "-m", folder, "--answers", pair, "--method", "eap", "-o",
                tmp_path / "c.png", "--html", tmp_path / "c.html", env={"COLUMNS": "120", "NO_COLOR": "1"})
    assert shown.exit_code == 0 and "PASS" in shown.stdout and (tmp_path / "c.png").is_file()
    page = (tmp_path / "c.html").read_text(encoding="utf-8")
    top = json.loads(run("discover", CLEAN, corrupt, "-m", folder, "--answers", pair, "--method", "eap",
                         "--json").stdout)["edges"][0]
    assert top["from"] in shown.stdout and "<svg" in page and f"<td>{top['from']}</td>" in page


@pytest.mark.parametrize("args,message", [
    (["--pairs", "{bad}"], "line 2"),
    (["--method", "fast"], "--method"),
])
def test_what_discover_refuses_in_one_line(args, message, folders, tmp_path):
    folder = folders("llama")
    loaded = loaded_of(folder)
    a, b = answers_of(loaded)
    if args[0] == "--pairs":
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"clean": CLEAN, "corrupt": corrupt_for(loaded), "answers": [a, b]}) + "\n{\n",
                       encoding="utf-8")
        printed = run("discover", "--pairs", bad, "-m", folder)
        assert message in one_line_error(printed)
    else:
        printed = run("discover", CLEAN, corrupt_for(loaded), "-m", folder, "--answers", f"'{a}','{b}'", *args)
        assert message in one_line_error(printed, 2)


def test_discover_refuses_what_it_cannot_read(folders, tmp_path):
    """Prompts of different lengths, an answer of several tokens, an encoder, a block with a norm after attention
    (Gemma 2), a --pairs file that is not UTF-8 or holds no pair: one line each, exit 1."""
    folder = folders("llama")
    loaded = loaded_of(folder)
    a, b = answers_of(loaded)
    longer = run("discover", CLEAN, CLEAN + " and the dog", "-m", folder, "--answers", f"'{a}','{b}'")
    assert "as many tokens" in one_line_error(longer)
    several = run("discover", CLEAN, corrupt_for(loaded), "-m", folder, "--answers", f"'{a}','{a}{b} {a}'")
    assert "tokens" in one_line_error(several)
    encoder = run("discover", CLEAN, CLEAN.replace("cat", "dog"), "-m", folders("bert"), "--answers", "'a','b'")
    one_line_error(encoder)
    gemma = loaded_of(folders("gemma2"))
    g_a, g_b = answers_of(gemma)
    post_norm = run("discover", CLEAN, corrupt_for(gemma), "-m", folders("gemma2"), "--answers", f"'{g_a}','{g_b}'")
    assert "gemma2" in one_line_error(post_norm)
    binary = tmp_path / "pairs.bin"
    binary.write_bytes(b"\xff\xfe\x00{")
    assert "UTF-8" in one_line_error(run("discover", "--pairs", binary, "-m", folder))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    assert "no pair" in one_line_error(run("discover", "--pairs", empty, "-m", folder))
    many = tmp_path / "many.jsonl"
    many.write_text((json.dumps({"clean": CLEAN, "corrupt": CLEAN, "answers": [a, b]}) + "\n") * 1001,
                    encoding="utf-8")
    assert "1,000" in one_line_error(run("discover", "--pairs", many, "-m", folder))
    both = run("discover", CLEAN, corrupt_for(loaded), "--pairs", empty, "-m", folder)
    assert "--pairs" in one_line_error(both, 2)


def test_discover_finds_the_head_patch_finds_on_smollm2():
    """SmolLM2, "The capital of France is" / "… Italy is", ' Paris' against ' Rome': EAP-IG's top edges hold head
    23.4 writing to the logits (the head exact patching finds, test_patching), and the circuit of 1 % of the
    70,651 edges keeps at least 80 % of the logit difference; every edge gives the clean run."""
    require_real(offline.SMOLLM2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = attnviz.discover("The capital of France is", "The capital of Italy is", answers=(" Paris", " Rome"),
                                  model="smollm2")
    assert result.passed and result.total == 70_651
    assert {"from": "a23.4", "to": "logits"} in [{k: e[k] for k in ("from", "to")} for e in result.edges(5)]
    assert dict(result.curve)[round(0.01 * result.total)] >= 0.8


def test_an_encoder_is_refused_before_the_missing_answers_and_before_it_loads(monkeypatch):
    """`discover CLEAN CORRUPT` on the default model (an encoder) says first that it needs a causal LM (exit 1),
    not "give the two answers" (exit 2), and says so from the config, before any weights load; --help says it."""
    import attnviz.engine.models as models

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load", no_load)  # what load_model and resolve_model call
    for args in ([CLEAN, "The dog sat on the mat"], ["--pairs", "-"]):
        line = one_line_error(run("discover", *args))
        assert "needs a causal language model" in line and "minilm is an encoder" in line
    assert "causal language model" in " ".join(run("discover", "--help", env={"COLUMNS": "200"}).stdout.split())


def test_a_pair_of_unequal_lengths_in_a_file_names_its_line(folders, tmp_path):
    folder = folders("llama")
    loaded = loaded_of(folder)
    a, b = answers_of(loaded)
    lines = [{"clean": CLEAN, "corrupt": corrupt_for(loaded), "answers": [a, b]},
             {"clean": CLEAN, "corrupt": CLEAN + " and the dog", "answers": [a, b]}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    assert "line 2: the prompts must have as many tokens" in one_line_error(run("discover", "--pairs", path, "-m",
                                                                                folder))


def test_every_shape_of_pairs_the_docs_show_is_taken_and_every_other_refused(folders):
    """From Python: a list of (clean, corrupt, (answer, other)) and a list of the JSON-lines dicts give the same
    result; [], a bare pair, a two-item pair, pairs=5 and answers given as one string (which became " " and "P")
    are refused naming the pair."""
    from attnviz.errors import UsageError

    folder = folders("llama")
    loaded = loaded_of(folder)
    a, b = answers_of(loaded)
    corrupt = corrupt_for(loaded)
    as_tuples = attnviz.discover(pairs=[(CLEAN, corrupt, (a, b))], model=folder, method="eap").to_dict()
    as_dicts = attnviz.discover(pairs=[{"clean": CLEAN, "corrupt": corrupt, "answers": [a, b]}], model=folder,
                                method="eap").to_dict()
    assert as_tuples["edges"] == as_dicts["edges"] and as_tuples["edges"]
    for bad, words in (([], "empty"), ((CLEAN, corrupt, (a, b)), "put the one pair in a list"),
                       ([(CLEAN, corrupt)], "pair 1 is not"), (5, "got int"),
                       ([(CLEAN, corrupt, " Paris")], "pair 1 is not"), ("", "empty path")):
        with pytest.raises(UsageError, match=words):
            attnviz.discover(pairs=bad, model=folder)


@pytest.mark.parametrize("method, steps", [("eap", 1), ("eap-ig", 3)])
def test_over_the_full_paths_estimate_discover_runs_without_alpha(method, steps, folders):
    """The check before the run counts what the full path's scoring holds (the per-receiver copies of the inputs
    in the run that takes gradients, the model's activations for the backward pass, the gradients in float64),
    not α alone: within that estimate the full path runs; a byte under it, the long path (engine/discovery_lean:
    no copy per receiver, no α), with the same scores; under the long path's own parts, one line naming them.
    (The old check counted α alone: SmolLM2 on two 213-token prompts passed at 1.82 GB and grew to 4.6 GB.)"""
    from attnviz.engine.discovery import graph, scoring_bytes
    from attnviz.engine.discovery_lean import lean_parts
    from attnviz.engine.memory import attention_bytes

    loaded = loaded_of(folders("llama"))
    g = graph(loaded.model)
    corrupt = corrupt_for(loaded)
    T = len(loaded.tokenizer(CLEAN)["input_ids"])
    need = sum(scoring_bytes(g, T, steps).values())
    assert need > 4 * attention_bytes(loaded, T, 2.0 * (g.per_layer + 1) + steps)  # more than α's copies
    loaded.memory_budget = need
    full = attnviz.discover(CLEAN, corrupt, answers=answers_of(loaded), model=loaded, method=method, steps=steps)
    loaded.memory_budget = need - 1
    long = attnviz.discover(CLEAN, corrupt, answers=answers_of(loaded), model=loaded, method=method, steps=steps)
    assert not full.lean and long.lean and full.total == long.total == g.edges()
    assert np.abs(full.scores - long.scores).max() <= 1e-4 * np.abs(full.scores).max()
    loaded.memory_budget = sum(lean_parts(g, T)[0].values()) - 1
    with pytest.raises(InputError, match=rf"{T}-token prompts without α .*changes at every node"):
        attnviz.discover(CLEAN, corrupt, answers=answers_of(loaded), model=loaded, method=method, steps=steps)


def test_smollm2_s_long_pair_runs_without_alpha_within_the_budget():
    """The case that was killed at 4.6 GB: two 213-token prompts, SmolLM2. The full path's estimate (EAP about
    2.3 GiB, measured about 2.1 GB by benchmarks/bench_discover_memory.py) is over the 2 GiB budget, so discover
    takes the long path, whose check passes (every edge kept gives the clean run, none the corrupted one). On
    real weights the long path's scores equal the full path's (a shorter pair, the budget a byte under the full
    path's estimate): within 2e-4 of the largest (float32, eager and SDPA summing in different orders)."""
    from attnviz.engine.discovery import graph, scoring_bytes

    require_real(offline.SMOLLM2)
    sentence = "The quick brown fox jumps over the lazy dog and then "
    loaded = attnviz.load_model("smollm2", lm_head=True)

    def pair_of(T: int) -> tuple[str, str]:
        words, ask = (sentence * 40).split(), " When John and Mary went to the store, John gave a drink to"
        clean = " ".join(words[:1])
        while len(loaded.tokenizer(clean + ask)["input_ids"]) < T:
            clean = " ".join(words[:len(clean.split()) + 1])
        clean += ask
        corrupt = clean.replace("When John", "When Anna")
        assert len(loaded.tokenizer(clean)["input_ids"]) == len(loaded.tokenizer(corrupt)["input_ids"]) >= T
        return clean, corrupt

    long = attnviz.discover(*pair_of(213), answers=(" Mary", " John"), model=loaded, method="eap")
    assert long.lean and long.passed
    clean, corrupt = pair_of(40)
    T = len(loaded.tokenizer(clean)["input_ids"])
    need = sum(scoring_bytes(graph(loaded.model), T).values())
    loaded.memory_budget = need
    full = attnviz.discover(clean, corrupt, answers=(" Mary", " John"), model=loaded, method="eap")
    loaded.memory_budget = need - 1
    short = attnviz.discover(clean, corrupt, answers=(" Mary", " John"), model=loaded, method="eap")
    assert short.lean and not full.lean
    assert np.abs(full.scores - short.scores).max() <= 2e-4 * np.abs(full.scores).max()
    gap = full.clean_diff - full.corrupt_diff
    for (_, f), (_, g) in zip(full.curve, short.curve):  # the circuits' logit differences
        assert abs(f - g) * abs(gap) <= 1e-3 * max(1.0, abs(full.clean_diff))
