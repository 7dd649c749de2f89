"""What Whisper can be told about a sound: the languages it knows and its two tasks. No numpy here, so that the
command line's options read them without importing the sound reader."""

from __future__ import annotations

__all__ = ["LANGUAGES", "TASKS"]

# Whisper's languages, in the order of its tokens (<|en|> 50259 on): what --language takes
LANGUAGES = ("en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg "
             "lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so "
             "af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue"
             ).split()
TASKS = ("transcribe", "translate")
