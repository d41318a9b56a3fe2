"""The run: `run_experiment`, its settings, pre-flight checks, the runner and the controller."""
