"""attnviz corpus: batched statistics equal the single-text path, mergeable moments, bad lines, outputs, Ray."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import one_line_error, run
from hypothesis import given, settings
from hypothesis import strategies as st

from attnviz.corpora import CorpusState, Line, Moments, load_state, read_lines

TEXTS = ["The cat sat on the mat.", "Dogs bark", "A much longer sentence, with commas, runs on and on until it stops.",
         "Hi", "고양이가 매트 위에 앉았다.", "Birds sing over the green hills while the river flows by the town.",
         "One more, short.", "Is this the last one? No."]
ENCODERS = ("bert", "roberta", "distilbert")
CAUSAL = ("gpt2", "llama")


def _runner(loaded, **kwargs):
    from attnviz.engine.corpora.run import BatchRunner

    return BatchRunner(loaded, **kwargs)


def _lines(texts, source="t.txt"):
    return [Line(source, n + 1, t) for n, t in enumerate(texts)]


def _per_text(loaded, texts, batch_size):
    """Each text's statistics as the batched path computes them, by line number."""
    runner = _runner(loaded, batch_size=batch_size)
    ready, bad = runner.prepare(_lines(texts))
    assert not bad
    out = {}
    for batch in runner.batches(ready):
        for p, stats in zip(batch, runner.run(batch)):
            out[p.line.number] = stats
    return out


@pytest.mark.parametrize("kind", ENCODERS + CAUSAL)
def test_a_text_gives_the_same_numbers_alone_as_in_a_padded_batch(kind, load_tiny):
    """Every metric of every head, for each text, from a padded batch of 8 mixed lengths equals what
    `attnviz heads` computes for the text alone (the single-text path: its own forward pass), to 1e-5."""
    from attnviz.engine.forward import capture_text
    from attnviz.metrics import head_values

    loaded = load_tiny(kind)
    batched = _per_text(loaded, TEXTS, batch_size=8)
    assert len(batched) == len(TEXTS)
    worst = 0.0
    for n, text in enumerate(TEXTS, start=1):
        alone = head_values(capture_text(text, loaded))
        stats = batched[n]
        assert stats.tokens == capture_text(text, loaded).n_tokens
        for name, value in stats.values.items():
            expected = alone[name]
            assert np.array_equal(np.isnan(value), np.isnan(expected)), (name, text)
            worst = max(worst, float(np.nanmax(np.abs(value - expected))) if np.isfinite(value).any() else 0.0)
    assert worst < 1e-5, worst


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_word_level_statistics_equal_the_single_text_words_path(kind, load_tiny, tmp_path):
    """--words: each text's word-level statistics from the padded batch equal `attnviz heads TEXT --words`
    (to_words of the text's own capture), to 1e-5; merging a word-level run with a token-level one is refused."""
    from attnviz.engine.forward import capture_text
    from attnviz.metrics import head_values
    from attnviz.data.words import to_words

    loaded = load_tiny(kind)
    runner = _runner(loaded, batch_size=8, words=True)
    ready, _ = runner.prepare(_lines(TEXTS))
    worst, seen, merged_pieces = 0.0, 0, 0
    for batch in runner.batches(ready):
        for p, stats in zip(batch, runner.run(batch)):
            words = to_words(capture_text(p.line.text, loaded))
            alone = head_values(words)
            assert stats.tokens == words.n_tokens <= len(p.ids)
            merged_pieces += words.n_tokens < len(p.ids)
            for name, value in stats.values.items():
                if np.isfinite(value).any():
                    worst = max(worst, float(np.nanmax(np.abs(value - alone[name]))))
            seen += 1
    assert seen == len(TEXTS) and worst < 1e-5, worst
    assert merged_pieces >= 1  # some text really has words of several pieces
    state = runner.new_state()
    assert state.level == "word"
    other = _runner(loaded).new_state()
    assert "level" in (state.compatible(other) or "")


def test_the_batch_really_is_padded(load_tiny):
    """The invariance test above means something only if its batch mixes lengths (padding inside)."""
    runner = _runner(load_tiny("bert"), batch_size=8)
    ready, _ = runner.prepare(_lines(TEXTS))
    batches = list(runner.batches(ready))
    assert len(batches) == 1
    lengths = [len(p.ids) for p in batches[0]]
    assert max(lengths) > 2 * min(lengths)
    assert lengths == sorted(lengths)  # length-sorted

@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_statistics_of_a_batch_do_not_depend_on_how_it_is_cut(kind, load_tiny, monkeypatch):
    """texts_stats runs the metrics on the rows of several texts at once, in chunks of ROWS_BYTES. Every
    text's values, row moments and labels are the same whether the whole batch is one chunk, each text is
    its own chunk, or each layer of each text is (1e-9), and the same as each text computed alone through
    text_stats; pack and unpack give each text's α back exactly."""
    import attnviz.corpora.texts as corpus
    from attnviz.corpora import pack, text_stats, texts_stats, unpack
    from attnviz.engine.forward import capture_text
    from attnviz.metrics import Tokens

    loaded = load_tiny(kind)
    runner = _runner(loaded)
    captures = [capture_text(text, loaded) for text in TEXTS]
    alphas = [c.attentions for c in captures]
    tokens = [Tokens.of(c) for c in captures]
    lengths = [a.shape[-1] for a in alphas]
    packed = pack(alphas)
    starts = np.cumsum([0, *lengths])
    for a, start, n in zip(alphas, starts, lengths):
        assert np.array_equal(unpack(packed, int(start), n, a.shape[1]), a)
    H = alphas[0].shape[1]
    whole = texts_stats(packed, lengths, tokens, H, runner.metrics)
    cuts = []
    for budget in (1, max(lengths) ** 2 * H * 8 * 2):  # one layer of one text at a time; a text, all layers
        monkeypatch.setattr(corpus, "ROWS_BYTES", budget)
        cuts.append(texts_stats(packed, lengths, tokens, H, runner.metrics))
    alone = [text_stats(a, t, runner.metrics) for a, t in zip(alphas, tokens)]
    for other in (*cuts, corpus.BatchStats.stack(alone)):
        assert np.array_equal(other.labels, whole.labels)
        assert np.array_equal(other.tokens, lengths)
        for name in whole.values:  # the weights in [0, 1] are summed in float32 (within about 1e-7), the rest in
            # float64; how a batch is cut changes only how BLAS blocks the float32 sums
            assert np.allclose(other.values[name], whole.values[name], rtol=0, atol=1e-6, equal_nan=True), name
            for got, want in zip(other.rows[name], whole.rows[name]):
                assert np.allclose(got, want, rtol=0, atol=1e-6, equal_nan=True), name



def test_token_weighted_moments_equal_a_direct_computation_over_all_rows(load_tiny):
    """The tokens weighting: mean and sample std over every query row of every text, computed here from each
    text's own capture with numpy (row entropy, α_i,i−1), against the state's moments."""
    from attnviz.engine.corpora.run import run_local
    from attnviz.engine.forward import capture_text
    from attnviz.metrics import row_entropy

    loaded = load_tiny("gpt2")
    runner = _runner(loaded, batch_size=3)
    state = runner.new_state()
    assert run_local(runner, _lines(TEXTS), state)
    entropies, prevs = [], []
    for text in TEXTS:
        alpha = capture_text(text, loaded).attentions.astype(np.float64)  # (L, H, T, T)
        entropies.append(row_entropy(alpha))  # (L, H, T)
        T = alpha.shape[-1]
        prevs.append(alpha[..., np.arange(1, T), np.arange(0, T - 1)])  # (L, H, T-1)
    for name, rows in (("entropy", entropies), ("prev", prevs)):
        every = np.concatenate(rows, axis=-1)
        got = state.moments["tokens"][name]
        assert np.allclose(got.count, every.shape[-1])
        assert np.allclose(got.means(), every.mean(axis=-1), atol=1e-5)
        assert np.allclose(got.std(), every.std(axis=-1, ddof=1), atol=1e-5)
    texts = state.moments["texts"]["entropy"]
    per_text = np.stack([r.mean(axis=-1) for r in entropies])
    assert np.allclose(texts.means(), per_text.mean(axis=0), atol=1e-5)
    assert np.allclose(texts.std(), per_text.std(axis=0, ddof=1), atol=1e-5)
    assert state.label_counts.sum() == len(TEXTS) * state.layers * state.heads
    assert state.tokens == sum(r.shape[-1] for r in entropies)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=40), st.data())
def test_merged_moments_equal_the_moments_of_the_union(values, data):
    """Chan's merge: any split of the samples, merged, gives the moments of all of them (1e-9 relative)."""
    x = np.array(values)[:, None, None]
    cut = data.draw(st.integers(0, len(values)))
    merged = Moments.of(x[:cut]).merge(Moments.of(x[cut:]))
    whole = Moments.of(x)
    assert merged.count[0, 0] == len(values)
    assert np.allclose(merged.mean, whole.mean, rtol=1e-9, atol=1e-9)
    assert np.allclose(merged.m2, whole.m2, rtol=1e-9, atol=1e-6)
    if len(values) > 1:
        assert np.isclose(merged.std()[0, 0], np.std(values, ddof=1), rtol=1e-9, atol=1e-9)


def _corpus(tmp_path, name, texts):
    path = tmp_path / name
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


def _moments_close(a: CorpusState, b: CorpusState, rtol: float) -> float:
    worst = 0.0
    for w in a.moments:
        for name in a.metrics:
            for key in ("count", "mean", "m2"):
                x, y = getattr(a.moments[w][name], key), getattr(b.moments[w][name], key)
                worst = max(worst, float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-12))))
    assert worst <= rtol, worst
    return worst


@pytest.mark.slow
def test_merge_of_shards_equals_one_run_over_the_union(tmp_path, tiny_model_dir):
    """Two shards run separately and merged give what one run over both gives: every moment to 1e-9
    relative, label counts, texts, tokens and bad lines exactly. (--batch-size 1: each text's forward pass
    is then the same computation in every run, so what remains is the merge.)"""
    model = tiny_model_dir("bert")
    first = _corpus(tmp_path, "a.txt", TEXTS[:5] + [""])
    second = _corpus(tmp_path, "b.txt", TEXTS[5:])
    both = _corpus(tmp_path, "ab.txt", TEXTS[:5] + [""] + TEXTS[5:])
    for source, out in ((first, "A"), (second, "B"), (both, "AB")):
        result = run("corpus", source, "-m", model, "-b", 1, "-o", tmp_path / out)
        assert result.exit_code == 0, result.output
    result = run("corpus", "merge", tmp_path / "A", tmp_path / "B", "-o", tmp_path / "merged")
    assert result.exit_code == 0, result.output
    merged, union = load_state(tmp_path / "merged"), load_state(tmp_path / "AB")
    _moments_close(merged, union, 1e-9)
    assert np.array_equal(merged.label_counts, union.label_counts)
    assert (merged.texts, merged.tokens, merged.bad_total) == (union.texts, union.tokens, union.bad_total) == \
        (len(TEXTS), union.tokens, 1)
    # merging a shard with itself, or with a merge that holds it, counts it twice: refused
    one_line_error(run("corpus", "merge", tmp_path / "A", tmp_path / "A", "-o", tmp_path / "twice"))
    line = one_line_error(run("corpus", "merge", tmp_path / "merged", tmp_path / "B", "-o", tmp_path / "t2"))
    assert "twice" in line
    assert not (tmp_path / "twice").exists() and not (tmp_path / "t2").exists()


@pytest.mark.slow
def test_merge_refuses_different_models(tmp_path, tiny_model_dir):
    source = _corpus(tmp_path, "a.txt", TEXTS[:3])
    for kind in ("bert", "gpt2"):
        assert run("corpus", source, "-m", tiny_model_dir(kind), "-o", tmp_path / kind).exit_code == 0
    line = one_line_error(run("corpus", "merge", tmp_path / "bert", tmp_path / "gpt2", "-o", tmp_path / "m"))
    assert "differ in model" in line


def test_bad_lines_are_counted_by_number_and_never_fatal(tmp_path, tiny_model_dir):
    path = tmp_path / "mixed.txt"
    path.write_bytes(b"good one\n\n   \nbad \xff byte\nanother good line\n" + b"x" * (1 << 20 + 1) + b"\nlast\n")
    result = run("corpus", path, "-m", tiny_model_dir("bert"), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["texts"] == 3 and summary["lines"] == 7 and summary["bad_lines"] == 4
    assert summary["bad_reasons"] == {"empty": 2, "not UTF-8": 1, "longer than 1 MiB": 1}
    for where in ("mixed.txt:2: empty", "mixed.txt:3: empty", "mixed.txt:4: not UTF-8", "mixed.txt:6: longer"):
        assert where in result.stderr


def test_json_lines_bad_records(tmp_path, tiny_model_dir):
    records = [{"text": "A fine sentence."}, "not json {", {"body": "wrong field"}, {"text": 5}, [1, 2],
               {"text": ""}, {"text": "Another fine one."}]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    result = run("corpus", path, "-m", tiny_model_dir("bert"), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["texts"] == 2
    assert summary["bad_reasons"] == {"not JSON": 1, "no field 'text'": 1, "field 'text' is not a string": 1,
                                      "not a JSON object": 1, "empty": 1}
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"body": "Text in another field."}) + "\n")
    result = run("corpus", other, "--field", "body", "-m", tiny_model_dir("bert"), "--json")
    assert json.loads(result.stdout)["summary"]["texts"] == 1


def test_reader_streams_lines_with_numbers():
    lines = list(read_lines(io.BytesIO("\ufeffone\r\ntwo\n\nthree".encode()), "s"))
    assert [(line.number, line.text, line.reason) for line in lines] == [
        (1, "one", ""), (2, "two", ""), (3, None, "empty"), (4, "three", "")]


def test_truncation_is_counted_and_no_truncate_skips(tmp_path, tiny_model_dir, load_tiny):
    from attnviz.engine.forward import encode

    model = tiny_model_dir("bert")
    loaded = load_tiny("bert")
    long = sum(len(encode(loaded, t).token_ids) > 8 for t in TEXTS)
    assert 0 < long < len(TEXTS)
    source = _corpus(tmp_path, "t.txt", TEXTS)
    result = run("corpus", source, "-m", model, "--max-length", 8, "--json")
    summary = json.loads(result.stdout)["summary"]
    assert summary["truncated"] == long and summary["texts"] == len(TEXTS)
    # the Korean text's words are unknown to this vocabulary: counted and said, once for the whole run
    assert summary["texts_with_unknown_words"] == 1 and "1 text has words" in result.stderr
    assert json.loads(result.stdout)["summary"]["max_length"] == 8
    result = run("corpus", source, "-m", model, "--max-length", 8, "--no-truncate", "--json")
    summary = json.loads(result.stdout)["summary"]
    assert summary["texts"] == len(TEXTS) - long and summary["bad_reasons"] == {"longer than 8 tokens": long}
    one_line_error(run("corpus", source, "-m", model, "--max-length", 100000))


@pytest.mark.slow
def test_output_folder(tmp_path, tiny_model_dir):
    from PIL import Image

    source = _corpus(tmp_path, "t.txt", TEXTS)
    out = tmp_path / "out"
    result = run("corpus", source, "-m", tiny_model_dir("gpt2"), "-o", out)
    assert result.exit_code == 0, result.output
    names = {p.name for p in out.iterdir()}
    assert {"stats.json", "heads.csv", "heads.json", "layers.csv", "entropy.png", "special.png", "prev.png",
            "labels.png"} <= names
    for picture in ("entropy.png", "special.png", "prev.png", "labels.png"):
        with Image.open(out / picture) as image:
            image.load()
            assert image.width > 300
    header = (out / "heads.csv").read_text().splitlines()[0].split(",")
    assert {"entropy", "entropy_std", "entropy_tokens", "entropy_tokens_std", "label", "label_share"} <= set(header)
    heads = json.loads((out / "heads.json").read_text())
    assert len(heads["heads"]) == 2 * 4 and "token-weighted" in heads["weightings"]
    # the terminal table is the heads table, with the mean over texts
    assert "mean over 8 texts" in result.stdout and "prev" in result.stdout
    # an existing folder is never replaced without --force, and --force replaces only attnviz's own
    one_line_error(run("corpus", source, "-m", tiny_model_dir("gpt2"), "-o", out))
    assert run("corpus", source, "-m", tiny_model_dir("gpt2"), "-o", out, "--force").exit_code == 0
    (out / "mine.txt").write_text("user file")
    one_line_error(run("corpus", source, "-m", tiny_model_dir("gpt2"), "-o", out, "--force"))
    assert (out / "mine.txt").read_text() == "user file"


def test_standard_input_and_plain_strings(tiny_model_dir):
    result = run("corpus", "-", "-m", tiny_model_dir("bert"), "--csv", input="One text.\nTwo texts here.\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("layer,head,entropy,")
    assert "2 texts" in result.stderr


@pytest.mark.parametrize("content", [b"not json", b'{"kind": "attnviz-corpus", "version": 1}', b"[" * 100000,
                                     b'{"kind": "attnviz-corpus", "version": 99}', b"\xff\xfe"])
@pytest.mark.slow
def test_merge_refuses_hostile_stats(tmp_path, tiny_model_dir, content):
    good = tmp_path / "good"
    assert run("corpus", _corpus(tmp_path, "t.txt", TEXTS[:2]), "-m", tiny_model_dir("bert"), "-o", good
               ).exit_code == 0
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "stats.json").write_bytes(content)
    one_line_error(run("corpus", "merge", good, bad, "-o", tmp_path / "m"))
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_merge_refuses_tampered_numbers(tmp_path, tiny_model_dir):
    out = tmp_path / "a"
    assert run("corpus", _corpus(tmp_path, "t.txt", TEXTS[:2]), "-m", tiny_model_dir("bert"), "-o", out
               ).exit_code == 0
    data = json.loads((out / "stats.json").read_text())
    for corrupt in ("shape", "negative"):
        changed = json.loads(json.dumps(data))
        m = changed["moments"]["texts"]["entropy"]
        if corrupt == "shape":
            m["mean"] = m["mean"][:1]
        else:
            m["m2"][0][0] = -1.0
        folder = tmp_path / corrupt
        folder.mkdir()
        changed["runs"] = ["another run"]  # so that only the numbers are wrong
        (folder / "stats.json").write_text(json.dumps(changed))
        one_line_error(run("corpus", "merge", out, folder, "-o", tmp_path / f"m-{corrupt}"))


def test_encoder_decoder_models_are_refused(tmp_path, tiny_seq2seq_dir):
    line = one_line_error(run("corpus", _corpus(tmp_path, "t.txt", TEXTS[:2]), "-m", tiny_seq2seq_dir("bart")))
    assert "encoder-decoder" in line


def test_usage_errors(tmp_path):
    assert run("corpus").exit_code == 2
    one_line_error(run("corpus", "merge", tmp_path, "-o", tmp_path / "x"), code=2)
    one_line_error(run("corpus", tmp_path / "missing.txt"))
    one_line_error(run("corpus", tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["-o", "table", "--json", "--csv"])
def test_interrupt_keeps_partial_statistics_and_says_so_in_one_line(tmp_path, tiny_model_dir, monkeypatch, shape):
    """Ctrl-C during a run: the batch in progress finishes, what was folded so far is written (-o) and shown
    (the tables, --json or --csv on standard output), marked partial, one line on stderr says how far it got and
    where the partial statistics are, and the exit code is 130."""
    from attnviz.engine.corpora.run import BatchRunner

    calls = []
    original = BatchRunner.run

    def run_and_interrupt(self, batch):
        calls.append(len(batch))
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, batch)

    monkeypatch.setattr(BatchRunner, "run", run_and_interrupt)
    out = tmp_path / "out"
    asked = {"-o": ["-o", out], "table": [], "--json": ["--json"], "--csv": ["--csv"]}[shape]
    result = run("corpus", _corpus(tmp_path, "t.txt", TEXTS * 3), "-m", tiny_model_dir("bert"), "-b", 2, *asked)
    assert result.exit_code == 130, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: interrupted after 4 texts ("), result.stderr
    if shape == "-o":
        state = load_state(out)
        assert state.partial and state.texts == sum(calls) == 4
        assert f"after 4 texts ({state.tokens:,} tokens from {state.lines:,} lines): " in lines[0]
        assert f"were written to {out} (stats.json, " in lines[0] and "shown in the tables above" in lines[0]
        assert "PARTIAL" in result.stdout
    elif shape == "table":
        assert lines[0].endswith('the partial statistics (marked "partial": true) were shown in the tables above')
        assert "PARTIAL" in result.stdout
    elif shape == "--json":
        data = json.loads(result.stdout)["summary"]
        assert data["partial"] is True and data["texts"] == 4
        assert f"after 4 texts ({data['tokens']:,} tokens from {data['lines']:,} lines): " in lines[0]
        assert lines[0].endswith("were shown in the JSON on standard output")
    else:
        assert result.stdout.count("\n") > 1 and lines[0].endswith("were shown in the CSV on standard output")


@pytest.mark.slow
def test_local_engine_never_imports_ray(tmp_path, tiny_model_dir):
    source = _corpus(tmp_path, "t.txt", TEXTS[:2])
    code = ("import sys; from typer.testing import CliRunner; from attnviz.cli import app; "
            f"r = CliRunner().invoke(app, ['corpus', {str(source)!r}, '-m', {tiny_model_dir('bert')!r}]); "
            "print(r.exit_code, 'ray' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split()[-2:] == ["0", "False"], done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.ray
def test_ray_engine_equals_the_local_engine(tmp_path, tiny_model_dir):
    """--engine ray on a local Ray with 2 CPUs and 2 actors: the same statistics as the local engine, to 1e-6."""
    if not _has_ray():
        pytest.skip('Ray Data is not installed (pip install "attnviz[ray]"); .ci/run installs it')
    model = tiny_model_dir("bert")
    source = _corpus(tmp_path, "t.txt", TEXTS * 40 + ["", "  "])
    assert run("corpus", source, "-m", model, "-o", tmp_path / "local").exit_code == 0
    done = subprocess.run([sys.executable, "-m", "attnviz", "corpus", str(source), "-m", model, "--engine", "ray",
                           "--workers", "2", "-b", "4", "-o", str(tmp_path / "ray")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    local, ray = load_state(tmp_path / "local"), load_state(tmp_path / "ray")
    assert (ray.texts, ray.tokens, ray.lines, ray.bad) == (local.texts, local.tokens, local.lines, local.bad)
    assert sorted(map(tuple, ray.bad_lines)) == sorted(map(tuple, local.bad_lines))  # Ray: in any order
    worst = 0.0
    for w in local.moments:
        for name in local.metrics:
            a, b = ray.moments[w][name], local.moments[w][name]
            assert np.array_equal(a.count, b.count)
            worst = max(worst, float(np.max(np.abs(a.mean - b.mean))), float(np.nanmax(np.abs(a.std() - b.std()))))
    assert worst < 1e-6, worst
    assert np.array_equal(ray.label_counts, local.label_counts)
    # a text file read as JSON lines: every line bad, so Ray hands the actors batches whose text column is all
    # missing (as NaN): still no text, each line with its reason, as the local engine says
    assert run("corpus", source, "--format", "jsonl", "-m", model, "-o", tmp_path / "local-bad").exit_code == 0
    done = subprocess.run([sys.executable, "-m", "attnviz", "corpus", str(source), "--format", "jsonl", "-m", model,
                           "--engine", "ray", "--workers", "2", "-b", "4", "-o", str(tmp_path / "ray-bad")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    local, ray = load_state(tmp_path / "local-bad"), load_state(tmp_path / "ray-bad")
    assert (ray.texts, ray.tokens, ray.lines, ray.bad) == (local.texts, local.tokens, local.lines, local.bad)
    assert local.texts == 0 and local.lines == len(TEXTS) * 40 + 2
    assert local.bad == {"not JSON": len(TEXTS) * 40, "empty": 2}


def test_a_ray_batch_of_bad_lines_stays_bad_lines():
    """Ray Data hands an actor a column whose values are all missing as float NaN (a batch made only of bad
    lines): those lines stay bad, with their reasons, never the text "nan" (which counted 3 tokens a line)."""
    from attnviz.engine.corpora.ray import batch_lines

    every_bad = {"source": np.array(["a.txt", "a.txt"], object), "number": np.array([1, 2]),
                 "text": np.array([np.nan, np.nan], np.float32), "reason": np.array(["not JSON", "empty"], object)}
    assert [(line.text, line.reason) for line in batch_lines(every_bad)] == [(None, "not JSON"), (None, "empty")]
    mixed = {"source": np.array(["a.txt", "a.txt"], object), "number": np.array([3, 4]),
             "text": np.array([None, "The cat"], object), "reason": np.array(["empty", None], object)}
    assert [(line.number, line.text, line.reason) for line in batch_lines(mixed)] == [(3, None, "empty"),
                                                                                     (4, "The cat", "")]
    no_reasons = {"source": np.array(["b.txt"], object), "number": np.array([7]), "text": np.array(["x"], object),
                  "reason": np.array([np.nan], np.float32)}
    assert batch_lines(no_reasons)[0].reason == ""


def test_an_unreachable_ray_address_is_one_line_in_seconds(tmp_path, tiny_model_dir):
    """Ray retries a wrong --address for minutes; attnviz checks the port first (before importing Ray)."""
    import socket

    from attnviz.engine.corpora.ray import check_address
    from attnviz.errors import InputError

    with socket.socket() as s:  # a port with nothing listening: bind, take its number, close
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}", "no-port", "ray://:5"):
        with pytest.raises(InputError):
            check_address(address, timeout=1.0)
    with socket.socket() as server:  # something listening: accepted
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_address(f"127.0.0.1:{server.getsockname()[1]}")
    check_address("auto")


def _has_ray() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def _ray_processes() -> list[str]:
    """Command lines of Ray's own processes on this machine (raylet, GCS, workers, actors)."""
    done = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines()
            if any(name in line for name in ("raylet", "gcs_server", "ray::", "default_worker.py"))]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("how", ["SIGTERM to attnviz", "Ctrl-C to the terminal's process group"])
def test_a_stopped_ray_run_is_one_line_saying_what_was_kept_and_leaves_no_ray_process(tmp_path, tiny_model_dir, how):
    """SIGTERM to attnviz, or Ctrl-C in a terminal (SIGINT to the whole process group: Ray's own processes
    too), while the actors work: one line on stderr (no Ray stack dump, no summary and file list besides)
    saying how far it got and what was kept, the partial statistics marked so, exit 143 / 130, and the local
    Ray shut down with every process of it."""
    if not _has_ray():
        pytest.skip('Ray Data is not installed (pip install "attnviz[ray]"); .ci/run installs it')
    deadline = time.monotonic() + 60  # a Ray shut down just before (the test above) takes a moment to go
    while _ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    if _ray_processes():
        pytest.skip("another Ray runs on this machine: its processes could not be told apart")
    source = _corpus(tmp_path, "t.txt", TEXTS * 4000)
    process = subprocess.Popen([sys.executable, "-m", "attnviz", "corpus", str(source), "-m", tiny_model_dir("bert"),
                                "--engine", "ray", "--workers", "2", "-b", "2", "-o", str(tmp_path / "out")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any("CorpusWorker" in p for p in _ray_processes()):
        time.sleep(0.5)
    assert any("CorpusWorker" in p for p in _ray_processes()), "the actors never started"
    time.sleep(3)  # the actors are at work
    if how.startswith("SIGTERM"):
        process.send_signal(signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == (143 if how.startswith("SIGTERM") else 130), err
    lines = [line for line in err.splitlines() if line.strip()]
    state = load_state(tmp_path / "out")
    assert state.partial and 0 <= state.texts < len(TEXTS) * 4000
    word = "terminated" if how.startswith("SIGTERM") else "interrupted"
    assert lines == [f"Error: {word} after {state.texts:,} texts ({state.tokens:,} tokens from {state.lines:,} lines): "
                     f"the partial statistics (marked \"partial\": true) were written to {tmp_path / 'out'} "
                     f"(stats.json, heads.csv, heads.json, layers.csv, entropy.png, special.png, prev.png, "
                     f"labels.png)"], err
    assert ("mean over" in out) == (state.texts > 0)  # the tables of what was kept, on standard output
    deadline = time.monotonic() + 30
    while _ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _ray_processes() == []


@pytest.mark.slow
def test_sigterm_ends_an_endless_line_with_partial_statistics(tiny_model_dir, tmp_path):
    """`cat /dev/zero | attnviz corpus -` is one endless line: the reader skips it a block at a time, and
    SIGTERM stops it there, with attnviz's line, the partial statistics and exit 143."""
    process = subprocess.Popen([sys.executable, "-m", "attnviz", "corpus", "-", "-m", tiny_model_dir("bert"),
                                "-o", str(tmp_path / "out")], stdin=open("/dev/zero", "rb"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)  # the model loads, then the reader is inside the endless line
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert "terminated" in err and "partial" in err and "Traceback" not in err
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["partial"] is True and stats["texts"] == 0


def forged(tmp_path, shard, change, name="forged"):
    data = json.loads((shard / "stats.json").read_text())
    data["runs"] = ["another run"]
    change(data)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "stats.json").write_text(json.dumps(data) if isinstance(data, dict) else data)
    return folder


@pytest.mark.parametrize("change, words", [
    (lambda d: d["moments"]["texts"]["entropy"]["count"][0].__setitem__(0, 1e308), "out of range"),
    (lambda d: d["moments"]["texts"]["entropy"]["mean"][0].__setitem__(0, 1e300), "out of range"),
    (lambda d: d.__setitem__("texts", 10 ** 400), "'texts'"),
    (lambda d: d.__setitem__("tokens", -1), "'tokens'"),
    (lambda d: d["label_counts"][0][0].__setitem__(0, 2 ** 60), "label_counts"),
    (lambda d: d.__setitem__("bad", {"x": True}), "'bad'"),
    (lambda d: d.update(layers=4096, heads=4096), "over the limit"),
])
@pytest.mark.slow
def test_numbers_out_of_range_are_refused_in_one_line(tmp_path, shard, change, words):
    folder = forged(tmp_path, shard, change)
    line = one_line_error(run("corpus", "merge", shard, folder, "-o", tmp_path / "m"))
    assert words in line
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_a_state_of_empty_lists_is_refused_before_it_is_parsed(tmp_path, shard, monkeypatch):
    """Memory stays bounded: a file of many JSON containers is refused by counting, not by parsing (the
    limit is lowered here so the file can stay small)."""
    import attnviz.corpora.state as corpus

    monkeypatch.setattr(corpus, "MAX_STATE_CONTAINERS", 1000)
    folder = tmp_path / "lists"
    folder.mkdir()
    (folder / "stats.json").write_text("[" + ",".join(["[]"] * 5000) + "]")
    with pytest.raises(Exception, match="JSON lists and objects"):
        corpus.load_state(folder)
    (folder / "stats.json").write_bytes(b" " * (corpus.MAX_STATE_BYTES + 1))
    with pytest.raises(Exception, match="larger than"):
        corpus.load_state(folder)


@pytest.mark.slow
def test_merging_many_large_shards_stays_finite(tmp_path, shard):
    from attnviz.corpora import load_state, merge_states

    def big(d):
        for per in d["moments"].values():
            for entry in per.values():
                entry["count"] = [[2.0 ** 52] * len(row) for row in entry["count"]]
    states = [load_state(forged(tmp_path, shard, big, f"s{n}")) for n in range(3)]
    for n, state in enumerate(states):
        state.runs = [f"run {n}"]
    merged = merge_states(states)
    for per in merged.moments.values():
        for m in per.values():
            assert np.isfinite(m.count).all() and np.isfinite(m.mean).all() and np.isfinite(m.m2).all()
