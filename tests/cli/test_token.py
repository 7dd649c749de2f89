"""One token everywhere (attnviz token) and how TOKEN arguments are read: indices, text, the#2."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_capture, one_line_error, run


@pytest.mark.parametrize("spec", ["the#²", "the#١", "cat#³#2", "#", "the#", "\u00b2"])
def test_unusual_token_arguments_are_usage_errors(tmp_path, spec):
    tokens = ["[CLS]", "the", "cat", "the", "[SEP]"]
    alpha = np.full((1, 2, 5, 5), 0.2, np.float32)
    path = make_capture(alpha, tokens, special=[True, False, False, False, True],
                        kinds=["start", "", "", "", "end"]).save(tmp_path / "c.npz")
    one_line_error(run("token", "--from", path, spec), 2)


def test_token_number_in_ascii_digits_still_works(tmp_path):
    tokens = ["[CLS]", "the", "cat", "the", "[SEP]"]
    alpha = np.full((1, 2, 5, 5), 0.2, np.float32)
    path = make_capture(alpha, tokens, special=[True, False, False, False, True],
                        kinds=["start", "", "", "", "end"]).save(tmp_path / "c.npz")
    assert json.loads(run("token", "--from", path, "the#2", "--json").stdout)["token"] == 3


def test_a_stripe_head_is_not_taken_for_a_link(tmp_path):
    """In a head where every token looks at "cat" (a vertical stripe), "it" → "cat" says nothing about "it":
    a head where only "it" looks at "cat", with a smaller weight, ranks first, and the stripe is named."""
    tokens = ["[CLS]", "the", "cat", "sat", "because", "it", "was", "tired", "[SEP]"]
    alpha = np.full((1, 2, 9, 9), 1 / 9, np.float32)
    alpha[0, 0, :, :] = 0.1 / 8
    alpha[0, 0, :, 2] = 0.9  # head 0: every query puts 0.9 on "cat"
    alpha[0, 1, 5, :] = 0.4 / 8
    alpha[0, 1, 5, 2] = 0.6  # head 1: only "it" looks at "cat" (0.6)
    path = make_capture(alpha, tokens, special=[True] + [False] * 7 + [True],
                        kinds=["start"] + [""] * 7 + ["end"]).save(tmp_path / "c.npz")
    links = json.loads(run("token", "--from", path, "it", "--json").stdout)["strongest_links"]
    assert (links[0]["head"], links[0]["token"]) == (1, "cat") and not links[0]["stripe"]
    assert all(link["head"] != 0 or link["lift"] < links[0]["lift"] for link in links)
    text = run("token", "--from", path, "it").stdout
    assert "others 0.11" in text


@pytest.mark.slow
def test_token_view_rows_columns_and_links(tmp_path):
    rng = np.random.default_rng(0)
    tokens = ["[CLS]", "the", "cat", "sat", "because", "it", "was", "the", "[SEP]"]
    alpha = rng.dirichlet(np.ones(9), size=(2, 3, 9)).astype(np.float32)
    alpha[1, 2, 5] = 0.0
    alpha[1, 2, 5, 2] = 1.0  # layer 1 head 2: "it" -> "cat"
    path = make_capture(alpha, tokens, special=[True] + [False] * 7 + [True],
                        kinds=["start"] + [""] * 7 + ["end"]).save(tmp_path / "c.npz")
    data = json.loads(run("token", "--from", path, "it", "--json").stdout)
    assert data["token"] == 5
    np.testing.assert_allclose(np.array(data["attends_to"]), alpha[:, :, 5, :], atol=1e-7)
    np.testing.assert_allclose(np.array(data["attended_by"]), alpha[:, :, :, 5], atol=1e-7)
    best = data["strongest_links"][0]
    assert (best["layer"], best["head"], best["token"], best["weight"]) == (1, 2, "cat", pytest.approx(1.0))
    lift = np.full((2, 3, 9), -np.inf)  # brute force: weight minus the other non-special queries' mean weight
    for layer in range(2):
        for head in range(3):
            for key in range(1, 8):
                if key != 5:
                    mean = np.mean([alpha[layer, head, q, key] for q in range(1, 8) if q != 5])
                    lift[layer, head, key] = alpha[layer, head, 5, key] - mean
    assert best["lift"] == pytest.approx(float(lift.max()), abs=1e-6)
    assert best["typical"] == pytest.approx(float(alpha[1, 2, [1, 2, 3, 4, 6, 7], 2].mean()), abs=1e-6)
    assert "occurs 2 times (tokens 1, 7)" in one_line_error(run("token", "--from", path, "the"), 2)
    assert run("token", "--from", path, "the#2", "--json").exit_code == 0
    assert json.loads(run("token", "--from", path, "THE#2", "--json").stdout)["token"] == 7
    assert "no token 'dog'" in one_line_error(run("token", "--from", path, "dog"), 2)
    result = run("token", "--from", path, "5", "-o", tmp_path / "t.png")
    assert result.exit_code == 0 and "layer 1 head 2 → cat 1.00 (others " in result.stdout
    assert (tmp_path / "t.png").exists()
