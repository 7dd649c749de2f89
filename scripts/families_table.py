"""Write the README's table of model families from attnviz/engine/families.py (between its two markers)."""

from __future__ import annotations

import re
from pathlib import Path

from attnviz.engine.families import markdown_table

START, END = "<!-- families: made by scripts/families_table.py -->", "<!-- /families -->"


def main() -> None:
    readme = Path(__file__).resolve().parents[1] / "README.md"
    text = readme.read_text(encoding="utf-8")
    block = f"{START}\n{markdown_table()}\n{END}"
    if START in text:
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        raise SystemExit(f"README.md has no {START} marker")
    readme.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
