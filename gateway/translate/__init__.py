"""Translation layers over the one chat path: OpenAI's Responses API and Anthropic's Messages API.

Each turns its request into an OpenAI chat-completions request dict (validated by the gateway's own
chat request model), and the chat path's answer (a `chat.completion`, or `chat.completion.chunk`s) back
into its own objects and stream events. Nothing here does I/O.
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
