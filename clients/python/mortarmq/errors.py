"""Exceptions of the client: MortarError for the broker's ERR answers (with the
registry's advice), ProtocolError for a broker that breaks the protocol."""

from . import wire


class MortarError(Exception):
    """The broker answered ERR. ``code`` is the registry code; ``name``, ``after``
    ("close" or "keep"), ``retry`` ("no", "backoff" or "idempotent") and
    ``client_should`` come from the registry (man/mortarmq.7, ERRORS); ``message`` is the
    broker's diagnostic text and ``request_op`` the op it answers."""

    def __init__(self, code, message="", request_op=0):
        entry = wire.error_code(code)
        self.code = entry.code
        self.name = entry.name
        self.after = entry.after
        self.retry = entry.retry
        self.client_should = entry.client_should
        self.message = message
        self.request_op = request_op
        super().__init__(code, message, request_op)

    @classmethod
    def from_frame(cls, err):
        return cls(err.code, err.message.decode("utf-8", "replace"), err.request_op)

    @property
    def retryable(self):
        return self.retry != "no"

    @property
    def closes_connection(self):
        return self.after == "close"

    def __str__(self):
        text = "%s (0x%04X)" % (self.name, self.code)
        if self.message:
            text += ": " + self.message
        return text + " (client should: %s)" % self.client_should

    def __repr__(self):
        return "MortarError(0x%04X %s, %r)" % (self.code, self.name, self.message)


class ProtocolError(Exception):
    """The broker sent bytes or a frame the protocol does not allow there. The client
    drops the connection (and reconnects where it can)."""
