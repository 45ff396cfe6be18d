"""The pipeline's reaches into Prefect's and MLflow's internals, behind one door each (see :mod:`mars2.shims`)."""
