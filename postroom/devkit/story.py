"""The seed's story: the September sales report for four recipients (one refused, one deferred
twice), then October, queued while the mail server is down and delivered once it is back, then
November through the company's relay (a smarthost that accepts every recipient), where
old.manager@'s refusal comes back as a bounce. `make demo` tells it;
tests/integration/sender/test_seed_scenario.py checks how September and October end,
tests/integration/bounces/test_smarthost.py how a bounce through a smarthost does."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Report:
    """One run of the report job: a message key, its email and who gets it."""

    key: str
    subject: str
    body: str
    recipients: tuple[str, ...]


TEAM = ("finance@example.com", "ops@example.com", "old.manager@example.com", "ceo@example.com")
REFUSED = "old.manager@example.com"  # the mail server answers 550 5.1.1 User unknown
DEFERRED = {"ops@example.com": 2}  # answered 451 this many times, then accepted
SEPTEMBER = Report("sales-report-2026-09", "Sales report — September 2026",
                   "The September sales report is attached.", TEAM)
OCTOBER = Report("sales-report-2026-10", "Sales report — October 2026",
                 "The October sales report is attached.", ("finance@example.com",))
NOVEMBER = Report("sales-report-2026-11", "Sales report — November 2026",
                  "The November sales report is attached.", TEAM)
# Through the smarthost: accepted (sent), then Postfix's DSN comes back to the return path.
NOVEMBER_ENDS = {address: "sent" for address in TEAM} | {REFUSED: "bounced"}
BOUNCE_ADDRESS = "bounces@bounce.example.com"
WORKBOOK_NAME = "sales_2026-09.xlsx"
SUMMARY_NAME = "summary_2026-09.html"
# region, orders, revenue: the month's figures, in the workbook and the HTML summary
FIGURES = (("north", 412, 51_230.50), ("south", 388, 47_915.00), ("west", 290, 36_004.25))
FINAL_STATUSES = frozenset({"sent", "failed", "dead"})
# recipient -> (status, attempts) once every September row is final.
SEPTEMBER_ENDS = {
    "finance@example.com": ("sent", 1),
    "ops@example.com": ("sent", 1 + DEFERRED["ops@example.com"]),
    "old.manager@example.com": ("failed", 1),
    "ceo@example.com": ("sent", 1),
}


def make_workbook(directory: Path) -> Path:
    """Write the September workbook (openpyxl, from the demo extra) into ``directory``."""
    from openpyxl import Workbook

    book = Workbook()
    sheet = book.active
    sheet.title = "September 2026"
    sheet.append(["region", "orders", "revenue"])
    for row in FIGURES:
        sheet.append(list(row))
    path = directory / WORKBOOK_NAME
    book.save(path)
    return path


def make_html_summary(directory: Path) -> Path:
    """Write the report owners' HTML summary, a small table of the month's figures, into
    ``directory``."""
    rows = "".join(f"<tr><td>{region}</td><td>{orders}</td><td>{revenue:,.2f}</td></tr>"
                   for region, orders, revenue in FIGURES)
    orders = sum(o for _, o, _ in FIGURES)
    revenue = sum(r for _, _, r in FIGURES)
    path = directory / SUMMARY_NAME
    path.write_text(
        "<html><body><h2>Sales — September 2026</h2>"
        '<table border="1"><tr><th>region</th><th>orders</th><th>revenue</th></tr>'
        f"{rows}<tr><th>total</th><th>{orders}</th><th>{revenue:,.2f}</th></tr></table>"
        "<p>The workbook is attached.</p></body></html>", encoding="utf-8")
    return path
