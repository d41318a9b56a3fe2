"""Run state: the checkpoint, input position, random state, directory lock, SavedModel."""
