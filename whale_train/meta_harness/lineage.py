"""A readable markdown report of an archive: the tree of candidates with their scores per model version,
their hypotheses, the accepted ones marked, and every step's decision."""

from __future__ import annotations

import re
from pathlib import Path

from whale_train.meta_harness.archive import Archive


def _score(rec: dict | None) -> str:
    return f"{100 * rec['mean']:.1f} ± {100 * rec['se']:.1f}" if rec else "–"


def lineage_report(archive_dir: str | Path, hypothesis_chars: int = 400) -> str:
    archive = Archive(archive_dir, readonly=True)
    settings = archive.settings() or {}
    records = archive.records()
    cands = archive.candidates()
    metas = {c.id: c.meta for c in cands}
    versions = sorted({v for c in cands for v in c.versions()})
    accepted_at: dict[str, str] = {}
    for r in records:
        if r["accepted"]:
            step = (
                f"iteration {r['iteration']}"
                if r["kind"] == "iteration"
                else f"rescore v{r['model_version']}"
            )
            accepted_at.setdefault(r["incumbent"], step)
    incumbent = records[-1]["incumbent"] if records else settings.get("seed_id", "?")
    rollouts = sum(r["rollouts"] for r in records)
    checks = sum(r.get("check_episodes", 0) for r in records)
    valid = sum(m.get("status") == "valid" for m in metas.values())
    iterations = sum(r["kind"] == "iteration" for r in records)
    cfg = settings.get("config", {})

    out = [f"# Harness search on {settings.get('env_id', '?')}", ""]
    out.append(
        f"- seed: `{settings.get('seed_id')}` ({settings.get('seed_harness')}); {len(settings.get('task_ids', []))} "
        f"`harness`-split tasks × {cfg.get('rollouts_per_task', 1)} rollout(s) per candidate; proposer "
        f"{cfg.get('proposer', '?')}{' (prompt-only)' if cfg.get('prompt_only') else ''}; seed {settings.get('seed')}"
    )
    out.append(
        f"- incumbent: **`{incumbent}`**; {len(cands)} candidates ({valid} valid) over {iterations} iterations; "
        f"{rollouts} rollouts charged; {checks} null-model check episodes (not charged)"
    )
    if records:
        out.append(f"- acceptance rule: {records[-1]['rule']}")
    out += [
        "",
        "## Lineage",
        "",
        "Success rate on the search tasks (% ± SE) per model version; ★ = became the incumbent.",
        "",
    ]

    children: dict[str, list[str]] = {}
    roots = []
    for cid, meta in metas.items():
        parents = meta.get("parents") or []
        if parents and parents[0] in metas:
            children.setdefault(parents[0], []).append(cid)
        else:
            roots.append(cid)

    def line(cid: str, depth: int) -> None:
        meta = metas[cid]
        cand = archive.get(cid)
        scores = ", ".join(f"v{v} {_score(cand.eval(v))}" for v in versions if cand.eval(v)) or "not scored"
        star = "★ " if cid in accepted_at else ""
        what = meta.get("summary") or meta.get("change", "")
        extra = f"; also from `{meta['parents'][1]}`" if len(meta.get("parents") or []) > 1 else ""
        status = (
            ""
            if meta.get("status") in ("valid", None)
            else f" — **{meta.get('status')}**: {meta.get('reason')}"
        )
        when = f" — accepted at {accepted_at[cid]}" if cid in accepted_at else ""
        pad = "  " * depth
        by = f" [{meta.get('proposer')}]" if meta.get("proposer") not in ("seed", None) else ""
        out.append(f"{pad}- {star}`{cid}` {what}{by}{extra} — {scores}{when}{status}")
        hyp = (meta.get("hypothesis") or "").strip()
        if hyp and meta.get("proposer") != "seed":
            text = hyp if len(hyp) <= hypothesis_chars else hyp[:hypothesis_chars] + " …"
            out.append(f"{pad}  <br>_{text}_")
        for child in children.get(cid, []):
            line(child, depth + 1)

    for root in roots:
        line(root, 0)

    out += [
        "",
        "## Steps",
        "",
        "| # | step | model | candidates | incumbent | rollouts | decision |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        step = f"iteration {r['iteration']}" if r["kind"] == "iteration" else "rescore"
        names = ", ".join(c["id"] for c in r["candidates"]) or "–"
        reason = r["reason"].replace("|", "/")
        out.append(
            f"| {r['seq']} | {step} | v{r['model_version']} | {names} | `{r['incumbent']}` | {r['rollouts']} | {reason} |"
        )
    usage = [r["proposer_usage"] for r in records if r.get("proposer_usage")]
    if usage:
        tokens = sum(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0) for u in usage)
        cost = sum(u.get("cost_usd", 0.0) for u in usage)
        out += ["", f"Proposer usage: {tokens} tokens, ${cost:.4f}."]
    agent = [r for r in records if "runs" in (r.get("proposer_usage") or {})]
    if agent:
        out += ["", *agent_lines(agent)]
    return "\n".join(out) + "\n"


def agent_lines(records: list[dict]) -> list[str]:
    """The measured agent proposer, per iteration: turns, tool calls, prototype runs, tries, tokens, cost."""
    out = [
        "Proposer (agent): per iteration, model requests (turns), tool calls, prototype runs in the jail "
        "(failed or refused), try_candidate rollouts on train tasks (charged apart from scoring), tokens, "
        "cost and wall time.",
        "",
    ]
    for r in records:
        u = r["proposer_usage"]
        tokens = u.get("prompt_tokens", 0) + u.get("completion_tokens", 0)
        out.append(
            f"- iteration {r['iteration']}: {u.get('requests', 0)} turns, {u.get('tool_calls', 0)} tool calls, "
            f"{u.get('runs', 0)} prototype runs ({u.get('runs_failed', 0)} failed), {u.get('tries', 0)} tries, "
            f"{r.get('proposer_rollouts', 0)} try rollouts, {tokens} tokens, ${u.get('cost_usd', 0.0):.4f}, "
            f"{u.get('wall_seconds', 0.0):.0f} s"
        )
    return out


def for_terminal(report: str):
    """The markdown of :func:`lineage_report` as rich renders it in a terminal (``whale lineage`` without
    ``--out``): tables drawn, emphasis shown, and each hypothesis on a line of its own (the markdown's
    ``<br>`` becomes a hard line break instead of raw HTML)."""
    from rich.markdown import Markdown

    return Markdown(re.sub(r"\n(\s*)<br>", r"\\\n\1", report))
