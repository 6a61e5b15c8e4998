"""Run a family of recipes and compare them: ``python -m recipes.sweep FOLDER`` (the command's guide is
:mod:`recipes.sweep.cli`'s docstring, and ``--help``).

- :mod:`recipes.sweep.records` — a sweep's runs, its ``sweep.json`` and ``record.json``, reading a run's numbers;
- :mod:`recipes.sweep.launch` — finding a family's recipes and running them (cores, GPUs, submitit);
- :mod:`recipes.sweep.report` — the tables (per run, or over seeds with the statistics) and figures;
- :mod:`recipes.sweep.cli` — the command.
"""
