"""attnviz serve: the live app. One model loaded once; a page that redraws every view for each text; a JSON API
(app.py) behind a guard (guard.py: Host, Origin, body size) and a line of one request at a time (queue.py).
Needs FastAPI and uvicorn: pip install 'attnviz[serve]'."""

from __future__ import annotations

INSTALL = "pip install 'attnviz[serve]'"
