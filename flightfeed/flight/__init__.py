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
from .keepalive import KeepalivePolicy
from .schema import schema_from_ipc, schema_to_ipc
from .server import CallContext, FlightHandler, FlightServer, FlightService, PutResultWriter
from .streams import FlightDataReader, FlightDataWriter

__all__ = [
    "Action",
    "ActionType",
    "CallContext",
    "DoGetCall",
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
    "PollInfo",
    "PutResultWriter",
    "Ticket",
    "command_descriptor",
    "decode_flight_data",
    "parse_location",
    "path_descriptor",
    "schema_from_ipc",
    "schema_to_ipc",
]
