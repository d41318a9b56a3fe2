"""Optional features: mixed precision, EMA, NaN guard, learning rate, validation control."""
