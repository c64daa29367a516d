"""What we send: one ``/v1/chat/completions`` request (``docs/sglang.md``, "The chat request")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_tasks.core.job import GenerationSpec
from dflash_tasks.core.repetition import RepetitionSettings

#: The chat route (OpenAI-compatible).
CHAT_PATH = "/v1/chat/completions"
#: ``stream_options`` of a streamed request: the usage at the end and with every text chunk.
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat request: the job's generation spec, the conversation so far and a request id.

    ``rid`` must be unique among the server's requests in flight (SGLang rejects a duplicate);
    ``continues``: the last message is the assistant's thought so far, which the answer continues
    (``continue_final_message``); ``watch``: the job's loop settings; when they are on, the answer
    is streamed and stopped once its text loops (:mod:`~workers.sglang_client.stream`).
    """

    spec: GenerationSpec
    messages: Sequence[Mapping[str, str]]
    rid: str
    continues: bool = False
    watch: RepetitionSettings | None = None
    #: The thought a continuation continues, and its tokens: it primes the thought's detector.
    primer: str = ""
    primer_tokens: int | None = None

    @property
    def streams(self) -> bool:
        """Whether the answer is read as a stream (loop detection on)."""
        return self.watch is not None and self.watch.enabled

    def body(self) -> dict[str, Any]:
        """The JSON body.

        The limit goes out under both names: SGLang 0.5.23 reads ``max_completion_tokens`` first
        (and marks ``max_tokens`` deprecated), releases that predate it ignore the unknown field
        and read ``max_tokens``. ``return_meta_info`` asks for the per-request speculative-decoding
        numbers; older releases ignore it too. Streamed (:attr:`streams`), it asks for the usage
        with every text chunk and ``return_spec_tokens_details`` instead (SGLang refuses
        ``return_meta_info`` with streaming). ``seed`` goes out only on a repair round's request
        (SGLang applies it only with ``--enable-deterministic-inference``; otherwise every request
        samples afresh anyway).
        """
        spec = self.spec
        body: dict[str, Any] = {
            "model": spec.model,
            "messages": list(self.messages),
            "max_completion_tokens": spec.max_tokens,
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "top_p": spec.top_p,
            "top_k": spec.top_k,
            "n": 1,
            "stream": False,
            "chat_template_kwargs": template_kwargs(spec),
            "separate_reasoning": True,
            "return_meta_info": True,
            "rid": self.rid,
        }
        if self.streams:
            del body["return_meta_info"]
            body["stream"] = True
            body["stream_options"] = dict(STREAM_OPTIONS)
            body["return_spec_tokens_details"] = True
        if spec.seed is not None:
            body["seed"] = spec.seed
        if self.continues:
            body["continue_final_message"] = True
        return body


def template_kwargs(spec: GenerationSpec) -> dict[str, bool]:
    """The chat template's switches: thinking, and with ``history_reasoning: keep`` Qwen3.6's
    ``preserve_thinking`` (render the earlier turns' reasoning the request carries)."""
    kwargs = {"enable_thinking": spec.thinking}
    if spec.keeps_history_reasoning:
        kwargs["preserve_thinking"] = True
    return kwargs
