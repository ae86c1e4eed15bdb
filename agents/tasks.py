"""The Celery tasks: transport only; the lifecycle (claim, execute, finish) is agents/lifecycle.py."""

from __future__ import annotations

from celery import shared_task

from agents import lifecycle


@shared_task(name=lifecycle.RUN_TASK, acks_late=True)
def run_turn(run_id: int) -> None:
    lifecycle.run_execute(run_id, worker=lifecycle.worker_identity(run_turn.request.hostname))


@shared_task(name=lifecycle.SUBAGENT_TASK)
def run_subagent(subagent_id: int) -> None:
    lifecycle.subagent_execute(subagent_id, worker=lifecycle.worker_identity(run_subagent.request.hostname))
