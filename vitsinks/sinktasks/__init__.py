"""Synthetic tasks with a known answer about attention sinks (trigger, nop, broadcast)."""

from vitsinks.sinktasks.tasks import TASKS, run_broadcast, run_nop, run_trigger

__all__ = ["TASKS", "run_broadcast", "run_nop", "run_trigger"]
