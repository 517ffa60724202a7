"""What the terminal renderers print, as HTML: rich tables become ``<table>`` elements, lines of
text become paragraphs.

The report page shows the tables the commands print. Recorded as terminal text inside ``<pre>``,
a table was fixed to one console width: boxes broke when the browser's font did not match, and
footnotes ran on as one unwrapped line. :func:`capture_html` runs a renderer against a console
that keeps what it is asked to print instead, and writes each table as a table (title, header,
sections, the cells' colours and alignment) and each line as a paragraph the browser wraps, so
the page and the terminal still show the same rows, drawn by the same functions.
"""
from __future__ import annotations

import html
import io
from typing import Any, Callable

from rich.console import Console
from rich.style import Style
from rich.table import Table
from rich.text import Text

__all__ = ["HtmlConsole", "capture_html", "table_html", "text_html"]

# Only as wide as anything not translated to HTML is drawn (a panel, a rule): tables and text
# take the page's width.
FALLBACK_WIDTH = 120


def text_html(value: Any, console: Console | None = None) -> str:
    """A rich markup string or ``Text`` as escaped HTML, its styles as inline ``<span>`` styles."""
    text = value if isinstance(value, Text) else Text.from_markup(str(value))
    out = []
    for segment in text.render(console or _plain_console()):
        if not segment.text:
            continue
        chunk = html.escape(segment.text)
        css = segment.style.get_html_style() if isinstance(segment.style, Style) and segment.style else ""
        out.append(f'<span style="{css}">{chunk}</span>' if css else chunk)
    return "".join(out).replace("\n", "<br>")


def table_html(table: Table, console: Console | None = None) -> str:
    """A rich ``Table`` as ``<table class="data">``: its title as the caption, a ``<tbody>`` per
    section, each column aligned as it is justified in the terminal."""
    console = console or _plain_console()
    cols = table.columns
    align = [' class="num"' if c.justify == "right" else ' class="mid"' if c.justify == "center" else ""
             for c in cols]
    parts = ['<table class="data">']
    if table.title:
        parts.append(f"<caption>{text_html(table.title, console)}</caption>")
    if table.show_header:
        parts.append("<thead><tr>" + "".join(f"<th{a}>{text_html(c.header, console)}</th>"
                                             for c, a in zip(cols, align)) + "</tr></thead>")
    parts.append("<tbody>")
    n_rows = max((len(c._cells) for c in cols), default=0)
    for i in range(n_rows):
        cells = [c._cells[i] if i < len(c._cells) else "" for c in cols]
        parts.append("<tr>" + "".join(f"<td{a}>{_cell_html(v, console)}</td>" for v, a in zip(cells, align))
                     + "</tr>")
        if i < len(table.rows) and table.rows[i].end_section and i + 1 < n_rows:
            parts.append("</tbody><tbody>")
    parts.append("</tbody></table>")
    if table.caption:
        parts.append(f'<p class="caption">{text_html(table.caption, console)}</p>')
    return "".join(parts)


def _cell_html(value: Any, console: Console) -> str:
    if isinstance(value, (str, Text)):
        return text_html(value, console)
    return _pre(value, console)


def _pre(renderable: Any, console: Console) -> str:
    """Anything else as the terminal draws it."""
    rec = Console(record=True, file=io.StringIO(), width=FALLBACK_WIDTH, highlight=False, color_system="truecolor")
    rec.print(renderable)
    return rec.export_html(inline_styles=True, code_format='<pre class="rich"><code>{code}</code></pre>')


def _plain_console() -> Console:
    return Console(file=io.StringIO(), width=FALLBACK_WIDTH, highlight=False, color_system="truecolor")


class HtmlConsole(Console):
    """A console that turns what it is asked to print into HTML blocks (``.blocks``) instead of
    writing it anywhere: the renderers take it where they take a terminal's console."""

    def __init__(self) -> None:
        super().__init__(file=io.StringIO(), width=FALLBACK_WIDTH, highlight=False, color_system="truecolor",
                         soft_wrap=True)
        self.blocks: list[str] = []

    def print(self, *objects: Any, sep: str = " ", markup: bool | None = None, **_: Any) -> None:  # type: ignore[override]
        if not objects:
            return
        if all(isinstance(o, str) for o in objects):
            text = sep.join(objects)
            body = text_html(text if markup is not False else Text(text), self)
            self.blocks.append(f'<p class="line">{body}</p>')
            return
        for obj in objects:
            if isinstance(obj, Table):
                self.blocks.append(table_html(obj, self))
            elif isinstance(obj, Text):
                self.blocks.append(f'<p class="line">{text_html(obj, self)}</p>')
            else:
                self.blocks.append(_pre(obj, self))


def capture_html(draw: Callable[[Console], Any]) -> str:
    """What ``draw(console)`` prints, as HTML tables and paragraphs."""
    console = HtmlConsole()
    draw(console)
    return '<div class="printed">' + "".join(console.blocks) + "</div>"
