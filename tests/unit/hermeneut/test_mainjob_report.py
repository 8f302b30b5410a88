"""The main job's report prints a finding whole, wrapped at words (issue 41: lines were cut mid-word at ~150
characters, "SM cloc")."""

from __future__ import annotations

from hermeneut.jobs.mainjob import finding_line

# a real summary from `make run` (the uncorrectable ECC error of the demo), longer than one line
SUMMARY = (
    "GPU 3 (NVIDIA H100 80GB HBM3) on node-0001, idle: uncorrectable ECC error: 4 uncorrected in total, rows "
    "remapped for uncorrectable errors 1, remap pending yes; XID 48 (double-bit ECC error) at 12:14:31; reset the "
    "GPU (GPU-c1809d33-0f5e-4a4c-9f0e-1d2b3c4d5e6f) to retire the row"
)


def test_a_finding_is_printed_whole_and_wrapped_at_words() -> None:
    text = finding_line("critical", SUMMARY, width=80)
    lines = text.splitlines()
    assert len(lines) > 1 and lines[0].startswith("  critical GPU 3")
    assert all(line.startswith(" " * 11) for line in lines[1:])
    assert " ".join(line.strip() for line in lines).removeprefix("critical ") == SUMMARY
    # no word is split: every word of the summary is on one line
    words = {w for line in lines for w in line.split()}
    assert set(SUMMARY.split()) <= words
    assert all(len(line) <= 80 for line in lines if " " in line.strip())
