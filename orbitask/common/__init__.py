"""What tasks and trainers both stand on: configuration errors (`errors`), the rules of every
setting (`setting_rules`) and the one place that reaches into Keras 2 and 3 (`keras_compat`).
Imports neither `orbitask.tasks` nor `orbitask.trainers`."""
