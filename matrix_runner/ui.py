"""What the commands print on a terminal or into a log: the stderr console, progress lines, the
plan blocks and tables that fit the console's width (rich). No stage logic lives here."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

#: progress, warnings and the plan go to stderr; a command's own output (a table, JSON) to stdout
console = Console(stderr=True, highlight=False)


def warn(text: str, out: Console | None = None) -> None:
    """One ``warning:`` line on ``out`` (default :data:`console`); ``text`` is printed as written, never
    read as rich markup (a warning naming ``pip install 'matrix-run[explain]'`` lost its ``[explain]``)."""
    (out or console).print(f"[yellow]warning:[/] {escape(text)}")


def progress() -> Progress:
    """A spinner line with elapsed time on :data:`console`; off where the console is not a terminal (a
    CI log, a pipe: rich would print its last frame on exit; the callers print lines there instead)."""
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                    disable=not console.is_terminal)


def print_plan(items: list, out: Console | None = None) -> None:
    """The plan, one block per env (a title line, then field / value rows): it fits an 80-column
    terminal or log, where a table of 7 columns folded every cell into many lines. Long values
    (kernel lists, errors) wrap at spaces to the console's width, as rich measures it (a pipe or log:
    $COLUMNS, else 80)."""
    from rich.padding import Padding

    out = out or console
    out.print("[bold]Plan: where each env's flash-attn comes from[/]")
    for it in items:
        g = Table.grid(padding=(0, 2))
        g.add_column(no_wrap=True, style="dim")
        g.add_column(overflow="fold")
        if it.method == "failed":
            g.add_row("method", f"[red]failed[/]: {escape(str(it.error))}")
        else:
            est = (f" · ~{it.estimate_s / 60:.1f} min" + (f" (MAX_JOBS={it.jobs['max_jobs']})" if it.jobs else "")
                   if it.estimate_s else "")
            cold = (it.compile_cache or {}).get("estimate_cold_s")
            if cold and it.estimate_s:
                est += f", {len(it.compile_cache['expected_hits'])} cache hits (cold ~{cold / 60:.1f} min)"
            g.add_row("method", escape(it.method) + est)
            archs = ",".join(it.archs) if isinstance(it.archs, list) else it.archs
            g.add_row("wheel key", escape(f"{it.key_id} · archs {archs or 'none (no CUDA)'}"))
            kern = (it.kernels if isinstance(it.kernels, str) else "none (no CUDA)" if not it.kernels
                    else f"{len(it.kernels)}: " + ", ".join(it.kernels))
            g.add_row("kernels", escape(kern))
        for n in it.notes:
            g.add_row("note", escape(n))
        if it.compile_cache and it.compile_cache.get("note"):
            g.add_row("compile cache", escape(it.compile_cache["note"]))
        version = f"  [dim]flash-attn {escape(it.version)}[/]" if it.version != it.label else ""
        out.print(f"[bold]{escape(it.label)}[/]{version}")
        out.print(Padding(g, (0, 0, 0, 2), expand=False))


def table_or_blocks(title: str, columns: list[str], rows: list[list[str]], out: Console) -> None:
    """Rows (cells are rich markup) as a table where rich measures that it fits the console's width
    (a pipe or log: $COLUMNS, else 80); else one block per row: its first cell, then a column /
    value line per other cell, values wrapping at spaces. No cell is folded into many lines."""
    from rich import box
    from rich.measure import Measurement
    from rich.padding import Padding

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in columns:
        t.add_column(col, no_wrap=True)
    for r in rows:
        t.add_row(*r)
    if not rows or Measurement.get(out, out.options.update_width(1 << 16), t).maximum <= out.width:
        out.print(t)
        return
    out.print(f"[bold]{title}[/]")
    for r in rows:
        g = Table.grid(padding=(0, 2))
        g.add_column(no_wrap=True, style="dim")
        g.add_column(overflow="fold")
        for col, v in zip(columns[1:], r[1:]):
            g.add_row(col, v)
        out.print(f"[bold]{r[0]}[/]")
        out.print(Padding(g, (0, 0, 0, 2), expand=False))
