"""The loop engine: the Orbit trainer and evaluator, the composed step, inputs, loop lengths."""
