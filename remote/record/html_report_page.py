"""The report page's style and its small HTML pieces (tables, figures, cards); no data logic here."""

from __future__ import annotations

from html import escape

CSS = """
:root { --ink:#1d2330; --muted:#5f6673; --line:#e2e5ea; --soft:#f6f7f9; --ok:#1d9a50; --bad:#d62f2f;
        --warn:#b26a00; }
* { box-sizing: border-box; }
body { margin: 0; background: #fff; color: var(--ink);
       font: 14px/1.5 "Inter", "Segoe UI", "Helvetica Neue", "DejaVu Sans", Arial, sans-serif; }
main { max-width: 1160px; margin: 0 auto; padding: 28px 20px 48px; }
header { display: flex; align-items: baseline; gap: 14px; flex-wrap: wrap;
         border-bottom: 1px solid var(--line); padding-bottom: 14px; }
header h1 { font-size: 24px; margin: 0; font-weight: 650; letter-spacing: -0.01em; }
header .run { color: var(--muted); font: 13px ui-monospace, "DejaVu Sans Mono", monospace; }
header .when { margin-left: auto; color: var(--muted); font-size: 13px; }
.badge { font-size: 12px; font-weight: 650; text-transform: uppercase; letter-spacing: .05em;
         padding: 2px 9px; border-radius: 999px; color: #fff; background: var(--muted); }
.badge.succeeded { background: var(--ok); } .badge.failed { background: var(--bad); }
.badge.stopped, .badge.unfinished { background: var(--warn); }
.cards { display: grid; grid-template-columns: repeat(6, 1fr); gap: 10px; margin: 18px 0; }
.card { background: var(--soft); border-radius: 8px; padding: 10px 12px; }
.card b { display: block; font-size: 18px; white-space: nowrap; font-weight: 650; font-variant-numeric: tabular-nums; }
.card span { color: var(--muted); font-size: 12px; }
.limits { border-left: 4px solid var(--warn); background: #fff8ec; padding: 10px 16px; border-radius: 0 8px 8px 0; }
.limits h2 { margin: 0 0 4px; font-size: 15px; border: 0; padding: 0; }
.limits ul { margin: 0; padding-left: 18px; }
h2 { font-size: 18px; font-weight: 650; margin: 30px 0 10px; padding-bottom: 6px;
     border-bottom: 1px solid var(--line); }
h2 small { font-size: 13px; font-weight: 400; margin-left: 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; } h3 small { color: var(--muted); font-weight: 400; margin-left: 8px; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; gap: 8px 24px; }
.grid4 { display: grid; grid-template-columns: repeat(4, 1fr); gap: 8px 14px; }
figure { margin: 0 0 14px; } figcaption { font-size: 13px; font-weight: 600; margin-bottom: 2px; }
figcaption .unit { color: var(--muted); font-weight: 400; }
.chart { display: block; width: 100%; height: auto; }
.chart text { font-size: 10.5px; fill: #5f6673; font-variant-numeric: tabular-nums; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 12px; color: var(--muted); min-height: 18px; }
.legend i { display: inline-block; width: 14px; height: 3px; border-radius: 2px; margin-right: 5px;
            vertical-align: middle; }
.legend i.dash { height: 0; border-top: 2px dashed; background: none !important; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 5px 10px 5px 0; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 600; } th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.kind { white-space: nowrap; font-weight: 600; } td.t { white-space: nowrap; color: var(--muted);
          font-variant-numeric: tabular-nums; }
pre { background: var(--soft); border-radius: 6px; padding: 8px 10px; font-size: 12px; overflow-x: auto;
      white-space: pre-wrap; word-break: break-all; margin: 4px 0 10px; }
.muted { color: var(--muted); } .slow { color: var(--warn); font-weight: 600; } .empty { color: var(--muted); font-style: italic; }
details summary { cursor: pointer; font-weight: 600; margin: 6px 0; }
footer { margin-top: 36px; color: var(--muted); font-size: 12px; }
"""


def table(header: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    """An HTML table; cells are already-escaped HTML, `classes` gives each column's class."""
    classes = classes or [""] * len(header)
    head = "".join(f'<th class="{c}">{escape(h)}</th>' for c, h in zip(classes, header))
    body = "".join("<tr>" + "".join(f'<td class="{c}">{cell}</td>' for c, cell in zip(classes, row)) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figure(caption: str, unit: str, legend_html: str, svg: str) -> str:
    unit_html = f' <span class="unit">{escape(unit)}</span>' if unit else ""
    return f"<figure><figcaption>{escape(caption)}{unit_html}</figcaption>{legend_html}{svg}</figure>"


def card(value: str, label: str) -> str:
    return f'<div class="card"><b>{escape(value)}</b><span>{escape(label)}</span></div>'


def page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<style>{CSS}</style></head><body><main>{body}</main></body></html>\n")
