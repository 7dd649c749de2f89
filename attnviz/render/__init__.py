"""Renderers: Capture and metrics -> matplotlib Figures (png.py), Rich renderables (terminal.py, tables.py),
the export gallery (html.py). They build; they never print."""
