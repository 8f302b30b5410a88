"""What the CLI and the HTTP API both show, wired once: fleet health, reliability figures, right-sizing advice
(stored history through the query layer into the core's and the processors' pure folds)."""
