"""The pipeline's stages, one Prefect task each (pipelines.md lists them): caching, artefact folders, MLflow metrics.
No algorithm here (``mars2/``), and nothing that runs them (``pipeline/``).
"""
