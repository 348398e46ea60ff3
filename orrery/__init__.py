"""Orrery's wire: generated protobuf and gRPC code, and the access control every server shares.

`orrery/v1/` is generated from `proto/orrery/v1/*.proto`; do not edit it: regenerate with
`python scripts/gen_proto.py`. Only the `wire.py`, `service.py`, `server.py` and `client.py`
modules of each package import from there; everything else uses dataclasses.
`orrery/security.py` is hand-written: TLS, tokens with roles, rate limits, path roots.
"""
