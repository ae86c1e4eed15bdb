from __future__ import annotations

from celery import shared_task

from agents import services


@shared_task(name="agents.run_turn", acks_late=True)
def run_turn(run_id: int) -> None:
    services.run_execute(run_id=run_id, worker=run_turn.request.hostname or "celery")


@shared_task(name="agents.run_subagent")
def run_subagent(subagent_id: int) -> None:
    from agents.subagents import subagent_execute

    subagent_execute(subagent_id, worker=run_subagent.request.hostname or "celery")
