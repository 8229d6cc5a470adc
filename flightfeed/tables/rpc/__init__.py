"""One module per RemoteEngineService RPC (seed 003), over the worker's TableEngine."""
