"""MortarMQ client: Producer, Consumer and the wire codec (mortarmq.wire), standard
library only. The protocol is described in man/mortarmq.7."""

from . import wire
from .consumer import Consumer, DeadLetterOrigin, Message
from .errors import MortarError, ProtocolError
from .producer import Producer, PublishHandle, Receipt
from .wire import Durability, OriginReason

__version__ = "0.1.0"

__all__ = [
    "Consumer", "DeadLetterOrigin", "Durability", "Message", "MortarError", "OriginReason",
    "Producer", "ProtocolError", "PublishHandle", "Receipt", "wire",
]
