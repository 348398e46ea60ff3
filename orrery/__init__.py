"""Generated protobuf and gRPC code for Orrery's contracts (`proto/orrery/v1/*.proto`).

Do not edit: regenerate with `python scripts/gen_proto.py`. Only the `wire.py`, `service.py`
and `client.py` modules of each package import from here; everything else uses dataclasses.
"""
