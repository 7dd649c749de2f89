"""Word-level attention: to a word the sum over its pieces, from a word the mean; rows still sum to 1;
labels are the words as written; every viewer reads a word-level capture."""

import json

import numpy as np
import pytest
from helpers import make_capture, run

from attnviz.base.blocks import pool_blocks
from attnviz.data.capture import Capture
from attnviz.data.words import to_words, word_edges


def words_by_hand(alpha: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """The definition, with loops: W[a, b] = mean over i in a of the sum over j in b of α[i, j]."""
    out = np.zeros(alpha.shape[:-2] + (len(groups), len(groups)))
    for a, rows in enumerate(groups):
        for b, cols in enumerate(groups):
            out[..., a, b] = alpha[..., rows, :][..., :, cols].sum(-1).mean(-1)
    return out


def test_word_edges_keep_specials_and_punctuation_alone():
    tokens = ["[CLS]", "token", "##ization", "of", "un", "##bel", "##ievably", ",", "isn", "'", "t", "[SEP]"]
    subword = [False, False, True, False, False, True, True, False, False, False, False, False]
    special = [True] + [False] * 10 + [True]
    edges = word_edges(tokens, subword, special)
    assert [tokens[a:b] for a, b in zip(edges[:-1], edges[1:])] == [
        ["[CLS]"], ["token", "##ization"], ["of"], ["un", "##bel", "##ievably"], [","], ["isn"], ["'"], ["t"],
        ["[SEP]"]]


def test_word_level_alpha_is_the_definition_and_rows_sum_to_one():
    rng = np.random.default_rng(0)
    tokens = ["[CLS]", "the", "cat", "##s", "sat", ".", "[SEP]"]
    alpha = rng.dirichlet(np.ones(7), size=(2, 3, 7)).astype(np.float32)
    capture = make_capture(alpha, tokens, special=[True] + [False] * 5 + [True]).with_meta(text="the cats sat.")
    capture = type(capture)(**{**capture.__dict__, "subword": np.array([0, 0, 0, 1, 0, 0, 0], bool)})
    words = to_words(capture)
    groups = [[0], [1], [2, 3], [4], [5], [6]]
    np.testing.assert_allclose(words.attentions, words_by_hand(alpha, groups), atol=1e-6)
    np.testing.assert_allclose(words.attentions.sum(-1), 1.0, atol=1e-6)
    assert words.tokens == ("[CLS]", "the", "cats", "sat", ".", "[SEP]") and words.meta["level"] == "word"


def test_causal_word_level_stays_causal():
    T = 6
    tril = np.tril(np.ones((T, T), np.float32))
    capture = make_capture(np.broadcast_to(tril / tril.sum(-1, keepdims=True), (1, 1, T, T)), causal=True)
    capture = type(capture)(**{**capture.__dict__, "subword": np.array([0, 1, 0, 1, 1, 0], bool)})
    words = to_words(capture)
    assert words.n_tokens == 3 and np.abs(np.triu(words.attentions[0, 0], 1)).max() == 0


@pytest.mark.slow
def test_korean_on_minilm_reads_as_five_words(tmp_path):
    result = run("heatmap", "나는 사과를 먹었다", "--words", "-t", "--layer", "0", "--head", "3", env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    rows = [line.split()[1] for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert rows == ["[CLS]", "나는", "사과를", "[UNK:먹었다]", "[SEP]"]  # MiniLM cannot read 먹었다: said
    path = tmp_path / "w.npz"
    assert run("capture", "나는 사과를 먹었다", "--words", "-o", path).exit_code == 0
    words = Capture.load(path)
    assert words.attentions.shape == (6, 12, 5, 5) and words.meta["level"] == "word" and words.meta["pieces"] == 15


@pytest.mark.slow
def test_every_viewer_reads_word_level(tiny_model_dir, tmp_path):
    model = tiny_model_dir("bert")
    text = "Tokenization of unbelievably long words, isn't it?"
    path = tmp_path / "w.npz"
    assert run("capture", text, "-m", model, "--words", "-o", path).exit_code == 0
    words = Capture.load(path)
    assert "Tokenization" in words.tokens and "unbelievably" in words.tokens
    for command in (["heatmap", "-o", tmp_path / "h.png"], ["heads", "--json"], ["entropy"], ["rollout", "--json"],
                    ["compare"], ["export", "-o", tmp_path / "e"]):
        result = run(command[0], "--from", path, *command[1:])
        assert result.exit_code == 0, (command, result.output)
    tokens = Capture.load(tmp_path / "e" / "attention.npz")
    assert tokens.meta["level"] == "word"
    token_level = tmp_path / "t.npz"
    assert run("capture", text, "-m", model, "-o", token_level).exit_code == 0
    from_tokens = json.loads(run("heads", "--from", token_level, "--words", "--json").stdout)["heads"]
    direct = json.loads(run("heads", "--from", path, "--json").stdout)["heads"]
    assert from_tokens == direct


def test_streamed_words_equal_full_words(tiny_model_dir):
    model = tiny_model_dir("gpt2")
    text = "The cat sat on the mat. A dog ran in the park!"
    full = json.loads(run("heads", text, "-m", model, "--words", "--json").stdout)["heads"]
    streamed = run("heads", text, "-m", model, "--words", "--json", "--stream")
    assert streamed.exit_code == 0 and "words" in streamed.stderr
    rows = json.loads(streamed.stdout)["heads"]
    assert [r["label"] for r in rows] == [r["label"] for r in full]
    assert max(abs(a[k] - b[k]) for a, b in zip(rows, full) for k in a if isinstance(a[k], float)) < 1e-5


def test_pool_blocks_matches_loops():
    rng = np.random.default_rng(1)
    alpha = rng.dirichlet(np.ones(9), size=(2, 9))
    edges = np.array([0, 1, 4, 5, 9])
    groups = [list(range(a, b)) for a, b in zip(edges[:-1], edges[1:])]
    np.testing.assert_allclose(pool_blocks(alpha, edges), words_by_hand(alpha, groups), atol=1e-6)


def test_a_picture_pooled_again_to_fit_is_the_same_pooling():
    """panels.coarsen (a terminal narrower than the picture) pools by blocks.pool_blocks: rows averaged,
    columns summed, so its rows still sum to 1; checked against loops, and a cell is hidden only where
    every cell of its group was."""
    from attnviz.panels import Panel, Scale, coarsen

    rng = np.random.default_rng(2)
    matrix = rng.dirichlet(np.ones(7), size=7).astype(np.float32)  # (7, 7), rows sum to 1
    hidden = np.triu(np.ones((7, 7), bool), k=1)  # a causal mask
    labels = tuple(f"t{i}" for i in range(7))
    panel = Panel(matrix, labels, labels, hidden, Scale(), ("x",), "x")
    pooled = coarsen(panel, 3)
    groups = [[0, 1, 2], [3, 4, 5], [6]]
    by_hand = np.array([[matrix[np.ix_(r, c)].sum(axis=1).mean() for c in groups] for r in groups])
    np.testing.assert_allclose(pooled.matrix, by_hand, atol=1e-6)
    np.testing.assert_allclose(pooled.matrix.sum(axis=1), 1.0, atol=1e-6)
    assert pooled.rows == ("t0", "t3", "t6") and pooled.hidden.tolist() == [[False, True, True], [False, False, True],
                                                                            [False, False, False]]
