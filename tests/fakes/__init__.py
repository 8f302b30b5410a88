"""Stand-ins for hardware the test machines do not have, built from real captures (used only by unit tests)."""
