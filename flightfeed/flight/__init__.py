"""The Arrow Flight data plane: zero-copy FlightData codec, server and client on grpclib."""

from .._generated.arrow.flight.protocol import (
    Action,
    ActionType,
    FlightDescriptor,
    FlightEndpoint,
    FlightInfo,
    HandshakeRequest,
    HandshakeResponse,
    Location,
    PollInfo,
    Ticket,
)
from .client import DoGetCall, FlightClient, command_descriptor, parse_location, path_descriptor
from .codec import FlightDataDecoder, FlightDataEncoder, decode_flight_data
from .connection_limits import ConnectionLimits
from .errors import PLAIN_ERRORS, ErrorMapping, PlainErrors, StatusReply
from .keepalive import KeepalivePolicy
from .schema import schema_from_ipc, schema_to_ipc
from .server import CallContext, FlightHandler, FlightServer, FlightService, PutResultWriter
from .streams import FlightDataReader, FlightDataWriter

__all__ = [
    "PLAIN_ERRORS",
    "Action",
    "ActionType",
    "CallContext",
    "ConnectionLimits",
    "DoGetCall",
    "ErrorMapping",
    "FlightClient",
    "FlightDataDecoder",
    "FlightDataEncoder",
    "FlightDataReader",
    "FlightDataWriter",
    "FlightDescriptor",
    "FlightEndpoint",
    "FlightHandler",
    "FlightInfo",
    "FlightServer",
    "FlightService",
    "HandshakeRequest",
    "HandshakeResponse",
    "KeepalivePolicy",
    "Location",
    "PlainErrors",
    "PollInfo",
    "PutResultWriter",
    "StatusReply",
    "Ticket",
    "command_descriptor",
    "decode_flight_data",
    "parse_location",
    "path_descriptor",
    "schema_from_ipc",
    "schema_to_ipc",
]
