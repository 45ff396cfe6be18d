"""Entry point run inside the GPU worker's vLLM environment: ``python -m mars2.backends.vllm_worker REQ OUT``.

Reads the request written by :func:`mars2.backends.vllm_backend.build_request`, generates with ``vllm.LLM``
(processed log-probs of the sampled tokens), and writes one JSON line per prompt, in prompt order.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict


def main(request_path: str, out_path: str) -> None:
    from vllm import LLM
    from vllm import SamplingParams as VSamplingParams

    from mars2.backends.vllm_backend import generation_from_vllm

    req = json.loads(open(request_path).read())
    llm = LLM(**req["engine"], logprobs_mode="processed_logprobs")
    # one SamplingParams per prompt: each request carries its own seed
    outputs = llm.generate(req["prompts"], [VSamplingParams(**req["sampling"], seed=s) for s in req["seeds"]])
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        for out in outputs:
            gens = [asdict(generation_from_vllm(out.prompt_token_ids, o)) for o in out.outputs]
            f.write(json.dumps({"generations": gens}) + "\n")
    os.replace(tmp, out_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
