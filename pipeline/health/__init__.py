"""Health: ``states`` (the vocabulary: states, remedies, the shape of a rule) and ``fold`` (a state per GPU and per
node folded from the findings firing now, what a finding history escalates, fleet incidents)."""
