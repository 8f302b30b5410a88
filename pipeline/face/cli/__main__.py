"""``python -m pipeline.face.cli``: how the main job starts its stages as child processes."""

from pipeline.face.cli import main

main()
