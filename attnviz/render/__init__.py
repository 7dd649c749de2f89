"""Renderers: Panels and Pages (attnviz.panels) -> matplotlib Figures (png.py), Rich renderables
(terminal.py, tables.py), the export gallery (html.py), PNG files (encode.py). They build; they never print,
and they decide nothing about what a picture shows."""

FORMATS = (".png", ".svg", ".pdf")  # the image files a figure is saved as (the suffix chooses)
