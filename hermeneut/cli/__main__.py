"""``python -m hermeneut.cli``: how the main job starts its stages as child processes."""

from hermeneut.cli import main

main()
