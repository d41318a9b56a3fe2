"""Built-in example tasks on scikit-learn's 8x8 digits (no download needed)."""
