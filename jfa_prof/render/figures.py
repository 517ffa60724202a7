"""How every plotly figure is shown: in a page, a standalone file and a notebook.

Figures carry no fixed width: they fill the page or notebook column they are drawn in, and the
``responsive`` config redraws them when it resizes, so a three-panel heatmap is never clipped
on a narrower screen than the one it was designed on.
"""
from __future__ import annotations

from typing import Any

__all__ = ["CONFIG", "NOTEBOOK_RENDERER", "have_plotly", "ranked_bars_layout", "use_notebook_renderer"]

CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True}

# "notebook" stores each figure as text/html (drawn by the plotly.js it puts in the notebook
# once, inline: nothing is fetched, the machines here reach no CDN), "plotly_mimetype" as
# plotly's JSON, which JupyterLab prefers. nbconvert's HTML export knows only the first: with
# the mimetype alone, exported figures are empty.
NOTEBOOK_RENDERER = "notebook+plotly_mimetype"


def use_notebook_renderer() -> None:
    """Make ``fig.show()`` in this notebook store an HTML copy of each figure beside plotly's
    JSON, so the figures survive ``jupyter nbconvert --to html``. Call it once, early: it
    writes plotly.js into the output of the cell that calls it."""
    import plotly.io as pio

    for name in NOTEBOOK_RENDERER.split("+"):
        renderer = pio.renderers[name]
        if hasattr(renderer, "config"):
            renderer.config = dict(CONFIG)
    pio.renderers.default = NOTEBOOK_RENDERER


def ranked_bars_layout(fig, *, title: str | None, n_rows: int, n_groups: int, x_title: str, legend_title: str):
    """The layout of a ranked chart of grouped horizontal bars (largest first, one group per
    recording or report): tall enough for every bar, the legend below."""
    fig.update_layout(
        title=title, barmode="group", template="plotly_white", autosize=True,
        height=160 + 22 * n_rows * max(1, n_groups),
        xaxis={"title": {"text": x_title}, "rangemode": "tozero"},
        yaxis={"autorange": "reversed"}, legend={"orientation": "h", "y": -0.12, "title": {"text": legend_title}},
        margin={"l": 150, "r": 30, "t": 60, "b": 60})
    return fig


def have_plotly() -> bool:
    """Whether charts can be drawn here: plotly is a dependency, but a machine set up by hand (a GPU
    image with only the kernels' packages) may lack it, and a command should say so before it
    measures, not fail on a traceback after."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        return False
    return True

