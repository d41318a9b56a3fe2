"""Periodic work between device loops: triggers, callbacks, summaries, progress, preemption."""
