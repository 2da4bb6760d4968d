"""Pictures of a pipeline schedule: one row per slice, one box per forward or backward step.

The planned picture times each worker's steps in its schedule order (see
`pipeline.schedule_steps`), a step starting when its worker is free and
what it reads exists, with nominal costs: F 1, a whole backward 2, ZB-H1's
B and W 1 each, the last stage's FB 3. The measured picture takes the launches of a
run's trace (`Runtime.start_tracing`, the events `--trace` writes), one row
per island. Either is written as a PNG whose title gives the bubble: the
idle fraction of the rows between the first start and the last end.

    step = pw.pipeline(stages, slices, loss=mse, schedule="zb-h1", micro_batches=8)
    step.draw("planned.png")
    tracer = runtime.start_tracing(); step(params, x, y); step.draw("measured.png", runtime.stop_tracing())
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

COSTS = {"F": 1.0, "B": 2.0, "W": 1.0, "FB": 3.0}
COLORS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868", "FB": "#c44e52", "other": "#bbbbbb"}
# A launch's label is its function's name and a count: stage_forward#3, stage_input_grad#0, ...
_KINDS = [("_forward_backward#", "FB"), ("_forward#", "F"), ("_input_grad#", "B"), ("_backward#", "B"),
          ("_weight_grad#", "W")]


@dataclass(frozen=True)
class Box:
    """One step on one row, from `start` to `end` (ticks of nominal cost, or seconds)."""

    row: int
    kind: str            # "F", "B", "W", "FB" or "other"
    label: str
    start: float
    end: float


def planned(steps: Sequence[Sequence[tuple[int, str, int]]]) -> list[Box]:
    """Times each worker's steps (rows in `steps`' order) with the nominal costs."""
    from .pipeline import step_needs

    split = {s for order in steps for s, kind, _ in order if kind == "W"}
    finished: dict[tuple[int, str, int], float] = {}
    free = [0.0] * len(steps)
    position = [0] * len(steps)
    boxes = []
    last = max(s for order in steps for s, _, _ in order)
    while any(p < len(order) for p, order in zip(position, steps)):
        progressed = False
        for w, order in enumerate(steps):
            if position[w] == len(order):
                continue
            s, kind, m = order[position[w]]
            needs = step_needs((s, kind, m), last)
            if needs is not None and needs not in finished:
                continue
            start = max(free[w], finished.get(needs, 0.0))
            cost = 1.0 if kind == "B" and s in split else COSTS[kind]
            free[w] = finished[s, kind, m] = start + cost
            boxes.append(Box(w, kind, f"{kind}{m}", start, start + cost))
            position[w] += 1
            progressed = True
        if not progressed:
            raise ValueError("pipeline schedule deadlocks")
    return boxes


def measured(events, rows: Sequence[str]) -> list[Box]:
    """Boxes of a trace's launches (`TraceEvent`s, or a `Tracer`), one row per island in `rows`.

    A launch starts when it was enqueued or its island's previous launch
    ended, whichever is later, as in the Chrome trace.
    """
    events = events.flush() if hasattr(events, "flush") else events
    busy_until: dict[str, float] = {}
    boxes = []
    for e in sorted((e for e in events if e.kind == "launch" and e.island in rows), key=lambda e: e.enqueued):
        start = max(e.enqueued, busy_until.get(e.island, 0.0))
        end = busy_until[e.island] = max(start, e.ready)
        kind = next((k for suffix, k in _KINDS if suffix in e.name), "other")
        boxes.append(Box(list(rows).index(e.island), kind, re.sub(r".*#", kind, e.name), start, end))
    return boxes


def bubble(boxes: Sequence[Box]) -> float:
    """The idle fraction of the rows between the first start and the last end (steps only)."""
    steps = [b for b in boxes if b.kind != "other"]
    if not steps:
        raise ValueError("no pipeline steps to measure a bubble on")
    rows = {b.row for b in steps}
    span = max(b.end for b in steps) - min(b.start for b in steps)
    return 1.0 - sum(b.end - b.start for b in steps) / (len(rows) * span)


def draw(boxes: Sequence[Box], path: str, title: str, row_names: Sequence[str]) -> float:
    """Writes the boxes as a PNG at `path`, titled with the bubble; returns the bubble."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    idle = bubble(boxes)
    origin = min(b.start for b in boxes)
    # The layout makes room for the title, the axis and the legend below it, however few the rows.
    fig, ax = plt.subplots(figsize=(10, 1.3 + 0.45 * len(row_names)), layout="constrained")
    for b in boxes:
        ax.broken_barh([(b.start - origin, b.end - b.start)], (b.row - 0.4, 0.8), facecolors=COLORS[b.kind],
                       edgecolor="white", linewidth=0.5)
        if len(boxes) <= 200:
            ax.text(b.start - origin + (b.end - b.start) / 2, b.row, b.label[len(b.kind):], ha="center",
                    va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(row_names)), row_names)
    ax.invert_yaxis()
    ax.set_title(f"{title}: bubble {idle:.1%}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in ("F", "B", "W", "FB")]
    fig.legend(handles, ["forward", "backward (ZB: input grad)", "weight grad", "last stage F+B"],
               fontsize="small", ncol=4, loc="outside lower center")
    fig.savefig(path, dpi=120, format="png")     # at `path` as given: without a suffix matplotlib adds ".png"
    plt.close(fig)
    return idle


def draw_schedule(schedule: str, steps, slices, path: str, trace=None) -> float:
    """Draws a pipeline's schedule at `path` (see `Pipeline.draw`): its planned steps, one row per worker's
    slice, or with `trace` the measured launches of one run, one row per stage's island. Returns the bubble."""
    if trace is None:
        boxes = planned(steps)
        names = [s.name or f"slice {w}" for w, s in enumerate(slices)]
        title = f"{schedule} planned (nominal costs)"
    else:
        names = list(dict.fromkeys(s.constraints["island"] for s in slices if "island" in s.constraints))
        if len(names) != len(slices):
            raise ValueError("a measured schedule needs each stage's slice on its own island (island=...)")
        boxes = measured(trace, names)
        title = f"{schedule} measured"
    return draw(boxes, path, title, names)
