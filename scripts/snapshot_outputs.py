"""Run a fixed list of attnviz commands and record what each printed and wrote, to show that a change of code
leaves every output as it was.

    python scripts/snapshot_outputs.py DIR              # run every command, write DIR/manifest.json
    python scripts/snapshot_outputs.py --compare A B    # exit 1 and name each output that differs

Each entry runs the real `attnviz` command (NO_COLOR, 80 columns) in a scratch folder; stdout, the exit code
and a SHA-256 of every file written are recorded (PNG files by their pixels, so that a change of matplotlib's
metadata does not count). The commands are the samples' (scripts/make_samples.py) and the README's examples,
each command's --json and --csv, and the three inputs (TEXT, -, --text-file). Timings (cost) are left out:
they differ from run to run by nature.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CAT = "The cat sat on the mat"
IT = "The cat sat on the mat because it was tired"
KO = "나는 사과를 먹었다"

# (name, arguments, stdin). "{cap}" is a capture written by the first entry.
COMMANDS: list[tuple[str, list[str], str | None]] = [
    ("capture", ["capture", CAT, "-o", "cat.npz"], None),
    ("capture_json", ["capture", CAT, "-o", "cat2.npz", "--json"], None),
    ("heatmap", ["heatmap", CAT, "-o", "h.png"], None),
    ("heatmap_from", ["heatmap", "--from", "{cap}", "--layer", "0", "--head", "2", "-o", "h0.png"], None),
    ("heatmap_all", ["heatmap", "--from", "{cap}", "--layer", "all", "--hide-special", "-o", "hall.png"], None),
    ("heatmap_terminal", ["heatmap", CAT, "-t", "--layer", "0", "--head", "2"], None),
    ("heatmap_stdin", ["heatmap", "-", "-t", "--layer", "1"], CAT),
    ("heatmap_file", ["heatmap", "--text-file", "{text}", "-t"], None),
    ("heatmap_values", ["heatmap", "--from", "{cap}", "-t", "--layer", "1", "--head", "2", "--values"], None),
    ("heatmap_korean", ["heatmap", KO, "-t", "--layer", "0", "--head", "3"], None),
    ("heatmap_korean_words", ["heatmap", KO, "--words", "-t", "--layer", "0", "--head", "3"], None),
    ("heatmap_stream", ["heatmap", " ".join(["The quick brown fox jumps over the lazy dog."] * 12), "--stream",
                        "--pool", "16", "--layer", "0", "--head", "2", "-o", "hs.png"], None),
    ("heatmap_json", ["heatmap", CAT, "--json", "--layer", "0", "--head", "2"], None),
    ("token", ["token", IT, "it", "-o", "tok.png"], None),
    ("token_json", ["token", IT, "it", "--json"], None),
    ("token_tokens", ["token", IT, "--tokens", "cat,it", "--json"], None),
    ("why", ["why", IT, "-l", "3", "-H", "2", "--key", "cat", "--versus", "sat"], None),
    ("why_json", ["why", IT, "-l", "3", "-H", "2", "--json"], None),
    ("steps", ["steps", CAT, "--layer", "0", "--head", "2", "-o", "steps.png"], None),
    ("steps_token", ["steps", CAT, "--layer", "0", "--head", "2", "--token", "cat"], None),
    ("steps_json", ["steps", CAT, "--layer", "0", "--head", "2", "--json"], None),
    ("steps_stdin", ["steps", "-", "--layer", "1", "--head", "0"], CAT),
    ("positions", ["positions", CAT, "-o", "pos.png"], None),
    ("positions_json", ["positions", CAT, "--json"], None),
    ("compare", ["compare", "--from", "{cap}", "--layers", "0,3,5"], None),
    ("heads", ["heads", "--from", "{cap}", "--layer", "0"], None),
    ("heads_json", ["heads", CAT, "--json"], None),
    ("heads_csv", ["heads", CAT, "--csv"], None),
    ("heads_words", ["heads", KO, "--words", "--json"], None),
    ("heads_stream", ["heads", IT, "--stream", "--json"], None),
    ("entropy", ["entropy", "--from", "{cap}", "-o", "ent.png"], None),
    ("entropy_json", ["entropy", CAT, "--json"], None),
    ("rollout", ["rollout", "--from", "{cap}", "-o", "roll.png"], None),
    ("rollout_json", ["rollout", CAT, "--json"], None),
    ("norms", ["norms", CAT, "--layer", "5", "--head", "0", "-o", "norms.png"], None),
    ("norms_json", ["norms", CAT, "--json"], None),
    ("norms_csv", ["norms", CAT, "--csv"], None),
    ("sinks", ["sinks", CAT], None),
    ("sinks_json", ["sinks", CAT, "--json"], None),
    ("verify", ["verify", CAT], None),
    ("verify_json", ["verify", CAT, "--json"], None),
    ("verify_norms", ["verify", CAT, "--norms", "--json"], None),
    ("verify_from", ["verify", "--from", "{cap}", "--json"], None),
    ("scaling", ["scaling", CAT, "-o", "scaling.png"], None),
    ("scaling_json", ["scaling", CAT, "--json"], None),
    ("importance", ["importance", IT, "-o", "imp.png"], None),
    ("importance_json", ["importance", IT, "--json"], None),
    ("ablate", ["ablate", IT, "--heads", "0.2,1.3"], None),
    ("ablate_json", ["ablate", IT, "--heads", "0.2", "--json"], None),
    ("detect", ["detect", "--length", "12", "--sequences", "2", "-o", "det.png"], None),
    ("detect_json", ["detect", "--length", "12", "--sequences", "2", "--json"], None),
    ("export", ["export", "--from", "{cap}", "--out-dir", "exp", "--layers", "0,5", "--heads", "0-3"], None),
    ("view", ["view", IT, "-o", "view.html"], None),
    ("explain", ["explain"], None),
    ("explain_term", ["explain", "entropy"], None),
    ("corpus", ["corpus", str(ROOT / "scripts" / "sample_corpus.jsonl"), "--top", "12"], None),
    ("corpus_json", ["corpus", str(ROOT / "scripts" / "sample_corpus.jsonl"), "--json"], None),
    ("corpus_out", ["corpus", str(ROOT / "scripts" / "sample_corpus.jsonl"), "-o", "corpus_out"], None),
    ("token_csv", ["token", IT, "it", "--csv", "--layer", "0"], None),
    ("token_from", ["token", "--from", "{cap}", "cat", "--layer", "1"], None),
    ("heatmap_window", ["heatmap", CAT, "-t", "--layer", "0", "--head", "1", "--rows", "1-3", "--cols", "0-4"], None),
    ("heatmap_window_png", ["heatmap", CAT, "--layer", "0", "--rows", "1-3", "-o", "hw.png"], None),
    ("compare_text", ["compare", CAT, "--layers", "0,5", "--head", "1"], None),
    ("compare_json", ["compare", "--from", "{cap}", "--layers", "0,5", "--json"], None),
    ("compare_csv", ["compare", "--from", "{cap}", "--layers", "0,5", "--csv"], None),
    ("compare_png", ["compare", "--from", "{cap}", "--layers", "0,5", "-o", "cmp.png"], None),
    ("heads_label", ["heads", CAT, "--label", "previous-token"], None),
    ("heads_rows", ["heads", "--from", "{cap}", "--rows", "1-3", "--layer", "1"], None),
    ("entropy_csv", ["entropy", CAT, "--csv", "--normalised"], None),
    ("entropy_text", ["entropy", CAT, "--layer", "0-2"], None),
    ("rollout_text", ["rollout", CAT, "--token", "cat"], None),
    ("rollout_csv", ["rollout", CAT, "--csv"], None),
    ("norms_text", ["norms", CAT, "--layer", "1", "--head", "2"], None),
    ("sinks_csv", ["sinks", CAT, "--csv"], None),
    ("sinks_png", ["sinks", CAT, "-o", "sinks.png"], None),
    ("contributions", ["contributions", IT, "--token", "it"], None),
    ("contributions_json", ["contributions", IT, "--json"], None),
    ("contributions_csv", ["contributions", IT, "--csv"], None),
    ("contributions_png", ["contributions", IT, "-o", "contrib.png", "--graph", "graph.png"], None),
    ("contributions_html", ["contributions", IT, "--html", "contrib.html"], None),
    ("contributions_vz", ["contributions", CAT, "--method", "value-zeroing", "--json"], None),
    ("importance_csv", ["importance", IT, "--csv"], None),
    ("importance_text", ["importance", IT, "--top", "5"], None),
    ("ablate_terminal", ["ablate", IT, "--heads", "0.2", "-t", "--layer", "1"], None),
    ("ablate_png", ["ablate", IT, "--heads", "0.2,1.3", "-o", "abl.png"], None),
    ("ablate_mean", ["ablate", IT, "--heads", "0.2", "--mode", "mean", "--json"], None),
    ("detect_text", ["detect", "--length", "12", "--sequences", "2"], None),
    ("circuits", ["circuits", "--tokens", "200", "--listed", "3"], None),
    ("circuits_json", ["circuits", "--tokens", "200", "--json"], None),
    ("circuits_csv", ["circuits", "--tokens", "200", "--csv"], None),
    ("verify_stdin", ["verify", "-"], CAT),
    ("verify_file", ["verify", "--text-file", "{text}", "--json"], None),
    ("scaling_text", ["scaling", CAT, "--dk", "4,64,1024"], None),
    ("capture_words", ["capture", KO, "--words", "-o", "ko.npz"], None),
    ("capture_stream", ["capture", IT, "--stream", "-o", "long.npz"], None),
    ("view_from", ["view", "--from", "{cap}", "-o", "v2.html", "--layer", "0,1"], None),
    ("corpus_csv", ["corpus", str(ROOT / "scripts" / "sample_corpus.jsonl"), "--csv"], None),
    ("explain_unknown", ["explain", "entropi"], None),
    ("explain_label", ["explain", "previous-token"], None),
    ("help", ["--help"], None),
    ("version", ["--version"], None),
    ("usage_error", ["heatmap", CAT, "--layer", "9"], None),
    ("text_error", ["heatmap", "   "], None),
]

# The causal LM's entries (SmolLM2), when it is installed: its generation, ablation and steps.
SMOLLM2: list[tuple[str, list[str], str | None]] = [
    ("smollm2_generate", ["generate", "The capital of France is", "-m", "smollm2", "-n", "6", "-o", "gen.npz"], None),
    ("smollm2_generate_json", ["generate", "The capital of France is", "-m", "smollm2", "-n", "4", "--json"], None),
    ("smollm2_steps", ["steps", CAT, "-m", "smollm2", "--layer", "3", "--head", "0"], None),
    ("smollm2_ablate", ["ablate", "The capital of France is Paris. The capital of Italy is", "-m", "smollm2",
                        "--heads", "18.6,17.3", "--at", "-1", "--json"], None),
    ("smollm2_ablate_text", ["ablate", "The capital of France is Paris. The capital of Italy is", "-m", "smollm2",
                             "--heads", "18.6,17.3"], None),
    ("smollm2_generate_text", ["generate", "The capital of France is", "-m", "smollm2", "-n", "4"], None),
    ("smollm2_generate_terminal", ["generate", "The capital of France is", "-m", "smollm2", "-n", "3", "-t",
                                   "--layer", "2"], None),
    ("smollm2_heatmap_gen", ["heatmap", "--from", "gen.npz", "--rows", "generated", "-o", "gen.png"], None),
    ("smollm2_logit_attr", ["logit-attr", "The capital of France is", "-m", "smollm2"], None),
    ("smollm2_logit_attr_json", ["logit-attr", "The capital of France is", "-m", "smollm2", "--json"], None),
    ("smollm2_logit_attr_csv", ["logit-attr", "The capital of France is", "-m", "smollm2", "--csv"], None),
    ("smollm2_logit_attr_png", ["logit-attr", "The capital of France is", "-m", "smollm2", "-o", "la.png"], None),
    ("smollm2_patch", ["patch", "The capital of France is", "The capital of Italy is", "-m", "smollm2"], None),
    ("smollm2_patch_json", ["patch", "The capital of France is", "The capital of Italy is", "-m", "smollm2",
                            "--json"], None),
    ("smollm2_patch_csv", ["patch", "The capital of France is", "The capital of Italy is", "-m", "smollm2",
                           "--csv"], None),
    ("smollm2_patch_png", ["patch", "The capital of France is", "The capital of Italy is", "-m", "smollm2",
                           "-o", "patch.png", "--html", "patch.html"], None),
    ("smollm2_patch_noise", ["patch", "The capital of France is", "The capital of Italy is", "-m", "smollm2",
                             "--noise", "--positions", "--top", "3"], None),
    ("smollm2_path_patch", ["patch", "The capital of France is", "The capital of Italy is", "-m", "smollm2",
                            "--senders", "23.4", "--json"], None),
    ("smollm2_massive", ["massive", "Summer is warm. Winter is cold.", "-m", "smollm2"], None),
    ("smollm2_massive_json", ["massive", "Summer is warm. Winter is cold.", "-m", "smollm2", "--json"], None),
    ("smollm2_circuits", ["circuits", "-m", "smollm2", "--tokens", "200", "--listed", "3"], None),
    ("smollm2_retrieval", ["retrieval", "-m", "smollm2", "--lengths", "200", "--depths", "0.5", "--draws", "1",
                           "--json"], None),
    ("smollm2_retrieval_text", ["retrieval", "-m", "smollm2", "--lengths", "200", "--depths", "0.5", "--draws",
                                "1", "--top", "4"], None),
    ("smollm2_detect", ["detect", "-m", "smollm2", "--length", "12", "--sequences", "2", "--draws", "2"], None),
    ("smollm2_importance", ["importance", "The cat sat on the mat", "-m", "smollm2", "--top", "4"], None),
    ("smollm2_sinks", ["sinks", IT, "-m", "smollm2", "--json"], None),
    ("smollm2_steps_json", ["steps", CAT, "-m", "smollm2", "--layer", "3", "--head", "0", "--json"], None),
    ("smollm2_contributions", ["contributions", IT, "-m", "smollm2", "--json"], None),
    # pictures (dinov2) and sound (whisper)
    ("image_heatmap", ["heatmap", "--image", str(ROOT / "scripts" / "grace_hopper.jpg"), "--head", "0-1",
                       "-o", "img.png"], None),
    ("image_patch", ["heatmap", "--image", str(ROOT / "scripts" / "grace_hopper.jpg"), "--patch", "5,7",
                     "-o", "imgp.png"], None),
    ("image_rollout", ["rollout", "--image", str(ROOT / "scripts" / "grace_hopper.jpg"), "--json"], None),
    ("image_heads", ["heads", "--image", str(ROOT / "scripts" / "grace_hopper.jpg"), "--layer", "11"], None),
    ("image_positions", ["positions", "--image", str(ROOT / "scripts" / "grace_hopper.jpg"), "--json"], None),
    ("image_verify", ["verify", "--image", str(ROOT / "scripts" / "grace_hopper.jpg"), "--json"], None),
    ("image_sinks", ["sinks", "--image", str(ROOT / "scripts" / "grace_hopper.jpg")], None),
    ("audio_heatmap", ["heatmap", "--audio", "{wav}", "-o", "snd.png"], None),
    ("audio_capture", ["capture", "--audio", "{wav}", "-o", "snd.npz"], None),
    ("audio_heads", ["heads", "--from", "snd.npz", "--part", "cross", "--layer", "3"], None),
    ("audio_align", ["align", "--from", "snd.npz", "--json"], None),
    ("audio_align_text", ["align", "--from", "snd.npz", "-o", "align.png"], None),
    ("audio_detect", ["detect", "--audio", "{wav}", "--json"], None),
    ("audio_verify", ["verify", "--from", "snd.npz"], None),
]


def attnviz() -> list[str]:
    exe = shutil.which("attnviz", path=str(Path(sys.executable).parent)) or shutil.which("attnviz")
    return [exe] if exe else [sys.executable, "-m", "attnviz"]


def digest(path: Path) -> str:
    if path.suffix == ".png":
        from PIL import Image

        with Image.open(path) as image:
            return "png:" + hashlib.sha256(image.convert("RGBA").tobytes()).hexdigest()
    if path.suffix == ".npz":
        import numpy as np

        with np.load(path, allow_pickle=False) as data:
            h = hashlib.sha256()
            for key in sorted(data.files):
                h.update(key.encode() + data[key].tobytes())
            return "npz:" + h.hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path, smollm2: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="attnviz-snapshot-"))
    (work / "text.txt").write_text(IT + "\n", encoding="utf-8")
    if smollm2:  # the sound the Whisper entries hear
        subprocess.run(["espeak-ng", "-w", str(work / "speech.wav"), "The quick brown fox jumps over the lazy dog."],
                       check=True, capture_output=True)
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("FORCE_COLOR", None)
    manifest: dict[str, dict] = {}
    for name, args, stdin in COMMANDS + (SMOLLM2 if smollm2 else []):
        args = [a.replace("{cap}", str(work / "cat.npz")).replace("{text}", str(work / "text.txt"))
                .replace("{wav}", str(work / "speech.wav")) for a in args]
        before = {p for p in work.rglob("*") if p.is_file()}
        done = subprocess.run(attnviz() + args, input=stdin, capture_output=True, text=True, cwd=work, env=env)
        written = sorted(p for p in work.rglob("*") if p.is_file() and p not in before)
        manifest[name] = {"command": shlex.join(args), "exit": done.returncode, "stdout": done.stdout,
                          "stderr": done.stderr if done.returncode else "",
                          "files": {str(p.relative_to(work)): digest(p) for p in written}}
        print(f"{name}: exit {done.returncode}, {len(written)} files", flush=True)
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False), encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)


def compare(a: Path, b: Path) -> int:
    old = json.loads((a / "manifest.json").read_text(encoding="utf-8"))
    new = json.loads((b / "manifest.json").read_text(encoding="utf-8"))
    differing = 0
    for name in old.keys() | new.keys():
        if name not in old or name not in new:
            print(f"{name}: only in {'the first' if name in old else 'the second'}")
            differing += 1
            continue
        for field in ("exit", "stdout", "stderr", "files"):
            if old[name][field] != new[name][field]:
                print(f"{name}: {field} differs ({old[name]['command']})")
                differing += 1
    print(f"{len(old)} outputs compared, {differing} differences")
    return 1 if differing else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    snapshot(Path(sys.argv[1]), smollm2="--smollm2" in sys.argv[2:])
