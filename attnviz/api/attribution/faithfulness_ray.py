"""`attnviz faithfulness --corpus FILE --engine ray`: the texts spread over Ray Data as `attnviz corpus` spreads
them, a pool of actors that each load the model once and measure their texts; every text's summary comes back
as JSON and is gathered on the driver exactly as the local run gathers them. Ray is imported only here."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

from attnviz.errors import InputError
from attnviz.progress import Reporter


class FaithfulnessWorker:
    """A Ray actor: loads the model once, then measures each text of a batch (a summary, or why not)."""

    def __init__(self, model_options: dict, options: dict, measure: Callable) -> None:
        from attnviz.engine.models import load

        self.loaded = load(**model_options, lm_head="auto")
        self.loaded.model.eval()
        self.options = options
        self.measure = measure  # faithfulness's measure_one (handed in: this module does not import that one)

    def __call__(self, batch: dict) -> dict:
        return {"result": [json.dumps({"number": int(n), "found": self.measure(self.loaded, int(n), str(t),
                                                                                 self.options)})
                           for n, t in zip(batch["number"], batch["text"])]}


def measure_on_ray(texts: list[str], model_options: dict, options: dict, measure: Callable, *, address: str | None,
                   workers: int, reporter: Reporter) -> tuple[list[dict], list[tuple[int, str]]]:
    """Every text measured by `workers` actors; (the summaries in the texts' order, the skipped ones)."""
    from attnviz.engine.corpora.ray import _ray, check_address, ray_failure, start_ray

    if address is not None:
        check_address(address)
    ray = _ray()
    started_here = not ray.is_initialized()
    found: dict[int, object] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(reporter.status(f"Measuring {len(texts):,} texts on Ray ({workers} workers)…"))
        try:
            start_ray(ray, address, workers)
            data = ray.data.from_items([{"number": n, "text": t} for n, t in enumerate(texts, 1)],
                                       override_num_blocks=max(1, min(len(texts), workers * 4)))
            pool = ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1)
            gpus = 1 if model_options.get("device") == "cuda" else 0
            results = data.map_batches(FaithfulnessWorker, fn_constructor_kwargs=dict(model_options=model_options,
                                                                                      options=options,
                                                                                      measure=measure),
                                       batch_size=1, compute=pool, num_gpus=gpus, num_cpus=0 if gpus else 1,
                                       max_restarts=0, batch_format="numpy")
            for row in results.iter_rows():
                value = json.loads(row["result"])
                found[int(value["number"])] = value["found"]
        except InputError:
            raise
        except Exception as exc:  # Ray wraps a worker's error in its own exception types
            raise ray_failure(exc) from None
        finally:
            if started_here and ray.is_initialized():
                ray.shutdown()
    measured = [found[n] for n in sorted(found) if isinstance(found[n], dict)]
    skipped = [(n, str(found[n][1])) for n in sorted(found) if isinstance(found[n], list)]  # type: ignore[index]
    return measured, skipped  # type: ignore[return-value]
