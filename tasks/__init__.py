"""Prefect tasks, one per pipeline stage: caching, artefact folders, MLflow logging. No algorithm here.

Importing this package changes nothing in the process: entry points call
:func:`tasks.runtime.configure_process` themselves, before Prefect, MLflow or transformers are imported.
"""
