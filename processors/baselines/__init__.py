"""Learned baselines: what is normal for each (application, GPU model, phase), and how far a row is from it.

- ``model``: a baseline as a model (robust Gaussian modes and quantiles over the FEATURES), its calibrated score and
  its drivers;
- ``fit``: fitting one baseline, and a whole version with its priors and the application classifier (pure, used by
  the training job);
- ``store``: a published version as the processor uses it, the checks of records read from the baselines topic, and
  hot reload of complete versions;
- ``explain``: the one-line explanation of a verdict;
- ``world``: what healthy GPUs show in the world (public measurements, physical limits), beyond which alone a prior
  may judge;
- ``score``: the :class:`~processors.baselines.score.Scorer` stage and its ``baseline-anomaly`` findings.
"""
