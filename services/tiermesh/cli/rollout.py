"""`tiermesh rollout start|status|promote|rollback MODEL`: argument parsing and printing;
the logic is tiermesh.rollout.commands."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import time

from tiermesh.cli.args import (
    Subcommands,
    add_redis_url_arg,
    add_repository_arg,
    nonempty,
    nonneg_int,
    percent,
    repository_of,
)
from tiermesh.core.redis_client import connect
from tiermesh.core.repository import ModelRepository
from tiermesh.rollout.commands import Rollouts, Status
from tiermesh.rollout.state import RolloutState
from tiermesh.rollout.store import RolloutStore


def _who(args: argparse.Namespace) -> str:
    if args.who:
        return str(args.who)
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


async def _run(args: argparse.Namespace) -> int:
    repo = ModelRepository(repository_of(args))
    redis = connect(args.redis_url)
    try:
        rollouts = Rollouts(RolloutStore(redis), repo.load(), _who(args))
        if args.action == "start":
            print(_state_line(await rollouts.start(args.model, args.canary, args.percent)))
        elif args.action == "promote":
            print(_state_line(await rollouts.promote(args.model)))
        elif args.action == "rollback":
            print(_state_line(await rollouts.rollback(args.model)))
        else:
            print(_status_text(args.model, await rollouts.status(args.model, args.events)))
        return 0
    finally:
        await redis.aclose()


def cmd_rollout(args: argparse.Namespace) -> int:
    """RolloutError, RepositoryError and Redis's errors become the CLI's error line."""
    return asyncio.run(_run(args))


def _state_line(s: RolloutState) -> str:
    return f"{s.model}: {s.state}, stable {s.stable}, canary {s.canary or '-'} at {s.percent:g}%"


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def _status_text(model: str, st: Status) -> str:
    lines = [_state_line(st.state) if st.state else f"{model}: no rollout, stable {st.stable}"]
    if st.state is not None:
        t = st.state.thresholds
        lines.append(
            f"  started {_when(st.state.started_ms)}, changed {_when(st.state.updated_ms)}"
        )
        lines.append(
            f"  thresholds: window {t.window_s:g}s, min {t.min_requests} requests, errors <= "
            f"{t.max_error_rate:.1%}, p99 <= {t.max_p99_ratio:g}x stable (floor "
            f"{t.p99_floor_ms:g} ms), cosine >= {t.min_cosine:g} over {t.min_pairs}+ mirrored "
            f"({t.mirror_fraction:.0%} of stable traffic)"
        )
    for version, w in st.window.items():
        p99 = w.p99_ms()
        cos = w.cosine_mean
        lines.append(
            f"  version {version}: {w.answers} answers, {w.errors} errors "
            f"({w.error_rate:.1%}), p99 {'-' if p99 is None else f'{p99:.1f} ms'}, "
            f"cosine {'-' if cos is None else f'{cos:.4f} over {w.cosine_n}'}"
        )
    if st.verdict is not None:
        lines.append(f"  verdict now: {st.verdict.action} {st.verdict.detail}".rstrip())
    for c in st.changes:
        lines.append(
            f"  {_when(c.time_ms)} {c.action} by {c.who}: stable {c.stable}, canary "
            f"{c.canary or '-'} at {c.percent:g}% -> {c.state}"
            + (f" ({c.reason}: {c.detail})" if c.reason else "")
        )
    return "\n".join(lines)


def add_rollout_parser(sub: Subcommands) -> None:
    p = sub.add_parser("rollout", help="canary rollouts of a model's versions")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="send a share of the traffic to a canary version")
    start.add_argument("--canary", type=nonempty, required=True, help="the version to try")
    start.add_argument(
        "--percent", type=percent, required=True, help="its share of the traffic, 0..100"
    )
    status = actions.add_parser("status", help="state, window stats per version, last events")
    status.add_argument("--events", type=nonneg_int, default=5, help="change-log entries to show")
    actions.add_parser("promote", help="the canary becomes the stable version")
    actions.add_parser("rollback", help="no more traffic to the canary")
    for action in actions.choices.values():
        action.add_argument("model", help="the model whose versions roll out")
        add_redis_url_arg(action)
        add_repository_arg(action)
        action.add_argument("--who", default="", help="recorded in the change log (default: $USER)")
        action.set_defaults(func=cmd_rollout)
