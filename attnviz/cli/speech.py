"""Word timings from cross-attention (whisper's timing.py): attnviz align."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from attnviz.cli.errors import cli_errors
from attnviz.cli.group import app
from attnviz.cli.inputs import Source, takes
from attnviz.cli.output import check_output, emit, figure_file
from attnviz.cli.params import CsvOpt, ImageOut, JsonOpt, ModelOptions, whole_number

# Imports inside the command (the API, numpy, matplotlib, Rich's heavier parts) keep `attnviz --help` light.


@app.command(help="When each word was said, from the cross-attention of a speech model (Whisper): its alignment "
                  "heads' attention over the sound, standardised and median-filtered, then dynamic time warping "
                  "(whisper's timing.py, as faster-whisper's word_timestamps). Prints each word's start and end, "
                  "and every cross-attention head's share of weight on the path (which heads align, and whether "
                  "the model lists them); -o draws the path over the spectrogram.")
@cli_errors
@takes(model=ModelOptions, inp=Source.taking(
    "audio", "saved", audio="The sound (WAV or FLAC, at most 30 s; - reads standard input); the model defaults to "
                            "whisper."))
def align(heads: Annotated[Optional[str], typer.Option(
              "--heads", metavar="L.H,L.H", show_default=False,
              help="The cross-attention heads to align with (default: the model's own alignment heads, else every "
                   "head of the decoder's second half).")] = None,
          band: Annotated[int, typer.Option(
              "--band", parser=whole_number(0, 50), metavar="FRAMES",
              help="A head's weight counts as on the path within this many frames (20 ms each) of it.")] = 1,
          top: Annotated[int, typer.Option("--top", parser=whole_number(0, 10_000), metavar="K",
                                           help="How many heads to list, by their share on the path.")] = 8,
          target: Annotated[Optional[str], typer.Option(
              "--target", metavar="TEXT", show_default=False,
              help="The transcript to time (forced alignment); without it, the one the model writes.")] = None,
          output: ImageOut = None, as_json: JsonOpt = False, as_csv: CsvOpt = False, *, model: ModelOptions,
          inp: Source) -> None:
    import attnviz

    from attnviz.render.png import FORMATS

    check_output(output, FORMATS)
    if (inp.audio is None) == (inp.source is None):
        raise typer.BadParameter("give the sound to look at (--audio FILE) or a capture of one (--from "
                                 "CAPTURE.npz), one of them")
    if heads is not None:
        from attnviz.base.selection import pair_form

        pair_form(heads)  # before the sound is read and the model loads
    given = inp.resolve()
    result = attnviz.align(given, model=model.later_for(given), target=target, heads=heads, band=band, top=top,
                           reporter=inp.options()["reporter"])
    emit(result, as_json=as_json, as_csv=as_csv, files=[figure_file(output, result)])
