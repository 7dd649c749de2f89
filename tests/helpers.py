"""What the tests share besides fixtures: tiny random models of each family built from configs and saved
with a tokenizer (no downloads), hand-made captures, and running `attnviz` as a user does."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys

CORPUS = ["The cat sat on the mat.", "A dog ran in the park!", "Attention is all you need, they said.",
          "The quick brown fox jumps over the lazy dog", "tokenization of unbelievably long words"] * 4
SENTENCE = "The cat sat on the mat"


def bpe_tokenizer(kind: str):
    """A small BPE tokenizer trained on CORPUS: byte-level (GPT-2 style, Ġ) or metaspace (Llama style, ▁)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(CORPUS, trainer)
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                       unk_token="<|endoftext|>")
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def seq2seq_tokenizer(kind: str):
    """A small metaspace BPE tokenizer with <pad>, </s>, <unk>, <s>: T5 and Marian append </s>; BART wraps
    the text in <s> … </s>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>", "<s>"])
    tok.train_from_iterator(CORPUS, trainer)
    ids = {t: tok.token_to_id(t) for t in ("<pad>", "</s>", "<unk>", "<s>")}
    template = "<s> $A </s>" if kind == "bart" else "$A </s>"
    tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=[
        ("<s>", ids["<s>"]), ("</s>", ids["</s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   bos_token="<s>"), ids


def build_tiny_seq2seq(kind: str, folder, *, init: float = 0.3):
    """Save a tiny random encoder-decoder model (T5, BART or Marian) with its language-model head and a
    tokenizer into `folder`; return the folder."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    tokenizer, ids = seq2seq_tokenizer(kind)
    vocab = len(tokenizer)
    if kind == "t5":
        config = tf.T5Config(vocab_size=vocab, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3,
                             num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                             pad_token_id=ids["<pad>"], eos_token_id=ids["</s>"],
                             decoder_start_token_id=ids["<pad>"], initializer_factor=init * 3)
        model = tf.T5ForConditionalGeneration(config)
    else:
        common = dict(vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                      pad_token_id=ids["<pad>"], eos_token_id=ids["</s>"], bos_token_id=ids["<s>"],
                      forced_eos_token_id=None, init_std=init)
        if kind == "bart":
            model = tf.BartForConditionalGeneration(tf.BartConfig(decoder_start_token_id=ids["</s>"], **common))
        else:
            model = tf.MarianMTModel(tf.MarianConfig(decoder_start_token_id=ids["<pad>"],
                                                     decoder_vocab_size=vocab, **common))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def bert_tokenizer():
    from transformers import AutoTokenizer

    from attnviz.engine.models import bundled_model_dir

    return AutoTokenizer.from_pretrained(str(bundled_model_dir()))


def build_tiny_model(kind: str, folder, *, lm: bool = False, init: float = 0.5, positions: int | None = None):
    """Save a tiny random model of `kind` with a tokenizer into `folder`; return the folder. `lm`: a causal
    language model with its head (GPT-2, Llama), for generation. `positions`: the longest input it takes (64
    for GPT-2, 128 for the others), for the long path's tests."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    # initializer_range 0.5 (not 0.02) gives peaked attention, so a wrong detail shows up as a big |Δ|
    small = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, intermediate_size=64,
                 initializer_range=init)
    if kind in ("bert", "roberta", "electra", "distilbert"):
        tokenizer = bert_tokenizer()
        vocab = tokenizer.vocab_size
        if kind == "bert":
            model = tf.BertModel(tf.BertConfig(vocab_size=vocab, **small))
        elif kind == "roberta":
            model = tf.RobertaModel(tf.RobertaConfig(vocab_size=vocab, pad_token_id=0, **small))
        elif kind == "electra":
            model = tf.ElectraModel(tf.ElectraConfig(vocab_size=vocab, embedding_size=16, **small))
        else:
            model = tf.DistilBertModel(tf.DistilBertConfig(vocab_size=vocab, n_layers=2, n_heads=4, dim=32,
                                                           hidden_dim=64, initializer_range=0.5))
    elif kind == "gpt2":
        tokenizer = bpe_tokenizer("bytelevel")
        eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        model = (tf.GPT2LMHeadModel if lm else tf.GPT2Model)(tf.GPT2Config(
            vocab_size=len(tokenizer), n_layer=2, n_head=4, n_embd=32, n_positions=positions or 64, bos_token_id=eot,
            eos_token_id=eot, initializer_range=init))
    elif kind in ("llama", "mistral", "qwen2"):
        tokenizer = bpe_tokenizer("metaspace")
        cfg = dict(vocab_size=len(tokenizer), num_key_value_heads=2, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id, pad_token_id=None, max_position_embeddings=positions or 128,
                   rope_theta=10000.0, **small)
        if kind == "llama":
            model = (tf.LlamaForCausalLM if lm else tf.LlamaModel)(tf.LlamaConfig(**cfg))
        elif kind == "mistral":
            model = tf.MistralModel(tf.MistralConfig(sliding_window=None, **cfg))
        else:
            model = tf.Qwen2Model(tf.Qwen2Config(**cfg))
    elif kind in TODAYS:
        tokenizer = bpe_tokenizer("metaspace")
        model = todays_model(kind, tokenizer, small, positions or 128)
    else:
        raise ValueError(kind)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# Today's families, each with what its attention adds switched on and sized to matter on a short text:
# sliding windows of 4 tokens, alternating with full layers where the family alternates.
TODAYS = ("mistral-window", "qwen3", "phi3", "gemma2", "gemma3", "smollm3", "olmo2", "cohere2", "gpt_oss",
          "modernbert")
WINDOW = 4


def todays_model(kind: str, tokenizer, small: dict, positions: int = 128):
    import torch
    import transformers as tf

    alternating = ["sliding_attention", "full_attention"]
    cfg = dict(vocab_size=len(tokenizer), num_key_value_heads=2, bos_token_id=tokenizer.bos_token_id,
               eos_token_id=tokenizer.eos_token_id, pad_token_id=None, max_position_embeddings=positions, **small)
    if kind == "mistral-window":
        return tf.MistralModel(tf.MistralConfig(sliding_window=WINDOW, **cfg))
    if kind == "qwen3":
        return tf.Qwen3Model(tf.Qwen3Config(head_dim=8, **cfg))
    if kind == "phi3":
        return tf.Phi3Model(tf.Phi3Config(**cfg))
    if kind == "gemma2":
        return tf.Gemma2Model(tf.Gemma2Config(head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=6,
                                              attn_logit_softcapping=3.0, final_logit_softcapping=None,
                                              layer_types=alternating, **cfg))
    if kind == "gemma3":
        return tf.Gemma3TextModel(tf.Gemma3TextConfig(head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=6,
                                                      layer_types=alternating, **cfg))
    if kind == "smollm3":
        return tf.SmolLM3Model(tf.SmolLM3Config(no_rope_layers=[1, 0], **cfg))
    if kind == "olmo2":
        return tf.Olmo2Model(tf.Olmo2Config(**cfg))
    if kind == "cohere2":
        return tf.Cohere2Model(tf.Cohere2Config(sliding_window=WINDOW, layer_types=alternating, **cfg))
    if kind == "gpt_oss":
        model = tf.GptOssModel(tf.GptOssConfig(head_dim=8, sliding_window=WINDOW, layer_types=alternating,
                                               num_local_experts=4, num_experts_per_tok=2, **cfg))
        with torch.no_grad():  # sinks of either sign and size, so rows keep between a tenth and all of their mass
            for layer in model.layers:
                layer.self_attn.sinks.copy_(torch.linspace(-3.0, 1.5, layer.self_attn.sinks.numel()))
        return model
    if kind == "modernbert":
        return tf.ModernBertModel(tf.ModernBertConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, local_attention=WINDOW, layer_types=["full_attention", "sliding_attention",
                                                                          "full_attention"],
            initializer_range=0.5, pad_token_id=tokenizer.unk_token_id, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, cls_token_id=tokenizer.bos_token_id,
            sep_token_id=tokenizer.eos_token_id, max_position_embeddings=128))
    raise ValueError(kind)


def once(make):
    """get(kind) -> make(kind), made once per kind."""
    made: dict = {}

    def get(kind: str):
        if kind not in made:
            made[kind] = make(kind)
        return made[kind]

    return get


def make_capture(alpha, tokens=None, *, causal=False, special=None, kinds=None):
    """A Capture from a hand-made α (L, H, T, T) for metric and renderer tests."""
    import numpy as np

    from attnviz.data.capture import Capture

    alpha = np.asarray(alpha, dtype=np.float32)
    T = alpha.shape[-1]
    tokens = tokens or [f"t{i}" for i in range(T)]
    special = special if special is not None else [False] * T
    kinds = kinds or ["" if not s else "other" for s in special]
    return Capture(attentions=alpha, tokens=tokens, token_ids=list(range(T)), special=special,
                   special_kind=kinds, subword=[False] * T, meta={"model": "hand-made", "causal": causal})


def run(*args, **kwargs):
    """`attnviz ARGS` through Typer's CliRunner (stdout and stderr kept apart)."""
    from typer.testing import CliRunner

    from attnviz.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], **kwargs)


def one_line_error(result, code=1):
    """Assert the command failed with `code` and said so in exactly one line on stderr; return that line."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    return lines[0]


TEXTS = ["The cat sat on the mat.", "A dog ran in the park!", "Attention is all you need."]


def run_bounded(*args, timeout=60, **kwargs):
    """attnviz in a fresh process with a time limit: a command that blocks fails the test instead of hanging."""
    return subprocess.run([sys.executable, "-m", "attnviz", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def chromium_path() -> str | None:
    """The Chromium the browser tests drive: $ATTNVIZ_CHROMIUM, else the system's."""
    import os
    import shutil

    return os.environ.get("ATTNVIZ_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def browser_missing(why: str):
    """Skip, saying what to install; fail where the browser tests must run (CI sets ATTNVIZ_REQUIRE_BROWSER)."""
    import os

    import pytest

    if os.environ.get("ATTNVIZ_REQUIRE_BROWSER"):
        pytest.fail(f"ATTNVIZ_REQUIRE_BROWSER is set but {why}")
    pytest.skip(why)


def require_real(model):
    """The offline model's source files; skip (saying what to install) unless CI requires the real models."""
    import os

    import pytest

    from attnviz.engine import offline
    from attnviz.errors import ModelLoadError

    try:
        return offline.sources(model)
    except ModelLoadError as exc:
        if os.environ.get("ATTNVIZ_REQUIRE_REAL_MODELS"):
            pytest.fail(f"ATTNVIZ_REQUIRE_REAL_MODELS is set but {exc}")
        pytest.skip(str(exc))


def write_tiny_gguf(kind: str, path, *, unknown_token: bool = True):
    """A tiny random causal LM of `kind` written as a GGUF file the way llama.cpp lays one out: transformers'
    own tensor-name map read backwards, the config's GGUF keys, a byte-level BPE tokenizer. (The package index
    ships no GGUF checkpoint of these families; SmolLM2 is the real one, a Llama.)"""
    import json

    import gguf
    import numpy as np
    import torch
    import transformers as tf
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    torch.manual_seed(0)
    tok = bpe_tokenizer("bytelevel")
    small = dict(vocab_size=len(tok), num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 hidden_size=32, intermediate_size=64, max_position_embeddings=128, initializer_range=0.5,
                 bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=None)
    if kind == "qwen3":  # GGUF gives qwen3 no key_length: transformers takes head_dim's default, 128
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(head_dim=128, **small))
    elif kind == "gemma2":
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(head_dim=8, sliding_window=4, **small))
    else:
        model = tf.Phi3ForCausalLM(tf.Phi3Config(**small))
    config = model.config
    processor = TENSOR_PROCESSORS.get(kind, TensorProcessor)(config=config.to_dict())
    names = get_gguf_hf_weights_map(model, processor)  # GGUF name -> HF name
    writer = gguf.GGUFWriter(str(path), kind)
    writer.add_name(f"tiny {kind}")
    for key, hf_key in GGUF_CONFIG_MAPPING[kind].items():
        value = getattr(config, hf_key, None) if hf_key and key != "vocab_size" else None
        if isinstance(value, bool) or value is None:
            continue
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(f"{kind}.{key}", value)
    writer.add_float32(f"{kind}.rope.freq_base", float(config.rope_parameters["rope_theta"]))
    writer.add_uint32(f"{kind}.rope.dimension_count", config.head_dim if kind != "phi3" else 8)
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda item: item[1])]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t == "<|endoftext|>" else gguf.TokenType.NORMAL
                            for t in tokens])
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_bos_token_id(tok.bos_token_id)
    writer.add_eos_token_id(tok.eos_token_id)
    writer.add_pad_token_id(tok.eos_token_id)
    if unknown_token:
        writer.add_unk_token_id(tok.eos_token_id)
    state = model.state_dict()
    for gguf_name, hf_name in names.items():
        weights = state[hf_name].detach().float().numpy()
        if kind == "gemma2" and "norm.weight" in hf_name:
            weights = weights + 1  # llama.cpp stores Gemma's norms as 1 + w
        writer.add_tensor(gguf_name, np.ascontiguousarray(weights))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@contextlib.contextmanager
def small_filesystem(folder, *, size: str = "256k", read_only: bool = False):
    """A tmpfs of `size` mounted at `folder` (read-only with `read_only`), unmounted afterwards; yields None
    where this process may not mount one (not root, no CAP_SYS_ADMIN), so the test can simulate instead."""
    import os

    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    if os.name != "posix" or shutil.which("mount") is None:
        yield None
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                             capture_output=True).returncode == 0
    try:
        yield folder if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def read_three_ways(command: str, text: str, tmp_path, *args) -> list:
    """`attnviz COMMAND` with the text as TEXT, on standard input (-) and from --text-file, each with `args` and
    --json: the three outputs parsed (they must be equal)."""
    import json

    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    return [json.loads(run(command, text, *args, "--json").stdout),
            json.loads(run(command, "-", *args, "--json", input=text).stdout),
            json.loads(run(command, "--text-file", path, *args, "--json").stdout)]


def espeak(folder, text: str, voice: str = "en"):
    """A WAV file of espeak-ng speaking `text` in `voice` (en, ko, ja, …; 22,050 Hz); skip, saying what to
    install, unless CI requires the real models."""
    import os
    import shutil

    import pytest

    if shutil.which("espeak-ng") is None:
        if os.environ.get("ATTNVIZ_REQUIRE_REAL_MODELS"):
            pytest.fail("ATTNVIZ_REQUIRE_REAL_MODELS is set but espeak-ng is missing (apt-get install espeak-ng)")
        pytest.skip("espeak-ng makes the speech: apt-get install espeak-ng")
    path = folder / "speech.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True, capture_output=True)
    return path


def rendered(result, width: int = 80, **style) -> str:
    """A result's terminal report as the command line prints it through a pipe (plain text, no colour, the
    spaces at the ends of lines trimmed): what its command's stdout must be."""
    import io

    from rich.console import Console

    from attnviz.api.result import Line
    from attnviz.base.text import visible
    from attnviz.cli.output import flag
    from attnviz.errors import spell

    console = Console(width=width, file=io.StringIO(), record=True, color_system=None, force_terminal=False)
    for item in result.report(width=width, color=False, **{"tty": False, **style}):
        if isinstance(item, Line):
            if not item.stderr:
                console.print(visible(spell(item.text, flag), "\n\t" if item.lines else ""), soft_wrap=not item.wrap,
                              highlight=False)
        else:
            console.print(item)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


# --- pages in a real browser -----------------------------------------------------------------------------


class Page:
    """A page opened offline; every request other than the file itself (and, for the export's gallery, the
    images beside it) is recorded, and any request off this machine aborted."""

    def __init__(self, browser, path, local_files: bool = False):
        self.context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        folder = path.parent.as_uri() + "/"
        self.page.on("request", lambda r: None if r.url == path.as_uri() or (local_files and r.url.startswith(folder))
                     else self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.route(re.compile(r"^(?!file:).*"), lambda route: (self.requests.append(route.request.url),
                                                                    route.abort()))
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("html[data-attnviz-ready='1']", state="attached", timeout=10_000)

    def js(self, expression: str):
        return self.page.evaluate(expression)

    def lines(self) -> int:
        return self.js("window.attnvizViewer.drawnLines()")

    def close(self):
        assert self.errors == [], self.errors
        assert self.requests == [], self.requests
        assert self.dialogs == [], self.dialogs
        self.context.close()


def write_page(tmp_path, whole, name="view.html", **kwargs):
    path = tmp_path / name
    from attnviz.render.viewer import viewer_data, viewer_html

    path.write_text(viewer_html(viewer_data(whole, command="attnviz view (test)", **kwargs)), encoding="utf-8")
    return path


# --- shared by several layers' tests --------------------------------------------------------------------


def photo(height: int = 50, width: int = 70, seed: int = 0, fmt: str = "PNG") -> bytes:
    """A small picture of random blocks, as a file's bytes."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = np.kron(rng.integers(0, 256, (height // 10 + 1, width // 10 + 1, 3)), np.ones((10, 10, 1)))
    buffer = io.BytesIO()
    Image.fromarray(pixels[:height, :width].astype(np.uint8)).save(buffer, format=fmt)
    return buffer.getvalue()


def model_state(model) -> dict:
    """What a borrowed model must get back: mode, attention implementation, gradients, requires_grad, places,
    and every hook on every module."""
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())
    return {"training": model.training, "modes": [m.training for m in model.modules()],
            "attention": model.config._attn_implementation, "hooks": hooks,
            "grads": [p.grad is None for p in model.parameters()],
            "requires_grad": [p.requires_grad for p in model.parameters()],
            "places": {(str(p.device), str(p.dtype)) for p in model.parameters()}}


def header_cells(output: str) -> list[str]:
    """The column headers of every table in a command's plain output: the line above a rule of ─, cut at runs
    of two or more spaces."""
    lines = output.splitlines()
    cells = []
    for above, line in zip(lines, lines[1:]):
        if re.fullmatch(r"\s*─{3,}[─\s]*", line):
            cells += [c.strip() for c in re.split(r"\s{2,}", above) if c.strip()]
    return cells


def explainable(cell: str, tokens: set[str]) -> bool:
    """A table header that `attnviz explain` finds as it is printed (numbers and the text's tokens aside): a
    header "τ loo" must be found as "τ loo", not only as "τ" and "loo"."""
    from attnviz.metrics import lookup

    if re.fullmatch(r"-?\d+", cell) or cell in tokens or lookup(cell):
        return True
    vector = re.fullmatch(r"(‖)?(q|k|v|out)(‖)?(\[\d+\])?", cell)
    if vector:
        return bool(lookup(vector.group(2)))
    return False


def equals_transformers_gguf(path, loaded, text: str, shape: tuple[int, int]) -> None:
    """A joined GGUF file read by transformers' own GGUF path (removed afterwards) against attnviz's converted
    `loaded` model (with its head): the same token ids, α within 1e-5 (the same float32 weights, dequantized
    once each way) of `shape` (layers, heads), the logits within 1e-4 of their size."""
    import warnings

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnviz.engine.forward import capture_text

    from unittest import mock

    import gguf

    class Plain(gguf.GGUFReader):  # the same bytes, sliced through a plain ndarray view (numpy's memmap slices slowly)
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value):
            self._plain = value.view(np.ndarray)

    made: dict = {}

    def reader(where, mode="r"):  # read once: transformers opens the file for the tokenizer and the weights
        if (str(where), mode) not in made:
            made[(str(where), mode)] = Plain(where, mode)
        return made[(str(where), mode)]

    with warnings.catch_warnings(), mock.patch.object(gguf, "GGUFReader", reader):
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="eager",
                                                     dtype=torch.float32).eval()
    path.unlink()
    capture = capture_text(text, loaded)
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids[0].tolist() == list(capture.token_ids)
    with torch.inference_mode():
        theirs = model(input_ids=ids, output_attentions=True)
        ours = loaded.model(input_ids=ids)
    alpha = np.stack([a[0].double().numpy() for a in theirs.attentions])
    assert alpha.shape == capture.attentions.shape == (*shape, len(ids[0]), len(ids[0]))
    assert np.abs(alpha - capture.attentions).max() <= 1e-5
    assert float((theirs.logits - ours.logits).abs().max()) <= 1e-4 * max(1.0, float(theirs.logits.abs().max()))


def largest():
    """A dispatch mode recording every tensor the ops make, forward and backward: the most elements one had
    (`most`, its `shape`), the ops' names (`ops`) and how many times each ran (`counts`).
    `with largest() as probe: …`."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Largest(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.most, self.shape = 0, ()
            self.ops: set[str] = set()
            self.counts: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket.__name__)
            self.ops.add(name)
            self.counts[name] = self.counts.get(name, 0) + 1
            for t in tree_leaves(out):  # numbers (a boolean mask of T × T, shared by the layers, is not α)
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > self.most:
                    self.most, self.shape = t.numel(), tuple(t.shape)
            return out

    return Largest()


STORY_WORDS = "the cat sat on the mat and the dog ran to the park while a bird sang in the old tree".split()


def story(n: int) -> str:
    """n words of a plain story, for long inputs."""
    return " ".join(STORY_WORDS[i % len(STORY_WORDS)] for i in range(n))


def story_pair(n: int) -> tuple[str, str]:
    """A clean and a corrupted prompt of as many tokens: the story, then " so the cat" / " so the dog"."""
    body = story(n)
    return body + " so the cat", body + " so the dog"
