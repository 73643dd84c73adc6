"""What the tests share, one module per job (Lightning keeps the same ``helpers`` package in its tests).

- :mod:`helpers.support`: small data sets and models, a quiet Trainer, the Lightning package under
  test (``L``), a 2-process DDP runner, :class:`~helpers.support.ResumableLoader`.
- :mod:`helpers.resume_points`: the checkpoint points Lightning offers, as runs to resume from.
- :mod:`helpers.preemption`: runs killed with SIGKILL and resumed from ``last.ckpt``.
- :mod:`helpers.two_processes`: what the 2-process tests share: launch, read each rank's results,
  compare the ranks with each other and with one process.
- :mod:`helpers.fsdp_runs`: the 2-process FSDP2/DDP script ``tests/lightning/test_fsdp2.py`` launches.
- :mod:`helpers.plain_loss_probes`: algorithms that record what a plain module's loss used.
- :mod:`helpers.search_support`, :mod:`helpers.search_faults`: the recipe search's tiny task and
  the module factories that kill the process training a fit.

``tests`` is on ``sys.path`` (pyproject's ``pythonpath``; the DDP runner and the search's child
processes pass it on), so tests and the scripts they launch write ``from helpers.support import L``.
"""
