"""Word timings from cross-attention (whisper's timing.py): attnviz align."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import SoundInput, takes
from attnviz.cli.output import check_output, emit_records, err, out, output_path, print_json, say
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, whole_number

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help="When each word was said, from the cross-attention of a speech model (Whisper): its alignment "
                  "heads' attention over the sound, standardised and median-filtered, then dynamic time warping "
                  "(whisper's timing.py, as faster-whisper's word_timestamps). Prints each word's start and end, "
                  "and every cross-attention head's share of weight on the path (which heads align, and whether "
                  "the model lists them); -o draws the path over the spectrogram.")
@cli_errors
@takes(inp=SoundInput)
def align(heads: Annotated[Optional[str], typer.Option(
              "--heads", metavar="L.H,L.H", show_default=False,
              help="The cross-attention heads to align with (default: the model's own alignment heads, else every "
                   "head of the decoder's second half).")] = None,
          band: Annotated[int, typer.Option(
              "--band", parser=whole_number(0, 50), metavar="FRAMES",
              help="A head's weight counts as on the path within this many frames (20 ms each) of it.")] = 1,
          top: Annotated[int, typer.Option("--top", parser=whole_number(0, 10_000), metavar="K",
                                           help="How many heads to list, by their share on the path.")] = 8,
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, *, inp: SoundInput) -> None:
    from attnviz.api import align as run
    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    parts = inp.parts()
    timings = run(parts, heads=heads, band=band)
    if as_json:
        print_json(timings.to_dict())
    elif as_csv:
        emit_records(timings.records(), False, True)
    else:
        show(timings, top)
    if output is not None:
        from attnviz.render.png import save_figure

        say(save_figure(timings.figure(), output_path(output, "attnviz_align.png")),
            console=err if (as_json or as_csv) else out)


def show(timings, top: int) -> None:
    """The words' table, the heads' table and what they say."""
    from attnviz.api.speech import describe
    from attnviz.render.tables import records_table

    say(describe(timings), style="bold")
    out.print(records_table(timings.records(), [("word", "word", ""), ("start", "start (s)", ".2f"),
                                                ("end", "end (s)", ".2f")], title="words"))
    show_heads(timings, top)


def show_heads(timings, top: int) -> None:
    """The heads' table (the `top` by share on the path) and which heads align, listed or not."""
    from attnviz.api.speech import LISTED_SHARE
    from attnviz.render.tables import records_table

    if top:
        rows = [{**r, "listed": "✓" if r["listed"] else ""} for r in timings.head_records()[:top]]
        columns = [("layer", "layer", "d"), ("head", "head", "d"), ("on_path", "on the path", ".1%"),
                   ("listed", "listed", "")]
        out.print(records_table(rows, columns,
                                title=f"cross-attention heads by their share within {timings.band} frame"
                                      f"{'s' if timings.band != 1 else ''} of the path"))
    found = timings.aligning()
    listed = set(timings.model_heads)
    named = ", ".join(f"{n}.{h}{' (listed)' if (n, h) in listed else ''}" for n, h in found) or "none"
    say(f"heads with at least {LISTED_SHARE:.0%} of their weight on the path: {named}")
    if listed:
        say(f"{len(set(found) & listed)} of the model's {len(listed)} listed alignment heads are among them")


def aligned_heads(inp: SoundInput, output: str | None, as_json: bool) -> None:
    """attnviz detect --audio: every cross-attention head's share of weight on the word-timing path, and
    whether the model lists it; -o draws the shares, layers × heads."""
    from attnviz.api import align as run
    from attnviz.api.speech import describe, LISTED_SHARE

    timings = run(inp.parts())
    if as_json:
        print_json({"model": timings.model, "band_frames": timings.band, "threshold": LISTED_SHARE,
                    "aligning": [list(p) for p in timings.aligning()],
                    "listed": [list(p) for p in timings.model_heads], "heads": timings.head_records()})
    else:
        say(describe(timings), style="bold")
        show_heads(timings, len(timings.head_records()))
    if output is not None:
        from attnviz.panels import head_grid_panel, Scale, short_model
        from attnviz.render.png import panel_figure, save_figure

        panel = head_grid_panel(timings.scores, Scale(0.0, 1.0, "share of weight on the path"),
                                f"{short_model(timings.model)} · cross-attention heads on the word-timing path",
                                "attnviz_detect_alignment")
        say(save_figure(panel_figure(panel), output_path(output, "attnviz_detect_alignment.png")),
            console=err if as_json else out)
