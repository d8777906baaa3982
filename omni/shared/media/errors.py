"""The one error the media layer raises: the client's media cannot be used.

A plain exception, so the layer imports nothing of the HTTP API: the server maps it to a 400
naming the part (omni/http/errors.py), the encoder worker sends its message back per item.
"""

from __future__ import annotations


class MediaError(ValueError):
    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the request field it came from, e.g. "messages[0].content[1]"
