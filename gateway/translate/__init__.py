"""Translation layers over the one chat path: OpenAI's Responses API and Anthropic's Messages API.

Each builds its request as the gateway's typed chat request (`ChatCompletionRequest`, made of the chat
protocol's message, tool and format models; `params.translated` names a refusal by the client's
parameter), and renders the chat path's answer (a `chat.completion`, or typed `chat.completion.chunk`s
through `chunk_loop`) as its own objects and stream events. Nothing here does I/O.
"""

from gateway.protocol.parsing import parse_body
from gateway.translate import messages, responses
from gateway.translate.ids import new_id
from gateway.translate.messages_stream import MessagesStream
from gateway.translate.responses_stream import ResponsesStream
from gateway.translate.sse import encode_event, encode_events

__all__ = [
    "MessagesStream",
    "ResponsesStream",
    "encode_event",
    "encode_events",
    "messages",
    "new_id",
    "parse_body",
    "responses",
]
