"""The boundary to one SGLang server: what we send, what we read back, and how it fails.

The HTTP contract we rely on is written down in ``docs/sglang.md``. Callers hold typed objects
only, never a body of the server's:

* :mod:`~workers.sglang_client.request`: :class:`ChatRequest`, the chat body it builds
* :mod:`~workers.sglang_client.client`: :class:`SGLangClient`, the HTTP calls
* :mod:`~workers.sglang_client.replies`: :class:`Completion` and its :class:`MetaInfo`
* :mod:`~workers.sglang_client.stream`: a streamed answer read, and stopped when its text loops
* :mod:`~workers.sglang_client.stream_hub`: the one thread that reads every streamed body
* :mod:`~workers.sglang_client.chunked`: the chunked transfer coding, decoded as bytes arrive
* :mod:`~workers.sglang_client.info`: :class:`ServerInfo`, :class:`ModelInfo`, :class:`ServerIdentity`
* :mod:`~workers.sglang_client.load`: :class:`ServerLoad`, from ``/metrics``
* :mod:`~workers.sglang_client.http_errors`: every failure as the exception tree of
  ``core/errors.py`` (retryable or permanent)
"""

from workers.sglang_client.client import SGLangClient
from workers.sglang_client.http_errors import error_message
from workers.sglang_client.info import (
    ModelInfo,
    ServerIdentity,
    ServerInfo,
    parse_model_info,
    parse_server_info,
)
from workers.sglang_client.load import ServerLoad, parse_metrics
from workers.sglang_client.replies import Completion, MetaInfo, parse_completion, read_chat_reply
from workers.sglang_client.request import ChatRequest
from workers.sglang_client.stream import StreamReader, read_stream

__all__ = [
    "ChatRequest",
    "Completion",
    "MetaInfo",
    "ModelInfo",
    "SGLangClient",
    "ServerIdentity",
    "ServerInfo",
    "ServerLoad",
    "StreamReader",
    "error_message",
    "parse_completion",
    "parse_metrics",
    "parse_model_info",
    "parse_server_info",
    "read_chat_reply",
    "read_stream",
]
