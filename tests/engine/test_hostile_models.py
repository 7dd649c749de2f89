"""Hostile model files: a GGUF file or a model folder whose header declares what the file does not hold
(10^9 layers, an array of 10^8 entries, tensors beyond the end, keys that are not UTF-8, metadata that
disagrees with the weights) is refused in one line before anything is allocated or looped over; tokens
holding escape sequences and HTML reach the terminal and the page as plain text.

Every command here runs in a subprocess with a deadline (run_bounded): before these checks, the same files
ran for minutes."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from helpers import build_tiny_model, one_line_error, run, run_bounded, write_tiny_gguf

from attnviz.engine import modelfiles
from attnviz.engine.offline import gguf as gguf_check
from attnviz.errors import ModelLoadError

# --- GGUF files written by hand ---------------------------------------------------------------------------
# The layout, written here independently of the reader under test: magic, version 3, tensor count, key count;
# each key as (u64 length, bytes), a u32 value type, the value; each tensor as (name, u32 dimensions, u64
# each, u32 ggml type, u64 offset); the data aligned to 32 bytes.

U32, STRING, ARRAY, F32 = 4, 8, 9, 0


def text(raw: bytes | str) -> bytes:
    raw = raw.encode() if isinstance(raw, str) else raw
    return struct.pack("<Q", len(raw)) + raw


def entry(key: bytes | str, kind: int, value: bytes) -> bytes:
    return text(key) + struct.pack("<I", kind) + value


def u32(key: str, value: int) -> bytes:
    return entry(key, U32, struct.pack("<I", value))


def gguf_file(path, keys: list[bytes], tensors: list[tuple[str, tuple[int, ...]]]) -> str:
    """A GGUF file of float32 tensors (zeros) laid out one after another; a tensor over 1 MB gets its place in
    the table but no data (the file ends before it)."""
    table, offset, data = b"", 0, 0
    for name, dims in tensors:
        table += text(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        table += struct.pack("<IQ", F32, offset)
        offset += int(np.prod(dims)) * 4
        data = offset if offset < 1 << 20 else data
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(keys)) + b"".join(keys) + table
    head += bytes(-len(head) % 32)
    path.write_bytes(head + bytes(data))
    return str(path)


def llama_keys(*, layers=2, width=8, heads=2, kv_heads=2, context=64, arch="llama") -> list[bytes]:
    return [entry("general.architecture", STRING, text(arch)), u32(f"{arch}.block_count", layers),
            u32(f"{arch}.embedding_length", width), u32(f"{arch}.attention.head_count", heads),
            u32(f"{arch}.attention.head_count_kv", kv_heads), u32(f"{arch}.context_length", context)]


def llama_tensors(layers=2, width=8, vocab=16) -> list[tuple[str, tuple[int, ...]]]:
    tensors = [("token_embd.weight", (width, vocab))]
    for layer in range(layers):
        tensors += [(f"blk.{layer}.attn_q.weight", (width, width)), (f"blk.{layer}.attn_norm.weight", (width,))]
    return tensors


def string_array(key: str, count: int, strings: list[bytes] = ()) -> bytes:
    return entry(key, ARRAY, struct.pack("<IQ", STRING, count) + b"".join(text(s) for s in strings))


HOSTILE_GGUF = {
    "a billion layers": (llama_keys(layers=10**9), llama_tensors(), "declares 1,000,000,000 layers"),
    "an array of 10^8 entries": (llama_keys() + [string_array("tokenizer.ggml.tokens", 10**8)], llama_tensors(),
                                 "array of 100,000,000 entries"),
    "an array past the end": (llama_keys() + [string_array("tokenizer.ggml.tokens", 3_000_000)], llama_tensors(),
                              "runs past the end of the file"),
    "a string past the end": (llama_keys() + [entry("general.name", STRING, struct.pack("<Q", 1 << 40))],
                              llama_tensors(), "runs past the end of the file"),
    "a key that is not UTF-8": (llama_keys() + [entry(b"llama.\xff\xfe", U32, struct.pack("<I", 1))],
                                llama_tensors(), "not UTF-8"),
    "a value type GGUF lacks": (llama_keys() + [entry("x", 77, b"")], llama_tensors(), "value type 77"),
    "a tensor beyond the file": (llama_keys(), llama_tensors() + [("blk.1.huge.weight", (1 << 20, 1 << 10))],
                                 "runs past the end of the file"),
    "seven dimensions": (llama_keys(), llama_tensors() + [("blk.0.odd.weight", (1,) * 7)], "7 dimensions"),
    "width unlike the embedding": (llama_keys(width=4096), llama_tensors(), "embedding width of 4,096"),
    "heads that do not divide": (llama_keys(heads=4, kv_heads=3), llama_tensors(), "must divide"),
    "a context of 2^40": (llama_keys(context=1 << 31), llama_tensors(), "context of 2,147,483,648"),
    "blocks beyond the count": (llama_keys(layers=2), llama_tensors(3), "declares 2 layers"),
    "no blocks for the count": (llama_keys(layers=3), llama_tensors(2), "declares 3 layers"),
    "an unknown architecture, inconsistent": (llama_keys(arch="mystery", layers=40), llama_tensors(),
                                              "declares 40 layers"),
}


@pytest.mark.parametrize("case", HOSTILE_GGUF)
def test_a_forged_gguf_is_refused_before_anything_is_read(tmp_path, case):
    pytest.importorskip("gguf")
    keys, tensors, words = HOSTILE_GGUF[case]
    path = gguf_file(tmp_path / "forged.gguf", keys, tensors)
    with pytest.raises(ModelLoadError) as caught:
        gguf_check.inspect(Path(path))
    assert words in str(caught.value)


@pytest.mark.parametrize("case", ["a billion layers", "an array of 10^8 entries", "a key that is not UTF-8"])
def test_a_forged_gguf_is_one_line_from_the_command_line(tmp_path, case):
    pytest.importorskip("gguf")
    keys, tensors, words = HOSTILE_GGUF[case]
    path = gguf_file(tmp_path / "forged.gguf", keys, tensors)
    result = run_bounded("heatmap", "The cat", "-m", path, "-t", timeout=60,
                         env={"ATTNVIZ_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 1 and words in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "cache").exists() or not [p for p in (tmp_path / "cache").iterdir()
                                                     if not p.name.endswith(".lock")]


def test_the_hand_written_layout_is_what_the_reader_accepts(tmp_path):
    """The fixture's honest file passes: what the forged ones are refused for is the forgery."""
    pytest.importorskip("gguf")
    keys = llama_keys() + [string_array("tokenizer.ggml.tokens", 3, [b"a", b"<script>", b"\x1b[31m"])]
    summary = gguf_check.inspect(Path(gguf_file(tmp_path / "honest.gguf", keys, llama_tensors())))
    assert (summary.architecture, summary.tensors, summary.parameters) == ("llama", 5, 8 * 16 + 2 * (64 + 8))


def test_a_real_gguf_with_an_unknown_architecture_is_named(tmp_path, monkeypatch):
    """Consistent metadata but an architecture transformers does not read: the line names it."""
    pytest.importorskip("gguf")
    path = write_tiny_gguf("qwen3", tmp_path / "tiny.gguf")
    raw = bytearray(path.read_bytes())
    at = raw.index(b"qwen3", 24)  # general.architecture's value comes first
    raw[at:at + 5] = b"qwen9"
    forged = tmp_path / "qwen9.gguf"
    forged.write_bytes(bytes(raw))
    assert gguf_check.inspect(forged).architecture == "qwen9"
    result = run("heads", "The cat", "-m", forged, env={"ATTNVIZ_CACHE_DIR": str(tmp_path / "cache")})
    assert "'qwen9' model" in one_line_error(result)


# --- model folders ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder_source(tmp_path_factory):
    return build_tiny_model("bert", tmp_path_factory.mktemp("bert") / "bert")


def forged_folder(source, tmp_path, **changes):
    folder = tmp_path / "forged"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("changes, words", [
    ({"num_hidden_layers": 10**9}, "num_hidden_layers = 1,000,000,000"),
    ({"hidden_size": 10**9}, "hidden_size = 1,000,000,000"),
    ({"num_hidden_layers": 4000}, "declares 4,000 layers but its weights hold"),
    ({"vocab_size": 1 << 24, "hidden_size": 1 << 17}, "declares a model of at least"),
    ({"text_config": {"num_hidden_layers": -3}}, "num_hidden_layers = -3"),
    ({"max_position_embeddings": 10**12}, "max_position_embeddings"),
    ({"num_hidden_layers": 1e9}, "num_hidden_layers = '1000000000.0', not a whole number"),
    ({"num_hidden_layers": "1000000000"}, "not a whole number"),
    ({"num_attention_heads": 0}, "num_attention_heads = 0 (a model has at least 1)"),
    ({"num_attention_heads": 7}, "width of 32 in 7 heads"),
    ({"hidden_size": True}, "hidden_size = 'True', not a whole number"),
])
def test_a_config_declaring_what_the_weights_do_not_hold_is_refused(folder_source, tmp_path, changes, words):
    folder = forged_folder(folder_source, tmp_path, **changes)
    with pytest.raises(ModelLoadError, match=re.escape(words)):
        modelfiles.check_folder(folder)


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe{}", "not JSON text"), (b"[1, 2]", "JSON list"), (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (b" " * (modelfiles.CONFIG_BYTES + 1), "at most"),
])
def test_a_config_that_is_not_settings_is_refused(folder_source, tmp_path, content, words):
    folder = forged_folder(folder_source, tmp_path)
    (folder / "config.json").write_bytes(content)
    with pytest.raises(ModelLoadError, match=words):
        modelfiles.check_folder(folder)


def safetensors_bytes(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize("forge, words", [
    (lambda: struct.pack("<Q", 10**15) + b"{}", "not a safetensors file"),
    (lambda: safetensors_bytes({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8)),
     "runs past the end"),
    (lambda: safetensors_bytes({"w": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 8]}},
                               bytes(8)), "declares shape"),
    (lambda: safetensors_bytes({"w": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}, bytes(8)), "no dtype"),
    (lambda: safetensors_bytes({"w": {"dtype": "F32", "shape": "big", "data_offsets": [0, 8]}}, bytes(8)),
     "malformed"),
    (lambda: struct.pack("<Q", 4) + b"\xff\xff\xff\xff", "not JSON"),
])
def test_a_forged_safetensors_header_is_refused(folder_source, tmp_path, forge, words):
    folder = forged_folder(folder_source, tmp_path)
    (folder / "model.safetensors").write_bytes(forge())
    with pytest.raises(ModelLoadError, match=words):
        modelfiles.check_folder(folder)


def test_the_weight_limit_counts_the_weights_at_the_loaded_precision(folder_source, tmp_path, monkeypatch):
    tensors, weights = modelfiles.check_safetensors(folder_source / "model.safetensors")
    assert tensors > 10 and weights > 1000
    monkeypatch.setenv(gguf_check.MAX_MODEL_ENV, str(weights * 4 - 1))
    with pytest.raises(ModelLoadError, match=f"holds {weights:,} weights"):
        modelfiles.check_folder(folder_source)
    modelfiles.check_folder(folder_source, bytes_per_weight=2)  # bfloat16: half as much, under the limit


def test_a_forged_folder_is_one_line_in_seconds(folder_source, tmp_path):
    folder = forged_folder(folder_source, tmp_path, num_hidden_layers=10**9)
    result = run_bounded("heatmap", "The cat", "-m", folder, "-t", timeout=60)
    assert result.returncode == 1 and "num_hidden_layers = 1,000,000,000" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    layer_result = run_bounded("heatmap", "The cat", "-m", folder, "-t", "--layer", "0", timeout=60)
    assert layer_result.returncode == 1 and "num_hidden_layers" in layer_result.stderr


def _address_space(limit: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


@pytest.mark.parametrize("changes, words", [
    ({"num_hidden_layers": 10**9}, "num_hidden_layers = 1,000,000,000"),
    ({"num_hidden_layers": 4000}, "declares 4,000 layers but its weights hold 2 blocks"),
    ({"num_hidden_layers": 3}, "declares 3 layers but its weights hold 2 blocks"),
    ({"hidden_size": 64, "num_attention_heads": 4}, "token embedding embeddings.word_embeddings.weight is 32 wide"),
])
@pytest.mark.parametrize("command", [["heads"], ["entropy"], ["heatmap", "-t", "--layer", "all"],
                                     ["capture", "--json"]])
def test_a_config_larger_than_its_weights_is_refused_before_anything_is_built(folder_source, tmp_path, changes,
                                                                              words, command):
    """A config declaring more layers than the weights' blocks (10^9 grew to 24 GB: every command that selects
    all layers expanded the selection from the config before the folder was checked), or a width its token
    embedding does not have: one line, within 6 GiB of address space and a minute."""
    folder = forged_folder(folder_source, tmp_path, **changes)
    result = run_bounded(command[0], "The cat", *command[1:], "-m", folder, timeout=60,
                         preexec_fn=_address_space(6 << 30), cwd=tmp_path)
    assert result.returncode == 1 and words in result.stderr, result.stderr[-500:]
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_config_that_matches_its_weights_is_read_as_it_is(folder_source):
    """The checks against the weights pass every real layout: the tiny families and a sharded folder."""
    modelfiles.check_folder(folder_source)
    with pytest.raises(ModelLoadError, match="declares 3 layers"):
        modelfiles.check_against_weights("m", [{"num_hidden_layers": 3}], {"model.layers.1.mlp.weight": [2, 2]})
    modelfiles.check_against_weights("m", [{"n_layer": 2, "n_embd": 8}], {"h.1.attn.weight": [8, 8],
                                                                          "wte.weight": [10, 8]})
    modelfiles.check_against_weights("m", [{"num_layers": 2}], {"a": [1], "b": [1]})  # no block names: counted


def test_a_tokenizer_file_that_is_a_fifo_is_refused(folder_source, tmp_path):
    import os

    folder = forged_folder(folder_source, tmp_path)
    present = next(name for name in modelfiles.TOKENIZER_FILES if (folder / name).exists())
    (folder / present).unlink()
    os.mkfifo(folder / present)
    with pytest.raises(ModelLoadError, match="FIFO"):
        modelfiles.check_folder(folder)


# --- tokens that hold escape sequences and markup ---------------------------------------------------------

HOSTILE_TOKENS = ["\x1b[31mred", "<script>alert(1)</script>", "[bold]x[/bold]", "\x07bell", "\x1b]0;title\x07"]


@pytest.fixture(scope="module")
def hostile_vocab_lm(tmp_path_factory):
    """A tiny GPT-2 whose vocabulary is a word and tokens that hold escape sequences, a bell, HTML and Rich
    markup; the word's and the end token's output rows are zero, so what it writes is almost all hostile."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, "hello": 1, **{token: 2 + i for i, token in enumerate(HOSTILE_TOKENS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>",
                                        unk_token="<|endoftext|>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_embd=16, n_layer=2, n_head=2, n_positions=32,
                                       bos_token_id=0, eos_token_id=0))
    with torch.no_grad():
        model.transformer.wte.weight[:2] = 0  # tied to the output: "hello" and the end token never win
    folder = tmp_path_factory.mktemp("hostile-vocab") / "gpt2"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_escape_sequences_and_markup_in_a_vocabulary_reach_no_terminal_or_page(hostile_vocab_lm, tmp_path):
    from attnviz.data.capture import Capture

    saved = tmp_path / "g.npz"
    env = {"FORCE_COLOR": "1", "COLUMNS": "200"}
    writing = ["hello hello", "-m", hostile_vocab_lm, "--max-new-tokens", "16", "--sample", "--temperature", "100"]
    written = run("generate", *writing, "-o", saved, env=env)
    assert written.exit_code == 0, written.output
    tokens = Capture.load(saved).tokens
    assert set(HOSTILE_TOKENS) <= {t.removeprefix("##") for t in tokens[2:]} and len(tokens) == 18  # it wrote each
    outputs = [written.output]
    for command in (["heatmap", "--from", saved, "-t"], ["heads", "--from", saved], ["token", "3", "--from", saved],
                    ["generate", *writing, "-t"]):
        result = run(*command, env=env)
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    for output in outputs:
        assert "\x07" not in output and "\x1b[31mred" not in output and "\x1b]0;" not in output
    assert any("<script>" in output for output in outputs)  # markup is shown as the text it is
    page = tmp_path / "page.html"
    assert run("view", "--from", saved, "-o", page).exit_code == 0
    html = page.read_text(encoding="utf-8")
    assert "<script>alert(1)</script>" not in html and "\x1b" not in html and "\x07" not in html
