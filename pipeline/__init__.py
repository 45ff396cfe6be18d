"""What runs the stages: their cache keys and records (stage), where they run (dispatch), the run's engines, the
weights they hand on, MLflow tracking, progress and the summary, the process set-up, the CLI and the config
composition. ``tasks/`` holds the stages themselves.

Importing this package changes nothing in the process: entry points call
:func:`pipeline.runtime.configure_process` themselves, before Prefect, MLflow or transformers are imported.
"""
