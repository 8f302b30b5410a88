"""``python -m pipeline.cli``: how the main job starts its stages as child processes."""

from pipeline.cli import main

main()
