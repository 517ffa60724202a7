"""The terminal renderers' output as HTML (jfa_prof.render.html): tables as tables, lines as paragraphs."""
from __future__ import annotations

import re

from rich import box
from rich.table import Table

from jfa_prof.render.html import capture_html, table_html, text_html


def _table() -> Table:
    t = Table(title="t [bold]x[/]", box=box.SIMPLE_HEAD)
    t.add_column("name")
    t.add_column("÷fa4\ncall", justify="right")
    t.add_row("a < b", "[red]0.55[/]")
    t.add_section()
    t.add_row("c", "1.22")
    return t


def test_a_table_becomes_a_table_with_its_sections_alignment_and_colours():
    out = table_html(_table())
    assert out.startswith('<table class="data"><caption>t <span style="font-weight: bold">x</span></caption>')
    assert '<th>name</th><th class="num">÷fa4<br>call</th>' in out
    bodies = re.findall(r"<tbody>(.*?)</tbody>", out)
    assert len(bodies) == 2  # one per section
    assert bodies[0] == ('<tr><td>a &lt; b</td><td class="num"><span style="color: #800000; '
                         'text-decoration-color: #800000">0.55</span></td></tr>')
    assert bodies[1] == '<tr><td>c</td><td class="num">1.22</td></tr>'


def test_printed_lines_become_paragraphs_the_browser_wraps():
    long = "word " * 200

    def draw(console):
        console.print(_table())
        console.print(f"[dim]{long}[/]")
        console.print("plain", "two")

    out = capture_html(draw)
    assert "<pre" not in out
    assert out.count('<p class="line">') == 2 and "plain two" in out
    assert re.search(r'<p class="line"><span style="color: #7f7f7f[^"]*">word word', out)


def test_markup_is_read_and_text_is_escaped():
    assert text_html("[bold]a[/] & b") == '<span style="font-weight: bold">a</span> &amp; b'
