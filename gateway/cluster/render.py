"""`voltgate plan --cluster` as text: one row per model with its host and that host's speed prediction,
then each host's own placement table (the same one `voltgate plan` prints for one host)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gateway.cluster.plan import ClusterReport
from gateway.placement.report import describe_plan, render_plan_table


def render_cluster_plan(report: ClusterReport, console: Console) -> None:
    """Print the cluster summary, each host's placement table, and what every host answered per model."""
    table = Table(title="voltgate cluster placement", show_lines=True)
    for column in ("model", "host", "placement", "predicted (on that host)"):
        table.add_column(column, overflow="fold")
    for d in report.decisions:
        decision = d.decision
        if decision.plan is None:
            table.add_row(d.model, "", Text("refused", style="bold red"), "")
            continue
        where = d.host or "(remote endpoint)"
        speed = ""
        if decision.prediction is not None:
            p = decision.prediction
            speed = f"{p.gpu}: {p.decode_tok_s_1:,.0f} tok/s 1 stream, TTFT {p.ttft_s:.2f} s"
            if p.sessions > 1:
                speed += f"; {p.sessions} streams {p.aggregate_tok_s:,.0f} tok/s"
        table.add_row(d.model, where, describe_plan(decision.rung or "", decision.plan), speed)
    console.print(table)
    for host in report.hosts:
        address = f" at {host.address}" if host.address else ""
        gpus = ", ".join(g.describe() for g in host.report.inventory.gpus) or "no GPUs"
        budget = host.memory_budget_bytes
        memory = f"; on-demand host-memory budget {budget / (1 << 30):.1f} GiB" if budget is not None else ""
        console.print(Text(f"\nhost {host.host}{address}: {gpus}{memory}", style="bold"))
        if host.report.decisions:
            render_plan_table(host.report, console)
        else:
            console.print(Text("  no model placed here", style="dim"))
    console.print(Text("\nper host, per model", style="bold"))
    for d in report.decisions:
        console.print(Text(d.model, style="bold"))
        for c in d.considered:
            console.print(Text(f"  {c.host}: {c.outcome}"))
        if d.decision.plan is None and d.decision.refusal:
            console.print(Text(f"  refused: {d.decision.refusal}", style="red"))
