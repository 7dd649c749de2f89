"""Output folders and files: never delete what attnviz did not write, never leave half-written output, one
line for a full disk, a clean exit on SIGTERM (workers included), one winner when two exports race."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import make_capture, one_line_error, run

from attnviz.api import gallery as export_module
from attnviz.render import heads as heads_module
from attnviz.data.capture import Capture
from attnviz.errors import OutputError
from attnviz.api.gallery import export


def small_capture(L=2, H=2, T=6, seed=0):
    rng = np.random.default_rng(seed)
    return make_capture(rng.dirichlet(np.ones(T), size=(L, H, T)).astype(np.float32))


def big_capture(path, L=12, H=12, T=64):
    """A capture whose export takes a second or two: time to interrupt it."""
    rng = np.random.default_rng(1)
    tokens = [f"w{i}" for i in range(T)]
    return make_capture(rng.dirichlet(np.full(T, 0.3), size=(L, H, T)).astype(np.float32), tokens).save(path)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_out_dir_symlink_keeps_the_link_and_fills_its_folder(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    written = export(small_capture(), link, layer=[0], head=[0])
    assert link.is_symlink() and written == real.resolve()
    assert (real / "index.html").exists() and leftovers(tmp_path) == []
    broken = tmp_path / "broken"
    broken.symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputError, match="broken symbolic link"):
        export(small_capture(), broken, layer=[0], head=[0])


def test_out_dir_dot_is_the_current_folder(tmp_path, monkeypatch):
    path = small_capture().save(tmp_path / "c.npz")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    result = run("export", "--from", path, "--out-dir", ".", "--workers", "1")
    assert result.exit_code == 0, result.output
    assert (here / "index.html").exists()
    assert "not empty" in one_line_error(run("export", "--from", path, "--out-dir", ".", "--workers", "1"))
    result = run("export", "--from", path, "--out-dir", ".", "--workers", "1", "--force")
    assert result.exit_code == 0, result.output  # an earlier export of its own: replaced
    assert "cannot export to /" in one_line_error(run("export", "--from", path, "--out-dir", "/"))


def test_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    path = small_capture().save(tmp_path / "c.npz")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(heads_module, "encode_scanlines", full)
    message = one_line_error(run("export", "--from", path, "--out-dir", tmp_path / "e", "--workers", "1"))
    assert "No space left on device" in message
    assert not (tmp_path / "e").exists() and leftovers(tmp_path) == []
    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "savefig", full)
    message = one_line_error(run("heatmap", "--from", path, "-o", tmp_path / "h.png"))
    assert "No space left on device" in message and sorted(p.name for p in tmp_path.iterdir()) == ["c.npz"]


def test_a_file_put_into_the_folder_during_the_export_is_never_deleted(tmp_path, monkeypatch):
    target = tmp_path / "out"
    target.mkdir()  # empty: allowed without --force
    real_render = export_module.render_panels

    def render_and_meddle(*args, **kwargs):
        real_render(*args, **kwargs)
        (target / "notes.txt").write_text("written by the user meanwhile")

    monkeypatch.setattr(export_module, "render_panels", render_and_meddle)
    with pytest.raises(OutputError, match="changed while the export ran"):
        export(small_capture(), target, layer=[0], head=[0])
    assert [p.name for p in target.iterdir()] == ["notes.txt"] and leftovers(tmp_path) == []


def test_an_earlier_export_changed_during_a_forced_export_is_kept(tmp_path, monkeypatch):
    target = export(small_capture(), tmp_path / "out", layer=[0], head=[0])
    real_render = export_module.render_panels

    def render_and_meddle(*args, **kwargs):
        real_render(*args, **kwargs)
        (target / "index.html").write_text("edited meanwhile")

    monkeypatch.setattr(export_module, "render_panels", render_and_meddle)
    with pytest.raises(OutputError, match="changed while the export ran"):
        export(small_capture(), target, layer=[1], head=[1], force=True)
    assert (target / "index.html").read_text() == "edited meanwhile" and (target / "layer00_head00.png").exists()
    assert leftovers(tmp_path) == []


def processes_mentioning(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def attnviz_command() -> list[str]:
    return [sys.executable, "-m", "attnviz"]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find worker processes")
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.slow
def test_signal_mid_export_cleans_up_and_stops_the_workers(tmp_path, sig, code):
    capture = big_capture(tmp_path / "big.npz")
    target = tmp_path / f"sig-{sig.name}-target"
    process = subprocess.Popen([*attnviz_command(), "export", "--from", str(capture), "--out-dir", str(target),
                                "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not any(p.name.startswith(f".{target.name}.") for p in tmp_path.iterdir()):  # staging exists
        assert time.time() < deadline and process.poll() is None, "the export never started"
        time.sleep(0.02)
    time.sleep(0.3)  # inside the drawing
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("Error:")
    assert not target.exists() and leftovers(tmp_path) == []
    time.sleep(0.2)
    assert processes_mentioning(target.name) == [], "worker processes outlived the export"


@pytest.mark.slow
def test_two_exports_into_one_folder_one_wins_the_other_says_so(tmp_path):
    capture = big_capture(tmp_path / "big.npz", T=32)
    target = tmp_path / "shared"
    command = [*attnviz_command(), "export", "--from", str(capture), "--out-dir", str(target), "--workers", "1"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = [(p.wait(timeout=120), p.communicate()[1]) for p in (first, second)]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 1], results
    loser = next(stderr for code, stderr in results if code == 1)
    assert "changed while the export ran" in loser or "not empty" in loser
    assert (target / "index.html").exists() and leftovers(tmp_path) == []
    Capture.load(target / "attention.npz")


def test_a_manifest_naming_files_elsewhere_is_refused(tmp_path):
    import json

    from attnviz.api.gallery import MANIFEST

    victim = tmp_path / "victim.txt"
    victim.write_text("not attnviz's")
    target = export(small_capture(), tmp_path / "out", layer=[0], head=[0])
    manifest = json.loads((target / MANIFEST).read_text())
    manifest["files"]["../victim.txt"] = {"size": 13, "sha256": "0"}
    (target / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(OutputError, match="not there"):
        export(small_capture(), target, layer=[0], head=[1], force=True)
    assert victim.read_text() == "not attnviz's"


@pytest.mark.slow
def test_force_never_replaces_another_commands_folder(tmp_path, shard, cat_capture, tiny_model_dir):
    import shutil

    stats = tmp_path / "stats"
    shutil.copytree(shard, stats)
    before = {p.name: p.read_bytes() for p in stats.iterdir()}
    capture = cat_capture.save(tmp_path / "c.npz")
    line = one_line_error(run("export", "--from", capture, "--out-dir", stats, "--layers", "0", "--heads", "0",
                              "--force"))
    assert "corpus statistics" in line and "not an attnviz export" in line
    assert {p.name: p.read_bytes() for p in stats.iterdir()} == before
    exported = tmp_path / "exported"
    assert run("export", "--from", capture, "--out-dir", exported, "--layers", "0", "--heads", "0").exit_code == 0
    (tmp_path / "t.txt").write_text("The cat sat.\n")
    line = one_line_error(run("corpus", tmp_path / "t.txt", "-m", tiny_model_dir("bert"), "-o", exported,
                              "--force"))
    assert "export" in line
    # the same command still replaces its own folder
    assert run("export", "--from", capture, "--out-dir", exported, "--layers", "0", "--heads", "1",
               "--force").exit_code == 0
    assert run("corpus", tmp_path / "t.txt", "-m", tiny_model_dir("bert"), "-o", stats, "--force").exit_code == 0


@pytest.mark.slow
def test_an_old_manifest_without_its_command_is_told_apart_by_its_files(tmp_path, shard, cat_capture):
    import shutil

    stats = tmp_path / "stats"
    shutil.copytree(shard, stats)
    manifest = json.loads((stats / "attnviz-export.json").read_text())
    manifest.pop("folder")
    (stats / "attnviz-export.json").write_text(json.dumps(manifest))
    line = one_line_error(run("export", "--from", cat_capture.save(tmp_path / "c.npz"), "--out-dir", stats,
                              "--layers", "0", "--heads", "0", "--force"))
    assert "corpus statistics" in line


# --- a real full disk and a real read-only folder, for every command that writes ---------------------------
# A tmpfs is mounted where the test may (root with CAP_SYS_ADMIN, as in CI's container); elsewhere the same
# commands run in a subprocess whose file-size limit (RLIMIT_FSIZE) makes every write past 1 KB fail with
# "File too large", the same path through the code as a full disk.

WRITERS = {  # (a saved capture, the folder to write into, a model folder, a file of texts) -> the command
    "heatmap png": lambda cap, out, model, texts: ["heatmap", "--from", cap, "-o", out / "out.png"],
    "heatmap svg": lambda cap, out, model, texts: ["heatmap", "--from", cap, "-o", out / "out.svg"],
    "capture npz": lambda cap, out, model, texts: ["capture", "The cat sat", "-m", model, "-o", out / "out.npz"],
    "view html": lambda cap, out, model, texts: ["view", "--from", cap, "-o", out / "page.html"],
    "export folder": lambda cap, out, model, texts: ["export", "--from", cap, "--out-dir", out / "gallery",
                                                     "--workers", "1"],
    "corpus folder": lambda cap, out, model, texts: ["corpus", texts, "-m", model, "--out-dir", out / "stats"],
}


@pytest.fixture
def writer_inputs(tmp_path, tiny_model_dir):
    texts = tmp_path / "texts.txt"
    texts.write_text("The cat sat on the mat.\nA dog ran in the park.\n")
    return small_capture().save(tmp_path / "c.npz"), tiny_model_dir("bert"), texts


def fill_up(folder: Path) -> None:
    """Write until the file system says it is full (leaving it full)."""
    with open(folder / "filler", "wb") as handle:
        try:
            while True:
                handle.write(bytes(1 << 16))
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    # the handle's close flushes nothing more: everything was flushed


def state_of(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} | {
        p.name + "/": sorted(q.name for q in p.iterdir()) for p in folder.iterdir() if p.is_dir()}


@pytest.mark.parametrize("writer", WRITERS)
def test_a_full_disk_is_one_line_and_the_users_files_stay_as_they_were(tmp_path, writer, writer_inputs):
    from helpers import small_filesystem

    capture, model, texts = writer_inputs
    args = WRITERS[writer](capture, tmp_path / "disk", model, texts)
    with small_filesystem(tmp_path / "disk", size="1m") as disk:
        if disk is None:
            limited = run_limited(args, tmp_path / "disk")
            assert limited.returncode == 1 and len(limited.stderr.strip().splitlines()) == 1, limited.stderr
            assert "File too large" in limited.stderr
            return
        (disk / "precious.txt").write_text("the user's own file")
        (disk / "out.png").write_bytes(b"an earlier picture")
        fill_up(disk)
        before = state_of(disk)
        message = one_line_error(run(*args))
        assert "No space left on device" in message
        assert state_of(disk) == before  # nothing half-written, nothing replaced, nothing removed


def run_limited(args, folder: Path):
    import resource

    folder.mkdir(exist_ok=True)

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))

    return subprocess.run([*attnviz_command(), *map(str, args)], capture_output=True, text=True, timeout=120,
                          preexec_fn=limit)


@pytest.mark.parametrize("writer", WRITERS)
def test_a_read_only_folder_is_one_line_and_changes_nothing(tmp_path, writer, writer_inputs):
    from helpers import small_filesystem

    capture, model, texts = writer_inputs
    with small_filesystem(tmp_path / "ro", size="1m") as folder:
        if folder is None:
            pytest.skip("mounting a read-only file system needs root here")
        (folder / "precious.txt").write_text("the user's own file")
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        before = state_of(folder)
        message = one_line_error(run(*WRITERS[writer](capture, folder, model, texts)))
        assert "Read-only file system" in message
        assert state_of(folder) == before


def test_a_signal_that_surfaces_inside_a_c_extension_as_another_error_is_still_the_signal():
    """Ctrl-C landing inside matplotlib's C++ code came back as pybind11's TypeError ("incompatible function
    arguments") and printed a traceback: an error raised after a SIGINT or SIGTERM is that signal's exit."""
    import os

    import typer

    from attnviz.cli.errors import INTERRUPTED_EXIT, TERMINATED_EXIT, cli_errors

    def interrupted_inside_c(sig):
        @cli_errors
        def command():
            try:
                os.kill(os.getpid(), sig)
                time.sleep(1)  # the handler raises here
            except BaseException:
                raise TypeError("affine_transform(): incompatible function arguments") from None
        return command

    for sig, code in ((signal.SIGINT, INTERRUPTED_EXIT), (signal.SIGTERM, TERMINATED_EXIT)):
        with pytest.raises(typer.Exit) as caught:
            interrupted_inside_c(sig)()
        assert caught.value.exit_code == code

    @cli_errors
    def plain_bug():
        raise TypeError("a real bug")

    with pytest.raises(TypeError, match="a real bug"):  # no signal: a bug stays a bug
        plain_bug()
    assert signal.getsignal(signal.SIGINT) is not None
