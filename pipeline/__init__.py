"""What wires the stages into flows, above ``tasks/``: where each stage runs (dispatch), the flows' shared set-up
(session), MLflow tracking, the run's summary (report), the process set-up (runtime), the CLI and the config
composition. ``tasks/`` holds the stages; ``stagekit/`` (below them) what a stage is built with.

Importing this package changes nothing in the process: entry points call
:func:`pipeline.runtime.configure_process` themselves, before Prefect, MLflow or transformers are imported.
"""
